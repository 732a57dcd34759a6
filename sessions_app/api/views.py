"""The JSON API's views (docs/api.md). Thin: parse, call an action, shape the answer.

Every route is an async view made by `api_view` from the operations the route table
(sessions_app.api.urls.ROUTES) gives it per HTTP method. `api_view` does what every
operation shares, in this order: 405 for a method the route lacks, bearer-token
authentication (401), the token's rate limit (429), the body size limit (413), JSON
parsing (400); then the operation's handler runs, and any SectrError it raises becomes
``{"error": {"code", "message"}}`` with the error's status. State changes go through
sessions_app.actions (and media/token actions), called in a thread.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from asgiref.sync import sync_to_async
from django.db import connections
from django.http import HttpRequest, HttpResponse, HttpResponseBase, JsonResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt

from sectr.errors import NotFound, ValidationFailed
from sectr.events import Envelope, add_usage, usage_dict
from sessions_app import actions
from sessions_app.access import Need, check_access, get_session_for_user, visible_sessions
from sessions_app.api import auth
from sessions_app.api.auth import authenticate, check_rate_limit, required_bearer_token
from sessions_app.api.errors import ApiError, error_response, exception_response
from sessions_app.api.sse import RunStream, SessionStream, parse_after, replay_run, started
from sessions_app.attribution import current_api_token_key
from sessions_app.dbthread import run_plain_in_db_thread
from sessions_app.display.snapshots import TRANSCRIPT_VIEWS, session_summary, snapshot, transcript
from sessions_app.input_checks import is_whole_number
from sessions_app.journal.publish import collecting_commits
from sessions_app.models import ApiToken, ApprovalRule, AskIndex, Run, Session

KIB = 1024
#: Bodies of most operations are small; a prompt may carry 20 MiB of media as base64.
DEFAULT_BODY_LIMIT = 256 * KIB
RUN_BODY_LIMIT = 32 * 1024 * KIB
ID_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,64}")
#: The run a `POST /sessions/{id}/runs` answered with a stream started (also in Location).
RUN_ID_HEADER = "X-Sectr-Run-Id"

R = TypeVar("R")


@dataclass
class ApiCall:
    """What a handler gets: the request, the authenticated user and token, the JSON body."""

    request: HttpRequest
    token: ApiToken | None
    body: dict[str, Any] = field(default_factory=dict)
    #: The bearer token still to check, for an operation that admits its request in its
    #: own database hop (`Operation.admits_in_thread`, `in_db_thread`); None once checked.
    unchecked_token: str | None = None

    @property
    def user(self) -> Any:
        return self.token.user if self.token is not None else None

    def admit(self) -> None:
        """(Sync, in a database thread) Authenticate the request and count it against its
        token's rate limit, if the door left that to the operation: 401, 429."""
        if self.unchecked_token is not None:
            self.token = auth.admit(self.unchecked_token)
            self.unchecked_token = None
            current_api_token_key.set(self.token.pk)  # this thread's context: the work's

    async def in_db_thread(self, work: Callable[[], R]) -> R:
        """`work` in the journal's database threads, after the admission still owed: one
        thread hop for the token's lookup and the operation's queries. A POST of a run
        took four (the token, the rate limit, the action, giving the connection back),
        three of them in a thread Django starts for each request.

        Through `run_plain_in_db_thread`, without asgiref's SyncToAsync, whose set-up cost
        more than the hop: neither the admission nor a run's post calls back into async
        code through async_to_sync (their publications go on the server loop's queue, and
        the stream's join is handed to the loop explicitly, RunStream.join_from_thread),
        and the context variable the admission sets is read in the same call."""

        def admitted() -> R:
            self.admit()
            return work()

        return await run_plain_in_db_thread(admitted)


Handler = Callable[..., Coroutine[Any, Any, HttpResponseBase]]


