"""The chat's views: thin, each calls an action (or reads a session) and answers.

A view that changes a session calls its action without looking the session up first:
the action checks who is asking on the row it locks (404 for strangers, 403 for
readers, nothing written). A view that shows a session goes through
`get_session_for_request`. Either way a permission check never lives only in a template.
htmx requests get just the partial they need (or nothing: the session's websocket
brings the change to every tab); plain form posts get a redirect with a message, so
the pages also work without JavaScript, minus the live updates.

A refused operation (a sectr.errors.SectrError) becomes a flash message: for htmx it
is retargeted into the page's #flash with the error's status (base.html tells htmx to
swap 4xx answers), for a plain post it is a Django message on the redirected page.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.db.models import Q, QuerySet
from django.http import FileResponse, Http404, HttpResponse, HttpResponseBase
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.cache import cache_control
from django.views.decorators.http import require_GET, require_POST
from django_htmx.http import trigger_client_event

import sectr
from sectr.errors import ValidationFailed
from sectr.events import EventType
from sessions_app import access, actions
from sessions_app.chat.render import MODE_LABELS, chat_context, mode_choices, model_choices, session_agent_label
from sessions_app.chat.view_model import ChatViewModel, UserView
from sessions_app.input_checks import is_whole_number
from sessions_app.journal import get_journal
from sessions_app.media import PART_MAX_BYTES, missing_media, readable_blob
from sessions_app.models import AgentVersion, Envelope, Rating, Run, Session, Team
from sessions_app.provider_config import default_model
from sessions_app.web import HtmxHttpRequest, flash, get_session_for_request, go_to, refusals_as_messages


def _done(
    request: HtmxHttpRequest, session_id: str, message: str | None = None, *, event: str | None = None
) -> HttpResponse:
    """Success: nothing to swap (the websocket shows the change), or a note in #flash."""
    if request.htmx:
        response = flash(message) if message else HttpResponse(status=204)
        if event:
            trigger_client_event(response, event)
        return response
    if message:
        messages.info(request, message)
    return redirect("chat", session_id=session_id)


def build_view_model(session: Session, user: Any = None) -> ChatViewModel:
    """The chat's items from one read of the whole journal; with `user`, the media it
    cannot read here are named as not available rather than shown as broken images."""
    envelopes = get_journal().load_sync(session.pk, 0)
    missing = missing_media(user, session, (e.payload for e in envelopes)) if user is not None else frozenset()
    return ChatViewModel.from_envelopes(session.pk, envelopes, missing)


def page_context(user: Any, session: Session, vm: ChatViewModel) -> dict[str, Any]:
    fork_source, branches = _branches(user, session, vm)
    can_write = access.can_write(user, session)
    return chat_context(
        vm,
        can_write=can_write,
        can_approve=access.can_approve(user, session),
        can_fork=access.can_read(user, session),
        fork_source=fork_source,
        branches=branches,
        sidebar_sessions=sidebar_sessions(user, ""),
        my_thumbs=my_thumbs(user, session) if can_write else {},
        agent=session_agent_label(user, vm.state.agent),
        viewer=user.get_username(),
        session_owner=session.owner.get_username(),
    )


def agent_choices(user: Any, teams: list[Team]) -> list[dict[str, Any]]:
    """The New session form's Agent choices, by team (installation-wide ones first, team
    ""), from the agents the user may use: one query for the agents, one for their latest
    versions' names."""
    team_names = {team.name for team in teams}
    agents = [a for a in actions.list_agents(user) if a.team_id is None or a.team_name in team_names]
    names = dict(
        (
            (agent_id, number),
            name,
        )
        for agent_id, number, name in AgentVersion.objects.filter(agent__in=agents).values_list(
            "agent_id", "number", "name"
        )
    )
    groups: dict[str, dict[str, Any]] = {}
    for agent in agents:
        team = agent.team_name or ""
        group = groups.setdefault(team, {"team": team, "label": team or "Everyone", "agents": []})
        name = names.get((agent.pk, agent.latest_version), agent.slug)
        group["agents"].append({"ref": f"{team}/{agent.slug}" if team else agent.slug, "label": name})
    return list(groups.values())


def my_thumbs(user: Any, session: Session) -> dict[str, int]:
    """The user's own thumbs on the session's messages (message id: +1 or -1), so the
    chat page shows their earlier vote pressed after a reload. One query."""
    rows = (
        Rating.objects.filter(session=session, author_id=user.pk, source=Rating.END_USER, thumbs__isnull=False)
        .exclude(message_id="")
        .values_list("message_id", "thumbs")
    )
    return {message_id: thumbs for message_id, thumbs in rows if thumbs is not None}


