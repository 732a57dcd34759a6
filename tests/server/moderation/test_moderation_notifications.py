"""Moderation notifications: team webhooks (signed, retried, logged) and email to moderators.

Webhook calls go to a real HTTP server on loopback (allowed by
SECTR_WEBHOOK_ALLOWED_HOSTS), started by the test, which checks the HMAC-SHA256
signature of every body it receives.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from django.core import mail

from sessions_app import actions
from sessions_app.models import NotificationDelivery, Session, Team, TeamWebhook
from sessions_app.moderation.notifications import deliver_due
from tests.server.conftest import SessionFactory, compiled_models
from tests.server.moderation.test_moderation_ui import pending, team_session

pytestmark = pytest.mark.django_db
SECRET = "s3cret-for-tests"


class Receiver:
    """A loopback HTTP server that records webhook calls; `fail_first` answers 500 first."""

    def __init__(self, fail_first: int = 0) -> None:
        self.calls: list[dict[str, Any]] = []
        self.fail_first = fail_first
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                timestamp = self.headers["X-Sectr-Timestamp"]
                expected = (
                    "sha256=" + hmac.new(SECRET.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
                )
                receiver.calls.append(
                    {
                        "event": self.headers["X-Sectr-Event"],
                        "signed": hmac.compare_digest(expected, self.headers["X-Sectr-Signature"]),
                        "body": json.loads(body),
                    }
                )
                status = 500 if len(receiver.calls) <= receiver.fail_first else 204
                self.send_response(status)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(autouse=True)
def loopback_receivers_allowed(settings: Any) -> None:
    # The receivers here listen on loopback, which webhooks may reach only when the
    # operator allows it (tests/server/moderation/test_webhook_addresses.py tests the refusals).
    settings.SECTR_WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    yield server
    server.close()


def test_a_new_ask_and_its_decision_call_the_team_webhook_signed(
    make_session: SessionFactory, ops: Team, teammate: Any, receiver: Receiver
) -> None:
    TeamWebhook.objects.create(team=ops, url=receiver.url, secret=SECRET)
    session = team_session(make_session, ops)
    pending(session)
    assert NotificationDelivery.objects.filter(channel="webhook", status="pending").count() == 1
    assert deliver_due() == 2  # the webhook call and the moderators' email
    actions.do_decide(teammate, "ask_1", "deny", note="no")
    assert deliver_due() == 1  # decisions are not emailed
    assert [(c["event"], c["signed"]) for c in receiver.calls] == [("ask.requested", True), ("ask.decided", True)]
    asked, decided = (c["body"] for c in receiver.calls)
    assert asked["team"] == "ops" and asked["session_id"] == session.pk and asked["tool"] == "write_note"
    assert asked["arguments"] == {"title": "buy milk", "body": "buy milk"} and asked["url"].endswith(
        "/approvals/#ask-ask_1"
    )
    assert (decided["actor"], decided["verdict"], decided["note"]) == ("teammate", "deny", "no")
    assert decided["seconds_to_decide"] is not None
    log = list(
        NotificationDelivery.objects.filter(channel="webhook")
        .order_by("id")
        .values_list("status", "attempts", "last_status_code")
    )
    assert log == [("delivered", 1, 204), ("delivered", 1, 204)]
    assert deliver_due() == 0  # nothing is sent twice


def test_a_failing_webhook_is_retried_with_backoff_then_given_up(
    make_session: SessionFactory, ops: Team, settings: Any
) -> None:
    settings.SECTR_WEBHOOK_BACKOFF_SECONDS = 0.2
    settings.SECTR_WEBHOOK_MAX_ATTEMPTS = 3
    server = Receiver(fail_first=1)
    try:
        TeamWebhook.objects.create(team=ops, url=server.url, secret=SECRET)
        pending(team_session(make_session, ops))
        deliver_due()
        delivery = NotificationDelivery.objects.get(channel="webhook")
        assert (delivery.status, delivery.attempts, delivery.last_status_code) == ("pending", 1, 500)
        assert deliver_due() == 0  # not yet: it waits for its backoff
        time.sleep(0.3)
        assert deliver_due() == 1
        delivery.refresh_from_db()
        assert (delivery.status, delivery.attempts, delivery.last_status_code) == ("delivered", 2, 204)
        assert len(server.calls) == 2 and all(c["signed"] for c in server.calls)
    finally:
        server.close()
    # An unreachable receiver: each attempt waits twice as long, then it gives up.
    TeamWebhook.objects.update(url=server.url)  # the server is closed now
    pending(team_session(make_session, ops, "second"), "ask_2")
    delivery = NotificationDelivery.objects.filter(channel="webhook").latest("id")
    waits = []
    for _ in range(3):
        deliver_due()
        delivery.refresh_from_db()
        waits.append((delivery.next_attempt_at - delivery.created_at).total_seconds())
        NotificationDelivery.objects.filter(pk=delivery.pk, status="pending").update(
            next_attempt_at=delivery.created_at
        )
    assert (delivery.status, delivery.attempts, delivery.last_error) == ("failed", 3, "connection refused")
    assert 0.15 < waits[0] < waits[1]  # 0.2 s, then 0.4 s


def test_two_senders_never_send_one_delivery_twice(make_session: SessionFactory, ops: Team, receiver: Receiver) -> None:
    TeamWebhook.objects.create(team=ops, url=receiver.url, secret=SECRET)
    for number in range(5):
        pending(team_session(make_session, ops, f"s{number}"), f"ask_{number}")
    from sessions_app.moderation.notifications import claim_due

    first, second = claim_due(limit=100), claim_due(limit=100)
    assert len(first) == 10 and second == []  # 5 webhook calls, 5 emails


def test_a_sender_with_nothing_due_builds_one_query(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every worker looks once a second: with nothing due, only the look is compiled, and
    only once (neither the due rows' queryset nor the claimed rows' is built)."""
    from sessions_app.moderation import notifications
    from sessions_app.moderation.notifications import claim_due

    notifications._anything_due.clear()
    compiled = compiled_models(monkeypatch)
    assert claim_due() == [] and claim_due() == []
    assert compiled == [NotificationDelivery]


