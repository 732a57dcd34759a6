"""Property tests of the fold over generated valid journals.

The strategy writes journals the way the runtime does: user-message invocations whose
model steps stream assistant messages delta by delta, tool calls answered by results or
left unanswered at an approval pause (then resumed by an approval decision), steers at
model-step boundaries, cancellations, crashes mid message and between messages
(SESSION_ERROR, then a recover invocation) and compactions at turn boundaries whose messages are a previous fold.

While it writes, the generator also records the conversation it means (`expected`),
from its own intent rather than by folding, which gives the fold an oracle.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from sectr.events import Envelope, EventType, approval_decision_reason, recover_reason, usage_dict, user_message_reason
from sectr.fold import PLEASE_CONTINUE, fold_messages, open_tool_calls

PROPERTY_SETTINGS = settings(max_examples=300, deadline=None)

texts = st.text(alphabet="abc xyz.!\n", min_size=0, max_size=6)
contents = st.one_of(
    st.text(max_size=12),
    st.lists(
        st.one_of(
            st.builds(lambda t: {"type": "text", "text": t}, st.text(max_size=8)),
            st.builds(
                lambda n: {"type": "image_url", "image_url": {"url": f"https://example.com/{n}.png"}}, st.integers(0, 9)
            ),
        ),
        min_size=1,
        max_size=3,
    ),
)


@dataclass
class Writer:
    """Appends envelopes and keeps the intended conversation alongside."""

    draw: Any
    envelopes: list[Envelope] = field(default_factory=list)
    expected: list[dict[str, Any]] = field(default_factory=list)
    invocation_id: str | None = None
    counter: int = 0
    pending_call: str | None = None  # the call an approval pause left unanswered

    def next_id(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}_{self.counter}"

    def add(self, type: EventType, payload: dict[str, Any]) -> None:
        self.envelopes.append(Envelope("ses_p", len(self.envelopes) + 1, self.invocation_id, type, payload))

    def chance(self, percent: int) -> bool:
        return bool(self.draw(st.integers(0, 99)) < percent)

    def start_invocation(self, reason: dict[str, Any]) -> None:
        self.invocation_id = self.next_id("inv")
        self.add(EventType.INVOCATION_STARTED, {"reason": reason})

    def end_invocation(self, type: EventType, payload: dict[str, Any]) -> None:
        self.add(type, payload)
        self.invocation_id = None

    def compact(self) -> None:
        """A compaction at a turn boundary: all of a previous fold, or a summary and its tail."""
        folded = fold_messages(self.envelopes)
        if self.chance(50):
            user_turns = [i for i, m in enumerate(folded) if m["role"] == "user"]
            keep_from = user_turns[-1] if user_turns and self.chance(70) else len(folded)
            folded = [{"role": "user", "content": "Summary: " + self.draw(texts)}, *folded[keep_from:]]
        self.add(
            EventType.TRANSCRIPT_COMPACTED, {"messages": copy.deepcopy(folded), "through_seq": len(self.envelopes)}
        )
        self.expected = copy.deepcopy(folded)

    def model_steps(self) -> None:
        """One invocation's model steps, until it completes, pauses, is cancelled or crashes."""
        for step in range(self.draw(st.integers(1, 4))):
            if step and self.chance(20):
                text = self.draw(texts)
                self.add(EventType.STEER_RECEIVED, {"text": text})
                self.expected.append({"role": "user", "content": text})
            if self.chance(8):
                # A crash between messages: SESSION_ERROR with nothing open stitches nothing.
                self.add(EventType.SESSION_ERROR, {"error": "worker lost", "retryable": True})
                self.start_invocation(recover_reason(self.invocation_id or "inv_unknown"))
            outcome = self.message()
            if outcome != "tool_calls":
                return
        self.end_invocation(EventType.INVOCATION_COMPLETED, {"stop_reason": "max_turns", "usage": usage_dict(1, 1)})

    def message(self) -> str:
        """One assistant message; returns how the step ended."""
        mid = self.next_id("msg")
        self.add(EventType.MESSAGE_START, {"message_id": mid, "role": "assistant", "model": "demo"})
        text: list[str] = []
        reasoning: list[str] = []
        for _ in range(self.draw(st.integers(0, 6))):
            payload: dict[str, Any] = {"message_id": mid}
            which = self.draw(st.sampled_from(["text", "text", "reasoning", "both"]))
            if which in ("text", "both"):
                payload["text"] = self.draw(texts)
                text.append(payload["text"])
            if which in ("reasoning", "both"):
                payload["reasoning"] = self.draw(texts)
                reasoning.append(payload["reasoning"])
            self.add(EventType.MESSAGE_DELTA, payload)
        message: dict[str, Any] = {"role": "assistant", "content": "".join(text)}
        if reasoning and "".join(reasoning):
            message["reasoning_content"] = "".join(reasoning)
        self.expected.append(message)

        ending = self.draw(st.sampled_from(["end", "end", "end", "tools", "tools", "crash", "cancel"]))
        if ending == "crash":
            # The worker dies mid message; recovery journals SESSION_ERROR, then a recover
            # invocation continues (crash stitching).
            self.add(EventType.SESSION_ERROR, {"error": "worker lost", "message_id": mid, "retryable": True})
            self.expected.append({"role": "user", "content": PLEASE_CONTINUE})
            self.start_invocation(recover_reason(self.invocation_id or "inv_unknown"))
            self.model_steps()
            return "crash"
        if ending == "cancel":
            self.end_invocation(EventType.INVOCATION_CANCELLED, {"by": "bob"})
            return "cancel"

        calls: list[str] = []
        if ending == "tools":
            for _ in range(self.draw(st.integers(1, 3))):
                call_id = self.next_id("call")
                arguments = self.draw(st.sampled_from(["{}", '{"expression": "1+1"}', '{ "a" : [1, 2] }']))
                name = self.draw(st.sampled_from(["calculator", "get_time", "write_note"]))
                self.add(
                    EventType.TOOL_CALL,
                    {"message_id": mid, "tool_call_id": call_id, "name": name, "arguments": arguments},
                )
                call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
                message.setdefault("tool_calls", []).append(call)
                calls.append(call_id)
            if not message["content"]:
                message["content"] = None
        self.add(EventType.MESSAGE_END, {"message_id": mid, "finish_reason": "stop", "usage": usage_dict(2, 3)})
        if not calls:
            self.end_invocation(EventType.INVOCATION_COMPLETED, {"stop_reason": "end_turn", "usage": usage_dict(2, 3)})
            return "end"

        for call_id in calls:
            if self.chance(25):
                # A gated call: the invocation pauses on an ask, the call stays unanswered.
                ask_id = self.next_id("ask")
                self.add(
                    EventType.APPROVAL_REQUESTED,
                    {"ask_id": ask_id, "tool_call_id": call_id, "name": "write_note", "arguments": {}},
                )
                self.end_invocation(EventType.INVOCATION_SUSPENDED, {"ask_id": ask_id})
                self.pending_call = call_id
                # The calls after the gated one are answered on the resumed turn.
                self.resume(ask_id, calls[calls.index(call_id) + 1 :])
                return "paused"
            self.tool_result(call_id)
        return "tool_calls"

    def tool_result(self, call_id: str, denied: bool = False) -> None:
        content = "denied" if denied else self.draw(texts)
        payload: dict[str, Any] = {"tool_call_id": call_id, "name": "calculator", "content": content}
        if denied:
            payload["is_error"] = True
        self.add(EventType.TOOL_RESULT, payload)
        self.expected.append({"role": "tool", "tool_call_id": call_id, "content": content})

    def resume(self, ask_id: str, later_calls: list[str]) -> None:
        """Either leave the pause as the journal's end, or decide it and go on."""
        if self.chance(30):
            return  # the journal ends at the approval pause
        approved = self.chance(60)
        self.start_invocation(approval_decision_reason(ask_id, approved, verdict="allow_once" if approved else "deny"))
        assert self.pending_call is not None
        self.tool_result(self.pending_call, denied=not approved)
        self.pending_call = None
        for call_id in later_calls:
            self.tool_result(call_id)
        self.model_steps()

    @property
    def paused(self) -> bool:
        return self.pending_call is not None


