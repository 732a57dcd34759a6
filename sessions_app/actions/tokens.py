"""API token actions: issue and revoke bearer tokens (the management command, the API and
the web UI call these; nothing else writes ApiToken rows).

A raw token is shown once, when it is issued; only its sha256 is stored.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from sectr.errors import NotFound, ValidationFailed
from sessions_app.models import TOKEN_PREFIX, TOKEN_PREFIX_LENGTH, ApiToken, hash_token
from sessions_app.socket_access import notify_user_access_changed

TOKEN_NAME_MAX = 100


def check_token_name(name: Any) -> str:
    if not isinstance(name, str) or not name.strip() or len(name.strip()) > TOKEN_NAME_MAX:
        raise ValidationFailed(f"a token name is 1-{TOKEN_NAME_MAX} characters", code="invalid_token_name")
    return name.strip()


def do_issue_token(user: Any, name: str = "api") -> tuple[ApiToken, str]:
    """A new token for `user`: (the row, the raw secret to show once)."""
    if not user.is_active:
        raise ValidationFailed("tokens are issued only to active users", code="inactive_user")
    return ApiToken.issue(user, check_token_name(name))


def do_revoke_token(user: Any, prefix: str) -> int:
    """Revoke `user`'s live tokens whose public prefix starts with `prefix`; how many.

    The prefix is the token's first characters (``sectr_`` and a few more, as lists show
    them), or the whole token; at least one character beyond ``sectr_`` is required so that one call cannot
    revoke every token by accident.
    """
    if not isinstance(prefix, str) or len(prefix) <= len(TOKEN_PREFIX) or not prefix.startswith(TOKEN_PREFIX):
        raise ValidationFailed(f"give the token's prefix, e.g. {TOKEN_PREFIX}AbC123", code="invalid_token_prefix")
    live = ApiToken.objects.select_for_update().filter(user=user, revoked_at__isnull=True)
    with transaction.atomic():
        if len(prefix) > TOKEN_PREFIX_LENGTH:  # the whole token: exactly that one
            tokens = list(live.filter(token_hash=hash_token(prefix)))
        else:
            tokens = list(live.filter(prefix__startswith=prefix))
        if not tokens:
            raise NotFound("no live token of this user has that prefix")
        for token in tokens:
            token.revoke()
    return len(tokens)


def do_revoke_token_by_id(user: Any, token_id: int) -> ApiToken:
    """Revoke one of `user`'s tokens by its id (the web UI's revoke button)."""
    token = ApiToken.objects.filter(user=user, pk=token_id).first()
    if token is None:
        raise NotFound("no such token")
    token.revoke()
    return token


def do_revoke_tokens(tokens: QuerySet[ApiToken]) -> int:
    """Revoke the live tokens among `tokens` (the admin's action); how many."""
    with transaction.atomic():
        live = tokens.filter(revoked_at__isnull=True)
        owners = list(live.values_list("user_id", flat=True).distinct())
        count = live.update(revoked_at=timezone.now())
        notify_user_access_changed(owners)  # a bulk update sends no post_save: streams re-check
        return count


def do_revoke_tokens_of_inactive_user(user: Any) -> int:
    """Revoke every live token of `user` once the user is inactive; how many.

    Authentication already refuses an inactive user's tokens; revoking them too means
    reactivating the account does not bring them back: the user issues new ones.
    """
    if user.pk is None or user.is_active:
        return 0
    return do_revoke_tokens(ApiToken.objects.filter(user_id=user.pk))


def revoke_tokens_when_user_deactivated(sender: Any, instance: Any, raw: bool = False, **kwargs: Any) -> None:
    """post_save receiver on the user model (connected in SessionsAppConfig.ready): every
    save of an inactive user (the admin's form, `user.save()` in a shell) revokes their tokens."""
    if not raw:
        do_revoke_tokens_of_inactive_user(instance)
