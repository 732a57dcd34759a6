"""Account settings pages: the user's API tokens and share links."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from sectr.errors import SectrError
from sessions_app.actions import tokens as token_actions
from sessions_app.models import ApiToken, ShareLink
from sessions_app.review import actions as review_actions
from sessions_app.web import HtmxHttpRequest, refusals_as_messages


@login_required
@require_http_methods(["GET", "POST"])
def tokens(request: HtmxHttpRequest) -> HttpResponse:
    """The user's API tokens; POST issues one and shows its secret once (never stored)."""
    secret: str | None = None
    issued = None
    error: str | None = None
    if request.method == "POST":
        try:
            issued, secret = token_actions.do_issue_token(request.user, request.POST.get("name", ""))
        except SectrError as exc:
            error = exc.message
    user: Any = request.user
    listed = ApiToken.objects.filter(user=user).order_by("-created_at")
    response = render(
        request, "accounts/tokens.html", {"tokens": listed, "secret": secret, "issued": issued, "error": error}
    )
    # The page may hold a secret: no cache may keep it.
    response["Cache-Control"] = "no-store"
    return response


@login_required
@require_POST
@refusals_as_messages
def revoke_token(request: HtmxHttpRequest, token_id: int) -> HttpResponse:
    token = token_actions.do_revoke_token_by_id(request.user, token_id)
    messages.info(request, f"Revoked {token.name} ({token.prefix}…).")
    return redirect("tokens")


@login_required
@require_GET
def shares(request: HtmxHttpRequest) -> HttpResponse:
    """The user's share links, newest first, with `Revoke`; for a team's moderators (and
    staff) also every link of their teams' sessions, whoever made it, with `Revoke`."""
    user: Any = request.user
    listed = ShareLink.objects.filter(created_by=user).select_related("session", "created_by").order_by("-created_at")
    team_links = (
        review_actions.team_shares_for(user)
        .select_related("session", "session__team", "created_by")
        .order_by("session__team__name", "-created_at")
    )
    new_id = request.GET.get("new", "")
    context = {
        "shares": [
            (share, request.build_absolute_uri(reverse("shared", args=[share.token])), _works(share))
            for share in listed
        ],
        # No URL here: the token is the credential, and a moderator's part is to revoke.
        "team_shares": [(share, _works(share)) for share in team_links],
        "moderates": review_actions.moderates_any_team(user),
        "new_id": int(new_id) if new_id.isdigit() else None,
        "now": timezone.now(),
    }
    return render(request, "accounts/shares.html", context)


def _works(share: ShareLink) -> bool:
    return share.revoked_at is None and share.is_live() and review_actions.creator_still_shares(share)


@login_required
@require_POST
@refusals_as_messages
def revoke_share(request: HtmxHttpRequest, share_id: int) -> HttpResponse:
    share = review_actions.do_revoke_share(request.user, share_id)
    messages.info(request, f"Revoked the share link of {share.session.title or share.session_id}.")
    return redirect("shares")
