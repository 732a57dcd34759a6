"""Thin views: check who is asking, call an action, render a partial.

Every view that touches a session goes through `_get_session_for_user` (or an action
that checks access itself), so a permission check never lives only in a template.
htmx requests get just the partial they need (or nothing: the session's websocket
brings the change to every tab); plain form posts get a redirect with a message, so
the pages also work without JavaScript, minus the live updates.

A refused operation (a sectr.errors.SectrError) becomes a flash message: for htmx it
is retargeted into the page's #flash with the error's status (base.html tells htmx to
swap 4xx answers), for a plain post it is a Django message on the redirected page.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from functools import wraps
from typing import Any, ParamSpec

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import FileResponse, Http404, HttpRequest, HttpResponse, HttpResponseBase, JsonResponse
from django.shortcuts import redirect, render
from django.template.loader import render_to_string
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django_htmx.http import HttpResponseClientRedirect, reswap, retarget, trigger_client_event
from django_htmx.middleware import HtmxDetails

import sectr
from sectr.errors import Forbidden, NotFound, SectrError, StaleRunControl, ValidationFailed
from sectr.providers import default_model_from_env
from sessions_app import access, actions, snapshots, token_actions
from sessions_app.chat_render import chat_context, mode_choices, model_choices
from sessions_app.chat_view_model import ApprovalView, ChatViewModel
from sessions_app.journal import DatabaseJournal
from sessions_app.models import ApiToken, MediaBlob, Run, Session

journal = DatabaseJournal()

_P = ParamSpec("_P")


class HtmxHttpRequest(HttpRequest):
    htmx: HtmxDetails


# ---- helpers ----


def _get_session_for_user(request: HttpRequest, session_id: str, need: access.Need = "read") -> Session:
    """The session if the signed-in user may `need` it: 404 for strangers, 403 for readers."""
    try:
        return access.get_session_for_user(request.user, session_id, need)
    except NotFound:
        raise Http404("no such session") from None
    except Forbidden as exc:
        raise PermissionDenied(exc.message) from None


def _flash(request: HttpRequest, message: str, *, level: str = "info", status: int = 200) -> HttpResponse:
    html = render_to_string("sessions_app/chat/_flash.html", {"message": message, "level": level})
    response = HttpResponse(html, status=status)
    retarget(response, "#flash")
    reswap(response, "innerHTML")
    return response


def refusals_as_messages(view: Callable[_P, HttpResponse]) -> Callable[_P, HttpResponse]:
    """Turn a refused action into a flash message (htmx) or a Django message + redirect."""

    @wraps(view)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> HttpResponse:
        request = args[0]
        assert isinstance(request, HttpRequest)
        try:
            return view(*args, **kwargs)
        except NotFound:
            raise Http404("not found") from None
        except Forbidden as exc:
            raise PermissionDenied(exc.message) from None
        except SectrError as exc:
            if getattr(request, "htmx", False):
                return _flash(request, exc.message, level="error", status=exc.status)
            messages.error(request, exc.message)
            session_id = kwargs.get("session_id")
            return redirect(reverse("chat", args=[session_id]) if session_id else reverse("home"))

    return wrapper


def _done(
    request: HttpRequest, session_id: str, message: str | None = None, *, event: str | None = None
) -> HttpResponse:
    """Success: nothing to swap (the websocket shows the change), or a note in #flash."""
    if getattr(request, "htmx", False):
        response = _flash(request, message) if message else HttpResponse(status=204)
        if event:
            trigger_client_event(response, event)
        return response
    if message:
        messages.info(request, message)
    return redirect("chat", session_id=session_id)


def _go_to(request: HttpRequest, url: str) -> HttpResponse:
    if getattr(request, "htmx", False):
        return HttpResponseClientRedirect(url)
    return redirect(url)


def build_view_model(session: Session) -> ChatViewModel:
    """The chat's items from one read of the whole journal."""
    return ChatViewModel.from_envelopes(session.pk, journal.load_sync(session.pk, 0))


