"""The moderation queue's views: the pending asks a user may decide, and deciding one.

Deciding goes through actions.do_decide, which checks the user's right to approve under
the session lock; the card rendered afterwards shows the ask as it is now (decided by
this request, or by someone faster).
"""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.template.loader import render_to_string
from django.views.decorators.http import require_GET, require_POST

from sectr.errors import Forbidden, NotFound, SectrError
from sessions_app import access, actions
from sessions_app.chat.view_model import ApprovalView
from sessions_app.web import HtmxHttpRequest, refusals_as_messages


def pending_approvals(user: Any) -> list[ApprovalView]:
    """Every pending ask `user` may decide: their own sessions' and their moderated teams'."""
    sessions = access.approvable_sessions(user).filter(status="awaiting").select_related("owner").order_by("updated_at")
    cards = []
    for session in sessions:
        ask = session.projection().pending_ask
        if ask:
            card = ApprovalView.from_ask(ask, session.pk)
            card.session_title = session.title
            card.owner = session.owner.get_username()
            cards.append(card)
    return cards


@login_required
@require_GET
def approvals(request: HtmxHttpRequest) -> HttpResponse:
    context = {
        "cards": pending_approvals(request.user),
        "can_approve": True,  # pending_approvals lists only asks this user may decide
        "show_session": True,
        "is_moderator": access.has_any_role(request.user, "moderator"),
    }
    if request.htmx and request.GET.get("partial") == "queue":
        return render(request, "moderation/_approval_queue.html", context)
    return render(request, "moderation/approvals.html", context)


@login_required
@require_POST
@refusals_as_messages
def decide(request: HtmxHttpRequest, ask_id: str) -> HttpResponse:
    verdict = request.POST.get("verdict", "")
    note = request.POST.get("note") or None
    try:
        actions.do_decide(request.user, ask_id, verdict, note=note)
    except SectrError as exc:
        if isinstance(exc, NotFound | Forbidden):
            raise
        refused: SectrError | None = exc
    else:
        refused = None
    # The card as it is now (decided by this request or by someone faster).
    session = actions.find_ask_session(ask_id)
    access.check_access(request.user, session, "read")
    where_queue = request.POST.get("where") == "queue"
    if not request.htmx:
        if refused is not None:
            messages.error(request, refused.message)
        return redirect("approvals") if where_queue else redirect("chat", session_id=session.pk)
    ask = session.projection().asks.get(ask_id, {})
    card = ApprovalView.from_ask(ask, session.pk)
    if where_queue:
        card.session_title = session.title
        card.owner = session.owner.get_username()
    html: str = render_to_string(
        "chat/_approval.html",
        {"item": card, "can_approve": access.can_approve(request.user, session), "show_session": where_queue},
        request=request,
    )
    if refused is not None:
        flash = render_to_string("chat/_flash.html", {"message": refused.message, "level": "error"})
        html += f'<div id="flash" hx-swap-oob="innerHTML">{flash}</div>'
    return HttpResponse(html)
