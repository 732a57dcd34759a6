"""The runtime through LocalRuntime: approvals, limits, steer, cancel, crash recovery,
provider errors, retry, one run at a time, fencing (docs/sessions.md)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

import sectr
from sectr import LocalRuntime, SessionContext, tool
from sectr.agent import LIMIT_CONTENT, default_handler
from sectr.context import (
    CANCELLED_TOOL_CONTENT,
    ENDED_TOOL_CONTENT,
    FAILED_TOOL_CONTENT,
    INTERRUPTED_TOOL_CONTENT,
)
from sectr.errors import AskNotPending, LeaseLost, ProviderError, RetryIneligible, SessionBusy, StaleRunControl
from sectr.events import EventType
from sectr.fold import PLEASE_CONTINUE, fold_messages
from sectr.journal import MemoryJournal, NewEvent
from sectr.operations import created_event, message_events, recover_events
from sectr.providers.base import CompletionRequest, Finish, ReasoningDelta, StreamEvent, TextDelta, ToolCallDelta
from sectr.providers.demo import DemoProvider
from sectr.runtime import Runtime
from sectr.state import DEFAULT_LIMITS

from .conftest import (
    SLOW_TICK,
    ScriptedProvider,
    assert_one_terminal_per_invocation,
    assert_tool_calls_answered_in_order,
    call,
    crash_when,
    final_text,
    invocation_envelopes,
    messages_of,
    of_type,
    say,
    text_so_far,
    types_of,
    usage,
    wait_for,
)


@tool
def ping() -> str:
    """Answer pong."""
    return "pong"


@tool
def boom() -> str:
    """Always fails."""
    raise RuntimeError("kaboom")


@tool
async def nap(seconds: float = 5.0) -> str:
    """Sleep a while.

    Args:
        seconds: how long.
    """
    await asyncio.sleep(seconds)
    return "rested"


TOOLS = [ping, boom, nap]


def ticks(text: str) -> list[int]:
    return [int(word) for word in text.split() if word.isdigit()]


def looping(name: str, per_turn: int = 1, tokens: dict[str, int] | None = None) -> ScriptedProvider:
    """A model that calls the tool `name` `per_turn` times on every step, forever."""

    def script(request: CompletionRequest, n: int) -> list[StreamEvent]:
        calls: list[StreamEvent] = [ToolCallDelta(f"c{n}_{i}", name, "{}") for i in range(per_turn)]
        return [*calls, Finish("tool_calls", tokens or usage())]

    return ScriptedProvider(script)


# ---- approvals with the demo model ----


async def test_approve_once_runs_the_note_tool_and_the_model_reports_it(rt: LocalRuntime, sid: str) -> None:
    suspended = await rt.send(sid, "note: buy milk")
    assert suspended.type is EventType.INVOCATION_SUSPENDED
    assert (await rt.state(sid)).notes == {}
    done = await rt.decide(sid, suspended.payload["ask_id"], "allow_once", approver="bob")
    assert done.type is EventType.INVOCATION_COMPLETED
    assert done.payload["stop_reason"] == "end_turn"
    state = await rt.state(sid)
    assert state.notes == {"buy milk": "buy milk"}
    assert state.status == "completed" and state.pending_ask is None
    assert state.asks[suspended.payload["ask_id"]]["status"] == "approved"
    assert final_text(rt, sid) == "write_note returned: saved note 'buy milk' (created)"
    journal = rt.journal.read(sid)
    assert_one_terminal_per_invocation(journal)
    assert_tool_calls_answered_in_order(fold_messages(journal))


async def test_deny_gives_the_model_an_error_result_and_the_run_goes_on(rt: LocalRuntime, sid: str) -> None:
    suspended = await rt.send(sid, '!tool write_note {"title": "t", "body": "b"}')
    done = await rt.decide(sid, suspended.payload["ask_id"], "deny", approver="bob", note="no notes today")
    assert done.type is EventType.INVOCATION_COMPLETED
    assert final_text(rt, sid) == "write_note was denied"
    state = await rt.state(sid)
    assert state.notes == {}
    assert state.asks[suspended.payload["ask_id"]]["status"] == "denied"
    result = of_type(rt.journal.read(sid), EventType.TOOL_RESULT)[-1]
    assert result.payload["is_error"] is True and "no notes today" in result.payload["content"]


async def test_allow_always_records_a_grant_that_skips_later_asks(rt: LocalRuntime, sid: str) -> None:
    suspended = await rt.send(sid, '!tool write_note {"title": "a", "body": "1"}')
    await rt.decide(sid, suspended.payload["ask_id"], "allow_always")
    assert (await rt.state(sid)).grants == ["write_note"]
    later = await rt.send(sid, '!tool write_note {"title": "b", "body": "2"}')
    assert later.type is EventType.INVOCATION_COMPLETED
    assert (await rt.state(sid)).notes == {"a": "1", "b": "2"}
    assert len(of_type(rt.journal.read(sid), EventType.APPROVAL_REQUESTED)) == 1
    # delete_note is another tool: the grant does not cover it
    assert (await rt.send(sid, '!tool delete_note {"title": "a"}')).type is EventType.INVOCATION_SUSPENDED


async def test_the_first_verdict_wins(rt: LocalRuntime, sid: str) -> None:
    suspended = await rt.send(sid, "note: x")
    ask_id = suspended.payload["ask_id"]
    await rt.decide(sid, ask_id, "deny")
    with pytest.raises(AskNotPending):
        await rt.decide(sid, ask_id, "allow_once")
    assert final_text(rt, sid) == "write_note was denied"


async def test_two_concurrent_verdicts_one_is_refused(rt: LocalRuntime, sid: str) -> None:
    suspended = await rt.send(sid, "note: x")
    ask_id = suspended.payload["ask_id"]
    results = await asyncio.gather(
        rt.decide(sid, ask_id, "allow_once"), rt.decide(sid, ask_id, "deny"), return_exceptions=True
    )
    assert sum(isinstance(r, AskNotPending) for r in results) == 1
    started = [e for e in of_type(rt.journal.read(sid), EventType.INVOCATION_STARTED)]
    assert [e.payload["reason"]["kind"] for e in started] == ["user_message", "approval_decision"]


async def test_an_unknown_ask_is_not_pending(rt: LocalRuntime, sid: str) -> None:
    with pytest.raises(AskNotPending):
        await rt.decide(sid, "ask_nope", "allow_once")


async def test_two_gated_calls_in_one_message_ask_one_after_the_other(demo: DemoProvider) -> None:
    def script(request: CompletionRequest, n: int) -> list[Any]:
        if n == 1:
            return [
                *call("write_note", '{"title": "a", "body": "1"}', call_id="w1")[:-1],
                *call("write_note", '{"title": "b", "body": "2"}', call_id="w2"),
            ]
        return say("both done")

    rt = LocalRuntime(provider=ScriptedProvider(script))
    sid = await rt.create_session()
    first = await rt.send(sid, "two notes")
    assert first.type is EventType.INVOCATION_SUSPENDED
    second = await rt.decide(sid, first.payload["ask_id"], "allow_once")
    assert second.type is EventType.INVOCATION_SUSPENDED
    asks = of_type(rt.journal.read(sid), EventType.APPROVAL_REQUESTED)
    assert [a.payload["tool_call_id"] for a in asks] == ["w1", "w2"]
    done = await rt.decide(sid, second.payload["ask_id"], "allow_once")
    assert done.type is EventType.INVOCATION_COMPLETED
    assert (await rt.state(sid)).notes == {"a": "1", "b": "2"}
    assert final_text(rt, sid) == "both done"
    assert_tool_calls_answered_in_order(messages_of(rt, sid))


# ---- limits ----


async def test_max_turns_ends_the_run_with_that_stop_reason() -> None:
    provider = looping("ping")
    rt = LocalRuntime(provider=provider, tools=TOOLS)
    sid = await rt.create_session(limits={"max_turns": 3})
    outcome = await rt.send(sid, "loop")
    assert outcome.type is EventType.INVOCATION_COMPLETED
    assert outcome.payload["stop_reason"] == "max_turns"
    assert len(provider.requests) == 3
    state = await rt.state(sid)
    assert state.turns == 3 and state.status == "completed" and state.last_stop_reason == "max_turns"
    assert_tool_calls_answered_in_order(messages_of(rt, sid))


async def test_a_limit_of_zero_is_off() -> None:
    def script(request: CompletionRequest, n: int) -> list[Any]:
        return call("ping", call_id=f"c{n}") if n <= DEFAULT_LIMITS["max_turns"] + 5 else say("done")

    rt = LocalRuntime(provider=ScriptedProvider(script), tools=TOOLS)
    sid = await rt.create_session(limits={"max_turns": 0, "max_tool_calls": 0})
    outcome = await rt.send(sid, "loop")
    assert outcome.payload["stop_reason"] == "end_turn"
    assert (await rt.state(sid)).turns == DEFAULT_LIMITS["max_turns"] + 6


async def test_max_tool_calls_ends_the_run_and_answers_the_calls_it_did_not_run() -> None:
    provider = looping("ping", per_turn=3)
    rt = LocalRuntime(provider=provider, tools=TOOLS)
    sid = await rt.create_session(limits={"max_tool_calls": 2})
    outcome = await rt.send(sid, "loop")
    assert outcome.payload["stop_reason"] == "max_tool_calls"
    results = of_type(rt.journal.read(sid), EventType.TOOL_RESULT)
    assert [r.payload["content"] for r in results] == ["pong", "pong", LIMIT_CONTENT.format(limit="max_tool_calls")]
    assert len(provider.requests) == 1
    assert_tool_calls_answered_in_order(messages_of(rt, sid))


async def test_max_tool_calls_holds_when_max_turns_is_reached_in_the_same_step() -> None:
    provider = looping("ping", per_turn=3)
    rt = LocalRuntime(provider=provider, tools=TOOLS)
    sid = await rt.create_session(limits={"max_turns": 1, "max_tool_calls": 1})
    outcome = await rt.send(sid, "loop")
    assert outcome.type is EventType.INVOCATION_COMPLETED
    contents = [r.payload["content"] for r in of_type(rt.journal.read(sid), EventType.TOOL_RESULT)]
    assert contents.count("pong") == 1, contents
    assert (await rt.state(sid)).tool_calls == 3  # the model asked three times; one ran


async def test_max_consecutive_failures_ends_the_run() -> None:
    provider = looping("boom")
    rt = LocalRuntime(provider=provider, tools=TOOLS)
    sid = await rt.create_session(limits={"max_consecutive_failures": 3})
    outcome = await rt.send(sid, "fail")
    assert outcome.payload["stop_reason"] == "max_consecutive_failures"
    results = of_type(rt.journal.read(sid), EventType.TOOL_RESULT)
    assert len(results) == 3
    assert all(r.payload["is_error"] and "kaboom" in r.payload["content"] for r in results)


async def test_a_success_resets_the_consecutive_failure_count() -> None:
    def script(request: CompletionRequest, n: int) -> list[Any]:
        if n > 7:
            return say("done")
        return call("ping" if n % 2 == 0 else "boom", call_id=f"c{n}")

    rt = LocalRuntime(provider=ScriptedProvider(script), tools=TOOLS)
    sid = await rt.create_session(limits={"max_consecutive_failures": 2})
    outcome = await rt.send(sid, "alternate")
    assert outcome.payload["stop_reason"] == "end_turn"


async def test_max_run_tokens_is_a_cumulative_budget() -> None:
    provider = looping("ping", tokens=usage(3, 3))
    rt = LocalRuntime(provider=provider, tools=TOOLS)
    sid = await rt.create_session(limits={"max_run_tokens": 10})
    outcome = await rt.send(sid, "spend")
    assert outcome.payload["stop_reason"] == "budget"
    assert outcome.payload["usage"] == {"input_tokens": 6, "output_tokens": 6}
    assert len(provider.requests) == 2
    # the budget is per run: the next run starts from zero again
    again = await rt.send(sid, "spend")
    assert again.payload["stop_reason"] == "budget"
    assert len(provider.requests) == 4


async def test_completed_usage_is_the_sum_of_the_runs_model_steps(rt: LocalRuntime, sid: str) -> None:
    outcome = await rt.send(sid, "calculate 1+1")
    ends = [e for e in invocation_envelopes(rt, sid, outcome.invocation_id or "") if e.type is EventType.MESSAGE_END]
    assert len(ends) == 2
    total = {"input_tokens": 0, "output_tokens": 0, "reasoning_tokens": 0}
    for end in ends:
        for key in total:
            total[key] += end.payload["usage"].get(key, 0)
    assert outcome.payload["usage"] == total
    state = await rt.state(sid)
    assert state.usage["demo"]["output_tokens"] == total["output_tokens"]


async def test_a_run_without_model_steps_reports_zero_usage(demo: DemoProvider) -> None:
    async def handler(ctx: SessionContext) -> None:
        return None

    rt = LocalRuntime(handler=handler, provider=demo)
    sid = await rt.create_session()
    outcome = await rt.send(sid, "hi")
    assert outcome.payload == {"stop_reason": "end_turn", "usage": {"input_tokens": 0, "output_tokens": 0}}


# ---- steer ----


async def test_a_steer_is_journaled_at_the_next_model_step_boundary_and_answered(rt: LocalRuntime, sid: str) -> None:
    task = asyncio.create_task(rt.send(sid, "!slow 10"))
    await wait_for(lambda: "tick 3" in text_so_far(rt.journal, sid))
    await rt.steer(sid, "go left", author="ann")
    outcome = await task
    assert outcome.type is EventType.INVOCATION_COMPLETED
    journal = rt.journal.read(sid)
    (steer,) = of_type(journal, EventType.STEER_RECEIVED)
    assert steer.payload == {"text": "go left", "author": "ann"}
    first_end = of_type(journal, EventType.MESSAGE_END)[0]
    assert steer.seq > first_end.seq, "the steer must not interrupt the model step"
    messages = messages_of(rt, sid)
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant"]
    assert ticks(messages[1]["content"]) == list(range(1, 11))
    assert messages[2] == {"role": "user", "content": "go left"}
    assert final_text(rt, sid) == "Steer received: go left"


async def test_two_steers_join_with_a_blank_line(rt: LocalRuntime, sid: str) -> None:
    task = asyncio.create_task(rt.send(sid, "!slow 10"))
    await wait_for(lambda: "tick 2" in text_so_far(rt.journal, sid))
    await rt.steer(sid, "first")
    await rt.steer(sid, "second")
    await task
    (steer,) = of_type(rt.journal.read(sid), EventType.STEER_RECEIVED)
    assert steer.payload["text"] == "first\n\nsecond"
    assert final_text(rt, sid) == "Steer received: first\n\nsecond"


async def test_a_steer_during_a_tool_call_waits_for_its_result(demo: DemoProvider) -> None:
    rt = LocalRuntime(provider=demo, tools=TOOLS)
    sid = await rt.create_session()
    task = asyncio.create_task(rt.send(sid, '!tool nap {"seconds": 0.1}'))
    await wait_for(lambda: bool(of_type(rt.journal.read(sid), EventType.TOOL_CALL)))
    await rt.steer(sid, "hurry up")
    await task
    journal = rt.journal.read(sid)
    (steer,) = of_type(journal, EventType.STEER_RECEIVED)
    (result,) = of_type(journal, EventType.TOOL_RESULT)
    assert steer.seq > result.seq
    assert_tool_calls_answered_in_order(fold_messages(journal))
    assert final_text(rt, sid) == "Steer received: hurry up"


async def test_a_steer_after_the_run_ended_is_stale(rt: LocalRuntime, sid: str) -> None:
    with pytest.raises(StaleRunControl):
        await rt.steer(sid, "too early")
    await rt.send(sid, "hello")
    with pytest.raises(StaleRunControl):
        await rt.steer(sid, "too late")
    # and it never started a run
    assert len(of_type(rt.journal.read(sid), EventType.INVOCATION_STARTED)) == 1
    assert of_type(rt.journal.read(sid), EventType.STEER_RECEIVED) == []


# ---- cancel ----


async def test_cancel_mid_stream_keeps_the_partial_message(rt: LocalRuntime, sid: str) -> None:
    task = asyncio.create_task(rt.send(sid, "!slow 50"))
    await wait_for(lambda: "tick 3" in text_so_far(rt.journal, sid))
    await rt.cancel(sid, by="ann")
    outcome = await task
    assert outcome.type is EventType.INVOCATION_CANCELLED
    assert outcome.payload == {"by": "ann"}
    journal = rt.journal.read(sid)
    end = journal[-2]
    assert end.type is EventType.MESSAGE_END and end.payload["finish_reason"] == "cancelled"
    partial = messages_of(rt, sid)[-1]
    assert partial["role"] == "assistant"
    got = ticks(partial["content"])
    assert got[:3] == [1, 2, 3] and len(got) < 50
    state = await rt.state(sid)
    assert state.status == "cancelled" and state.last_stop_reason == "cancelled"
    assert state.open_message_id is None
    # the next message reopens the session
    nxt = await rt.send(sid, "hello again")
    assert nxt.type is EventType.INVOCATION_COMPLETED
    assert final_text(rt, sid) == "You said: hello again"
    assert_one_terminal_per_invocation(rt.journal.read(sid))


async def test_cancel_during_a_tool_call_answers_the_orphan(demo: DemoProvider) -> None:
    rt = LocalRuntime(provider=demo, tools=TOOLS)
    sid = await rt.create_session()
    task = asyncio.create_task(rt.send(sid, '!tool nap {"seconds": 30}'))
    await wait_for(lambda: bool(of_type(rt.journal.read(sid), EventType.TOOL_CALL)))
    await rt.cancel(sid)
    outcome = await asyncio.wait_for(task, 5)
    assert outcome.type is EventType.INVOCATION_CANCELLED
    journal = rt.journal.read(sid)
    (call_env,) = of_type(journal, EventType.TOOL_CALL)
    (result,) = of_type(journal, EventType.TOOL_RESULT)
    assert result.payload == {
        "tool_call_id": call_env.payload["tool_call_id"],
        "name": "nap",
        "content": CANCELLED_TOOL_CONTENT,
        "is_error": True,
    }
    assert journal[-1] == outcome and journal[-2] == result
    assert_tool_calls_answered_in_order(fold_messages(journal))
    await rt.send(sid, "hello")
    assert final_text(rt, sid) == "You said: hello"


async def test_cancel_while_awaiting_withdraws_the_ask(rt: LocalRuntime, sid: str) -> None:
    suspended = await rt.send(sid, "note: x")
    await rt.cancel(sid, by="ann")
    state = await rt.state(sid)
    assert state.status == "cancelled" and state.pending_ask is None
    assert state.asks[suspended.payload["ask_id"]]["status"] == "withdrawn"
    with pytest.raises(AskNotPending):
        await rt.decide(sid, suspended.payload["ask_id"], "allow_once")
    journal = rt.journal.read(sid)
    assert types_of(journal[-2:]) == ["TOOL_RESULT", "INVOCATION_CANCELLED"]
    assert journal[-2].payload["content"] == CANCELLED_TOOL_CONTENT
    assert_one_terminal_per_invocation(journal)
    assert_tool_calls_answered_in_order(fold_messages(journal))
    await rt.send(sid, "hello")
    assert final_text(rt, sid) == "You said: hello"


async def test_cancel_with_nothing_running_is_stale(rt: LocalRuntime, sid: str) -> None:
    with pytest.raises(StaleRunControl):
        await rt.cancel(sid)
    await rt.send(sid, "hello")
    with pytest.raises(StaleRunControl):
        await rt.cancel(sid)


# ---- crash recovery ----


async def test_recover_continues_a_run_whose_worker_died(demo: DemoProvider) -> None:
    contexts: list[SessionContext] = []

    async def handler(ctx: SessionContext) -> None:
        contexts.append(ctx)
        await default_handler(ctx)

    rt = LocalRuntime(handler=handler, provider=demo)
    sid = await rt.create_session()
    await crash_when(rt.send(sid, "!slow 8"), lambda: "tick 3" in text_so_far(rt.journal, sid))
    crashed = (await rt.state(sid)).current_invocation_id
    assert (await rt.state(sid)).status == "running"
    before = len(rt.journal.read(sid))
    assert rt.journal.read(sid)[-1].type is EventType.MESSAGE_DELTA

    outcome = await rt.recover(sid)
    assert outcome.type is EventType.INVOCATION_COMPLETED
    journal = rt.journal.read(sid)
    error, started = journal[before], journal[before + 1]
    assert error.type is EventType.SESSION_ERROR and error.invocation_id == crashed
    assert error.payload["retryable"] is True
    assert error.payload["message_id"] == of_type(journal, EventType.MESSAGE_START)[0].payload["message_id"]
    assert started.type is EventType.INVOCATION_STARTED
    assert started.payload["reason"] == {"kind": "recover", "of_invocation_id": crashed}
    assert started.invocation_id == outcome.invocation_id

    # the recovering handler saw the stitched "please continue"; the journal never holds it
    stitched = contexts[-1]
    assert {"role": "user", "content": PLEASE_CONTINUE} in stitched.messages
    assert PLEASE_CONTINUE not in json.dumps([e.payload for e in journal])
    messages = messages_of(rt, sid)
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant"]
    partial, rest = ticks(messages[1]["content"]), ticks(messages[3]["content"])
    assert partial + rest == list(range(1, 9))
    assert final_text(rt, sid).endswith("tick 8 ")
    assert (await rt.state(sid)).status == "completed"
    assert_one_terminal_per_invocation(journal)


async def test_recover_after_a_crash_between_steps(demo: DemoProvider) -> None:
    """A worker that died with no open message: the SESSION_ERROR has no message_id and
    the run goes on from the journal (here: answering the tool result)."""
    journal = MemoryJournal()
    rt = LocalRuntime(provider=demo, journal=journal, tools=TOOLS)
    sid = await rt.create_session()
    await crash_when(
        rt.send(sid, '!tool nap {"seconds": 30}'), lambda: bool(of_type(journal.read(sid), EventType.TOOL_CALL))
    )
    rt2 = LocalRuntime(provider=demo, journal=journal, tools=[ping])  # another worker, no slow nap
    outcome = await rt2.recover(sid)
    assert outcome.type is EventType.INVOCATION_COMPLETED
    (error,) = of_type(journal.read(sid), EventType.SESSION_ERROR)
    assert "message_id" not in error.payload
    # the cut-off call was answered by the recovering worker (nap is unknown there)
    assert_tool_calls_answered_in_order(fold_messages(journal.read(sid)))
    assert final_text(rt2, sid).startswith("nap returned: Error: unknown tool")


async def test_recover_without_a_crash_is_refused(rt: LocalRuntime, sid: str) -> None:
    with pytest.raises(StaleRunControl):
        await rt.recover(sid)
    task = asyncio.create_task(rt.send(sid, "!slow 5"))
    await wait_for(lambda: "tick 1" in text_so_far(rt.journal, sid))
    with pytest.raises(StaleRunControl):  # the run is alive in this runtime
        await rt.recover(sid)
    await task


# ---- provider errors ----


class FlakyDemo(DemoProvider):
    """The demo model, failing as told on its first requests."""

    def __init__(self, failures: list[tuple[int, ProviderError]], **kwargs: Any) -> None:
        super().__init__(delay=0, slow_delay=SLOW_TICK / 4, **kwargs)
        self.failures = list(failures)  # (events to yield before failing, error), one per request
        self.calls = 0

    async def stream(self, request: CompletionRequest) -> AsyncIterator[StreamEvent]:
        self.calls += 1
        failure = self.failures.pop(0) if self.failures else None
        count = 0
        async for event in super().stream(request):
            if failure is not None and count == failure[0]:
                raise failure[1]
            count += 1
            yield event


async def test_retryable_errors_before_any_output_are_retried_quietly() -> None:
    provider = FlakyDemo([(0, ProviderError("429", retryable=True)), (0, ProviderError("503", retryable=True))])
    rt = LocalRuntime(provider=provider)
    sid = await rt.create_session()
    outcome = await rt.send(sid, "hello")
    assert outcome.type is EventType.INVOCATION_COMPLETED
    assert provider.calls == 3
    journal = rt.journal.read(sid)
    assert of_type(journal, EventType.SESSION_ERROR) == []
    assert len(of_type(journal, EventType.MESSAGE_START)) == 1
    assert final_text(rt, sid) == "You said: hello"


async def test_a_retryable_error_after_output_is_stitched_and_continued() -> None:
    provider = FlakyDemo([(3, ProviderError("connection reset", retryable=True))])
    rt = LocalRuntime(provider=provider)
    sid = await rt.create_session()
    outcome = await rt.send(sid, "!slow 6")
    assert outcome.type is EventType.INVOCATION_COMPLETED
    journal = rt.journal.read(sid)
    starts = of_type(journal, EventType.MESSAGE_START)
    (error,) = of_type(journal, EventType.SESSION_ERROR)
    assert error.payload == {
        "error": "connection reset",
        "message_id": starts[0].payload["message_id"],
        "retryable": True,
    }
    assert starts[0].seq < error.seq < starts[1].seq
    messages = messages_of(rt, sid)
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant"]
    assert messages[2]["content"] == PLEASE_CONTINUE
    assert ticks(messages[1]["content"]) + ticks(messages[3]["content"]) == [1, 2, 3, 4, 5, 6]
    assert_one_terminal_per_invocation(journal)


async def test_a_permanent_error_fails_the_run_and_cannot_be_retried() -> None:
    provider = FlakyDemo([(0, ProviderError("400 bad request", retryable=False))])
    rt = LocalRuntime(provider=provider)
    sid = await rt.create_session()
    outcome = await rt.send(sid, "hello")
    assert outcome.type is EventType.INVOCATION_FAILED
    assert outcome.payload == {"error": "400 bad request", "retryable": False}
    assert provider.calls == 1
    state = await rt.state(sid)
    assert state.status == "failed" and state.last_stop_reason == "error"
    with pytest.raises(RetryIneligible):
        await rt.retry(sid)
    # a new message is still accepted
    assert (await rt.send(sid, "again")).type is EventType.INVOCATION_COMPLETED


async def test_a_permanent_error_after_output_closes_the_partial_message() -> None:
    provider = FlakyDemo([(2, ProviderError("400 content policy", retryable=False))])
    rt = LocalRuntime(provider=provider)
    sid = await rt.create_session()
    outcome = await rt.send(sid, "!slow 6")
    assert outcome.type is EventType.INVOCATION_FAILED
    journal = rt.journal.read(sid)
    assert journal[-2].type is EventType.MESSAGE_END and journal[-2].payload["finish_reason"] == "error"
    assert of_type(journal, EventType.SESSION_ERROR) == []


async def test_retry_after_spent_attempts_continues_the_failed_step() -> None:
    failures = [(2, ProviderError("503", retryable=True)) for _ in range(3)]
    provider = FlakyDemo(failures)
    rt = LocalRuntime(provider=provider)
    sid = await rt.create_session()
    failed = await rt.send(sid, "!slow 10")
    assert failed.type is EventType.INVOCATION_FAILED
    assert failed.payload == {"error": "503", "retryable": True}
    assert provider.calls == 3
    state = await rt.state(sid)
    assert state.status == "failed" and state.last_error and state.last_error["retryable"]
    retried = await rt.retry(sid)
    assert retried.type is EventType.INVOCATION_COMPLETED
    started = of_type(rt.journal.read(sid), EventType.INVOCATION_STARTED)[-1]
    assert started.payload["reason"] == {"kind": "retry", "of_invocation_id": failed.invocation_id}
    # every partial attempt was stitched, so each attempt and the retry went on from where
    # the one before stopped: two ticks an attempt, then the rest
    assistant = [ticks(m["content"]) for m in messages_of(rt, sid) if m["role"] == "assistant"]
    assert assistant == [[1, 2], [3, 4], [5, 6], [7, 8, 9, 10]]
    with pytest.raises(RetryIneligible):
        await rt.retry(sid)
    assert_one_terminal_per_invocation(rt.journal.read(sid))


async def test_retry_is_refused_unless_the_session_failed_retryably(rt: LocalRuntime, sid: str) -> None:
    with pytest.raises(RetryIneligible):
        await rt.retry(sid)
    await rt.send(sid, "hello")
    with pytest.raises(RetryIneligible):
        await rt.retry(sid)


async def test_a_handler_exception_fails_the_run_without_retry(demo: DemoProvider) -> None:
    async def handler(ctx: SessionContext) -> None:
        async with ctx.message() as m:
            await m.text("half a thought")
            raise ValueError("handler bug")

    rt = LocalRuntime(handler=handler, provider=demo)
    sid = await rt.create_session()
    outcome = await rt.send(sid, "go")
    assert outcome.type is EventType.INVOCATION_FAILED
    assert outcome.payload == {"error": "ValueError: handler bug", "retryable": False}
    journal = rt.journal.read(sid)
    assert journal[-2].type is EventType.MESSAGE_END and journal[-2].payload["finish_reason"] == "error"


# ---- one run at a time ----


async def test_a_second_send_while_a_run_is_active_is_refused(rt: LocalRuntime, sid: str) -> None:
    task = asyncio.create_task(rt.send(sid, "!slow 5"))
    await wait_for(lambda: "tick 1" in text_so_far(rt.journal, sid))
    with pytest.raises(SessionBusy):
        await rt.send(sid, "me too")
    outcome = await task
    assert outcome.type is EventType.INVOCATION_COMPLETED
    assert len(of_type(rt.journal.read(sid), EventType.INVOCATION_STARTED)) == 1
    assert (await rt.send(sid, "now")).type is EventType.INVOCATION_COMPLETED


async def test_two_concurrent_sends_start_one_run(rt: LocalRuntime, sid: str) -> None:
    results = await asyncio.gather(rt.send(sid, "a"), rt.send(sid, "b"), return_exceptions=True)
    assert sum(isinstance(r, SessionBusy) for r in results) == 1
    assert len(of_type(rt.journal.read(sid), EventType.INVOCATION_STARTED)) == 1


async def test_a_message_while_awaiting_an_approval_is_refused(rt: LocalRuntime, sid: str) -> None:
    await rt.send(sid, "note: x")
    with pytest.raises(SessionBusy) as info:
        await rt.send(sid, "hello")
    assert info.value.code == "awaiting_approval"


# ---- fencing (the worker's lease) ----


async def _runtime_session(journal: MemoryJournal, text: str) -> tuple[str, str]:
    sid = journal.create()
    await journal.append(sid, [created_event(title=None, mode="default", model="demo", limits=dict(DEFAULT_LIMITS))])
    invocation_id, events = message_events(await journal.state(sid), text)
    await journal.append(sid, events)
    return sid, invocation_id


async def test_a_fenced_worker_writes_nothing_more_and_another_recovers() -> None:
    journal = MemoryJournal()
    runtime = Runtime(journal, provider=DemoProvider(delay=0, slow_delay=SLOW_TICK))
    sid, invocation_id = await _runtime_session(journal, "!slow 8")
    journal.set_fence(sid, "lease-1")
    task = asyncio.create_task(runtime.run_invocation(sid, invocation_id, fence="lease-1"))
    await wait_for(lambda: "tick 2" in text_so_far(journal, sid))
    journal.set_fence(sid, "lease-2")  # the lease was taken over
    with pytest.raises(LeaseLost):
        await task
    count = len(journal.read(sid))
    await asyncio.sleep(SLOW_TICK * 3)
    assert len(journal.read(sid)) == count  # nothing after the fence, not even buffered deltas
    assert not any(e.type is EventType.INVOCATION_FAILED for e in journal.read(sid))

    state = await journal.state(sid)
    new_invocation, events = recover_events(state, invocation_id)
    await journal.append(sid, events, fence="lease-2")
    outcome = await runtime.run_invocation(sid, new_invocation, fence="lease-2")
    assert outcome.type is EventType.INVOCATION_COMPLETED
    text = "".join(m["content"] for m in fold_messages(journal.read(sid)) if m["role"] == "assistant")
    assert ticks(text) == list(range(1, 9))


async def test_run_invocation_needs_the_invocations_start() -> None:
    journal = MemoryJournal()
    runtime = Runtime(journal, provider=DemoProvider(delay=0))
    sid, _ = await _runtime_session(journal, "hi")
    with pytest.raises(ValueError):
        await runtime.run_invocation(sid, "inv_unknown")


async def test_reasoning_and_text_of_one_message_fold_together(demo: DemoProvider) -> None:
    def script(request: CompletionRequest, n: int) -> list[Any]:
        return [ReasoningDelta("think "), ReasoningDelta("hard"), TextDelta("an"), TextDelta("swer"), *say("!")[1:]]

    rt = LocalRuntime(provider=ScriptedProvider(script))
    sid = await rt.create_session()
    await rt.send(sid, "q")
    last = messages_of(rt, sid)[-1]
    assert last == {"role": "assistant", "content": "answer", "reasoning_content": "think hard"}


async def test_new_event_shapes_are_json_serialisable(rt: LocalRuntime, sid: str) -> None:
    suspended = await rt.send(sid, "note: hello world")
    await rt.decide(sid, suspended.payload["ask_id"], "allow_always")
    await rt.send(sid, "!slow 2")
    for env in rt.journal.read(sid):
        assert type(env.from_json(env.to_json())) is type(env)
        assert env.from_json(env.to_json()) == env


# ---- edges found while testing ----


@tool(gated=True, mutating=True)
async def slow_deploy(target: str) -> str:
    """Deploy, slowly.

    Args:
        target: where to.
    """
    await asyncio.sleep(0.3)
    return f"deployed to {target}"


async def test_a_crash_between_approval_and_the_approved_call_does_not_ask_again(demo: DemoProvider) -> None:
    journal = MemoryJournal()
    rt = LocalRuntime(provider=demo, tools=[slow_deploy], journal=journal)
    sid = await rt.create_session()
    suspended = await rt.send(sid, '!tool slow_deploy {"target": "prod"}')
    state = await journal.state(sid)
    # the approval is journaled, the worker dies before the tool starts
    from sectr.operations import decision_events

    _, events = decision_events(state, suspended.payload["ask_id"], "allow_once", approver="bob")
    await journal.append(sid, events)
    outcome = await LocalRuntime(provider=demo, tools=[slow_deploy], journal=journal).recover(sid)
    assert outcome.type is EventType.INVOCATION_COMPLETED, outcome.payload
    assert len(of_type(journal.read(sid), EventType.APPROVAL_REQUESTED)) == 1
    assert final_text(rt, sid) == "slow_deploy returned: deployed to prod"


async def test_a_crash_inside_an_approved_call_asks_again_before_running_it_twice(demo: DemoProvider) -> None:
    journal = MemoryJournal()
    rt = LocalRuntime(provider=demo, tools=[slow_deploy], journal=journal)
    sid = await rt.create_session()
    suspended = await rt.send(sid, '!tool slow_deploy {"target": "prod"}')
    task = asyncio.create_task(rt.decide(sid, suspended.payload["ask_id"], "allow_once", approver="bob"))
    await wait_for(lambda: of_type(journal.read(sid), EventType.TOOL_STARTED) != [])
    await asyncio.sleep(0.05)  # inside the approved tool
    task.cancel()  # the worker dies
    with pytest.raises(asyncio.CancelledError):
        await task
    assert of_type(journal.read(sid), EventType.TOOL_RESULT) == []
    recovering = LocalRuntime(provider=demo, tools=[slow_deploy], journal=journal)
    outcome = await recovering.recover(sid)
    # slow_deploy is not idempotent: the first approval covered one run, not a second one
    assert outcome.type is EventType.INVOCATION_SUSPENDED, outcome.payload
    asks = of_type(journal.read(sid), EventType.APPROVAL_REQUESTED)
    assert len(asks) == 2 and asks[1].payload["tool_call_id"] == asks[0].payload["tool_call_id"]
    # The second ask says the first attempt may have run; the first did not say so.
    assert asks[1].payload["may_have_run"] is True and "may_have_run" not in asks[0].payload
    assert (await journal.state(sid)).pending_ask["may_have_run"] is True
    outcome = await recovering.decide(sid, outcome.payload["ask_id"], "allow_once", approver="bob")
    assert outcome.type is EventType.INVOCATION_COMPLETED
    assert final_text(rt, sid) == "slow_deploy returned: deployed to prod"
    assert len(of_type(journal.read(sid), EventType.TOOL_STARTED)) == 2


async def test_a_crash_inside_a_call_an_allow_rule_let_run_is_reported_never_run_again(demo: DemoProvider) -> None:
    runs: list[str] = []

    @tool(gated=True, mutating=True, name="slow_deploy")
    async def counted_deploy(target: str) -> str:
        """Deploy, slowly, counting.

        Args:
            target: where to.
        """
        runs.append(target)
        await asyncio.sleep(0.3)
        return f"deployed to {target}"

    journal = MemoryJournal()
    rules = [{"tool": "slow_deploy", "action": "allow"}]
    rt = LocalRuntime(provider=demo, tools=[counted_deploy], journal=journal, rules=rules)
    sid = await rt.create_session()
    await crash_when(rt.send(sid, '!tool slow_deploy {"target": "prod"}'), lambda: runs == ["prod"])
    outcome = await LocalRuntime(provider=demo, tools=[counted_deploy], journal=journal, rules=rules).recover(sid)
    # No one to ask about a second run the rule never weighed: the call is reported as
    # interrupted, like an ungated one, and nobody is asked.
    assert outcome.type is EventType.INVOCATION_COMPLETED, outcome.payload
    assert runs == ["prod"]
    (result,) = of_type(journal.read(sid), EventType.TOOL_RESULT)
    assert result.payload["is_error"] is True and result.payload["content"] == INTERRUPTED_TOOL_CONTENT
    (ask,) = of_type(journal.read(sid), EventType.APPROVAL_REQUESTED)
    assert ask.payload["decision"]["approver"] == "rule:r1"


# ---- exactly-once side effects across a crash (TOOL_STARTED) ----


class SideEffects:
    """Tools that record every run with the idempotency key they were given."""

    def __init__(self) -> None:
        self.runs: list[tuple[str, str | None]] = []
        self.journal_at_start: list[list[str]] = []
        self.release = asyncio.Event()

    def tools(self, journal: MemoryJournal, sid_box: list[str]) -> list[Any]:
        effects = self

        @tool(mutating=True, name="charge")
        async def charge(amount: int, context: sectr.ToolContext) -> str:
            """Charge a card (not idempotent).

            Args:
                amount: how much.
            """
            effects.journal_at_start.append(types_of(journal.read(sid_box[0])))
            effects.runs.append(("charge", context.idempotency_key))
            await effects.release.wait()
            return f"charged {amount}"

        @tool(mutating=True, idempotent=True, name="put_record")
        async def put_record(key: str, context: sectr.ToolContext) -> str:
            """Store a record under a key (idempotent: a second put changes nothing).

            Args:
                key: the record's key.
            """
            effects.runs.append(("put_record", context.idempotency_key))
            await effects.release.wait()
            return f"stored {key}"

        return [charge, put_record]


async def _crash_inside_tool(demo: DemoProvider, prompt: str) -> tuple[MemoryJournal, str, SideEffects, list[Any]]:
    """Run `prompt` until its tool is running, then kill the invocation (a dead worker)."""
    journal = MemoryJournal()
    effects = SideEffects()
    sid_box: list[str] = []
    tools = effects.tools(journal, sid_box)
    rt = LocalRuntime(provider=demo, tools=tools, journal=journal)
    sid_box.append(await rt.create_session())
    await crash_when(rt.send(sid_box[0], prompt), lambda: len(effects.runs) == 1)
    assert of_type(journal.read(sid_box[0]), EventType.TOOL_RESULT) == []
    return journal, sid_box[0], effects, tools


async def test_the_intent_is_journaled_before_a_tool_that_is_not_idempotent_runs(demo: DemoProvider) -> None:
    journal, sid, effects, _ = await _crash_inside_tool(demo, '!tool charge {"amount": 5}')
    assert effects.journal_at_start[0][-2:] == ["MESSAGE_END", "TOOL_STARTED"]
    (call_env,) = of_type(journal.read(sid), EventType.TOOL_CALL)
    (started,) = of_type(journal.read(sid), EventType.TOOL_STARTED)
    assert started.payload == {"tool_call_id": call_env.payload["tool_call_id"], "name": "charge"}
    assert effects.runs == [("charge", call_env.payload["tool_call_id"])]  # the key is the call id
    # TOOL_STARTED adds nothing to the model's messages (docs/journal.md unchanged)
    without = [e for e in journal.read(sid) if e.type is not EventType.TOOL_STARTED]
    assert fold_messages(journal.read(sid)) == fold_messages(without)


async def test_a_started_call_a_crash_cut_off_is_not_run_again_and_the_model_is_told(demo: DemoProvider) -> None:
    journal, sid, effects, tools = await _crash_inside_tool(demo, '!tool charge {"amount": 5}')
    effects.release.set()
    rt = LocalRuntime(provider=demo, tools=tools, journal=journal)
    outcome = await rt.recover(sid)
    assert outcome.type is EventType.INVOCATION_COMPLETED
    assert [name for name, _ in effects.runs] == ["charge"]  # once, never twice
    (result,) = of_type(journal.read(sid), EventType.TOOL_RESULT)
    assert result.payload["is_error"] is True
    assert result.payload["content"] == INTERRUPTED_TOOL_CONTENT
    assert "it may or may not have taken effect" in INTERRUPTED_TOOL_CONTENT
    assert final_text(rt, sid) == f"charge returned: {INTERRUPTED_TOOL_CONTENT}"


async def test_an_idempotent_call_a_crash_cut_off_runs_again_with_the_same_key(demo: DemoProvider) -> None:
    journal, sid, effects, tools = await _crash_inside_tool(demo, '!tool put_record {"key": "k1"}')
    assert of_type(journal.read(sid), EventType.TOOL_STARTED) == []  # an idempotent call costs no write
    effects.release.set()
    rt = LocalRuntime(provider=demo, tools=tools, journal=journal)
    outcome = await rt.recover(sid)
    assert outcome.type is EventType.INVOCATION_COMPLETED
    (call_env,) = of_type(journal.read(sid), EventType.TOOL_CALL)
    key = call_env.payload["tool_call_id"]
    assert effects.runs == [("put_record", key), ("put_record", key)]
    assert final_text(rt, sid) == "put_record returned: stored k1"


async def test_a_call_that_never_started_before_the_crash_runs_after_recovery(demo: DemoProvider) -> None:
    journal = MemoryJournal()
    effects = SideEffects()
    effects.release.set()
    sid_box: list[str] = []
    tools = effects.tools(journal, sid_box)
    sid, invocation_id = await _runtime_session(journal, "!tool charge {}")
    sid_box.append(sid)
    await journal.append(
        sid,
        [
            NewEvent(EventType.MESSAGE_START, {"message_id": "m1", "role": "assistant"}, invocation_id),
            NewEvent(
                EventType.TOOL_CALL,
                {"message_id": "m1", "tool_call_id": "c1", "name": "charge", "arguments": '{"amount": 3}'},
                invocation_id,
            ),
            NewEvent(EventType.MESSAGE_END, {"message_id": "m1"}, invocation_id),
        ],
    )
    outcome = await LocalRuntime(provider=demo, tools=tools, journal=journal).recover(sid)
    assert outcome.type is EventType.INVOCATION_COMPLETED
    assert effects.runs == [("charge", "c1")]
    (result,) = of_type(journal.read(sid), EventType.TOOL_RESULT)
    assert result.payload["content"] == "charged 3"


async def test_a_crash_between_a_denial_and_its_result_still_denies(demo: DemoProvider) -> None:
    """The recovered run applies the decision of the run it continues."""
    journal = MemoryJournal()
    rt = LocalRuntime(provider=demo, tools=[slow_deploy], journal=journal)
    sid = await rt.create_session()
    suspended = await rt.send(sid, '!tool slow_deploy {"target": "prod"}')
    state = await journal.state(sid)
    # the decision is journaled, the worker dies before it runs anything
    from sectr.operations import decision_events

    _, events = decision_events(state, suspended.payload["ask_id"], "deny", approver="bob")
    await journal.append(sid, events)
    outcome = await rt.recover(sid)
    assert outcome.type is EventType.INVOCATION_COMPLETED
    assert final_text(rt, sid) == "slow_deploy was denied"
    assert len(of_type(journal.read(sid), EventType.APPROVAL_REQUESTED)) == 1


async def test_a_steer_parked_when_a_limit_stops_the_run_is_journaled_not_lost() -> None:
    provider = looping("ping")
    provider.pause = 0.01
    rt = LocalRuntime(provider=provider, tools=TOOLS)
    # max_tool_calls stops right after the tools of the second step, before a boundary
    sid = await rt.create_session(limits={"max_tool_calls": 2})

    task = asyncio.create_task(rt.send(sid, "loop"))
    await wait_for(lambda: len(of_type(rt.journal.read(sid), EventType.TOOL_RESULT)) == 1)
    await rt.steer(sid, "stop soon")
    outcome = await task
    assert outcome.payload["stop_reason"] == "max_tool_calls"
    journal = rt.journal.read(sid)
    (steer,) = of_type(journal, EventType.STEER_RECEIVED)
    assert steer.seq < outcome.seq
    assert_tool_calls_answered_in_order(fold_messages(journal))


async def test_a_steer_to_a_handler_that_never_looks_is_journaled_before_the_end(demo: DemoProvider) -> None:
    async def handler(ctx: SessionContext) -> None:
        await asyncio.sleep(0.1)

    rt = LocalRuntime(handler=handler, provider=demo)
    sid = await rt.create_session()
    task = asyncio.create_task(rt.send(sid, "go"))
    await asyncio.sleep(0.02)
    await rt.steer(sid, "hello?")
    outcome = await task
    assert types_of(rt.journal.read(sid)[-2:]) == ["STEER_RECEIVED", "INVOCATION_COMPLETED"]
    assert outcome.type is EventType.INVOCATION_COMPLETED


class ClosingProvider(DemoProvider):
    """Records whether its stream was closed (as an HTTP response must be). It keeps its
    streams referenced, so garbage collection cannot close them behind the runtime's back."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.closed = 0
        self.streams: list[AsyncIterator[StreamEvent]] = []

    def stream(self, request: CompletionRequest) -> AsyncIterator[StreamEvent]:
        async def events() -> AsyncIterator[StreamEvent]:
            try:
                async for event in DemoProvider.stream(self, request):
                    yield event
            finally:
                self.closed += 1

        stream = events()
        self.streams.append(stream)
        return stream