@dataclass(frozen=True)
class Operation:
    """One method of one route, as the view dispatches it and the OpenAPI document shows it."""

    handler: Handler
    operation_id: str
    summary: str
    status: int = 200
    request: str | None = None  # component schema of the JSON body (None: no body)
    response: str | None = None  # component schema of the answer (None: no content)
    auth: bool = True
    body_limit: int = DEFAULT_BODY_LIMIT
    query: tuple[str, ...] = ()
    limit_max: int = 100  # the largest ?limit= a paginated operation takes
    streaming: bool = False
    #: how the stream of a streaming operation ends (the OpenAPI document says it)
    stream_end: str = "the stream ends after the `result` event"
    #: also answers with the run's event stream (200) when the request accepts text/event-stream
    streams_on_accept: bool = False
    #: the handler authenticates the request and counts its rate limit itself, in its one
    #: database hop (ApiCall.in_db_thread), before anything else it does there
    admits_in_thread: bool = False
    errors: tuple[int, ...] = ()


# ---- the shared door ----


def api_view(operations: Mapping[str, Operation]) -> Handler:
    allowed = ", ".join(sorted(operations))

    async def view(request: HttpRequest, **kwargs: Any) -> HttpResponseBase:
        operation = operations.get(request.method or "")
        if operation is None:
            return error_response(
                405, "method_not_allowed", f"{request.method} is not allowed here; use {allowed}", {"Allow": allowed}
            )
        try:
            call = ApiCall(request, None)
            if operation.auth and operation.admits_in_thread:
                call.unchecked_token = required_bearer_token(request)
            elif operation.auth:
                call.token = await authenticate(request)
                await check_rate_limit(call.token)
                current_api_token_key.set(call.token.pk)
            try:
                if operation.request is not None:
                    call.body = read_json_body(request, operation.body_limit)
                elif request.method == "POST" and read_json_body(request, DEFAULT_BODY_LIMIT):
                    raise ApiError("this operation takes no body (or {})", code="invalid_body", status=400)
            except Exception:
                # A bad body is answered after a bad token, as for every operation.
                await call.in_db_thread(lambda: None)
                raise
            response = await operation.handler(call, **kwargs)
            if call.unchecked_token is not None:  # a handler that never admitted: refuse
                raise RuntimeError(f"{operation.operation_id} answered without admitting its request")
            return response
        except Exception as exc:
            return exception_response(exc)

    return csrf_exempt(view)


@csrf_exempt
async def not_found(request: HttpRequest, path: str = "") -> HttpResponse:
    return error_response(404, "not_found", f"no API route {request.path}")


def read_json_body(request: HttpRequest, limit: int) -> dict[str, Any]:
    """The body as a JSON object ({} when empty); 413 past `limit` bytes, 400 if not JSON."""
    declared = str(request.META.get("CONTENT_LENGTH") or "0")
    if not (declared.isascii() and declared.isdigit()):  # int() would take " 12" and "٣"
        raise ApiError("Content-Length is not a number", code="malformed_request", status=400)
    declared_length = int(declared)
    if declared_length > limit:
        raise ApiError(f"the body is larger than {limit} bytes", code="too_large", status=413)
    data = request.read(limit + 1)  # not request.body: its own cap (DATA_UPLOAD_MAX_MEMORY_SIZE) is 2.5 MB
    if len(data) > limit:
        raise ApiError(f"the body is larger than {limit} bytes", code="too_large", status=413)
    if not data.strip():
        return {}
    try:
        body = json.loads(data.decode("utf-8"), parse_constant=_refuse_constant)
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise ApiError("the body is not valid JSON", code="malformed_json", status=400) from None
    if not isinstance(body, dict):
        raise ApiError("the body must be a JSON object", code="invalid_body", status=400)
    check_text(body)
    return body


