"""A PydanticAI agent inside a Sectr session (sectr.adapters.pydantic_ai), offline: the
agent's model is PydanticAI's FunctionModel (and TestModel), its tools are plain
PydanticAI tools, and everything runs on a LocalRuntime over a MemoryJournal."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from pydantic_ai import Agent, ModelRetry
from pydantic_ai.exceptions import ApprovalRequired
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    SystemPromptPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, DeltaThinkingPart, DeltaToolCall, FunctionModel
from pydantic_ai.models.test import TestModel

from sectr import LocalRuntime
from sectr.adapters.pydantic_ai import handler, to_model_messages
from sectr.events import EventType
from sectr.fold import fold_messages
from sectr.journal import MemoryJournal

from .conftest import assert_one_terminal_per_invocation, of_type, text_so_far, wait_for


def last_part(messages: list[ModelMessage]) -> Any:
    return messages[-1].parts[-1]


def user_texts(messages: list[ModelMessage]) -> list[str]:
    return [
        str(part.content)
        for message in messages
        if isinstance(message, ModelRequest)
        for part in message.parts
        if isinstance(part, UserPromptPart)
    ]


class Brain:
    """The agent's model: reads the history it is given and answers as scripted, and
    records every history it saw (what PydanticAI sent, after instructions)."""

    def __init__(self, delay: float = 0.0) -> None:
        self.seen: list[list[ModelMessage]] = []
        self.instructions: list[str | None] = []
        self.delay = delay

    async def stream(self, messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[Any]:
        self.seen.append(list(messages))
        self.instructions.append(info.instructions)
        last = last_part(messages)
        if isinstance(last, ToolReturnPart):
            yield f"{last.tool_name} said: {last.content}"
            return
        prompt = str(last.content)
        if prompt.startswith("add"):
            yield "Adding. "
            yield {1: DeltaToolCall(name="add", json_args='{"a": 2, ', tool_call_id="call_add")}
            yield {1: DeltaToolCall(json_args='"b": 3}')}
        elif prompt.startswith("delete"):
            yield {1: DeltaToolCall(name="delete_file", json_args='{"path": "notes.txt"}', tool_call_id="call_del")}
        elif prompt.startswith("think"):
            yield {0: DeltaThinkingPart(content="Let me ")}
            yield {0: DeltaThinkingPart(content="think.")}
            yield "Forty"
            yield "-two"
        elif prompt.startswith("slow"):
            for tick in range(1, 41):
                yield f"tick {tick} "
                await asyncio.sleep(self.delay)
        else:
            yield f"You said: {prompt}"


class Disk:
    """What the tools did, outside the journal: to count real runs."""

    def __init__(self) -> None:
        self.deleted: list[str] = []
        self.added: list[tuple[int, int]] = []


def make_agent(brain: Brain, disk: Disk) -> Agent[None, str]:
    agent: Agent[None, str] = Agent(FunctionModel(stream_function=brain.stream), instructions="Be brief.")

    @agent.tool_plain
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        disk.added.append((a, b))
        return a + b

    @agent.tool_plain(requires_approval=True)
    def delete_file(path: str) -> str:
        """Delete a file."""
        disk.deleted.append(path)
        return f"deleted {path}"

    return agent


@pytest.fixture
def brain() -> Brain:
    return Brain(delay=0.02)


@pytest.fixture
def disk() -> Disk:
    return Disk()


@pytest.fixture
def rt(brain: Brain, disk: Disk) -> LocalRuntime:
    return LocalRuntime(handler=handler(make_agent(brain, disk), read_only=["add"], idempotent=["add"]))


async def test_a_reply_streams_text_and_thinking_as_deltas_with_usage_per_model(rt: LocalRuntime) -> None:
    sid = await rt.create_session()
    outcome = await rt.send(sid, "think hard")
    assert outcome.type is EventType.INVOCATION_COMPLETED
    journal = rt.journal.read(sid)
    deltas = of_type(journal, EventType.MESSAGE_DELTA)
    assert [d.payload.get("reasoning") for d in deltas if "reasoning" in d.payload] == ["Let me ", "think."]
    assert [d.payload.get("text") for d in deltas if "text" in d.payload] == ["Forty", "-two"]
    (start,) = of_type(journal, EventType.MESSAGE_START)
    (end,) = of_type(journal, EventType.MESSAGE_END)
    assert start.payload["model"] == end.payload["model"] == "function::stream"
    assert end.payload["finish_reason"] == "stop"
    assert end.payload["usage"]["output_tokens"] > 0
    assert outcome.payload["usage"] == end.payload["usage"]
    assert fold_messages(journal)[-1] == {
        "role": "assistant",
        "content": "Forty-two",
        "reasoning_content": "Let me think.",
    }


async def test_the_agent_gets_the_journal_as_history_with_its_instructions(rt: LocalRuntime, brain: Brain) -> None:
    sid = await rt.create_session()
    await rt.send(sid, "hello")
    await rt.send(sid, "again")
    assert brain.instructions == ["Be brief.", "Be brief."]
    assert user_texts(brain.seen[-1]) == ["hello", "again"]
    assert [type(m).__name__ for m in brain.seen[-1]] == ["ModelRequest", "ModelResponse", "ModelRequest"]


async def test_an_ordinary_tool_runs_through_sectr_and_its_result_reaches_the_model(
    rt: LocalRuntime, brain: Brain, disk: Disk
) -> None:
    sid = await rt.create_session()
    outcome = await rt.send(sid, "add them")
    assert outcome.type is EventType.INVOCATION_COMPLETED
    journal = rt.journal.read(sid)
    (call,) = of_type(journal, EventType.TOOL_CALL)
    assert call.payload["name"] == "add" and json.loads(call.payload["arguments"]) == {"a": 2, "b": 3}
    (result,) = of_type(journal, EventType.TOOL_RESULT)
    assert result.payload == {"tool_call_id": call.payload["tool_call_id"], "name": "add", "content": "5"}
    assert disk.added == [(2, 3)]
    assert fold_messages(journal)[-1]["content"] == "add said: 5"
    assert not of_type(journal, EventType.TOOL_STARTED), "add is declared idempotent: no start marker"


async def test_a_tool_that_requires_approval_suspends_and_a_new_runtime_resumes_it_from_the_journal(
    brain: Brain, disk: Disk
) -> None:
    journal = MemoryJournal()
    first = LocalRuntime(handler=handler(make_agent(brain, disk)), journal=journal)
    sid = await first.create_session()
    suspended = await first.send(sid, "delete it")
    assert suspended.type is EventType.INVOCATION_SUSPENDED
    assert disk.deleted == []
    (ask,) = of_type(journal.read(sid), EventType.APPROVAL_REQUESTED)
    assert (ask.payload["name"], ask.payload["arguments"]) == ("delete_file", {"path": "notes.txt"})

    # Another process: a new agent object, a new model, a new runtime; only the journal is shared.
    brain2, disk2 = Brain(), Disk()
    second = LocalRuntime(handler=handler(make_agent(brain2, disk2)), journal=journal)
    done = await second.decide(sid, suspended.payload["ask_id"], "allow_once", approver="bob")
    assert done.type is EventType.INVOCATION_COMPLETED
    assert disk.deleted == [] and disk2.deleted == ["notes.txt"]
    envelopes = journal.read(sid)
    (result,) = of_type(envelopes, EventType.TOOL_RESULT)
    assert result.payload["content"] == "deleted notes.txt"
    # What the resumed model saw came from the journal: the user's turn, its call, the result.
    (history,) = brain2.seen
    assert user_texts(history) == ["delete it"]
    assert isinstance(last_part(history), ToolReturnPart)
    assert last_part(history).tool_call_id == ask.payload["tool_call_id"]
    assert fold_messages(envelopes)[-1]["content"] == "delete_file said: deleted notes.txt"
    assert_one_terminal_per_invocation(envelopes)


async def test_a_denial_reaches_the_agent_which_answers_it(rt: LocalRuntime, disk: Disk) -> None:
    sid = await rt.create_session()
    suspended = await rt.send(sid, "delete it")
    done = await rt.decide(sid, suspended.payload["ask_id"], "deny", approver="bob", note="keep it")
    assert done.type is EventType.INVOCATION_COMPLETED
    assert disk.deleted == []
    (result,) = of_type(rt.journal.read(sid), EventType.TOOL_RESULT)
    assert result.payload["is_error"] is True
    assert result.payload["content"] == "denied: bob denied this call (keep it)"
    assert fold_messages(rt.journal.read(sid))[-1]["content"] == (
        "delete_file said: denied: bob denied this call (keep it)"
    )


async def test_a_team_rule_and_plan_mode_apply_to_framework_tools(brain: Brain, disk: Disk) -> None:
    rt = LocalRuntime(
        handler=handler(make_agent(brain, disk)),
        rules=[{"id": "no-deletes", "tool": "delete_file", "action": "deny"}],
    )
    sid = await rt.create_session()
    done = await rt.send(sid, "delete it")
    assert done.type is EventType.INVOCATION_COMPLETED, "a rule decides at once: no pause"
    assert disk.deleted == []
    assert "denied" in of_type(rt.journal.read(sid), EventType.TOOL_RESULT)[0].payload["content"]

    planning = LocalRuntime(handler=handler(make_agent(brain, disk)))
    sid = await planning.create_session(mode="plan")
    await planning.send(sid, "add them")
    (refusal,) = of_type(planning.journal.read(sid), EventType.TOOL_RESULT)
    assert refusal.payload["content"].startswith("refused: add changes things")
    assert disk.added == [], "add is not declared read-only here"


async def test_a_steer_mid_stream_is_answered_at_the_step_boundary(rt: LocalRuntime, brain: Brain) -> None:
    sid = await rt.create_session()
    task = asyncio.create_task(rt.send(sid, "slow please"))
    await wait_for(lambda: "tick 3" in text_so_far(rt.journal, sid))
    await rt.steer(sid, "go left", author="ann")
    outcome = await task
    assert outcome.type is EventType.INVOCATION_COMPLETED
    journal = rt.journal.read(sid)
    (steer,) = of_type(journal, EventType.STEER_RECEIVED)
    first_end = of_type(journal, EventType.MESSAGE_END)[0]
    assert steer.seq > first_end.seq, "the steer must not interrupt the model step"
    assert "tick 40" in fold_messages(journal)[1]["content"]
    assert user_texts(brain.seen[-1]) == ["slow please", "go left"]
    assert fold_messages(journal)[-1]["content"] == "You said: go left"


async def test_cancel_mid_stream_keeps_the_partial_message_and_stops(rt: LocalRuntime, brain: Brain) -> None:
    sid = await rt.create_session()
    task = asyncio.create_task(rt.send(sid, "slow please"))
    await wait_for(lambda: "tick 3" in text_so_far(rt.journal, sid))
    await rt.cancel(sid, by="ann")
    outcome = await asyncio.wait_for(task, 5)
    assert outcome.type is EventType.INVOCATION_CANCELLED
    journal = rt.journal.read(sid)
    end = journal[-2]
    assert end.type is EventType.MESSAGE_END and end.payload["finish_reason"] == "cancelled"
    assert "tick 40" not in text_so_far(rt.journal, sid)
    assert len(brain.seen) == 1
    assert (await rt.send(sid, "hello")).type is EventType.INVOCATION_COMPLETED


async def test_max_turns_stops_the_loop_as_for_the_default_handler(brain: Brain, disk: Disk) -> None:
    rt = LocalRuntime(handler=handler(make_agent(brain, disk), read_only=["add"]))
    sid = await rt.create_session(limits={"max_turns": 1})
    outcome = await rt.send(sid, "add them")
    assert outcome.payload["stop_reason"] == "max_turns"
    assert len(brain.seen) == 1 and disk.added == [(2, 3)]


async def test_a_crash_mid_stream_is_recovered_with_nothing_lost_or_repeated(brain: Brain, disk: Disk) -> None:
    journal = MemoryJournal()
    rt = LocalRuntime(handler=handler(make_agent(brain, disk)), journal=journal)
    sid = await rt.create_session()
    task = asyncio.create_task(rt.send(sid, "slow please"))
    await wait_for(lambda: "tick 3" in text_so_far(journal, sid))
    task.cancel()  # the worker dies: no terminal event
    with pytest.raises(asyncio.CancelledError):
        await task
    partial = text_so_far(journal, sid)
    brain2 = Brain()
    recovered = LocalRuntime(handler=handler(make_agent(brain2, Disk())), journal=journal)
    outcome = await recovered.recover(sid)
    assert outcome.type is EventType.INVOCATION_COMPLETED
    # The partial message stays as it was and the model is asked to continue it.
    assert text_so_far(journal, sid).startswith(partial)
    (history,) = brain2.seen
    assert user_texts(history) == ["slow please", "please continue"]
    assert history[1].parts[-1].content == partial  # type: ignore[union-attr]


async def test_testmodel_runs_with_its_tool() -> None:
    calls: list[str] = []
    agent: Agent[None, str] = Agent(TestModel(call_tools=["ping"]))

    @agent.tool_plain
    def ping() -> str:
        calls.append("ping")
        return "pong"

    rt = LocalRuntime(handler=handler(agent))
    sid = await rt.create_session()
    assert (await rt.send(sid, "one")).type is EventType.INVOCATION_COMPLETED
    journal = rt.journal.read(sid)
    assert [e.payload["content"] for e in of_type(journal, EventType.TOOL_RESULT)] == ["pong"]
    assert calls == ["ping"]
    assert "pong" in fold_messages(journal)[-1]["content"]


async def test_a_model_that_repeats_a_call_id_gets_a_fresh_one(rt: LocalRuntime, disk: Disk) -> None:
    sid = await rt.create_session()
    await rt.send(sid, "add them")
    await rt.send(sid, "add again")
    journal = rt.journal.read(sid)
    ids = [e.payload["tool_call_id"] for e in of_type(journal, EventType.TOOL_CALL)]
    assert ids[0] == "call_add" and len(ids) == 2 and ids[1] != "call_add"
    assert [e.payload["tool_call_id"] for e in of_type(journal, EventType.TOOL_RESULT)] == ids
    assert disk.added == [(2, 3), (2, 3)]
    assert_one_terminal_per_invocation(journal)


def test_the_fold_converts_to_pydantic_ai_messages() -> None:
    history = to_model_messages(
        [
            {"role": "system", "content": "rules"},
            {"role": "user", "content": [{"type": "text", "text": "look"}]},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{}"}}],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "5"},
        ]
    )
    first, second, third = history
    assert isinstance(first.parts[0], SystemPromptPart) and first.parts[1].content == ["look"]  # type: ignore[union-attr]
    assert second.parts[0].tool_name == "add"  # type: ignore[union-attr]
    assert third.parts[0].tool_name == "add" and third.parts[0].content == "5"  # type: ignore[union-attr]


async def test_the_run_token_budget_caps_each_step_and_stops_the_loop(disk: Disk) -> None:
    settings_seen: list[Any] = []

    async def stream(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[Any]:
        settings_seen.append(info.model_settings)
        yield {1: DeltaToolCall(name="add", json_args='{"a": 1, "b": 1}', tool_call_id="call_1")}

    agent: Agent[None, str] = Agent(FunctionModel(stream_function=stream))

    @agent.tool_plain
    def add(a: int, b: int) -> int:
        disk.added.append((a, b))
        return a + b

    rt = LocalRuntime(handler=handler(agent))
    sid = await rt.create_session(limits={"max_run_tokens": 80})
    outcome = await rt.send(sid, "add")
    assert outcome.payload["stop_reason"] == "budget"
    first_end = of_type(rt.journal.read(sid), EventType.MESSAGE_END)[0]
    spent = first_end.payload["usage"]["input_tokens"] + first_end.payload["usage"]["output_tokens"]
    assert 0 < spent < 80
    # each step may use what is left of the budget; the run stops once it is spent
    assert [s["max_tokens"] for s in settings_seen] == [80, 80 - spent]
    assert len(disk.added) == 2


async def test_model_retry_and_an_approval_raised_in_a_tool_body_become_error_results() -> None:
    async def stream(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[Any]:
        if isinstance(last_part(messages), ToolReturnPart):
            yield "ok"
            return
        yield {1: DeltaToolCall(name="picky", json_args="{}", tool_call_id="call_p")}
        yield {2: DeltaToolCall(name="shy", json_args="{}", tool_call_id="call_s")}

    agent: Agent[None, str] = Agent(FunctionModel(stream_function=stream))

    @agent.tool_plain
    def picky() -> str:
        raise ModelRetry("give me a number")

    @agent.tool_plain
    def shy() -> str:
        raise ApprovalRequired()

    rt = LocalRuntime(handler=handler(agent))
    sid = await rt.create_session()
    assert (await rt.send(sid, "go")).type is EventType.INVOCATION_COMPLETED
    results = {e.payload["name"]: e.payload for e in of_type(rt.journal.read(sid), EventType.TOOL_RESULT)}
    assert results["picky"]["is_error"] and "give me a number" in results["picky"]["content"]
    assert results["shy"]["is_error"] and "requires_approval=True" in results["shy"]["content"]
