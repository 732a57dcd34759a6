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

from sectr.errors import Forbidden, NotFound, SectrError
from sessions_app import access
from sessions_app.media import missing_media
from sessions_app.models import (
    ForkLink,
    Rating,
    ReviewMark,
    ReviewNote,
    Session,
)
from sessions_app.review import actions, export, scores, search, usage
from sessions_app.review.navigation import item_address, queue_nav
from sessions_app.review.panels import snapshot_fields
from sessions_app.review.transcript import build_timeline
from sessions_app.web import HtmxHttpRequest, get_session_for_request, http_refusal, page_refusals

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
    form = search.SearchFilterForm(data=request.GET, viewer=request.user)
    filters = search.Filters.from_form(form)
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
        "form": form,
        "query": urlencode(filters.as_query()),
        "score_names": scores.score_names_for(request.user),
        "queues": queues,
        "is_reviewer": True,
        "can_experiment": access.has_any_role(request.user, "moderator"),
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
    return queue_nav(user, queue, session_id=session.pk)


def _rating_block(
    user: Any,
    session: Session,
    ratings: list[Rating],
    definitions: list[scores.ScoreDef],
    *,
    seq: int,
    message_id: str,
    here: str,
    error: str = "",
    saved: bool = False,
    posted: Any = None,
) -> dict[str, Any]:
    """What the rating partial (review/_rating_block.html) shows for the session (seq 0)
    or one message: reviewers' ratings of it, and the form, filled with the user's own
    rating (or, after a refusal, with what they sent)."""
    form_id = str(seq) if seq else "session"
    mine = next((r for r in ratings if r.author_id == user.pk), None)
    if posted is not None:
        thumbs = str(posted.get("thumbs") or "")
        score = str(posted.get("score") or "")
        tags = str(posted.get("tags") or "")
        comment = str(posted.get("comment") or "")
        given = {d.name: str(posted.get(f"s.{d.name}") or "") for d in definitions}
    else:
        thumbs = {1: "up", -1: "down"}.get(mine.thumbs or 0, "") if mine else ""
        score = str(mine.score or "") if mine else ""
        tags = ", ".join(mine.tags or []) if mine else ""
        comment = mine.comment if mine else ""
        stored = (mine.values or {}) if mine else {}
        given = {d.name: scores.value_text(stored[d.name]) if d.name in stored else "" for d in definitions}
    return {
        "id": f"rating-{form_id}",
        "form_id": form_id,
        "seq": seq,
        "message_id": message_id,
        "ratings": [(r, scores.rating_values(r)) for r in ratings],
        "fields": [(d, given.get(d.name, "")) for d in definitions if not d.built_in],
        "thumbs": thumbs,
        "score": score,
        "tags": tags,
        "comment": comment,
        "error": error,
        "saved": saved,
        "here": here,
    }


def _reviewer_ratings(session: Session, seq: int | None = None) -> list[Rating]:
    rows = Rating.objects.filter(session=session, source=Rating.REVIEWER)
    if seq is not None:
        rows = rows.filter(seq=seq)
    return list(rows.select_related("author").order_by("seq", "created_at"))


@login_required
@require_GET
def review_session(request: HtmxHttpRequest, session_id: str) -> HttpResponse:
    _require_reviewer(request)
    session = get_session_for_request(request, session_id, "review")
    envelopes = export.load_envelopes(session)
    missing = missing_media(request.user, session, (e.payload for e in envelopes))
    timeline = build_timeline(envelopes, media_session=session.pk, missing_media=missing)
    here = request.get_full_path()
    definitions = scores.team_scores(session.team_id)
    ratings = list(Rating.objects.filter(session=session).select_related("author").order_by("seq", "created_at"))
    by_seq: dict[int, list[Rating]] = {}
    for rating in ratings:
        if rating.source == Rating.REVIEWER:
            by_seq.setdefault(rating.seq, []).append(rating)
    end_user = {r.message_id: r.thumbs for r in ratings if r.source == Rating.END_USER}
    for entry in timeline:
        end_seq = entry.details.get("end_seq")
        if entry.kind == "assistant" and end_seq:
            entry.details["rating"] = _rating_block(
                request.user,
                session,
                by_seq.get(end_seq, []),
                definitions,
                seq=end_seq,
                message_id=entry.message_id,
                here=here,
            )
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
        "session_rating": _rating_block(
            request.user, session, by_seq.get(0, []), definitions, seq=0, message_id="", here=here
        ),
        "end_user_up": sum(1 for r in ratings if r.source == Rating.END_USER and (r.thumbs or 0) > 0),
        "end_user_down": sum(1 for r in ratings if r.source == Rating.END_USER and (r.thumbs or 0) < 0),
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
        "here": here,
    }
    return render(request, "review/review_session.html", context)


# ---- judge ----


def posted_values(post: Any) -> dict[str, str]:
    """The team's scores from a rating form: its fields named `s.<score name>`."""
    return {key[2:]: str(value) for key, value in post.items() if key.startswith("s.")}


