"""`AsyncClient`: the asyncio SDK, call for call the twin of `Client` (sectr.client.sync).

Cancelling the task that awaits a call cancels it as usual; a `Cancellation` passed as
``cancel=`` does the same from any thread and raises RequestCancelled.
"""

from __future__ import annotations

import asyncio
import builtins
import inspect
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx

from sectr.client.errors import InvalidStateError, RequestCancelled, SessionBusyError, TransportError
from sectr.client.models import PermissionAsk, RunEvent, RunResult, SessionMode, Snapshot, Transcript, Verdict
from sectr.client.parts import check_parts
from sectr.client.protocol import (
    API_PREFIX,
    DEFAULT_TIMEOUT,
    MAX_RECONNECTS,
    Cancellation,
    Deadline,
    RequestControls,
    RunFollower,
    SessionCursor,
    SSEDecoder,
    StreamUnavailable,
    answer_of,
    backoff,
    base_url_from_env,
    check_stream_answer,
    checked_calls,
    client_headers,
    control_options,
    decode_answer,
    is_event_stream,
    posted_run_stream,
    run_event_from_sse,
    run_stream_request,
    session_headers,
    stream_timeout,
    stream_unavailable_wait,
    timeout_for,
    token_from_env,
    transport_error,
    unavailable_wait,
    verdict_value,
)
from sectr.client.records import (
    Agent,
    AgentVersion,
    ApprovalRule,
    AskInfo,
    AskPage,
    Experiment,
    McpServerInfo,
    PairVerdict,
    QueuedPairs,
    Rating,
    Ratings,
    RunInfo,
    ScoreDefinition,
    SessionPage,
    Webhook,
    agent_body,
    agents_from_json,
    ask_query,
    decide_body,
    experiment_body,
    experiments_from_json,
    fork_body,
    mcp_server_body,
    mcp_servers_from_json,
    rating_body,
    rule_body,
    rules_from_json,
    run_body,
    score_body,
    scores_from_json,
    send_to_queue_body,
    session_body,
    verdict_body,
    versions_from_json,
    webhook_body,
    webhooks_from_json,
)

#: on_permission_ask for AsyncRun: a function or coroutine function taking the ask and
#: returning a verdict (or None to leave the ask pending).
AsyncResponder = Callable[[PermissionAsk], Any | Awaitable[Any]]
ACTIVE_RUN_STATUSES = ("pending", "queued", "running")


class _StreamCut(Exception):  # noqa: N818 - internal signal
    """The server closed a run's stream before its result."""


class _CancelScope:
    """Turns a Cancellation (any thread) into cancelling the current task."""

    def __init__(self, cancel: Cancellation | None) -> None:
        self.cancel = cancel
        self._remove: Callable[[], None] | None = None
        self._task: asyncio.Task[Any] | None = None

    def __enter__(self) -> _CancelScope:
        if self.cancel is not None:
            self.cancel.check()
            loop = asyncio.get_running_loop()
            task = asyncio.current_task()
            self._task = task
            if task is not None:
                self._remove = self.cancel.on_cancel(lambda: loop.call_soon_threadsafe(task.cancel))
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if self._remove is not None:
            self._remove()
        if exc_type is asyncio.CancelledError and self.cancel is not None and self.cancel.cancelled:
            if self._task is not None:
                self._task.uncancel()
            raise RequestCancelled("the call was cancelled") from None


