"""What an envelope changes for an approval ask: the one answer to "is this an ask event?".

An ask is requested (APPROVAL_REQUESTED; one an approval rule decided at once carries
its ``decision`` and is decided in the same envelope), voted on towards a quorum
(APPROVAL_VOTED), decided (INVOCATION_STARTED whose reason is ``approval_decision``:
a person, a quorum's last vote or a rule), expired (the same, decided by the expiry
policy, approver ``policy:expired``) or withdrawn (INVOCATION_CANCELLED of the run
paused on it; the envelope names the ask).

The fold (sectr.state) applies these to a session's asks; the Django side's projections
(the ask index, the audit), the publisher and the moderation queue's consumer ask
`ask_changes` which envelopes concern asks, and what they do to which ask.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from sectr.events import Envelope, EventType
from sectr.rules import EXPIRED_APPROVER

AskChangeKind = Literal["requested", "voted", "decided", "expired", "withdrawn"]

#: The envelope types that may change an ask (a cheap filter before `ask_changes`).
ASK_EVENT_TYPES = frozenset(
    {
        EventType.APPROVAL_REQUESTED,
        EventType.APPROVAL_VOTED,
        EventType.INVOCATION_STARTED,
        EventType.INVOCATION_CANCELLED,
    }
)


@dataclass(frozen=True, slots=True)
class AskChange:
    kind: AskChangeKind
    ask_id: str
    #: decided or expired: the decision as journaled ({"approved", "approver", "verdict", ...})
    decision: dict[str, Any] = field(default_factory=dict)
    #: decided by the envelope that asked (an approval rule matched at once)
    at_once: bool = False

    @property
    def closes(self) -> bool:
        """Whether the ask is no longer pending after this change."""
        return self.kind in ("decided", "expired", "withdrawn")


def ask_changes(envelope: Envelope, pending_ask_id: str | None = None) -> list[AskChange]:
    """What `envelope` changes for asks, in order (empty: it concerns no ask).

    `pending_ask_id`: the ask pending before this envelope, where the caller folds the
    session's state; a cancel withdraws it when the envelope does not name its ask.
    """
    if envelope.type not in ASK_EVENT_TYPES:
        return []
    payload = envelope.payload
    if envelope.type is EventType.APPROVAL_REQUESTED:
        ask_id = _ask_id(payload.get("ask_id"))
        changes = [AskChange("requested", ask_id)]
        if isinstance(payload.get("decision"), dict):
            changes.append(_decision(ask_id, payload["decision"], at_once=True))
        return changes
    if envelope.type is EventType.APPROVAL_VOTED:
        return [AskChange("voted", _ask_id(payload.get("ask_id")))]
    if envelope.type is EventType.INVOCATION_STARTED:
        reason = payload.get("reason")
        if not isinstance(reason, dict) or reason.get("kind") != "approval_decision":
            return []
        decision = reason.get("decision")
        return [_decision(_ask_id(reason.get("ask_id")), decision if isinstance(decision, dict) else {})]
    withdrawn = payload.get("ask_id") or pending_ask_id  # INVOCATION_CANCELLED
    return [AskChange("withdrawn", str(withdrawn))] if withdrawn else []


def _ask_id(value: Any) -> str:
    return "" if value is None else str(value)


def _decision(ask_id: str, decision: dict[str, Any], *, at_once: bool = False) -> AskChange:
    kind: AskChangeKind = "expired" if decision.get("approver") == EXPIRED_APPROVER else "decided"
    return AskChange(kind, ask_id, decision, at_once)
