"""The SDK's IO-free core, shared by `Client` and `AsyncClient`: request building, answer
decoding, the SSE decoder, and `RunFollower`, the bookkeeping of one client-side Run.

Resuming a stream exactly: an SSE frame's ``id`` is the seq of the envelope it came
from, and one envelope may give more than one event (a delta with both reasoning and
text). After a cut the follower therefore reconnects with ``Last-Event-ID = last_seq - 1``
and skips the events of ``last_seq`` it already delivered, so a cut between two events
of one envelope loses nothing and repeats nothing.
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx

from sectr.client.errors import (
    DeadlineExceededError,
    ProtocolError,
    RedirectError,
    RequestCancelled,
    SectrError,
    error_from_response,
)
from sectr.client.models import PermissionAsk, RunEvent, RunResult

DEFAULT_BASE_URL = "http://127.0.0.1:8000"
API_PREFIX = "/api/v1"
DEFAULT_TIMEOUT = 30.0
#: The server sends a comment every 15 s; a stream silent for this long is reconnected.
STREAM_READ_TIMEOUT = 45.0
MAX_RECONNECTS = 8
RECONNECT_BACKOFF = 0.25  # seconds, doubled per attempt in a row, capped at 5 s
#: A POST that asked for its run's stream and was answered 503 `unavailable` (live
#: updates, or the database, away for a moment) posted nothing: it is sent again after
#: the answer's Retry-After, up to this many times more, each wait at most
#: UNAVAILABLE_WAIT_CAP seconds, then the 503 is raised.
STREAM_POST_RETRIES = 3
UNAVAILABLE_WAIT_CAP = 10.0


#: Sent with every request about a known session, so a load balancer can keep a
#: session's calls on one server.
AFFINITY_HEADER = "X-Sectr-Session"
#: The run a POST answered with its event stream started (`Accept: text/event-stream`).
RUN_ID_HEADER = "X-Sectr-Run-Id"


# ---- request controls ----


@dataclass(frozen=True)
class RequestControls:
    """How one call is made, apart from what it asks for (``controls=RequestControls(...)``,
    or the same names as keywords: ``timeout=``, ``deadline=``, ``headers=``, ``cancel=``).

    `timeout` is httpx's limit per phase (connect, each read...); `deadline` is the total
    time in seconds for the call, and for a run, for starting and consuming it
    (DeadlineExceededError when it passes); `headers` are added to the request;
    `cancel` is a Cancellation that stops the call from another thread or task.
    """

    timeout: float | None = None
    deadline: float | None = None
    headers: Mapping[str, str] | None = None
    cancel: Cancellation | None = None


#: The keyword arguments every SDK call takes besides its own (its request controls).
CONTROL_NAMES = ("timeout", "deadline", "headers", "cancel", "controls")

F = TypeVar("F", bound=Callable[..., Any])
C = TypeVar("C", bound=type)


def _check_keywords(method: F) -> F:
    signature = inspect.signature(method)
    own = {
        name
        for name, param in signature.parameters.items()
        if param.kind not in (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL)
    }
    known = own | set(CONTROL_NAMES)

    @functools.wraps(method)
    def checked(*args: Any, **kwargs: Any) -> Any:
        for name in kwargs:
            if name not in known:
                raise TypeError(
                    f"{method.__qualname__}() got an unexpected keyword argument {name!r} "
                    f"(its options: {', '.join(sorted(own - {'self'})) or 'none'}; "
                    f"request controls: {', '.join(CONTROL_NAMES)})"
                )
        return method(*args, **kwargs)

    return checked  # type: ignore[return-value]


def checked_calls(cls: C) -> C:
    """Make every public method of `cls` that forwards ``**options`` refuse a keyword
    that is neither its own nor a request control, naming the method: a typo in
    ``session.run("hi", on_permision_ask=...)`` says ``Session.run()``, not the
    transport's ``Client.request()``."""
    for name, value in list(vars(cls).items()):
        if name.startswith("_") or not inspect.isfunction(value):
            continue
        params = inspect.signature(value).parameters.values()
        if any(param.kind is inspect.Parameter.VAR_KEYWORD for param in params):
            setattr(cls, name, _check_keywords(value))
    return cls


def control_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """The flat request controls of a call, with ``controls=`` spread out (a keyword
    given as well wins over the RequestControls field)."""
    flat = {key: value for key, value in options.items() if key != "controls"}
    controls = options.get("controls")
    if controls is None:
        return flat
    if not isinstance(controls, RequestControls):
        raise TypeError(f"controls must be a RequestControls, not {type(controls).__name__}")
    for key in ("timeout", "deadline", "headers", "cancel"):
        value = getattr(controls, key)
        if value is not None and flat.get(key) is None:
            flat[key] = dict(value) if key == "headers" else value
    return flat


