"""Team review pages: find sessions (/review/), read one (/review/<id>/), judge it
(ratings, reviewed mark, notes, queues), export and share it, and the usage page.

Views are thin: lookups that 404 strangers come first (sessions_app.access), every
change goes through sessions_app.review.actions.
"""

from __future__ import annotations

from typing import Any, ParamSpec
from urllib.parse import urlencode

from django.contrib import messages
from django.contrib.auth import get_user_model
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.db.models import Count, Q
from django.http import Http404, HttpRequest, HttpResponse, StreamingHttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from sectr.errors import NotFound, SectrError
from sessions_app import access
from sessions_app.models import (
    ForkLink,
    Rating,
    ReviewMark,
    ReviewNote,
    Session,
)
from sessions_app.review import actions, export, search, usage
from sessions_app.review.panels import snapshot_fields
from sessions_app.review.transcript import build_timeline
from sessions_app.web import HtmxHttpRequest, get_session_for_request, page_refusals

_P = ParamSpec("_P")
PAGE_SIZE = 25


def _back(request: HttpRequest) -> str:
    """Where a form came from: its `next` field if it is a local path, else /review/."""
    target = str(request.POST.get("next") or request.GET.get("next") or "")
    return target if target.startswith("/") and not target.startswith("//") else reverse("review")


#: A refused review action: 404/403 as such, anything else a message on the page it came from.
review_refusals = page_refusals(back=lambda request, _kwargs: _back(request), htmx_flash=False)


def _require_reviewer(request: HtmxHttpRequest) -> None:
    """The review pages are for reviewers and moderators of some team, and staff (what
    each of them shows is then narrowed to their teams' sessions by sessions_app.access)."""
    if not access.has_any_role(request.user, "reviewer"):
        raise PermissionDenied("team review is for reviewers and moderators of a team, and staff")


# ---- find ----


@login_required
@require_GET
def review(request: HtmxHttpRequest) -> HttpResponse:
    _require_reviewer(request)
    filters = search.Filters.from_query(request.GET)
    for error in filters.errors:
        messages.warning(request, error)
    # The list shows none of the cached projection's JSON: don't read it.
    sessions = search.search_sessions(request.user, filters).defer("state", "limits")
    page = search.ResultPage.of(sessions, request.GET.get("page"), PAGE_SIZE)
    rows = page.object_list
    found = search.snippets_for([s.pk for s in rows], filters.q)
    reviewed = set(ReviewMark.objects.filter(session__in=rows).values_list("session_id", flat=True))
    queues = actions.queues_for(request.user).select_related("team").order_by("team__name", "name")
    context = {
        "page": page,
        "rows": [(s, found.get(s.pk), s.pk in reviewed) for s in rows],
        "filters": filters,
        "query": urlencode(filters.as_query()),
        "states": search.STATES,
        "queues": queues,
        "is_reviewer": True,
        "sectr_can_review": True,  # the menu's own lookup (sessions_app.web.team_roles), known here
    }
    return render(request, "review/review.html", context)


@login_required
@require_GET
def export_results(request: HtmxHttpRequest) -> StreamingHttpResponse:
    """Every session the search finds, one JSON export a line (JSONL), streamed."""
    if not access.has_any_role(request.user, "reviewer"):
        raise PermissionDenied("bulk export is for reviewers")
    filters = search.Filters.from_query(request.GET)
    sessions = search.search_sessions(request.user, filters)
    response = StreamingHttpResponse(export.export_jsonl(sessions), content_type="application/x-ndjson")
    response["Content-Disposition"] = 'attachment; filename="sectr-sessions.jsonl"'
    return response


# ---- read ----


def _fork_links(user: Any, session: Session) -> tuple[Any, list[Any]]:
    source = ForkLink.objects.select_related("source").filter(child=session).first()
    source_view = None
    if source is not None and access.can_read(user, source.source):
        source_view = source
    children = [
        link
        for link in ForkLink.objects.select_related("child").filter(source=session).order_by("child__created_at")[:50]
        if access.can_read(user, link.child)
    ]
    return source_view, children


def _queue_nav(user: Any, session: Session, queue_id: str | None) -> dict[str, Any] | None:
    if not queue_id or not queue_id.isdigit():
        return None
    try:
        queue = actions.get_queue_for_user(user, int(queue_id))
    except NotFound:
        return None
    items = list(actions.queue_items_for(user, queue).values_list("pk", "session_id", "done_at"))
    index = next((i for i, (_, sid, _) in enumerate(items) if sid == session.pk), None)
    if index is None:
        return None
    return {
        "queue": queue,
        "item_id": items[index][0],
        "done": items[index][2] is not None,
        "position": index + 1,
        "count": len(items),
        "done_count": sum(1 for _, _, done in items if done is not None),
        "previous": items[index - 1][1] if index > 0 else None,
        "next": items[index + 1][1] if index + 1 < len(items) else None,
    }


