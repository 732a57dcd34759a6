"""sectr.payloads: the journal's rules for one event and for a journal's order, shared by
an invocation's writer and the import."""

from __future__ import annotations

from typing import Any

import pytest

from sectr.events import EventType, approval_decision_reason, recover_reason, user_message_reason
from sectr.payloads import INT_BOUND, MAX_DEPTH, InvalidEvent, JournalOrder, check_event

GOOD: list[tuple[EventType, dict[str, Any], str | None]] = [
    (EventType.SESSION_CREATED, {"mode": "default", "model": "demo", "limits": {"max_turns": 3}}, None),
    (EventType.SESSION_UPDATED, {"title": "New", "reasoning_effort": None}, None),
    (EventType.INVOCATION_STARTED, {"reason": user_message_reason([{"type": "text", "text": "hi"}], "ann")}, "inv_1"),
    (EventType.INVOCATION_STARTED, {"reason": recover_reason("inv_0")}, "inv_1"),
    (
        EventType.INVOCATION_STARTED,
        {"reason": approval_decision_reason("ask_1", True, approver="bo", verdict="allow_once", scope="turn")},
        "inv_2",
    ),
    (EventType.MESSAGE_START, {"message_id": "m1", "role": "assistant", "model": "demo"}, "inv_1"),
    (EventType.MESSAGE_DELTA, {"message_id": "m1", "text": "Hel", "reasoning": "think"}, "inv_1"),
    (EventType.MESSAGE_END, {"message_id": "m1", "usage": {"input_tokens": 3, "output_tokens": INT_BOUND}}, "inv_1"),
    (EventType.TOOL_CALL, {"message_id": "m1", "tool_call_id": "c1", "name": "get_time", "arguments": "{}"}, "i"),
    (EventType.TOOL_RESULT, {"tool_call_id": "c1", "name": "get_time", "content": "12:00", "is_error": False}, "i"),
    (
        EventType.APPROVAL_REQUESTED,
        {"ask_id": "ask_1", "tool_call_id": None, "name": "deploy", "arguments": {}, "approvals_required": 2},
        "inv_1",
    ),
    (EventType.APPROVAL_VOTED, {"ask_id": "ask_1", "approver": "bo", "verdict": "allow_once"}, None),
    (EventType.TRANSCRIPT_COMPACTED, {"messages": [{"role": "user", "content": "x"}], "through_seq": 4}, None),
    (EventType.SESSION_ERROR, {"error": "lost", "message_id": "m1", "retryable": True}, "inv_1"),
    (EventType.INVOCATION_COMPLETED, {"stop_reason": "end_turn"}, "inv_1"),
    (EventType.INVOCATION_CANCELLED, {}, "inv_1"),
]


@pytest.mark.parametrize(("type", "payload", "invocation_id"), GOOD)
def test_it_accepts_the_documented_shapes(type: EventType, payload: dict[str, Any], invocation_id: str | None) -> None:
    assert check_event(type.value, payload, invocation_id) is type