def check_text(value: Any) -> None:
    """Refuse strings no database can store: NUL characters and lone surrogates
    (JSON escapes like \\u0000 and \\ud800 decode to them)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            strings = [item]
        elif isinstance(item, dict):
            strings = [key for key in item if isinstance(key, str)]
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
            continue
        else:
            continue
        for text in strings:
            if "\x00" in text:
                raise ApiError("strings must not contain NUL characters", code="invalid_unicode", status=400)
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                raise ApiError(
                    "strings must be valid Unicode (no lone surrogates)", code="invalid_unicode", status=400
                ) from None


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


# ---- body and query fields ----


def check_fields(body: dict[str, Any], *allowed: str) -> None:
    unknown = sorted(set(body) - set(allowed))
    if unknown:
        raise ValidationFailed(f"unknown field(s): {', '.join(unknown)[:200]}", code="invalid_body")


def optional(body: dict[str, Any], key: str, kind: type | tuple[type, ...], *, allow_empty: bool = False) -> Any:
    """`body[key]` if present and not null; 400 `invalid_<key>` if it has the wrong type
    (or is an empty string, unless `allow_empty`: "" never means "the default")."""
    value = body.get(key)
    if value is None:
        return None
    if value == "" and not allow_empty:
        raise ValidationFailed(f"{key} must not be empty", code=f"invalid_{key}")
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if int in kinds and float not in kinds and isinstance(value, float) and value.is_integer():
        return int(value)  # 5.0 is the whole number 5 in JSON (and in JSON Schema)
    if isinstance(value, bool) and bool not in kinds:
        raise ValidationFailed(f"{key} has the wrong type", code=f"invalid_{key}")
    if not isinstance(value, kinds):
        names = " or ".join(k.__name__.replace("str", "string").replace("int", "integer") for k in kinds)
        raise ValidationFailed(f"{key} must be a {names}", code=f"invalid_{key}")
    return value


def required(body: dict[str, Any], key: str, kind: type | tuple[type, ...], *, allow_empty: bool = False) -> Any:
    value = optional(body, key, kind, allow_empty=allow_empty)
    if value is None:
        raise ValidationFailed(f"{key} is required", code=f"invalid_{key}")
    return value


def query_int(request: HttpRequest, key: str, default: int, low: int, high: int) -> int:
    raw = request.GET.get(key)
    if raw is None or raw == "":
        return default
    if not is_whole_number(raw) or len(raw) > len(str(high)) or not low <= int(raw) <= high:
        raise ValidationFailed(f"{key} must be a whole number from {low} to {high}", code=f"invalid_{key}")
    return int(raw)


def check_id(value: str, what: str) -> str:
    """An id from the URL, or 404: ids are short and made of letters, digits, _ and -."""
    if not ID_PATTERN.fullmatch(value):
        raise NotFound(f"no such {what}")
    return value


# ---- answers ----


def json_response(data: Any, status: int = 200) -> JsonResponse:
    return JsonResponse(data, status=status, safe=False, json_dumps_params={"ensure_ascii": False})


def run_dict(run: Run, *, with_result: bool = False) -> dict[str, Any]:
    """A run as clients see it; with its result (computed from the journal) when asked."""
    data: dict[str, Any] = {
        "run_id": run.pk,
        "session_id": run.session_id,
        "status": run.status,
        "reason": (run.reason or {}).get("kind"),
        "stop_reason": run.stop_reason or None,
        # Always the Usage shape (zeros for a run that never called the model), never {}.
        "usage": add_usage(usage_dict(), run.usage or {}),
        "error": run.error or None,
        "invocation_ids": list(run.invocation_ids or []),
        "start_seq": run.start_seq,
        "created_at": run.created_at.isoformat(),
        "started_at": run.started_at.isoformat() if run.started_at else None,
        "finished_at": run.finished_at.isoformat() if run.finished_at else None,
        "events_url": f"/api/v1/runs/{run.pk}/events",
        "result": None,
    }
    if with_result and run.start_seq is not None:
        tracker = replay_run(run)
        if tracker.finished and tracker.result is not None:
            # The journal is the truth; the Run row may lag its terminal envelope briefly.
            data["status"] = tracker.status
            data["stop_reason"] = tracker.result["stop"]
            data["usage"] = add_usage(usage_dict(), tracker.result["usage"])
            data["error"] = tracker.result["error"]
            data["result"] = tracker.result
    elif with_result and run.status in Run.FINISHED_STATUSES:  # a queued message cancelled before it started
        data["result"] = {
            "stop": run.stop_reason or "cancelled",
            "text": "",
            "usage": usage_dict(),
            "error": run.error or None,
        }
    return data


def _session_for(user: Any, session_id: str, need: Need = "read") -> Session:
    session = get_session_for_user(user, check_id(session_id, "session"), need)
    return Session.objects.select_related("owner", "team").get(pk=session.pk)


def _snapshot_of(user: Any, session_id: str) -> dict[str, Any]:
    return snapshot(_session_for(user, session_id))


def _run_for(user: Any, run_id: str) -> Run:
    run = Run.objects.select_related("session").filter(pk=check_id(run_id, "run")).first()
    if run is None:
        raise NotFound("no such run")
    check_access(user, run.session, "read")
    return run


# ---- sessions ----


async def list_sessions(call: ApiCall) -> HttpResponse:
    limit = query_int(call.request, "limit", 50, 1, 100)
    offset = query_int(call.request, "offset", 0, 0, 10**9)

    def page() -> dict[str, Any]:
        sessions = visible_sessions(call.user).select_related("owner", "team").order_by("-updated_at", "-id")
        total = sessions.count()
        items = [session_summary(s) for s in sessions[offset : offset + limit]]
        return {
            "sessions": items,
            "count": total,
            "limit": limit,
            "offset": offset,
            "next_offset": offset + limit if offset + limit < total else None,
        }

    return json_response(await sync_to_async(page)())


async def create_session(call: ApiCall) -> HttpResponse:
    body = call.body
    check_fields(body, "title", "mode", "model", "limits", "reasoning_effort", "team", "agent", "agent_version")
    if "team" in body and body["team"] is not None and not isinstance(body["team"], str):
        raise ValidationFailed("team must be a team's name or null", code="invalid_team")

    def create() -> dict[str, Any]:
        actions.check_new_session_budget(call.user)
        session = actions.do_create_session(
            call.user,
            title=optional(body, "title", str),
            mode=optional(body, "mode", str),
            model=optional(body, "model", str),
            limits=optional(body, "limits", dict),
            reasoning_effort=optional(body, "reasoning_effort", str),
            # Left out: the owner's team when they have exactly one; null: personal.
            team=body["team"] if "team" in body else actions.DEFAULT_TEAM,
            # An agent's id or team/slug; left out: the team's first agent, else the built-in one.
            agent=optional(body, "agent", str),
            agent_version=optional(body, "agent_version", int),
        )
        return _snapshot_of(call.user, session.pk)

    return json_response(await sync_to_async(create)(), status=201)


async def get_session(call: ApiCall, session_id: str) -> HttpResponse:
    return json_response(await sync_to_async(_snapshot_of)(call.user, session_id))


async def delete_session(call: ApiCall, session_id: str) -> HttpResponse:
    await sync_to_async(actions.do_delete)(call.user, check_id(session_id, "session"))
    return HttpResponse(status=204)


async def get_transcript(call: ApiCall, session_id: str) -> HttpResponse:
    view = call.request.GET.get("view") or "model"
    if view not in TRANSCRIPT_VIEWS:
        raise ValidationFailed(f"view must be one of: {', '.join(TRANSCRIPT_VIEWS)}", code="invalid_view")

    def read() -> dict[str, Any]:
        return transcript(_session_for(call.user, session_id), view)

    return json_response(await sync_to_async(read)())


async def fork_session(call: ApiCall, session_id: str) -> HttpResponse:
    body = call.body
    check_fields(
        body,
        "title",
        "model",
        "provider_id",
        "model_id",
        "reasoning_effort",
        "at_seq",
        "worktree_selector",
        "agent_version",
    )
    model = actions.check_model_choice(
        optional(body, "model", str), optional(body, "provider_id", str), optional(body, "model_id", str)
    )
    selector = optional(body, "worktree_selector", (str, dict))

    def fork() -> dict[str, Any]:
        actions.check_new_session_budget(call.user)
        forked = actions.do_fork(
            call.user,
            check_id(session_id, "session"),
            at_seq=optional(body, "at_seq", int),
            title=optional(body, "title", str),
            model=model,
            reasoning_effort=optional(body, "reasoning_effort", str),
            agent_version=optional(body, "agent_version", int),
            worktree_selector=selector,
        )
        return _snapshot_of(call.user, forked.pk)

    return json_response(await sync_to_async(fork)(), status=201)


async def clear_session(call: ApiCall, session_id: str) -> HttpResponse:
    body = call.body
    check_fields(body, "worktree_selector", "agent_version")
    selector = optional(body, "worktree_selector", (str, dict))
    agent_version = optional(body, "agent_version", int)

    def clear() -> dict[str, Any]:
        actions.check_new_session_budget(call.user)
        cleared = actions.do_clear(
            call.user, check_id(session_id, "session"), worktree_selector=selector, agent_version=agent_version
        )
        return _snapshot_of(call.user, cleared.pk)

    return json_response(await sync_to_async(clear)(), status=201)


async def close_session(call: ApiCall, session_id: str) -> HttpResponse:
    def close() -> dict[str, Any]:
        actions.do_close(call.user, check_id(session_id, "session"))
        return _snapshot_of(call.user, session_id)

    return json_response(await sync_to_async(close)())


async def compact_session(call: ApiCall, session_id: str) -> HttpResponse:
    compacted = await sync_to_async(actions.do_compact)(call.user, check_id(session_id, "session"))
    return json_response({"compacted": compacted})


async def retry_session(call: ApiCall, session_id: str) -> HttpResponse:
    def retry() -> dict[str, Any]:
        return run_dict(actions.do_retry(call.user, check_id(session_id, "session")))

    return json_response(await sync_to_async(retry)(), status=202)


async def rename_session(call: ApiCall, session_id: str) -> HttpResponse:
    check_fields(call.body, "title")

    def rename() -> dict[str, Any]:
        actions.do_rename(call.user, check_id(session_id, "session"), required(call.body, "title", str))
        return _snapshot_of(call.user, session_id)

    return json_response(await sync_to_async(rename)())


async def set_session_mode(call: ApiCall, session_id: str) -> HttpResponse:
    check_fields(call.body, "mode")

    def set_mode() -> dict[str, Any]:
        actions.do_set_mode(call.user, check_id(session_id, "session"), required(call.body, "mode", str))
        return _snapshot_of(call.user, session_id)

    return json_response(await sync_to_async(set_mode)())


async def set_session_model(call: ApiCall, session_id: str) -> HttpResponse:
    check_fields(call.body, "model", "reasoning_effort")

    def set_model() -> dict[str, Any]:
        actions.do_set_model(
            call.user,
            check_id(session_id, "session"),
            required(call.body, "model", str),
            reasoning_effort=optional(call.body, "reasoning_effort", str),
        )
        return _snapshot_of(call.user, session_id)

    return json_response(await sync_to_async(set_model)())


# ---- runs ----


def wants_event_stream(request: HttpRequest) -> bool:
    """The request's Accept names text/event-stream (and does not refuse it with q=0)."""
    for item in request.headers.get("Accept", "").split(","):
        media, *params = (part.strip() for part in item.split(";"))
        if media.lower() == "text/event-stream":
            return not any(param.replace(" ", "") in ("q=0", "q=0.0", "q=0.00", "q=0.000") for param in params)
    return False