BRANCH_REASONS = {"regenerate": "regenerated", "edit": "edited", "fork": "forked"}


def _branches(user: Any, session: Session, vm: ChatViewModel) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """The session this one was forked from, and the forks of this one the user may see.

    Forks record their source in SESSION_CREATED (the cached projection's forked_from);
    each fork made at the seq just before a user message is also listed on that message
    ("Other versions"), which is where Regenerate and Edit fork.
    """
    source: dict[str, Any] | None = None
    origin = vm.state.forked_from or {}
    if origin.get("session_id"):
        parent = Session.objects.filter(pk=origin["session_id"]).only("id", "title", "owner").first()
        if parent is not None and access.can_read(user, parent):
            source = {"id": parent.pk, "title": parent.title, "reason": BRANCH_REASONS.get(origin.get("reason", ""))}
    forks = (
        access.visible_sessions(user)
        .filter(state__forked_from__session_id=session.pk)
        .order_by("created_at")
        .only("id", "title", "state")[:100]
    )
    branches = []
    for fork in forks:
        made = fork.state.get("forked_from") or {}
        branches.append(
            {
                "id": fork.pk,
                "title": fork.title,
                "seq": made.get("seq"),
                "reason": BRANCH_REASONS.get(made.get("reason") or "fork", "forked"),
            }
        )
    by_user_seq: dict[int, list[dict[str, Any]]] = {}
    for branch in branches:
        if isinstance(branch["seq"], int):
            by_user_seq.setdefault(branch["seq"] + 1, []).append(branch)
    for item in vm.items:
        if isinstance(item, UserView) and not item.historic and item.seq in by_user_seq:
            item.branches = [
                {"id": b["id"], "label": f"{b['reason']} #{n}"} for n, b in enumerate(by_user_seq[item.seq], 1)
            ]
    return source, branches


SIDEBAR_SIZE = 30


def search_sessions(user: Any, query: str) -> QuerySet[Session]:
    """The user's visible sessions, newest first; with a query, those whose title or one of
    whose messages contains it (case-insensitive).

    Message text is searched in the user messages' INVOCATION_STARTED payloads through the
    (session, type, seq) index; the full-text search of /review/ is separate.
    """
    sessions = access.visible_sessions(user).order_by("-updated_at")
    query = query.strip()[:200]
    if query:
        with_message = Envelope.objects.filter(
            session__in=access.visible_sessions(user),
            type=EventType.INVOCATION_STARTED.value,
            payload__reason__input__content__icontains=query,
        ).values("session_id")
        sessions = sessions.filter(Q(title__icontains=query) | Q(pk__in=with_message))
    return sessions


def sidebar_sessions(user: Any, query: str) -> list[Session]:
    found = list(search_sessions(user, query).only("id", "title", "state", "updated_at")[:SIDEBAR_SIZE])
    for item in found:
        origin = (item.state or {}).get("forked_from") or {}
        item.forked_from_id = origin.get("session_id")  # type: ignore[attr-defined]
    return found


AUDIO_FORMATS = {"audio/wav": "wav", "audio/x-wav": "wav", "audio/wave": "wav", "audio/mpeg": "mp3", "audio/mp3": "mp3",
                 "audio/flac": "flac", "audio/x-flac": "flac", "audio/ogg": "ogg"}  # fmt: skip


def _message_content(request: HtmxHttpRequest) -> str | list[dict[str, Any]]:
    """The composer's text, plus its attachments as OpenAI content parts (uploads inline,
    as the API takes them; sessions_app.media validates and stores them)."""
    text = request.POST.get("content", "")
    files = request.FILES.getlist("attachments")
    if not files:
        return text
    parts: list[dict[str, Any]] = [{"type": "text", "text": text}] if text.strip() else []
    for upload in files:
        if upload.size is not None and upload.size > PART_MAX_BYTES:
            raise ValidationFailed(f"{upload.name} is larger than 10 MiB", code="size")
        mime = (upload.content_type or "").split(";")[0].strip().lower()
        data = base64.b64encode(upload.read()).decode("ascii")
        if mime.startswith("image/"):
            parts.append({"type": "image_url", "image_url": {"url": f"data:{mime};base64,{data}"}})
        elif mime.startswith("audio/"):
            audio_format = AUDIO_FORMATS.get(mime) or (upload.name or "").rsplit(".", 1)[-1].lower()
            parts.append({"type": "input_audio", "input_audio": {"data": data, "format": audio_format}})
        else:
            raise ValidationFailed(f"{upload.name}: only images and audio can be attached", code="mime_type")
    return parts