@pytest.mark.parametrize(
    ("type", "payload", "invocation_id", "reason"),
    [
        ("NOT_A_TYPE", {}, None, "unknown event type"),
        ("INVOCATION_STARTED", {"reason": "x"}, "inv_1", "reason.kind must be one of"),
        ("INVOCATION_STARTED", {"reason": {"kind": "user_message", "input": {"content": 3}}}, "inv_1", "content"),
        ("INVOCATION_STARTED", {"reason": user_message_reason("hi")}, None, "needs an invocation_id"),
        (
            "INVOCATION_STARTED",
            {"reason": approval_decision_reason("a", True, verdict="always")},
            "inv_1",
            "verdict must be one of",
        ),
        ("APPROVAL_VOTED", {"ask_id": "a", "approver": "", "verdict": "deny"}, None, "approver must be a non-empty"),
        ("APPROVAL_REQUESTED", {"ask_id": "a", "name": "t", "arguments": {}, "expires_after_s": 2**40}, "i", "expires"),
        ("SESSION_CREATED", {"mode": "yolo"}, None, "mode must be one of"),
        ("SESSION_CREATED", {"title": "t" * 121}, None, "longer than 120"),
        ("MESSAGE_DELTA", {"message_id": "m1"}, "i", "needs text or reasoning"),
        ("MESSAGE_START", {"message_id": "m1", "role": "user"}, "i", "role must be one of"),
        ("MESSAGE_END", {"message_id": "m1", "x": float("nan")}, "i", "not a finite number"),
        ("STEER_RECEIVED", {"text": "hi", "k\x00": 1}, None, "a key of payload contains a NUL"),
        ("STEER_RECEIVED", {"text": "hi"}, "i" * 41, "invocation_id must be a string of 1 to 40"),
        ("SESSION_UPDATED", [], None, "payload must be an object"),
    ],
)
def test_it_refuses_what_breaks_a_rule_naming_the_field(
    type: str, payload: Any, invocation_id: str | None, reason: str
) -> None:
    with pytest.raises(InvalidEvent, match=reason):
        check_event(type, payload, invocation_id)


def test_it_refuses_a_nesting_deeper_than_the_limit_without_recursing() -> None:
    deep: Any = "leaf"
    for _ in range(MAX_DEPTH + 1):
        deep = [deep]
    with pytest.raises(InvalidEvent, match="nests deeper"):
        check_event("STEER_RECEIVED", {"text": "hi", "extra": deep})
    very_deep: Any = {}
    for _ in range(100_000):  # far past Python's recursion limit: the walk is iterative
        very_deep = {"a": very_deep}
    with pytest.raises(InvalidEvent, match="nests deeper"):
        check_event("STEER_RECEIVED", {"text": "hi", "extra": very_deep})


def test_a_journal_runs_from_one_session_created_without_gaps() -> None:
    order = JournalOrder()
    with pytest.raises(InvalidEvent, match="exactly one SESSION_CREATED"):
        JournalOrder().check(1, EventType.MESSAGE_START)
    with pytest.raises(InvalidEvent, match="seq must be 1"):
        order.check(0, EventType.SESSION_CREATED)
    order.check(1, EventType.SESSION_CREATED)
    with pytest.raises(InvalidEvent, match="exactly one SESSION_CREATED"):
        order.check(2, EventType.SESSION_CREATED)
    with pytest.raises(InvalidEvent, match="seq must be 2"):
        order.check(3, EventType.STEER_RECEIVED)
    with pytest.raises(InvalidEvent, match="seq must be 2"):
        order.check(True, EventType.STEER_RECEIVED)
    order.check(2, EventType.STEER_RECEIVED)
    assert order.last_seq == 2


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        ({"message_id": "m", "text": "a\x00b"}, "payload.text contains a NUL"),
        ({"message_id": "m\x00", "text": "a"}, "payload.message_id contains a NUL"),
        ({"message_id": "m", "text": "\ud800"}, "payload.text is not valid Unicode"),
        ({"message_id": "m", "text\ud800": "a"}, "a key of payload is not valid Unicode"),
    ],
)
def test_a_deltas_strings_are_checked_on_its_fast_path(payload: dict[str, Any], reason: str) -> None:
    """A payload of strings only (a streamed chunk's) is checked in one pass; what that
    pass refuses goes through the full walk, which names it."""
    with pytest.raises(InvalidEvent, match=reason):
        check_event(EventType.MESSAGE_DELTA, payload, "inv_1")


def test_strings_only_takes_plain_strings_and_nothing_else() -> None:
    from sectr.payloads import strings_only

    class Text(str):
        pass

    assert strings_only({"message_id": "m", "text": "a"})
    assert strings_only({})
    assert not strings_only({"message_id": "m", "text": Text("a")})  # a JSON round trip gives a str
    assert not strings_only({"message_id": "m", "n": 1})
    assert not strings_only({1: "a"})
