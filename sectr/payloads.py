"""The journal's rules for one envelope: its type, its payload's shape, its values.

`check_event` is the one check every way into a journal shares that does not come
from the platform's own code: an invocation's writer runs it on each event a handler,
a tool or the model produces, and an import (`sessions_app.review.export`) runs it on
each envelope of the file, before anything is stored. `JournalOrder` adds the rules
of a whole journal that the journal itself guarantees on append (gapless seqs from 1,
exactly one SESSION_CREATED, first), for a journal that arrives from outside.

The shapes are those of docs/journal.md. Keys beyond the documented ones are allowed
(they are how the format grows: `rule_id`, `with_ask`, `limits` ...), except in
MESSAGE_DELTA, the most frequent event, which is exactly `message_id` plus `text`
and/or `reasoning`. Every string must be storable (no NUL, which PostgreSQL refuses,
no lone surrogate, which no UTF-8 encoder takes), every number a finite float or an
integer within `INT_BOUND` (a JavaScript client reads it exactly, a bigint column
holds it).
"""

from __future__ import annotations

import re
from typing import Any

from sectr.events import DECISION_SCOPES, MODES, REASON_KINDS, VERDICTS, VOTE_VERDICTS, EventType
from sectr.rules import MAX_APPROVALS
from sectr.state import TITLE_MAX

#: The largest magnitude of an integer anywhere in a payload: 2**53 - 1, the largest
#: integer a JSON reader with doubles (JavaScript) reads exactly.
INT_BOUND = 2**53 - 1
#: How deep a payload may nest (objects and lists): the deepest the platform writes is
#: a compaction's messages with their content parts, far below this.
MAX_DEPTH = 64
#: The longest identifiers and names a session's projection keeps in columns of their
#: own (the Django app's Session, Envelope and AskIndex rows): longer would not store.
ID_MAX = 40
ASK_ID_MAX = 64
MODEL_MAX = 200
SETTING_MAX = 16
#: An ask's expiry: a rule's is at most a year, a team's default a 32-bit count of seconds.
EXPIRY_MAX = 2**31 - 1
USAGE_KEYS = ("input_tokens", "output_tokens", "reasoning_tokens", "cached_input_tokens")
DELTA_KEYS = frozenset({"message_id", "text", "reasoning"})
#: How a TOOL_RESULT's `media` name stored bytes: content-addressed, never the bytes.
MEDIA_SCHEME = "sectr-media://"
MEDIA_REF = re.compile(r"sectr-media://[0-9a-f]{64}")
MEDIA_KINDS = ("image", "audio")
#: The most media one tool result may carry (more are named in its text, not kept).
RESULT_MEDIA_MAX = 16


class InvalidEvent(ValueError):
    """An event that breaks the journal's rules; the message names the field and why."""


def check_storable(value: Any, where: str = "payload") -> None:
    """Every string (and key) storable, every number a finite float or a bounded
    integer, nothing but JSON values, at most MAX_DEPTH deep. Iterative: a hostile
    nesting cannot exhaust the stack."""
    if type(value) is dict and _plain_texts(value):
        return
    stack: list[tuple[Any, str, int]] = [(value, where, 0)]
    while stack:
        item, path, depth = stack.pop()
        if isinstance(item, str):
            _check_text(item, path)
        elif isinstance(item, bool) or item is None:
            continue
        elif isinstance(item, int):
            if not -INT_BOUND <= item <= INT_BOUND:
                raise InvalidEvent(f"{path} is an integer out of bounds (at most {INT_BOUND} in magnitude)")
        elif isinstance(item, float):
            if item != item or item in (float("inf"), float("-inf")):
                raise InvalidEvent(f"{path} is not a finite number")
        elif isinstance(item, dict | list):
            if depth >= MAX_DEPTH:
                raise InvalidEvent(f"{path} nests deeper than {MAX_DEPTH} levels")
            if isinstance(item, dict):
                for key, child in item.items():
                    if not isinstance(key, str):
                        raise InvalidEvent(f"{path} has a key that is not a string")
                    _check_text(key, f"a key of {path}")
                    stack.append((child, f"{path}.{key[:40]}", depth + 1))
            else:
                stack.extend((child, f"{path}[{i}]", depth + 1) for i, child in enumerate(item))
        else:
            raise InvalidEvent(f"{path} is not a JSON value ({type(item).__name__})")