@login_required
@require_GET
def review_session(request: HtmxHttpRequest, session_id: str) -> HttpResponse:
    _require_reviewer(request)
    session = get_session_for_request(request, session_id, "review")
    timeline = build_timeline(export.load_envelopes(session))
    ratings = list(Rating.objects.filter(session=session).select_related("author").order_by("seq", "created_at"))
    reviewer_ratings = [r for r in ratings if r.source == Rating.REVIEWER]
    by_seq: dict[int, list[Rating]] = {}
    for rating in reviewer_ratings:
        by_seq.setdefault(rating.seq, []).append(rating)
    end_user = {r.message_id: r.thumbs for r in ratings if r.source == Rating.END_USER}
    for entry in timeline:
        end_seq = entry.details.get("end_seq")
        if entry.kind == "assistant" and end_seq:
            entry.details["ratings"] = by_seq.get(end_seq, [])
            entry.details["end_user_thumbs"] = end_user.get(entry.message_id)
    source, children = _fork_links(request.user, session)
    state = session.projection()
    mark = ReviewMark.objects.select_related("reviewed_by").filter(session=session).first()
    context = {
        "session": session,
        "timeline": timeline,
        "snapshot": snapshot_fields(session),
        "usage_by_model": sorted(state.usage.items()),
        "total_usage": state.total_usage,
        "session_ratings": by_seq.get(0, []),
        "end_user_up": sum(1 for r in ratings if r.source == Rating.END_USER and r.thumbs > 0),
        "end_user_down": sum(1 for r in ratings if r.source == Rating.END_USER and r.thumbs < 0),
        "notes": ReviewNote.objects.filter(session=session).select_related("author"),
        "fork_source": source,
        "fork_children": children,
        "mark": mark,
        "can_review": access.can_review(request.user, session),
        # Only the queues of the session's team take it (sessions_app.review.actions).
        "queues": actions.queues_for(request.user).filter(team_id=session.team_id).order_by("name")
        if session.team_id is not None
        else [],
        "queue_nav": _queue_nav(request.user, session, request.GET.get("queue")),
        "here": request.get_full_path(),
    }
    return render(request, "review/review_session.html", context)


# ---- judge ----


@login_required
@require_POST
@review_refusals
def rate(request: HtmxHttpRequest, session_id: str) -> HttpResponse:
    actions.do_rate(
        request.user,
        session_id,
        thumbs=request.POST.get("thumbs"),
        message_id=request.POST.get("message_id", ""),
        score=request.POST.get("score") or None,
        tags=request.POST.get("tags", ""),
        comment=request.POST.get("comment", ""),
    )
    messages.success(request, "Rating saved.")
    return redirect(_back(request))


@login_required
@require_POST
@review_refusals
def set_reviewed(request: HtmxHttpRequest, session_id: str) -> HttpResponse:
    reviewed = actions.do_set_reviewed(request.user, session_id, request.POST.get("reviewed") == "1")
    messages.success(request, "Marked reviewed." if reviewed else "Marked unreviewed.")
    return redirect(_back(request))


@login_required
@require_POST
@review_refusals
def add_note(request: HtmxHttpRequest, session_id: str) -> HttpResponse:
    actions.do_add_note(request.user, session_id, request.POST.get("body", ""))
    messages.success(request, "Note added.")
    return redirect(_back(request))


@login_required
@require_POST
@review_refusals
def end_user_feedback(request: HtmxHttpRequest, session_id: str, message_id: str) -> HttpResponse:
    """The chat page's thumbs on an assistant message (the session owner's own feedback)."""
    rating = actions.do_end_user_feedback(request.user, session_id, message_id, request.POST.get("thumbs"))
    if request.htmx:
        return render(
            request,
            "review/_thumbs.html",
            {"session_id": session_id, "message_id": message_id, "thumbs": rating.thumbs},
        )
    return redirect(reverse("chat", args=[session_id]))


# ---- queues ----


@login_required
def queues(request: HtmxHttpRequest) -> HttpResponse:
    if not access.has_any_role(request.user, "reviewer"):
        raise PermissionDenied("review queues are for reviewers")
    if request.method == "POST":
        try:
            usernames = [u.strip() for u in request.POST.get("reviewers", "").split(",") if u.strip()]
            people = list(get_user_model().objects.filter(username__in=usernames))
            missing = set(usernames) - {p.get_username() for p in people}
            if missing:
                messages.error(request, f"No such user: {', '.join(sorted(missing))}")
            else:
                queue = actions.do_create_queue(
                    request.user, request.POST.get("name"), people, team=request.POST.get("team") or None
                )
                messages.success(request, f"Queue {queue.name} created.")
                return redirect("review_queue", queue_id=queue.pk)
        except SectrError as exc:
            messages.error(request, exc.message)
    listed = (
        actions.queues_for(request.user)
        .select_related("team")
        .annotate(total=Count("items"), done=Count("items", filter=Q(items__done_at__isnull=False)))
        .order_by("team__name", "name")
    )
    teams = access.teams_for(request.user, "reviewer").order_by("name")
    return render(request, "review/queues.html", {"queues": listed, "teams": teams})