async def test_cancel_closes_the_providers_stream_at_once() -> None:
    provider = ClosingProvider(delay=0, slow_delay=SLOW_TICK)
    rt = LocalRuntime(provider=provider)
    sid = await rt.create_session()
    task = asyncio.create_task(rt.send(sid, "!slow 50"))
    await wait_for(lambda: "tick 2" in text_so_far(rt.journal, sid))
    await rt.cancel(sid)
    await task
    assert provider.closed == 1


async def test_a_journal_failure_mid_stream_closes_the_providers_stream() -> None:
    """The error comes from the consumer's side (the writer), not from inside the stream."""
    journal = MemoryJournal()
    provider = ClosingProvider(delay=0, slow_delay=SLOW_TICK)
    runtime = Runtime(journal, provider=provider)
    sid, invocation_id = await _runtime_session(journal, "!slow 50")
    journal.set_fence(sid, "lease-1")
    task = asyncio.create_task(runtime.run_invocation(sid, invocation_id, fence="lease-1"))
    await wait_for(lambda: "tick 2" in text_so_far(journal, sid))
    journal.set_fence(sid, "lease-2")
    with pytest.raises(LeaseLost):
        await task
    assert provider.closed == 1


async def test_recover_with_an_open_message_holding_tool_calls_answers_them_in_order(demo: DemoProvider) -> None:
    journal = MemoryJournal()
    sid, invocation_id = await _runtime_session(journal, "!tool ping {}")
    # the worker journaled the model's tool call and died before the message ended
    await journal.append(
        sid,
        [
            NewEvent(EventType.MESSAGE_START, {"message_id": "m1", "role": "assistant"}, invocation_id),
            NewEvent(
                EventType.TOOL_CALL,
                {"message_id": "m1", "tool_call_id": "c1", "name": "ping", "arguments": "{}"},
                invocation_id,
            ),
        ],
    )
    rt = LocalRuntime(provider=demo, journal=journal, tools=[ping])
    outcome = await rt.recover(sid)
    assert outcome.type is EventType.INVOCATION_COMPLETED
    envelopes = journal.read(sid)
    assert types_of(envelopes[5:10]) == [
        "MESSAGE_END",
        "SESSION_ERROR",
        "INVOCATION_STARTED",
        "TOOL_STARTED",
        "TOOL_RESULT",
    ]
    assert envelopes[5].payload == {"message_id": "m1", "finish_reason": "tool_calls"}
    assert "message_id" not in envelopes[6].payload
    messages = fold_messages(envelopes)
    assert PLEASE_CONTINUE not in [m.get("content") for m in messages]
    assert_tool_calls_answered_in_order(messages)
    assert final_text(rt, sid) == "ping returned: pong"


