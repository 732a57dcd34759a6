"""An OpenAI Agents SDK agent inside a Sectr session (sectr.adapters.openai_agents),
offline: the agent's model is the SDK's chat completions model on an AsyncOpenAI client
pointed at the local scripted server (real HTTP and SSE), on a LocalRuntime."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from agents import Agent, OpenAIChatCompletionsModel, function_tool
from openai import AsyncOpenAI

from sectr import LocalRuntime
from sectr.adapters.openai_agents import handler, to_input_items
from sectr.events import EventType
from sectr.fold import fold_messages
from sectr.journal import MemoryJournal
from tests.openai_stub_server import (
    STUB_MODEL,
    OpenAIStubServer,
    SSEStream,
    echo_reply,
    text_stream,
    tool_call_stream,
)

from .conftest import assert_one_terminal_per_invocation, of_type, text_so_far, wait_for


def scripted(body: dict[str, Any]) -> SSEStream:
    """The model: answers from the last message of the request."""
    last = body["messages"][-1]
    if last["role"] == "tool":
        return text_stream(f"tool said: {last['content']}")
    prompt = str(last.get("content") or "")
    if prompt.startswith("add"):
        return tool_call_stream([("call_add", "add", '{"a": 2, "b": 3}')])
    if prompt.startswith("delete"):
        return tool_call_stream([("call_del", "delete_file", '{"path": "notes.txt"}')])
    if prompt.startswith("think"):
        return text_stream("Forty", "-two", reasoning=["Let me ", "think."], usage=(12, 7))
    if prompt.startswith("slow"):
        return text_stream(*[f"tick {n} " for n in range(1, 41)], chunk_delay=0.02)
    return echo_reply(body)


class Disk:
    def __init__(self) -> None:
        self.deleted: list[str] = []
        self.added: list[tuple[int, int]] = []


def make_agent(server: OpenAIStubServer, disk: Disk) -> Agent[Any]:
    @function_tool
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        disk.added.append((a, b))
        return a + b

    @function_tool(needs_approval=True)
    def delete_file(path: str) -> str:
        """Delete a file."""
        disk.deleted.append(path)
        return f"deleted {path}"

    client = AsyncOpenAI(base_url=server.base_url, api_key="test-key", max_retries=0)
    return Agent(
        name="helper",
        instructions="Be brief.",
        model=OpenAIChatCompletionsModel(model=STUB_MODEL, openai_client=client),
        tools=[add, delete_file],
    )


@pytest.fixture
def server() -> Iterator[OpenAIStubServer]:
    with OpenAIStubServer(fallback=scripted) as srv:
        yield srv


@pytest.fixture
def disk() -> Disk:
    return Disk()


@pytest.fixture
def rt(server: OpenAIStubServer, disk: Disk) -> LocalRuntime:
    return LocalRuntime(handler=handler(make_agent(server, disk)))


async def test_a_reply_streams_text_and_reasoning_as_deltas_with_usage_per_model(
    rt: LocalRuntime, server: OpenAIStubServer
) -> None:
    sid = await rt.create_session()
    outcome = await rt.send(sid, "think hard")
    assert outcome.type is EventType.INVOCATION_COMPLETED
    journal = rt.journal.read(sid)
    deltas = of_type(journal, EventType.MESSAGE_DELTA)
    assert [d.payload["reasoning"] for d in deltas if "reasoning" in d.payload] == ["Let me ", "think."]
    assert [d.payload["text"] for d in deltas if "text" in d.payload] == ["Forty", "-two"]
    (end,) = of_type(journal, EventType.MESSAGE_END)
    assert end.payload["model"] == STUB_MODEL
    assert end.payload["usage"] == {"input_tokens": 12, "output_tokens": 7}
    assert outcome.payload["usage"] == {"input_tokens": 12, "output_tokens": 7}
    (request,) = server.requests
    assert request["messages"][0] == {"role": "system", "content": "Be brief."}
    assert request["stream"] is True
    assert fold_messages(journal)[-1]["content"] == "Forty-two"


async def test_an_ordinary_tool_runs_through_sectr_and_its_result_reaches_the_model(
    rt: LocalRuntime, server: OpenAIStubServer, disk: Disk
) -> None:
    sid = await rt.create_session()
    assert (await rt.send(sid, "add them")).type is EventType.INVOCATION_COMPLETED
    journal = rt.journal.read(sid)
    (call,) = of_type(journal, EventType.TOOL_CALL)
    assert (call.payload["tool_call_id"], call.payload["name"]) == ("call_add", "add")
    (result,) = of_type(journal, EventType.TOOL_RESULT)
    assert result.payload == {"tool_call_id": "call_add", "name": "add", "content": "5"}
    assert disk.added == [(2, 3)]
    second = server.requests[1]["messages"]
    assert second[-1] == {"role": "tool", "tool_call_id": "call_add", "content": "5"}
    assert [t["function"]["name"] for t in server.requests[0]["tools"]] == ["add", "delete_file"]
    assert fold_messages(journal)[-1]["content"] == "tool said: 5"


async def test_a_needs_approval_tool_suspends_and_a_new_runtime_resumes_it_from_the_journal(
    server: OpenAIStubServer, disk: Disk
) -> None:
    journal = MemoryJournal()
    first = LocalRuntime(handler=handler(make_agent(server, disk)), journal=journal)
    sid = await first.create_session()
    suspended = await first.send(sid, "delete it")
    assert suspended.type is EventType.INVOCATION_SUSPENDED
    assert disk.deleted == []
    (ask,) = of_type(journal.read(sid), EventType.APPROVAL_REQUESTED)
    assert (ask.payload["name"], ask.payload["arguments"]) == ("delete_file", {"path": "notes.txt"})

    disk2 = Disk()
    second = LocalRuntime(handler=handler(make_agent(server, disk2)), journal=journal)
    done = await second.decide(sid, suspended.payload["ask_id"], "allow_once", approver="bob")
    assert done.type is EventType.INVOCATION_COMPLETED
    assert disk.deleted == [] and disk2.deleted == ["notes.txt"]
    resumed = server.requests[-1]["messages"]
    assert [m["role"] for m in resumed] == ["system", "user", "assistant", "tool"]
    assert resumed[-1] == {"role": "tool", "tool_call_id": "call_del", "content": "deleted notes.txt"}
    assert fold_messages(journal.read(sid))[-1]["content"] == "tool said: deleted notes.txt"
    assert_one_terminal_per_invocation(journal.read(sid))


async def test_a_denial_reaches_the_agent_which_answers_it(rt: LocalRuntime, disk: Disk) -> None:
    sid = await rt.create_session()
    suspended = await rt.send(sid, "delete it")
    done = await rt.decide(sid, suspended.payload["ask_id"], "deny", approver="bob", note="keep it")
    assert done.type is EventType.INVOCATION_COMPLETED
    assert disk.deleted == []
    (result,) = of_type(rt.journal.read(sid), EventType.TOOL_RESULT)
    assert result.payload["is_error"] is True
    assert fold_messages(rt.journal.read(sid))[-1]["content"] == "tool said: denied: bob denied this call (keep it)"


async def test_plan_mode_refuses_a_tool_not_declared_read_only(server: OpenAIStubServer, disk: Disk) -> None:
    rt = LocalRuntime(handler=handler(make_agent(server, disk)))
    sid = await rt.create_session(mode="plan")
    await rt.send(sid, "add them")
    assert disk.added == []
    reading = LocalRuntime(handler=handler(make_agent(server, disk), read_only=["add"]))
    sid = await reading.create_session(mode="plan")
    await reading.send(sid, "add them")
    assert disk.added == [(2, 3)]


async def test_a_steer_mid_stream_is_answered_at_the_step_boundary(rt: LocalRuntime, server: OpenAIStubServer) -> None:
    sid = await rt.create_session()
    task = asyncio.create_task(rt.send(sid, "slow please"))
    await wait_for(lambda: "tick 3" in text_so_far(rt.journal, sid))
    await rt.steer(sid, "go left", author="ann")
    assert (await task).type is EventType.INVOCATION_COMPLETED
    journal = rt.journal.read(sid)
    (steer,) = of_type(journal, EventType.STEER_RECEIVED)
    assert steer.seq > of_type(journal, EventType.MESSAGE_END)[0].seq
    assert "tick 40" in fold_messages(journal)[1]["content"]
    assert server.requests[-1]["messages"][-1] == {"role": "user", "content": "go left"}
    assert fold_messages(journal)[-1]["content"] == "You said: go left"


async def test_cancel_mid_stream_keeps_the_partial_message_and_stops(
    rt: LocalRuntime, server: OpenAIStubServer
) -> None:
    sid = await rt.create_session()
    task = asyncio.create_task(rt.send(sid, "slow please"))
    await wait_for(lambda: "tick 3" in text_so_far(rt.journal, sid))
    await rt.cancel(sid, by="ann")
    outcome = await asyncio.wait_for(task, 5)
    assert outcome.type is EventType.INVOCATION_CANCELLED
    end = rt.journal.read(sid)[-2]
    assert end.type is EventType.MESSAGE_END and end.payload["finish_reason"] == "cancelled"
    assert "tick 40" not in text_so_far(rt.journal, sid)
    assert len(server.requests) == 1


async def test_a_crash_mid_stream_is_recovered_with_nothing_lost_or_repeated(
    server: OpenAIStubServer, disk: Disk
) -> None:
    journal = MemoryJournal()
    rt = LocalRuntime(handler=handler(make_agent(server, disk)), journal=journal)
    sid = await rt.create_session()
    task = asyncio.create_task(rt.send(sid, "slow please"))
    await wait_for(lambda: "tick 3" in text_so_far(journal, sid))
    task.cancel()  # the worker dies: no terminal event
    with pytest.raises(asyncio.CancelledError):
        await task
    partial = text_so_far(journal, sid)
    recovered = LocalRuntime(handler=handler(make_agent(server, Disk())), journal=journal)
    assert (await recovered.recover(sid)).type is EventType.INVOCATION_COMPLETED
    assert text_so_far(journal, sid).startswith(partial)
    messages = server.requests[-1]["messages"]
    assert messages[-2] == {"role": "assistant", "content": partial}
    assert messages[-1] == {"role": "user", "content": "please continue"}


def test_the_fold_converts_to_responses_input_items() -> None:
    items = to_input_items(
        [
            {"role": "user", "content": [{"type": "text", "text": "look"}]},
            {
                "role": "assistant",
                "content": "ok",
                "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{}"}}],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "5"},
        ]
    )
    assert items == [
        {"role": "user", "content": [{"type": "input_text", "text": "look"}]},
        {"role": "assistant", "content": "ok"},
        {"type": "function_call", "call_id": "c1", "name": "add", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "5"},
    ]
    assert json.loads(json.dumps(items)) == items


async def test_the_run_token_budget_caps_each_step_and_stops_the_loop(server: OpenAIStubServer, disk: Disk) -> None:
    rt = LocalRuntime(handler=handler(make_agent(server, disk), read_only=["add"]))
    sid = await rt.create_session(limits={"max_run_tokens": 12})
    outcome = await rt.send(sid, "add them")
    assert outcome.payload["stop_reason"] == "budget"
    assert server.requests[0]["max_tokens"] == 12
    assert len(server.requests) == 1, "the tool step spent 15 tokens: no second step"
    assert disk.added == [(2, 3)]


async def test_a_needs_approval_function_asks_for_every_call(server: OpenAIStubServer) -> None:
    async def never(context: Any, arguments: dict[str, Any], call_id: str) -> bool:
        return False  # Sectr does not ask the function: it decides before the call, from the journal

    @function_tool(needs_approval=never)
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        return a + b

    client = AsyncOpenAI(base_url=server.base_url, api_key="test-key", max_retries=0)
    agent: Agent[Any] = Agent(
        name="adder", model=OpenAIChatCompletionsModel(model=STUB_MODEL, openai_client=client), tools=[add]
    )
    rt = LocalRuntime(handler=handler(agent))
    sid = await rt.create_session()
    assert (await rt.send(sid, "add them")).type is EventType.INVOCATION_SUSPENDED


async def test_an_agent_with_handoffs_is_refused_with_the_reason(server: OpenAIStubServer, disk: Disk) -> None:
    agent = make_agent(server, disk)
    agent.handoffs = [make_agent(server, disk)]
    rt = LocalRuntime(handler=handler(agent))
    sid = await rt.create_session()
    outcome = await rt.send(sid, "hello")
    assert outcome.type is EventType.INVOCATION_FAILED
    assert "handoffs" in str(outcome.payload)
    assert server.requests == []