@st.composite
def journals(draw: Any) -> tuple[list[Envelope], list[dict[str, Any]]]:
    """A valid journal and the conversation it was written to hold."""
    writer = Writer(draw)
    writer.add(EventType.SESSION_CREATED, {"mode": "default", "model": "demo"})
    for _ in range(draw(st.integers(0, 6))):
        if writer.paused:
            break
        if writer.chance(20):
            writer.compact()
        writer.start_invocation(user_message_reason(copy.deepcopy(draw(contents))))
        writer.expected.append({"role": "user", "content": writer.envelopes[-1].payload["reason"]["input"]["content"]})
        writer.model_steps()
    return writer.envelopes, copy.deepcopy(writer.expected)


def compaction_indexes(envelopes: list[Envelope]) -> list[int]:
    return [i for i, e in enumerate(envelopes) if e.type is EventType.TRANSCRIPT_COMPACTED]


def mutate_everything(value: Any) -> None:
    """Scribble over every dict and list reachable from value."""
    if isinstance(value, dict):
        for item in list(value.values()):
            mutate_everything(item)
        value.clear()
        value["scribbled"] = True
    elif isinstance(value, list):
        for item in value:
            mutate_everything(item)
        value.append("scribbled")


@PROPERTY_SETTINGS
@given(journals())
def test_fold_reproduces_the_conversation_the_journal_was_written_to_hold(
    journal: tuple[list[Envelope], list[dict[str, Any]]],
) -> None:
    envelopes, expected = journal
    assert fold_messages(envelopes) == expected