async def test_a_retryable_provider_error_after_a_tool_call_keeps_the_step() -> None:
    def script(request: CompletionRequest, n: int) -> list[Any]:
        if n == 1:
            return [ToolCallDelta("c1", "ping", "{}"), ProviderError("stream reset", retryable=True)]
        return say("ping said pong")

    provider = ScriptedProvider(script)
    rt = LocalRuntime(provider=provider, tools=TOOLS)
    sid = await rt.create_session()
    outcome = await rt.send(sid, "go")
    assert outcome.type is EventType.INVOCATION_COMPLETED
    journal = rt.journal.read(sid)
    assert of_type(journal, EventType.SESSION_ERROR) == []
    assert of_type(journal, EventType.MESSAGE_END)[0].payload["finish_reason"] == "tool_calls"
    assert [r.payload["content"] for r in of_type(journal, EventType.TOOL_RESULT)] == ["pong"]
    assert_tool_calls_answered_in_order(fold_messages(journal))
    assert final_text(rt, sid) == "ping said pong"


async def test_a_permanent_provider_error_after_a_tool_call_answers_the_orphan() -> None:
    def script(request: CompletionRequest, n: int) -> list[Any]:
        if n == 1:
            return [ToolCallDelta("c1", "ping", "{}"), ProviderError("content filter", retryable=False)]
        return say("fine")

    rt = LocalRuntime(provider=ScriptedProvider(script), tools=TOOLS)
    sid = await rt.create_session()
    outcome = await rt.send(sid, "go")
    assert outcome.type is EventType.INVOCATION_FAILED
    journal = rt.journal.read(sid)
    assert types_of(journal[-3:]) == ["MESSAGE_END", "TOOL_RESULT", "INVOCATION_FAILED"]
    assert journal[-2].payload == {
        "tool_call_id": "c1",
        "name": "ping",
        "content": FAILED_TOOL_CONTENT,
        "is_error": True,
    }
    await rt.send(sid, "again")
    assert_tool_calls_answered_in_order(messages_of(rt, sid))