def page_context(user: Any, session: Session, vm: ChatViewModel) -> dict[str, Any]:
    return chat_context(
        vm,
        can_write=access.can_write(user, session),
        can_approve=access.can_approve(user, session),
        can_fork=access.can_read(user, session),
    )


AUDIO_FORMATS = {"audio/wav": "wav", "audio/x-wav": "wav", "audio/wave": "wav", "audio/mpeg": "mp3", "audio/mp3": "mp3",
                 "audio/flac": "flac", "audio/x-flac": "flac", "audio/ogg": "ogg"}  # fmt: skip


def _message_content(request: HttpRequest) -> str | list[dict[str, Any]]:
    """The composer's text, plus its attachments as OpenAI content parts (uploads inline,
    as the API takes them; sessions_app.media validates and stores them)."""
    text = request.POST.get("content", "")
    files = request.FILES.getlist("attachments")
    if not files:
        return text
    from sessions_app.media import PART_MAX_BYTES

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


def _active_run(session: Session) -> Run:
    """The run a Stop or Steer on this session means: the running one, or the one paused on an ask."""
    state = session.projection()
    invocation_id: str | None = None
    if state.status == "running":
        invocation_id = state.current_invocation_id
    elif state.status == "awaiting" and state.pending_ask:
        invocation_id = state.pending_ask.get("invocation_id")
    run = Run.objects.filter(session=session, invocation_id=invocation_id).first() if invocation_id else None
    if run is None:
        raise StaleRunControl("no run is active in this session")
    return run


# ---- pages ----


@login_required
@require_GET
def home(request: HttpRequest) -> HttpResponse:
    sessions = access.visible_sessions(request.user).order_by("-updated_at")
    page = Paginator(sessions, 50).get_page(request.GET.get("page"))
    return render(
        request,
        "sessions_app/home.html",
        {
            "page": page,
            "modes": mode_choices(),
            "models": model_choices(),
            "default_model": default_model_from_env(),
            "version": sectr.__version__,
        },
    )


@login_required
@require_POST
@refusals_as_messages
def create_session(request: HttpRequest) -> HttpResponse:
    title = request.POST.get("title", "").strip() or None
    session = actions.do_create_session(
        request.user,
        title=title,
        mode=request.POST.get("mode") or None,
        model=request.POST.get("model") or None,
    )
    return _go_to(request, reverse("chat", args=[session.pk]))


@login_required
@require_GET
def chat(request: HttpRequest, session_id: str) -> HttpResponse:
    session = _get_session_for_user(request, session_id, "read")
    vm = build_view_model(session)
    context = page_context(request.user, session, vm)
    if getattr(request, "htmx", False) and request.GET.get("partial") == "transcript":
        return render(request, "sessions_app/chat/_transcript.html", context)
    return render(request, "sessions_app/chat.html", context)


# ---- runs ----


@login_required
@require_POST
@refusals_as_messages
def post_message(request: HttpRequest, session_id: str) -> HttpResponse:
    session = _get_session_for_user(request, session_id, "write")
    content = _message_content(request)
    # The composer queues behind an active run rather than refusing (the API's 409 is
    # for programs); a queued message starts when the current run ends.
    if isinstance(content, list):
        from sessions_app.media import do_post_message_with_media

        run = do_post_message_with_media(request.user, session.pk, content, queue=True)
    else:
        run = actions.do_post_message(request.user, session.pk, content, queue=True)
    note = "Queued: your message is sent when the current run ends." if run.status == Run.PENDING else None
    return _done(request, session.pk, note, event="sectr:sent")


@login_required
@require_POST
@refusals_as_messages
def stop(request: HttpRequest, session_id: str) -> HttpResponse:
    session = _get_session_for_user(request, session_id, "write")
    actions.do_cancel(request.user, _active_run(session).pk)
    return _done(request, session.pk)