@PROPERTY_SETTINGS
@given(journals())
def test_fold_never_raises_and_yields_well_formed_messages(
    journal: tuple[list[Envelope], list[dict[str, Any]]],
) -> None:
    messages = fold_messages(journal[0])
    for message in messages:
        assert message["role"] in ("user", "assistant", "tool")
        if message["role"] == "assistant":
            assert isinstance(message["content"], str) or (message["content"] is None and message.get("tool_calls"))
            if "reasoning_content" in message:
                assert message["reasoning_content"]


@PROPERTY_SETTINGS
@given(journals())
def test_every_tool_message_follows_its_call_in_the_same_block(
    journal: tuple[list[Envelope], list[dict[str, Any]]],
) -> None:
    messages = fold_messages(journal[0])
    for index, message in enumerate(messages):
        if message["role"] != "tool":
            continue
        owner = index - 1
        while owner >= 0 and messages[owner]["role"] == "tool":
            owner -= 1
        assert owner >= 0 and messages[owner]["role"] == "assistant", "a tool message outside an assistant+tool block"
        call_ids = [call["id"] for call in messages[owner].get("tool_calls", [])]
        assert message["tool_call_id"] in call_ids


@PROPERTY_SETTINGS
@given(journals())
def test_only_a_pause_leaves_tool_calls_open(journal: tuple[list[Envelope], list[dict[str, Any]]]) -> None:
    envelopes = journal[0]
    opened = open_tool_calls(fold_messages(envelopes))
    if envelopes[-1].type is EventType.INVOCATION_SUSPENDED:
        asked = [e.payload["tool_call_id"] for e in envelopes if e.type is EventType.APPROVAL_REQUESTED][-1]
        assert asked in [call["id"] for call in opened]
    else:
        assert opened == []


@PROPERTY_SETTINGS
@given(journals())
def test_compaction_resets_the_fold(journal: tuple[list[Envelope], list[dict[str, Any]]]) -> None:
    envelopes = journal[0]
    whole = fold_messages(envelopes)
    for index in compaction_indexes(envelopes):
        # What came before a compaction has no effect on the fold...
        assert fold_messages(envelopes[index:]) == whole
        # ...and right after it the messages are exactly the compaction's.
        assert fold_messages(envelopes[: index + 1]) == envelopes[index].payload["messages"]


@PROPERTY_SETTINGS
@given(journals())
def test_folding_never_changes_the_journal(journal: tuple[list[Envelope], list[dict[str, Any]]]) -> None:
    envelopes = journal[0]
    before = copy.deepcopy(envelopes)
    messages = fold_messages(envelopes)
    assert envelopes == before
    # Nothing in the fold's output is shared with the journal's payloads.
    mutate_everything(messages)
    assert envelopes == before


@PROPERTY_SETTINGS
@given(journals())
def test_fold_is_deterministic(journal: tuple[list[Envelope], list[dict[str, Any]]]) -> None:
    envelopes = journal[0]
    first = fold_messages(envelopes)
    assert fold_messages(envelopes) == first
    assert fold_messages(iter(envelopes)) == first
    assert fold_messages(copy.deepcopy(envelopes)) == first


@PROPERTY_SETTINGS
@given(journals(), st.integers(0, 10_000))
def test_fold_never_raises_on_any_prefix(journal: tuple[list[Envelope], list[dict[str, Any]]], cut: int) -> None:
    # Every prefix of a valid journal is what a live reader sees mid-invocation.
    envelopes = journal[0]
    fold_messages(envelopes[: cut % (len(envelopes) + 1)])
