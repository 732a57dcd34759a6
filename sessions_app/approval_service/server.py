"""`/mcp`: an MCP server (Streamable HTTP) with one tool, `approval_prompt`, built on the
official `mcp` package's server: its `StreamableHTTPSessionManager` serves both protocol
revisions on one URL (a request whose `MCP-Protocol-Version` is the stateless 2026-07-28
revision is one self-contained exchange; anything else goes through the session-based
2025-11-25 handshake and `Mcp-Session-Id`).

Around it, an ASGI app of Sectr's own: `Authorization: Bearer <API token>` (401
otherwise, the API's tokens and rate limit), the team (`?team=`, or the owner's only
team; 400 otherwise), the request body limit. Daphne sends no ASGI lifespan events, so
the manager's task group is started on the server's loop by the first request.

A call waits for its ask's decision on the event loop, never in a thread of its own: it
sleeps on an `asyncio.Event` that the process's one listener on the channel layer's
moderation group sets when an envelope decides, expires or withdraws that ask (any
process's decision reaches every process through Redis), and reads the ask's state from
the database when woken and at least every POLL_MAX_S (the layer delivers at most once:
the poll is what makes a lost message cost seconds, not the answer).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import parse_qs

import mcp_types as types
from asgiref.sync import sync_to_async
from django.conf import settings
from mcp.server.lowlevel.server import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp_types import CLIENT_INFO_META_KEY
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from sectr.asks import ask_changes
from sectr.errors import SectrError
from sectr.events import Envelope
from sessions_app.actions.asks import do_expire_ask
from sessions_app.actions.teams import DEFAULT_TEAM, check_session_team
from sessions_app.api.auth import CHALLENGE, bearer_token, check_rate_limit
from sessions_app.api.errors import ApiError
from sessions_app.approval_service.asks import (
    Caller,
    CallRefused,
    Opened,
    Outcome,
    check_call,
    open_ask,
    read_outcome,
    withdraw,
)
from sessions_app.dbthread import run_in_db_thread
from sessions_app.journal.publish import ENVELOPES_MESSAGE_TYPE, MODERATION_GROUP
from sessions_app.models import ApiToken

logger = logging.getLogger("sectr.approval_service")

TOOL_NAME = "approval_prompt"
SCOPE_KEY = "sectr.mcp"
SESSION_META_KEY = "sectr/session"
#: The longest a waiting call goes without reading its ask from the database.
POLL_MAX_S = 5.0
#: Progress notifications (when the request has a progress token) at least this often.
PROGRESS_EVERY_S = 5.0
#: How long past an ask's deadline a call waits for the expiry sweep before expiring
#: the ask itself (any process may: the expiry is a conditional write).
EXPIRY_GRACE_S = 2.0

APPROVAL_TOOL = types.Tool(
    name=TOOL_NAME,
    title="Ask Sectr for approval",
    description=(
        "Ask the team's approval rules and moderators whether a tool call may run (Claude Code's "
        "--permission-prompt-tool contract). Waits for the decision; answers one text content holding "
        'JSON: {"behavior": "allow", "updatedInput": {...}} or {"behavior": "deny", "message": "..."}.'
    ),
    input_schema={
        "type": "object",
        "properties": {
            "tool_name": {"type": "string", "description": "The tool the agent wants to call"},
            "input": {"type": "object", "description": "The arguments of that call"},
            "tool_use_id": {"type": "string", "description": "The agent's id of the call (a retry finds its ask)"},
        },
        "required": ["tool_name", "input"],
    },
)


# ---- waking waiting calls --------------------------------------------------------------


class DecisionWatcher:
    """One listener per process on the moderation group; waiting calls sleep on events."""

    def __init__(self) -> None:
        self._waiters: dict[str, set[asyncio.Event]] = {}
        self._task: asyncio.Task[None] | None = None

    @property
    def waiting(self) -> int:
        return sum(len(events) for events in self._waiters.values())

    async def wait(self, ask_id: str, within: float) -> bool:
        """Sleep until the ask's decision is seen on the layer (True), at most `within` s."""
        self._start()
        event = asyncio.Event()
        self._waiters.setdefault(ask_id, set()).add(event)
        try:
            async with asyncio.timeout(max(within, 0.0)):
                await event.wait()
            return True
        except TimeoutError:
            return False
        finally:
            events = self._waiters.get(ask_id)
            if events is not None:
                events.discard(event)
                if not events:
                    del self._waiters[ask_id]

    def wake(self, ask_id: str) -> None:
        for event in self._waiters.get(ask_id, ()):
            event.set()

    def _start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._listen(), name="mcp-approval-watcher")

    async def _listen(self) -> None:
        from channels.layers import get_channel_layer

        layer = get_channel_layer()
        if layer is None:
            return  # no layer: the waiting calls poll
        while True:
            try:
                channel = await layer.new_channel()
                await layer.group_add(MODERATION_GROUP, channel)
                joined = time.monotonic()
                while True:
                    if time.monotonic() - joined > 3600:  # groups expire on Redis: join again
                        await layer.group_add(MODERATION_GROUP, channel)
                        joined = time.monotonic()
                    message = await layer.receive(channel)
                    if message.get("type") == ENVELOPES_MESSAGE_TYPE:
                        self._apply(message.get("envelopes") or [])
            except asyncio.CancelledError:
                raise
            except Exception:  # a Redis hiccup: the calls poll meanwhile
                logger.warning("approval watcher: channel layer failed; listening again in 2 s", exc_info=True)
                await asyncio.sleep(2.0)

    def _apply(self, envelopes: list[dict[str, Any]]) -> None:
        for data in envelopes:
            try:
                envelope = Envelope.from_dict(data)
            except Exception:  # noqa: BLE001 - a malformed message wakes nobody
                logger.debug("approval watcher: not an envelope: %.200r", data)
                continue
            for change in ask_changes(envelope):
                if change.closes:
                    self.wake(change.ask_id)


