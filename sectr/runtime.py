"""One invocation's life: start, handler, suspend, complete, fail, cancel (docs/sessions.md).

`Runtime.run_invocation` runs the handler for an invocation whose INVOCATION_STARTED is
already in the journal, and journals exactly one terminal event for it. It is shared by
`LocalRuntime` (in memory, below) and the Django worker (durable, with a fence).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from sectr import operations
from sectr.agents import DEFAULT_AGENT, DEFAULT_HANDLER, AgentSpec
from sectr.compaction import auto_compact
from sectr.context import ENDED_TOOL_CONTENT, FAILED_TOOL_CONTENT, SessionContext
from sectr.control import RunControl
from sectr.errors import (
    ApprovalDenied,
    ApprovalRequired,
    InvocationCancelled,
    JournalUnavailable,
    LeaseLost,
    ProviderError,
    ReplayDiverged,
    SteerArrived,
)
from sectr.events import Envelope, EventType, add_usage, usage_dict
from sectr.fold import fold_messages, open_tool_calls
from sectr.journal import Journal, NewEvent, new_id
from sectr.providers import provider_from_env
from sectr.providers.base import Provider
from sectr.replay import DIVERGED, REPLAY_STOPPED, ReplayPlan, replay_registry
from sectr.rules import Policy, Rule, as_policy
from sectr.state import SessionState
from sectr.telemetry import traced_invocation
from sectr.tools import Tool, ToolRegistry
from sectr.writer import InvocationWriter

log = logging.getLogger("sectr.runtime")
#: How often one invocation may run its handler again for steers that arrive as it ends.
MAX_STEER_ROUNDS = 5
#: The end of a run the team's spent budget stopped (`budget: "team"` tells it from the
#: run's own max_run_tokens).
TEAM_BUDGET_END = {"stop_reason": "budget", "budget": "team"}

Handler = Callable[[SessionContext], Any]
#: Reads a session's approval rules when an invocation starts (the Django worker's).
PolicySource = Callable[[str], Awaitable[Policy]]
#: The agent version a session is pinned to (`SessionState.agent`), as an invocation
#: starts. Versions never change, so the Django worker's keeps them in memory once read.
AgentSource = Callable[[SessionState], Awaitable[AgentSpec]]
#: The tools a session gets beside the runtime's own (its team's MCP servers' tools, in
#: the Django worker), asked as each invocation starts.
ToolSource = Callable[[SessionState], Awaitable[Iterable[Tool]]]
#: The three reads an invocation starts with (its transcript since the newest compaction,
#: the session's state, its rules), in one go: the Django worker's makes them in one
#: database-thread hop instead of three.
StartSource = Callable[[str], Awaitable[tuple[list[Envelope], SessionState, Policy]]]
#: Whether the session's team has spent its budget (the Django worker's answers from a
#: figure it keeps for a few seconds). Asked as each invocation starts and before each
#: model step of the default handler.
BudgetSource = Callable[[str], Awaitable[bool]]


def builtin_registry(extra: Iterable[Tool] = ()) -> ToolRegistry:
    from sectr.builtin_tools import BUILTIN_TOOLS

    registry = ToolRegistry(BUILTIN_TOOLS)
    for tool in extra:
        registry.add(tool)
    return registry


class Runtime:
    """Runs invocations of one handler with one tool registry against one journal."""

    def __init__(
        self,
        journal: Journal,
        *,
        handler: Handler | None = None,
        tools: Iterable[Tool] | ToolRegistry = (),
        provider: Provider | None = None,
        rules: PolicySource | Policy | Iterable[Rule | Mapping[str, Any]] | None = None,
        agent: AgentSource | AgentSpec | None = None,
        handlers: Mapping[str, Handler] | None = None,
        budget: BudgetSource | None = None,
        extra_tools: ToolSource | None = None,
        start: StartSource | None = None,
    ) -> None:
        from sectr.agent import default_handler

        self.journal = journal
        # A callable is asked for each invocation's policy (the Django worker reads the
        # session's team's rules from the database); anything else is one fixed policy.
        self._policy_source: PolicySource | None = rules if callable(rules) else None
        self._policy = Policy() if callable(rules) else as_policy(rules)
        self.handler: Handler = handler or default_handler
        # As with rules: a callable is asked for each invocation's agent, a spec is the
        # one agent of every session.
        self._agent_source: AgentSource | None = agent if callable(agent) else None
        self._agent: AgentSpec = agent if isinstance(agent, AgentSpec) else DEFAULT_AGENT
        #: Handlers an agent may name (`AgentSpec.handler`) besides "default", which is
        #: `handler` above.
        self.handlers: dict[str, Handler] = dict(handlers or {})
        self._budget_source = budget
        self.tools = tools if isinstance(tools, ToolRegistry) else builtin_registry(tools)
        self._tool_source = extra_tools
        #: Replaces the journal's and the rules' separate reads at each start (`rules`
        #: must then be what it reads: the runtime does not ask the rules source too).
        self._start_source = start
        self.provider = provider or provider_from_env()

    async def folded_messages(self, session_id: str) -> list[dict[str, Any]]:
        return fold_messages(await self.journal.load_since_compaction(session_id))

    async def build_context(
        self,
        session_id: str,
        invocation_id: str,
        *,
        control: RunControl | None = None,
        fence: Any = None,
    ) -> SessionContext:
        """The SessionContext of an invocation: O(envelopes since the newest compaction)."""
        if self._start_source is not None:
            transcript, journal_state, policy = await self._start_source(session_id)
        else:
            # Three independent reads, at once: a database journal answers each from a
            # thread, and one after the other they were three round trips before the first
            # token.
            transcript, journal_state, policy = await asyncio.gather(
                self.journal.load_since_compaction(session_id),
                self.journal.state(session_id),
                self.policy_for(session_id),
            )
        # A private copy: the context applies its own appends to it (SessionContext._extend),
        # whatever the journal's `state()` returns (a live object, a fresh row...).
        state = journal_state.copy()
        agent = await self.agent_for(state)
        tools = await self.tools_for(state)
        if state.replay is not None:
            tools = await self._replay_tools(state, transcript, tools)
        ctx: SessionContext | None = None

        def on_append(envelopes: list[Envelope]) -> None:
            if ctx is not None:
                ctx._extend(envelopes)

        writer = InvocationWriter(self.journal, session_id, invocation_id, fence=fence, on_append=on_append)
        ctx = SessionContext(
            session_id=session_id,
            invocation_id=invocation_id,
            transcript=transcript,
            state=state,
            writer=writer,
            tools=tools,
            provider=self.provider,
            model_info=self.provider.model_info(state.model),
            control=control,
            compactor=auto_compact,
            policy=policy,
            agent=agent,
        )
        return ctx

    async def _replay_tools(self, state: SessionState, transcript: list[Envelope], tools: ToolRegistry) -> ToolRegistry:
        """A replay session's tools answer from its source's journal (sectr.replay)."""
        replay = state.replay or {}
        source = await self.journal.load(str(replay.get("source")))
        plan = ReplayPlan.for_invocation(
            source, transcript, int(replay.get("turns") or 0), live_reads=bool(replay.get("live_reads"))
        )
        return replay_registry(tools, plan)

    async def policy_for(self, session_id: str) -> Policy:
        """The approval rules an invocation of this session obeys, read as it starts."""
        if self._policy_source is None:
            return self._policy
        return await self._policy_source(session_id)

    async def tools_for(self, state: SessionState) -> ToolRegistry:
        """The tools an invocation of this session knows: the runtime's, plus those its
        `extra_tools` source gives this session (a name the runtime has is not replaced)."""
        if self._tool_source is None:
            return self.tools
        extra = [t for t in await self._tool_source(state) if t.name not in self.tools]
        if not extra:
            return self.tools
        return ToolRegistry([*self.tools, *extra])

    async def agent_for(self, state: SessionState) -> AgentSpec:
        """The agent version an invocation of this session runs with."""
        if self._agent_source is None:
            return self._agent
        return await self._agent_source(state)

    def handler_for(self, agent: AgentSpec) -> Handler:
        """The handler an agent names; LookupError for one nobody registered."""
        if agent.handler == DEFAULT_HANDLER:
            return self.handler
        try:
            return self.handlers[agent.handler]
        except KeyError:
            message = f"agent {agent.slug} names the handler {agent.handler!r}, which is not registered"
            raise LookupError(message) from None

    @traced_invocation  # the `invoke_agent` span and the ids of the log context
    async def run_invocation(
        self,
        session_id: str,
        invocation_id: str,
        *,
        control: RunControl | None = None,
        fence: Any = None,
    ) -> Envelope:
        """Run the handler and journal the invocation's terminal envelope, which it returns.

        LeaseLost propagates: a fenced worker writes nothing more and another worker
        owns the run.
        """
        try:
            ctx = await self.build_context(session_id, invocation_id, control=control, fence=fence)
        except (LeaseLost, JournalUnavailable, asyncio.CancelledError):
            raise
        except Exception as exc:
            # Fail the invocation rather than leave the session `running` for ever.
            return await self._fail_unbuildable(session_id, invocation_id, fence, exc)
        ctx.loop = asyncio.get_running_loop()
        if ctx.state.replay is not None and ctx.state.replay.get("diverged"):
            # A replay stops at its first divergence: later turns end at once.
            ctx.stop_reason = REPLAY_STOPPED
            return await self._finish(ctx, EventType.INVOCATION_COMPLETED, {"stop_reason": REPLAY_STOPPED})
        if self._budget_source is not None:
            source = self._budget_source
            ctx.budget_check = lambda: source(session_id)
            if await ctx.budget_spent():
                # The team's budget is spent: the run ends at once, a result, not an error.
                ctx.stop_reason = "budget"
                return await self._finish(ctx, EventType.INVOCATION_COMPLETED, TEAM_BUDGET_END)
        for _ in range(MAX_STEER_ROUNDS):
            terminal = await self._run_handler(ctx)
            if terminal is not None:
                return terminal
            try:
                return await self._finish(ctx, EventType.INVOCATION_COMPLETED, self._completed_payload(ctx))
            except SteerArrived:
                # A steer was parked while the run was ending (the journal refused the
                # end, writing nothing): run the handler again; its first step boundary
                # journals the steer and the model answers it.
                log.info("%s: a steer arrived while ending; answering it", invocation_id)
                ctx.stop_reason = "end_turn"
        return await self._finish(ctx, EventType.INVOCATION_COMPLETED, self._completed_payload(ctx))

    @staticmethod
    def _completed_payload(ctx: SessionContext) -> dict[str, Any]:
        if ctx.stop_reason == "budget" and ctx.budget_ended:
            return dict(TEAM_BUDGET_END)
        return {"stop_reason": ctx.stop_reason}

    async def _run_handler(self, ctx: SessionContext) -> Envelope | None:
        """Run the handler once: the terminal envelope of an ending other than a normal
        completion (suspended, cancelled, failed), or None when the handler returned."""
        handler_task = asyncio.ensure_future(self._call_handler(ctx))
        cancel_task = asyncio.ensure_future(ctx.control.wait_cancelled())
        try:
            await asyncio.wait({handler_task, cancel_task}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            handler_task.cancel()
            cancel_task.cancel()
            raise
        if not handler_task.done():  # cancelled mid-step: stop the handler where it is
            handler_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await handler_task
            return await self._finish_cancelled(ctx)
        cancel_task.cancel()
        try:
            handler_task.result()
        except (LeaseLost, JournalUnavailable):
            # Fenced off, or the journal is gone: write nothing more (recording a failure
            # would fail too, or end for good a run that recovery can continue).
            ctx.writer.discard()
            raise
        except ApprovalRequired as ask:
            return await self._finish_suspended(ctx, ask)
        except ReplayDiverged as diverged:
            ctx.stop_reason = DIVERGED
            payload = {"stop_reason": DIVERGED, "divergence": diverged.payload()}
            return await self._finish(ctx, EventType.INVOCATION_COMPLETED, payload)
        except (InvocationCancelled, asyncio.CancelledError):
            return await self._finish_cancelled(ctx)
        except ApprovalDenied as exc:
            # A handler that lets a denial escape still ends cleanly: the model saw it.
            return await self._finish(ctx, EventType.INVOCATION_COMPLETED, {"stop_reason": "end_turn"}, note=str(exc))
        except ProviderError as exc:
            return await self._finish_failed(ctx, str(exc), retryable=exc.retryable)
        except Exception as exc:
            log.exception("handler failed in %s", ctx.invocation_id)
            return await self._finish_failed(ctx, f"{type(exc).__name__}: {exc}", retryable=False)
        # A steer parked after the handler's last step boundary (a run that stopped at a
        # limit, a handler that never looks) is journaled before the end rather than lost:
        # the next run's model sees it. Never between a tool call and its result.
        # What a sync `ctx.execute` queued is part of ctx.messages; a held MESSAGE_END
        # (a reply's) goes with the terminal event, or with the steer's event.
        await ctx.writer.flush(keep_held=True)
        if not ctx.control.cancelled and ctx.control.has_steer() and not open_tool_calls(ctx.messages):
            await ctx.step_boundary()
        return None

    async def _fail_unbuildable(self, session_id: str, invocation_id: str, fence: Any, exc: Exception) -> Envelope:
        state = await self.journal.state(session_id)
        if state.current_invocation_id != invocation_id:
            raise exc  # not an invocation this session is running: nothing to fail
        log.exception("cannot start %s", invocation_id)
        writer = InvocationWriter(self.journal, session_id, invocation_id, fence=fence)
        payload = {"error": f"{type(exc).__name__}: {exc}", "retryable": False}
        return await writer.emit(EventType.INVOCATION_FAILED, payload)

    async def _call_handler(self, ctx: SessionContext) -> None:
        handler = self.handler_for(ctx.agent)
        if inspect.iscoroutinefunction(handler):
            await handler(ctx)
            return
        result = await asyncio.to_thread(handler, ctx)
        if inspect.isawaitable(result):
            await result

    async def _close_open_message(self, ctx: SessionContext, finish_reason: str) -> list[NewEvent]:
        # A held MESSAGE_END (the reply's `end()`) stays held: it goes in the terminal
        # event's append, which `_finish` makes next.
        await ctx.writer.flush(keep_held=True)
        stream = ctx._open_message
        if stream is None or stream.ended:
            return []
        stream.ended = True
        ctx._open_message = None
        payload = {"message_id": stream.message_id, "finish_reason": finish_reason}
        return [ctx.writer.event(EventType.MESSAGE_END, payload)]

    async def _finish(
        self,
        ctx: SessionContext,
        type: EventType,
        payload: dict[str, Any],
        *,
        before: list[NewEvent] | None = None,
        note: str | None = None,
    ) -> Envelope:
        events = await self._close_open_message(ctx, "error" if type is EventType.INVOCATION_FAILED else "stop")
        if type is EventType.INVOCATION_FAILED:
            events.extend(self._orphan_results(ctx, FAILED_TOOL_CONTENT))
        elif type is EventType.INVOCATION_COMPLETED:
            events.extend(self._orphan_results(ctx, ENDED_TOOL_CONTENT))
        events.extend(before or [])
        if type is EventType.INVOCATION_COMPLETED:
            # Always the full usage shape (input and output tokens), even for a run
            # that never called the model.
            payload = {**payload, "usage": add_usage(usage_dict(), ctx.run_usage)}
        events.append(ctx.writer.event(type, payload))
        envelopes = await ctx.writer.append(*events)
        return envelopes[-1]

    async def _finish_suspended(self, ctx: SessionContext, ask: ApprovalRequired) -> Envelope:
        ask_id = new_id("ask")
        # A handler may ask about anything (request_approval): store plain JSON.
        arguments = json.loads(json.dumps(ask.arguments, default=str))
        # A tool's gate brings its rule's terms; request_approval() is matched here (an
        # `ask` rule's quorum and expiry apply; allow and deny rules cannot: the handler
        # has already stopped, so a person decides).
        terms = ask.terms
        if terms is None:
            rule = ctx.policy.first_match(ask.name, arguments)
            terms = ctx.policy.ask_terms(rule if rule is not None and rule.action == "ask" else None)
        payload = {"ask_id": ask_id, "tool_call_id": ask.tool_call_id, "name": ask.name, "arguments": arguments}
        requested = ctx.writer.event(EventType.APPROVAL_REQUESTED, {**payload, **terms})
        return await self._finish(ctx, EventType.INVOCATION_SUSPENDED, {"ask_id": ask_id}, before=[requested])

    async def _finish_failed(self, ctx: SessionContext, error: str, *, retryable: bool) -> Envelope:
        return await self._finish(ctx, EventType.INVOCATION_FAILED, {"error": error, "retryable": retryable})

    @staticmethod
    def _orphan_results(ctx: SessionContext, content: str) -> list[NewEvent]:
        return operations.orphan_result_events(open_tool_calls(ctx.messages), content, ctx.invocation_id)

    async def _finish_cancelled(self, ctx: SessionContext) -> Envelope:
        await ctx.writer.flush()
        stream = ctx._open_message
        open_message_id = None
        if stream is not None and not stream.ended:
            stream.ended = True
            ctx._open_message = None
            open_message_id = stream.message_id
        events = operations.cancelled_events(
            ctx.invocation_id,
            open_message_id=open_message_id,
            open_calls=open_tool_calls(ctx.messages),
            by=ctx.control.cancelled_by,
        )
        envelopes = await ctx.writer.append(*events)
        return envelopes[-1]
