"""The journal's vocabulary: event types, the Envelope, reason shapes, JSON round-trip.

The rules an event's payload follows are checked by `sectr.payloads`."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import Enum
from typing import Any


class EventType(str, Enum):
    SESSION_CREATED = "SESSION_CREATED"
    SESSION_UPDATED = "SESSION_UPDATED"
    INVOCATION_STARTED = "INVOCATION_STARTED"
    INVOCATION_SUSPENDED = "INVOCATION_SUSPENDED"
    INVOCATION_COMPLETED = "INVOCATION_COMPLETED"
    INVOCATION_FAILED = "INVOCATION_FAILED"
    INVOCATION_CANCELLED = "INVOCATION_CANCELLED"
    MESSAGE_START = "MESSAGE_START"
    MESSAGE_DELTA = "MESSAGE_DELTA"
    MESSAGE_END = "MESSAGE_END"
    TOOL_CALL = "TOOL_CALL"
    TOOL_RESULT = "TOOL_RESULT"
    #: The intent to run a tool call, journaled (and committed) before the tool runs:
    #: after a crash, a call with TOOL_STARTED and no TOOL_RESULT may have taken effect.
    TOOL_STARTED = "TOOL_STARTED"
    APPROVAL_REQUESTED = "APPROVAL_REQUESTED"
    APPROVAL_VOTED = "APPROVAL_VOTED"
    STEER_RECEIVED = "STEER_RECEIVED"
    TRANSCRIPT_COMPACTED = "TRANSCRIPT_COMPACTED"
    SESSION_ERROR = "SESSION_ERROR"

    def __str__(self) -> str:
        return self.value


#: The events that end an invocation. Exactly one of them closes each INVOCATION_STARTED.
TERMINAL_TYPES = frozenset(
    {
        EventType.INVOCATION_SUSPENDED,
        EventType.INVOCATION_COMPLETED,
        EventType.INVOCATION_FAILED,
        EventType.INVOCATION_CANCELLED,
    }
)

REASON_KINDS = frozenset({"user_message", "approval_decision", "retry", "recover"})
VERDICTS = ("allow_once", "allow_always", "deny", "respond")
#: The verdicts a vote towards a quorum may carry: an edited call or a person's answer
#: instead of the call decides an ask one person decides only.
VOTE_VERDICTS = ("allow_once", "allow_always", "deny")
#: A person's answer instead of running the call (`respond`), and edited arguments
#: (`allow_once` with `arguments`): their largest size, in characters (arguments as JSON).
RESPONSE_MAX = 20_000
EDITED_ARGUMENTS_MAX = 100_000
#: The scopes an approving decision may carry: "turn" ("Approve all") also approves the
#: later gated calls of the same assistant message that would otherwise ask.
DECISION_SCOPES = ("turn",)
MODES = ("default", "plan", "accept_edits")
#: How an imported journal names the people in it (`imported:alice`): an import restores a
#: transcript, not other people's decisions, so a vote or a decision in it is never a live
#: user's (the audit's actor, a quorum's count, a filter by user all see the prefix).
IMPORTED_PREFIX = "imported:"


def imported_name(name: str) -> str:
    return name if name.startswith(IMPORTED_PREFIX) else IMPORTED_PREFIX + name


def utcnow() -> datetime:
    return datetime.now(UTC)


#: Each EventType by its value (Envelope.from_dict).
_EVENT_TYPES: dict[str, EventType] = {event_type.value: event_type for event_type in EventType}


@dataclass(frozen=True, slots=True)
class Envelope:
    session_id: str
    seq: int
    invocation_id: str | None
    type: EventType
    payload: dict[str, Any]
    created_at: datetime = field(default_factory=utcnow)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict (what the channel layer and the SSE stream carry)."""
        return {
            "session_id": self.session_id,
            "seq": self.seq,
            "invocation_id": self.invocation_id,
            "type": self.type.value,
            "payload": self.payload,
            "created_at": self.created_at.isoformat(),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Envelope:
        """The envelope `to_dict` made `data` of (ValueError for an unknown type).

        Every live stream rebuilds each envelope the channel layer brings it, one per
        streamed chunk per client: the type is looked up by value in a dict (EventType(...)
        goes through the enum's metaclass call, 0.7 us) and the fields passed by position
        (keywords cost a frozen dataclass's __init__ 0.4 us more): 2.8 us a call, was 4.2."""
        created = data["created_at"]
        if isinstance(created, str):
            created = datetime.fromisoformat(created)
        if created.tzinfo is None:
            created = created.replace(tzinfo=UTC)
        kind = data["type"]
        event_type = _EVENT_TYPES.get(kind) if type(kind) is str else None
        return cls(
            str(data["session_id"]),
            int(data["seq"]),
            data.get("invocation_id"),
            event_type if event_type is not None else EventType(kind),
            dict(data["payload"]),
            created,
        )

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Envelope:
        return cls.from_dict(json.loads(text))


# ---- reason shapes (INVOCATION_STARTED.payload.reason) ----


def user_message_reason(content: str | list[dict[str, Any]], author: str | None = None) -> dict[str, Any]:
    reason: dict[str, Any] = {"kind": "user_message", "input": {"content": content}}
    if author is not None:
        reason["author"] = author
    return reason


def approval_decision_reason(
    ask_id: str,
    approved: bool,
    *,
    approver: str | None = None,
    verdict: str | None = None,
    note: str | None = None,
    scope: str | None = None,
    arguments: dict[str, Any] | None = None,
    result: str | None = None,
) -> dict[str, Any]:
    """The reason of the INVOCATION_STARTED a decision journals. `arguments`: the call's
    arguments as a person edited them (allow_once; the ask keeps those asked); `result`:
    a person's answer instead of running the call (verdict respond, not approved)."""
    decision: dict[str, Any] = {"approved": approved}
    if approver is not None:
        decision["approver"] = approver
    if verdict is not None:
        decision["verdict"] = verdict
    if note is not None:
        decision["note"] = note
    if scope is not None:
        decision["scope"] = scope
    if arguments is not None:
        decision["arguments"] = arguments
    if result is not None:
        decision["result"] = result
    return {"kind": "approval_decision", "ask_id": ask_id, "decision": decision}


def retry_reason(of_invocation_id: str) -> dict[str, Any]:
    return {"kind": "retry", "of_invocation_id": of_invocation_id}


def recover_reason(of_invocation_id: str) -> dict[str, Any]:
    return {"kind": "recover", "of_invocation_id": of_invocation_id}


def usage_dict(
    input_tokens: int = 0, output_tokens: int = 0, reasoning_tokens: int = 0, cached_input_tokens: int = 0
) -> dict[str, int]:
    usage = {"input_tokens": input_tokens, "output_tokens": output_tokens}
    if reasoning_tokens:
        usage["reasoning_tokens"] = reasoning_tokens
    if cached_input_tokens:
        usage["cached_input_tokens"] = cached_input_tokens
    return usage


def add_usage(total: dict[str, int], more: dict[str, Any] | None) -> dict[str, int]:
    """Sum two usage dicts (missing keys count as 0); returns a new dict."""
    result = dict(total)
    for key, value in (more or {}).items():
        if isinstance(value, int):
            result[key] = result.get(key, 0) + value
    return result