class Deadline:
    """A point in time a call must finish by (None: no deadline)."""

    def __init__(self, seconds: float | None) -> None:
        if seconds is not None and (isinstance(seconds, bool) or not seconds > 0):
            raise ValueError("deadline is a number of seconds above zero")
        self.seconds = seconds
        self.end = time.monotonic() + seconds if seconds is not None else None

    @classmethod
    def of(cls, value: float | Deadline | None) -> Deadline:
        return value if isinstance(value, Deadline) else cls(value)

    def remaining(self) -> float | None:
        return None if self.end is None else max(self.end - time.monotonic(), 0.0)

    @property
    def expired(self) -> bool:
        return self.end is not None and time.monotonic() >= self.end

    def error(self, what: str) -> DeadlineExceededError:
        return DeadlineExceededError(f"{what}: the deadline of {self.seconds:g} s passed")

    def check(self, what: str) -> None:
        if self.expired:
            raise self.error(what)

    def cap(self, timeout: httpx.Timeout) -> httpx.Timeout:
        """`timeout` with no phase longer than the time left (a little slack so the
        deadline, not a phase, reports it)."""
        left = self.remaining()
        if left is None:
            return timeout

        def capped(value: float | None) -> float:
            return min(value, left + 0.05) if value is not None else left + 0.05

        return httpx.Timeout(
            connect=capped(timeout.connect),
            read=capped(timeout.read),
            write=capped(timeout.write),
            pool=capped(timeout.pool),
        )


def session_headers(session_id: str | None, headers: Mapping[str, str] | None) -> dict[str, str]:
    """`headers` plus the affinity header when the session is known."""
    out = dict(headers or {})
    if session_id:
        out.setdefault(AFFINITY_HEADER, session_id)
    return out


def base_url_from_env(base_url: str | None) -> str:
    return (base_url or os.environ.get("SECTR_URL") or DEFAULT_BASE_URL).rstrip("/")


def token_from_env(token: str | None) -> str | None:
    return token or os.environ.get("SECTR_TOKEN") or None


def client_headers(token: str | None, headers: dict[str, str] | None) -> dict[str, str]:
    out = {"Accept": "application/json", "User-Agent": "sectr-client"}
    if token:
        out["Authorization"] = f"Bearer {token}"
    out.update(headers or {})
    return out


def timeout_for(timeout: float | httpx.Timeout | None, default: float | httpx.Timeout) -> httpx.Timeout:
    value = default if timeout is None else timeout
    return value if isinstance(value, httpx.Timeout) else httpx.Timeout(value)


def stream_timeout(timeout: float | None) -> httpx.Timeout:
    """Connect within `timeout` (default 30 s); a silent stream counts as cut after 45 s."""
    return httpx.Timeout(timeout or DEFAULT_TIMEOUT, read=max(STREAM_READ_TIMEOUT, timeout or 0))


def redirect_error(response: httpx.Response) -> RedirectError:
    location = response.headers.get("location")
    target = str(response.url.join(location)) if location else None
    where = f"to {target}" if target else "without saying where"
    to_https = bool(target) and str(target).startswith("https://") and response.url.scheme == "http"
    hint = " (use an https:// base_url)" if to_https else ""
    return RedirectError(
        f"the server answered {response.status_code}, a redirect {where}: point base_url at the API itself{hint}",
        location=target,
        status=response.status_code,
    )


def decode_answer(response: httpx.Response) -> Any:
    """The JSON of a 2xx answer (None for 204 only); the typed error for anything else:
    RedirectError for a 3xx, ProtocolError for a 2xx whose body is not JSON."""
    status = response.status_code
    if status >= 400:
        raise error_from_response(status, response.content, response.headers)
    if 300 <= status < 400:
        raise redirect_error(response)
    if status == 204:
        return None
    if not 200 <= status < 300:
        raise ProtocolError(f"the server answered {status}, which the API never sends", status=status)
    content_type = response.headers.get("content-type", "")
    if "json" not in content_type.lower():
        shown = content_type or "no content type"
        raise ProtocolError(f"the server answered {status} with {shown}, not JSON", status=status)
    try:
        return response.json()
    except ValueError:
        raise ProtocolError(f"the server answered {status} with a body that is not JSON", status=status) from None