@login_required
@require_POST
def rate(request: HtmxHttpRequest, session_id: str) -> HttpResponse:
    """Save a reviewer's rating. From htmx, the answer is the rating's own block (its
    ratings and form), saved or with the refusal in it, swapped in place; otherwise a
    redirect back with a message."""
    message_id = str(request.POST.get("message_id", ""))
    error = ""
    try:
        rating = actions.do_rate(
            request.user,
            session_id,
            thumbs=request.POST.get("thumbs") or None,
            message_id=message_id,
            score=request.POST.get("score") or None,
            tags=request.POST.get("tags", ""),
            comment=request.POST.get("comment", ""),
            values=posted_values(request.POST),
        )
    except (NotFound, Forbidden) as exc:
        raise http_refusal(exc, not_found="no such session") from None
    except SectrError as exc:
        if not request.htmx:
            messages.error(request, exc.message)
            return redirect(_back(request))
        error = exc.message
    if not request.htmx:
        messages.success(request, "Rating saved.")
        return redirect(_back(request))
    session = access.get_session_for_user(request.user, session_id, "review")
    try:
        seq = rating.seq if not error else (actions.message_end_seq(session, message_id) if message_id else 0)
    except NotFound:
        raise Http404("no such message") from None
    block = _rating_block(
        request.user,
        session,
        _reviewer_ratings(session, seq),
        scores.team_scores(session.team_id),
        seq=seq,
        message_id=message_id,
        here=_back(request).split("#", 1)[0],
        error=error,
        saved=not error,
        posted=request.POST if error else None,
    )
    response = render(request, "review/_rating_block.html", {"block": block, "session": session, "can_review": True})
    if error:
        response.status_code = 400
    return response


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
    items = list(actions.queue_items_for(request.user, queue).select_related("session", "assignee", "pair__experiment"))
    username = request.user.get_username()
    mine = [item for item in items if item.assignee_id in (None, request.user.pk)]
    first_open = next((item for item in mine if item.done_at is None), None) or next(
        (item for item in items if item.done_at is None), None
    )
    shares = actions.queue_shares(queue)
    oversees = actions.oversees_queue(request.user, queue)
    context = {
        "queue": queue,
        "items": items,
        "done_count": sum(1 for item in items if item.done_at is not None),
        "first_open": first_open,
        "reviewers": list(queue.reviewers.order_by("username")),
        "shares": shares,
        "progress": actions.progress_text(shares, username),
        "oversees": oversees,
        "sees_all": oversees,
    }
    return render(request, "review/queue.html", context)


def _assigned_text(assigned: dict[str, int]) -> str:
    """ "carol (1), dave (1)" or "anyone" for the unassigned."""
    if list(assigned) == [""]:
        return "nobody in particular (the queue has no reviewers)"
    return ", ".join(f"{who or 'anyone'} ({count})" for who, count in assigned.items())


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
    result = actions.do_add_to_queue(request.user, int(queue_id), sessions)
    queue = actions.get_queue_for_user(request.user, int(queue_id))
    note = f" ({result.duplicates} already in it, not added again)" if result.duplicates else ""
    plural = "s" if result.added != 1 else ""
    to_whom = f", assigned to {_assigned_text(result.assigned)}" if result.added else ""
    messages.success(request, f"Added {result.added} session{plural} to {queue.name}{to_whom}{note}.")
    return redirect(_back(request))


@login_required
@require_POST
@review_refusals
def assign_queue_item(request: HtmxHttpRequest, item_id: int) -> HttpResponse:
    """Hand an item to another of the queue's reviewers ("" : to anyone)."""
    username = str(request.POST.get("assignee") or "")
    person = get_user_model().objects.filter(username=username).first() if username else None
    if username and person is None:
        raise SectrError(f"No such user: {username}", code="assignee")
    item = actions.do_assign(request.user, item_id, person)
    messages.success(request, f"Item {item.position} assigned to {username or 'anyone'}.")
    return redirect(_back(request))


@login_required
@require_POST
@review_refusals
def queue_item_done(request: HtmxHttpRequest, item_id: int) -> HttpResponse:
    item = actions.do_mark_item_done(request.user, item_id, request.POST.get("done", "1") == "1")
    progress = actions.progress_text(actions.queue_shares(item.queue), request.user.get_username())
    messages.success(request, f"{'Done' if item.done_at else 'Reopened'}: {progress}")
    # `then` names the item to review next (a session or a pair); it leads only to
    # another item of this queue the user works through (anything else, however it is
    # spelled, goes back).
    target = str(request.POST.get("then") or "")
    if target.isdigit() and len(target) <= 18:
        following = (
            actions.queue_items_for(request.user, item.queue)
            .filter(pk=int(target))
            .values_list("pk", "session_id", "pair_id")
            .first()
        )
        if following is not None:
            return redirect(item_address(item.queue_id, *following))
    return redirect(_back(request))


# ---- export and share ----


@login_required
@require_GET
@review_refusals
def export_session(request: HtmxHttpRequest, session_id: str, fmt: str) -> HttpResponse:
    session = access.get_session_for_user(request.user, session_id, "review")
    if fmt == "json":
        media_for = request.user if request.GET.get("media") == "1" else None  # the opt-in media section
        response = HttpResponse(export.export_json(session, media_for), content_type="application/json")
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
    notes, ratings, other sessions, media or controls). Public by design (unless the
    link asks for login): the token is the credential. A link that shows nothing
    (revoked, expired, stopped, asking for a login, unknown) answers 404 with a plain
    page that says which, and nothing of the session."""
    try:
        share = actions.live_share(token, request.user)
    except NotFound:
        reason, gone = actions.why_share_fails(token, request.user)
        context = {"reason": reason, "share": gone, "login_next": request.get_full_path()}
        response = render(request, "review/share_gone.html", context, status=404)
        response["Cache-Control"] = "no-store"
        response["X-Robots-Tag"] = "noindex"
        return response
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
    ratings = scores.dashboard(request.user, report.date_from, report.date_to, report.team)
    return render(request, "review/usage.html", {"report": report, "score_dashboard": ratings})