def strings_only(payload: dict[Any, Any]) -> bool:
    """Whether `payload` maps plain strings to plain strings (a delta's, on every streamed
    chunk): a JSON value as it is, which a copy reproduces as a JSON round trip would.
    A plain loop: all() over a generator was 0.58 us a delta's payload, this 0.22 (timeit)."""
    for key, item in payload.items():
        if type(key) is not str or type(item) is not str:
            return False
    return True


def _plain_texts(payload: dict[Any, Any]) -> bool:
    """Whether `payload` maps strings to strings, none with a NUL or a lone surrogate (a
    delta's, on every streamed chunk): storable, checked in one pass over its text. False
    sends it through the full walk, which also names what is wrong. (Its texts gathered
    in the loop that checks their types: 0.5 us a delta's payload, where strings_only and
    a join over a nested generator took 1.6, timeit.)"""
    parts = []
    for key, item in payload.items():
        if type(key) is not str or type(item) is not str:
            return False
        parts.append(key)
        parts.append(item)
    text = "".join(parts)
    if "\x00" in text:
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _check_text(text: str, path: str) -> None:
    if "\x00" in text:
        raise InvalidEvent(f"{path} contains a NUL character")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidEvent(f"{path} is not valid Unicode (a lone surrogate)") from None


# ---- shapes ----


def _string(
    payload: dict[str, Any], key: str, where: str, *, required: bool = True, empty: bool = True, max_length: int = 0
) -> None:
    value = payload.get(key)
    if value is None and not required:
        return
    if not isinstance(value, str) or (not empty and not value):
        raise InvalidEvent(f"{where}.{key} must be a {'non-empty ' if not empty else ''}string")
    if max_length and len(value) > max_length:
        raise InvalidEvent(f"{where}.{key} is longer than {max_length} characters")


def _boolean(payload: dict[str, Any], key: str, where: str, *, required: bool = True) -> None:
    value = payload.get(key)
    if value is None and not required:
        return
    if not isinstance(value, bool):
        raise InvalidEvent(f"{where}.{key} must be true or false")


def _count(
    payload: dict[str, Any], key: str, where: str, *, minimum: int = 0, maximum: int = INT_BOUND, required: bool = True
) -> None:
    value = payload.get(key)
    if value is None and not required:
        return
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise InvalidEvent(f"{where}.{key} must be an integer from {minimum} to {maximum}")


def _one_of(payload: dict[str, Any], key: str, where: str, choices: tuple[str, ...], *, required: bool = True) -> None:
    value = payload.get(key)
    if value is None and not required:
        return
    if value not in choices:
        raise InvalidEvent(f"{where}.{key} must be one of {', '.join(choices)}")


def check_usage(usage: Any, where: str = "usage") -> None:
    if not isinstance(usage, dict):
        raise InvalidEvent(f"{where} must be an object")
    for key in USAGE_KEYS:
        _count(usage, key, where, required=False)


