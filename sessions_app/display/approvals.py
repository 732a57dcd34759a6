"""The approval card and the calls "Approve all" would approve with it: the chat shows
the cards of one session, the moderation queue those of many."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sectr.events import Envelope, EventType
from sessions_app.display.content import dom_id, pretty_json
from sessions_app.runtime import is_gated_tool


@dataclass
class TurnCall:
    """A gated call of the same assistant message as an ask, later than its call and still
    unanswered: what "Approve all" would approve with it (the card lists them)."""

    tool_call_id: str
    name: str
    arguments: Any  # the JSON text the model wrote

    @property
    def arguments_pretty(self) -> str:
        if isinstance(self.arguments, str):
            try:
                return pretty_json(json.loads(self.arguments))
            except ValueError:
                return self.arguments
        return pretty_json(self.arguments)


def turn_calls_waiting(envelopes: Iterable[Envelope], tool_call_id: Any) -> list[TurnCall]:
    """The later gated calls of the message holding `tool_call_id` that have no result."""
    if not tool_call_id:
        return []
    calls: dict[str, list[dict[str, Any]]] = {}
    answered: set[str] = set()
    message_of_ask = None
    for envelope in envelopes:
        if envelope.type is EventType.TOOL_CALL:
            message_id = str(envelope.payload.get("message_id"))
            calls.setdefault(message_id, []).append(envelope.payload)
            if envelope.payload.get("tool_call_id") == tool_call_id:
                message_of_ask = message_id
        elif envelope.type is EventType.TOOL_RESULT:
            answered.add(str(envelope.payload.get("tool_call_id")))
    if message_of_ask is None:
        return []
    siblings = calls[message_of_ask]
    position = next(i for i, call in enumerate(siblings) if call.get("tool_call_id") == tool_call_id)
    return [
        TurnCall(str(call.get("tool_call_id")), str(call.get("name", "")), call.get("arguments", ""))
        for call in siblings[position + 1 :]
        if str(call.get("tool_call_id")) not in answered and is_gated_tool(str(call.get("name", "")))
    ]


@dataclass
class ApprovalView:
    ask_id: str
    name: str
    arguments: Any
    seq: int
    status: str = "pending"  # pending, approved, denied, withdrawn
    verdict: str | None = None
    approver: str | None = None
    note: str | None = None
    session_id: str = ""
    session_title: str | None = None  # set where cards of many sessions are listed
    owner: str | None = None
    at: datetime | None = None
    kind: str = "approval"
    #: the transcript shows the tool call this card asks about (with its arguments): the
    #: pending card shows them instead of the call, the decided card leaves them to it
    call_shown: bool = False
    approvals_required: int = 1
    #: the later gated calls of the ask's turn still unanswered (pending cards only)
    turn_calls: list[TurnCall] = field(default_factory=list)
    tool_call_id: str | None = None  # None: a handler's request_approval, not a tool call

    @property
    def can_answer(self) -> bool:
        """Whether the card offers `Edit arguments` and `Respond`: pending, one person
        decides, and a tool call's ask (there is a call to edit or to answer)."""
        return self.is_pending and self.approvals_required <= 1 and self.tool_call_id is not None

    @property
    def can_approve_all(self) -> bool:
        """Whether the card offers "Approve all": pending, one person decides, calls wait."""
        return self.is_pending and self.approvals_required <= 1 and bool(self.turn_calls)

    @property
    def shows_arguments(self) -> bool:
        return self.is_pending or not self.call_shown

    @property
    def dom_id(self) -> str:
        return dom_id("ask", self.ask_id)

    @property
    def arguments_pretty(self) -> str:
        return pretty_json(self.arguments)

    @property
    def is_pending(self) -> bool:
        return self.status == "pending"

    @property
    def verdict_label(self) -> str:
        labels = {
            "allow_once": "Approved once",
            "allow_always": "Always allowed",
            "deny": "Denied",
            "respond": "Answered",
        }
        return labels.get(self.verdict or "", self.status.capitalize())

    @classmethod
    def from_ask(cls, ask: dict[str, Any], session_id: str) -> ApprovalView:
        return cls(
            ask_id=str(ask.get("ask_id")),
            name=str(ask.get("name", "")),
            arguments=ask.get("arguments", {}),
            seq=int(ask.get("seq") or 0),
            status=str(ask.get("status", "pending")),
            verdict=ask.get("verdict"),
            approver=ask.get("approver"),
            note=ask.get("note"),
            session_id=session_id,
            approvals_required=int(ask.get("approvals_required") or 1),
            tool_call_id=ask.get("tool_call_id"),
        )