WATCHER = DecisionWatcher()


# ---- the tool --------------------------------------------------------------------------


def _text(data: dict[str, Any], *, error: bool = False) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=json.dumps(data, ensure_ascii=False))], is_error=error
    )


def _client_info(ctx: Any) -> tuple[str, str]:
    """(name, version) the client gave: the handshake's clientInfo, or (stateless
    revision) the request's `_meta`."""
    params = getattr(ctx.session, "client_params", None)
    info: Any = getattr(params, "client_info", None)
    if info is None:
        raw = (ctx.params or {}).get("_meta") or {}
        info = raw.get(CLIENT_INFO_META_KEY) if isinstance(raw, dict) else None
    if isinstance(info, dict):
        return str(info.get("name") or "MCP client")[:100], str(info.get("version") or "")[:50]
    if info is not None:
        return str(getattr(info, "name", "") or "MCP client")[:100], str(getattr(info, "version", "") or "")[:50]
    return "MCP client", ""


def _caller(ctx: Any) -> Caller:
    auth = ctx.request.scope[SCOPE_KEY]
    name, version = _client_info(ctx)
    client = f"{name} {version}".strip()
    meta = (ctx.params or {}).get("_meta") or {}
    named = meta.get(SESSION_META_KEY) if isinstance(meta, dict) else None
    if named is not None and (not isinstance(named, str) or not named or len(named) > 40):
        raise CallRefused(f"_meta {SESSION_META_KEY} must be a session id")
    if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
        day = datetime.now(UTC).date().isoformat()
        group = f"session:{named}" if named else f"day:{auth['token_id']}:{name}:{day}"
        title = f"{client} · {day}"
    else:
        session_id = ctx.request.headers.get("mcp-session-id") or "none"
        group = f"session:{named}" if named else f"mcp:{session_id}"
        title = client
    return Caller(
        user=auth["user"], team=auth["team"], client=client, title=title, group=group[:300], named_session=named
    )


async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
    if params.name != TOOL_NAME:
        return _text({"error": f"unknown tool {params.name!r}; this server offers {TOOL_NAME}"}, error=True)
    try:
        caller = _caller(ctx)
        tool_name, tool_input, tool_use_id = check_call(params.arguments or {})
        outcome = await wait_for_decision(ctx, caller, tool_name, tool_input, tool_use_id)
    except CallRefused as exc:
        return _text({"error": str(exc)}, error=True)
    except SectrError as exc:  # a session the caller may not write to, say
        return _text({"error": str(exc)}, error=True)
    return _text(outcome.as_json())


