"""Traces and log context of invocations, without Django (docs/operations.md).

**Traces.** OpenTelemetry is optional here: with `opentelemetry-api` installed, the
spans below go to whatever tracer provider the process installed (the Django app sets
an OTLP exporter when OTEL_EXPORTER_OTLP_ENDPOINT is set; tests set the SDK's in-memory
exporter); without a provider the API is a no-op, and without the package at all every
hook here does nothing. Names and attributes follow the GenAI semantic conventions:

* ``invoke_agent`` per invocation (`traced_invocation` on `Runtime.run_invocation`),
* ``chat {model}`` per model step (`traced_model_step` on `SessionContext.complete`),
* ``execute_tool {name}`` per tool call (`traced_tool_call` on `SessionContext.execute_tool`),
* ``approval`` from an ask to its decision (`decisions_in` + `record_approval`, called
  where the decision is journaled: its start time is the ask's, so it is written then).

Every span carries ``gen_ai.conversation.id`` = the session id. An approval ask is
control flow, not an error: a span it ends is not marked failed.

**Log context.** `log_context` is a ContextVar of the ids that apply to the code running
now (session_id, run_id, invocation_id, worker); the runtime and the worker set them
(`bind_log_context`), asyncio copies them into the tasks and threads an invocation
starts, and `JsonLogFormatter` writes them into every record (SECTR_LOG_FORMAT=json).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import json
import logging
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any, TypeVar, cast

from sectr.asks import ask_changes
from sectr.errors import ApprovalDenied, ApprovalRequired, InvocationCancelled
from sectr.events import Envelope

try:  # optional: the core runs without it
    from opentelemetry import trace as _otel_trace
    from opentelemetry.trace import Status, StatusCode
except ImportError:  # pragma: no cover - exercised only where the package is missing
    _otel_trace = None  # type: ignore[assignment]

TRACER_NAME = "sectr"
F = TypeVar("F", bound=Callable[..., Awaitable[Any]])

# ---- log context ----

LOG_CONTEXT_KEYS = ("session_id", "run_id", "invocation_id", "worker")
log_context: contextvars.ContextVar[Mapping[str, str]] = contextvars.ContextVar(
    "sectr_log_context", default=MappingProxyType({})
)


@contextlib.contextmanager
def bind_log_context(**ids: str | None) -> Iterator[None]:
    """Add ids to the log context of the code inside (and the tasks it starts)."""
    merged = {**log_context.get(), **{key: value for key, value in ids.items() if value}}
    token = log_context.set(merged)
    try:
        yield
    finally:
        log_context.reset(token)


def set_log_context(**ids: str | None) -> None:
    """Add ids to the log context of the current task for the rest of its life (a
    worker's loop sets `worker` once)."""
    log_context.set({**log_context.get(), **{key: value for key, value in ids.items() if value}})


class JsonLogFormatter(logging.Formatter):
    """One JSON object a line: time, level, logger, message, the ids of the log context
    that apply, and the exception text when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        line.update(log_context.get())
        for key in LOG_CONTEXT_KEYS:  # an explicit `extra={...}` wins over the context
            value = record.__dict__.get(key)
            if value:
                line[key] = value
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


# ---- traces ----


def _tracer() -> Any:
    # Looked up on every span, not cached at import: the provider may be installed
    # after this module is imported (Django's AppConfig.ready, a test fixture).
    # No provider installed (nor named by OTEL_PYTHON_TRACER_PROVIDER): the API's
    # proxy would only make non-recording spans, and entering one (a ProxyTracer, a
    # NoOpTracer, the context attached and detached) was most of a no-op span's cost,
    # two per run (py-spy --gil, bench/run_lifecycle.py): none at all then.
    if _otel_trace is None or isinstance(_otel_trace.get_tracer_provider(), _otel_trace.ProxyTracerProvider):
        return None
    return _otel_trace.get_tracer(TRACER_NAME)


class _Span:
    """A started span, or nothing (no OpenTelemetry): attributes set on it are kept or dropped."""

    def __init__(self, span: Any = None) -> None:
        self.span = span

    def set(self, name: str, value: Any) -> None:
        if self.span is not None and value is not None:
            self.span.set_attribute(name, value)

    def fail(self, error_type: str, description: str = "") -> None:
        if self.span is not None:
            self.span.set_attribute("error.type", error_type)
            self.span.set_status(Status(StatusCode.ERROR, description or error_type))


@contextlib.contextmanager
def span(name: str, attributes: Mapping[str, Any]) -> Iterator[_Span]:
    """A span named `name` around the code inside, current while it runs (children
    started inside it, in this task or the ones it starts, nest under it)."""
    tracer = _tracer()
    if tracer is None:
        yield _Span()
        return
    clean = {key: value for key, value in attributes.items() if value is not None}
    with tracer.start_as_current_span(
        name, attributes=clean, record_exception=False, set_status_on_exception=False
    ) as current:
        handle = _Span(current)
        try:
            yield handle
        except (ApprovalRequired, ApprovalDenied, InvocationCancelled) as flow:
            handle.set("sectr.outcome", type(flow).__name__)
            raise
        except BaseException as exc:
            current.record_exception(exc)
            handle.fail(type(exc).__name__, str(exc))
            raise


def _usage_attributes(handle: _Span, usage: Mapping[str, Any] | None) -> None:
    if usage:
        handle.set("gen_ai.usage.input_tokens", usage.get("input_tokens"))
        handle.set("gen_ai.usage.output_tokens", usage.get("output_tokens"))


def traced_invocation(method: F) -> F:
    """`invoke_agent` around `Runtime.run_invocation(session_id, invocation_id, ...)`,
    which also binds session_id and invocation_id to the log context."""

    @functools.wraps(method)
    async def wrapper(self: Any, session_id: str, invocation_id: str, *args: Any, **kwargs: Any) -> Any:
        attributes = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": "sectr",
            "gen_ai.conversation.id": session_id,
            "gen_ai.provider.name": getattr(getattr(self, "provider", None), "provider_id", None),
            "sectr.invocation.id": invocation_id,
        }
        ids = bind_log_context(session_id=session_id, invocation_id=invocation_id)
        with ids, span("invoke_agent", attributes) as h:
            terminal = await method(self, session_id, invocation_id, *args, **kwargs)
            kind = getattr(getattr(terminal, "type", None), "value", None)
            payload = getattr(terminal, "payload", None) or {}
            h.set("sectr.invocation.end", kind)
            h.set("sectr.stop_reason", payload.get("stop_reason"))
            _usage_attributes(h, payload.get("usage"))
            if kind == "INVOCATION_FAILED":
                h.fail("invocation_failed", str(payload.get("error") or ""))
            return terminal

    return cast(F, wrapper)


def traced_model_step(method: F) -> F:
    """`chat {model}` around `SessionContext.complete(...)` (one model step, its retries included)."""

    @functools.wraps(method)
    async def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        model = kwargs.get("model") or getattr(self, "model", None) or "unknown"
        attributes = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": getattr(getattr(self, "provider", None), "provider_id", None),
            "gen_ai.request.model": model,
            "gen_ai.conversation.id": getattr(self, "session_id", None),
            "sectr.invocation.id": getattr(self, "invocation_id", None),
        }
        with span(f"chat {model}", attributes) as h:
            turn = await method(self, *args, **kwargs)
            _usage_attributes(h, getattr(turn, "usage", None))
            finish = getattr(turn, "finish_reason", None)
            if finish:
                h.set("gen_ai.response.finish_reasons", [finish])
            return turn

    return cast(F, wrapper)


def traced_tool_call(method: F) -> F:
    """`execute_tool {name}` around `SessionContext.execute_tool(name, arguments, call_id)`."""

    @functools.wraps(method)
    async def wrapper(self: Any, name: str, arguments: Any, call_id: str | None = None, **kwargs: Any) -> Any:
        attributes = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": name,
            "gen_ai.tool.call.id": call_id,
            "gen_ai.conversation.id": getattr(self, "session_id", None),
            "sectr.invocation.id": getattr(self, "invocation_id", None),
        }
        tools = getattr(self, "tools", None)
        server = getattr(tools.get(name), "mcp_server", None) if tools is not None and name in tools else None
        if server is not None:  # an MCP tool: which server ran it (sectr.mcp)
            attributes["sectr.mcp.server"] = server
        with span(f"execute_tool {name}", attributes) as h:
            result = await method(self, name, arguments, call_id, **kwargs)
            if getattr(result, "is_error", False):
                h.fail("tool_error", str(getattr(result, "content", ""))[:200])
            return result

    return cast(F, wrapper)


@dataclass(frozen=True)
class Decision:
    """An approval ask that was decided: what the `approval` span and the time-to-decision
    metric are made of."""

    session_id: str
    ask_id: str
    tool_name: str | None
    asked_at: datetime
    decided_at: datetime
    verdict: str
    approver: str | None

    @property
    def wait_seconds(self) -> float:
        return max((self.decided_at - self.asked_at).total_seconds(), 0.0)


def decisions_in(asks: Mapping[str, Mapping[str, Any]], envelopes: Iterable[Envelope]) -> list[Decision]:
    """The asks that `envelopes` (one append) decide: each INVOCATION_STARTED whose reason
    is an approval decision, whoever took it (a person, the last vote of a quorum, the
    expiry sweep). `asks` is the session's state's asks (they know when each was asked)."""
    found: list[Decision] = []
    for envelope in envelopes:
        for change in ask_changes(envelope):
            if change.kind not in ("decided", "expired") or change.at_once:
                continue  # an ask a rule decided at once waited for nobody
            ask = asks.get(change.ask_id)
            requested = ask.get("requested_at") if ask else None
            if not ask or not isinstance(requested, str):
                continue
            decision = change.decision
            found.append(
                Decision(
                    session_id=envelope.session_id,
                    ask_id=change.ask_id,
                    tool_name=ask.get("name"),
                    asked_at=datetime.fromisoformat(requested),
                    decided_at=envelope.created_at,
                    verdict=str(decision.get("verdict") or ("allow_once" if decision.get("approved") else "deny")),
                    approver=decision.get("approver"),
                )
            )
    return found


def record_approval(decision: Decision) -> None:
    """Write the `approval` span of an ask that was just decided: it starts when the ask
    was journaled and ends at the decision (days later, maybe, in another process)."""
    tracer = _tracer()
    if tracer is None:
        return
    attributes = {
        "gen_ai.conversation.id": decision.session_id,
        "gen_ai.tool.name": decision.tool_name,
        "sectr.ask.id": decision.ask_id,
        "sectr.approval.verdict": decision.verdict,
        "sectr.approval.approver": decision.approver,
        "sectr.approval.wait_seconds": decision.wait_seconds,
    }
    started = tracer.start_span(
        "approval",
        attributes={key: value for key, value in attributes.items() if value is not None},
        start_time=_nanoseconds(decision.asked_at),
    )
    started.end(end_time=max(_nanoseconds(decision.decided_at), _nanoseconds(decision.asked_at)))


def _nanoseconds(moment: datetime) -> int:
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1e9)