@login_required
@require_POST
@refusals_as_messages
def steer(request: HttpRequest, session_id: str) -> HttpResponse:
    session = _get_session_for_user(request, session_id, "write")
    text = request.POST.get("content") or request.POST.get("text") or ""
    if not text.strip():
        raise ValidationFailed("write the steer in the message box first", code="invalid_steer")
    actions.do_steer(request.user, _active_run(session).pk, text)
    return _done(request, session.pk, "Steer sent: the model sees it at its next step.", event="sectr:sent")


@login_required
@require_POST
@refusals_as_messages
def retry(request: HttpRequest, session_id: str) -> HttpResponse:
    session = _get_session_for_user(request, session_id, "write")
    actions.do_retry(request.user, session.pk)
    return _done(request, session.pk)


@login_required
@require_POST
@refusals_as_messages
def decide(request: HttpRequest, ask_id: str) -> HttpResponse:
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
    if not getattr(request, "htmx", False):
        if refused is not None:
            messages.error(request, refused.message)
        return redirect("approvals") if where_queue else redirect("chat", session_id=session.pk)
    ask = session.projection().asks.get(ask_id, {})
    card = ApprovalView.from_ask(ask, session.pk)
    if where_queue:
        card.session_title = session.title
        card.owner = session.owner.get_username()
    html: str = render_to_string(
        "sessions_app/chat/_approval.html",
        {"item": card, "can_approve": access.can_approve(request.user, session), "show_session": where_queue},
        request=request,
    )
    if refused is not None:
        flash = render_to_string("sessions_app/chat/_flash.html", {"message": refused.message, "level": "error"})
        html += f'<div id="flash" hx-swap-oob="innerHTML">{flash}</div>'
    return HttpResponse(html)


# ---- session operations ----


@login_required
@require_POST
@refusals_as_messages
def fork(request: HttpRequest, session_id: str) -> HttpResponse:
    session = _get_session_for_user(request, session_id, "read")
    raw_seq = request.POST.get("at_seq", "").strip()
    at_seq: int | None = None
    if raw_seq:
        if not raw_seq.isdigit():
            raise ValidationFailed("at_seq must be a whole number", code="invalid_seq")
        at_seq = int(raw_seq)
    forked = actions.do_fork(request.user, session.pk, at_seq=at_seq)
    return _go_to(request, reverse("chat", args=[forked.pk]))


@login_required
@require_POST
@refusals_as_messages
def clear(request: HttpRequest, session_id: str) -> HttpResponse:
    session = _get_session_for_user(request, session_id, "write")
    cleared = actions.do_clear(request.user, session.pk)
    return _go_to(request, reverse("chat", args=[cleared.pk]))


@login_required
@require_POST
@refusals_as_messages
def compact(request: HttpRequest, session_id: str) -> HttpResponse:
    session = _get_session_for_user(request, session_id, "write")
    shorter = actions.do_compact(request.user, session.pk)
    return _done(request, session.pk, "Compacted." if shorter else "Nothing to compact yet.")


@login_required
@require_POST
@refusals_as_messages
def rename(request: HttpRequest, session_id: str) -> HttpResponse:
    session = _get_session_for_user(request, session_id, "write")
    actions.do_rename(request.user, session.pk, request.POST.get("title", ""))
    return _done(request, session.pk)


@login_required
@require_POST
@refusals_as_messages
def set_mode(request: HttpRequest, session_id: str) -> HttpResponse:
    session = _get_session_for_user(request, session_id, "write")
    actions.do_set_mode(request.user, session.pk, request.POST.get("mode", ""))
    return _done(request, session.pk)


@login_required
@require_POST
@refusals_as_messages
def set_model(request: HttpRequest, session_id: str) -> HttpResponse:
    session = _get_session_for_user(request, session_id, "write")
    actions.do_set_model(request.user, session.pk, request.POST.get("model", ""))
    return _done(request, session.pk)


