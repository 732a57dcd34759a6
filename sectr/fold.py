"""The fold: a session's envelopes -> the OpenAI-style messages the model sees (docs/journal.md).

`fold_messages(envelopes)` is pure: it reads the envelopes and their payloads and never
changes them, and the list it returns shares no mutable object with them (a caller may
edit the messages freely). It runs once per model step of every invocation, over the
envelopes since the newest TRANSCRIPT_COMPACTED, so it is written for speed: one pass,
type dispatch with `is` ordered by how often each type occurs (MESSAGE_DELTA dwarfs the
rest), text collected as lists of pieces and joined once at the end.

The eight rules, in journal order:

1. INVOCATION_STARTED with reason `user_message` -> `{"role": "user", "content": input.content}`.
2. MESSAGE_START/DELTA/END (keyed by `message_id`) -> an assistant message; `text` deltas
   make `content`, `reasoning` deltas make `reasoning_content` (present only when there was
   reasoning). `content` is None with tool calls and no text, "" with neither.
3. TOOL_CALL -> appended to `tool_calls` of the most recent assistant message.
4. TOOL_RESULT -> `{"role": "tool", "tool_call_id", "content"}`.
5. An unanswered tool call stays as the model left it.
6. STEER_RECEIVED -> `{"role": "user", "content": text}`.
7. TRANSCRIPT_COMPACTED -> the messages so far are replaced by a copy of `payload.messages`.
8. SESSION_ERROR while an assistant message is open -> the message is closed with what it
   has and `{"role": "user", "content": "please continue"}` follows (never persisted).

Everything else adds nothing. Two decisions of our own (see docs/journal.md):
a MESSAGE_START while a message is open closes the earlier one without stitching, and an
invocation's terminal event (completed, suspended, failed, cancelled) closes an open
message without stitching, so a later SESSION_ERROR of another invocation cannot stitch
a message that belongs to an invocation that has already ended.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from sectr.events import Envelope, EventType

__all__ = ["PLEASE_CONTINUE", "fold_messages", "last_assistant_text", "open_tool_calls"]

#: The synthesized user turn that follows a message cut short by a crash (rule 8).
PLEASE_CONTINUE = "please continue"

_DELTA = EventType.MESSAGE_DELTA
_START = EventType.MESSAGE_START
_END = EventType.MESSAGE_END
_TOOL_CALL = EventType.TOOL_CALL
_TOOL_RESULT = EventType.TOOL_RESULT
_INVOCATION_STARTED = EventType.INVOCATION_STARTED
_STEER = EventType.STEER_RECEIVED
_COMPACTED = EventType.TRANSCRIPT_COMPACTED
_SESSION_ERROR = EventType.SESSION_ERROR
_TERMINAL = frozenset(
    {
        EventType.INVOCATION_COMPLETED,
        EventType.INVOCATION_SUSPENDED,
        EventType.INVOCATION_FAILED,
        EventType.INVOCATION_CANCELLED,
    }
)

#: "No message is open / current". A message_id may be missing (None) in a bad journal,
#: so None cannot serve as the marker.
_NO_MESSAGE: Any = object()

# A message under construction: (the message dict, its text pieces, its reasoning pieces).
_Builder = tuple[dict[str, Any], list[str], list[str]]


_ATOMS = frozenset({str, int, float, bool, type(None)})


def copy_json(value: Any) -> Any:
    """A deep copy of a JSON-shaped value (dicts, lists, scalars); much faster than deepcopy."""
    if isinstance(value, dict):
        return {key: item if type(item) in _ATOMS else copy_json(item) for key, item in value.items()}
    if isinstance(value, list):
        return [item if type(item) in _ATOMS else copy_json(item) for item in value]
    return value


def _copy_message(message: Any) -> Any:
    """A deep copy of one message: a shallow dict copy, then deep copies of nested values."""
    if type(message) is not dict:
        return copy_json(message)
    copied = message.copy()
    for key, value in message.items():
        if type(value) not in _ATOMS:
            copied[key] = copy_json(value)
    return copied


def fold_messages(envelopes: Iterable[Envelope]) -> list[dict[str, Any]]:
    """Fold envelopes (in seq order) into OpenAI-style message dicts; see the module doc."""
    messages: list[dict[str, Any]] = []
    builders: list[_Builder] = []  # every assistant message started since the last reset
    by_id: dict[Any, _Builder] = {}
    # The message the last delta went to (the fast path) and the open message (rule 8).
    current_id: Any = _NO_MESSAGE
    current_text: list[str] = []
    current_reasoning: list[str] = []
    open_id: Any = _NO_MESSAGE
    last_assistant: dict[str, Any] | None = None

    for envelope in envelopes:
        kind = envelope.type
        if kind is _DELTA:
            payload = envelope.payload
            message_id = payload.get("message_id")
            if message_id != current_id:
                builder = by_id.get(message_id)
                if builder is None:
                    # A delta with no MESSAGE_START (a bad journal): start the message here.
                    message: dict[str, Any] = {"role": "assistant", "content": None}
                    messages.append(message)
                    last_assistant = message
                    builder = (message, [], [])
                    builders.append(builder)
                    by_id[message_id] = builder
                    open_id = message_id
                current_id = message_id
                current_text = builder[1]
                current_reasoning = builder[2]
            text = payload.get("text")
            if text:
                current_text.append(text)
            reasoning = payload.get("reasoning")
            if reasoning:
                current_reasoning.append(reasoning)
        elif kind is _START:
            # Opening a message closes any open one (no stitching: nothing crashed).
            message_id = envelope.payload.get("message_id")
            message = {"role": "assistant", "content": None}
            messages.append(message)
            last_assistant = message
            current_text = []
            current_reasoning = []
            builder = (message, current_text, current_reasoning)
            builders.append(builder)
            by_id[message_id] = builder
            current_id = open_id = message_id
        elif kind is _END:
            if envelope.payload.get("message_id") == open_id:
                open_id = _NO_MESSAGE
        elif kind is _TOOL_CALL:
            payload = envelope.payload
            if last_assistant is None:
                last_assistant = {"role": "assistant", "content": None}
                messages.append(last_assistant)
            elif last_assistant.get("content") == "":
                # An assistant message carried over by a compaction: tool calls and no text.
                last_assistant["content"] = None
            calls = last_assistant.get("tool_calls")
            if calls is None:
                calls = last_assistant["tool_calls"] = []
            arguments = payload.get("arguments", "{}")
            if not isinstance(arguments, str):
                arguments = json.dumps(arguments)
            calls.append(
                {
                    "id": payload.get("tool_call_id"),
                    "type": "function",
                    "function": {"name": payload.get("name"), "arguments": arguments},
                }
            )
        elif kind is _TOOL_RESULT:
            payload = envelope.payload
            content = payload.get("content", "")
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": payload.get("tool_call_id"),
                    "content": content if isinstance(content, str) else copy_json(content),
                }
            )
        elif kind is _INVOCATION_STARTED:
            reason = envelope.payload.get("reason")
            if isinstance(reason, dict) and reason.get("kind") == "user_message":
                given = reason.get("input")
                content = given.get("content", "") if isinstance(given, dict) else ""
                # Parts are copied so that editing the messages cannot edit the journal.
                messages.append(
                    {"role": "user", "content": content if isinstance(content, str) else copy_json(content)}
                )
        elif kind is _STEER:
            messages.append({"role": "user", "content": envelope.payload.get("text", "")})
        elif kind is _COMPACTED:
            # The messages so far are replaced, positionally (rule 7). Copied deeply: the
            # fold may later attach tool calls to one of them, and the payload is the journal's.
            kept = envelope.payload.get("messages")
            messages = [_copy_message(item) for item in kept] if isinstance(kept, list) else []
            builders = []
            by_id = {}
            current_id = open_id = _NO_MESSAGE
            last_assistant = None
            for item in reversed(messages):
                if isinstance(item, dict) and item.get("role") == "assistant":
                    last_assistant = item
                    break
        elif kind is _SESSION_ERROR:
            if open_id is not _NO_MESSAGE:
                # Crash stitching (rule 8): the open message keeps what it has (it is
                # finalised below like any other) and the model is asked to go on.
                messages.append({"role": "user", "content": PLEASE_CONTINUE})
                open_id = _NO_MESSAGE
        elif kind in _TERMINAL:
            open_id = _NO_MESSAGE

    for message, text_pieces, reasoning_pieces in builders:
        if text_pieces:
            message["content"] = "".join(text_pieces)
        elif "tool_calls" not in message:
            message["content"] = ""
        if reasoning_pieces:
            message["reasoning_content"] = "".join(reasoning_pieces)
    return messages


def open_tool_calls(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The tool calls of the last assistant message that no later tool message answers."""
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].get("role") == "assistant":
            break
    else:
        return []
    calls = messages[index].get("tool_calls") or []
    if not calls:
        return []
    answered = {m.get("tool_call_id") for m in messages[index + 1 :] if m.get("role") == "tool"}
    return [call for call in calls if call.get("id") not in answered]


def last_assistant_text(messages: list[dict[str, Any]]) -> str:
    """The text of the last assistant message ("" when it has none, or there is none)."""
    for message in reversed(messages):
        if message.get("role") == "assistant":
            content = message.get("content")
            if isinstance(content, str):
                return content
            if isinstance(content, list):
                return "".join(
                    str(part.get("text", ""))
                    for part in content
                    if isinstance(part, dict) and part.get("type") == "text"
                )
            return ""
    return ""
