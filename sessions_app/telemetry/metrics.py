"""The process's Prometheus counters and gauges (docs/operations.md), counted where things
happen. `/metrics` serves them with the gauges computed from the database at scrape time
(sessions_app.ops.scrape); docs/operations.md lists every metric.

This module imports nothing of Sectr's Django app, so the lowest layers (the journal,
the run state machine, the publisher) can count without an import circle.

Counters on hot paths are counted per append batch, not per envelope (an `inc` is a
lock and an add; in multiprocess mode a write to a memory-mapped file).

Several processes: set PROMETHEUS_MULTIPROC_DIR (an empty directory, shared by every
Sectr process of one machine, wiped before they start) and each process writes its
values there; `/metrics` of any of them then adds up the whole machine. Without it, each
process serves its own values (workers: `sectr_worker --metrics-port`).
"""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import Counter, Gauge, Histogram

from sectr.events import Envelope, EventType

ENVELOPES = Counter("sectr_journal_envelopes", "Envelopes appended to session journals (committed).")
DELTAS = Counter("sectr_journal_deltas", "MESSAGE_DELTA envelopes appended (committed): streamed chunks, coalesced.")
PUBLISH_DROPS = Counter(
    "sectr_publish_drops",
    "Channel-layer sends that failed or timed out (readers catch up from the journal).",
    ["group_kind"],
)
LEASE_EXPIRIES = Counter(
    "sectr_run_lease_expiries",
    "Runs found running with an expired lease (their worker stopped answering), by what was done.",
    ["outcome"],
)
RECOVERIES = Counter("sectr_run_recoveries", "Recover invocations started for runs whose worker died.")
LEASES_LOST = Counter("sectr_worker_leases_lost", "Runs a worker stopped because another worker took their lease over.")
APPROVAL_DECISION_SECONDS = Histogram(
    "sectr_approval_decision_seconds",
    "Time from an approval ask to its decision.",
    buckets=(1, 5, 15, 60, 300, 900, 3600, 4 * 3600, 24 * 3600, 7 * 24 * 3600, float("inf")),
)
WEBSOCKET_CLIENTS = Gauge(
    "sectr_websocket_clients", "Open websockets, by consumer.", ["consumer"], multiprocess_mode="livesum"
)
SSE_CLIENTS = Gauge("sectr_sse_clients", "Open SSE run-event streams.", multiprocess_mode="livesum")
MCP_CALLS = Counter(
    "sectr_mcp_calls",
    "MCP tool calls a worker made, by server (team/name, or an installation server's name).",
    ["server"],
)
MCP_ERRORS = Counter(
    "sectr_mcp_errors",
    "MCP tool calls that became error results (isError, protocol error, timeout, server down), by server.",
    ["server"],
)
MCP_CALL_SECONDS = Histogram(
    "sectr_mcp_call_seconds",
    "Time of an MCP tool call, from the worker's request to the server's answer, by server.",
    ["server"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, float("inf")),
)


def appended_numbers(envelopes: Sequence[Envelope]) -> tuple[int, int]:
    """(envelopes, deltas) of an append batch: what an on-commit count keeps, rather than
    the batch itself (an import appends batch after batch in one transaction)."""
    return len(envelopes), sum(1 for envelope in envelopes if envelope.type is EventType.MESSAGE_DELTA)


def count_appended_numbers(envelopes: int, deltas: int) -> None:
    if envelopes:
        ENVELOPES.inc(envelopes)
    if deltas:
        DELTAS.inc(deltas)


def group_kind(group: str) -> str:
    """A bounded label for a channel-layer group (never a session id: one series per session
    would grow without end)."""
    for prefix, kind in (("sectr.session.", "session"), ("sectr.run.", "run_control")):
        if group.startswith(prefix):
            return kind
    return {"sectr.moderation": "moderation", "sectr.workers": "workers"}.get(group, "other")