def event_stream_response(frames: AsyncIterator[bytes]) -> StreamingHttpResponse:
    response = StreamingHttpResponse(frames, content_type="text/event-stream; charset=utf-8")
    response["Cache-Control"] = "no-cache, no-transform"
    response["X-Accel-Buffering"] = "no"  # nginx: pass events through as they come
    return response


async def start_run(call: ApiCall, session_id: str) -> HttpResponseBase:
    def start() -> Run:  # after the admission (401, 429), as the door does for others
        body = call.body
        check_fields(body, "content", "queue")
        content = required(body, "content", (str, list), allow_empty=True)  # an empty prompt: code "prompt"
        queue = bool(optional(body, "queue", bool))
        return actions.do_post_message_with_media(call.user, check_id(session_id, "session"), content, queue=queue)

    # One hop (admission and the action), in a database thread that gives its connection
    # back to the pool when it is done.
    if not wants_event_stream(call.request):
        return json_response(run_dict(await call.in_db_thread(start)), status=202)
    # The run's own stream (as GET /runs/{id}/events from its start), answered at once:
    # no second request before the first chunk. It joins the session's group (and its
    # user's access group, in the same step) before the post, so it needs no journal
    # read to start (RunStream.joined_before_run); it sends nothing unless the post
    # succeeds (400, 404 close it unread). One database hop: the request is admitted
    # (401, 429) first, so a refused token costs no subscription; then the thread has the
    # event loop join the groups and waits for it; then it posts.
    loop = asyncio.get_running_loop()
    stream = RunStream.to_join_before_run(session_id) if ID_PATTERN.fullmatch(session_id) else None

    def join_and_start() -> tuple[Run, list[Envelope]]:
        if stream is not None and call.token is not None:
            stream.join_from_thread(call.token, loop)
        # What the post commits, for the stream to start with (RunStream.of_posted_run).
        with collecting_commits() as posted:
            run = start()  # with no stream: 400 or this id's 404, in that order
        return run, posted

    try:
        run, posted = await call.in_db_thread(join_and_start)
    except BaseException:
        if stream is not None:
            await stream.close()
        raise
    assert stream is not None  # a malformed id never posts
    response = event_stream_response(await started(stream.of_posted_run(run, call.token, posted).frames()))
    response["Location"] = f"/api/v1/runs/{run.pk}"
    response[RUN_ID_HEADER] = run.pk
    return response