def check_decision(decision: Any, where: str) -> None:
    """A decision: `approved`, and the optional `approver`, `approvers`, `verdict`,
    `note`, `scope`, `with_ask`; `arguments` (an object: the call as a person edited it,
    on an approved allow_once only) and `result` (a person's answer instead of the call,
    with verdict respond, never approved)."""
    if not isinstance(decision, dict):
        raise InvalidEvent(f"{where} must be an object")
    _boolean(decision, "approved", where)
    for key in ("approver", "note", "with_ask"):
        _string(decision, key, where, required=False)
    _one_of(decision, "verdict", where, VERDICTS, required=False)
    _one_of(decision, "scope", where, DECISION_SCOPES, required=False)
    approvers = decision.get("approvers")
    if approvers is not None and (
        not isinstance(approvers, list) or not all(isinstance(a, str) and a for a in approvers)
    ):
        raise InvalidEvent(f"{where}.approvers must be a list of names")
    if "arguments" in decision and (
        not isinstance(decision["arguments"], dict)
        or decision.get("verdict") != "allow_once"
        or decision.get("approved") is not True
    ):
        raise InvalidEvent(f"{where}.arguments must be an object, on an approved allow_once only")
    if decision.get("verdict") == "respond":
        if decision.get("approved") is not False:
            raise InvalidEvent(f"{where}: a respond decision is never approved (the call does not run)")
        _string(decision, "result", where)
    elif "result" in decision:
        raise InvalidEvent(f"{where}.result goes with verdict respond only")


def check_reason(reason: Any, where: str = "payload.reason") -> None:
    """An INVOCATION_STARTED reason: one of REASON_KINDS with its keys."""
    if not isinstance(reason, dict) or reason.get("kind") not in REASON_KINDS:
        raise InvalidEvent(f"{where}.kind must be one of {', '.join(sorted(REASON_KINDS))}")
    kind = reason["kind"]
    if kind == "user_message":
        inp = reason.get("input")
        content = inp.get("content") if isinstance(inp, dict) else None
        if isinstance(content, list):
            if not all(isinstance(part, dict) and isinstance(part.get("type"), str) for part in content):
                raise InvalidEvent(f"{where}.input.content must be a list of parts (objects with a type)")
        elif not isinstance(content, str):
            raise InvalidEvent(f"{where}.input.content must be a string or a list of parts")
        _string(reason, "author", where, required=False)
    elif kind == "approval_decision":
        _string(reason, "ask_id", where, empty=False)
        check_decision(reason.get("decision"), f"{where}.decision")
    else:
        _string(reason, "of_invocation_id", where, empty=False)


def _settings(p: dict[str, Any], w: str) -> None:
    _string(p, "title", w, required=False, max_length=TITLE_MAX)
    _string(p, "model", w, required=False, max_length=MODEL_MAX)
    _string(p, "reasoning_effort", w, required=False, max_length=SETTING_MAX)
    _string(p, "title_source", w, required=False, max_length=SETTING_MAX)
    _one_of(p, "mode", w, MODES, required=False)
    limits = p.get("limits")
    if limits is not None:
        if not isinstance(limits, dict):
            raise InvalidEvent(f"{w}.limits must be an object")
        for key in limits:
            _count(limits, key, f"{w}.limits")


def _session_created(p: dict[str, Any], w: str) -> None:
    _settings(p, w)
    forked = p.get("forked_from")
    if forked is not None:
        if not isinstance(forked, dict):
            raise InvalidEvent(f"{w}.forked_from must be an object")
        _string(forked, "session_id", f"{w}.forked_from", empty=False)
        _count(forked, "seq", f"{w}.forked_from")
    replay = p.get("replay")
    if replay is not None:
        if not isinstance(replay, dict):
            raise InvalidEvent(f"{w}.replay must be an object")
        _string(replay, "source", f"{w}.replay", empty=False)
        if not isinstance(replay.get("live_reads", False), bool):
            raise InvalidEvent(f"{w}.replay.live_reads must be a boolean")


def _message_start(p: dict[str, Any], w: str) -> None:
    _string(p, "message_id", w, empty=False)
    _one_of(p, "role", w, ("assistant",))
    _string(p, "model", w, required=False, max_length=MODEL_MAX)


def _message_delta(p: dict[str, Any], w: str) -> None:
    if not DELTA_KEYS.issuperset(p):
        unknown = sorted(set(p) - DELTA_KEYS)
        raise InvalidEvent(f"{w} has unknown key(s) {', '.join(k[:40] for k in unknown[:5])}")
    _string(p, "message_id", w, empty=False)
    if "text" not in p and "reasoning" not in p:
        raise InvalidEvent(f"{w} needs text or reasoning")
    for key in ("text", "reasoning"):
        if key in p and not isinstance(p[key], str):
            raise InvalidEvent(f"{w}.{key} must be a string")


