"""The AskIndex projection: one row per approval ask, written with the envelopes.

DatabaseJournal calls `update_ask_index` inside each append's transaction, after folding
the batch into the session's state, so an ask's row always agrees with its journal:
created by its APPROVAL_REQUESTED (with the deadline its `expires_after_s` sets),
closed by the INVOCATION_STARTED that decides it, by an APPROVAL_REQUESTED that a rule
decided at once, or by the INVOCATION_CANCELLED that withdraws it.
`rebuild_ask_index` recomputes a session's rows from its journal alone.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db import DEFAULT_DB_ALIAS, transaction

from sectr.asks import ask_changes
from sectr.events import Envelope, EventType
from sectr.state import SessionState, project
from sessions_app import models


def _touched_asks(envelopes: list[Envelope], before_pending: str | None) -> tuple[list[Envelope], set[str]]:
    """(the APPROVAL_REQUESTED envelopes, the ids of earlier asks these envelopes close)."""
    requested = [e for e in envelopes if e.type is EventType.APPROVAL_REQUESTED]
    closed = {
        change.ask_id
        for envelope in envelopes
        if envelope.type is not EventType.APPROVAL_REQUESTED  # its row is written whole
        for change in ask_changes(envelope, before_pending)
        if change.closes
    }
    return requested, closed - {str(e.payload.get("ask_id")) for e in requested}


def _row_fields(ask: dict[str, Any], requested_at: datetime | None, decided_at: datetime | None) -> dict[str, Any]:
    expires = ask.get("expires_after_s")
    status = str(ask.get("status") or "pending")
    return {
        "tool": str(ask.get("name") or "")[:100],
        "status": status,
        "requested_at": requested_at,
        "deadline": requested_at + timedelta(seconds=int(expires)) if requested_at and expires else None,
        "approvals_required": int(ask.get("approvals_required") or 1),
        "rule_id": str(ask.get("rule_id") or "")[:64],
        "decided_at": decided_at if status != "pending" else None,
        "decided_by": str(ask.get("approver") or "")[:150] if status != "pending" else "",
        "verdict": str(ask.get("verdict") or "")[:16] if status != "pending" else "",
    }


def update_ask_index(
    session_id: str,
    envelopes: list[Envelope],
    before_pending: str | None,
    state: SessionState,
    *,
    using: str = DEFAULT_DB_ALIAS,
) -> None:
    """Index what `envelopes` (just appended; `state` includes them) did to the asks.

    `before_pending` is the id of the ask pending before this batch (a cancel withdraws it).
    """
    requested, closed = _touched_asks(envelopes, before_pending)
    manager = models.AskIndex.objects.using(using)
    if requested:
        rows = []
        for envelope in requested:
            ask_id = str(envelope.payload["ask_id"])
            ask: dict[str, Any] = state.asks.get(ask_id) or {**envelope.payload, "status": "pending"}
            rows.append(
                models.AskIndex(
                    ask_id=ask_id, session_id=session_id, **_row_fields(ask, envelope.created_at, envelope.created_at)
                )
            )
        manager.bulk_create(rows)
    for ask_id in closed:
        closed_ask = state.asks.get(ask_id)
        if closed_ask is None:
            continue
        decided_at = envelopes[-1].created_at
        manager.filter(pk=ask_id, session_id=session_id).update(
            status=str(closed_ask.get("status") or "pending"),
            decided_at=decided_at,
            decided_by=str(closed_ask.get("approver") or "")[:150],
            verdict=str(closed_ask.get("verdict") or "")[:16],
        )


def rebuild_ask_index(session_id: str, *, using: str = DEFAULT_DB_ALIAS) -> int:
    """Recompute a session's AskIndex rows from its journal alone; returns how many."""
    with transaction.atomic(using=using):
        session = models.Session.objects.using(using).select_for_update().get(pk=session_id)
        envelopes = [row.to_envelope() for row in session.envelopes.order_by("seq")]
        state = project(envelopes, session_id=session_id)
        requested_at = {e.payload["ask_id"]: e.created_at for e in envelopes if e.type is EventType.APPROVAL_REQUESTED}
        decided_at: dict[str, datetime] = {}
        pending: str | None = None
        for envelope in envelopes:
            changes = ask_changes(envelope, pending)
            closed_at_once = {change.ask_id for change in changes if change.at_once}
            for change in changes:
                if change.kind == "requested" and change.ask_id not in closed_at_once:
                    pending = change.ask_id
                elif change.closes:
                    decided_at[change.ask_id] = envelope.created_at
                    if not change.at_once:
                        pending = None
        manager = models.AskIndex.objects.using(using)
        manager.filter(session_id=session_id).delete()
        manager.bulk_create(
            [
                models.AskIndex(
                    ask_id=ask_id,
                    session_id=session_id,
                    **_row_fields(ask, requested_at.get(ask_id), decided_at.get(ask_id)),
                )
                for ask_id, ask in state.asks.items()
            ]
        )
        return len(state.asks)
