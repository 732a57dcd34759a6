"""Replay (sectr.replay): a session's user turns run again on another agent, its tool
calls answered from the source's journal, never asking, never touching a real system."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sectr import LocalRuntime, tool
from sectr.events import Envelope, EventType
from sectr.journal import MemoryJournal
from sectr.payloads import InvalidEvent, check_event
from sectr.providers import DemoProvider
from sectr.providers.base import CompletionRequest
from sectr.replay import DIVERGED, REPLAY_STOPPED, recorded_turns
from sectr.tools import ToolOutput

from .conftest import ScriptedProvider, call, say


def file_tools(folder: Path) -> list[Any]:
    reads: list[str] = []

    @tool(gated=True, mutating=True)
    def write_file(path: str, text: str) -> str:
        """Write a file."""
        (folder / path).write_text(text)
        return f"wrote {len(text)} bytes to {path}"

    @tool
    def read_clock() -> str:
        """The time."""
        reads.append("read")
        return f"tick {len(reads)}"

    return [write_file, read_clock]


def of(envelopes: list[Envelope], kind: EventType) -> list[dict[str, Any]]:
    return [e.payload for e in envelopes if e.type is kind]


async def recorded_source(rt: LocalRuntime, folder: Path, *, approve: bool) -> str:
    source = await rt.create_session()
    args = json.dumps({"path": "out.txt", "text": "hello"})
    await rt.send(source, f"!tool write_file {args}")
    ask = (await rt.state(source)).pending_ask
    assert ask is not None
    verdict = "allow_once" if approve else "deny"
    await rt.decide(source, ask["ask_id"], verdict, approver="bob", note=None if approve else "not today")
    await rt.send(source, "thanks")
    return source


@pytest.mark.parametrize("approve", [True, False])
async def test_a_recorded_call_is_answered_from_the_journal_and_nothing_runs_or_asks(
    tmp_path: Path, approve: bool
) -> None:
    journal = MemoryJournal()
    rt = LocalRuntime(tools=file_tools(tmp_path), journal=journal, provider=DemoProvider())
    source = await recorded_source(rt, tmp_path, approve=approve)
    assert (tmp_path / "out.txt").exists() is approve
    (tmp_path / "out.txt").unlink(missing_ok=True)

    replay = await rt.replay(source)

    replayed = journal.read(replay)
    recorded = journal.read(source)
    assert not of(replayed, EventType.APPROVAL_REQUESTED)  # a replay never asks
    assert not (tmp_path / "out.txt").exists()  # and never runs the recorded call
    (recorded_result,) = of(recorded, EventType.TOOL_RESULT)
    (replayed_result,) = of(replayed, EventType.TOOL_RESULT)
    assert replayed_result["content"] == recorded_result["content"]
    assert bool(replayed_result.get("is_error")) is (not approve)
    if not approve:
        assert "not today" in replayed_result["content"]
    # Both user turns were given, in order, and the replay says where it came from.
    users = [p["reason"]["input"]["content"] for p in of(replayed, EventType.INVOCATION_STARTED)]
    assert users == [turn.content for turn in recorded_turns(recorded)]
    state = await rt.state(replay)
    assert state.replay == {"source": source, "live_reads": False, "turns": 2, "diverged": None}


def scripted(*turns: list[Any]) -> ScriptedProvider:
    answers = list(turns)

    def script(request: CompletionRequest, n: int) -> list[Any]:
        return answers[n - 1] if n <= len(answers) else say("done")

    return ScriptedProvider(script)


async def test_another_call_is_a_divergence_that_runs_nothing_and_stops_the_replay(tmp_path: Path) -> None:
    journal = MemoryJournal()
    tools = file_tools(tmp_path)
    wrote_a = json.dumps({"path": "a.txt", "text": "A"})
    source_rt = LocalRuntime(
        tools=tools,
        journal=journal,
        provider=scripted(call("write_file", wrote_a, call_id="c1"), say("written"), say("bye")),
    )
    source = await source_rt.create_session()
    await source_rt.send(source, "write a")
    ask = (await source_rt.state(source)).pending_ask
    assert ask is not None
    await source_rt.decide(source, ask["ask_id"], "allow_once", approver="bob")
    await source_rt.send(source, "and goodbye")
    (tmp_path / "a.txt").unlink()

    wrote_b = json.dumps({"path": "b.txt", "text": "B"})
    candidate = LocalRuntime(tools=tools, journal=journal, provider=scripted(call("write_file", wrote_b, call_id="x1")))
    replay = await candidate.replay(source)

    assert not (tmp_path / "b.txt").exists() and not (tmp_path / "a.txt").exists()
    replayed = journal.read(replay)
    ends = of(replayed, EventType.INVOCATION_COMPLETED)
    assert ends[0]["stop_reason"] == DIVERGED
    assert ends[0]["divergence"] == {"name": "write_file", "arguments": {"path": "b.txt", "text": "B"}, "turn": 1}
    assert len(ends) == 1  # LocalRuntime.replay stops there
    # The unrun call still has a result, so the transcript stays valid for the model.
    (result,) = of(replayed, EventType.TOOL_RESULT)
    assert result["tool_call_id"] == "x1" and result["is_error"]
    state = await candidate.state(replay)
    assert state.replay is not None and state.replay["diverged"]["name"] == "write_file"
    # A later turn given anyway (the server queues every turn up front) ends at once.
    end = await candidate.send(replay, "and goodbye")
    assert end.payload["stop_reason"] == REPLAY_STOPPED
    assert len(candidate.runtime.provider.requests) == 1  # type: ignore[attr-defined]


async def test_read_only_tools_run_live_only_when_the_replay_allows_it(tmp_path: Path) -> None:
    journal = MemoryJournal()
    tools = file_tools(tmp_path)
    source_rt = LocalRuntime(tools=tools, journal=journal, provider=scripted(say("hi")))
    source = await source_rt.create_session()
    await source_rt.send(source, "what time is it?")

    def candidate() -> LocalRuntime:
        provider = scripted(call("read_clock", "{}", call_id="r1"), say("it is tick 1"))
        return LocalRuntime(tools=tools, journal=journal, provider=provider)

    strict = await candidate().replay(source)
    assert of(journal.read(strict), EventType.INVOCATION_COMPLETED)[0]["stop_reason"] == DIVERGED
    live = await candidate().replay(source, live_reads=True)
    (result,) = of(journal.read(live), EventType.TOOL_RESULT)
    assert result["content"] == "tick 1" and not result.get("is_error")
    assert of(journal.read(live), EventType.INVOCATION_COMPLETED)[0]["stop_reason"] == "end_turn"


async def test_each_recorded_call_answers_once_in_any_order_within_its_turn(tmp_path: Path) -> None:
    journal = MemoryJournal()
    tools = file_tools(tmp_path)
    one, two = json.dumps({"path": "1", "text": "x"}), json.dumps({"path": "2", "text": "y"})
    source_rt = LocalRuntime(
        tools=tools,
        journal=journal,
        rules=[{"tool": "write_file", "action": "allow"}],
        provider=scripted(call("write_file", one, call_id="a"), call("write_file", two, call_id="b"), say("ok")),
    )
    source = await source_rt.create_session()
    await source_rt.send(source, "write both")
    for name in ("1", "2"):
        (tmp_path / name).unlink()

    # The candidate writes them the other way round, then tries the first again.
    candidate = LocalRuntime(
        tools=tools,
        journal=journal,
        provider=scripted(
            call("write_file", two, call_id="b2"),
            call("write_file", one, call_id="a2"),
            call("write_file", one, call_id="a3"),
        ),
    )
    replay = await candidate.replay(source)
    results = of(journal.read(replay), EventType.TOOL_RESULT)
    assert [r["content"] for r in results[:2]] == ["wrote 1 bytes to 2", "wrote 1 bytes to 1"]
    end = of(journal.read(replay), EventType.INVOCATION_COMPLETED)[0]
    assert end["stop_reason"] == DIVERGED and end["divergence"]["arguments"] == {"path": "1", "text": "x"}
    assert not list(tmp_path.iterdir())


def test_the_created_event_checks_its_replay() -> None:
    base = {"mode": "default", "model": "demo", "limits": {}}
    check_event(EventType.SESSION_CREATED, {**base, "replay": {"source": "s1", "live_reads": True}})
    for bad in ("s1", {"source": ""}, {"source": "s1", "live_reads": "yes"}):
        with pytest.raises(InvalidEvent):
            check_event(EventType.SESSION_CREATED, {**base, "replay": bad})


async def test_a_recorded_results_media_are_journaled_on_the_replay_too() -> None:
    """A tool whose result carried media (an MCP image, say): the replay's TOOL_RESULT
    holds the same references, and the tool is not run again."""
    runs: list[str] = []
    ref = {"ref": "sectr-media://" + "ab" * 32, "kind": "image", "mime_type": "image/png", "bytes": 67}

    @tool
    def snapshot() -> ToolOutput:
        """A picture."""
        runs.append("ran")
        return ToolOutput("[image image/png, 67 bytes]", [ref])

    journal = MemoryJournal()
    rt = LocalRuntime(tools=[snapshot], journal=journal, provider=DemoProvider())
    source = await rt.create_session()
    await rt.send(source, "!tool snapshot {}")
    replay = await rt.replay(source)
    (recorded,) = of(journal.read(source), EventType.TOOL_RESULT)
    (replayed,) = of(journal.read(replay), EventType.TOOL_RESULT)
    assert recorded["media"] == [ref] and replayed["media"] == [ref]
    assert replayed["content"] == recorded["content"] and runs == ["ran"]