def _message_end(p: dict[str, Any], w: str) -> None:
    _string(p, "message_id", w, empty=False)
    _string(p, "finish_reason", w, required=False)
    _string(p, "model", w, required=False, max_length=MODEL_MAX)
    if p.get("usage") is not None:
        check_usage(p["usage"], f"{w}.usage")


def _tool_call(p: dict[str, Any], w: str) -> None:
    _string(p, "message_id", w, required=False)
    _string(p, "tool_call_id", w, empty=False)
    _string(p, "name", w, empty=False)
    _string(p, "arguments", w)


def _tool_result(p: dict[str, Any], w: str) -> None:
    _string(p, "tool_call_id", w, empty=False)
    _string(p, "name", w)
    _string(p, "content", w)
    _boolean(p, "is_error", w, required=False)
    if p.get("media") is not None:
        check_result_media(p["media"], f"{w}.media")


def check_result_media(media: Any, where: str = "media") -> None:
    """A TOOL_RESULT's `media`: at most RESULT_MEDIA_MAX references to stored bytes,
    each ``{"ref": "sectr-media://<sha256>", "kind", "mime_type", "bytes"}`` (no data)."""
    if not isinstance(media, list) or len(media) > RESULT_MEDIA_MAX:
        raise InvalidEvent(f"{where} must be a list of at most {RESULT_MEDIA_MAX} media references")
    for index, item in enumerate(media):
        at = f"{where}[{index}]"
        if not isinstance(item, dict):
            raise InvalidEvent(f"{at} must be an object")
        if not isinstance(item.get("ref"), str) or not MEDIA_REF.fullmatch(item["ref"]):
            raise InvalidEvent(f"{at}.ref must be a {MEDIA_SCHEME}<sha256> reference")
        _one_of(item, "kind", at, MEDIA_KINDS)
        _string(item, "mime_type", at, empty=False, max_length=MODEL_MAX)
        _count(item, "bytes", at)
        if "data" in item:
            raise InvalidEvent(f"{at} holds data: the journal keeps references, never the bytes")


def _tool_started(p: dict[str, Any], w: str) -> None:
    _string(p, "tool_call_id", w, empty=False)
    _string(p, "name", w, empty=False)


def _approval_requested(p: dict[str, Any], w: str) -> None:
    _string(p, "ask_id", w, empty=False, max_length=ASK_ID_MAX)
    _string(p, "tool_call_id", w, required=False)
    _string(p, "name", w, empty=False)
    if not isinstance(p.get("arguments"), dict):
        raise InvalidEvent(f"{w}.arguments must be an object")
    _string(p, "rule_id", w, required=False)
    _count(p, "approvals_required", w, minimum=1, maximum=MAX_APPROVALS, required=False)
    _count(p, "expires_after_s", w, maximum=EXPIRY_MAX, required=False)
    if p.get("decision") is not None:
        check_decision(p["decision"], f"{w}.decision")


def _approval_voted(p: dict[str, Any], w: str) -> None:
    _string(p, "ask_id", w, empty=False)
    _string(p, "approver", w, empty=False)
    _one_of(p, "verdict", w, VOTE_VERDICTS)
    _string(p, "note", w, required=False)


def _steer(p: dict[str, Any], w: str) -> None:
    _string(p, "text", w)
    _string(p, "author", w, required=False)


def _compacted(p: dict[str, Any], w: str) -> None:
    messages = p.get("messages")
    if not isinstance(messages, list) or not all(
        isinstance(message, dict) and isinstance(message.get("role"), str) for message in messages
    ):
        raise InvalidEvent(f"{w}.messages must be a list of messages (objects with a role)")
    _string(p, "summary", w, required=False)
    _count(p, "through_seq", w)


