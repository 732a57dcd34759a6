"""The fold (docs/journal.md): one or more tests per rule, then edge cases and the helpers."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from sectr.events import (
    Envelope,
    EventType,
    approval_decision_reason,
    recover_reason,
    retry_reason,
    usage_dict,
    user_message_reason,
)
from sectr.fold import PLEASE_CONTINUE, fold_messages, last_assistant_text, open_tool_calls
from sectr.journal import MemoryJournal, NewEvent


class Journal:
    """Builds a list of envelopes with gapless seqs, one small method per event type."""

    def __init__(self, session_id: str = "ses_test") -> None:
        self.session_id = session_id
        self.envelopes: list[Envelope] = []
        self.invocation_id: str | None = None

    def add(self, type: EventType, payload: dict[str, Any]) -> Envelope:
        envelope = Envelope(self.session_id, len(self.envelopes) + 1, self.invocation_id, type, payload)
        self.envelopes.append(envelope)
        return envelope

    def invocation(self, reason: dict[str, Any]) -> Journal:
        self.invocation_id = f"inv_{len(self.envelopes) + 1}"
        self.add(EventType.INVOCATION_STARTED, {"reason": reason})
        return self

    def user(self, content: str | list[dict[str, Any]]) -> Journal:
        return self.invocation(user_message_reason(content))

    def start(self, message_id: str) -> Journal:
        self.add(EventType.MESSAGE_START, {"message_id": message_id, "role": "assistant", "model": "demo"})
        return self

    def delta(self, message_id: str, text: str | None = None, reasoning: str | None = None) -> Journal:
        payload: dict[str, Any] = {"message_id": message_id}
        if text is not None:
            payload["text"] = text
        if reasoning is not None:
            payload["reasoning"] = reasoning
        self.add(EventType.MESSAGE_DELTA, payload)
        return self

    def end(self, message_id: str) -> Journal:
        self.add(EventType.MESSAGE_END, {"message_id": message_id, "finish_reason": "stop", "usage": usage_dict(3, 4)})
        return self

    def say(self, message_id: str, *pieces: str) -> Journal:
        self.start(message_id)
        for piece in pieces:
            self.delta(message_id, text=piece)
        return self.end(message_id)

    def call(
        self, message_id: str, call_id: str, name: str = "calculator", arguments: str = '{"expression": "1+1"}'
    ) -> Journal:
        payload = {"message_id": message_id, "tool_call_id": call_id, "name": name, "arguments": arguments}
        self.add(EventType.TOOL_CALL, payload)
        return self

    def result(self, call_id: str, content: str, name: str = "calculator", is_error: bool = False) -> Journal:
        payload: dict[str, Any] = {"tool_call_id": call_id, "name": name, "content": content}
        if is_error:
            payload["is_error"] = True
        self.add(EventType.TOOL_RESULT, payload)
        return self

    def steer(self, text: str) -> Journal:
        self.add(EventType.STEER_RECEIVED, {"text": text, "author": "bob"})
        return self

    def compact(self, messages: list[dict[str, Any]]) -> Journal:
        self.add(
            EventType.TRANSCRIPT_COMPACTED, {"messages": messages, "summary": "s", "through_seq": len(self.envelopes)}
        )
        return self

    def error(self, message_id: str | None = None) -> Journal:
        payload: dict[str, Any] = {"error": "worker lost", "retryable": True}
        if message_id is not None:
            payload["message_id"] = message_id
        self.add(EventType.SESSION_ERROR, payload)
        return self

    def completed(self) -> Journal:
        self.add(EventType.INVOCATION_COMPLETED, {"stop_reason": "end_turn", "usage": usage_dict(3, 4)})
        return self

    def fold(self) -> list[dict[str, Any]]:
        return fold_messages(self.envelopes)


def assistant(content: str | None, **extra: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": content, **extra}


def tool_call(call_id: str, name: str = "calculator", arguments: str = '{"expression": "1+1"}') -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


# ---- rule 1: user turns ----


def test_rule1_user_message_becomes_user_turn() -> None:
    j = Journal().user("hello")
    assert j.fold() == [{"role": "user", "content": "hello"}]


@pytest.mark.parametrize(
    "reason",
    [approval_decision_reason("ask_1", True, verdict="allow_once"), retry_reason("inv_0"), recover_reason("inv_0")],
)
def test_rule1_other_reasons_add_no_message(reason: dict[str, Any]) -> None:
    j = Journal().user("hello").completed().invocation(reason)
    assert j.fold() == [{"role": "user", "content": "hello"}]


def test_rule1_parts_content_passed_through_unchanged() -> None:
    parts: list[dict[str, Any]] = [
        {"type": "text", "text": "what is this?"},
        {"type": "image_url", "image_url": {"url": "https://example.com/media/1.png"}},
        {"type": "input_audio", "input_audio": {"data": "media:2", "format": "wav"}},
    ]
    j = Journal().user(copy.deepcopy(parts))
    messages = j.fold()
    assert messages == [{"role": "user", "content": parts}]
    # Editing the folded parts does not edit the journal.
    messages[0]["content"][1]["image_url"]["url"] = "changed"
    assert j.envelopes[0].payload["reason"]["input"]["content"] == parts


# ---- rule 2: assistant messages ----


def test_rule2_text_deltas_concatenate_into_content() -> None:
    j = Journal().user("hi").say("m1", "Hel", "lo", ", world")
    assert j.fold()[1] == assistant("Hello, world")


def test_rule2_reasoning_deltas_make_reasoning_content() -> None:
    j = Journal().user("hi").start("m1").delta("m1", reasoning="let me ").delta("m1", reasoning="think")
    j.delta("m1", text="Yes").delta("m1", text="!", reasoning=" more").end("m1")
    assert j.fold()[1] == assistant("Yes!", reasoning_content="let me think more")


def test_rule2_reasoning_key_absent_without_reasoning() -> None:
    message = Journal().user("hi").say("m1", "plain").fold()[1]
    assert "reasoning_content" not in message


def test_rule2_reasoning_only_message() -> None:
    j = Journal().user("hi").start("m1").delta("m1", reasoning="hmm").end("m1")
    assert j.fold()[1] == assistant("", reasoning_content="hmm")


def test_rule2_content_none_with_tool_calls_and_no_text() -> None:
    j = Journal().user("time?").start("m1").call("m1", "c1", "get_time", "{}").end("m1")
    assert j.fold()[1] == assistant(None, tool_calls=[tool_call("c1", "get_time", "{}")])


def test_rule2_text_and_tool_calls_keep_text() -> None:
    j = Journal().user("time?").start("m1").delta("m1", text="Checking.").call("m1", "c1", "get_time", "{}").end("m1")
    assert j.fold()[1] == assistant("Checking.", tool_calls=[tool_call("c1", "get_time", "{}")])


def test_rule2_message_with_neither_text_nor_tool_calls_has_empty_content() -> None:
    j = Journal().user("hi").start("m1").delta("m1", text="").end("m1")
    assert j.fold()[1] == assistant("")


def test_rule2_deltas_are_keyed_by_message_id() -> None:
    # A late delta of an earlier message goes to that message, not to the newest one.
    j = Journal().user("hi").start("m1").delta("m1", text="one").end("m1")
    j.start("m2").delta("m2", text="two").delta("m1", text="+").end("m2")
    assert j.fold()[1:] == [assistant("one+"), assistant("two")]


def test_rule2_many_small_deltas() -> None:
    j = Journal().user("count").say("m1", *(f"{i} " for i in range(1000)))
    assert j.fold()[1]["content"] == "".join(f"{i} " for i in range(1000))


# ---- rule 3: tool calls ----


def test_rule3_tool_call_attaches_to_most_recent_assistant_message() -> None:
    j = Journal().user("hi").say("m1", "first").start("m2").call("m2", "c1").end("m2")
    messages = j.fold()
    assert "tool_calls" not in messages[1]
    assert messages[2]["tool_calls"] == [tool_call("c1")]


def test_rule3_two_tool_calls_in_journal_order() -> None:
    j = (
        Journal()
        .user("do both")
        .start("m1")
        .call("m1", "c2", "b", '{"x": 2}')
        .call("m1", "c1", "a", '{"x": 1}')
        .end("m1")
    )
    assert j.fold()[1]["tool_calls"] == [tool_call("c2", "b", '{"x": 2}'), tool_call("c1", "a", '{"x": 1}')]


def test_rule3_arguments_are_kept_exactly_as_the_model_produced_them() -> None:
    raw = '{ "expression" :"2 * (3+4)",\n"extra": [1,2] }'
    j = Journal().user("calc").start("m1").call("m1", "c1", "calculator", raw).end("m1")
    assert j.fold()[1]["tool_calls"][0]["function"]["arguments"] == raw


def test_rule3_tool_call_after_message_end_still_attaches() -> None:
    j = Journal().user("hi").start("m1").end("m1").call("m1", "c1")
    assert j.fold()[1] == assistant(None, tool_calls=[tool_call("c1")])


def test_rule3_tool_call_without_assistant_message_creates_one() -> None:
    j = Journal().user("hi").call("m1", "c1")
    assert j.fold() == [{"role": "user", "content": "hi"}, assistant(None, tool_calls=[tool_call("c1")])]


# ---- rule 4: tool results ----


def test_rule4_tool_result_becomes_tool_message() -> None:
    j = Journal().user("calc").start("m1").call("m1", "c1").end("m1").result("c1", "2").say("m2", "It is 2.")
    assert j.fold() == [
        {"role": "user", "content": "calc"},
        assistant(None, tool_calls=[tool_call("c1")]),
        {"role": "tool", "tool_call_id": "c1", "content": "2"},
        assistant("It is 2."),
    ]


def test_rule4_error_result_is_a_plain_tool_message() -> None:
    j = Journal().user("x").start("m1").call("m1", "c1").end("m1").result("c1", "boom", is_error=True)
    assert j.fold()[-1] == {"role": "tool", "tool_call_id": "c1", "content": "boom"}


# ---- rule 5: unanswered tool calls ----


def test_rule5_unanswered_tool_call_stays_as_the_model_left_it() -> None:
    j = Journal().user("note: buy milk").start("m1").delta("m1", reasoning="gated").call("m1", "c1", "write_note", "{}")
    j.end("m1")
    j.add(
        EventType.APPROVAL_REQUESTED, {"ask_id": "ask_1", "tool_call_id": "c1", "name": "write_note", "arguments": {}}
    )
    j.add(EventType.INVOCATION_SUSPENDED, {"ask_id": "ask_1"})
    paused = j.fold()
    assert paused[-1] == assistant(None, reasoning_content="gated", tool_calls=[tool_call("c1", "write_note", "{}")])
    assert open_tool_calls(paused) == [tool_call("c1", "write_note", "{}")]

    # The resumed turn appends the result after the call.
    j.invocation(approval_decision_reason("ask_1", True, verdict="allow_once")).result("c1", "saved", "write_note")
    j.say("m2", "Saved.").completed()
    resumed = j.fold()
    assert resumed[:2] == paused
    assert resumed[2:] == [{"role": "tool", "tool_call_id": "c1", "content": "saved"}, assistant("Saved.")]
    assert open_tool_calls(resumed) == []


# ---- rule 6: steers ----


def test_rule6_steer_becomes_user_turn_at_its_position() -> None:
    j = Journal().user("write a poem").say("m1", "Roses").steer("make it about cats").say("m2", "Cats")
    assert j.fold() == [
        {"role": "user", "content": "write a poem"},
        assistant("Roses"),
        {"role": "user", "content": "make it about cats"},
        assistant("Cats"),
    ]


# ---- rule 7: compaction ----


def test_rule7_compaction_replaces_the_messages_so_far() -> None:
    kept = [{"role": "user", "content": "Summary: we talked."}, assistant("Recent answer")]
    j = Journal().user("old").say("m1", "old answer").completed().compact(copy.deepcopy(kept))
    assert j.fold() == kept


def test_rule7_compaction_then_more_events() -> None:
    kept = [{"role": "user", "content": "Summary"}]
    j = Journal().user("old").say("m1", "old answer").completed().compact(copy.deepcopy(kept))
    j.user("new").start("m2").delta("m2", text="fresh").call("m2", "c1").end("m2").result("c1", "4")
    assert j.fold() == [
        {"role": "user", "content": "Summary"},
        {"role": "user", "content": "new"},
        assistant("fresh", tool_calls=[tool_call("c1")]),
        {"role": "tool", "tool_call_id": "c1", "content": "4"},
    ]


def test_rule7_newest_compaction_wins() -> None:
    j = Journal().user("a").compact([{"role": "user", "content": "first"}]).user("b")
    j.compact([{"role": "user", "content": "second"}]).user("c")
    assert j.fold() == [{"role": "user", "content": "second"}, {"role": "user", "content": "c"}]


def test_rule7_fold_does_not_share_dicts_with_compaction_payload() -> None:
    kept = [
        {"role": "user", "content": [{"type": "text", "text": "Summary"}]},
        assistant(None, tool_calls=[tool_call("c0")]),
        {"role": "tool", "tool_call_id": "c0", "content": "ok"},
    ]
    j = Journal().compact(copy.deepcopy(kept))
    before = copy.deepcopy(j.envelopes)
    messages = j.fold()
    assert messages == kept
    for folded, stored in zip(messages, j.envelopes[0].payload["messages"], strict=True):
        assert folded is not stored
    messages[0]["content"][0]["text"] = "changed"
    messages[1]["tool_calls"][0]["function"]["name"] = "changed"
    messages[2]["content"] = "changed"
    assert j.envelopes == before


def test_rule7_tool_call_after_compaction_does_not_touch_the_payload() -> None:
    # A tool call attaches to the most recent assistant message, which may be a compacted one.
    kept = [{"role": "user", "content": "Summary"}, assistant("", tool_calls=[tool_call("c0")])]
    j = Journal().compact(copy.deepcopy(kept)).call("m9", "c1")
    before = copy.deepcopy(j.envelopes)
    assert j.fold()[1] == assistant(None, tool_calls=[tool_call("c0"), tool_call("c1")])
    assert j.envelopes == before


# ---- rule 8: crash stitching ----


def test_rule8_stitching_closes_open_message_with_partial_text() -> None:
    j = Journal().user("!slow 5").start("m1").delta("m1", text="tick 1 ").delta("m1", text="tick 2 ")
    j.error("m1").invocation(recover_reason("inv_1")).say("m2", "tick 3 ")
    assert j.fold() == [
        {"role": "user", "content": "!slow 5"},
        assistant("tick 1 tick 2 "),
        {"role": "user", "content": PLEASE_CONTINUE},
        assistant("tick 3 "),
    ]
    assert PLEASE_CONTINUE == "please continue"


def test_rule8_stitching_keeps_reasoning_and_an_empty_message() -> None:
    j = Journal().user("x").start("m1").delta("m1", reasoning="thinking").error()
    assert j.fold()[1:] == [assistant("", reasoning_content="thinking"), {"role": "user", "content": PLEASE_CONTINUE}]


def test_rule8_session_error_without_open_message_adds_nothing() -> None:
    j = Journal().user("x").say("m1", "done").error()
    assert j.fold() == [{"role": "user", "content": "x"}, assistant("done")]


def test_rule8_second_session_error_does_not_stitch_twice() -> None:
    j = Journal().user("x").start("m1").delta("m1", text="a").error().error()
    assert [m["content"] for m in j.fold()].count(PLEASE_CONTINUE) == 1


def test_rule8_message_start_while_open_closes_earlier_without_stitching() -> None:
    j = Journal().user("x").start("m1").delta("m1", text="cut").start("m2").delta("m2", text="whole").end("m2").error()
    assert j.fold() == [{"role": "user", "content": "x"}, assistant("cut"), assistant("whole")]


def test_rule8_stitching_leaves_the_journal_unchanged() -> None:
    j = Journal().user("x").start("m1").delta("m1", text="partial").call("m1", "c1").error("m1")
    before = copy.deepcopy(j.envelopes)
    messages = j.fold()
    assert messages[-1] == {"role": "user", "content": PLEASE_CONTINUE}
    assert j.envelopes == before
    assert not any(e.payload.get("content") == PLEASE_CONTINUE for e in j.envelopes)


def test_rule8_terminal_event_closes_open_message_without_stitching() -> None:
    # A cancelled run keeps its partial message; a later error of another invocation
    # must not stitch it (it is no longer open).
    j = Journal().user("x").start("m1").delta("m1", text="partial")
    j.add(EventType.INVOCATION_CANCELLED, {"by": "bob"})
    j.user("y").error()
    assert j.fold() == [{"role": "user", "content": "x"}, assistant("partial"), {"role": "user", "content": "y"}]


# ---- everything else ----


def test_other_event_types_add_nothing() -> None:
    j = Journal()
    j.add(EventType.SESSION_CREATED, {"mode": "default", "model": "demo", "title": "t"})
    j.add(EventType.SESSION_UPDATED, {"title": "renamed"})
    j.user("hi").say("m1", "hello")
    j.add(EventType.APPROVAL_REQUESTED, {"ask_id": "a", "tool_call_id": None, "name": "deploy", "arguments": {}})
    j.add(EventType.INVOCATION_SUSPENDED, {"ask_id": "a"})
    j.add(EventType.INVOCATION_COMPLETED, {"stop_reason": "end_turn", "usage": usage_dict()})
    j.add(EventType.INVOCATION_FAILED, {"error": "x", "retryable": False})
    j.add(EventType.INVOCATION_CANCELLED, {})
    assert j.fold() == [{"role": "user", "content": "hi"}, assistant("hello")]


def test_empty_journal_folds_to_no_messages() -> None:
    assert fold_messages([]) == []


def test_fold_accepts_any_iterable() -> None:
    j = Journal().user("hi").say("m1", "a", "b")
    assert fold_messages(iter(j.envelopes)) == j.fold()
    assert fold_messages(e for e in j.envelopes) == j.fold()


def test_fold_of_memory_journal_envelopes() -> None:
    journal = MemoryJournal()
    sid = journal.create()
    inv = "inv_1"
    journal.append_now(
        sid,
        [
            NewEvent(EventType.SESSION_CREATED, {"mode": "default", "model": "demo"}),
            NewEvent(EventType.INVOCATION_STARTED, {"reason": user_message_reason("hi")}, inv),
            NewEvent(EventType.MESSAGE_START, {"message_id": "m1", "role": "assistant"}, inv),
            NewEvent(EventType.MESSAGE_DELTA, {"message_id": "m1", "text": "You said: hi"}, inv),
            NewEvent(EventType.MESSAGE_END, {"message_id": "m1", "usage": usage_dict(1, 3)}, inv),
            NewEvent(EventType.INVOCATION_COMPLETED, {"stop_reason": "end_turn", "usage": usage_dict(1, 3)}, inv),
        ],
    )
    assert fold_messages(journal.read(sid)) == [{"role": "user", "content": "hi"}, assistant("You said: hi")]


def test_fold_is_pure() -> None:
    j = Journal().user([{"type": "text", "text": "hi"}]).start("m1").delta("m1", text="a", reasoning="r")
    j.call("m1", "c1").end("m1").result("c1", "r1").steer("s").compact([{"role": "user", "content": "k"}]).user("z")
    before = copy.deepcopy(j.envelopes)
    assert j.fold() == j.fold()
    assert j.envelopes == before


# ---- open_tool_calls and last_assistant_text ----


def test_open_tool_calls_lists_only_unanswered_calls_of_last_assistant_message() -> None:
    j = Journal().user("x").start("m1").call("m1", "c1").call("m1", "c2").call("m1", "c3").end("m1").result("c2", "ok")
    assert open_tool_calls(j.fold()) == [tool_call("c1"), tool_call("c3")]


def test_open_tool_calls_ignores_earlier_assistant_messages() -> None:
    j = Journal().user("x").start("m1").call("m1", "c1").end("m1").say("m2", "moved on")
    assert open_tool_calls(j.fold()) == []


def test_open_tool_calls_of_no_messages() -> None:
    assert open_tool_calls([]) == []
    assert open_tool_calls([{"role": "user", "content": "x"}]) == []


def test_last_assistant_text() -> None:
    assert last_assistant_text([]) == ""
    j = Journal().user("x").say("m1", "first").start("m2").call("m2", "c1").end("m2")
    assert last_assistant_text(j.fold()) == ""
    j.result("c1", "2").say("m3", "It is ", "2.")
    assert last_assistant_text(j.fold()) == "It is 2."
    assert last_assistant_text([assistant("a"), {"role": "user", "content": "b"}]) == "a"
    parts = [{"type": "text", "text": "x"}, {"type": "refusal", "refusal": "no"}, {"type": "text", "text": "y"}]
    assert last_assistant_text([{"role": "assistant", "content": parts}]) == "xy"