class AsyncClient:
    """``AsyncClient(base_url, token=...)``; use ``async with`` or `aclose()`."""

    def __init__(
        self,
        base_url: str | None = None,
        token: str | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        headers: dict[str, str] | None = None,
        max_reconnects: int = MAX_RECONNECTS,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.base_url = base_url_from_env(base_url)
        self.timeout = timeout
        self.max_reconnects = max_reconnects
        self._http = httpx.AsyncClient(
            base_url=self.base_url,
            headers=client_headers(token_from_env(token), headers),
            timeout=timeout,
            transport=transport,
        )
        self.sessions = AsyncSessions(self)
        self.runs = AsyncRuns(self)
        self.asks = AsyncAsks(self)
        self.teams = AsyncTeams(self)
        self.scores = AsyncScores(self)
        self.experiments = AsyncExperiments(self)
        self.agents = AsyncAgents(self)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: dict[str, Any] | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - an httpx per-phase limit; `deadline` is the total
        headers: dict[str, str] | None = None,
        cancel: Cancellation | None = None,
        deadline: float | Deadline | None = None,
        controls: RequestControls | None = None,
        session_id: str | None = None,
    ) -> Any:
        if controls is not None:
            flat = control_options({"controls": controls, "timeout": timeout, "headers": headers, "cancel": cancel})
            timeout, headers, cancel = flat.get("timeout"), flat.get("headers"), flat.get("cancel")
            deadline = deadline if deadline is not None else flat.get("deadline")
        limit = Deadline.of(deadline)
        what = f"{method} {path}"
        limit.check(what)
        request = self._http.build_request(
            method,
            API_PREFIX + path,
            json=json,
            params=params,
            headers=session_headers(session_id, headers),
            timeout=timeout_for(timeout, self.timeout),
        )
        with _CancelScope(cancel):
            try:
                response = await asyncio.wait_for(self._http.send(request), limit.remaining())
            except TimeoutError:
                raise limit.error(what) from None
            except httpx.HTTPError as exc:
                raise transport_error(exc, what) from exc
        return decode_answer(response)

    async def _post_run(
        self,
        path: str,
        body: dict[str, Any],
        *,
        stream: bool,
        timeout: float | None,  # noqa: ASYNC109 - an httpx request timeout (docs/sdk.md)
        headers: dict[str, str] | None,
        cancel: Cancellation | None,
        limit: Deadline,
        session_id: str,
    ) -> tuple[str, httpx.Response | None]:
        """As Client._post_run: the run's id, and with `stream` its open event stream (a
        503 `unavailable` posted nothing: sent again after its Retry-After, a few times)."""
        if not stream:
            data = await self.request(
                "POST", path, json=body, timeout=timeout, headers=headers, cancel=cancel, deadline=limit,
                session_id=session_id,
            )  # fmt: skip
            return str(data["run_id"]), None
        what = f"POST {path}"
        retries = 0
        while True:
            limit.check(what)
            request = run_stream_request(
                self._http, path, body, headers=headers, session_id=session_id, timeout=timeout, limit=limit
            )
            with _CancelScope(cancel):
                try:
                    response = await asyncio.wait_for(self._http.send(request, stream=True), limit.remaining())
                except TimeoutError:
                    raise limit.error(what) from None
                except httpx.HTTPError as exc:
                    raise transport_error(exc, what) from exc
                try:
                    run_id = posted_run_stream(response)
                except Exception:
                    await response.aclose()
                    raise
                if run_id is not None:
                    return run_id, response
                try:
                    await response.aread()
                except httpx.HTTPError as exc:
                    raise transport_error(exc, what) from exc
                finally:
                    await response.aclose()
                wait = unavailable_wait(response, retries, limit)
                if wait is None:
                    return str(decode_answer(response)["run_id"]), None
                retries += 1
                await asyncio.sleep(wait)

    @asynccontextmanager
    async def _event_stream(
        self,
        run_id: str,
        headers: dict[str, str],
        timeout: float | None,  # noqa: ASYNC109 - an httpx request timeout (docs/sdk.md)
        limit: Deadline | None = None,
        *,
        path: str | None = None,
        opened: httpx.Response | None = None,
    ) -> AsyncIterator[httpx.Response]:
        """The event stream of run `run_id` (or at `path`, under the API), or the one a
        POST opened already (`opened`)."""
        if opened is not None:
            response = opened
        else:
            request = self._http.build_request(
                "GET",
                API_PREFIX + (path or f"/runs/{run_id}/events"),
                headers={"Accept": "text/event-stream", **headers},
                timeout=limit.cap(stream_timeout(timeout)) if limit is not None else stream_timeout(timeout),
            )
            response = await self._http.send(request, stream=True)
        try:
            if not is_event_stream(response):
                await response.aread()
                check_stream_answer(response)
            yield response
        finally:
            await response.aclose()

    def session(self, session_id: str) -> AsyncSession:
        return AsyncSession(self, session_id)


@checked_calls
class AsyncSessions:
    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    async def create(
        self,
        title: str | None = None,
        mode: SessionMode | str | None = None,
        model: str | None = None,
        *,
        limits: dict[str, int] | None = None,
        reasoning_effort: str | None = None,
        team: str | None = None,
        agent: str | None = None,
        agent_version: int | None = None,
        **options: Any,
    ) -> AsyncSession:
        body = session_body(title, mode, model, limits, reasoning_effort, team, agent, agent_version)
        data = await self._client.request("POST", "/sessions", json=body, **options)
        return AsyncSession(self._client, data["id"], Snapshot.from_json(data))

    async def get(self, session_id: str, **options: Any) -> AsyncSession:
        data = await self._client.request("GET", f"/sessions/{session_id}", session_id=session_id, **options)
        return AsyncSession(self._client, session_id, Snapshot.from_json(data))

    async def list(self, *, limit: int = 50, offset: int = 0, **options: Any) -> SessionPage:
        data = await self._client.request("GET", "/sessions", params={"limit": limit, "offset": offset}, **options)
        return SessionPage.from_json(data)

    async def fork(
        self,
        session_id: str,
        *,
        title: str | None = None,
        reasoning_effort: str | None = None,
        model: str | None = None,
        at_seq: int | None = None,
        provider_id: str | None = None,
        model_id: str | None = None,
        worktree_selector: str | dict[str, Any] | None = None,
        **options: Any,
    ) -> AsyncSession:
        body = fork_body(title, reasoning_effort, model, at_seq, provider_id, model_id, worktree_selector)
        path = f"/sessions/{session_id}/fork"
        data = await self._client.request("POST", path, json=body, session_id=session_id, **options)
        return AsyncSession(self._client, data["id"], Snapshot.from_json(data))