async def test_a_handler_that_ends_or_fails_with_open_tool_calls_gets_them_answered(demo: DemoProvider) -> None:
    async def handler(ctx: SessionContext) -> None:
        async with ctx.message() as m:
            await m.tool_call(f"c_{ctx.invocation_id}", "ping", "{}")
        if ctx.input["content"] == "fail":
            raise RuntimeError("handler bug")

    rt = LocalRuntime(handler=handler, provider=demo, tools=TOOLS)
    sid = await rt.create_session()
    ended = await rt.send(sid, "end")
    assert ended.type is EventType.INVOCATION_COMPLETED
    failed = await rt.send(sid, "fail")
    assert failed.type is EventType.INVOCATION_FAILED
    contents = [r.payload["content"] for r in of_type(rt.journal.read(sid), EventType.TOOL_RESULT)]
    assert contents == [ENDED_TOOL_CONTENT, FAILED_TOOL_CONTENT]
    assert_tool_calls_answered_in_order(messages_of(rt, sid))


async def test_the_budget_caps_a_single_long_step(rt: LocalRuntime) -> None:
    sid = await rt.create_session(limits={"max_run_tokens": 30})
    outcome = await rt.send(sid, "!long 100")
    assert outcome.payload["stop_reason"] == "budget"
    (end,) = of_type(rt.journal.read(sid), EventType.MESSAGE_END)
    assert end.payload["finish_reason"] == "length"
    assert end.payload["usage"]["output_tokens"] <= 30
    # without a budget the same prompt runs to its end
    free = await rt.create_session()
    assert (await rt.send(free, "!long 100")).payload["stop_reason"] == "end_turn"