async def get_run(call: ApiCall, run_id: str) -> HttpResponse:
    def read() -> dict[str, Any]:
        return run_dict(_run_for(call.user, run_id), with_result=True)

    return json_response(await sync_to_async(read)())


def parse_after_or_400(request: HttpRequest) -> int:
    try:
        return parse_after(request.headers.get("Last-Event-ID"), request.GET.get("after"))
    except ValueError as exc:
        raise ValidationFailed(str(exc), code="invalid_after") from None


async def run_events(call: ApiCall, run_id: str) -> HttpResponseBase:
    after = parse_after_or_400(call.request)
    run = await sync_to_async(_run_for)(call.user, run_id)
    # The request's thread would hold its database connection (authentication, this
    # lookup) for as long as the stream lasts; the stream reads through the journal's
    # threads, so give it back now (PostgreSQL's pool is small).
    await sync_to_async(connections.close_all)()
    return event_stream_response(RunStream(run, after, call.token).frames())


async def session_events(call: ApiCall, session_id: str) -> HttpResponseBase:
    after = parse_after_or_400(call.request)
    session = await sync_to_async(_session_for)(call.user, session_id)
    await sync_to_async(connections.close_all)()  # as run_events: the stream reads in the journal's threads
    return event_stream_response(SessionStream(session.pk, after, call.token).frames())