@checked_calls
class AsyncSession:
    def __init__(self, client: AsyncClient, session_id: str, snapshot: Snapshot | None = None) -> None:
        self._client = client
        self.id = session_id
        self.last_snapshot = snapshot
        self._active: AsyncRun | None = None

    def __repr__(self) -> str:
        return f"<AsyncSession {self.id}>"

    async def _request(self, method: str, suffix: str = "", **kwargs: Any) -> Any:
        return await self._client.request(method, f"/sessions/{self.id}{suffix}", session_id=self.id, **kwargs)

    def _snapshot(self, data: Any) -> Snapshot:
        self.last_snapshot = Snapshot.from_json(data)
        return self.last_snapshot

    async def snapshot(self, **options: Any) -> Snapshot:
        return self._snapshot(await self._request("GET", **options))

    async def transcript(self, view: str = "model", **options: Any) -> Transcript:
        """What the model sees (view="model": from the newest compaction, its summary
        first) or everything people saw (view="history")."""
        params = {"view": view}
        return Transcript.from_json(await self._request("GET", "/transcript", params=params, **options))

    async def rename(self, title: str, **options: Any) -> Snapshot:
        return self._snapshot(await self._request("POST", "/rename", json={"title": title}, **options))

    async def set_mode(self, mode: SessionMode | str, **options: Any) -> Snapshot:
        return self._snapshot(await self._request("POST", "/mode", json={"mode": str(mode)}, **options))

    async def set_model(self, model: str, *, reasoning_effort: str | None = None, **options: Any) -> Snapshot:
        body: dict[str, Any] = {"model": model}
        if reasoning_effort is not None:
            body["reasoning_effort"] = reasoning_effort
        return self._snapshot(await self._request("POST", "/model", json=body, **options))

    async def compact(self, **options: Any) -> bool:
        return bool((await self._request("POST", "/compact", **options))["compacted"])

    async def clear(self, *, worktree_selector: str | dict[str, Any] | None = None, **options: Any) -> AsyncSession:
        body = {"worktree_selector": worktree_selector} if worktree_selector is not None else None
        data = await self._request("POST", "/clear", json=body, **options)
        return AsyncSession(self._client, data["id"], Snapshot.from_json(data))

    async def fork(
        self,
        *,
        title: str | None = None,
        reasoning_effort: str | None = None,
        model: str | None = None,
        at_seq: int | None = None,
        provider_id: str | None = None,
        model_id: str | None = None,
        worktree_selector: str | dict[str, Any] | None = None,
        **options: Any,
    ) -> AsyncSession:
        return await self._client.sessions.fork(
            self.id,
            title=title,
            reasoning_effort=reasoning_effort,
            model=model,
            at_seq=at_seq,
            provider_id=provider_id,
            model_id=model_id,
            worktree_selector=worktree_selector,
            **options,
        )

    async def close(self, **options: Any) -> Snapshot:
        return self._snapshot(await self._request("POST", "/close", **options))

    async def delete(self, **options: Any) -> None:
        await self._request("DELETE", **options)

    async def rate(
        self,
        scores: dict[str, Any],
        *,
        message_id: str | None = None,
        tags: builtins.list[str] | None = None,
        comment: str | None = None,
        **options: Any,
    ) -> Rating:
        """Rate the session (or the message `message_id`) with scores by name: `thumbs`
        (True: up), `score` (1-5) and the team's own; replaces your earlier rating of it."""
        body = rating_body(scores, message_id, tags, comment)
        return Rating.from_json(await self._request("POST", "/ratings", json=body, **options))

    async def ratings(self, **options: Any) -> Ratings:
        """Reviewers' ratings of the session and its messages, with the team's scores."""
        return Ratings.from_json(await self._request("GET", "/ratings", **options))

    async def run(
        self,
        content: str | list[dict[str, Any]],
        *,
        on_permission_ask: AsyncResponder | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - an httpx request timeout (docs/sdk.md)
        headers: dict[str, str] | None = None,
        cancel: Cancellation | None = None,
        queue: bool = False,
        stream: bool = False,
        deadline: float | None = None,
        controls: RequestControls | None = None,
    ) -> AsyncRun:
        """As Session.run; with `stream` the POST's answer is the run's event stream."""
        flat = control_options({"controls": controls, "timeout": timeout, "headers": headers, "cancel": cancel})
        timeout, headers, cancel = flat.get("timeout"), flat.get("headers"), flat.get("cancel")
        limit = Deadline.of(deadline if deadline is not None else flat.get("deadline"))
        body = run_body(content, queue)
        if isinstance(content, list):
            if self.last_snapshot is None:
                await self.snapshot(timeout=timeout, headers=headers, cancel=cancel, deadline=limit)
            check_parts(content, self.last_snapshot.media if self.last_snapshot is not None else None)
        if not queue and self._active is not None and not self._active.finished:
            active = self._active.id
            status = (await self._client.runs.get(active, timeout=timeout, headers=headers, deadline=limit)).status
            if status in ACTIVE_RUN_STATUSES:
                raise SessionBusyError(f"run {active} of this session is still {status}", code="session_busy")
        run_id, opened = await self._client._post_run(
            f"/sessions/{self.id}/runs", body, stream=stream, timeout=timeout, headers=headers, cancel=cancel,
            limit=limit, session_id=self.id,
        )  # fmt: skip
        run = AsyncRun(
            self._client,
            run_id,
            on_permission_ask=on_permission_ask,
            timeout=timeout,
            headers=headers,
            cancel=cancel,
            deadline=limit,
            session_id=self.id,
            opened=opened,
        )
        self._active = run
        return run

    async def events(
        self,
        *,
        after: int | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - an httpx request timeout (docs/sdk.md)
        headers: dict[str, str] | None = None,
        cancel: Cancellation | None = None,
        controls: RequestControls | None = None,
    ) -> AsyncIterator[RunEvent]:
        """As Session.events: every run's events of this session as they come, resumed
        after a cut; it never ends by itself."""
        flat = control_options({"controls": controls, "timeout": timeout, "headers": headers, "cancel": cancel})
        timeout, cancel = flat.get("timeout"), flat.get("cancel")
        base = session_headers(self.id, flat.get("headers"))
        cursor = SessionCursor(after=after)
        failures = 0
        with _CancelScope(cancel):
            while True:
                mark = cursor.last_seq
                try:
                    path = f"/sessions/{self.id}/events"
                    async with self._client._event_stream(
                        "", {**base, **cursor.resume_headers()}, timeout, path=path
                    ) as response:  # fmt: skip
                        decoder = SSEDecoder()
                        async for chunk in response.aiter_bytes():
                            for sse in decoder.feed(chunk):
                                event = run_event_from_sse(sse)
                                if cursor.accept(event):
                                    yield event
                    raise _StreamCut("the session's stream ended")  # a restart's `retry:`: go on
                except StreamUnavailable as exc:  # a 503 before the stream: a cut, after Retry-After
                    failures = 1 if cursor.last_seq != mark else failures + 1
                    await asyncio.sleep(stream_unavailable_wait(exc, failures, self._client.max_reconnects))
                except (httpx.HTTPError, httpx.StreamError, _StreamCut) as exc:
                    failures = 1 if cursor.last_seq != mark else failures + 1
                    if failures > self._client.max_reconnects:
                        raise TransportError(f"the event stream of {self.id} failed {failures} times: {exc}") from exc
                    await asyncio.sleep(backoff(failures))

    async def retry(
        self,
        *,
        on_permission_ask: AsyncResponder | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - an httpx request timeout (docs/sdk.md)
        headers: dict[str, str] | None = None,
        cancel: Cancellation | None = None,
        deadline: float | None = None,
        controls: RequestControls | None = None,
    ) -> AsyncRun:
        flat = control_options({"controls": controls, "timeout": timeout, "headers": headers, "cancel": cancel})
        timeout, headers, cancel = flat.get("timeout"), flat.get("headers"), flat.get("cancel")
        limit = Deadline.of(deadline if deadline is not None else flat.get("deadline"))
        data = await self._request("POST", "/retry", timeout=timeout, headers=headers, cancel=cancel, deadline=limit)
        run = AsyncRun(
            self._client,
            data["run_id"],
            on_permission_ask=on_permission_ask,
            timeout=timeout,
            headers=headers,
            cancel=cancel,
            deadline=limit,
            session_id=self.id,
        )
        self._active = run
        return run


