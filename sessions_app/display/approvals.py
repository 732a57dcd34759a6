"""The approval card and the calls "Approve all" would approve with it: the chat shows
the cards of one session, the moderation queue those of many.

Both cards say the same things about an ask needing several approvals (its quorum) and
one that expires: how many approvals it has and from whom ("1 of 2 approvals: bob"),
when it expires, who approved it in the end ("Approved by bob and carol"), and what
the person looking at it can still do (`ApprovalView.for_viewer`): a moderator who voted
sees "You voted: waiting for 1 more" instead of the buttons, and the requester, whose
own approval does not count towards a quorum, sees no approve buttons (Deny still ends
the ask: a refusal by anyone denies)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone
from django.utils.dateparse import parse_datetime

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
class Vote:
    approver: str
    verdict: str
    note: str = ""


def votes_of(ask: dict[str, Any]) -> list[Vote]:
    return [
        Vote(str(v.get("approver", "")), str(v.get("verdict", "")), str(v.get("note") or ""))
        for v in ask.get("votes") or []
        if isinstance(v, dict)
    ]


def expiry_of(ask: dict[str, Any]) -> datetime | None:
    """When a pending ask is denied unless decided (its rule's `expires_after_s` after
    it was asked), None when it never expires."""
    seconds = ask.get("expires_after_s")
    asked = parse_datetime(str(ask.get("requested_at") or ""))
    if not seconds or asked is None:
        return None
    return asked + timedelta(seconds=int(seconds))


def names_joined(names: list[str]) -> str:
    """bob; bob and carol; bob, carol and dave."""
    if len(names) <= 1:
        return "".join(names)
    return ", ".join(names[:-1]) + " and " + names[-1]


def remaining_text(seconds: float) -> str:
    """A countdown's words (static/sectr.js writes the same as it counts down)."""
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min"
    if seconds < 86400:
        return f"{seconds // 3600} h {seconds % 3600 // 60} min"
    return f"{seconds // 86400} d {seconds % 86400 // 3600} h"


@dataclass
class ViewerPart:
    """What one person may still do with a card, and what it tells them instead."""

    may_approve: bool
    may_deny: bool
    #: why they get fewer buttons or none ("" when they get them all)
    waiting: str = ""

    @property
    def may_decide(self) -> bool:
        return self.may_approve or self.may_deny


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
    #: the votes so far (an ask needing several approvals; the deciding vote included)
    votes: list[Vote] = field(default_factory=list)
    expires_at: datetime | None = None
    #: a crash cut off an earlier attempt of this very call after it started: it may
    #: have taken effect already, and approving runs it again
    may_have_run: bool = False

    @property
    def approvers(self) -> list[str]:
        """Who approved (votes that did not deny), in order."""
        return [vote.approver for vote in self.votes if vote.verdict != "deny"]

    @property
    def approvals_missing(self) -> int:
        return max(0, self.approvals_required - len(self.approvers))

    @property
    def progress(self) -> str:
        """A pending quorum's state: "1 of 2 approvals: bob" ("" for one approver)."""
        if self.approvals_required <= 1:
            return ""
        names = self.approvers
        text = f"{len(names)} of {self.approvals_required} approvals"
        return f"{text}: {names_joined(names)}" if names else text

    @property
    def expires_iso(self) -> str:
        return self.expires_at.isoformat() if self.expires_at else ""

    @property
    def expires_in(self) -> str:
        """ "expires in 54 min" (static/sectr.js keeps counting down in the page)."""
        if self.expires_at is None:
            return ""
        left = (self.expires_at - timezone.now()).total_seconds()
        return f"expires in {remaining_text(left)}" if left > 0 else "expiring now"

    @property
    def outcome(self) -> str:
        """A decided card's line: "Approved once by bob", "Approved by bob and carol",
        "Denied by dana: too risky" (the note, when there is one, after a colon)."""
        label = self.verdict_label
        by = self.approver or ""
        approvers = self.approvers
        if self.status == "approved" and len(approvers) > 1:
            # A quorum: everyone who approved, not just the last one.
            label = "Always allowed" if self.verdict == "allow_always" else "Approved"
            by = names_joined(approvers)
        text = f"{label} by {by}" if by else label
        return f"{text}: {self.note}" if self.note else text

    def for_viewer(self, viewer: str | None, owner: str | None, can_approve: bool) -> ViewerPart:
        """What `viewer` (a username) may do with this card: `owner` is the session's
        owner (the requester), `can_approve` whether the viewer may decide its asks at
        all. The server refuses the same things (sectr.operations.vote_events)."""
        if not self.is_pending:
            return ViewerPart(False, False)
        if not can_approve:
            return ViewerPart(False, False, "Waiting for the owner or a moderator to decide.")
        missing = self.approvals_missing
        more = f"{missing} more approval{'s' if missing != 1 else ''}"
        if self.approvals_required > 1 and viewer and any(vote.approver == viewer for vote in self.votes):
            return ViewerPart(False, False, f"You voted: waiting for {missing} more")
        if self.approvals_required > 1 and viewer and viewer == owner:
            return ViewerPart(
                False,
                True,
                f"Your own approval does not count on an ask needing {self.approvals_required} approvals: "
                f"waiting for {more} from the team's moderators.",
            )
        return ViewerPart(True, True)

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
            votes=votes_of(ask),
            expires_at=expiry_of(ask),
            may_have_run=bool(ask.get("may_have_run")),
        )
