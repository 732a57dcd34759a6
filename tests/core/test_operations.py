"""The pure session rules (sectr.operations): check_* validators and *_events builders."""

from __future__ import annotations

from typing import Any

import pytest

from sectr import operations
from sectr.errors import (
    AskNotPending,
    NotAtTurnBoundary,
    RetryIneligible,
    SessionBusy,
    StaleRunControl,
    ValidationFailed,
)
from sectr.events import Envelope, EventType, approval_decision_reason, user_message_reason
from sectr.journal import NewEvent
from sectr.state import DEFAULT_LIMITS, TITLE_MAX, SessionState, project

# ---- a tiny journal builder ----


class Builder:
    def __init__(self) -> None:
        self.envelopes: list[Envelope] = []

    def add(self, type: EventType, payload: dict[str, Any], invocation_id: str | None = None) -> Builder:
        self.envelopes.append(Envelope("ses_1", len(self.envelopes) + 1, invocation_id, type, payload))
        return self

    def extend(self, events: list[NewEvent]) -> Builder:
        for event in events:
            self.add(event.type, event.payload, event.invocation_id)
        return self

    @property
    def state(self) -> SessionState:
        return project(self.envelopes)


def created() -> Builder:
    b = Builder()
    return b.add(EventType.SESSION_CREATED, {"mode": "default", "model": "demo", "limits": dict(DEFAULT_LIMITS)})


def awaiting() -> tuple[Builder, str]:
    b = created()
    b.add(EventType.INVOCATION_STARTED, {"reason": user_message_reason("note: x")}, "inv_1")
    b.add(EventType.MESSAGE_START, {"message_id": "m1", "role": "assistant"}, "inv_1")
    b.add(
        EventType.TOOL_CALL,
        {"message_id": "m1", "tool_call_id": "c1", "name": "write_note", "arguments": '{"title": "x", "body": "x"}'},
        "inv_1",
    )
    b.add(EventType.MESSAGE_END, {"message_id": "m1"}, "inv_1")
    b.add(
        EventType.APPROVAL_REQUESTED,
        {"ask_id": "ask_1", "tool_call_id": "c1", "name": "write_note", "arguments": {"title": "x", "body": "x"}},
        "inv_1",
    )
    b.add(EventType.INVOCATION_SUSPENDED, {"ask_id": "ask_1"}, "inv_1")
    return b, "ask_1"


# ---- validators ----


@pytest.mark.parametrize("bad", [None, "", "   ", "\n\t", 5, ["t"], "x" * (TITLE_MAX + 1)])
def test_check_title_refuses(bad: Any) -> None:
    with pytest.raises(ValidationFailed) as info:
        operations.check_title(bad)
    assert info.value.code == "invalid_title" and info.value.status == 400


@pytest.mark.parametrize(
    ("given", "kept"),
    [("a", "a"), ("x" * TITLE_MAX, "x" * TITLE_MAX), ("  two   words ", "two words"), ("é" * 120, "é" * 120)],
)
def test_check_title_accepts_and_normalises_whitespace(given: str, kept: str) -> None:
    assert operations.check_title(given) == kept


def test_check_title_counts_characters_after_normalising() -> None:
    assert operations.check_title("a" + " " * 200 + "b") == "a b"


@pytest.mark.parametrize("mode", ["default", "plan", "accept_edits"])
def test_check_mode_value_accepts_the_three_modes(mode: str) -> None:
    assert operations.check_mode_value(mode) == mode


@pytest.mark.parametrize("bad", ["", "PLAN", "bypass", None, 1])
def test_check_mode_value_refuses_others(bad: Any) -> None:
    with pytest.raises(ValidationFailed) as info:
        operations.check_mode_value(bad)
    assert info.value.code == "invalid_mode"


def test_check_limits_fills_in_the_defaults() -> None:
    assert operations.check_limits(None) == DEFAULT_LIMITS
    assert operations.check_limits({}) == DEFAULT_LIMITS
    assert operations.check_limits({"max_turns": 0, "max_run_tokens": 5000}) == {
        **DEFAULT_LIMITS,
        "max_turns": 0,
        "max_run_tokens": 5000,
    }


@pytest.mark.parametrize(
    "bad",
    [
        [1, 2],
        "max_turns=3",
        {"max_turns": -1},
        {"max_turns": 1.5},
        {"max_turns": "3"},
        {"max_turns": True},
        {"max_turns": None},
        {"max_turns": 10**9 + 1},
        {"max_minutes": 3},
    ],
)
def test_check_limits_refuses(bad: Any) -> None:
    with pytest.raises(ValidationFailed) as info:
        operations.check_limits(bad)
    assert info.value.code == "invalid_limits"


@pytest.mark.parametrize("effort", ["minimal", "low", "medium", "high"])
def test_check_reasoning_effort_accepts(effort: str) -> None:
    assert operations.check_reasoning_effort(effort) == effort


def test_check_reasoning_effort_treats_empty_as_none() -> None:
    assert operations.check_reasoning_effort(None) is None
    assert operations.check_reasoning_effort("") is None


