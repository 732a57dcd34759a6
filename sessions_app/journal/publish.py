"""Live publication of journal appends to the channel layer.

The journal is the truth; the channel layer only pushes and wakes. It delivers at most
once and drops messages under load or on a Redis reconnect, so every reader tracks the
seq it has rendered and, on a gap (or after a reconnect), reads the missing envelopes
from the journal (`DatabaseJournal.load(session_id, after_seq=...)`). Publication
failures are logged and swallowed: an append that committed has happened.

Messages are plain JSON (they cross Redis), sent only after the append's transaction
commits:

* group ``session_group(session_id)`` (``"sectr.session.<id>"``), once per append::

      {"type": "journal.envelopes",
       "session_id": "ses_...",
       "envelopes": [Envelope.to_dict(), ...]}   # one append's batch, seq ascending

  Each envelope dict is ``{"session_id", "seq", "invocation_id", "type", "payload",
  "created_at"}`` (sectr.events.Envelope.to_dict; created_at is ISO 8601 UTC;
  rebuild one with ``Envelope.from_dict``). A consumer handles it in a method named
  ``journal_envelopes``.

* group ``MODERATION_GROUP`` (``"sectr.moderation"``): the same message shape, with
  only the envelopes moderators care about: APPROVAL_REQUESTED (an ask is now
  pending), APPROVAL_VOTED (a vote towards a quorum), INVOCATION_STARTED whose reason
  is ``approval_decision`` (an ask was decided) and INVOCATION_CANCELLED naming an
  ``ask_id`` (a paused run was cancelled: its ask is withdrawn). Other envelopes of
  that append are left out; a batch with none of them sends nothing.

* group ``WORKERS_GROUP`` (``"sectr.workers"``): ``{"type": "runs.wake"}`` from
  `wake_workers` / `awake_workers` / `wake_workers_on_commit`, sent when a run was
  queued. It carries no data: a woken worker claims from the Run table.

Entry points: `apublish(envelopes)` (async, publish now: the async journal path calls it
after its transaction committed in the worker thread) and `publish_on_commit(envelopes)`
(sync, inside or outside `transaction.atomic()`: sends when the outermost block commits,
never if it rolls back). The sync path reaches the channel layer through `async_to_sync`;
from a thread started by `sync_to_async` (Django's sync views under ASGI, consumers'
`database_sync_to_async`) that runs on the server's event loop.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
from collections.abc import Sequence
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

from sectr.events import Envelope, EventType
from sessions_app.ops.metrics import PUBLISH_DROPS, group_kind

logger = logging.getLogger("sectr.publish")

SESSION_GROUP_PREFIX = "sectr.session."
MODERATION_GROUP = "sectr.moderation"
WORKERS_GROUP = "sectr.workers"
ENVELOPES_MESSAGE_TYPE = "journal.envelopes"
WAKE_MESSAGE_TYPE = "runs.wake"
#: How long one publication may take before it is abandoned (a stuck Redis must not
#: hold a journal writer).
PUBLISH_TIMEOUT = 2.0

# Channels accepts group names of ASCII letters, digits, "-", "_" and "." under 100 chars.
_GROUP_SAFE = re.compile(r"^[a-zA-Z0-9\-_.]+$")
_GROUP_MAX = 99


def session_group(session_id: str) -> str:
    """The channel-layer group of one session's live journal tail."""
    name = SESSION_GROUP_PREFIX + session_id
    if _GROUP_SAFE.match(session_id) and len(name) <= _GROUP_MAX:
        return name
    # An id channels would reject: use a digest (stable, distinct per id).
    return SESSION_GROUP_PREFIX + "h" + hashlib.sha256(session_id.encode()).hexdigest()[:40]


def is_moderation_envelope(envelope: Envelope) -> bool:
    if envelope.type in (EventType.APPROVAL_REQUESTED, EventType.APPROVAL_VOTED):
        return True
    if envelope.type is EventType.INVOCATION_STARTED:
        reason = envelope.payload.get("reason")
        return isinstance(reason, dict) and reason.get("kind") == "approval_decision"
    # Cancelling a run paused on an ask withdraws the ask (the payload names it).
    return envelope.type is EventType.INVOCATION_CANCELLED and bool(envelope.payload.get("ask_id"))


def envelope_messages(envelopes: Sequence[Envelope]) -> list[tuple[str, dict[str, Any]]]:
    """The (group, message) pairs one append publishes (see the module docstring)."""
    if not envelopes:
        return []
    by_session: dict[str, list[Envelope]] = {}
    for envelope in envelopes:
        by_session.setdefault(envelope.session_id, []).append(envelope)
    messages: list[tuple[str, dict[str, Any]]] = []
    for session_id, batch in by_session.items():
        batch.sort(key=lambda e: e.seq)
        messages.append(
            (
                session_group(session_id),
                {"type": ENVELOPES_MESSAGE_TYPE, "session_id": session_id, "envelopes": [e.to_dict() for e in batch]},
            )
        )
        moderated = [e.to_dict() for e in batch if is_moderation_envelope(e)]
        if moderated:
            messages.append(
                (MODERATION_GROUP, {"type": ENVELOPES_MESSAGE_TYPE, "session_id": session_id, "envelopes": moderated})
            )
    return messages


async def _send(messages: list[tuple[str, dict[str, Any]]]) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    for group, message in messages:
        try:
            await asyncio.wait_for(layer.group_send(group, message), PUBLISH_TIMEOUT)
        except Exception:
            # The journal has it; readers catch up from there.
            PUBLISH_DROPS.labels(group_kind(group)).inc()
            logger.warning("could not publish %s to %s", message.get("type"), group, exc_info=True)


def _send_sync(messages: list[tuple[str, dict[str, Any]]]) -> None:
    try:
        async_to_sync(_send)(messages)
    except Exception:
        logger.warning("could not publish %d message(s)", len(messages), exc_info=True)


async def apublish(envelopes: Sequence[Envelope]) -> None:
    """Publish committed envelopes now. Never raises (failures are logged)."""
    messages = envelope_messages(envelopes)
    if messages:
        await _send(messages)


def publish_on_commit(envelopes: Sequence[Envelope], *, using: str | None = None) -> None:
    """Publish `envelopes` once the current transaction commits (now, outside one)."""
    messages = envelope_messages(envelopes)
    if messages:
        transaction.on_commit(lambda: _send_sync(messages), using=using)


async def awake_workers() -> None:
    """Tell idle workers to look for queued runs. Never raises."""
    await _send([(WORKERS_GROUP, {"type": WAKE_MESSAGE_TYPE})])


def wake_workers() -> None:
    """Sync `awake_workers`, sent now (not tied to a transaction)."""
    _send_sync([(WORKERS_GROUP, {"type": WAKE_MESSAGE_TYPE})])


def wake_workers_on_commit(*, using: str | None = None) -> None:
    """Wake the workers once the current transaction (which queued a run) commits."""
    transaction.on_commit(wake_workers, using=using)


RUN_CONTROL_GROUP_PREFIX = "sectr.run."
RUN_CONTROL_MESSAGE_TYPE = "run.control"


def run_control_group(run_id: str) -> str:
    """The group a worker joins while it executes `run_id` (cancel pokes reach it there)."""
    return RUN_CONTROL_GROUP_PREFIX + run_id


def poke_run_control(run_id: str) -> None:
    """Tell the worker (in any process) that holds `run_id` to re-read its cancel flag.
    Never raises: the worker's poll still sees the flag."""
    _send_sync([(run_control_group(run_id), {"type": RUN_CONTROL_MESSAGE_TYPE, "run_id": run_id})])