async def cancel_run(call: ApiCall, run_id: str) -> HttpResponse:
    def cancel() -> dict[str, Any]:
        return run_dict(actions.do_cancel(call.user, check_id(run_id, "run")))

    return json_response(await sync_to_async(cancel)(), status=202)


async def steer_run(call: ApiCall, run_id: str) -> HttpResponse:
    check_fields(call.body, "text")

    def steer() -> dict[str, Any]:
        return run_dict(actions.do_steer(call.user, check_id(run_id, "run"), required(call.body, "text", str)))

    return json_response(await sync_to_async(steer)(), status=202)


async def decide_ask(call: ApiCall, ask_id: str) -> HttpResponse:
    check_fields(call.body, "verdict", "note", "scope", "arguments", "result")

    def decide() -> dict[str, Any]:
        ask_id_checked = check_id(ask_id, "ask")
        run = actions.do_decide(
            call.user,
            ask_id_checked,
            required(call.body, "verdict", str),
            note=optional(call.body, "note", str),
            scope=optional(call.body, "scope", str),
            arguments=optional(call.body, "arguments", dict),
            result=optional(call.body, "result", str),
        )
        index = AskIndex.objects.select_related("session", "session__team", "session__owner").get(pk=ask_id_checked)
        # A vote that leaves a quorum short starts no run: run_id is null, the ask tells.
        data: dict[str, Any] = run_dict(run) if run is not None else {"run_id": None, "status": "voted"}
        data["ask"] = ask_dict(index)
        return data

    return json_response(await sync_to_async(decide)(), status=202)