@pytest.mark.parametrize("bad", ["max", "HIGH", 3, ["low"]])
def test_check_reasoning_effort_refuses(bad: Any) -> None:
    with pytest.raises(ValidationFailed) as info:
        operations.check_reasoning_effort(bad)
    assert info.value.code == "invalid_reasoning_effort"


def test_check_model_value() -> None:
    assert operations.check_model_value(" gpt-4o ") == "gpt-4o"
    for bad in ("", "  ", None, 7, "m" * 201):
        with pytest.raises(ValidationFailed):
            operations.check_model_value(bad)


# ---- verdicts ----


@pytest.mark.parametrize("verdict", ["allow_once", "allow_always", "deny"])
def test_check_decision_accepts_the_three_verdicts_on_the_pending_ask(verdict: str) -> None:
    b, ask_id = awaiting()
    assert operations.check_decision(b.state, ask_id, verdict)["name"] == "write_note"


@pytest.mark.parametrize("bad", ["approve", "ALLOW_ONCE", "", None, True])
def test_check_decision_refuses_unknown_verdicts(bad: Any) -> None:
    b, ask_id = awaiting()
    with pytest.raises(ValidationFailed) as info:
        operations.check_decision(b.state, ask_id, bad)
    assert info.value.code == "invalid_verdict"


def test_check_decision_refuses_an_ask_that_is_not_pending() -> None:
    b, ask_id = awaiting()
    with pytest.raises(AskNotPending):
        operations.check_decision(b.state, "ask_other", "allow_once")
    invocation_id, events = operations.decision_events(b.state, ask_id, "allow_once", approver="bob")
    b.extend(events)
    with pytest.raises(AskNotPending) as info:
        operations.check_decision(b.state, ask_id, "deny")
    assert info.value.status == 409 and info.value.code == "ask_not_pending"


def test_decision_events_build_the_resume_reason() -> None:
    b, ask_id = awaiting()
    invocation_id, events = operations.decision_events(b.state, ask_id, "allow_always", approver="bob", note="")
    (event,) = events
    assert event.type is EventType.INVOCATION_STARTED and event.invocation_id == invocation_id
    assert event.payload["reason"] == approval_decision_reason(ask_id, True, approver="bob", verdict="allow_always")
    b.extend(events)
    assert b.state.grants == ["write_note"]
    _, denied = operations.decision_events(awaiting()[0].state, ask_id, "deny")
    assert denied[0].payload["reason"]["decision"]["approved"] is False


# ---- runs ----


def test_check_can_start() -> None:
    operations.check_can_start(created().state)
    b, _ = awaiting()
    with pytest.raises(SessionBusy) as info:
        operations.check_can_start(b.state)
    assert info.value.code == "awaiting_approval"
    running = created().add(EventType.INVOCATION_STARTED, {"reason": user_message_reason("x")}, "inv_1")
    with pytest.raises(SessionBusy) as info:
        operations.check_can_start(running.state)
    assert info.value.code == "session_busy"


def test_message_events_set_the_title_only_until_one_is_set() -> None:
    b = created()
    _, events = operations.message_events(b.state, "  Plan   the trip  ", author="ann")
    assert types_of_events(events) == ["SESSION_UPDATED", "INVOCATION_STARTED"]
    assert events[0].payload == {"title": "Plan the trip", "title_source": "prompt"}
    assert events[1].payload["reason"] == user_message_reason("  Plan   the trip  ", author="ann")
    b.extend(events)
    _, again = operations.message_events(b.state, "something else")
    assert types_of_events(again) == ["INVOCATION_STARTED"]


def test_message_events_without_text_set_no_title() -> None:
    parts = [{"type": "image_url", "image_url": {"url": "https://example.com/x.png"}}]
    _, events = operations.message_events(created().state, parts)
    assert types_of_events(events) == ["INVOCATION_STARTED"]


def types_of_events(events: list[NewEvent]) -> list[str]:
    return [e.type.value for e in events]


def test_retry_events_only_after_a_retryable_failure() -> None:
    b = created().add(EventType.INVOCATION_STARTED, {"reason": user_message_reason("x")}, "inv_1")
    with pytest.raises(RetryIneligible):
        operations.retry_events(b.state)  # running
    permanent = Builder()
    permanent.envelopes = list(b.envelopes)
    permanent.add(EventType.INVOCATION_FAILED, {"error": "400", "retryable": False}, "inv_1")
    with pytest.raises(RetryIneligible) as info:
        operations.retry_events(permanent.state)
    assert info.value.code == "failed_step_retry_ineligible"
    b.add(EventType.INVOCATION_FAILED, {"error": "503", "retryable": True}, "inv_1")
    invocation_id, events = operations.retry_events(b.state)
    assert events[0].payload["reason"] == {"kind": "retry", "of_invocation_id": "inv_1"}
    b.extend(events)
    with pytest.raises(RetryIneligible):
        operations.retry_events(b.state)


