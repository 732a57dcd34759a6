"""SessionContext: the single argument of every handler (docs/sessions.md).

One SessionContext is one invocation. It sees the journal since the newest compaction,
folds it into `messages`, and offers the handler three doors: `execute` (tools, with the
approval gate), `message()` (stream an assistant message into the journal) and
`complete()` (stream a model completion from the session's provider).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

from sectr.agents import DEFAULT_AGENT, TOOL_NOT_AVAILABLE, AgentSpec
from sectr.control import RunControl
from sectr.errors import (
    ApprovalDenied,
    ApprovalRequired,
    InvocationCancelled,
    JournalUnavailable,
    ProviderError,
    ReplayDiverged,
)
from sectr.events import Envelope, EventType, add_usage
from sectr.fold import copy_json, fold_messages
from sectr.journal import NewEvent, new_id
from sectr.providers.base import (
    CompletionRequest,
    Finish,
    ModelInfo,
    Provider,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
)
from sectr.replay import RecordedResult
from sectr.rules import RULE_APPROVER_PREFIX, Policy, Rule, RuleDecision
from sectr.state import SessionState, apply_envelope
from sectr.telemetry import traced_model_step, traced_tool_call
from sectr.tools import Tool, ToolContext, ToolOutput, ToolRegistry, format_result
from sectr.writer import InvocationWriter

log = logging.getLogger("sectr.context")
T = TypeVar("T")

CANCELLED_TOOL_CONTENT = "tool call interrupted by cancellation"
#: The result of a tool call still unanswered when its run failed or ended.
FAILED_TOOL_CONTENT = "tool call not run: the run failed"
ENDED_TOOL_CONTENT = "tool call not run: the run ended"
#: The result of a call to a tool that is not idempotent which a crash cut off: it was
#: journaled as started (TOOL_STARTED) and never answered, so it is not run again.
INTERRUPTED_TOOL_CONTENT = "tool call interrupted by a crash; it may or may not have taken effect"
#: Provider errors are retried this many times within one model step.
PROVIDER_ATTEMPTS = 3
PROVIDER_BACKOFF_SECONDS = 0.5


@dataclass
class ToolResult:
    """What `execute` returns: the journaled content, whether it is an error, the raw value."""

    content: str
    is_error: bool = False
    value: Any = None

    def __str__(self) -> str:
        return self.content


@dataclass
class _Admission:
    """What the session's rules say about one tool call, before it runs (`_admit`)."""

    call_id: str | None
    tool: Tool | None = None  # run it; None: answer `content` without running
    content: str = ""
    is_error: bool = True  # `content` is an error (a refusal, a denial), not a person's answer
    #: run the tool with these (a person edited the asked arguments), its result prefixed
    arguments: dict[str, Any] | None = None
    result_prefix: str = ""
    denied: ApprovalDenied | None = None  # raise this after answering
    #: APPROVAL_REQUESTED payloads of asks decided at once (a rule, or an "Approve all"
    #: of the same turn), journaled first
    decided_by_rule: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class ModelTurn:
    """One streamed assistant message, as `complete()` returns it."""

    message_id: str
    text: str = ""
    reasoning: str = ""
    tool_calls: list[dict[str, str]] = field(default_factory=list)  # {"id", "name", "arguments"}
    finish_reason: str | None = None
    usage: dict[str, int] = field(default_factory=dict)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


@asynccontextmanager
async def _aclosing(stream: AsyncIterator[Any]) -> AsyncIterator[AsyncIterator[Any]]:
    """contextlib.aclosing for any async iterator (a Provider may return one without aclose)."""
    try:
        yield stream
    finally:
        close = getattr(stream, "aclose", None)
        if close is not None:
            await close()