def test_moderators_get_an_email_with_a_link_to_the_card(
    make_session: SessionFactory, ops: Team, teammate: Any, owner: Any
) -> None:
    pending(team_session(make_session, ops))
    assert deliver_due() == 1
    (message,) = mail.outbox
    assert message.to == [teammate.email] and owner.email not in message.to  # moderators only
    assert "write_note" in message.subject and "/approvals/#ask-ask_1" in message.body
    assert '"body": "buy milk"' in message.body


def test_a_re_ask_after_a_crash_says_the_first_attempt_may_have_run(
    make_session: SessionFactory, ops: Team, receiver: Receiver
) -> None:
    from sessions_app.moderation.slack import MAY_HAVE_RUN, slack_message

    TeamWebhook.objects.create(team=ops, url=receiver.url, secret=SECRET)
    pending(team_session(make_session, ops, "first"), ask_id="ask_plain")
    pending(team_session(make_session, ops, "again"), ask_id="ask_again", may_have_run=True)
    assert deliver_due() == 4  # a webhook call and an email per ask
    bodies = {call["body"]["ask_id"]: call["body"] for call in receiver.calls}
    assert bodies["ask_plain"]["may_have_run"] is False and bodies["ask_again"]["may_have_run"] is True
    emails = {message.subject: message.body for message in mail.outbox}
    assert [MAY_HAVE_RUN in body for body in emails.values()].count(True) == 1
    (again,) = [body for body in emails.values() if MAY_HAVE_RUN in body]
    assert "again" in again
    said = json.dumps(slack_message(bodies["ask_again"]))
    assert "may have taken effect" in said
    assert "may have taken effect" not in json.dumps(slack_message(bodies["ask_plain"]))


def test_personal_sessions_and_rule_decided_asks_email_nobody(
    make_session: SessionFactory, ops: Team, outsider: Any
) -> None:
    personal = make_session(outsider, title="personal")
    assert personal.team_id is None
    pending(personal)
    assert not NotificationDelivery.objects.exists()
    session = team_session(make_session, ops)
    from sectr.events import EventType
    from sectr.journal import NewEvent
    from tests.server.chat.test_web import append, started

    decided = {"approved": False, "approver": "rule:r1", "verdict": "deny"}
    append(
        session,
        [
            started("note: x", inv="inv_r"),
            NewEvent(
                EventType.APPROVAL_REQUESTED,
                {"ask_id": "ask_r", "tool_call_id": None, "name": "delete_note", "arguments": {}, "decision": decided},
                "inv_r",
            ),
        ],
    )
    assert not NotificationDelivery.objects.filter(channel="email").exists()
    assert Session.objects.filter(pk=session.pk).exists()


def test_an_ask_approved_with_another_of_its_turn_emails_nobody(make_session: SessionFactory, ops: Team) -> None:
    from sectr.events import EventType
    from sectr.journal import NewEvent
    from tests.server.chat.test_web import append, started

    session = team_session(make_session, ops)
    TeamWebhook.objects.create(team=ops, url="http://127.0.0.1:9/hook", secret=SECRET)  # never sent here
    decided = {"approved": True, "approver": "teammate", "verdict": "allow_once", "with_ask": "ask_0"}
    append(
        session,
        [
            started("note: x", inv="inv_t"),
            NewEvent(
                EventType.APPROVAL_REQUESTED,
                {"ask_id": "ask_t", "tool_call_id": "c_t", "name": "write_note", "arguments": {}, "decision": decided},
                "inv_t",
            ),
        ],
    )
    assert not NotificationDelivery.objects.filter(channel="email").exists()
    # one webhook call: the decision (the ask is announced by it, not as waiting)
    assert list(NotificationDelivery.objects.values_list("event", flat=True)) == ["ask.decided"]