def _session_error(p: dict[str, Any], w: str) -> None:
    _string(p, "error", w)
    _string(p, "message_id", w, required=False)
    _boolean(p, "retryable", w, required=False)


def _invocation_suspended(p: dict[str, Any], w: str) -> None:
    _string(p, "ask_id", w, empty=False)


def _invocation_completed(p: dict[str, Any], w: str) -> None:
    _string(p, "stop_reason", w, required=False)
    if p.get("usage") is not None:
        check_usage(p["usage"], f"{w}.usage")


def _invocation_failed(p: dict[str, Any], w: str) -> None:
    _string(p, "error", w)
    _boolean(p, "retryable", w, required=False)


def _invocation_cancelled(p: dict[str, Any], w: str) -> None:
    _string(p, "by", w, required=False)
    _string(p, "ask_id", w, required=False)


def _invocation_started(p: dict[str, Any], w: str) -> None:
    check_reason(p.get("reason"), f"{w}.reason")


_SHAPES = {
    EventType.SESSION_CREATED: _session_created,
    EventType.SESSION_UPDATED: _settings,
    EventType.INVOCATION_STARTED: _invocation_started,
    EventType.INVOCATION_SUSPENDED: _invocation_suspended,
    EventType.INVOCATION_COMPLETED: _invocation_completed,
    EventType.INVOCATION_FAILED: _invocation_failed,
    EventType.INVOCATION_CANCELLED: _invocation_cancelled,
    EventType.MESSAGE_START: _message_start,
    EventType.MESSAGE_DELTA: _message_delta,
    EventType.MESSAGE_END: _message_end,
    EventType.TOOL_CALL: _tool_call,
    EventType.TOOL_RESULT: _tool_result,
    EventType.TOOL_STARTED: _tool_started,
    EventType.APPROVAL_REQUESTED: _approval_requested,
    EventType.APPROVAL_VOTED: _approval_voted,
    EventType.STEER_RECEIVED: _steer,
    EventType.TRANSCRIPT_COMPACTED: _compacted,
    EventType.SESSION_ERROR: _session_error,
}


def event_type(value: Any) -> EventType:
    """The EventType named `value`; InvalidEvent for anything else."""
    if type(value) is EventType:  # (most are: the Enum call was a cost of every streamed chunk)
        return value
    try:
        return EventType(value)
    except ValueError:
        raise InvalidEvent(f"unknown event type {str(value)[:60]!r}") from None


def check_event(type: Any, payload: Any, invocation_id: Any = None) -> EventType:
    """Check one event against the journal's rules (see the module docstring); returns
    its EventType, raises InvalidEvent naming the first thing wrong."""
    kind = event_type(type)
    if invocation_id is not None:
        if not isinstance(invocation_id, str) or not 0 < len(invocation_id) <= ID_MAX:
            raise InvalidEvent(f"invocation_id must be a string of 1 to {ID_MAX} characters, or null")
        _check_text(invocation_id, "invocation_id")
    elif kind is EventType.INVOCATION_STARTED:
        raise InvalidEvent(f"{kind.value} needs an invocation_id")
    if not isinstance(payload, dict):
        raise InvalidEvent("payload must be an object")
    check_storable(payload)
    _SHAPES[kind](payload, "payload")
    return kind


class JournalOrder:
    """The rules of a whole journal read envelope by envelope: seqs 1, 2, 3 ... without
    a gap, and exactly one SESSION_CREATED, first."""

    def __init__(self) -> None:
        self.last_seq = 0

    def check(self, seq: Any, kind: EventType) -> None:
        expected = self.last_seq + 1
        if isinstance(seq, bool) or seq != expected or not isinstance(seq, int):
            raise InvalidEvent(f"seq must be {expected} (seqs run 1, 2, 3 ... without a gap)")
        if (kind is EventType.SESSION_CREATED) != (expected == 1):
            raise InvalidEvent("a journal has exactly one SESSION_CREATED, and it comes first")
        self.last_seq = expected