# ---- pages ----


@login_required
@require_GET
def home(request: HtmxHttpRequest) -> HttpResponse:
    query = request.GET.get("q", "")
    sessions = search_sessions(request.user, query)
    page = Paginator(sessions, 50).get_page(request.GET.get("page"))
    for item in page.object_list:
        origin = (item.state or {}).get("forked_from") or {}
        item.forked_from_id = origin.get("session_id")
    teams = list(access.member_teams(request.user))
    default_team = teams[0].name if len(teams) == 1 else ""
    groups = agent_choices(request.user, teams)
    return render(
        request,
        "chat/home.html",
        {
            "page": page,
            "query": query,
            "teams": teams,
            # The New session form preselects the owner's team when they have exactly one.
            "default_team": default_team,
            "agent_groups": groups,
            # The preselected team's first agent (the form's script keeps this in step
            # with the Team picker).
            "default_agent": next(
                (g["agents"][0]["ref"] for g in groups if g["team"] == default_team and g["team"]), ""
            ),
            "modes": mode_choices(),
            "models": model_choices(),
            "default_model": default_model(),
            "version": sectr.__version__,
        },
    )


@login_required
@require_GET
def session_list(request: HtmxHttpRequest) -> HttpResponse:
    """The sidebar's list, searched (htmx swaps it in as the search box is typed in)."""
    query = request.GET.get("q", "")
    context = {
        "sidebar_sessions": sidebar_sessions(request.user, query),
        "query": query,
        "session_id": request.GET.get("current", ""),
    }
    return render(request, "chat/_session_list.html", context)


FAVICON = Path(settings.BASE_DIR) / "static" / "favicon.ico"


@require_GET
@cache_control(public=True, max_age=86400)
def favicon(request: HtmxHttpRequest) -> HttpResponse:
    """/favicon.ico, which browsers ask for whatever the page says (public, like static files)."""
    return HttpResponse(FAVICON.read_bytes(), content_type="image/x-icon")


@login_required
@require_POST
@refusals_as_messages
def create_session(request: HtmxHttpRequest) -> HttpResponse:
    title = request.POST.get("title", "").strip() or None
    actions.check_new_session_budget(request.user)
    session = actions.do_create_session(
        request.user,
        title=title,
        mode=request.POST.get("mode") or None,
        model=request.POST.get("model") or None,
        # The form always sends its Team choice; "" is a personal session.
        team=request.POST.get("team") or None if "team" in request.POST else actions.DEFAULT_TEAM,
        agent=request.POST.get("agent") or None,
    )
    return go_to(request, reverse("chat", args=[session.pk]))


@login_required
@require_GET
def chat(request: HtmxHttpRequest, session_id: str) -> HttpResponse:
    session = get_session_for_request(request, session_id, "read")
    vm = build_view_model(session, request.user)
    context = page_context(request.user, session, vm)
    if request.htmx and request.GET.get("partial") == "transcript":
        return render(request, "chat/_transcript.html", context)
    return render(request, "chat/chat.html", context)


# ---- runs ----


@login_required
@require_POST
@refusals_as_messages
def post_message(request: HtmxHttpRequest, session_id: str) -> HttpResponse:
    content = _message_content(request)
    # The composer queues behind an active run rather than refusing (the API's 409 is
    # for programs); a queued message starts when the current run ends. The action
    # checks the user's access on the row it locks (404 / 403 before anything is
    # written): no read of the session before it.
    run = actions.do_post_message_with_media(request.user, session_id, content, queue=True)
    note = "Queued: your message is sent when the current run ends." if run.status == Run.PENDING else None
    return _done(request, run.session_id, note, event="sectr:sent")


@login_required
@require_POST
@refusals_as_messages
def stop(request: HtmxHttpRequest, session_id: str) -> HttpResponse:
    actions.do_cancel_current(request.user, session_id)
    return _done(request, session_id)


@login_required
@require_POST
@refusals_as_messages
def steer(request: HtmxHttpRequest, session_id: str) -> HttpResponse:
    text = request.POST.get("content") or request.POST.get("text") or ""
    actions.do_steer_current(request.user, session_id, text)
    return _done(request, session_id, "Steer sent: the model sees it at its next step.", event="sectr:sent")


