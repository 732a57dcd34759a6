"""Team review: the sessions a reviewer may read, and one session read-only with its
snapshot and usage."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from sessions_app import access
from sessions_app.chat.views import build_view_model
from sessions_app.journal import snapshots
from sessions_app.models import Session
from sessions_app.web import HtmxHttpRequest, get_session_for_request


def _require_reviewer(request: HtmxHttpRequest) -> None:
    if not access.has_any_role(request.user, "reviewer"):
        raise PermissionDenied("team review is for reviewers and moderators of a team, and staff")


@login_required
@require_GET
def review(request: HtmxHttpRequest) -> HttpResponse:
    _require_reviewer(request)
    sessions = access.reviewable_sessions(request.user).select_related("owner").order_by("-updated_at")
    owner = request.GET.get("owner", "").strip()
    if owner:
        sessions = sessions.filter(owner__username=owner)
    page = Paginator(sessions, 50).get_page(request.GET.get("page"))
    return render(request, "review/review.html", {"page": page, "owner": owner})


def _when(iso: str | None) -> str:
    return f"{iso[:19].replace('T', ' ')} UTC" if iso else "—"


def snapshot_fields(session: Session) -> list[tuple[str, Any]]:
    """The snapshot of SPEC section 6 (sessions_app.journal.snapshots, as the API serves it) as rows."""
    snap = snapshots.snapshot(session)
    model = snap["resolved_model"]
    ask = snap["pending_ask"]
    origin = snap.get("forked_from")
    media = [kind for kind, accepted in snap["media"].items() if accepted]
    placement = snap.get("placement")
    return [
        ("id", snap["id"]),
        ("owner", snap["owner"]),
        ("state", snap["state"]),
        ("mode", snap["mode"]),
        ("title", snap["title"] or ""),
        ("model", f"{model['provider_id']} / {model['model_id']}"),
        ("context window", model["context_window"]),
        ("reasoning effort", model["reasoning_effort"] or "provider default"),
        ("limits", ", ".join(f"{key} {value}" for key, value in snap["limits"].items())),
        ("turns", snap["turns"]),
        ("tool calls", snap["tool_calls"]),
        ("media", ", ".join(media) or "none"),
        ("pending ask", f"{ask['name']} ({ask['ask_id']})" if ask else "none"),
        ("placement", (placement.get("worker") or "not yet claimed") if placement else "—"),
        ("forked from", f"{origin.get('session_id')} at #{origin.get('seq')}" if origin else "—"),
        ("stop reason", snap.get("stop_reason") or "—"),
        ("last error", snap.get("last_error") or "—"),
        ("created", _when(snap["created_at"])),
        ("updated", _when(snap["updated_at"])),
        ("events", snap.get("last_seq")),
    ]


@login_required
@require_GET
def review_session(request: HtmxHttpRequest, session_id: str) -> HttpResponse:
    _require_reviewer(request)
    session = get_session_for_request(request, session_id, "review")
    vm = build_view_model(session)
    context = {
        "vm": vm,
        "session": session,
        "session_id": session.pk,
        "snapshot": snapshot_fields(session),
        "usage_by_model": sorted(vm.state.usage.items()),
        # Read-only: no decisions, no forks from the review page.
        "can_write": False,
        "can_approve": False,
        "can_fork": False,
    }
    return render(request, "review/review_session.html", context)
