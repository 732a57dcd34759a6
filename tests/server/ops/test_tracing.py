"""Traces and JSON logs of the server (docs/operations.md): a worker's invocations, the
`approval` span of a decision made through the action, the time-to-decision histogram,
log lines with the worker's ids, and the OTLP/HTTP exporter talking to a real (loopback)
collector endpoint.
"""

from __future__ import annotations

import http.server
import json
import logging
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import override_settings
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from prometheus_client import REGISTRY

from sectr import telemetry
from sectr.context import SessionContext
from sectr.events import EventType
from sectr.providers import DemoProvider
from sectr.runtime import Runtime
from sessions_app import actions
from sessions_app.journal import DatabaseJournal
from sessions_app.models import Envelope, Session
from sessions_app.telemetry.tracing import configure_tracing, tracer_provider_from_settings
from tests.server.runs import test_worker as worker_tests
from tests.server.runs.test_worker import db, finished, new_session, post, wait_until
from tests.tracing import recorded_spans, spans_named

start_worker = worker_tests.start_worker  # the fixture: Workers as tasks, stopped after the test


def attrs(span: Any) -> dict[str, Any]:
    return dict(span.attributes or {})


def decisions_observed() -> float:
    return REGISTRY.get_sample_value("sectr_approval_decision_seconds_count") or 0.0


@pytest.mark.django_db(transaction=True)
async def test_a_workers_run_and_a_decision_through_the_action_are_traced(owner: Any, start_worker: Any) -> None:
    exporter = recorded_spans()
    observed = decisions_observed()
    await start_worker()
    session = await new_session(owner)
    run = await post(owner, session, "note: hello world")
    await wait_until(finished(run.pk))
    state = (await db(Session.objects.get, pk=session.pk)).projection()
    ask = state.pending_ask
    assert ask is not None
    resumed = await db(actions.do_decide, owner, ask["ask_id"], "allow_once")
    await wait_until(finished(resumed.pk))

    spans = exporter.get_finished_spans()
    invocations = spans_named(spans, "invoke_agent")
    assert [attrs(s)["sectr.invocation.id"] for s in invocations] == [run.invocation_id, resumed.invocation_id]
    assert all(attrs(s)["gen_ai.conversation.id"] == session.pk for s in invocations)
    chats = spans_named(spans, "chat")
    assert chats and {s.name for s in chats} == {"chat demo"}
    assert all(attrs(s)["gen_ai.usage.output_tokens"] > 0 for s in chats)
    ran = spans_named(spans, "execute_tool")[-1]
    assert ran.name == "execute_tool write_note" and attrs(ran)["gen_ai.tool.call.id"] == ask["tool_call_id"]

    (approval,) = spans_named(spans, "approval")
    requested = await db(
        Envelope.objects.get, session_id=session.pk, type=EventType.APPROVAL_REQUESTED.value, seq=ask["seq"]
    )
    assert approval.start_time == int(requested.created_at.timestamp() * 1e9)
    assert approval.end_time >= approval.start_time
    assert attrs(approval)["sectr.ask.id"] == ask["ask_id"]
    assert attrs(approval)["sectr.approval.approver"] == "owner"
    assert decisions_observed() - observed == 1


@pytest.mark.django_db(transaction=True)
async def test_a_refused_decision_records_no_approval(owner: Any, start_worker: Any) -> None:
    exporter = recorded_spans()
    await start_worker()
    session = await new_session(owner)
    run = await post(owner, session, "hello")
    await wait_until(finished(run.pk))
    with pytest.raises(Exception):  # noqa: B017 - whatever refusal: nothing may be recorded
        await db(actions.do_decide, owner, "ask_" + "0" * 32, "allow_once")
    assert spans_named(exporter.get_finished_spans(), "approval") == []


class JsonLines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(telemetry.JsonLogFormatter())
        self.lines: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(json.loads(self.format(record)))


@pytest.mark.django_db(transaction=True)
async def test_json_logs_of_a_run_carry_session_run_invocation_and_worker(owner: Any, start_worker: Any) -> None:
    async def handler(ctx: SessionContext) -> None:
        logging.getLogger("sectr.test").warning("working on it")

    lines = JsonLines()
    logging.getLogger("sectr.test").addHandler(lines)
    try:
        runtime = Runtime(DatabaseJournal(), handler=handler, provider=DemoProvider(delay=0))
        worker = await start_worker(runtime=runtime)
        session = await new_session(owner)
        run = await post(owner, session, "hello")
        await wait_until(finished(run.pk))
    finally:
        logging.getLogger("sectr.test").removeHandler(lines)
    (line,) = [line for line in lines.lines if line["message"] == "working on it"]
    assert line["session_id"] == session.pk and line["run_id"] == run.pk
    assert line["invocation_id"] == run.invocation_id and line["worker"] == worker.worker_id


class Collector(http.server.BaseHTTPRequestHandler):
    received: list[tuple[str, str, bytes]] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.received.append((self.path, self.headers["Content-Type"], body))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def collector() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Collector)
    Collector.received = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@override_settings(OTEL_EXPORTER_OTLP_ENDPOINT="", OTEL_EXPORTER_OTLP_TRACES_ENDPOINT="")
def test_without_an_endpoint_nothing_is_installed() -> None:
    assert tracer_provider_from_settings() is None
    assert configure_tracing() is False


def test_the_otlp_exporter_sends_spans_to_the_configured_endpoint(collector: str) -> None:
    with override_settings(OTEL_EXPORTER_OTLP_ENDPOINT=collector, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=""):
        provider = tracer_provider_from_settings()
    try:
        tracer = provider.get_tracer("sectr")
        with tracer.start_as_current_span("invoke_agent", attributes={"gen_ai.conversation.id": "ses_x"}):
            tracer.start_span("chat demo", attributes={"gen_ai.request.model": "demo"}).end()
        assert provider.force_flush(10_000)
    finally:
        provider.shutdown()
    ((path, content_type, body),) = Collector.received
    assert path == "/v1/traces" and content_type == "application/x-protobuf"
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    (resource_spans,) = request.resource_spans
    service = {a.key: a.value.string_value for a in resource_spans.resource.attributes}["service.name"]
    assert service == "sectr"
    names = sorted(span.name for scope in resource_spans.scope_spans for span in scope.spans)
    assert names == ["chat demo", "invoke_agent"]
