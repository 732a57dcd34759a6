"""The journal protocol and its in-memory implementation.

A journal stores each session's envelopes. `append` is the only write: it takes a batch
of new events for one session and stores all or none of them, with gapless seqs. The
Django app implements the same protocol on the database (sessions_app.journal).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from sectr.errors import LeaseLost, NotFound
from sectr.events import Envelope, EventType, utcnow
from sectr.state import SessionState, apply_envelope


@dataclass(frozen=True, slots=True)
class NewEvent:
    """An event to append; the journal assigns seq and created_at.

    `text` (a MESSAGE_END's only, never journaled): the text its message's deltas hold,
    as the writer that journaled all of them knows it (InvocationWriter), so a journal
    that indexes replies need not read them back; None when unknown."""

    type: EventType
    payload: dict[str, Any]
    invocation_id: str | None = None
    text: str | None = field(default=None, compare=False, repr=False)


@runtime_checkable
class Journal(Protocol):
    async def append(self, session_id: str, events: Sequence[NewEvent], *, fence: Any = None) -> list[Envelope]:
        """Append `events` atomically (all or none) with the next gapless seqs.

        `fence` is the writer's lease (opaque to the core). A journal that leases runs
        raises LeaseLost when the fence no longer holds, and writes nothing.
        """
        ...

    async def load(self, session_id: str, after_seq: int = 0) -> list[Envelope]:
        """Every envelope with seq > after_seq, in seq order."""
        ...

    async def load_since_compaction(self, session_id: str) -> list[Envelope]:
        """The envelopes from the newest TRANSCRIPT_COMPACTED (included) to the end.

        With no compaction, the whole journal. This is what an invocation folds, so its
        start cost does not grow with the history before the compaction.
        """
        ...

    async def state(self, session_id: str) -> SessionState:
        """The session's projection (sectr.state), equal to folding every envelope."""
        ...


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


@dataclass
class _MemorySession:
    envelopes: list[Envelope] = field(default_factory=list)
    compaction_index: int = 0  # index into envelopes of the newest TRANSCRIPT_COMPACTED
    state: SessionState | None = None
    fence: Any = None


class MemoryJournal:
    """An in-memory journal for tests, embedding and LocalRuntime.

    Appends are atomic because they run without an await between check and write. A
    session's fence, when set with `set_fence`, must match the writer's fence.
    """

    def __init__(self) -> None:
        self._sessions: dict[str, _MemorySession] = {}
        self._listeners: list[asyncio.Queue[Envelope]] = []

    def create(self, session_id: str | None = None) -> str:
        session_id = session_id or new_id("ses")
        self._sessions.setdefault(session_id, _MemorySession())
        return session_id

    def sessions(self) -> list[str]:
        return list(self._sessions)

    def _get(self, session_id: str) -> _MemorySession:
        try:
            return self._sessions[session_id]
        except KeyError:
            raise NotFound(f"no session {session_id}") from None

    def set_fence(self, session_id: str, fence: Any) -> None:
        self._get(session_id).fence = fence

    def subscribe(self) -> asyncio.Queue[Envelope]:
        """A queue that receives every envelope appended from now on (live tail)."""
        queue: asyncio.Queue[Envelope] = asyncio.Queue()
        self._listeners.append(queue)
        return queue

    def append_now(self, session_id: str, events: Sequence[NewEvent], *, fence: Any = None) -> list[Envelope]:
        session = self._get(session_id)
        if session.fence is not None and fence is not None and fence != session.fence:
            raise LeaseLost(f"session {session_id}: fence {fence!r} no longer holds")
        if not events:
            return []
        # Build every envelope and the new projection before storing any: all or none.
        seq = len(session.envelopes)
        now = utcnow()
        built = []
        for event in events:
            seq += 1
            built.append(Envelope(session_id, seq, event.invocation_id, EventType(event.type), event.payload, now))
        state = session.state or SessionState(session_id=session_id)
        if any(envelope.type is not EventType.MESSAGE_DELTA for envelope in built):
            # A malformed payload may fail half-way through the projection: work on a copy.
            # (Deltas only move last_seq/updated_at, which cannot fail: no copy needed.)
            state = state.copy()
        for envelope in built:
            state = apply_envelope(state, envelope)
        for envelope in built:
            if envelope.type is EventType.TRANSCRIPT_COMPACTED:
                session.compaction_index = envelope.seq - 1
        session.envelopes.extend(built)
        session.state = state
        for queue in self._listeners:
            for envelope in built:
                queue.put_nowait(envelope)
        return built

    async def append(self, session_id: str, events: Sequence[NewEvent], *, fence: Any = None) -> list[Envelope]:
        return self.append_now(session_id, events, fence=fence)

    def read(self, session_id: str, after_seq: int = 0) -> list[Envelope]:
        return list(self._get(session_id).envelopes[after_seq:])

    async def load(self, session_id: str, after_seq: int = 0) -> list[Envelope]:
        return self.read(session_id, after_seq)

    async def load_since_compaction(self, session_id: str) -> list[Envelope]:
        session = self._get(session_id)
        return list(session.envelopes[session.compaction_index :])

    async def state(self, session_id: str) -> SessionState:
        """A copy of the projection: callers may keep or change it freely."""
        session = self._get(session_id)
        return session.state.copy() if session.state else SessionState(session_id=session_id)