async def wait_for_decision(
    ctx: Any, caller: Caller, tool_name: str, tool_input: dict[str, Any], tool_use_id: str
) -> Outcome:
    """Ask (or find the ask), then wait for its decision, the ask's expiry or the wait limit."""
    wait_s = float(settings.SECTR_MCP_APPROVAL_WAIT_S)
    started = time.monotonic()
    give_up = started + wait_s
    last_progress = started
    delay = 0.25
    opened = Opened(busy=True)
    while True:
        if opened.busy:
            opened = await run_in_db_thread(open_ask, caller, tool_name, tool_input, tool_use_id)
            if opened.outcome is not None:
                return opened.outcome
        else:
            outcome = await run_in_db_thread(read_outcome, opened.ask_id)
            if outcome is not None:
                return outcome
        now = time.monotonic()
        if now >= give_up:
            if opened.busy:
                return Outcome(False, message=f"No decision within {wait_s:g} s: the named session stayed busy.")
            return await run_in_db_thread(withdraw, opened.ask_id, wait_s)
        if opened.deadline is not None and datetime.now(UTC) > opened.deadline + timedelta(seconds=EXPIRY_GRACE_S):
            await run_in_db_thread(do_expire_ask, opened.ask_id)
            continue  # read what the expiry (ours, or the sweep's) decided
        if now - last_progress >= PROGRESS_EVERY_S:
            last_progress = now
            waited = now - started
            with contextlib.suppress(Exception):  # a client that went away is noticed on return
                await ctx.session.report_progress(waited, wait_s, f"waiting for a decision ({waited:.0f} s)")
        pause = min(delay, give_up - now, max(0.05, PROGRESS_EVERY_S - (now - last_progress)))
        if opened.deadline is not None:
            until_deadline = (opened.deadline - datetime.now(UTC)).total_seconds() + EXPIRY_GRACE_S
            pause = min(pause, max(0.05, until_deadline))
        if opened.busy:
            await asyncio.sleep(pause)
        else:
            await WATCHER.wait(opened.ask_id, pause)
        delay = min(delay * 2, POLL_MAX_S)


async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
    return types.ListToolsResult(tools=[APPROVAL_TOOL])


SERVER: Server[Any] = Server(
    "sectr",
    version="1",
    instructions="Sectr's approval service: call approval_prompt before running a tool.",
    on_list_tools=list_tools,
    on_call_tool=call_tool,
)


# ---- the ASGI app ----------------------------------------------------------------------


class McpEndpoint:
    """The ASGI app of `/mcp`: authentication and the team, then the `mcp` package."""

    def __init__(self) -> None:
        self._manager: StreamableHTTPSessionManager | None = None
        self._ready: asyncio.Future[None] | None = None

    async def _started(self) -> StreamableHTTPSessionManager:
        if self._ready is None:
            loop = asyncio.get_running_loop()
            self._ready = loop.create_future()
            self._manager = StreamableHTTPSessionManager(SERVER, max_request_body_size=_body_limit())
            loop.create_task(self._run(self._manager, self._ready), name="mcp-session-manager")
        await asyncio.shield(self._ready)
        assert self._manager is not None
        return self._manager

    @staticmethod
    async def _run(manager: StreamableHTTPSessionManager, ready: asyncio.Future[None]) -> None:
        try:
            async with manager.run():
                ready.set_result(None)
                await asyncio.Event().wait()  # for the process's life
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(RuntimeError(f"the MCP session manager did not start: {exc!r}"))
            raise

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        try:
            scope[SCOPE_KEY] = await _authenticate(scope)
        except ApiError as exc:
            await _error(send, exc.status, exc.code, str(exc), exc.headers)
            return
        manager = await self._started()
        await manager.handle_request(scope, receive, send)


def _body_limit() -> int:
    from sectr_web.body_limits import max_request_bytes

    return int(max_request_bytes())


async def _authenticate(scope: dict[str, Any]) -> dict[str, Any]:
    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}

    class _Headers:  # what api.auth.bearer_token reads
        def __init__(self) -> None:
            self.headers = {"Authorization": headers.get("authorization", "")}

    raw = bearer_token(_Headers())  # type: ignore[arg-type]
    if raw is None:
        raise ApiError("an API token is required: Authorization: Bearer <token>", code="unauthenticated", status=401)
    token = await sync_to_async(ApiToken.authenticate)(raw)
    if token is None:
        raise ApiError("the API token is invalid or revoked", code="invalid_token", status=401)
    if scope.get("method") == "POST":
        await check_rate_limit(token)
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    team_name = (query.get("team") or [None])[0]
    team = await sync_to_async(_team)(token.user, team_name)
    return {"user": token.user, "team": team, "token_id": token.pk}


def _team(user: Any, name: str | None) -> Any:
    try:
        team = check_session_team(user, name if name else DEFAULT_TEAM)
    except SectrError as exc:
        raise ApiError(str(exc), code="invalid_team", status=400) from None
    if team is None:
        raise ApiError(
            "name the team whose rules and moderators decide: /mcp?team=<name> (you are not a member of exactly one)",
            code="team_required",
            status=400,
        )
    return team


async def _error(send: Any, status: int, code: str, message: str, headers: dict[str, str] | None) -> None:
    body = json.dumps({"error": {"code": code, "message": message}}).encode()
    extra = dict(headers or {})
    if status == 401:
        extra.update(CHALLENGE)
    raw_headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw_headers += [(k.lower().encode(), v.encode()) for k, v in extra.items()]
    await send({"type": "http.response.start", "status": status, "headers": raw_headers})
    await send({"type": "http.response.body", "body": body})


ENDPOINT = McpEndpoint()