# ---- asks, teams and rules (docs/moderation.md) ----


def ask_dict(index: AskIndex) -> dict[str, Any]:
    """One ask as GET /asks lists it: the index row, with arguments and votes from the
    session's cached projection (no query more than the row's own join)."""
    session = index.session
    ask = ((session.state or {}).get("asks") or {}).get(index.ask_id) or {}
    return {
        "ask_id": index.ask_id,
        "session_id": session.pk,
        "team": session.team.name if session.team is not None else None,
        "owner": session.owner.get_username(),
        "tool": index.tool,
        "tool_call_id": ask.get("tool_call_id"),
        "arguments": ask.get("arguments") or {},
        # A re-ask after a crash cut off this call once it had started (docs/journal.md).
        "may_have_run": bool(ask.get("may_have_run")),
        "state": "pending" if index.status == AskIndex.PENDING else "decided",
        "status": index.status,
        "requested_at": index.requested_at.isoformat() if index.requested_at else None,
        "deadline": index.deadline.isoformat() if index.deadline else None,
        "approvals_required": index.approvals_required,
        "votes": list(ask.get("votes") or []),
        "rule_id": index.rule_id or None,
        "decided_by": index.decided_by or None,
        "verdict": index.verdict or None,
        "decided_at": index.decided_at.isoformat() if index.decided_at else None,
    }


def _query_text(request: HttpRequest, key: str) -> str | None:
    raw = request.GET.get(key)
    if raw is None or raw == "":
        return None
    if len(raw) > 100:
        raise ValidationFailed(f"{key} is longer than 100 characters", code=f"invalid_{key}")
    return raw


async def list_asks(call: ApiCall) -> HttpResponse:
    limit = query_int(call.request, "limit", 50, 1, 100)
    offset = query_int(call.request, "offset", 0, 0, 10**9)
    state = _query_text(call.request, "state")
    team = _query_text(call.request, "team")
    tool = _query_text(call.request, "tool")

    def page() -> dict[str, Any]:
        asks = actions.visible_asks(call.user, state=state, team=team, tool=tool)
        total = asks.count()
        return {
            "asks": [ask_dict(index) for index in asks[offset : offset + limit]],
            "count": total,
            "limit": limit,
            "offset": offset,
            "next_offset": offset + limit if offset + limit < total else None,
        }

    return json_response(await sync_to_async(page)())


def rule_dict(rule: ApprovalRule) -> dict[str, Any]:
    return {**rule.as_dict(), "created_by": rule.created_by or None, "updated_at": rule.updated_at.isoformat()}


RULE_FIELDS = ("tool", "arguments", "action", "approvals_required", "expires_after_s", "position")


async def list_rules(call: ApiCall, name: str) -> HttpResponse:
    def read() -> dict[str, Any]:
        return {"team": name, "rules": [rule_dict(rule) for rule in actions.list_rules(call.user, name)]}

    return json_response(await sync_to_async(read)())


async def create_rule(call: ApiCall, name: str) -> HttpResponse:
    check_fields(call.body, *RULE_FIELDS)

    def create() -> dict[str, Any]:
        return rule_dict(actions.do_create_rule(call.user, name, call.body))

    return json_response(await sync_to_async(create)(), status=201)


async def update_rule(call: ApiCall, name: str, rule_id: str) -> HttpResponse:
    check_fields(call.body, *RULE_FIELDS)

    def update() -> dict[str, Any]:
        return rule_dict(actions.do_update_rule(call.user, name, rule_id, call.body))

    return json_response(await sync_to_async(update)())


async def delete_rule(call: ApiCall, name: str, rule_id: str) -> HttpResponse:
    await sync_to_async(actions.do_delete_rule)(call.user, name, rule_id)
    return HttpResponse(status=204)
