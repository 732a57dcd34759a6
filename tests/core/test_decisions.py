"""More verdicts on an ask: allow_once with edited arguments, and respond (a person's
answer instead of running the call), on LocalRuntime and the demo model."""

from __future__ import annotations

import json
from typing import Any

import pytest

from sectr import LocalRuntime
from sectr.errors import AskNotPending, ValidationFailed
from sectr.events import RESPONSE_MAX, Envelope, EventType
from sectr.fold import fold_messages
from sectr.payloads import InvalidEvent, check_decision
from sectr.providers import DemoProvider

E = EventType


def tool_prompt(name: str, **arguments: Any) -> str:
    return f"!tool {name} {json.dumps(arguments)}"


def runtime(rules: Any = None) -> LocalRuntime:
    return LocalRuntime(provider=DemoProvider(delay=0), rules=rules)


def of_type(rt: LocalRuntime, session_id: str, kind: EventType) -> list[Envelope]:
    return [e for e in rt.journal.read(session_id) if e.type is kind]


def tool_results(rt: LocalRuntime, session_id: str) -> list[dict[str, Any]]:
    return [m for m in fold_messages(rt.journal.read(session_id)) if m["role"] == "tool"]


async def asked(rt: LocalRuntime, **arguments: Any) -> tuple[str, str]:
    sid = await rt.create_session()
    outcome = await rt.send(sid, tool_prompt("write_note", **arguments))
    assert outcome.type is E.INVOCATION_SUSPENDED
    return sid, outcome.payload["ask_id"]


async def test_an_edited_call_runs_with_the_edited_arguments_and_says_so() -> None:
    rt = runtime()
    sid, ask_id = await asked(rt, title="a", body="asked")
    outcome = await rt.decide(sid, ask_id, "allow_once", approver="bob", arguments={"title": "a", "body": "edited ✓"})
    assert outcome.type is E.INVOCATION_COMPLETED
    state = await rt.state(sid)
    assert state.notes == {"a": "edited ✓"}  # what ran, not what was asked
    (requested,) = of_type(rt, sid, E.APPROVAL_REQUESTED)
    assert requested.payload["arguments"] == {"title": "a", "body": "asked"}  # the journal keeps both
    decision = state.asks[ask_id]
    assert (decision["status"], decision["verdict"], decision["approver"]) == ("approved", "allow_once", "bob")
    start = [e for e in of_type(rt, sid, E.INVOCATION_STARTED) if e.payload["reason"]["kind"] == "approval_decision"]
    assert start[0].payload["reason"]["decision"]["arguments"] == {"title": "a", "body": "edited ✓"}
    (result,) = tool_results(rt, sid)
    # keys sorted: the same text whichever database kept the decision (jsonb reorders keys)
    assert result["content"].startswith('(arguments edited by bob: {"body": "edited ✓", "title": "a"})\n')
    assert result["content"].endswith("saved note 'a' (created)")


async def test_edited_arguments_the_tool_refuses_are_an_error_result_that_says_they_were_edited() -> None:
    rt = runtime()
    sid, ask_id = await asked(rt, title="a", body="b")
    outcome = await rt.decide(sid, ask_id, "allow_once", approver="bob", arguments={"nope": 1})
    assert outcome.type is E.INVOCATION_COMPLETED
    (result,) = [e.payload for e in of_type(rt, sid, E.TOOL_RESULT)]
    assert result["is_error"] is True
    assert result["content"].startswith('(arguments edited by bob: {"nope": 1})\nError: ')
    assert (await rt.state(sid)).notes == {}


async def test_respond_answers_the_call_with_the_persons_text_without_running_it() -> None:
    rt = runtime()
    sid, ask_id = await asked(rt, title="a", body="b")
    outcome = await rt.decide(sid, ask_id, "respond", approver="ann", result="Use the wiki page instead.")
    assert outcome.type is E.INVOCATION_COMPLETED
    state = await rt.state(sid)
    assert state.notes == {}  # the tool never ran
    assert not of_type(rt, sid, E.TOOL_STARTED)
    (result,) = [e.payload for e in of_type(rt, sid, E.TOOL_RESULT)]
    assert "is_error" not in result
    assert result["content"] == "(answered by ann instead of running write_note) Use the wiki page instead."
    ask = state.asks[ask_id]
    assert (ask["status"], ask["verdict"], ask["approver"]) == ("denied", "respond", "ann")
    assert state.grants == []


@pytest.mark.parametrize(
    ("verdict", "options", "code"),
    [
        ("respond", {}, "invalid_result"),
        ("respond", {"result": "   "}, "invalid_result"),
        ("respond", {"result": "x" * (RESPONSE_MAX + 1)}, "invalid_result"),
        ("deny", {"result": "x"}, "invalid_result"),
        ("allow_always", {"arguments": {"title": "a"}}, "invalid_arguments"),
        ("deny", {"arguments": {"title": "a"}}, "invalid_arguments"),
        ("allow_once", {"arguments": ["a"]}, "invalid_arguments"),
        ("allow_once", {"arguments": {"x": float("nan")}}, "invalid_arguments"),
        ("respond", {"result": "x", "scope": "turn"}, "invalid_scope"),
    ],
)
async def test_a_bad_edit_or_response_is_refused_and_changes_nothing(
    verdict: str, options: dict[str, Any], code: str
) -> None:
    rt = runtime()
    sid, ask_id = await asked(rt, title="a", body="b")
    before = len(rt.journal.read(sid))
    with pytest.raises(ValidationFailed) as refused:
        await rt.decide(sid, ask_id, verdict, approver="bob", **options)
    assert refused.value.code == code
    assert len(rt.journal.read(sid)) == before
    assert (await rt.state(sid)).pending_ask is not None


@pytest.mark.parametrize(
    ("verdict", "options"), [("allow_once", {"arguments": {"title": "a", "body": "c"}}), ("respond", {"result": "no"})]
)
async def test_an_ask_needing_several_approvals_takes_no_edit_nor_response(
    verdict: str, options: dict[str, Any]
) -> None:
    rt = runtime([{"id": "two", "tool": "write_note", "action": "ask", "approvals_required": 2}])
    sid, ask_id = await asked(rt, title="a", body="b")
    with pytest.raises(ValidationFailed) as refused:
        await rt.decide(sid, ask_id, verdict, approver="ann", **options)
    assert refused.value.code == "needs_quorum"
    assert not of_type(rt, sid, E.APPROVAL_VOTED)
    assert (await rt.state(sid)).pending_ask is not None


async def test_a_decided_ask_takes_no_second_answer() -> None:
    rt = runtime()
    sid, ask_id = await asked(rt, title="a", body="b")
    await rt.decide(sid, ask_id, "respond", approver="ann", result="done by hand")
    with pytest.raises(AskNotPending):
        await rt.decide(sid, ask_id, "allow_once", approver="bob", arguments={"title": "a", "body": "b"})


def test_the_journal_rules_check_the_new_decision_keys() -> None:
    check_decision({"approved": True, "verdict": "allow_once", "arguments": {"a": 1}}, "d")
    check_decision({"approved": False, "verdict": "respond", "result": "text"}, "d")
    for bad in (
        {"approved": True, "verdict": "allow_always", "arguments": {"a": 1}},
        {"approved": False, "verdict": "deny", "arguments": {"a": 1}},
        {"approved": True, "verdict": "allow_once", "arguments": "a=1"},
        {"approved": True, "verdict": "respond", "result": "text"},
        {"approved": False, "verdict": "respond"},
        {"approved": False, "verdict": "deny", "result": "text"},
    ):
        with pytest.raises(InvalidEvent):
            check_decision(bad, "d")