@checked_calls
class AsyncRuns:
    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    async def get(self, run_id: str, **options: Any) -> RunInfo:
        return RunInfo.from_json(await self._client.request("GET", f"/runs/{run_id}", **options))

    def attach(
        self,
        run_id: str,
        *,
        on_permission_ask: AsyncResponder | None = None,
        session_id: str | None = None,
        **options: Any,
    ) -> AsyncRun:
        flat = control_options(options)
        return AsyncRun(
            self._client,
            run_id,
            on_permission_ask=on_permission_ask,
            timeout=flat.get("timeout"),
            headers=flat.get("headers"),
            cancel=flat.get("cancel"),
            deadline=Deadline.of(flat.get("deadline")),
            session_id=session_id,
        )


@checked_calls
class AsyncAsks:
    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    async def list(
        self,
        *,
        state: str | None = None,
        team: str | None = None,
        tool: str | None = None,
        limit: int | None = None,
        offset: int | None = None,
        **options: Any,
    ) -> AskPage:
        """The asks the caller may see, newest first: state "pending" or "decided", a team, a tool."""
        params = ask_query(state, team, tool, limit, offset)
        return AskPage.from_json(await self._client.request("GET", "/asks", params=params, **options))

    async def decide(
        self,
        ask_id: str,
        verdict: Verdict | str,
        *,
        note: str | None = None,
        scope: str | None = None,
        arguments: dict[str, Any] | None = None,
        result: str | None = None,
        **options: Any,
    ) -> Decision:
        """Decide (or vote on) an ask. `Decision.run` is the resumed session's run, or None
        for a vote that leaves a quorum short. AskAlreadyResolvedError (with `decided_by`)
        when someone decided first. `scope="turn"` ("Approve all", with an approving
        verdict) also approves the later gated calls of the ask's turn. `arguments` (with
        allow_once) runs the call with these instead; `result` (with respond) answers it
        with this text instead of running it."""
        data = await self._client.request(
            "POST",
            f"/asks/{ask_id}",
            json=decide_body(verdict_value(verdict), note, scope, arguments, result),
            **options,
        )
        run = AsyncRun(self._client, data["run_id"]) if data.get("run_id") else None
        ask = AskInfo.from_json(data["ask"]) if isinstance(data.get("ask"), dict) else None
        return Decision(run, ask)

    async def resolve(
        self,
        ask_id: str,
        verdict: str,
        *,
        note: str | None = None,
        arguments: dict[str, Any] | None = None,
        result: str | None = None,
        **options: Any,
    ) -> AsyncRun:
        """Decide an ask; returns the resumed session's run. AskAlreadyResolvedError if decided."""
        decision = await self.decide(ask_id, verdict, note=note, arguments=arguments, result=result, **options)
        if decision.run is None:
            raise InvalidStateError("the vote was recorded; the ask needs more approvals", code="quorum_pending")
        return decision.run