class MessageStream:
    """Streams one assistant message into the journal.

    MESSAGE_START is journaled with the first output (so a provider that fails before
    saying anything leaves no empty message behind); `end()` journals MESSAGE_END with
    the invocation's next write (`InvocationWriter.hold`): after a reply, in the same
    append as the terminal event.
    """

    def __init__(self, ctx: SessionContext, model: str | None) -> None:
        self.ctx = ctx
        self.model = model
        self.message_id = f"msg_{uuid.uuid4().hex}"
        self.started = False
        self.ended = False
        self.turn = ModelTurn(self.message_id)

    def _start_event(self) -> NewEvent:
        self.started = True
        payload: dict[str, Any] = {"message_id": self.message_id, "role": "assistant"}
        if self.model:
            payload["model"] = self.model
        self.ctx._open_message = self
        return self.ctx.writer.event(EventType.MESSAGE_START, payload)

    async def _start(self) -> None:
        if not self.started:
            await self.ctx.writer.append(self._start_event())

    def _start_with_delta(self) -> None:
        """Queue MESSAGE_START for the first delta's write: one journal append (and one
        publication) for both instead of two in a row before the first token shows.
        Like a delta's, its write's error is raised by the writer's next call."""
        if not self.started:
            self.ctx.writer.append_soon(self._start_event())

    async def text(self, text: str) -> None:
        if text:
            self._start_with_delta()
            self.turn.text += text
            await self.ctx.writer.delta(self.message_id, text=text)

    async def reasoning(self, text: str) -> None:
        if text:
            self._start_with_delta()
            self.turn.reasoning += text
            await self.ctx.writer.delta(self.message_id, reasoning=text)

    async def tool_call(self, tool_call_id: str, name: str, arguments: str) -> None:
        await self._start()
        self.turn.tool_calls.append({"id": tool_call_id, "name": name, "arguments": arguments})
        await self.ctx.writer.emit(
            EventType.TOOL_CALL,
            {"message_id": self.message_id, "tool_call_id": tool_call_id, "name": name, "arguments": arguments},
        )

    async def end(self, finish_reason: str | None = None, usage: dict[str, int] | None = None) -> None:
        if self.ended:
            return
        await self._start()
        self.ended = True
        self.turn.finish_reason = finish_reason
        payload: dict[str, Any] = {"message_id": self.message_id}
        if finish_reason is not None:
            payload["finish_reason"] = finish_reason
        if usage:
            payload["usage"] = usage
            self.turn.usage = usage
            self.ctx.run_usage = add_usage(self.ctx.run_usage, usage)
        if self.model:
            payload["model"] = self.model
        # Held, not written now: it goes out in one append with the invocation's next
        # event (the terminal event after a reply, a tool call's TOOL_STARTED), or alone
        # within the writer's HOLD_SECONDS (sectr.writer). A crash before that leaves the
        # message open, as a crash just before `end()` did: the recovery stitches it.
        self.ctx.writer.hold(self.ctx.writer.event(EventType.MESSAGE_END, payload))
        if self.ctx._open_message is self:
            self.ctx._open_message = None


