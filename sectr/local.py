"""LocalRuntime: sessions in memory, without Django (SPEC section 5).

    rt = sectr.LocalRuntime(tools=[my_tool])
    sid = await rt.create_session(mode="default")
    outcome = await rt.send(sid, "hello")          # the invocation's terminal envelope
    outcome = await rt.decide(sid, ask_id, "allow_once", approver="bob")
    envelopes = rt.journal.read(sid)
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from sectr import operations, telemetry
from sectr.compaction import compacted_payload
from sectr.control import RunControl
from sectr.errors import NotAtTurnBoundary, SessionBusy, StaleRunControl
from sectr.events import Envelope, EventType
from sectr.journal import MemoryJournal, NewEvent
from sectr.providers import default_model_from_env
from sectr.providers.base import Provider
from sectr.runtime import Handler, Runtime
from sectr.state import SessionState
from sectr.tools import Tool, ToolRegistry


class LocalRuntime:
    def __init__(
        self,
        handler: Handler | None = None,
        tools: Iterable[Tool] | ToolRegistry = (),
        provider: Provider | None = None,
        journal: MemoryJournal | None = None,
    ) -> None:
        self.journal = journal or MemoryJournal()
        self.runtime = Runtime(self.journal, handler=handler, tools=tools, provider=provider)
        self._controls: dict[str, RunControl] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    def _lock(self, session_id: str) -> asyncio.Lock:
        return self._locks.setdefault(session_id, asyncio.Lock())

    async def state(self, session_id: str) -> SessionState:
        return await self.journal.state(session_id)

    async def create_session(
        self,
        *,
        mode: str = "default",
        model: str | None = None,
        title: str | None = None,
        limits: dict[str, int] | None = None,
        reasoning_effort: str | None = None,
    ) -> str:
        events = operations.create_events(
            title=title,
            mode=mode,
            model=model,
            limits=limits,
            reasoning_effort=reasoning_effort,
            default_model=default_model_from_env(),
        )
        session_id = self.journal.create()
        await self.journal.append(session_id, events)
        return session_id

    async def _start_and_run(self, session_id: str, build: Any) -> Envelope:
        # Check and write under the session's lock: two callers cannot both start a run.
        async with self._lock(session_id):
            state = await self.journal.state(session_id)
            invocation_id, events = build(state)
            await self.journal.append(session_id, events)
            control = self._controls[session_id] = RunControl()
        try:
            return await self.runtime.run_invocation(session_id, invocation_id, control=control)
        finally:
            if self._controls.get(session_id) is control:
                del self._controls[session_id]

    async def send(
        self, session_id: str, content: str | list[dict[str, Any]], *, author: str | None = None
    ) -> Envelope:
        """Start a run for a user message and run it to its end."""

        def build(state: SessionState) -> tuple[str, list[NewEvent]]:
            operations.check_can_start(state)
            return operations.message_events(state, content, author=author)

        return await self._start_and_run(session_id, build)

    async def decide(
        self, session_id: str, ask_id: str, verdict: str, *, approver: str | None = None, note: str | None = None
    ) -> Envelope:
        """Record a verdict on the pending ask; the decision resumes the session."""
        asked = await self._asked(session_id, ask_id)

        def build(state: SessionState) -> tuple[str, list[NewEvent]]:
            decided = operations.decision_events(state, ask_id, verdict, approver=approver, note=note)
            if asked is not None:
                telemetry.record_approval(
                    session_id=session_id,
                    ask_id=ask_id,
                    tool_name=asked.payload.get("name"),
                    asked_at=asked.created_at,
                    decided_at=datetime.now(UTC),
                    verdict=verdict,
                    approver=approver,
                )
            return decided

        return await self._start_and_run(session_id, build)

    async def _asked(self, session_id: str, ask_id: str) -> Envelope | None:
        """The APPROVAL_REQUESTED of `ask_id` (for the `approval` span), if it is there."""
        ask = (await self.journal.state(session_id)).asks.get(ask_id)
        if ask is None:
            return None
        found = await self.journal.load(session_id, after_seq=int(ask["seq"]) - 1)
        return found[0] if found and found[0].type is EventType.APPROVAL_REQUESTED else None

    async def retry(self, session_id: str) -> Envelope:
        return await self._start_and_run(session_id, operations.retry_events)

    async def recover(self, session_id: str) -> Envelope:
        """Continue a run whose runner died (its invocation has no terminal event)."""

        def build(state: SessionState) -> tuple[str, list[NewEvent]]:
            if not state.is_active or state.current_invocation_id is None or session_id in self._controls:
                raise StaleRunControl("there is no crashed run to recover")
            return operations.recover_events(state, state.current_invocation_id)

        return await self._start_and_run(session_id, build)

    async def steer(self, session_id: str, text: str, *, author: str | None = None) -> None:
        state = await self.journal.state(session_id)
        operations.check_steer(state, text)
        control = self._controls.get(session_id)
        if control is None:
            raise StaleRunControl("the run has ended; send a new message instead")
        control.steer(text, author)

    async def cancel(self, session_id: str, *, by: str | None = None) -> None:
        control = self._controls.get(session_id)
        if control is not None:
            control.cancel(by)
            return
        async with self._lock(session_id):
            state = await self.journal.state(session_id)
            await self.journal.append(session_id, operations.cancel_awaiting_events(state, by))

    async def set_mode(self, session_id: str, mode: str) -> SessionState:
        async with self._lock(session_id):
            state = await self.journal.state(session_id)
            mode = operations.check_mode_change(state, mode)
            await self.journal.append(session_id, [NewEvent(EventType.SESSION_UPDATED, {"mode": mode})])
        return await self.journal.state(session_id)

    async def rename(self, session_id: str, title: str) -> SessionState:
        title = operations.check_title(title)
        renamed = NewEvent(EventType.SESSION_UPDATED, {"title": title, "title_source": "user"})
        await self.journal.append(session_id, [renamed])
        return await self.journal.state(session_id)

    async def fork(self, session_id: str, *, at_seq: int | None = None, **overrides: Any) -> str:
        state = await self.journal.state(session_id)
        source = self.journal.read(session_id)
        events = operations.fork_events(state, source, at_seq=at_seq, **overrides)
        new_id = self.journal.create()
        await self.journal.append(new_id, events)
        return new_id

    async def clear(self, session_id: str) -> str:
        state = await self.journal.state(session_id)
        new_id = self.journal.create()
        await self.journal.append(new_id, operations.clear_events(state))
        return new_id

    async def compact(self, session_id: str) -> bool:
        """Manual compaction at a turn boundary; True when the history got shorter."""
        async with self._lock(session_id):
            state = await self.journal.state(session_id)
            if not state.at_turn_boundary:
                raise NotAtTurnBoundary("compaction happens only between runs")
            if session_id in self._controls:
                raise SessionBusy("a run is active in this session")
            ctx_messages = await self.runtime.folded_messages(session_id)
            payload = await compacted_payload(self.runtime.provider, state.model, ctx_messages, state.last_seq)
            if payload is None:
                return False
            await self.journal.append(session_id, [NewEvent(EventType.TRANSCRIPT_COMPACTED, payload)])
            return True