@checked_calls
class AsyncTeams:
    """A team's approval rules and MCP servers (read by its members, changed by its
    moderators) and its webhooks (its moderators only; a secret is write-only)."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    async def rules(self, name: str, **options: Any) -> list[ApprovalRule]:
        return rules_from_json(await self._client.request("GET", f"/teams/{name}/rules", **options))

    async def create_rule(
        self,
        name: str,
        tool: str,
        action: str,
        *,
        arguments: dict[str, str] | None = None,
        approvals_required: int | None = None,
        expires_after_s: int | None = None,
        position: int | None = None,
        **options: Any,
    ) -> ApprovalRule:
        body = rule_body(tool, action, arguments, approvals_required, expires_after_s, position)
        return ApprovalRule.from_json(await self._client.request("POST", f"/teams/{name}/rules", json=body, **options))

    async def update_rule(
        self,
        name: str,
        rule_id: str,
        tool: str,
        action: str,
        *,
        arguments: dict[str, str] | None = None,
        approvals_required: int | None = None,
        expires_after_s: int | None = None,
        position: int | None = None,
        **options: Any,
    ) -> ApprovalRule:
        """Replace a rule's fields (PUT: left-out fields take their defaults) and move it with `position`."""
        body = rule_body(tool, action, arguments, approvals_required, expires_after_s, position)
        path = f"/teams/{name}/rules/{rule_id}"
        return ApprovalRule.from_json(await self._client.request("PUT", path, json=body, **options))

    async def delete_rule(self, name: str, rule_id: str, **options: Any) -> None:
        await self._client.request("DELETE", f"/teams/{name}/rules/{rule_id}", **options)

    async def webhooks(self, name: str, **options: Any) -> list[Webhook]:
        return webhooks_from_json(await self._client.request("GET", f"/teams/{name}/webhooks", **options))

    async def add_webhook(
        self, name: str, url: str, *, kind: str | None = None, secret: str | None = None, **options: Any
    ) -> Webhook:
        """Add a webhook: `kind` "json" (the default) or "slack"; `secret` signs the JSON
        deliveries (a random one when left out) and is never returned."""
        body = webhook_body(url, kind, secret)
        return Webhook.from_json(await self._client.request("POST", f"/teams/{name}/webhooks", json=body, **options))

    async def delete_webhook(self, name: str, webhook_id: int, **options: Any) -> None:
        await self._client.request("DELETE", f"/teams/{name}/webhooks/{webhook_id}", **options)

    # ---- MCP servers (docs/mcp.md) ----

    async def mcp_servers(self, name: str, **options: Any) -> list[McpServerInfo]:
        """The team's MCP servers (headers by name only)."""
        return mcp_servers_from_json(await self._client.request("GET", f"/teams/{name}/mcp-servers", **options))

    async def mcp_server(self, name: str, server: str, **options: Any) -> McpServerInfo:
        path = f"/teams/{name}/mcp-servers/{server}"
        return McpServerInfo.from_json(await self._client.request("GET", path, **options))

    async def add_mcp_server(
        self,
        name: str,
        server: str,
        url: str | None = None,
        *,
        headers: dict[str, str] | None = None,
        enabled: bool | None = None,
        timeout_s: float | None = None,
        tools: list[str] | None = None,
        **options: Any,
    ) -> McpServerInfo:
        """Register a Streamable HTTP server (with `url`), or enable the installation's
        stdio server named `server` for the team (without); its tools are discovered."""
        body = mcp_server_body(server, url, headers, enabled, timeout_s, tools)
        path = f"/teams/{name}/mcp-servers"
        return McpServerInfo.from_json(await self._client.request("POST", path, json=body, **options))

    async def update_mcp_server(
        self,
        name: str,
        server: str,
        *,
        url: str | None = None,
        headers: dict[str, str] | None = None,
        enabled: bool | None = None,
        timeout_s: float | None = None,
        tools: list[str] | None = None,
        **options: Any,
    ) -> McpServerInfo:
        """Change what is given (`headers` replace the stored set), then discover again."""
        body = mcp_server_body(None, url, headers, enabled, timeout_s, tools)
        path = f"/teams/{name}/mcp-servers/{server}"
        return McpServerInfo.from_json(await self._client.request("PUT", path, json=body, **options))

    async def refresh_mcp_server(self, name: str, server: str, **options: Any) -> McpServerInfo:
        path = f"/teams/{name}/mcp-servers/{server}/refresh"
        return McpServerInfo.from_json(await self._client.request("POST", path, **options))

    async def delete_mcp_server(self, name: str, server: str, **options: Any) -> None:
        """Delete the team's server, or disable an installation server for the team."""
        await self._client.request("DELETE", f"/teams/{name}/mcp-servers/{server}", **options)