@login_required
@require_POST
@refusals_as_messages
def retry(request: HtmxHttpRequest, session_id: str) -> HttpResponse:
    actions.do_retry(request.user, session_id)
    return _done(request, session_id)


# ---- session operations ----


@login_required
@require_POST
@refusals_as_messages
def fork(request: HtmxHttpRequest, session_id: str) -> HttpResponse:
    raw_seq = request.POST.get("at_seq", "").strip()
    at_seq: int | None = None
    if raw_seq:
        if not is_whole_number(raw_seq):
            raise ValidationFailed("at_seq must be a whole number", code="invalid_seq")
        at_seq = int(raw_seq)
    actions.check_new_session_budget(request.user)
    forked = actions.do_fork(request.user, session_id, at_seq=at_seq)
    messages.info(request, "Forked: this is a new session; the original stays as it was.")
    return go_to(request, reverse("chat", args=[forked.pk]))


@login_required
@require_POST
@refusals_as_messages
def regenerate(request: HtmxHttpRequest, session_id: str) -> HttpResponse:
    """Answer the last message again, in a new branch (actions.do_regenerate)."""
    branch = actions.do_regenerate(request.user, session_id)
    messages.info(request, "Regenerating in a new branch; the earlier answer stays in the original session.")
    return go_to(request, reverse("chat", args=[branch.pk]))


@login_required
@require_POST
@refusals_as_messages
def edit_message(request: HtmxHttpRequest, session_id: str) -> HttpResponse:
    """Send an edited message in a new branch forked just before it (actions.do_edit_message)."""
    raw_seq = request.POST.get("seq", "").strip()
    if not is_whole_number(raw_seq):
        raise ValidationFailed("seq must be a whole number", code="invalid_seq")
    branch = actions.do_edit_message(request.user, session_id, int(raw_seq), request.POST.get("content", ""))
    messages.info(request, "Edited message sent in a new branch; the original conversation stays as it was.")
    return go_to(request, reverse("chat", args=[branch.pk]))


@login_required
@require_POST
@refusals_as_messages
def clear(request: HtmxHttpRequest, session_id: str) -> HttpResponse:
    actions.check_new_session_budget(request.user)
    cleared = actions.do_clear(request.user, session_id)
    messages.info(request, "Cleared: a new empty session with the same mode and model.")
    return go_to(request, reverse("chat", args=[cleared.pk]))


@login_required
@require_POST
@refusals_as_messages
def compact(request: HtmxHttpRequest, session_id: str) -> HttpResponse:
    shorter = actions.do_compact(request.user, session_id)
    return _done(request, session_id, "Compacted." if shorter else "Nothing to compact yet.")


@login_required
@require_POST
@refusals_as_messages
def rename(request: HtmxHttpRequest, session_id: str) -> HttpResponse:
    renamed = actions.do_rename(request.user, session_id, request.POST.get("title", ""))
    return _done(request, session_id, f"Renamed to “{renamed.title}”.")


@login_required
@require_POST
@refusals_as_messages
def set_mode(request: HtmxHttpRequest, session_id: str) -> HttpResponse:
    changed = actions.do_set_mode(request.user, session_id, request.POST.get("mode", ""))
    return _done(request, session_id, f"Mode: {MODE_LABELS.get(changed.mode, changed.mode)}.")


@login_required
@require_POST
@refusals_as_messages
def set_model(request: HtmxHttpRequest, session_id: str) -> HttpResponse:
    changed = actions.do_set_model(request.user, session_id, request.POST.get("model", ""))
    return _done(request, session_id, f"Model: {changed.model}.")


@login_required
@require_POST
@refusals_as_messages
def delete(request: HtmxHttpRequest, session_id: str) -> HttpResponse:
    actions.do_delete(request.user, session_id)
    messages.info(request, "Session deleted.")
    return go_to(request, reverse("home"))


@login_required
@require_GET
def session_media(request: HtmxHttpRequest, session_id: str, sha256: str) -> HttpResponseBase:
    """An image or audio of a session (a prompt's part, a tool result's), for the page
    to show (sessions_app.media.readable_blob: the fork chain is followed)."""
    session = get_session_for_request(request, session_id, "read")
    blob = readable_blob(request.user, session, sha256)
    if blob is None:
        raise Http404("no such media")
    response = FileResponse(blob.file.open("rb"), content_type=blob.mime_type)
    response["X-Content-Type-Options"] = "nosniff"
    response["Content-Security-Policy"] = "default-src 'none'; sandbox"
    response["Cache-Control"] = "private, max-age=86400"
    return response
