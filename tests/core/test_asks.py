"""sectr.asks: what each envelope changes for an approval ask (the one answer the
journal's projections, the publisher and the moderation queue share)."""

from __future__ import annotations

from typing import Any

from sectr.asks import ASK_EVENT_TYPES, AskChange, ask_changes
from sectr.events import Envelope, EventType, approval_decision_reason, user_message_reason
from sectr.rules import EXPIRED_APPROVER


def envelope(event_type: EventType, payload: dict[str, Any], seq: int = 1) -> Envelope:
    return Envelope("ses_1", seq, "inv_1", event_type, payload)


def test_it_names_each_kind_of_change() -> None:
    asked = envelope(EventType.APPROVAL_REQUESTED, {"ask_id": "ask_1", "name": "write_note"})
    voted = envelope(EventType.APPROVAL_VOTED, {"ask_id": "ask_1", "approver": "mod", "verdict": "allow_once"})
    decided = envelope(
        EventType.INVOCATION_STARTED, {"reason": approval_decision_reason("ask_1", True, approver="mod")}
    )
    expired = envelope(
        EventType.INVOCATION_STARTED, {"reason": approval_decision_reason("ask_1", False, approver=EXPIRED_APPROVER)}
    )
    withdrawn = envelope(EventType.INVOCATION_CANCELLED, {"ask_id": "ask_1", "by": "owner"})
    assert ask_changes(asked) == [AskChange("requested", "ask_1")]
    assert ask_changes(voted) == [AskChange("voted", "ask_1")]
    assert ask_changes(decided) == [AskChange("decided", "ask_1", {"approved": True, "approver": "mod"})]
    assert [c.kind for c in ask_changes(expired)] == ["expired"]
    assert ask_changes(withdrawn) == [AskChange("withdrawn", "ask_1")]
    assert all(c.closes for c in ask_changes(decided) + ask_changes(expired) + ask_changes(withdrawn))
    assert not any(c.closes for c in ask_changes(asked) + ask_changes(voted))


def test_a_rule_decides_in_the_asking_envelope() -> None:
    decision = {"approved": True, "approver": "rule:r1", "verdict": "allow_once"}
    asked = envelope(EventType.APPROVAL_REQUESTED, {"ask_id": "ask_2", "decision": decision})
    assert ask_changes(asked) == [
        AskChange("requested", "ask_2"),
        AskChange("decided", "ask_2", decision, at_once=True),
    ]


def test_other_envelopes_change_no_ask() -> None:
    started = envelope(EventType.INVOCATION_STARTED, {"reason": user_message_reason("hi")})
    cancelled = envelope(EventType.INVOCATION_CANCELLED, {"by": "owner"})
    delta = envelope(EventType.MESSAGE_DELTA, {"message_id": "m", "text": "x"})
    malformed = envelope(EventType.INVOCATION_STARTED, {"reason": "approval_decision"})
    assert [ask_changes(e) for e in (started, cancelled, delta, malformed)] == [[], [], [], []]
    assert EventType.MESSAGE_DELTA not in ASK_EVENT_TYPES


def test_a_cancel_withdraws_the_pending_ask_the_caller_folded() -> None:
    # A cancel names its ask; a fold that knows the pending ask also covers one that does not.
    cancelled = envelope(EventType.INVOCATION_CANCELLED, {"by": "owner"})
    assert ask_changes(cancelled, "ask_3") == [AskChange("withdrawn", "ask_3")]
    named = envelope(EventType.INVOCATION_CANCELLED, {"ask_id": "ask_4"})
    assert ask_changes(named, "ask_4") == [AskChange("withdrawn", "ask_4")]