@checked_calls
class AsyncScores:
    """A team's scores: read by anyone with a role in it, defined by its moderators."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    async def list(self, team: str, **options: Any) -> builtins.list[ScoreDefinition]:
        return scores_from_json(await self._client.request("GET", f"/teams/{team}/scores", **options))

    async def create(
        self,
        team: str,
        name: str,
        kind: str,
        *,
        labels: builtins.list[str] | None = None,
        minimum: float | None = None,
        maximum: float | None = None,
        description: str | None = None,
        **options: Any,
    ) -> ScoreDefinition:
        """Define a score: categorical (give `labels`), numeric (`minimum`, `maximum`) or boolean."""
        body = {"name": name, "kind": kind, **score_body(labels, minimum, maximum, description)}
        path = f"/teams/{team}/scores"
        return ScoreDefinition.from_json(await self._client.request("POST", path, json=body, **options))

    async def update(
        self,
        team: str,
        name: str,
        *,
        labels: builtins.list[str] | None = None,
        minimum: float | None = None,
        maximum: float | None = None,
        description: str | None = None,
        **options: Any,
    ) -> ScoreDefinition:
        """Change a score's labels, range or description (its name and kind stay)."""
        body = score_body(labels, minimum, maximum, description)
        path = f"/teams/{team}/scores/{name}"
        return ScoreDefinition.from_json(await self._client.request("PUT", path, json=body, **options))

    async def delete(self, team: str, name: str, **options: Any) -> None:
        """Delete a score; ratings keep the values given with it."""
        await self._client.request("DELETE", f"/teams/{team}/scores/{name}", **options)


@dataclass(frozen=True)
class Decision:
    """What deciding an ask did: the resumed run (None while a quorum is short) and the ask now."""

    run: AsyncRun | None
    ask: AskInfo | None