async def test_a_retried_steer_step_still_answers_the_steer() -> None:
    never = (10**6, ProviderError("unused", retryable=True))
    provider = FlakyDemo([never] + [(0, ProviderError("503", retryable=True))] * 3)
    rt = LocalRuntime(provider=provider)
    sid = await rt.create_session()
    task = asyncio.create_task(rt.send(sid, "!slow 6"))
    await wait_for(lambda: "tick 2" in text_so_far(rt.journal, sid))
    await rt.steer(sid, "turn around")
    failed = await task
    assert failed.type is EventType.INVOCATION_FAILED and failed.payload["retryable"] is True
    await rt.retry(sid)
    assert final_text(rt, sid) == "Steer received: turn around"


async def test_approval_arguments_are_stored_as_json(demo: DemoProvider) -> None:
    from datetime import UTC, datetime

    async def handler(ctx: SessionContext) -> None:
        ctx.request_approval("schedule", {"at": datetime(2030, 1, 2, tzinfo=UTC), "tags": ("a", "b")})

    rt = LocalRuntime(handler=handler, provider=demo)
    sid = await rt.create_session()
    await rt.send(sid, "go")
    (requested,) = of_type(rt.journal.read(sid), EventType.APPROVAL_REQUESTED)
    assert requested.payload["arguments"] == {"at": "2030-01-02 00:00:00+00:00", "tags": ["a", "b"]}
    assert json.loads(requested.to_json())["payload"]["arguments"]["tags"] == ["a", "b"]


