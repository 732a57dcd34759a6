"""LocalRuntime: sessions in memory, without Django (docs/sessions.md).

rt = sectr.LocalRuntime(tools=[my_tool])
sid = await rt.create_session(mode="default")
outcome = await rt.send(sid, "hello")          # the invocation's terminal envelope
outcome = await rt.decide(sid, ask_id, "allow_once", approver="bob")
envelopes = rt.journal.read(sid)
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from sectr import operations, telemetry
from sectr.agents import AgentSpec
from sectr.compaction import compacted_payload
from sectr.control import RunControl
from sectr.errors import AskNotPending, NotAtTurnBoundary, SessionBusy, StaleRunControl
from sectr.events import Envelope, EventType, utcnow
from sectr.journal import MemoryJournal, NewEvent
from sectr.providers import default_model_from_env
from sectr.providers.base import Provider
from sectr.replay import DIVERGED, recorded_turns
from sectr.rules import Policy, Rule
from sectr.runtime import BudgetSource, Handler, Runtime, ToolSource
from sectr.state import SessionState
from sectr.tools import Tool, ToolRegistry


class LocalRuntime:
    def __init__(
        self,
        handler: Handler | None = None,
        tools: Iterable[Tool] | ToolRegistry = (),
        provider: Provider | None = None,
        journal: MemoryJournal | None = None,
        rules: Policy | Iterable[Rule | Mapping[str, Any]] | None = None,
        agent: AgentSpec | None = None,
        handlers: Mapping[str, Handler] | None = None,
        budget: BudgetSource | None = None,
        extra_tools: ToolSource | None = None,
    ) -> None:
        self.journal = journal or MemoryJournal()
        #: The agent every session of this runtime runs with (its instructions, model,
        #: tools, mode and limits); None: the built-in default agent.
        self.agent = agent
        self.runtime = Runtime(
            self.journal,
            handler=handler,
            tools=tools,
            provider=provider,
            rules=rules,
            agent=agent,
            handlers=handlers,
            budget=budget,
            extra_tools=extra_tools,
        )
        self._controls: dict[str, RunControl] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    def _lock(self, session_id: str) -> asyncio.Lock:
        return self._locks.setdefault(session_id, asyncio.Lock())

    async def state(self, session_id: str) -> SessionState:
        return await self.journal.state(session_id)

    async def create_session(
        self,
        *,
        mode: str | None = None,
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
            agent=self.agent,
        )
        session_id = self.journal.create()
        await self.journal.append(session_id, events)
        return session_id

    async def replay(
        self, source_id: str, *, live_reads: bool = False, model: str | None = None, title: str | None = None
    ) -> str:
        """Replay a session's user turns on this runtime's agent (sectr.replay): a new
        session that gets the source's user messages in order, its tool calls answered
        with the source's recorded results. Stops at the first divergence. Returns the
        replay session's id."""
        source = await self.journal.load(source_id)
        if not source:
            raise LookupError(f"no session {source_id}")
        events = operations.create_events(
            title=title,
            model=model,
            default_model=default_model_from_env(),
            agent=self.agent,
            replay={"source": source_id, "live_reads": live_reads},
        )
        replay_id = self.journal.create()
        await self.journal.append(replay_id, events)
        for turn in recorded_turns(source):
            terminal = await self.send(replay_id, turn.content)
            if terminal.payload.get("stop_reason") == DIVERGED:
                break
        return replay_id

    async def _start_and_run(self, session_id: str, build: Any) -> Envelope:
        # Check and write under the session's lock: two callers cannot both start a run.
        async with self._lock(session_id):
            state = await self.journal.state(session_id)
            invocation_id, events = build(state)
            appended = await self.journal.append(session_id, events)
            for decision in telemetry.decisions_in(state.asks, appended):
                telemetry.record_approval(decision)  # the `approval` span, from ask to decision
            if invocation_id is None:  # a vote that leaves the quorum short: no run yet
                return appended[-1]
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
        self,
        session_id: str,
        ask_id: str,
        verdict: str,
        *,
        approver: str | None = None,
        note: str | None = None,
        scope: str | None = None,
        arguments: dict[str, Any] | None = None,
        result: str | None = None,
    ) -> Envelope:
        """Record a verdict on the pending ask; the decision resumes the session.

        `allow_once` with `arguments` runs the call with these instead of those asked;
        `respond` with `result` answers the call with the text instead of running it
        (both on an ask one person decides only).

        `scope="turn"` (an approving verdict only) approves all: the later gated calls of
        the same assistant message run without asking again, unless a rule denies them or
        needs a quorum or an expiry.

        On an ask needing several approvals (an `ask` rule's approvals_required), each
        verdict is a vote: until the quorum is reached the APPROVAL_VOTED envelope is
        returned and nothing runs; a deny or the last approval resumes the session.
        """
        return await self._start_and_run(
            session_id,
            lambda state: operations.vote_events(
                state,
                ask_id,
                verdict,
                approver=approver,
                note=note,
                scope=scope,
                arguments=arguments,
                result=result,
            ),
        )

    async def expire_asks(self, now: datetime | None = None) -> list[Envelope]:
        """Deny every pending ask whose `expires_after_s` has passed (approver
        "policy:expired") and run the resumed invocations; their terminal envelopes."""
        now = now or utcnow()
        outcomes = []
        for session_id in self.journal.sessions():
            ask = (await self.journal.state(session_id)).pending_ask
            if not ask or not ask.get("expires_after_s") or not ask.get("requested_at"):
                continue
            deadline = datetime.fromisoformat(ask["requested_at"]) + timedelta(seconds=int(ask["expires_after_s"]))
            if deadline > now:
                continue
            try:
                outcomes.append(
                    await self._start_and_run(
                        session_id,
                        lambda state, a=ask: operations.expired_events(state, a["ask_id"], a["expires_after_s"]),
                    )
                )
            except AskNotPending:
                continue  # decided meanwhile
        return outcomes

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

    async def clear(self, session_id: str, *, worktree_selector: Any = None) -> str:
        state = await self.journal.state(session_id)
        events = operations.clear_events(state, worktree_selector=worktree_selector)
        new_id = self.journal.create()
        await self.journal.append(new_id, events)
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
