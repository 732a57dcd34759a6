"""The OpenTelemetry SDK's in-memory exporter as this test process's tracer provider.

A process has one global tracer provider and it can be set once: every test module
that asserts spans takes them from here.
"""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

EXPORTER = InMemorySpanExporter()
_installed = False


def recorded_spans() -> InMemorySpanExporter:
    """The exporter, emptied: the spans finished from now on."""
    global _installed
    if not _installed:
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(EXPORTER))
        trace.set_tracer_provider(provider)
        _installed = True
    EXPORTER.clear()
    return EXPORTER


def spans_named(spans: tuple[ReadableSpan, ...] | list[ReadableSpan], prefix: str) -> list[ReadableSpan]:
    return [span for span in spans if span.name == prefix or span.name.startswith(prefix + " ")]