async def test_an_invocation_that_cannot_start_fails_instead_of_hanging() -> None:
    class NoModels(DemoProvider):
        def model_info(self, model: str) -> Any:
            raise KeyError(model)

    rt = LocalRuntime(provider=NoModels(delay=0))
    sid = await rt.create_session()
    outcome = await rt.send(sid, "hello")
    assert outcome.type is EventType.INVOCATION_FAILED
    assert outcome.payload == {"error": "KeyError: 'demo'", "retryable": False}
    assert (await rt.state(sid)).status == "failed"


async def test_recover_after_the_final_answer_does_not_answer_again(demo: DemoProvider) -> None:
    """The worker died (or lost its lease) after the reply's MESSAGE_END and before the
    terminal event: the recovered run completes without calling the model again."""
    journal = MemoryJournal()

    async def answer_then_hang(ctx: SessionContext) -> None:
        await default_handler(ctx)
        await asyncio.sleep(3600)  # the terminal event is never written

    rt = LocalRuntime(handler=answer_then_hang, provider=demo, journal=journal)
    sid = await rt.create_session()
    await crash_when(rt.send(sid, "!slow 3"), lambda: bool(of_type(journal.read(sid), EventType.MESSAGE_END)))
    rt2 = LocalRuntime(provider=demo, journal=journal)  # another worker, the default handler
    outcome = await rt2.recover(sid)
    assert outcome.type is EventType.INVOCATION_COMPLETED
    assert len(of_type(journal.read(sid), EventType.MESSAGE_START)) == 1
    messages = messages_of(rt2, sid)
    assert [m["role"] for m in messages] == ["user", "assistant"]
    assert ticks(messages[1]["content"]) == [1, 2, 3]
    assert_one_terminal_per_invocation(journal.read(sid))


async def test_recover_after_a_tool_result_still_calls_the_model(demo: DemoProvider) -> None:
    """Only a final answer ends a recovery at once: after a tool result the model goes on."""
    journal = MemoryJournal()
    rt = LocalRuntime(provider=demo, journal=journal, tools=TOOLS)
    sid = await rt.create_session()
    await crash_when(
        rt.send(sid, '!tool nap {"seconds": 30}'), lambda: bool(of_type(journal.read(sid), EventType.TOOL_CALL))
    )
    outcome = await LocalRuntime(provider=demo, journal=journal, tools=[ping]).recover(sid)
    assert outcome.type is EventType.INVOCATION_COMPLETED
    assert len(of_type(journal.read(sid), EventType.MESSAGE_START)) == 2
