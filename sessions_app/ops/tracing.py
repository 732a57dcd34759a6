"""OpenTelemetry for the Django processes (SPEC section 13).

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
import os
from collections.abc import Sequence
from typing import Any

from django.db import DEFAULT_DB_ALIAS, transaction

from sectr import telemetry
from sectr.events import Envelope
from sectr.state import SessionState
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