@checked_calls
class AsyncRun:
    """The async twin of `Run`: ``async for event in run`` or ``await run.result()``, once."""

    def __init__(
        self,
        client: AsyncClient,
        run_id: str,
        *,
        on_permission_ask: AsyncResponder | None = None,
        timeout: float | None = None,
        headers: dict[str, str] | None = None,
        cancel: Cancellation | None = None,
        deadline: Deadline | None = None,
        session_id: str | None = None,
        opened: httpx.Response | None = None,
    ) -> None:
        self._client = client
        #: the run's event stream a POST opened (AsyncSession.run(stream=True)), read first
        self._opened = opened
        self._follower = RunFollower(run_id)
        self._responder = on_permission_ask
        self._timeout = timeout
        self._headers = session_headers(session_id, headers)
        self._cancel = cancel
        self._deadline = deadline or Deadline(None)
        self.session_id = session_id
        self._consumed: str | None = None

    def __repr__(self) -> str:
        return f"<AsyncRun {self.id}{' finished' if self.finished else ''}>"

    @property
    def id(self) -> str:
        return self._follower.run_id

    run_id = id

    @property
    def run_ids(self) -> list[str]:
        return list(self._follower.run_ids)

    @property
    def finished(self) -> bool:
        return self._follower.finished

    @property
    def pending_ask(self) -> PermissionAsk | None:
        return self._follower.pending_ask

    def __aiter__(self) -> AsyncIterator[RunEvent]:
        self._consume("iteration")
        return self._events()

    async def result(self) -> RunResult:
        if self._follower.result is not None and self._consumed == "result":
            return self._follower.result
        if self._consumed != "result":
            self._consume("result")
        async for _ in self._events():
            pass
        assert self._follower.result is not None
        return self._follower.result

    def _consume(self, how: str) -> None:
        if self._consumed is not None:
            raise InvalidStateError(
                f"this run was already consumed by {self._consumed}: iterate a run or call result(), once",
                code="run_consumed",
            )
        self._consumed = how

    async def cancel(self, **options: Any) -> RunInfo:
        return RunInfo.from_json(
            await self._client.request("POST", f"/runs/{self.id}/cancel", **self._options(options))
        )

    async def steer(self, text: str, **options: Any) -> RunInfo:
        data = await self._client.request(
            "POST", f"/runs/{self.id}/steer", json={"text": text}, **self._options(options)
        )
        return RunInfo.from_json(data)

    async def status(self, **options: Any) -> RunInfo:
        return await self._client.runs.get(self.id, **self._options(options))

    async def resolve_ask(
        self,
        ask_id: str,
        verdict: str,
        *,
        note: str | None = None,
        arguments: dict[str, Any] | None = None,
        result: str | None = None,
        **options: Any,
    ) -> AsyncRun:
        resumed = await self._client.asks.resolve(
            ask_id, verdict, note=note, arguments=arguments, result=result, **self._options(options)
        )
        pending = self._follower.pending_ask
        if not self.finished and (pending is None or pending.ask_id == ask_id):
            self._follower.resumed(resumed.id)
        return resumed

    def _options(self, options: dict[str, Any]) -> dict[str, Any]:
        return {"timeout": self._timeout, "headers": self._headers, **options}

    async def _events(self) -> AsyncGenerator[RunEvent, None]:
        failures = 0
        limit = self._deadline
        with _CancelScope(self._cancel):
            while not self._follower.finished:
                limit.check(f"run {self.id}")
                mark = (self._follower.run_id, self._follower.last_seq)
                try:
                    async for event in self._follow_stream():
                        yield event
                except StreamUnavailable as exc:  # a 503 before the stream: a cut, after Retry-After
                    failures = 1 if (self._follower.run_id, self._follower.last_seq) != mark else failures + 1
                    await asyncio.sleep(stream_unavailable_wait(exc, failures, self._client.max_reconnects, limit))
                except (httpx.HTTPError, httpx.StreamError, _StreamCut) as exc:
                    if limit.expired:
                        raise limit.error(f"run {self.id}") from exc
                    failures = 1 if (self._follower.run_id, self._follower.last_seq) != mark else failures + 1
                    if failures > self._client.max_reconnects:
                        raise TransportError(f"the event stream of {self.id} failed {failures} times: {exc}") from exc
                    left = limit.remaining()
                    await asyncio.sleep(backoff(failures) if left is None else min(backoff(failures), left))

    async def _follow_stream(self) -> AsyncGenerator[RunEvent, None]:
        follower = self._follower
        headers = {**self._headers, **follower.resume_headers()}
        limit = self._deadline
        opened, self._opened = self._opened, None
        async with self._client._event_stream(
            follower.run_id, headers, self._timeout, limit, opened=opened
        ) as response:  # fmt: skip
            decoder = SSEDecoder()
            async for chunk in response.aiter_bytes():
                limit.check(f"run {self.id}")
                for sse in decoder.feed(chunk):
                    step = follower.accept(run_event_from_sse(sse))
                    if step.deliver is not None:
                        yield step.deliver
                    if not step.done:
                        continue
                    if step.ask is not None and step.held is not None:
                        await self._answer(step.ask)
                        if follower.after_ask():
                            return
                        yield follower.finish_awaiting(step.held)
                    return
        raise _StreamCut("the stream ended before the run's result")

    async def _answer(self, ask: PermissionAsk) -> None:
        if self._follower.next_run_id is not None or self._responder is None:
            return
        verdict = self._responder(ask)
        if inspect.isawaitable(verdict):
            verdict = await verdict
        if verdict is not None and self._follower.next_run_id is None:
            answer, answer_options = answer_of(verdict)
            await self.resolve_ask(ask.ask_id, answer, **answer_options)


