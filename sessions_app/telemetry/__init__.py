"""The process's telemetry: Prometheus metrics (`metrics`) and OpenTelemetry tracing
(`tracing`).

Low in the import graph on purpose: the journal, the Run lifecycle, the worker and the
consumers count and trace from here, so it imports nothing of sessions_app above the
core. The pages that serve what it collects (/metrics, health, readiness) and the
retention sweep live in sessions_app.ops, which sits at the top.
"""
