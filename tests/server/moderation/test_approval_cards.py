"""The words of an approval card (sessions_app.display.approvals) and the chat's card
following a quorum's votes (sessions_app.chat.view_model), without a database."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from django.utils import timezone

from sectr.events import Envelope, EventType
from sessions_app.chat.view_model import ChatViewModel
from sessions_app.display.approvals import ApprovalView, remaining_text
from tests.server.chat.test_web import asked, started


def card(**ask: Any) -> ApprovalView:
    base = {"ask_id": "ask_1", "name": "write_note", "arguments": {}, "seq": 3, "status": "pending"}
    return ApprovalView.from_ask({**base, **ask}, "ses_1")


def test_a_quorum_card_counts_its_approvals_and_names_who_approved() -> None:
    assert card(approvals_required=2).progress == "0 of 2 approvals"
    voted = card(approvals_required=2, votes=[{"approver": "bob", "verdict": "allow_once"}])
    assert voted.progress == "1 of 2 approvals: bob" and voted.approvals_missing == 1
    assert card().progress == ""  # one approval decides: nothing to count
    both = [{"approver": "bob", "verdict": "allow_once"}, {"approver": "carol", "verdict": "allow_once"}]
    decided = card(approvals_required=2, votes=both, status="approved", verdict="allow_once", approver="carol")
    assert decided.outcome == "Approved by bob and carol"
    always = [{**vote, "verdict": "allow_always"} for vote in both]
    assert card(approvals_required=2, votes=always, status="approved", verdict="allow_always").outcome == (
        "Always allowed by bob and carol"
    )
    assert card(status="approved", verdict="allow_once", approver="bob").outcome == "Approved once by bob"
    denied = card(approvals_required=2, votes=[both[0]], status="denied", verdict="deny", approver="dana", note="no")
    assert denied.outcome == "Denied by dana: no"


def test_what_each_viewer_may_do_with_a_two_person_ask() -> None:
    ask = card(approvals_required=2, votes=[{"approver": "bob", "verdict": "allow_once"}])
    assert ask.for_viewer("carol", "alice", True).may_approve
    voter = ask.for_viewer("bob", "alice", True)
    assert not voter.may_decide and voter.waiting == "You voted: waiting for 1 more"
    requester = ask.for_viewer("alice", "alice", True)
    assert not requester.may_approve and requester.may_deny
    assert requester.waiting.startswith("Your own approval does not count on an ask needing 2 approvals")
    reader = ask.for_viewer("tess", "alice", False)
    assert not reader.may_decide and reader.waiting == "Waiting for the owner or a moderator to decide."
    # One approval decides: the requester decides their own ask.
    assert card().for_viewer("alice", "alice", True).may_approve


def test_the_expiry_counts_down_from_the_ask() -> None:
    asked_at = timezone.now() - timedelta(seconds=30)
    expiring = card(requested_at=asked_at.isoformat(), expires_after_s=3300)
    assert expiring.expires_at == asked_at + timedelta(seconds=3300)
    assert expiring.expires_in == "expires in 54 min"
    assert card().expires_at is None and card().expires_in == ""
    assert [remaining_text(s) for s in (5, 125, 3 * 3600 + 120, 90000)] == ["5 s", "2 min", "3 h 2 min", "1 d 1 h"]


def test_the_chat_card_follows_the_votes() -> None:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    events = [started("note: buy milk", inv="inv_2"), *asked()]
    envelopes = [
        Envelope("ses_1", seq, event.invocation_id, event.type, event.payload, at)
        for seq, event in enumerate(events, start=1)
    ]
    [ask] = [e for e in envelopes if e.type is EventType.APPROVAL_REQUESTED]
    ask.payload["approvals_required"] = 2
    vm = ChatViewModel.from_envelopes("ses_1", envelopes)
    vote = {"ask_id": "ask_1", "approver": "bob", "verdict": "allow_once"}
    vm.apply(Envelope("ses_1", len(envelopes) + 1, "inv_2", EventType.APPROVAL_VOTED, vote, at))
    changes = vm.take_changes()
    [shown] = [item for item in changes.replaced if isinstance(item, ApprovalView)]
    assert shown.progress == "1 of 2 approvals: bob"