@checked_calls
class AsyncAgents:
    """Agents and their versions (docs/agents.md): every team member sees them, a team's
    moderators create and save them; every save is a new version."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    async def list(self, team: str | None = None, **options: Any) -> builtins.list[Agent]:
        """The agents the caller may use, or one team's."""
        path = f"/teams/{team}/agents" if team is not None else "/agents"
        return agents_from_json(await self._client.request("GET", path, **options))

    async def get(self, agent_id: str, **options: Any) -> Agent:
        """An agent by id (or `team/slug`) with its latest version."""
        team, _, slug = agent_id.rpartition("/")
        path = f"/teams/{team}/agents/{slug}" if team else f"/agents/{agent_id}"
        return Agent.from_json(await self._client.request("GET", path, **options))

    async def create(
        self,
        team: str,
        slug: str,
        name: str,
        *,
        instructions: str | None = None,
        model: str | None = None,
        tools: builtins.list[str] | None = None,
        description: str | None = None,
        params: dict[str, Any] | None = None,
        mode: str | None = None,
        limits: dict[str, int] | None = None,
        handler: str | None = None,
        note: str | None = None,
        **options: Any,
    ) -> Agent:
        fields = {
            "name": name,
            "instructions": instructions,
            "model": model,
            "tools": tools,
            "description": description,
            "params": params,
            "mode": mode,
            "limits": limits,
            "handler": handler,
        }
        body = {"slug": slug, **agent_body(fields, note)}
        return Agent.from_json(await self._client.request("POST", f"/teams/{team}/agents", json=body, **options))

    async def update(
        self,
        agent_id: str,
        note: str | None = None,
        *,
        name: str | None = None,
        instructions: str | None = None,
        model: str | None = None,
        tools: builtins.list[str] | None = None,
        description: str | None = None,
        params: dict[str, Any] | None = None,
        mode: str | None = None,
        limits: dict[str, int] | None = None,
        handler: str | None = None,
        **options: Any,
    ) -> AgentVersion:
        """Save the next version: the fields given replace the latest version's (the
        others stay); `note` says what changed."""
        fields = {
            "name": name,
            "instructions": instructions,
            "model": model,
            "tools": tools,
            "description": description,
            "params": params,
            "mode": mode,
            "limits": limits,
            "handler": handler,
        }
        body = agent_body(fields, note)
        return AgentVersion.from_json(await self._client.request("PUT", f"/agents/{agent_id}", json=body, **options))

    async def versions(self, agent_id: str, **options: Any) -> builtins.list[AgentVersion]:
        """Every version of an agent, newest first."""
        return versions_from_json(await self._client.request("GET", f"/agents/{agent_id}/versions", **options))

    async def version(self, agent_id: str, number: int, **options: Any) -> AgentVersion:
        return AgentVersion.from_json(
            await self._client.request("GET", f"/agents/{agent_id}/versions/{number}", **options)
        )


@checked_calls
class AsyncExperiments:
    """Experiments (docs/experiments.md): a team's sessions replayed on candidate agent
    versions, created by its moderators, read and judged by its reviewers; their pairs
    can go to a review queue for blind A/B verdicts."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    async def list(self, team: str, **options: Any) -> builtins.list[Experiment]:
        """The team's experiments, newest first."""
        return experiments_from_json(await self._client.request("GET", f"/teams/{team}/experiments", **options))

    async def get(self, experiment_id: str, **options: Any) -> Experiment:
        """An experiment with its replays' progress and the summary per candidate."""
        return Experiment.from_json(await self._client.request("GET", f"/experiments/{experiment_id}", **options))

    async def create(
        self,
        team: str,
        name: str,
        candidates: builtins.list[dict[str, Any]],
        *,
        sessions: builtins.list[str] | None = None,
        queue: int | None = None,
        last: int | None = None,
        live_reads: bool | None = None,
        **options: Any,
    ) -> Experiment:
        """Replay sessions of the team (one of `sessions`, `queue`, `last`) on each
        candidate ({"agent", "version"?, "model"?})."""
        body = experiment_body(name, candidates, sessions, queue, last, live_reads)
        path = f"/teams/{team}/experiments"
        return Experiment.from_json(await self._client.request("POST", path, json=body, **options))

    async def judge(
        self,
        experiment_id: str,
        source: str,
        candidate: int,
        winner: str,
        *,
        note: str | None = None,
        scores: dict[str, Any] | None = None,
        **options: Any,
    ) -> PairVerdict:
        """A verdict on one pair, given openly: `winner` baseline, candidate or tie;
        `scores` each side's values of the team's own scores ({"baseline": {...},
        "candidate": {...}})."""
        body = verdict_body(source, candidate, winner, note, scores)
        path = f"/experiments/{experiment_id}/verdicts"
        return PairVerdict.from_json(await self._client.request("POST", path, json=body, **options))

    async def send_to_queue(
        self,
        experiment_id: str,
        *,
        queue: int | None = None,
        name: str | None = None,
        reviewers: builtins.list[str] | None = None,
        **options: Any,
    ) -> QueuedPairs:
        """Every pair of the experiment into a review queue of its team: `queue` (an id)
        or a new one (`name`, `reviewers` by username), for blind A/B verdicts."""
        body = send_to_queue_body(queue, name, reviewers)
        path = f"/experiments/{experiment_id}/queue"
        return QueuedPairs.from_json(await self._client.request("POST", path, json=body, **options))