class StreamUnavailable(Exception):  # noqa: N818 - internal signal
    """An event stream's GET was answered 503 `unavailable` (the database, or live
    updates, away for a moment): a cut to reconnect from after `wait` seconds (the
    answer's Retry-After), or, when the stream gives up, `error` (that 503) to raise."""

    def __init__(self, error: SectrError, wait: float) -> None:
        super().__init__(str(error))
        self.error = error
        self.wait = wait


def check_stream_answer(response: httpx.Response) -> None:
    """Raise the typed error of an event-stream request's answer that is not a stream
    (read its body first): an error, a redirect, or a 2xx of another content type; a
    503 `unavailable` as StreamUnavailable, which the stream's loop treats as a cut."""
    if response.status_code >= 300:
        wait = unavailable_retry_after(response)
        try:
            decode_answer(response)
        except SectrError as error:
            if wait is None:
                raise
            raise StreamUnavailable(error, wait) from None
    content_type = response.headers.get("content-type", "")
    raise ProtocolError(
        f"the server answered {response.status_code} with {content_type or 'no content type'}, not text/event-stream",
        status=response.status_code,
    )


def is_event_stream(response: httpx.Response) -> bool:
    ok = 200 <= response.status_code < 300
    return ok and response.headers.get("content-type", "").lower().startswith("text/event-stream")


def backoff(attempt: int) -> float:
    return float(min(RECONNECT_BACKOFF * 2 ** max(attempt - 1, 0), 5.0))


def retry_after_seconds(value: str | None) -> float:
    """A Retry-After header's seconds, between 0 and UNAVAILABLE_WAIT_CAP (1 when it is
    missing or not a number: the API sends seconds, never a date)."""
    try:
        seconds = float(value) if value is not None else 1.0
    except ValueError:
        seconds = 1.0
    if not 0.0 <= seconds < float("inf"):  # also NaN
        seconds = 1.0
    return min(seconds, UNAVAILABLE_WAIT_CAP)