@login_required
@require_GET
@review_refusals
def review_queue(request: HtmxHttpRequest, queue_id: int) -> HttpResponse:
    queue = actions.get_queue_for_user(request.user, queue_id)
    items = list(actions.queue_items_for(request.user, queue).select_related("session", "assignee"))
    first_open = next((item for item in items if item.done_at is None), None)
    context = {
        "queue": queue,
        "items": items,
        "done_count": sum(1 for item in items if item.done_at is not None),
        "first_open": first_open,
        "reviewers": queue.reviewers.order_by("username"),
    }
    return render(request, "review/queue.html", context)


@login_required
@require_POST
@review_refusals
def add_to_queue(request: HtmxHttpRequest) -> HttpResponse:
    """Put one session (`session_id`) or every result of a search (the filters) in a queue."""
    queue_id = request.POST.get("queue", "")
    if not queue_id.isdigit():
        raise SectrError("choose a queue", code="queue")
    session_id = request.POST.get("session_id")
    if session_id:
        sessions: Any = [access.get_session_for_user(request.user, session_id, "read")]
    else:
        sessions = search.search_sessions(request.user, search.Filters.from_query(request.POST))
    added, duplicates = actions.do_add_to_queue(request.user, int(queue_id), sessions)
    note = f" ({duplicates} already in it, not added again)" if duplicates else ""
    messages.success(request, f"Added {added} session{'s' if added != 1 else ''} to the queue{note}.")
    return redirect(_back(request))


@login_required
@require_POST
@review_refusals
def queue_item_done(request: HtmxHttpRequest, item_id: int) -> HttpResponse:
    item = actions.do_mark_item_done(request.user, item_id, request.POST.get("done", "1") == "1")
    # `then` names the session to review next; it leads only to another item of this
    # queue the user works through (anything else, however it is spelled, goes back).
    target = request.POST.get("then")
    if target and actions.queue_items_for(request.user, item.queue).filter(session_id=target).exists():
        return redirect(f"{reverse('review_session', args=[target])}?queue={item.queue_id}")
    return redirect(_back(request))


# ---- export and share ----


@login_required
@require_GET
@review_refusals
def export_session(request: HtmxHttpRequest, session_id: str, fmt: str) -> HttpResponse:
    session = access.get_session_for_user(request.user, session_id, "review")
    if fmt == "json":
        response = HttpResponse(export.export_json(session), content_type="application/json")
        response["Content-Disposition"] = f'attachment; filename="{session.pk}.json"'
    else:
        response = HttpResponse(export.export_markdown(session), content_type="text/markdown; charset=utf-8")
        response["Content-Disposition"] = f'attachment; filename="{session.pk}.md"'
    return response


@login_required
@require_POST
@review_refusals
def create_share(request: HtmxHttpRequest, session_id: str) -> HttpResponse:
    share = actions.do_create_share(
        request.user,
        session_id,
        days=request.POST.get("days") or 7,
        require_login=request.POST.get("require_login") == "1",
    )
    url = request.build_absolute_uri(reverse("shared", args=[share.token]))
    messages.success(request, f"Share link created: {url}")
    return redirect(f"{reverse('shares')}?new={share.pk}")


@require_GET
def shared(request: HttpRequest, token: str) -> HttpResponse:
    """A share link's page: that transcript as of the link's seq and nothing else (no
    notes, ratings, other sessions, media or controls). 404 when revoked or expired.
    Public by design (unless the link asks for login): the token is the credential."""
    try:
        share = actions.live_share(token, request.user)
    except NotFound:
        raise Http404("no such link") from None
    session = share.session
    timeline = build_timeline(export.load_envelopes(session, share.seq))
    response = render(request, "review/shared.html", {"share": share, "session": session, "timeline": timeline})
    response["Cache-Control"] = "no-store"
    response["X-Robots-Tag"] = "noindex"
    return response


# ---- usage ----


@login_required
@require_GET
def usage_page(request: HtmxHttpRequest) -> HttpResponse:
    _require_reviewer(request)
    report = usage.build_report(request.user, request.GET)
    return render(request, "review/usage.html", {"report": report})
