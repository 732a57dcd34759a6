"""`Client`: the synchronous SDK (docs/sdk.md) over httpx."""

from __future__ import annotations

import builtins
import time
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
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
    pause,
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

#: on_permission_ask: called with the ask when a run stops on it; return a verdict
#: ("allow_once", "allow_always", "deny") to answer it and follow the resumed run, or None.
Responder = Callable[[PermissionAsk], Any]
ACTIVE_RUN_STATUSES = ("pending", "queued", "running")


class _StreamCut(Exception):  # noqa: N818 - internal signal
    """The server closed a run's stream before its result."""


class Client:
    """A connection to a Sectr server: ``Client(base_url, token=...)``.

    `base_url` defaults to ``$SECTR_URL`` or http://127.0.0.1:8000, `token` to
    ``$SECTR_TOKEN``. `timeout` and `headers` apply to every request; each call can
    override them (``timeout=``, ``headers=``) and take a ``cancel=`` Cancellation.
    """

    def __init__(
        self,
        base_url: str | None = None,
        token: str | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        headers: dict[str, str] | None = None,
        max_reconnects: int = MAX_RECONNECTS,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.base_url = base_url_from_env(base_url)
        self.timeout = timeout
        self.max_reconnects = max_reconnects
        self._http = httpx.Client(
            base_url=self.base_url,
            headers=client_headers(token_from_env(token), headers),
            timeout=timeout,
            transport=transport,
        )
        self.sessions = Sessions(self)
        self.runs = Runs(self)
        self.asks = Asks(self)
        self.teams = Teams(self)
        self.scores = Scores(self)
        self.experiments = Experiments(self)
        self.agents = Agents(self)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- transport ----

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: dict[str, Any] | None = None,
        timeout: float | None = None,
        headers: dict[str, str] | None = None,
        cancel: Cancellation | None = None,
        deadline: float | Deadline | None = None,
        controls: RequestControls | None = None,
        session_id: str | None = None,
    ) -> Any:
        """One API call: the decoded JSON answer, or a typed SectrError. `session_id`
        (when the call is about a known session) adds the affinity header."""
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
            timeout=limit.cap(timeout_for(timeout, self.timeout)),
        )
        if cancel is not None:
            cancel.check()
        try:
            response = self._http.send(request, stream=True)
        except httpx.HTTPError as exc:
            if limit.expired:
                raise limit.error(what) from exc
            raise transport_error(exc, f"{method} {path}") from exc
        remove = cancel.on_cancel(response.close) if cancel is not None else None
        try:
            response.read()
        except Exception as exc:
            if cancel is not None and cancel.cancelled:
                raise RequestCancelled("the call was cancelled") from None
            if limit.expired:
                raise limit.error(what) from exc
            raise transport_error(exc, f"{method} {path}") from exc
        finally:
            response.close()
            if remove is not None:
                remove()
        return decode_answer(response)

    def _post_run(
        self,
        path: str,
        body: dict[str, Any],
        *,
        stream: bool,
        timeout: float | None,
        headers: dict[str, str] | None,
        cancel: Cancellation | None,
        limit: Deadline,
        session_id: str,
    ) -> tuple[str, httpx.Response | None]:
        """POST a run: its id, and with `stream` the open answer that is its event stream
        (`Accept: text/event-stream`: no second request before the first event). A server
        that answers with JSON anyway gives the id alone; an error is its typed error,
        except a 503 `unavailable`, which posted nothing: the POST is sent again after its
        Retry-After, a few times (`unavailable_wait`)."""
        if not stream:
            data = self.request(
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
            if cancel is not None:
                cancel.check()
            try:
                response = self._http.send(request, stream=True)
            except httpx.HTTPError as exc:
                if limit.expired:
                    raise limit.error(what) from exc
                raise transport_error(exc, what) from exc
            try:
                run_id = posted_run_stream(response)
            except Exception:
                response.close()
                raise
            if run_id is not None:
                return run_id, response
            try:
                response.read()
            except httpx.HTTPError as exc:
                raise transport_error(exc, what) from exc
            finally:
                response.close()
            wait = unavailable_wait(response, retries, limit)
            if wait is None:
                return str(decode_answer(response)["run_id"]), None
            retries += 1
            pause(wait, cancel)

    @contextmanager
    def _event_stream(
        self,
        run_id: str,
        headers: dict[str, str],
        timeout: float | None,
        cancel: Cancellation | None,
        limit: Deadline | None = None,
        *,
        path: str | None = None,
        opened: httpx.Response | None = None,
    ) -> Iterator[httpx.Response]:
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
            response = self._http.send(request, stream=True)
        remove = cancel.on_cancel(response.close) if cancel is not None else None
        try:
            if not is_event_stream(response):
                response.read()
                check_stream_answer(response)
            yield response
        finally:
            response.close()
            if remove is not None:
                remove()

    def session(self, session_id: str) -> Session:
        """A handle on a session by id, without a request (`sessions.get` checks it exists)."""
        return Session(self, session_id)


@checked_calls
class Sessions:
    def __init__(self, client: Client) -> None:
        self._client = client

    def create(
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
    ) -> Session:
        data = self._client.request(
            "POST",
            "/sessions",
            json=session_body(title, mode, model, limits, reasoning_effort, team, agent, agent_version),
            **options,
        )
        return Session(self._client, data["id"], Snapshot.from_json(data))

    def get(self, session_id: str, **options: Any) -> Session:
        data = self._client.request("GET", f"/sessions/{session_id}", session_id=session_id, **options)
        return Session(self._client, session_id, Snapshot.from_json(data))

    def list(self, *, limit: int = 50, offset: int = 0, **options: Any) -> SessionPage:
        data = self._client.request("GET", "/sessions", params={"limit": limit, "offset": offset}, **options)
        return SessionPage.from_json(data)

    def fork(
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
    ) -> Session:
        """A new session from this one's conversation (now, or at `at_seq`). `model`, or
        `provider_id` + `model_id`, picks its model; `worktree_selector` (default: the
        source's) is stored and returned in the snapshot's `placement`, uninterpreted."""
        body = fork_body(title, reasoning_effort, model, at_seq, provider_id, model_id, worktree_selector)
        path = f"/sessions/{session_id}/fork"
        data = self._client.request("POST", path, json=body, session_id=session_id, **options)
        return Session(self._client, data["id"], Snapshot.from_json(data))


@checked_calls
class Session:
    """A handle on one session. At most one run at a time: see `run`."""

    def __init__(self, client: Client, session_id: str, snapshot: Snapshot | None = None) -> None:
        self._client = client
        self.id = session_id
        self.last_snapshot = snapshot
        self._active: Run | None = None

    def __repr__(self) -> str:
        return f"<Session {self.id}>"

    def _request(self, method: str, suffix: str = "", **kwargs: Any) -> Any:
        return self._client.request(method, f"/sessions/{self.id}{suffix}", session_id=self.id, **kwargs)

    def _snapshot(self, data: Any) -> Snapshot:
        self.last_snapshot = Snapshot.from_json(data)
        return self.last_snapshot

    def snapshot(self, **options: Any) -> Snapshot:
        return self._snapshot(self._request("GET", **options))

    def transcript(self, view: str = "model", **options: Any) -> Transcript:
        """What the model sees (view="model": from the newest compaction, its summary
        first) or everything people saw (view="history")."""
        return Transcript.from_json(self._request("GET", "/transcript", params={"view": view}, **options))

    def rename(self, title: str, **options: Any) -> Snapshot:
        return self._snapshot(self._request("POST", "/rename", json={"title": title}, **options))

    def set_mode(self, mode: SessionMode | str, **options: Any) -> Snapshot:
        return self._snapshot(self._request("POST", "/mode", json={"mode": str(mode)}, **options))

    def set_model(self, model: str, *, reasoning_effort: str | None = None, **options: Any) -> Snapshot:
        body: dict[str, Any] = {"model": model}
        if reasoning_effort is not None:
            body["reasoning_effort"] = reasoning_effort
        return self._snapshot(self._request("POST", "/model", json=body, **options))

    def compact(self, **options: Any) -> bool:
        return bool(self._request("POST", "/compact", **options)["compacted"])

    def clear(self, *, worktree_selector: str | dict[str, Any] | None = None, **options: Any) -> Session:
        """A new empty session with this one's mode, model, limits and worktree selector
        (or `worktree_selector`, stored and returned in `placement`, uninterpreted)."""
        body = {"worktree_selector": worktree_selector} if worktree_selector is not None else None
        data = self._request("POST", "/clear", json=body, **options)
        return Session(self._client, data["id"], Snapshot.from_json(data))

    def fork(
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
    ) -> Session:
        return self._client.sessions.fork(
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

    def close(self, **options: Any) -> Snapshot:
        return self._snapshot(self._request("POST", "/close", **options))

    def delete(self, **options: Any) -> None:
        self._request("DELETE", **options)

    def rate(
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
        return Rating.from_json(self._request("POST", "/ratings", json=body, **options))

    def ratings(self, **options: Any) -> Ratings:
        """Reviewers' ratings of the session and its messages, with the team's scores."""
        return Ratings.from_json(self._request("GET", "/ratings", **options))

    def run(
        self,
        content: str | list[dict[str, Any]],
        *,
        on_permission_ask: Responder | None = None,
        timeout: float | None = None,
        headers: dict[str, str] | None = None,
        cancel: Cancellation | None = None,
        queue: bool = False,
        stream: bool = False,
        deadline: float | None = None,
        controls: RequestControls | None = None,
    ) -> Run:
        """Start a run with a user message (a string, or parts: text_part, image_part_from_path...).

        Parts are checked before anything is sent (count, source, type by their bytes,
        size, and the snapshot's media capabilities): PromptValidationError.
        SessionBusyError while this handle's previous run (or any run of the session) is
        still active, unless `queue`: the message then waits for its turn. `deadline`
        (seconds) bounds starting the run and consuming it: DeadlineExceededError.
        With `stream`, the POST's answer is the run's event stream itself (one request
        fewer before the first event); consume the Run then (iterate it or `result()`):
        until it is, the stream holds a connection.
        """
        flat = control_options({"controls": controls, "timeout": timeout, "headers": headers, "cancel": cancel})
        timeout, headers, cancel = flat.get("timeout"), flat.get("headers"), flat.get("cancel")
        limit = Deadline.of(deadline if deadline is not None else flat.get("deadline"))
        body = run_body(content, queue)
        if isinstance(content, list):
            if self.last_snapshot is None:
                self.snapshot(timeout=timeout, headers=headers, cancel=cancel, deadline=limit)
            check_parts(content, self.last_snapshot.media if self.last_snapshot is not None else None)
        if not queue and self._active is not None and not self._active.finished:
            active = self._active.id
            status = self._client.runs.get(active, timeout=timeout, headers=headers, deadline=limit).status
            if status in ACTIVE_RUN_STATUSES:
                raise SessionBusyError(f"run {active} of this session is still {status}", code="session_busy")
        run_id, opened = self._client._post_run(
            f"/sessions/{self.id}/runs", body, stream=stream, timeout=timeout, headers=headers, cancel=cancel,
            limit=limit, session_id=self.id,
        )  # fmt: skip
        run = Run(
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

    def events(
        self,
        *,
        after: int | None = None,
        timeout: float | None = None,
        headers: dict[str, str] | None = None,
        cancel: Cancellation | None = None,
        controls: RequestControls | None = None,
    ) -> Iterator[RunEvent]:
        """Every run's events of this session as they come (`GET /sessions/{id}/events`):
        from the session's first run, or after seq `after` (a snapshot's `last_seq`: only
        what comes next). It reconnects after a cut, from the last event it saw, and never
        ends by itself: break out of the loop (or cancel)."""
        flat = control_options({"controls": controls, "timeout": timeout, "headers": headers, "cancel": cancel})
        timeout, cancel = flat.get("timeout"), flat.get("cancel")
        base = session_headers(self.id, flat.get("headers"))
        cursor = SessionCursor(after=after)
        failures = 0
        while True:
            if cancel is not None:
                cancel.check()
            mark = cursor.last_seq
            try:
                path = f"/sessions/{self.id}/events"
                with self._client._event_stream(
                    "", {**base, **cursor.resume_headers()}, timeout, cancel, path=path
                ) as response:  # fmt: skip
                    decoder = SSEDecoder()
                    for chunk in response.iter_bytes():
                        for sse in decoder.feed(chunk):
                            event = run_event_from_sse(sse)
                            if cursor.accept(event):
                                yield event
                raise _StreamCut("the session's stream ended")  # a restart's `retry:`: go on
            except StreamUnavailable as exc:  # a 503 before the stream: a cut, after Retry-After
                failures = 1 if cursor.last_seq != mark else failures + 1
                pause(stream_unavailable_wait(exc, failures, self._client.max_reconnects), cancel)
            except (httpx.HTTPError, httpx.StreamError, _StreamCut) as exc:
                if cancel is not None and cancel.cancelled:
                    raise RequestCancelled("the call was cancelled") from None
                failures = 1 if cursor.last_seq != mark else failures + 1
                if failures > self._client.max_reconnects:
                    raise TransportError(f"the event stream of {self.id} failed {failures} times: {exc}") from exc
                time.sleep(backoff(failures))

    def retry(
        self,
        *,
        on_permission_ask: Responder | None = None,
        timeout: float | None = None,
        headers: dict[str, str] | None = None,
        cancel: Cancellation | None = None,
        deadline: float | None = None,
        controls: RequestControls | None = None,
    ) -> Run:
        """Retry the failed step (only after a retryable failure; else InvalidStateError)."""
        flat = control_options({"controls": controls, "timeout": timeout, "headers": headers, "cancel": cancel})
        timeout, headers, cancel = flat.get("timeout"), flat.get("headers"), flat.get("cancel")
        limit = Deadline.of(deadline if deadline is not None else flat.get("deadline"))
        data = self._request("POST", "/retry", timeout=timeout, headers=headers, cancel=cancel, deadline=limit)
        run = Run(
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
class Runs:
    def __init__(self, client: Client) -> None:
        self._client = client

    def get(self, run_id: str, **options: Any) -> RunInfo:
        return RunInfo.from_json(self._client.request("GET", f"/runs/{run_id}", **options))

    def attach(
        self,
        run_id: str,
        *,
        on_permission_ask: Responder | None = None,
        session_id: str | None = None,
        **options: Any,
    ) -> Run:
        """A Run handle on an existing run (to stream or await it from another process);
        `session_id`, when known, adds the affinity header."""
        flat = control_options(options)
        return Run(
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
class Asks:
    def __init__(self, client: Client) -> None:
        self._client = client

    def list(
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
        return AskPage.from_json(self._client.request("GET", "/asks", params=params, **options))

    def decide(
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
        data = self._client.request(
            "POST",
            f"/asks/{ask_id}",
            json=decide_body(verdict_value(verdict), note, scope, arguments, result),
            **options,
        )
        run = Run(self._client, data["run_id"]) if data.get("run_id") else None
        ask = AskInfo.from_json(data["ask"]) if isinstance(data.get("ask"), dict) else None
        return Decision(run, ask)

    def resolve(
        self,
        ask_id: str,
        verdict: str,
        *,
        note: str | None = None,
        arguments: dict[str, Any] | None = None,
        result: str | None = None,
        **options: Any,
    ) -> Run:
        """Decide an ask; returns the resumed session's run. AskAlreadyResolvedError if decided."""
        decision = self.decide(ask_id, verdict, note=note, arguments=arguments, result=result, **options)
        if decision.run is None:
            raise InvalidStateError("the vote was recorded; the ask needs more approvals", code="quorum_pending")
        return decision.run


@checked_calls
class Teams:
    """A team's approval rules and MCP servers (read by its members, changed by its
    moderators) and its webhooks (its moderators only; a secret is write-only)."""

    def __init__(self, client: Client) -> None:
        self._client = client

    def rules(self, name: str, **options: Any) -> list[ApprovalRule]:
        return rules_from_json(self._client.request("GET", f"/teams/{name}/rules", **options))

    def create_rule(
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
        return ApprovalRule.from_json(self._client.request("POST", f"/teams/{name}/rules", json=body, **options))

    def update_rule(
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
        return ApprovalRule.from_json(self._client.request("PUT", path, json=body, **options))

    def delete_rule(self, name: str, rule_id: str, **options: Any) -> None:
        self._client.request("DELETE", f"/teams/{name}/rules/{rule_id}", **options)

    def webhooks(self, name: str, **options: Any) -> list[Webhook]:
        return webhooks_from_json(self._client.request("GET", f"/teams/{name}/webhooks", **options))

    def add_webhook(
        self, name: str, url: str, *, kind: str | None = None, secret: str | None = None, **options: Any
    ) -> Webhook:
        """Add a webhook: `kind` "json" (the default) or "slack"; `secret` signs the JSON
        deliveries (a random one when left out) and is never returned."""
        body = webhook_body(url, kind, secret)
        return Webhook.from_json(self._client.request("POST", f"/teams/{name}/webhooks", json=body, **options))

    def delete_webhook(self, name: str, webhook_id: int, **options: Any) -> None:
        self._client.request("DELETE", f"/teams/{name}/webhooks/{webhook_id}", **options)

    # ---- MCP servers (docs/mcp.md) ----

    def mcp_servers(self, name: str, **options: Any) -> list[McpServerInfo]:
        """The team's MCP servers (headers by name only)."""
        return mcp_servers_from_json(self._client.request("GET", f"/teams/{name}/mcp-servers", **options))

    def mcp_server(self, name: str, server: str, **options: Any) -> McpServerInfo:
        path = f"/teams/{name}/mcp-servers/{server}"
        return McpServerInfo.from_json(self._client.request("GET", path, **options))

    def add_mcp_server(
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
        return McpServerInfo.from_json(self._client.request("POST", path, json=body, **options))

    def update_mcp_server(
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
        return McpServerInfo.from_json(self._client.request("PUT", path, json=body, **options))

    def refresh_mcp_server(self, name: str, server: str, **options: Any) -> McpServerInfo:
        path = f"/teams/{name}/mcp-servers/{server}/refresh"
        return McpServerInfo.from_json(self._client.request("POST", path, **options))

    def delete_mcp_server(self, name: str, server: str, **options: Any) -> None:
        """Delete the team's server, or disable an installation server for the team."""
        self._client.request("DELETE", f"/teams/{name}/mcp-servers/{server}", **options)


@checked_calls
class Scores:
    """A team's scores: read by anyone with a role in it, defined by its moderators."""

    def __init__(self, client: Client) -> None:
        self._client = client

    def list(self, team: str, **options: Any) -> builtins.list[ScoreDefinition]:
        return scores_from_json(self._client.request("GET", f"/teams/{team}/scores", **options))

    def create(
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
        return ScoreDefinition.from_json(self._client.request("POST", path, json=body, **options))

    def update(
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
        return ScoreDefinition.from_json(self._client.request("PUT", path, json=body, **options))

    def delete(self, team: str, name: str, **options: Any) -> None:
        """Delete a score; ratings keep the values given with it."""
        self._client.request("DELETE", f"/teams/{team}/scores/{name}", **options)


@dataclass(frozen=True)
class Decision:
    """What deciding an ask did: the resumed run (None while a quorum is short) and the ask now."""

    run: Run | None
    ask: AskInfo | None


@checked_calls
class Run:
    """One run, consumed once: iterate its events, or call `result()` (not both).

    The stream reconnects by itself after a cut (from the last event it saw), and a run
    that stops on a permission ask answered through it (`on_permission_ask` returning a
    verdict, or `resolve_ask` while iterating) goes on with the resumed run.
    """

    def __init__(
        self,
        client: Client,
        run_id: str,
        *,
        on_permission_ask: Responder | None = None,
        timeout: float | None = None,
        headers: dict[str, str] | None = None,
        cancel: Cancellation | None = None,
        deadline: Deadline | None = None,
        session_id: str | None = None,
        opened: httpx.Response | None = None,
    ) -> None:
        self._client = client
        #: the run's event stream a POST opened (Session.run(stream=True)), read first
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
        return f"<Run {self.id}{' finished' if self.finished else ''}>"

    @property
    def id(self) -> str:
        """The server run followed now (a resumed run after an approval has its own id)."""
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

    def __iter__(self) -> Iterator[RunEvent]:
        self._consume("iteration")
        return self._events()

    def result(self) -> RunResult:
        """Wait for the end; the RunResult (stop reason, text, usage, error)."""
        if self._follower.result is not None and self._consumed == "result":
            return self._follower.result
        if self._consumed != "result":  # after a TransportError, calling again resumes
            self._consume("result")
        for _ in self._events():
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

    # ---- controls ----

    def cancel(self, **options: Any) -> RunInfo:
        return RunInfo.from_json(self._client.request("POST", f"/runs/{self.id}/cancel", **self._options(options)))

    def steer(self, text: str, **options: Any) -> RunInfo:
        data = self._client.request("POST", f"/runs/{self.id}/steer", json={"text": text}, **self._options(options))
        return RunInfo.from_json(data)

    def status(self, **options: Any) -> RunInfo:
        return self._client.runs.get(self.id, **self._options(options))

    def resolve_ask(
        self,
        ask_id: str,
        verdict: str,
        *,
        note: str | None = None,
        arguments: dict[str, Any] | None = None,
        result: str | None = None,
        **options: Any,
    ) -> Run:
        """Decide an ask of this run. While this Run is consumed, it follows the resumed
        run itself; the returned handle is for a Run whose consumption already ended."""
        resumed = self._client.asks.resolve(
            ask_id, verdict, note=note, arguments=arguments, result=result, **self._options(options)
        )
        pending = self._follower.pending_ask
        if not self.finished and (pending is None or pending.ask_id == ask_id):
            self._follower.resumed(resumed.id)
        return resumed

    def _options(self, options: dict[str, Any]) -> dict[str, Any]:
        return {"timeout": self._timeout, "headers": self._headers, **options}

    # ---- the stream ----

    def _events(self) -> Generator[RunEvent, None, None]:
        failures = 0
        limit = self._deadline
        while not self._follower.finished:
            if self._cancel is not None:
                self._cancel.check()
            limit.check(f"run {self.id}")
            mark = (self._follower.run_id, self._follower.last_seq)
            try:
                yield from self._follow_stream()
            except StreamUnavailable as exc:  # a 503 before the stream: a cut, after Retry-After
                failures = 1 if (self._follower.run_id, self._follower.last_seq) != mark else failures + 1
                pause(stream_unavailable_wait(exc, failures, self._client.max_reconnects, limit), self._cancel)
            except (httpx.HTTPError, httpx.StreamError, _StreamCut) as exc:
                if self._cancel is not None and self._cancel.cancelled:
                    raise RequestCancelled("the call was cancelled") from None
                if limit.expired:
                    raise limit.error(f"run {self.id}") from exc
                # Attempts in a row without a new event count towards the limit.
                failures = 1 if (self._follower.run_id, self._follower.last_seq) != mark else failures + 1
                if failures > self._client.max_reconnects:
                    raise TransportError(f"the event stream of {self.id} failed {failures} times: {exc}") from exc
                left = limit.remaining()
                time.sleep(backoff(failures) if left is None else min(backoff(failures), left))

    def _follow_stream(self) -> Generator[RunEvent, None, None]:
        """Stream one connection's events until the current server run is over."""
        follower = self._follower
        headers = {**self._headers, **follower.resume_headers()}
        limit = self._deadline
        opened, self._opened = self._opened, None
        with self._client._event_stream(
            follower.run_id, headers, self._timeout, self._cancel, limit, opened=opened
        ) as response:  # fmt: skip
            decoder = SSEDecoder()
            for chunk in response.iter_bytes():
                limit.check(f"run {self.id}")
                for sse in decoder.feed(chunk):
                    step = follower.accept(run_event_from_sse(sse))
                    if step.deliver is not None:
                        yield step.deliver
                    if not step.done:
                        continue
                    if step.ask is not None and step.held is not None:
                        self._answer(step.ask)
                        if follower.after_ask():
                            return  # on to the resumed run
                        yield follower.finish_awaiting(step.held)
                    return
        raise _StreamCut("the stream ended before the run's result")

    def _answer(self, ask: PermissionAsk) -> None:
        if self._follower.next_run_id is not None or self._responder is None:
            return
        verdict = self._responder(ask)
        if verdict is not None and self._follower.next_run_id is None:
            answer, answer_options = answer_of(verdict)
            self.resolve_ask(ask.ask_id, answer, **answer_options)


@checked_calls
class Agents:
    """Agents and their versions (docs/agents.md): every team member sees them, a team's
    moderators create and save them; every save is a new version."""

    def __init__(self, client: Client) -> None:
        self._client = client

    def list(self, team: str | None = None, **options: Any) -> builtins.list[Agent]:
        """The agents the caller may use, or one team's."""
        path = f"/teams/{team}/agents" if team is not None else "/agents"
        return agents_from_json(self._client.request("GET", path, **options))

    def get(self, agent_id: str, **options: Any) -> Agent:
        """An agent by id (or `team/slug`) with its latest version."""
        team, _, slug = agent_id.rpartition("/")
        path = f"/teams/{team}/agents/{slug}" if team else f"/agents/{agent_id}"
        return Agent.from_json(self._client.request("GET", path, **options))

    def create(
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
        return Agent.from_json(self._client.request("POST", f"/teams/{team}/agents", json=body, **options))

    def update(
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
        return AgentVersion.from_json(self._client.request("PUT", f"/agents/{agent_id}", json=body, **options))

    def versions(self, agent_id: str, **options: Any) -> builtins.list[AgentVersion]:
        """Every version of an agent, newest first."""
        return versions_from_json(self._client.request("GET", f"/agents/{agent_id}/versions", **options))

    def version(self, agent_id: str, number: int, **options: Any) -> AgentVersion:
        return AgentVersion.from_json(self._client.request("GET", f"/agents/{agent_id}/versions/{number}", **options))


@checked_calls
class Experiments:
    """Experiments (docs/experiments.md): a team's sessions replayed on candidate agent
    versions, created by its moderators, read and judged by its reviewers; their pairs
    can go to a review queue for blind A/B verdicts."""

    def __init__(self, client: Client) -> None:
        self._client = client

    def list(self, team: str, **options: Any) -> builtins.list[Experiment]:
        """The team's experiments, newest first."""
        return experiments_from_json(self._client.request("GET", f"/teams/{team}/experiments", **options))

    def get(self, experiment_id: str, **options: Any) -> Experiment:
        """An experiment with its replays' progress and the summary per candidate."""
        return Experiment.from_json(self._client.request("GET", f"/experiments/{experiment_id}", **options))

    def create(
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
        return Experiment.from_json(self._client.request("POST", path, json=body, **options))

    def judge(
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
        return PairVerdict.from_json(self._client.request("POST", path, json=body, **options))

    def send_to_queue(
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
        return QueuedPairs.from_json(self._client.request("POST", path, json=body, **options))
