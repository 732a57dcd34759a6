"""A team's notification settings as its moderators change them from the team page
(`Notifications`) and the API: its webhooks (list, add, delete) and whether an email's
action link decides without a login.

Checked like the other team settings (sessions_app.actions.members.moderated_team):
strangers get NotFound, members and reviewers get Forbidden, moderators and staff may.
Even listing the webhooks is for moderators: a webhook URL may itself be a credential
(a Slack incoming-webhook URL is). A webhook's secret is write-only: nothing here returns
it, and `webhook_dict` (what the API and the page show) leaves it out.
"""

from __future__ import annotations

from typing import Any

from sectr.errors import NotFound, ValidationFailed
from sessions_app.actions.members import moderated_team
from sessions_app.addresses import check_webhook_url
from sessions_app.models import Team, TeamWebhook

#: TeamWebhook.secret's max_length.
SECRET_MAX_LENGTH = 200
KINDS = tuple(kind for kind, _label in TeamWebhook.KIND_CHOICES)


def webhook_dict(webhook: TeamWebhook) -> dict[str, Any]:
    """A webhook as it is shown: never its secret."""
    return {
        "id": webhook.pk,
        "url": webhook.url,
        "kind": webhook.kind,
        "active": webhook.active,
        "created_at": webhook.created_at.isoformat(),
    }


def list_webhooks(actor: Any, team_name: Any) -> list[TeamWebhook]:
    """The team's webhooks, oldest first, for its moderators only: a webhook URL may itself
    be a credential (a Slack incoming-webhook URL is)."""
    team = moderated_team(actor, team_name, "its webhooks")
    return list(TeamWebhook.objects.filter(team=team).order_by("created_at", "id"))


def check_kind(kind: Any) -> str:
    if kind not in KINDS:
        raise ValidationFailed(f"kind must be one of {', '.join(KINDS)}", code="invalid_kind")
    return str(kind)


def check_secret(secret: Any) -> str | None:
    """A secret to sign deliveries with, or None (a random one is made)."""
    if secret is None or secret == "":
        return None
    if not isinstance(secret, str) or len(secret) > SECRET_MAX_LENGTH:
        raise ValidationFailed(f"a secret is text of at most {SECRET_MAX_LENGTH} characters", code="invalid_secret")
    if any(ch.isspace() or ord(ch) < 32 or ord(ch) == 127 for ch in secret):
        raise ValidationFailed("a secret must not contain spaces or control characters", code="invalid_secret")
    return secret


def do_add_webhook(
    actor: Any, team_name: Any, url: Any, kind: Any = TeamWebhook.JSON, secret: Any = None
) -> TeamWebhook:
    """Add a webhook: `url` must pass the address guard (check_webhook_url), `kind` is
    json or slack, `secret` signs the JSON deliveries (made up when left out)."""
    team = moderated_team(actor, team_name, "its webhooks")
    kind = check_kind(kind)
    secret = check_secret(secret)
    if url is None:
        raise ValidationFailed("url is required", code="url")
    check_webhook_url(url)
    fields: dict[str, Any] = {"team": team, "url": url, "kind": kind}
    if secret is not None:
        fields["secret"] = secret
    return TeamWebhook.objects.create(**fields)


def do_delete_webhook(actor: Any, team_name: Any, webhook_id: Any) -> None:
    """Delete one of the team's webhooks (and its delivery log); `webhook_id` is its id, or
    its id in decimal digits (as a URL names it)."""
    team = moderated_team(actor, team_name, "its webhooks")
    if isinstance(webhook_id, str) and webhook_id.isascii() and webhook_id.isdigit() and len(webhook_id) <= 18:
        webhook_id = int(webhook_id)
    if isinstance(webhook_id, bool) or not isinstance(webhook_id, int):
        raise NotFound("no such webhook")
    deleted, _ = TeamWebhook.objects.filter(team=team, pk=webhook_id).delete()
    if not deleted:
        raise NotFound("no such webhook")


def do_set_links_decide_without_login(actor: Any, team_name: Any, enabled: Any) -> Team:
    """Turn `Links decide without login` on or off: when on, an email's action link (bound
    to one moderator and one ask) decides without a login; a webhook's never does."""
    team = moderated_team(actor, team_name, "how its links decide")
    if not isinstance(enabled, bool):
        raise ValidationFailed("links_decide_without_login is true or false", code="invalid_setting")
    Team.objects.filter(pk=team.pk).update(links_decide_without_login=enabled)
    team.links_decide_without_login = enabled
    return team