class SessionContext:
    def __init__(
        self,
        *,
        session_id: str,
        invocation_id: str,
        transcript: list[Envelope],
        state: SessionState,
        writer: InvocationWriter,
        tools: ToolRegistry,
        provider: Provider,
        model_info: ModelInfo,
        control: RunControl | None = None,
        compactor: Callable[[SessionContext], Awaitable[bool]] | None = None,
        policy: Policy | None = None,
        agent: AgentSpec | None = None,
    ) -> None:
        self.session_id = session_id
        self.invocation_id = invocation_id
        self.transcript: list[Envelope] = transcript
        self.state = state
        self.writer = writer
        #: The agent (one version of it) this session is pinned to: its instructions go
        #: first in every model call (`model_messages`), and only its tools are offered.
        self.agent: AgentSpec = agent or DEFAULT_AGENT
        #: Every tool the runtime knows; `tools` is the part of it the agent offers.
        self.all_tools = tools
        self.tools = self.agent.select_tools(tools)
        self.provider = provider
        self.model_info = model_info
        self.control = control or RunControl()
        self._compactor = compactor
        #: Set by the runtime when the session's team has a budget (`budget_spent`).
        self.budget_check: Callable[[], Awaitable[bool]] | None = None
        self.budget_ended = False
        # The approval rules of this session (sectr.rules), fixed when the context is
        # built: frozen values no handler, tool or model output can edit for later runs.
        self._policy = policy or Policy()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.run_usage: dict[str, int] = {}
        self.turns = 0  # model steps in this invocation
        self.tool_call_count = 0
        self.consecutive_failures = 0
        self.stop_reason = "end_turn"
        self._open_message: MessageStream | None = None
        self._pending_consumed = False
        self._messages_cache: tuple[int, list[dict[str, Any]]] | None = None
        start = next(
            (
                e
                for e in reversed(transcript)
                if e.type is EventType.INVOCATION_STARTED and e.invocation_id == invocation_id
            ),
            None,
        )
        if start is None:
            raise ValueError(f"invocation {invocation_id} has no INVOCATION_STARTED in the transcript")
        self.reason: dict[str, Any] = start.payload["reason"]
        self.start_seq = start.seq

    # ---- the transcript and its fold ----

    def _extend(self, envelopes: list[Envelope]) -> None:
        """Take in what this invocation journaled: the transcript and the state follow."""
        self.transcript.extend(envelopes)
        for envelope in envelopes:
            apply_envelope(self.state, envelope)

    @property
    def messages(self) -> list[dict[str, Any]]:
        """fold_messages(self.transcript), recomputed when the invocation journals more.

        Each access returns a fresh copy: a handler may edit it (add a system message,
        trim it) without changing what the next access, or the next model step, sees.
        """
        cached = self._messages_cache
        if cached is None or cached[0] != len(self.transcript):
            cached = (len(self.transcript), fold_messages(self.transcript))
            self._messages_cache = cached
        return copy_json(cached[1])

    def model_messages(self) -> list[dict[str, Any]]:
        """What a model call sends by default: the agent's instructions as the first system
        message, then `messages`. The instructions are configuration, not conversation:
        they are never journaled, and `messages` stays the fold of the journal."""
        messages = self.messages
        if self.agent.instructions:
            messages.insert(0, {"role": "system", "content": self.agent.instructions})
        return messages

    @property
    def model(self) -> str:
        return self.state.model

    @property
    def mode(self) -> str:
        return self.state.mode

    @property
    def limits(self) -> dict[str, int]:
        return self.state.limits

    # ---- the reason ----

    @property
    def input(self) -> dict[str, Any]:
        if self.reason.get("kind") != "user_message":
            raise TypeError(f"ctx.input is only for a user_message invocation, not {self.reason.get('kind')}")
        return dict(self.reason["input"])

    @property
    def decision(self) -> dict[str, Any]:
        if self.reason.get("kind") != "approval_decision":
            raise TypeError(f"ctx.decision is only for an approval_decision invocation, not {self.reason.get('kind')}")
        return dict(self.reason["decision"])

    def _decided_ask(self) -> dict[str, Any] | None:
        if self.reason.get("kind") != "approval_decision":
            return None
        return self.state.asks.get(self.reason.get("ask_id", ""))

    def _decision_reason(self) -> dict[str, Any] | None:
        """The approval decision this invocation acts on for the approval gate: its own, or,
        for a `recover` or `retry`, that of the invocation it continues (found through the
        transcript). Without this, a worker dying between an approval and the approved
        call would make the recovered run ask the person again."""
        reason = self.reason
        followed: set[str] = set()
        while reason.get("kind") in ("recover", "retry"):
            previous = reason.get("of_invocation_id")
            if not isinstance(previous, str) or previous in followed:
                return None
            followed.add(previous)
            start = next(
                (e for e in self.transcript if e.type is EventType.INVOCATION_STARTED and e.invocation_id == previous),
                None,
            )
            if start is None:  # compacted away: the gate asks again, which is safe
                return None
            reason = start.payload.get("reason") or {}
        return reason if reason.get("kind") == "approval_decision" else None

    @property
    def pending_tool_call(self) -> dict[str, Any] | None:
        ask = self._decided_ask()
        if ask is None or ask.get("tool_call_id") is None:
            return None
        return {
            "name": ask["name"],
            "arguments": dict(ask.get("arguments") or {}),
            "tool_call_id": ask["tool_call_id"],
            "ask_id": ask["ask_id"],
        }

    # ---- tools ----

    def request_approval(self, name: str, arguments: dict[str, Any]) -> None:
        """Always raises ApprovalRequired: gate an action no single tool expresses."""
        raise ApprovalRequired(name, dict(arguments), None)

    def execute(self, name: str, /, call_id: str | None = None, **arguments: Any) -> ToolResult:
        """Run a tool from sync code: a `def` handler's thread, or an `async def` handler.

        From a `def` handler's thread it is `aexecute`, run on the invocation's loop. On
        the loop itself (an async handler calling it without `await`) it raises what
        `aexecute` raises (LookupError, ApprovalRequired, ApprovalDenied), runs a sync
        tool right there and queues its TOOL_RESULT on the writer (written at the next
        await of the invocation, in order); an async tool is a TypeError there.
        """
        loop = self.loop
        if loop is None:
            raise RuntimeError("this SessionContext is not attached to a running invocation")
        if _running_loop() is loop:
            return self._execute_on_loop(name, arguments, call_id)
        return self.call(self.aexecute(name, call_id, **arguments))

    async def aexecute(self, name: str, /, call_id: str | None = None, **arguments: Any) -> ToolResult:
        return await self.execute_tool(name, arguments, call_id)

    @traced_tool_call  # the `execute_tool {name}` span
    async def execute_tool(self, name: str, arguments: dict[str, Any], call_id: str | None = None) -> ToolResult:
        """Run a registered tool under the session's rules and journal its TOOL_RESULT.

        Raises LookupError (unknown tool), ApprovalRequired (a gated tool without a
        decision or grant) and ApprovalDenied (the decided call was denied). With a
        `call_id` and a tool that is not idempotent, TOOL_STARTED is journaled (committed)
        before the tool runs, so that after a crash recovery knows the call may have
        taken effect.
        """
        admission = self._admit(name, arguments, call_id)
        call_id = admission.call_id
        tool = admission.tool
        for payload in admission.decided_by_rule:
            await self.writer.emit(EventType.APPROVAL_REQUESTED, payload)
        if tool is None:
            result = await self._tool_result(call_id, name, admission.content, is_error=admission.is_error)
            if admission.denied is not None:
                raise admission.denied
            return result
        prefix = admission.result_prefix
        if admission.arguments is not None:
            arguments = admission.arguments
        self.tool_call_count += 1
        try:
            kwargs = tool.bind(arguments, self._tool_context(call_id))
        except Exception as exc:  # arguments the model got wrong: a result it can correct
            return await self._tool_failed(call_id, name, exc, prefix)
        if call_id is not None and not tool.idempotent:
            # Committed before the tool runs: if the worker dies now, recovery knows the
            # call may have taken effect. An idempotent tool is simply run again, so its
            # calls cost no extra write.
            await self.writer.emit(EventType.TOOL_STARTED, {"tool_call_id": call_id, "name": name})
        try:
            value = await tool.invoke(kwargs)
        except (asyncio.CancelledError, JournalUnavailable, ReplayDiverged):
            # A tool that lost the platform's database (it read through it) stops the run
            # for recovery like the journal does, rather than tell the model it failed; a
            # replay's divergence ends the invocation (sectr.replay).
            raise
        except Exception as exc:  # a tool's failure is a result for the model, not a crash
            return await self._tool_failed(call_id, name, exc, prefix)
        if type(value) is RecordedResult:  # a replay's recorded answer, journaled verbatim
            recorded = ToolOutput(value.content, value.media) if value.media else None
            return await self._tool_result(call_id, name, value.content, is_error=value.is_error, value=recorded)
        self.consecutive_failures = 0
        return await self._tool_result(call_id, name, prefix + format_result(value), is_error=False, value=value)

    def _execute_on_loop(self, name: str, arguments: dict[str, Any], call_id: str | None) -> ToolResult:
        """`execute` on the invocation's own loop: no awaiting, so the tool runs here and
        its result is queued on the writer. The loop cannot wait for the journal before
        the tool runs, so no TOOL_STARTED is journaled: a crash during such a call looks
        like a call that never started. Side effects that must not repeat after a crash
        belong in `await ctx.aexecute` (or a `def` handler)."""
        tool = self._offered_tool(name)  # LookupError for an unknown or unoffered tool
        if tool.is_async:
            raise TypeError(
                f"{name} is an async tool: in an async handler, call it with `await ctx.aexecute({name!r}, ...)`"
            )
        admission = self._admit(name, arguments, call_id)
        call_id = admission.call_id
        for payload in admission.decided_by_rule:
            self.writer.append_soon(self.writer.event(EventType.APPROVAL_REQUESTED, payload))
        if admission.tool is None:
            result = self._tool_result_soon(call_id, name, admission.content, is_error=admission.is_error)
            if admission.denied is not None:
                raise admission.denied
            return result
        prefix = admission.result_prefix
        if admission.arguments is not None:
            arguments = admission.arguments
        self.tool_call_count += 1
        try:
            value = tool.fn(**tool.bind(arguments, self._tool_context(call_id)))
        except ReplayDiverged:
            raise
        except Exception as exc:  # a tool's failure is a result for the model, not a crash
            self.consecutive_failures += 1
            content = f"{prefix}Error: {type(exc).__name__}: {exc}"
            return self._tool_result_soon(call_id, name, content, is_error=True)
        if inspect.isawaitable(value):
            if inspect.iscoroutine(value):
                value.close()  # never awaited, on purpose
            raise TypeError(f"{name} returned an awaitable: in an async handler, `await ctx.aexecute({name!r}, ...)`")
        if type(value) is RecordedResult:
            recorded = ToolOutput(value.content, value.media) if value.media else None
            return self._tool_result_soon(call_id, name, value.content, is_error=value.is_error, value=recorded)
        self.consecutive_failures = 0
        return self._tool_result_soon(call_id, name, prefix + format_result(value), is_error=False, value=value)

    def _admit(self, name: str, arguments: dict[str, Any], call_id: str | None) -> _Admission:
        """Apply the session's rules to a call before it runs: plan mode, a call a crash
        cut off, the approval gate. Raises LookupError and ApprovalRequired; a refusal or
        a denial comes back as an error content to journal (and, for a denial, raise)."""
        tool = self._offered_tool(name)  # LookupError for an unknown or unoffered tool
        # An MCP tool runs in plan mode only when its server says it only reads
        # (`readOnlyHint`, which is what leaves it ungated): "not destructive" is not
        # "changes nothing".
        if self.mode == "plan" and (tool.mutating or (tool.mcp_server is not None and tool.gated)):
            refusal = f"refused: {name} changes things and this session is in plan mode (read-only tools only)"
            return _Admission(call_id, content=refusal)
        if call_id is not None and not tool.idempotent and self._interrupted(call_id):
            if tool.gated:
                rule = self._policy.first_match(name, arguments)
                if rule is not None and rule.action == "deny":
                    return self._denied_by_rule(rule, name, arguments, call_id)
                if self._started_by_rule(call_id):
                    # An `allow` rule let it run, not a person: no one weighed a second
                    # run, and a rule cannot tell whether the first took effect. It is
                    # reported as an ungated call's would be, never run again.
                    return _Admission(call_id, content=INTERRUPTED_TOOL_CONTENT)
                # A person approved running it once (or a grant of theirs let it run);
                # whether to risk a second run is a new decision (the ask's decision
                # starts a run that runs it, see `_interrupted`), never taken from the
                # first approval, a grant or an `allow` rule. The ask says the first
                # attempt may have run (`may_have_run`), for the card and the API.
                terms = self._policy.ask_terms(rule if rule is not None and rule.action == "ask" else None)
                raise ApprovalRequired(name, dict(arguments), call_id, terms={**terms, "may_have_run": True})
            return _Admission(call_id, content=INTERRUPTED_TOOL_CONTENT)
        if tool.gated:
            ask = self._decided_ask_for(name, arguments, call_id)
            if ask is not None:
                self._pending_consumed = True
                # Executing the pending call without its id still answers that call, so
                # the model's history stays valid (every tool call gets its result).
                call_id = call_id or ask.get("tool_call_id")
                decision = (self._decision_reason() or {}).get("decision") or {}
                approver = decision.get("approver") or "the approver"
                if decision.get("verdict") == "respond":
                    # A person answered instead: the model gets their text as the call's
                    # (non-error) result, and the tool never runs.
                    content = f"(answered by {approver} instead of running {name}) {decision.get('result') or ''}"
                    return _Admission(call_id, content=content, is_error=False)
                if not decision.get("approved"):
                    note = decision.get("note")
                    content = f"denied: {approver} denied this call" + (f" ({note})" if note else "")
                    return _Admission(call_id, content=content, denied=ApprovalDenied(name, note))
                edited = decision.get("arguments")
                if isinstance(edited, dict):
                    # The model asked for other arguments than those that ran: its result
                    # says so, or it would reason about a call it did not make.
                    shown = json.dumps(edited, ensure_ascii=False, sort_keys=True)
                    prefix = f"(arguments edited by {approver}: {shown})\n"
                    return _Admission(call_id, tool=tool, arguments=dict(edited), result_prefix=prefix)
            else:
                return self._apply_rules(tool, arguments, call_id)
        return _Admission(call_id, tool=tool)

    def _offered_tool(self, name: str) -> Tool:
        if name not in self.tools and name in self.all_tools:
            raise LookupError(f"{TOOL_NOT_AVAILABLE}: {name}")
        return self.tools.get(name)

    def _interrupted(self, call_id: str) -> bool:
        """Whether an earlier invocation started this call (TOOL_STARTED) and a crash cut it
        off: nothing answered it since, and nobody was asked about it again since (an
        APPROVAL_REQUESTED for it after the start means a person decides the re-run)."""
        for envelope in reversed(self.transcript):
            kind = envelope.type
            if kind is EventType.TOOL_STARTED or kind is EventType.TOOL_RESULT or kind is EventType.APPROVAL_REQUESTED:
                if envelope.payload.get("tool_call_id") == call_id:
                    return kind is EventType.TOOL_STARTED
        return False

    def _started_by_rule(self, call_id: str) -> bool:
        """Whether the call's newest TOOL_STARTED was let through by an `allow` rule: the
        APPROVAL_REQUESTED of the call just before that start carries a rule's approving
        decision (approver ``rule:<id>``). False for a person's approval, their "Approve
        all" or a grant of theirs (no ask of its own)."""
        started = False
        for envelope in reversed(self.transcript):
            if envelope.payload.get("tool_call_id") != call_id:
                continue
            if envelope.type is EventType.TOOL_STARTED:
                started = True
            elif envelope.type is EventType.APPROVAL_REQUESTED and started:
                decision = envelope.payload.get("decision")
                return (
                    isinstance(decision, dict)
                    and bool(decision.get("approved"))
                    and str(decision.get("approver") or "").startswith(RULE_APPROVER_PREFIX)
                )
        return False

    def _tool_context(self, call_id: str | None) -> ToolContext:
        return ToolContext(self.session_id, self.invocation_id, dict(self.state.notes), tool_call_id=call_id)

    async def _tool_failed(self, call_id: str | None, name: str, exc: Exception, prefix: str = "") -> ToolResult:
        self.consecutive_failures += 1
        return await self._tool_result(call_id, name, f"{prefix}Error: {type(exc).__name__}: {exc}", is_error=True)

    @property
    def policy(self) -> Policy:
        """The approval rules this invocation obeys (read-only)."""
        return self._policy

    def _apply_rules(self, tool: Tool, arguments: dict[str, Any], call_id: str | None) -> _Admission:
        """The gate of a gated call that is not the decided one: run it (perhaps after a
        rule's decision is journaled), a rule's denial, or ApprovalRequired (ask).

        A team's `deny` rule wins over a session's allow_always grant and over
        accept_edits (a person's grant in one session cannot lift a team's ban); `allow`
        and `ask` rules apply only where the call would otherwise ask.
        """
        name = tool.name
        rule = self._policy.first_match(name, arguments)
        if rule is not None and rule.action == "deny":
            return self._denied_by_rule(rule, name, arguments, call_id)
        if name in self.state.grants or (self.mode == "accept_edits" and tool.edit):
            return _Admission(call_id, tool=tool)
        if rule is not None and rule.action == "allow":
            return _Admission(call_id, tool=tool, decided_by_rule=[self._rule_decision(rule, name, arguments, call_id)])
        if rule is None or (rule.approvals_required <= 1 and not rule.expires_after_s):
            # An ask rule's quorum or expiry is never lifted by one person's approve-all.
            approved_with = self._turn_approval(call_id)
            if approved_with is not None:
                decided = self._turn_decision(approved_with, rule, name, arguments, call_id)
                return _Admission(call_id, tool=tool, decided_by_rule=[decided])
        raise ApprovalRequired(name, dict(arguments), call_id, terms=self._policy.ask_terms(rule))

    def _turn_approval(self, call_id: str | None) -> dict[str, Any] | None:
        """The approval decision reason scoped to the turn (`"scope": "turn"`, "Approve
        all") that covers `call_id`: a later call of the same assistant message as the
        decided ask's call. None when there is none (the gate asks as usual)."""
        if call_id is None:
            return None
        reason = self._decision_reason()
        if reason is None:
            return None
        decision = reason.get("decision") or {}
        if not decision.get("approved") or decision.get("scope") != "turn":
            return None
        ask = self.state.asks.get(reason.get("ask_id", ""))
        decided_call = ask.get("tool_call_id") if ask is not None else None
        if decided_call is None or decided_call == call_id:
            return None
        order: dict[str, tuple[Any, int]] = {}  # tool_call_id: (message_id, seq of its TOOL_CALL)
        for envelope in self.transcript:
            if envelope.type is EventType.TOOL_CALL:
                tool_call_id = envelope.payload.get("tool_call_id")
                if tool_call_id in (decided_call, call_id):
                    order[tool_call_id] = (envelope.payload.get("message_id"), envelope.seq)
        decided, this = order.get(decided_call), order.get(call_id)
        if decided is None or this is None or decided[0] is None or decided[0] != this[0] or this[1] <= decided[1]:
            return None
        return reason

    @staticmethod
    def _turn_decision(
        reason: dict[str, Any], rule: Rule | None, name: str, arguments: dict[str, Any], call_id: str | None
    ) -> dict[str, Any]:
        """The APPROVAL_REQUESTED of a call an "Approve all" decided at once: the approver
        of the decided ask, verdict allow_once, `with_ask` naming that ask."""
        decided = reason.get("decision") or {}
        decision: dict[str, Any] = {"approved": True, "verdict": "allow_once", "with_ask": reason.get("ask_id")}
        if decided.get("approver") is not None:
            decision["approver"] = decided["approver"]
        payload: dict[str, Any] = {
            "ask_id": new_id("ask"),
            "tool_call_id": call_id,
            "name": name,
            "arguments": json.loads(json.dumps(arguments, default=str)),
            "decision": decision,
        }
        if rule is not None:
            payload["rule_id"] = rule.id
        return payload

    def _denied_by_rule(self, rule: Rule, name: str, arguments: dict[str, Any], call_id: str | None) -> _Admission:
        return _Admission(
            call_id,
            content=f"denied: {rule.approver} denied this call",
            denied=ApprovalDenied(name, f"denied by {rule.approver}"),
            decided_by_rule=[self._rule_decision(rule, name, arguments, call_id)],
        )

    @staticmethod
    def _rule_decision(rule: Rule, name: str, arguments: dict[str, Any], call_id: str | None) -> dict[str, Any]:
        """The APPROVAL_REQUESTED of an ask a rule decided at once, with its `decision`
        (approver "rule:<id>"), journaled in this invocation so the run goes on without a
        pause."""
        return {
            "ask_id": new_id("ask"),
            "tool_call_id": call_id,
            "name": name,
            "arguments": json.loads(json.dumps(arguments, default=str)),
            "rule_id": rule.id,
            "decision": RuleDecision.of(rule).decision,
        }

    def _decided_ask_for(self, name: str, arguments: dict[str, Any], call_id: str | None) -> dict[str, Any] | None:
        """The ask this invocation's decision answers, if executing (name, arguments,
        call_id) is that very action: the same tool call id, or, without an id, the same
        tool and arguments. Only once per invocation."""
        if self._pending_consumed:
            return None
        reason = self._decision_reason()
        ask = self.state.asks.get(reason.get("ask_id", "")) if reason is not None else None
        if ask is None or ask.get("name") != name:
            return None
        if call_id is not None:
            return ask if call_id == ask.get("tool_call_id") else None
        return ask if arguments == (ask.get("arguments") or {}) else None

    async def _tool_result(
        self, call_id: str | None, name: str, content: str, *, is_error: bool, value: Any = None
    ) -> ToolResult:
        if call_id is not None:
            payload: dict[str, Any] = {"tool_call_id": call_id, "name": name, "content": content}
            if is_error:
                payload["is_error"] = True
            if isinstance(value, ToolOutput) and value.media:
                payload["media"] = [dict(item) for item in value.media]
            await self.writer.emit(EventType.TOOL_RESULT, payload)
        return ToolResult(content, is_error, value)

    def _tool_result_soon(
        self, call_id: str | None, name: str, content: str, *, is_error: bool, value: Any = None
    ) -> ToolResult:
        """`_tool_result` for code on the loop that cannot await: queued on the writer."""
        if call_id is not None:
            payload: dict[str, Any] = {"tool_call_id": call_id, "name": name, "content": content}
            if is_error:
                payload["is_error"] = True
            if isinstance(value, ToolOutput) and value.media:
                payload["media"] = [dict(item) for item in value.media]
            self.writer.append_soon(self.writer.event(EventType.TOOL_RESULT, payload))
        return ToolResult(content, is_error, value)

    async def execute_call(self, call: dict[str, Any]) -> ToolResult:
        """Execute a tool call as the model wrote it ({"id", "name", "arguments" JSON text}).

        Unknown tools and unparsable arguments become error results, so the model can
        correct itself; ApprovalRequired and ApprovalDenied propagate.
        """
        call_id, name = call["id"], call["name"]
        try:
            arguments = json.loads(call.get("arguments") or "{}")
            if not isinstance(arguments, dict):
                raise ValueError("arguments must be a JSON object")
        except ValueError as exc:
            self.consecutive_failures += 1
            return await self._tool_result(call_id, name, f"Error: invalid JSON arguments: {exc}", is_error=True)
        if name not in self.tools:
            self.consecutive_failures += 1
            content = TOOL_NOT_AVAILABLE if name in self.all_tools else f"Error: unknown tool: {name}"
            return await self._tool_result(call_id, name, content, is_error=True)
        return await self.execute_tool(name, arguments, call_id)

    # ---- streaming ----

    @asynccontextmanager
    async def message(self, model: str | None = None) -> AsyncIterator[MessageStream]:
        """Stream an assistant message: `async with ctx.message() as m: await m.text(...)`."""
        stream = MessageStream(self, model or self.model)
        yield stream
        await stream.end(stream.turn.finish_reason)

    async def step_boundary(self, *, ending: bool = False) -> bool:
        """A model-step boundary: raise if cancelled; journal a parked steer (True if one).

        `ending`: the handler returns here unless a steer is taken (the model answered in
        text), which lets the run's control skip a read its end makes anyway
        (`RunControl.take_steer`)."""
        if self.control.cancelled:
            raise InvocationCancelled()
        steer = await self.control.take_steer(ending=ending)
        if steer is None:
            return False
        text, author = steer
        payload: dict[str, Any] = {"text": text}
        if author:
            payload["author"] = author
        await self.writer.emit(EventType.STEER_RECEIVED, payload)
        return True

    def _request_metadata(self) -> dict[str, Any]:
        """{"steer": text} when the newest model-visible turn is a steer. Invocation starts
        that add no message (retry, recover, approval) do not hide it."""
        for env in reversed(self.transcript):
            if env.type is EventType.STEER_RECEIVED:
                return {"steer": env.payload.get("text", "")}
            if env.type is EventType.MESSAGE_START:
                return {}
            if env.type is EventType.INVOCATION_STARTED and env.payload.get("reason", {}).get("kind") == "user_message":
                return {}
        return {}

    @traced_model_step  # the `chat {model}` span
    async def complete(
        self,
        *,
        tools: list[dict[str, Any]] | None = None,
        messages: list[dict[str, Any]] | None = None,
        model: str | None = None,
    ) -> ModelTurn:
        """Stream one model completion from the session's provider into the journal.

        Retryable provider errors are retried with backoff. Before any output was
        journaled the step simply starts again; after, a SESSION_ERROR closes the partial
        message and the retry continues it (crash stitching). Permanent errors raise.
        """
        # Results a sync `execute` queued on the writer belong in the messages the model sees.
        await self.writer.flush()
        if self._compactor is not None and messages is None:
            await self._compactor(self)
        model = model or self.model
        schemas = self.tools.schemas() if tools is None else tools
        params = self.agent.params
        attempt = 0
        while True:
            attempt += 1
            request = CompletionRequest(
                model=model,
                messages=list(messages if messages is not None else self.model_messages()),
                tools=schemas,
                reasoning_effort=self.state.reasoning_effort or params.get("reasoning_effort"),
                max_output_tokens=self._output_budget(),
                temperature=params.get("temperature"),
                metadata=self._request_metadata(),
                conversation_id=self.session_id,
            )
            stream = MessageStream(self, model)
            try:
                # aclosing: a cancel or an error closes the provider's stream (and its HTTP
                # response) now, not whenever the generator is garbage-collected.
                async with _aclosing(self.provider.stream(request)) as events:
                    async for event in events:
                        if isinstance(event, TextDelta):
                            await stream.text(event.text)
                        elif isinstance(event, ReasoningDelta):
                            await stream.reasoning(event.text)
                        elif isinstance(event, ToolCallDelta):
                            await stream.tool_call(event.id, event.name, event.arguments)
                        elif isinstance(event, Finish):
                            stream.turn.finish_reason = event.finish_reason
                            stream.turn.usage = dict(event.usage or {})
                await stream.end(stream.turn.finish_reason, stream.turn.usage or None)
                self.turns += 1
                return stream.turn
            except ProviderError as exc:
                if exc.retryable and stream.turn.tool_calls and not stream.ended:
                    # Every tool call a provider yields is complete: keep the step rather
                    # than stitch a "please continue" between the calls and their results.
                    log.warning("provider error after tool calls (keeping the step): %s", exc)
                    await stream.end("tool_calls")
                    self.turns += 1
                    return stream.turn
                if exc.retryable and stream.started and not stream.ended:
                    # The partial message stays; the SESSION_ERROR closes it and the fold
                    # asks the model to continue it (rule 8), in this step's next attempt
                    # or, when the attempts are spent, in the `retry` invocation.
                    await self.writer.emit(
                        EventType.SESSION_ERROR,
                        {"error": str(exc), "message_id": stream.message_id, "retryable": True},
                    )
                    stream.ended = True
                    if self._open_message is stream:
                        self._open_message = None
                if not exc.retryable or attempt >= PROVIDER_ATTEMPTS:
                    raise
                log.warning("provider error (attempt %s, retrying): %s", attempt, exc)
                await asyncio.sleep(PROVIDER_BACKOFF_SECONDS * 2 ** (attempt - 1))

    # ---- limits ----

    def limit_reached(self) -> str | None:
        """The stop reason of the first limit this invocation has reached, or None."""
        limits = self.limits
        if limits.get("max_turns") and self.turns >= limits["max_turns"]:
            return "max_turns"
        tool_limit = self.tool_limit_reached()
        if tool_limit is not None:
            return tool_limit
        budget = limits.get("max_run_tokens")
        if budget and self.run_tokens() >= budget:
            return "budget"
        return None

    async def budget_spent(self) -> bool:
        """Whether the session's team has spent its budget: the default handler asks before
        each model step, so a run already going finishes its current step and stops."""
        if self.budget_check is None:
            return False
        spent = await self.budget_check()
        self.budget_ended = self.budget_ended or spent
        return spent

    def run_tokens(self) -> int:
        """Tokens this run has used so far (input + output), what max_run_tokens limits."""
        return sum(v for k, v in self.run_usage.items() if k in ("input_tokens", "output_tokens"))

    def _output_budget(self) -> int | None:
        """The most output tokens the next model step may use: what is left of the run's
        budget (max_run_tokens), so that a single long step cannot overrun it."""
        cap = self.agent.params.get("max_output_tokens")
        budget = self.limits.get("max_run_tokens")
        if not budget:
            return cap
        left = max(budget - self.run_tokens(), 1)
        return min(left, cap) if cap else left

    def tool_limit_reached(self) -> str | None:
        """`max_tool_calls` or `max_consecutive_failures` when reached: no more tool runs.

        Checked on its own (not through `limit_reached`) before each tool call, so that a
        limit reached first by another counter (max_turns) cannot hide it.
        """
        limits = self.limits
        if limits.get("max_tool_calls") and self.tool_call_count >= limits["max_tool_calls"]:
            return "max_tool_calls"
        if limits.get("max_consecutive_failures") and self.consecutive_failures >= limits["max_consecutive_failures"]:
            return "max_consecutive_failures"
        return None

    # ---- sync handlers ----

    def _check_sync_caller(self) -> asyncio.AbstractEventLoop:
        loop = self.loop
        if loop is None:
            raise RuntimeError("this SessionContext is not attached to a running invocation")
        if _running_loop() is loop:
            raise RuntimeError("ctx.call is for a def handler's thread: in an async handler, await the helper itself")
        return loop

    def call(self, awaitable: Awaitable[T]) -> T:
        """Run one of the async helpers from a sync (`def`) handler's thread."""
        try:
            loop = self._check_sync_caller()
        except RuntimeError:
            if inspect.iscoroutine(awaitable):
                awaitable.close()  # never awaited, on purpose: no "never awaited" warning
            raise

        async def wrap() -> T:
            return await awaitable

        return asyncio.run_coroutine_threadsafe(wrap(), loop).result()
