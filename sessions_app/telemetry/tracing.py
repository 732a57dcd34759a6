"""OpenTelemetry for the Django processes (docs/operations.md).

`configure_tracing()` (called once per process from the app's `ready()`) installs a
tracer provider that exports through OTLP over HTTP when OTEL_EXPORTER_OTLP_ENDPOINT is
set (the exporter reads the OTEL_EXPORTER_OTLP_* variables itself: endpoint, headers,
timeout). Without it nothing is installed and the core's spans (sectr.telemetry) cost
only the no-op API calls.

`observe_decisions_on_commit` (called by the journal's append) writes what an approval
decision shows an operator: the `approval` span from the ask to the decision, and the
time to decision (histogram).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, transaction

from sectr import telemetry
from sectr.events import Envelope
from sectr.state import SessionState
from sessions_app.telemetry.metrics import APPROVAL_DECISION_SECONDS

log = logging.getLogger("sectr.ops")
_configured = False


def traces_endpoint() -> str:
    """Where spans go: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT as is, or OTEL_EXPORTER_OTLP_ENDPOINT
    plus /v1/traces (as the OTLP exporter reads them); empty: tracing is off."""
    if settings.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT:
        return str(settings.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT)
    if settings.OTEL_EXPORTER_OTLP_ENDPOINT:
        return str(settings.OTEL_EXPORTER_OTLP_ENDPOINT).rstrip("/") + "/v1/traces"
    return ""


def tracer_provider_from_settings() -> Any:
    """A TracerProvider exporting in batches through OTLP/HTTP, or None when no endpoint is set."""
    endpoint = traces_endpoint()
    if not endpoint:
        return None
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    # Resource.create also reads OTEL_RESOURCE_ATTRIBUTES; the service name given here wins.
    resource = Resource.create({"service.name": settings.OTEL_SERVICE_NAME or "sectr"})
    provider = TracerProvider(resource=resource)
    # The exporter reads the other OTEL_EXPORTER_OTLP_* variables (headers, timeout) itself.
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    return provider


def configure_tracing() -> bool:
    """Install the OTLP tracer provider once per process; True if tracing is on."""
    global _configured
    if _configured:
        return True
    provider = tracer_provider_from_settings()
    if provider is None:
        return False
    from opentelemetry import trace

    trace.set_tracer_provider(provider)
    _configured = True
    log.info("OpenTelemetry traces export to %s", traces_endpoint())
    return True


def observe_decisions_on_commit(
    state: SessionState, envelopes: Sequence[Envelope], *, using: str = DEFAULT_DB_ALIAS
) -> None:
    """The asks this append decides (by a person, a quorum's last vote, the expiry sweep):
    once it commits, their `approval` spans and time-to-decision observations."""
    decisions = telemetry.decisions_in(state.asks, envelopes)
    if not decisions:
        return

    def observe() -> None:
        for decision in decisions:
            APPROVAL_DECISION_SECONDS.observe(decision.wait_seconds)
            telemetry.record_approval(decision)

    # robust: a failing observation is logged and never fails the append that committed.
    transaction.on_commit(observe, using=using, robust=True)