def test_recover_events_close_the_open_message() -> None:
    b = created().add(EventType.INVOCATION_STARTED, {"reason": user_message_reason("x")}, "inv_1")
    b.add(EventType.MESSAGE_START, {"message_id": "m1", "role": "assistant"}, "inv_1")
    invocation_id, events = operations.recover_events(b.state, "inv_1")
    error, started = events
    assert error.type is EventType.SESSION_ERROR and error.invocation_id == "inv_1"
    assert error.payload == {"error": "worker lost", "retryable": True, "message_id": "m1"}
    assert started.invocation_id == invocation_id != "inv_1"
    assert started.payload["reason"] == {"kind": "recover", "of_invocation_id": "inv_1"}


@pytest.mark.parametrize("bad", ["", "   ", None, 3, "x" * 20_001])
def test_check_steer_refuses_bad_text(bad: Any) -> None:
    running = created().add(EventType.INVOCATION_STARTED, {"reason": user_message_reason("x")}, "inv_1")
    with pytest.raises(ValidationFailed):
        operations.check_steer(running.state, bad)


def test_check_steer_needs_an_active_run() -> None:
    with pytest.raises(StaleRunControl) as info:
        operations.check_steer(created().state, "go")
    assert info.value.code == "stale_run_control" and info.value.status == 409
    b, _ = awaiting()
    with pytest.raises(StaleRunControl):
        operations.check_steer(b.state, "go")
    running = created().add(EventType.INVOCATION_STARTED, {"reason": user_message_reason("x")}, "inv_1")
    assert operations.check_steer(running.state, "go") == "go"


def test_check_mode_change() -> None:
    assert operations.check_mode_change(created().state, "plan") == "plan"
    with pytest.raises(ValidationFailed):
        operations.check_mode_change(created().state, "nope")
    running = created().add(EventType.INVOCATION_STARTED, {"reason": user_message_reason("x")}, "inv_1")
    with pytest.raises(SessionBusy):
        operations.check_mode_change(running.state, "plan")


def test_cancel_awaiting_events_answer_the_call_and_withdraw_the_ask() -> None:
    b, ask_id = awaiting()
    events = operations.cancel_awaiting_events(b.state, by="ann")
    assert types_of_events(events) == ["TOOL_RESULT", "INVOCATION_CANCELLED"]
    assert events[0].payload["tool_call_id"] == "c1" and events[0].payload["is_error"] is True
    assert events[1].payload == {"ask_id": ask_id, "by": "ann"}
    # the suspended invocation already ended: these belong to none
    assert {e.invocation_id for e in events} == {None}
    b.extend(events)
    state = b.state
    assert state.status == "cancelled" and state.pending_ask is None
    assert state.asks[ask_id]["status"] == "withdrawn"
    with pytest.raises(StaleRunControl):
        operations.cancel_awaiting_events(state)


# ---- fork ----


def test_fork_events_validate_at_seq_and_the_turn_boundary() -> None:
    b = created().add(EventType.INVOCATION_STARTED, {"reason": user_message_reason("x")}, "inv_1")
    with pytest.raises(NotAtTurnBoundary) as info:
        operations.fork_events(b.state, b.envelopes, at_seq=None)
    assert info.value.status == 412
    for bad in (0, 3, True, "1"):
        with pytest.raises(ValidationFailed):
            operations.fork_events(b.state, b.envelopes, at_seq=bad)
    events = operations.fork_events(b.state, b.envelopes, at_seq=2)
    assert events[0].payload["forked_from"] == {"session_id": "ses_1", "seq": 2}
    assert events[1].payload["messages"] == [{"role": "user", "content": "x"}]


def test_strip_trailing_unanswered() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    call2 = {"id": "c2", "type": "function", "function": {"name": "g", "arguments": "{}"}}
    user = {"role": "user", "content": "u"}
    only_call = [user, {"role": "assistant", "content": None, "tool_calls": [call]}]
    assert operations.strip_trailing_unanswered(only_call) == [user]
    with_text = [user, {"role": "assistant", "content": "let me see", "tool_calls": [call]}]
    assert operations.strip_trailing_unanswered(with_text) == [user, {"role": "assistant", "content": "let me see"}]
    partly = [
        user,
        {"role": "assistant", "content": None, "tool_calls": [call, call2]},
        {"role": "tool", "tool_call_id": "c1", "content": "r"},
    ]
    assert operations.strip_trailing_unanswered(partly) == [
        user,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "r"},
    ]
    answered = [*partly, {"role": "tool", "tool_call_id": "c2", "content": "r2"}]
    assert operations.strip_trailing_unanswered(answered) == answered
    # the input is not changed
    assert len(partly[1]["tool_calls"]) == 2


def test_clear_events_inherit_the_settings() -> None:
    b = created().add(EventType.SESSION_UPDATED, {"mode": "plan", "reasoning_effort": "low", "title": "T"})
    (event,) = operations.clear_events(b.state)
    assert event.payload == {"mode": "plan", "model": "demo", "limits": DEFAULT_LIMITS, "reasoning_effort": "low"}
