"""OpenTelemetry for the Django processes (SPEC section 13).

`configure_tracing()` (called once per process from the app's `ready()`) installs a
tracer provider that exports through OTLP over HTTP when OTEL_EXPORTER_OTLP_ENDPOINT is
set (the exporter reads the OTEL_EXPORTER_OTLP_* variables itself: endpoint, headers,
timeout). Without it nothing is installed and the core's spans (sectr.telemetry) cost
only the no-op API calls.

`observe_decision_on_commit` writes what an approval decision shows an operator: the
`approval` span from the ask to the decision, and the time to decision (histogram).
"""

from __future__ import annotations

import logging
import os
from typing import Any

from django.db import transaction
from django.utils import timezone

from sectr import telemetry
from sectr.events import EventType
from sessions_app.models import Envelope
from sessions_app.ops.metrics import APPROVAL_DECISION_SECONDS

log = logging.getLogger("sectr.ops")
_configured = False


def tracer_provider_from_env(environ: dict[str, str] | None = None) -> Any:
    """A TracerProvider exporting in batches through OTLP/HTTP, or None when
    OTEL_EXPORTER_OTLP_ENDPOINT (or ..._TRACES_ENDPOINT) is not set."""
    env = os.environ if environ is None else environ
    if not (env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")):
        return None
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    # Resource.create also reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES.
    resource = Resource.create({} if env.get("OTEL_SERVICE_NAME") else {"service.name": "sectr"})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    return provider


def configure_tracing() -> bool:
    """Install the OTLP tracer provider once per process; True if tracing is on."""
    global _configured
    if _configured:
        return True
    provider = tracer_provider_from_env()
    if provider is None:
        return False
    from opentelemetry import trace

    trace.set_tracer_provider(provider)
    _configured = True
    log.info("OpenTelemetry traces export to %s", os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", ""))
    return True


def observe_decision_on_commit(session_id: str, ask: dict[str, Any] | None, verdict: str, approver: str | None) -> None:
    """Once the decision commits: the `approval` span and the time-to-decision histogram."""
    if not ask or not isinstance(ask.get("seq"), int):
        return
    seq: int = ask["seq"]
    decided_at = timezone.now()

    def observe() -> None:
        asked_at = (
            Envelope.objects.filter(session_id=session_id, seq=seq, type=EventType.APPROVAL_REQUESTED.value)
            .values_list("created_at", flat=True)
            .first()
        )
        if asked_at is None:
            return
        APPROVAL_DECISION_SECONDS.observe(max((decided_at - asked_at).total_seconds(), 0.0))
        telemetry.record_approval(
            session_id=session_id,
            ask_id=str(ask.get("ask_id")),
            tool_name=ask.get("name"),
            asked_at=asked_at,
            decided_at=decided_at,
            verdict=verdict,
            approver=approver,
        )

    # robust: a failing observation is logged and never fails the decision that committed.
    transaction.on_commit(observe, robust=True)