def unavailable_retry_after(response: httpx.Response) -> float | None:
    """The seconds a (read) 503 `unavailable` answer asks to wait before asking again
    (its Retry-After, capped), or None for any other answer."""
    if response.status_code != 503:
        return None
    try:
        code = response.json()["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return None
    if code != "unavailable":
        return None
    return retry_after_seconds(response.headers.get("retry-after"))


def unavailable_wait(response: httpx.Response, retries: int, limit: Deadline) -> float | None:
    """The seconds to wait before sending a streamed POST again after its (read) answer
    `response`, or None to raise its error instead: only a 503 `unavailable` is retried,
    at most STREAM_POST_RETRIES times, and not when the wait would outlast the deadline."""
    wait = unavailable_retry_after(response) if retries < STREAM_POST_RETRIES else None
    left = limit.remaining()
    return None if wait is None or (left is not None and wait >= left) else wait


def stream_unavailable_wait(
    exc: StreamUnavailable, failures: int, max_reconnects: int, limit: Deadline | None = None
) -> float:
    """The seconds to wait before reconnecting an event stream whose GET was answered
    503 `unavailable` (`exc`), this being the `failures`-th attempt in a row without a
    new event: its Retry-After (capped). The 503 itself is raised once more than
    `max_reconnects` attempts in a row failed, or when the wait would outlast `limit`."""
    left = limit.remaining() if limit is not None else None
    if failures > max_reconnects or (left is not None and exc.wait >= left):
        raise exc.error from None
    return exc.wait


def pause(seconds: float, cancel: Cancellation | None) -> None:
    """Sleep `seconds`, ending early with RequestCancelled when `cancel` is cancelled."""
    if cancel is None:
        time.sleep(seconds)
        return
    woken = threading.Event()
    remove = cancel.on_cancel(woken.set)
    try:
        woken.wait(seconds)
    finally:
        remove()
    cancel.check()


# ---- cancellation ----


class Cancellation:
    """Cancels the SDK calls it is passed to (`cancel=`), from any thread.

    Cancelling stops the *client's* waiting: an open request or stream is closed and the
    call raises RequestCancelled. It does not cancel a run on the server; `run.cancel()`
    does that.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cancelled = False
        self._callbacks: list[Callable[[], object]] = []

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def cancel(self) -> None:
        with self._lock:
            self._cancelled = True
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            try:
                callback()
            except Exception:  # noqa: S110 - closing an already closed stream
                pass

    def on_cancel(self, callback: Callable[[], object]) -> Callable[[], None]:
        """Register `callback` (called at once if already cancelled); returns an unregister."""
        with self._lock:
            if not self._cancelled:
                self._callbacks.append(callback)

                def remove() -> None:
                    with self._lock:
                        if callback in self._callbacks:
                            self._callbacks.remove(callback)

                return remove
        callback()
        return lambda: None

    def check(self) -> None:
        if self._cancelled:
            raise RequestCancelled("the call was cancelled")


# ---- Server-Sent Events ----


@dataclass
class ServerSentEvent:
    event: str
    data: str
    id: str | None


class SSEDecoder:
    """An incremental text/event-stream parser (the WHATWG rules the API needs)."""

    def __init__(self) -> None:
        self._buffer = b""
        self._event = ""
        self._data: list[str] = []
        self._id: str | None = None

    def feed(self, chunk: bytes) -> list[ServerSentEvent]:
        self._buffer += chunk
        events: list[ServerSentEvent] = []
        while b"\n" in self._buffer:
            raw, self._buffer = self._buffer.split(b"\n", 1)
            line = raw.rstrip(b"\r").decode("utf-8", errors="replace")
            event = self._line(line)
            if event is not None:
                events.append(event)
        return events

    def _line(self, line: str) -> ServerSentEvent | None:
        if not line:
            if not self._data and not self._event:
                return None
            event = ServerSentEvent(self._event or "message", "\n".join(self._data), self._id)
            self._event, self._data = "", []
            return event
        if line.startswith(":"):
            return None  # a comment (the server's heartbeat)
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        elif name == "id" and "\0" not in value:
            self._id = value
        return None


def run_event_from_sse(sse: ServerSentEvent) -> RunEvent:
    try:
        data = json.loads(sse.data)
    except ValueError:
        raise ProtocolError(f"an SSE event's data is not JSON: {sse.data[:80]!r}") from None
    event = RunEvent.from_json(data)
    if event.kind != sse.event:
        raise ProtocolError(f"an SSE event named {sse.event!r} carries a {event.kind!r} event")
    return event


# ---- one Run, across reconnects and approvals ----


@dataclass
class Step:
    """What the IO loop does with one received event."""

    deliver: RunEvent | None = None  # hand this to the user
    ask: PermissionAsk | None = None  # the run ended on this ask: maybe ask the responder
    held: RunEvent | None = None  # the result to deliver if nobody answers the ask
    done: bool = False  # the stream of the current server run is over


@dataclass
class RunFollower:
    """The client side of one Run (see the module docstring).

    `run_id` is the server run being streamed now. When that run ends on a permission
    ask that somebody answered through this Run (`resumed(new_run_id)`, from
    `resolve_ask` or an `on_permission_ask` responder), the follower moves on to the
    resumed run instead of ending: the same Run follows it.
    """

    run_id: str
    run_ids: list[str] = field(default_factory=list)
    last_seq: int | None = None
    delivered_at_last_seq: int = 0  # events of last_seq handed out so far
    skip: int = 0  # events of last_seq to drop after a reconnect
    pending_ask: PermissionAsk | None = None
    next_run_id: str | None = None  # the run resuming the ask, once decided
    usage: dict[str, int] = field(default_factory=dict)
    result: RunResult | None = None

    def __post_init__(self) -> None:
        if not self.run_ids:
            self.run_ids = [self.run_id]

    @property
    def finished(self) -> bool:
        return self.result is not None

    def resume_headers(self) -> dict[str, str]:
        """Headers of the next stream request: Last-Event-ID when resuming."""
        if self.last_seq is None:
            return {}
        self.skip = self.delivered_at_last_seq
        return {"Last-Event-ID": str(max(self.last_seq - 1, 0))}

    def resumed(self, new_run_id: str) -> None:
        self.next_run_id = new_run_id

    def accept(self, event: RunEvent) -> Step:
        if event.run_id != self.run_id:
            raise ProtocolError(f"an event of run {event.run_id} in the stream of {self.run_id}")
        if event.seq is not None:
            if self.last_seq is not None and event.seq < self.last_seq:
                return Step()  # replayed before the resume point: seen already
            if event.seq == self.last_seq:
                if self.skip > 0:
                    self.skip -= 1
                    return Step()
                self.delivered_at_last_seq += 1
            else:
                self.last_seq, self.delivered_at_last_seq, self.skip = event.seq, 1, 0
        if event.kind == "permission.ask":
            self.pending_ask = PermissionAsk.from_payload(event.payload, self.run_id)
        if event.kind != "result":
            return Step(deliver=event)
        payload = event.payload
        for key, value in (payload.get("usage") or {}).items():
            if isinstance(value, int):
                self.usage[key] = self.usage.get(key, 0) + value
        if payload.get("stop") == "awaiting_approval" and self.pending_ask is not None:
            return Step(ask=self.pending_ask, held=event, done=True)
        self._finish(event)
        return Step(deliver=event, done=True)

    def after_ask(self) -> bool:
        """Called when the current run ended on an ask: True to follow the resumed run."""
        if self.next_run_id is None:
            return False
        self.run_id = self.next_run_id
        self.run_ids.append(self.run_id)
        self.next_run_id = None
        self.pending_ask = None
        self.last_seq, self.delivered_at_last_seq, self.skip = None, 0, 0
        return True

    def finish_awaiting(self, event: RunEvent) -> RunEvent:
        """The run ends on its ask (nobody answered through this Run): deliver the result."""
        self._finish(event)
        return event

    def _finish(self, event: RunEvent) -> None:
        payload = event.payload
        try:
            self.result = RunResult(
                run_id=self.run_id,
                text=str(payload.get("text") or ""),
                stop_reason=str(payload["stop"]),
                usage=dict(self.usage),
                error=payload.get("error"),
                ask=self.pending_ask if payload.get("stop") == "awaiting_approval" else None,
                run_ids=tuple(self.run_ids),
            )
        except KeyError:
            raise ProtocolError("a result event without a stop reason") from None


def run_stream_request(
    http: httpx.Client | httpx.AsyncClient,
    path: str,
    body: dict[str, Any],
    *,
    headers: Mapping[str, str] | None,
    session_id: str,
    timeout: float | None,
    limit: Deadline,
) -> httpx.Request:
    """The POST of a run (at `path`, under the API) that asks for the run's event stream
    as its answer (`Accept: text/event-stream`), with the stream's timeouts capped by
    `limit`; `posted_run_stream` reads which run its answer is."""
    return http.build_request(
        "POST",
        API_PREFIX + path,
        json=body,
        headers={**session_headers(session_id, headers), "Accept": "text/event-stream"},
        timeout=limit.cap(stream_timeout(timeout)),
    )


def posted_run_stream(response: httpx.Response) -> str | None:
    """The run id of a POST's answer that is the run's event stream (None: not a stream);
    ProtocolError for a stream that does not say which run it is."""
    if not is_event_stream(response):
        return None
    run_id = response.headers.get(RUN_ID_HEADER)
    if not run_id:
        raise ProtocolError(f"an event stream answered the POST without its {RUN_ID_HEADER} header")
    return run_id


@dataclass
class SessionCursor:
    """Where a session's event stream (`GET /sessions/{id}/events`) resumes after a cut,
    by RunFollower's rule: one envelope may carry several events, so the stream resumes
    from the seq before the last one seen and drops the events of that seq it delivered."""

    after: int | None = None  # the caller's start: events after this seq
    last_seq: int | None = None
    delivered_at_last_seq: int = 0
    skip: int = 0

    def resume_headers(self) -> dict[str, str]:
        if self.last_seq is None:
            return {} if self.after is None else {"Last-Event-ID": str(self.after)}
        self.skip = self.delivered_at_last_seq
        return {"Last-Event-ID": str(max(self.last_seq - 1, 0))}

    def accept(self, event: RunEvent) -> bool:
        """Whether to deliver `event` (False: seen before the resume point)."""
        if event.seq is None:
            return True
        if self.after is not None and event.seq <= self.after:
            return False
        if self.last_seq is not None and event.seq < self.last_seq:
            return False
        if event.seq == self.last_seq:
            if self.skip > 0:
                self.skip -= 1
                return False
            self.delivered_at_last_seq += 1
        else:
            self.last_seq, self.delivered_at_last_seq, self.skip = event.seq, 1, 0
        return True


def verdict_value(verdict: Any) -> str:
    return str(getattr(verdict, "value", verdict))


def answer_of(answer: Any) -> tuple[str, dict[str, Any]]:
    """What a responder returned, as a verdict and its options: an `Edit` (allow_once
    with `arguments`), a `Respond` (respond with `result`) or a verdict."""
    from sectr.client.models import Edit, Respond

    if isinstance(answer, Edit):
        return "allow_once", {"arguments": answer.arguments}
    if isinstance(answer, Respond):
        return "respond", {"result": answer.result}
    return verdict_value(answer), {}


def transport_error(exc: Exception, what: str) -> SectrError:
    from sectr.client.errors import TransportError

    return TransportError(f"{what}: {type(exc).__name__}: {exc}")
