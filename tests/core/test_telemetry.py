"""Traces and log context of the core, without Django (docs/operations.md): the GenAI span
names and attributes of an invocation that asks and is resumed by a decision, and JSON
log lines carrying the ids of the code that logged them."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from typing import Any

from opentelemetry.trace import StatusCode

from sectr import LocalRuntime, SessionContext, telemetry
from sectr.events import EventType
from sectr.providers import DemoProvider
from tests.tracing import recorded_spans, spans_named


def attrs(span: Any) -> dict[str, Any]:
    return dict(span.attributes or {})


async def test_an_ask_and_its_decision_are_traced_with_the_genai_conventions() -> None:
    exporter = recorded_spans()
    rt = LocalRuntime(provider=DemoProvider(delay=0))
    sid = await rt.create_session()
    asked = await rt.send(sid, "note: hello world")
    assert asked.type is EventType.INVOCATION_SUSPENDED
    ask_id = (await rt.state(sid)).pending_ask["ask_id"]
    await asyncio.sleep(0.05)  # the approval span measures the wait
    done = await rt.decide(sid, ask_id, "allow_once", approver="bob")
    assert done.type is EventType.INVOCATION_COMPLETED
    spans = exporter.get_finished_spans()

    invocations = spans_named(spans, "invoke_agent")
    assert [s.name for s in invocations] == ["invoke_agent", "invoke_agent"]
    first, second = invocations
    assert attrs(first)["gen_ai.operation.name"] == "invoke_agent"
    assert attrs(first)["gen_ai.conversation.id"] == sid
    assert attrs(first)["sectr.invocation.end"] == "INVOCATION_SUSPENDED"
    assert attrs(second)["sectr.invocation.end"] == "INVOCATION_COMPLETED"
    assert attrs(second)["sectr.stop_reason"] == "end_turn"
    assert first.status.status_code is not StatusCode.ERROR, "an ask is not an error"

    chats = spans_named(spans, "chat")
    assert chats and all(s.name == "chat demo" for s in chats)
    for chat in chats:
        a = attrs(chat)
        assert a["gen_ai.operation.name"] == "chat"
        assert a["gen_ai.provider.name"] == "demo" and a["gen_ai.request.model"] == "demo"
        assert a["gen_ai.conversation.id"] == sid
        assert a["gen_ai.usage.input_tokens"] > 0 and a["gen_ai.usage.output_tokens"] > 0
        assert chat.parent is not None and chat.parent.span_id in {s.context.span_id for s in invocations}
    # "note: hello world" is three input words; the demo model's first step calls write_note
    assert attrs(chats[0])["gen_ai.usage.input_tokens"] == 3
    assert attrs(chats[0])["gen_ai.response.finish_reasons"] == ("tool_calls",)

    tools = spans_named(spans, "execute_tool")
    assert [s.name for s in tools] == ["execute_tool write_note", "execute_tool write_note"]
    gated, ran = tools
    assert attrs(gated)["sectr.outcome"] == "ApprovalRequired"
    assert gated.status.status_code is not StatusCode.ERROR
    call_id = (await rt.state(sid)).asks[ask_id]["tool_call_id"]
    assert attrs(ran)["gen_ai.tool.name"] == "write_note" and attrs(ran)["gen_ai.tool.call.id"] == call_id
    assert attrs(ran)["gen_ai.operation.name"] == "execute_tool"
    assert ran.parent is not None and ran.parent.span_id == second.context.span_id

    (approval,) = spans_named(spans, "approval")
    a = attrs(approval)
    assert a["sectr.ask.id"] == ask_id and a["gen_ai.tool.name"] == "write_note"
    assert a["sectr.approval.verdict"] == "allow_once" and a["sectr.approval.approver"] == "bob"
    requested = next(e for e in rt.journal.read(sid) if e.type is EventType.APPROVAL_REQUESTED)
    assert approval.start_time == int(requested.created_at.timestamp() * 1e9)
    assert approval.end_time - approval.start_time >= 50_000_000  # the 50 ms wait
    assert a["gen_ai.conversation.id"] == sid


async def test_an_mcp_tools_span_names_its_server() -> None:
    from sectr.agents import AgentSpec
    from sectr.tools import SchemaTool

    exporter = recorded_spans()

    async def echo(arguments: dict[str, Any], context: Any = None) -> str:
        return str(arguments.get("text"))

    tool = SchemaTool(echo, name="srv__echo", description="echo", parameters={"type": "object"}, idempotent=True)
    tool.mcp_server = "srv"
    rt = LocalRuntime(tools=[tool], provider=DemoProvider(delay=0), agent=AgentSpec(tools=("srv__*", "get_time")))
    sid = await rt.create_session()
    await rt.send(sid, '!tool srv__echo {"text": "hi"}')
    await rt.send(sid, "!tool get_time {}")
    mcp_span, plain = spans_named(exporter.get_finished_spans(), "execute_tool")
    assert attrs(mcp_span)["sectr.mcp.server"] == "srv" and attrs(mcp_span)["gen_ai.tool.name"] == "srv__echo"
    assert "sectr.mcp.server" not in attrs(plain)


async def test_a_failed_tool_and_a_failed_invocation_are_marked_as_errors() -> None:
    exporter = recorded_spans()

    async def handler(ctx: SessionContext) -> None:
        await ctx.execute_tool("calculator", {"expression": "1/0"}, "call_1")
        raise RuntimeError("handler broke")

    rt = LocalRuntime(handler=handler, provider=DemoProvider(delay=0))
    sid = await rt.create_session()
    failed = await rt.send(sid, "go")
    assert failed.type is EventType.INVOCATION_FAILED
    spans = exporter.get_finished_spans()
    (tool_span,) = spans_named(spans, "execute_tool")
    assert tool_span.status.status_code is StatusCode.ERROR and attrs(tool_span)["error.type"] == "tool_error"
    (invocation,) = spans_named(spans, "invoke_agent")
    assert invocation.status.status_code is StatusCode.ERROR
    assert attrs(invocation)["error.type"] == "invocation_failed"


class ListHandler(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []
        self.setFormatter(telemetry.JsonLogFormatter())

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


async def test_json_log_lines_carry_the_ids_of_the_invocation_that_logged() -> None:
    seen: dict[str, str] = {}

    async def handler(ctx: SessionContext) -> None:
        seen.update(session_id=ctx.session_id, invocation_id=ctx.invocation_id)
        logging.getLogger("sectr.test").warning("inside %s", "the handler")

        def in_a_thread() -> None:
            logging.getLogger("sectr.test").warning("from a thread")

        await asyncio.to_thread(in_a_thread)

    lines = ListHandler()
    logger = logging.getLogger("sectr.test")
    logger.addHandler(lines)
    try:
        rt = LocalRuntime(handler=handler, provider=DemoProvider(delay=0))
        sid = await rt.create_session()
        with telemetry.bind_log_context(worker="w-1"):
            await rt.send(sid, "go")
        logger.warning("outside")
    finally:
        logger.removeHandler(lines)
    inside, threaded, outside = (json.loads(line) for line in lines.lines)
    assert inside["message"] == "inside the handler" and inside["level"] == "warning"
    assert inside["logger"] == "sectr.test" and inside["time"].endswith("+00:00")
    for line in (inside, threaded):
        assert line["session_id"] == sid and line["invocation_id"] == seen["invocation_id"]
        assert line["worker"] == "w-1"
    assert "session_id" not in outside and "worker" not in outside


def test_a_json_log_line_has_the_exception_and_explicit_ids_win() -> None:
    formatter = telemetry.JsonLogFormatter()
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.LogRecord("sectr.x", logging.ERROR, __file__, 1, "failed: %s", ("it",), sys.exc_info())
    record.run_id = "run_explicit"
    with telemetry.bind_log_context(run_id="run_context", session_id="ses_1"):
        line = json.loads(formatter.format(record))
    assert line["message"] == "failed: it" and line["run_id"] == "run_explicit" and line["session_id"] == "ses_1"
    assert "ValueError: boom" in line["exception"]


def test_without_a_tracer_provider_no_span_is_started(monkeypatch: Any) -> None:
    """No provider installed: the API's proxy would only make non-recording spans, so none
    is started at all (the tracer is not even asked); one installed later is used."""
    from opentelemetry import trace

    asked: list[str] = []
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: trace.ProxyTracerProvider())
    monkeypatch.setattr(trace, "get_tracer", lambda *a, **k: asked.append("tracer"))
    assert telemetry._tracer() is None
    with telemetry.span("invoke_agent", {"gen_ai.conversation.id": "s"}) as handle:
        handle.set("sectr.stop_reason", "end_turn")  # dropped, no error
        assert handle.span is None
    assert asked == []

    recorded_spans()  # the SDK's provider, as a process that exports traces installs one
    monkeypatch.undo()
    assert telemetry._tracer() is not None