@login_required
@require_POST
@refusals_as_messages
def delete(request: HttpRequest, session_id: str) -> HttpResponse:
    session = _get_session_for_user(request, session_id, "write")
    actions.do_delete(request.user, session.pk)
    messages.info(request, "Session deleted.")
    return _go_to(request, reverse("home"))


# ---- moderation and review ----


def pending_approvals(user: Any) -> list[ApprovalView]:
    """Every pending ask `user` may decide: all sessions' for moderators, their own otherwise."""
    sessions = Session.objects.filter(status="awaiting").select_related("owner").order_by("updated_at")
    if not access.is_moderator(user):
        sessions = sessions.filter(owner=user)
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
def approvals(request: HttpRequest) -> HttpResponse:
    context = {
        "cards": pending_approvals(request.user),
        "can_approve": True,  # pending_approvals lists only asks this user may decide
        "show_session": True,
        "is_moderator": access.is_moderator(request.user),
    }
    if getattr(request, "htmx", False) and request.GET.get("partial") == "queue":
        return render(request, "sessions_app/_approval_queue.html", context)
    return render(request, "sessions_app/approvals.html", context)


def _require_reviewer(request: HttpRequest) -> None:
    if not access.is_reviewer(request.user):
        raise PermissionDenied("team review is for reviewers, moderators and admins")


@login_required
@require_GET
def review(request: HttpRequest) -> HttpResponse:
    _require_reviewer(request)
    sessions = Session.objects.select_related("owner").order_by("-updated_at")
    owner = request.GET.get("owner", "").strip()
    if owner:
        sessions = sessions.filter(owner__username=owner)
    page = Paginator(sessions, 50).get_page(request.GET.get("page"))
    return render(request, "sessions_app/review.html", {"page": page, "owner": owner})


def _when(iso: str | None) -> str:
    return f"{iso[:19].replace('T', ' ')} UTC" if iso else "—"


def snapshot_fields(session: Session) -> list[tuple[str, Any]]:
    """The snapshot of SPEC section 6 (sessions_app.snapshots, as the API serves it) as rows."""
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
def review_session(request: HttpRequest, session_id: str) -> HttpResponse:
    _require_reviewer(request)
    session = _get_session_for_user(request, session_id, "read")
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
    return render(request, "sessions_app/review_session.html", context)


# ---- API tokens ----


@login_required
@require_http_methods(["GET", "POST"])
def tokens(request: HttpRequest) -> HttpResponse:
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
        request, "sessions_app/tokens.html", {"tokens": listed, "secret": secret, "issued": issued, "error": error}
    )
    # The page may hold a secret: no cache may keep it.
    response["Cache-Control"] = "no-store"
    return response


@login_required
@require_POST
@refusals_as_messages
def revoke_token(request: HttpRequest, token_id: int) -> HttpResponse:
    token = token_actions.do_revoke_token_by_id(request.user, token_id)
    messages.info(request, f"Revoked {token.name} ({token.prefix}…).")
    return redirect("tokens")


@login_required
@require_GET
def session_media(request: HttpRequest, session_id: str, sha256: str) -> HttpResponseBase:
    """An image or audio part of a session's prompts, for the page to show.

    A fork's inherited messages reference media linked to the session it came from, so
    the fork chain is followed (while the user may read each session on it).
    """
    session = _get_session_for_user(request, session_id, "read")
    for _ in range(20):
        blob = MediaBlob.objects.filter(sha256=sha256, sessions__session=session).first()
        if blob is not None:
            response = FileResponse(blob.file.open("rb"), content_type=blob.mime_type)
            response["X-Content-Type-Options"] = "nosniff"
            response["Content-Security-Policy"] = "default-src 'none'; sandbox"
            response["Cache-Control"] = "private, max-age=86400"
            return response
        origin = session.projection().forked_from
        parent = Session.objects.filter(pk=origin.get("session_id")).first() if origin else None
        if parent is None or parent.pk == session.pk or not access.can_read(request.user, parent):
            break
        session = parent
    raise Http404("no such media")


def healthz(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"ok": True, "version": sectr.__version__})
