"""Agents in the core (docs/agents.md): the frozen AgentSpec a session pins, its
instructions as the first system message of every model call, only its tools offered and
run, its defaults for new sessions, handlers by name, and the checks of a definition."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from sectr import LocalRuntime, SessionContext
from sectr.agent import default_handler
from sectr.agent_definitions import check_agent_definition
from sectr.agents import DEFAULT_AGENT, TOOL_NOT_AVAILABLE, AgentSpec
from sectr.errors import SessionBusy, ValidationFailed
from sectr.events import EventType
from sectr.operations import agent_moved_events
from sectr.providers.base import CompletionRequest, StreamEvent
from sectr.providers.demo import DemoProvider
from sectr.state import project

from .conftest import final_text, messages_of, of_type

RELEASE = AgentSpec(
    id="agt_release",
    slug="release",
    name="Release assistant",
    team="platform",
    version=3,
    instructions="You help ship releases. Answer briefly.",
    tools=("get_time", "*_note"),
    mode="accept_edits",
    model="demo-large",
    limits={"max_turns": 7, "max_tool_calls": 9, "max_consecutive_failures": 2, "max_run_tokens": 0},
)


class RecordingProvider(DemoProvider):
    """The demo model, keeping every request it was sent."""

    def __init__(self) -> None:
        super().__init__(delay=0, slow_delay=0.01)
        self.requests: list[CompletionRequest] = []

    async def stream(self, request: CompletionRequest) -> AsyncIterator[StreamEvent]:
        self.requests.append(request)
        async for event in super().stream(request):
            yield event


async def test_the_instructions_reach_the_model_as_its_first_system_message() -> None:
    rt = LocalRuntime(agent=RELEASE, provider=DemoProvider(delay=0))
    sid = await rt.create_session()
    await rt.send(sid, "!system")
    assert final_text(rt, sid) == "system: You help ship releases. Answer briefly."


async def test_without_an_agent_the_model_gets_no_system_message() -> None:
    rt = LocalRuntime(provider=DemoProvider(delay=0))
    sid = await rt.create_session()
    await rt.send(sid, "!system")
    assert final_text(rt, sid) == "system: (none)"


async def test_the_instructions_are_sent_on_every_model_call_but_never_journaled() -> None:
    provider = RecordingProvider()
    rt = LocalRuntime(agent=RELEASE, provider=provider)
    sid = await rt.create_session()
    await rt.send(sid, "what time is it")  # a tool call, then the answer: two model calls
    assert len(provider.requests) == 2
    for request in provider.requests:
        assert request.messages[0] == {"role": "system", "content": RELEASE.instructions}
        assert [m["role"] for m in request.messages].count("system") == 1
    assert all(RELEASE.instructions not in repr(e.payload) for e in rt.journal.read(sid))
    assert all(m["role"] != "system" for m in messages_of(rt, sid))  # ctx.messages is the fold


async def test_only_the_agents_tools_are_offered() -> None:
    rt = LocalRuntime(agent=RELEASE, provider=DemoProvider(delay=0))
    sid = await rt.create_session()
    await rt.send(sid, "!offered")
    assert final_text(rt, sid) == "tools: delete_note, get_time, write_note"


async def test_the_default_agent_offers_every_tool_of_the_runtime() -> None:
    rt = LocalRuntime(provider=DemoProvider(delay=0))
    sid = await rt.create_session()
    await rt.send(sid, "!offered")
    assert final_text(rt, sid) == "tools: calculator, delete_note, get_time, write_note"


async def test_a_call_to_a_tool_outside_the_agent_gets_an_error_result_and_the_run_goes_on() -> None:
    rt = LocalRuntime(agent=RELEASE, provider=DemoProvider(delay=0))
    sid = await rt.create_session()
    outcome = await rt.send(sid, '!tool calculator {"expression": "6*7"}')
    assert outcome.type is EventType.INVOCATION_COMPLETED
    [result] = of_type(rt.journal.read(sid), EventType.TOOL_RESULT)
    assert result.payload == {
        "tool_call_id": result.payload["tool_call_id"],
        "name": "calculator",
        "content": TOOL_NOT_AVAILABLE,
        "is_error": True,
    }


async def test_an_unknown_tool_is_still_reported_as_unknown() -> None:
    rt = LocalRuntime(agent=RELEASE, provider=DemoProvider(delay=0))
    sid = await rt.create_session()
    await rt.send(sid, "!tool no_such_tool {}")
    [result] = of_type(rt.journal.read(sid), EventType.TOOL_RESULT)
    assert result.payload["content"] == "Error: unknown tool: no_such_tool"


async def test_a_handler_cannot_execute_a_tool_outside_its_agent() -> None:
    seen: list[str] = []

    async def handler(ctx: SessionContext) -> None:
        try:
            await ctx.aexecute("calculator", expression="1+1")
        except LookupError as exc:
            seen.append(str(exc))
        seen.append((await ctx.aexecute("get_time")).content[:4])

    rt = LocalRuntime(handler=handler, agent=RELEASE, provider=DemoProvider(delay=0))
    sid = await rt.create_session()
    await rt.send(sid, "hi")
    assert seen[0] == f"{TOOL_NOT_AVAILABLE}: calculator"
    assert seen[1].isdigit()  # get_time is offered: it ran


async def test_a_new_session_pins_the_agent_and_takes_its_defaults() -> None:
    rt = LocalRuntime(agent=RELEASE, provider=DemoProvider(delay=0))
    sid = await rt.create_session()
    created = rt.journal.read(sid)[0]
    assert created.payload["agent"] == {"id": "agt_release", "slug": "release", "team": "platform", "version": 3}
    state = await rt.state(sid)
    assert state.agent == created.payload["agent"]
    assert (state.mode, state.model) == ("accept_edits", "demo-large")
    assert state.limits["max_turns"] == 7


async def test_what_the_caller_gives_wins_over_the_agents_defaults() -> None:
    rt = LocalRuntime(agent=RELEASE, provider=DemoProvider(delay=0))
    sid = await rt.create_session(mode="plan", model="other", limits={"max_turns": 1})
    state = await rt.state(sid)
    assert (state.mode, state.model, state.limits["max_turns"]) == ("plan", "other", 1)


async def test_the_builtin_agent_pins_nothing() -> None:
    rt = LocalRuntime(provider=DemoProvider(delay=0))
    sid = await rt.create_session()
    assert "agent" not in rt.journal.read(sid)[0].payload
    assert (await rt.state(sid)).agent is None


async def test_fork_and_clear_keep_the_pin() -> None:
    rt = LocalRuntime(agent=RELEASE, provider=DemoProvider(delay=0))
    sid = await rt.create_session()
    await rt.send(sid, "hello")
    fork = await rt.fork(sid)
    cleared = await rt.clear(sid)
    pin = RELEASE.pin
    assert (await rt.state(fork)).agent == pin
    assert (await rt.state(cleared)).agent == pin


async def test_moving_the_pin_is_one_journaled_update_between_runs() -> None:
    rt = LocalRuntime(agent=RELEASE, provider=DemoProvider(delay=0.0, slow_delay=0.05))
    sid = await rt.create_session()
    moved = {**RELEASE.pin, "version": 4}
    state = await rt.state(sid)
    [event] = agent_moved_events(state, moved)
    assert event.type is EventType.SESSION_UPDATED and event.payload == {"agent": moved}
    await rt.journal.append(sid, [event])
    assert (await rt.state(sid)).agent == moved
    # the projection rebuilt from the journal alone says the same
    assert project(rt.journal.read(sid)).agent == moved
    state.status = "running"
    with pytest.raises(SessionBusy):
        agent_moved_events(state, moved)


async def test_an_agent_names_its_handler() -> None:
    calls: list[str] = []

    async def triage(ctx: SessionContext) -> None:
        calls.append(ctx.agent.slug)
        await default_handler(ctx)

    agent = AgentSpec(slug="triage", handler="triage")
    rt = LocalRuntime(agent=agent, handlers={"triage": triage}, provider=DemoProvider(delay=0))
    sid = await rt.create_session()
    await rt.send(sid, "hi")
    assert calls == ["triage"]
    assert final_text(rt, sid) == "You said: hi"


async def test_an_unregistered_handler_fails_the_run_with_a_clear_error() -> None:
    rt = LocalRuntime(agent=AgentSpec(slug="x", handler="missing"), provider=DemoProvider(delay=0))
    sid = await rt.create_session()
    outcome = await rt.send(sid, "hi")
    assert outcome.type is EventType.INVOCATION_FAILED
    assert "names the handler 'missing', which is not registered" in outcome.payload["error"]
    assert outcome.payload["retryable"] is False


async def test_the_agents_params_reach_the_model_request() -> None:
    provider = RecordingProvider()
    agent = AgentSpec(slug="p", params={"temperature": 0.2, "max_output_tokens": 3, "reasoning_effort": "low"})
    rt = LocalRuntime(agent=agent, provider=provider)
    sid = await rt.create_session()
    await rt.send(sid, "!long 10")
    [request] = provider.requests
    assert (request.temperature, request.max_output_tokens, request.reasoning_effort) == (0.2, 3, "low")
    assert final_text(rt, sid).split() == ["lorem", "ipsum", "dolor"]  # cut at 3 tokens


def test_a_spec_is_frozen_all_the_way_down() -> None:
    spec = AgentSpec(params={"temperature": 1.0}, limits={"max_turns": 2}, tools=["a"])  # type: ignore[arg-type]
    assert spec.tools == ("a",)
    with pytest.raises(TypeError):
        spec.params["temperature"] = 2.0  # type: ignore[index]
    with pytest.raises(TypeError):
        spec.limits["max_turns"] = 3  # type: ignore[index]
    assert AgentSpec.from_dict(RELEASE.to_dict()) == RELEASE
    assert DEFAULT_AGENT.tools is None and DEFAULT_AGENT.instructions == ""


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("name", "", "name is required"),
        ("name", "x" * 121, "longer than 120"),
        ("instructions", 5, "instructions must be text"),
        ("instructions", "a\x00b", "NUL"),
        ("tools", "get_time", "list of tool names"),
        ("tools", ["get time"], "is not a tool name or glob"),
        ("params", {"top_k": 3}, "unknown params: top_k"),
        ("params", {"temperature": 3}, "temperature must be a number from 0 to 2"),
        ("params", {"max_output_tokens": 0}, "max_output_tokens"),
        ("mode", "yolo", "mode must be one of"),
        ("limits", {"max_turns": -1}, "limits.max_turns"),
        ("handler", "a b", "handler must be the name"),
    ],
)
def test_a_bad_definition_is_refused_naming_the_field(field: str, value: Any, words: str) -> None:
    definition: dict[str, Any] = {"name": "Release", field: value}
    with pytest.raises(ValidationFailed, match=words):
        check_agent_definition(definition)


def test_a_good_definition_is_normalised() -> None:
    checked = check_agent_definition(
        {"name": " Release ", "tools": ["get_time", "get_time", "git__*"], "params": {"temperature": 1}, "mode": ""}
    )
    assert checked["name"] == "Release"
    assert checked["tools"] == ("get_time", "git__*")
    assert checked["params"] == {"temperature": 1.0}
    assert checked["mode"] is None and checked["handler"] == "default" and checked["limits"] is None
