"""Action links: the email and webhook notices of a new ask link to /approvals/act/<token>/,
a signed, single-use, bound and expiring link whose GET never decides and whose POST does.

Standing users: owner (member of team ops, owns the session), teammate (moderator of
ops, with an email address), outsider (no team)."""

from __future__ import annotations

import re
from typing import Any
from unittest import mock

import pytest
from django.core import mail, signing
from django.test import Client

from sessions_app import action_links as links
from sessions_app.models import ActionLinkUse, Envelope, Membership, NotificationDelivery, Session, Team, TeamWebhook
from sessions_app.moderation.notifications import send_email
from tests.server.chat.test_web import append, asked, logged_in, started
from tests.server.conftest import SessionFactory, make_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def ops(ops: Team, teammate: Any) -> Team:
    """The moderation tests' team, its moderator with an email address."""
    type(teammate).objects.filter(pk=teammate.pk).update(email="teammate@example.com")
    return ops


def pending_session(make_session: SessionFactory, team: Team) -> Session:
    session = make_session(title="Ops session")
    Session.objects.filter(pk=session.pk).update(team=team)
    append(session, [started("note: buy milk", inv="inv_2"), *asked(inv="inv_2", mid="msg_2")])
    return session


def decisions(session: Session) -> list[dict[str, Any]]:
    return [
        e.payload["reason"]["decision"]
        for e in Envelope.objects.filter(
            session=session, type="INVOCATION_STARTED", payload__reason__kind="approval_decision"
        )
    ]


def path_of(url: str) -> str:
    match = re.search(r"/approvals/act/[^/\s]+/", url)
    assert match is not None, url
    return match.group(0)


def email_link(teammate: Any) -> str:
    return path_of(links.link_url("ask_1", links.EMAIL, teammate.pk))


def test_the_email_of_a_new_ask_carries_a_link_for_its_moderator(
    make_session: SessionFactory, ops: Team, teammate: Any, settings: Any
) -> None:
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    session = pending_session(make_session, ops)
    delivery = NotificationDelivery.objects.get(channel=NotificationDelivery.EMAIL, ask_id="ask_1")
    assert delivery.payload["action_url"] is None  # the outbox holds no email link
    send_email(delivery)
    (message,) = mail.outbox
    assert message.to == ["teammate@example.com"]
    link = links.read_token(path_of(message.body).split("/")[3])
    assert (link.ask_id, link.channel, link.user_id) == ("ask_1", links.EMAIL, teammate.pk)
    assert decisions(session) == []


def test_the_email_link_works_through_the_file_backend(
    make_session: SessionFactory, ops: Team, teammate: Any, settings: Any, tmp_path: Any
) -> None:
    settings.EMAIL_BACKEND = "django.core.mail.backends.filebased.EmailBackend"
    settings.EMAIL_FILE_PATH = str(tmp_path)
    session = pending_session(make_session, ops)
    send_email(NotificationDelivery.objects.get(channel=NotificationDelivery.EMAIL, ask_id="ask_1"))
    (written,) = list(tmp_path.iterdir())
    path = path_of(written.read_text())
    client = logged_in(teammate)
    page = client.get(path)
    assert page.status_code == 200 and decisions(session) == []  # GET never decides
    html = page.content.decode()
    assert "Approve once</button>" in html and "Deny</button>" in html and 'name="note"' in html
    assert "note: buy milk" in html and "&quot;body&quot;: &quot;buy milk&quot;" in html and "Ops session" in html
    done = client.post(path, {"verdict": "deny", "note": "not now"})
    assert done.status_code == 200 and "Denied by teammate: not now" in done.content.decode()
    assert decisions(session) == [{"approved": False, "approver": "teammate", "verdict": "deny", "note": "not now"}]
    again = client.post(path, {"verdict": "allow_once"})
    assert again.status_code == 410 and "This link decides nothing" in again.content.decode()
    assert len(decisions(session)) == 1


def test_a_link_needs_a_login_first(make_session: SessionFactory, ops: Team, teammate: Any) -> None:
    session = pending_session(make_session, ops)
    path = email_link(teammate)
    anonymous = Client()
    assert anonymous.get(path).status_code == 302
    response = anonymous.post(path, {"verdict": "allow_once"})
    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/?next=")
    assert decisions(session) == []


def test_with_the_team_setting_an_email_link_decides_without_login_but_a_webhook_link_never(
    make_session: SessionFactory, ops: Team, teammate: Any
) -> None:
    Team.objects.filter(pk=ops.pk).update(links_decide_without_login=True)
    session = pending_session(make_session, ops)
    webhook_path = path_of(links.link_url("ask_1", links.WEBHOOK))
    assert Client().get(webhook_path).status_code == 302
    assert Client().post(webhook_path, {"verdict": "allow_once"}).status_code == 302
    client = Client(enforce_csrf_checks=True)
    path = email_link(teammate)
    page = client.get(path)
    assert page.status_code == 200 and "Deciding as teammate" in page.content.decode()
    assert client.post(path, {"verdict": "allow_once"}).status_code == 403  # CSRF: no token, no decision
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.content.decode())
    assert token is not None
    done = client.post(path, {"verdict": "allow_once", "csrfmiddlewaretoken": token.group(1)})
    assert done.status_code == 200 and "Approved once by teammate" in done.content.decode()
    assert decisions(session) == [{"approved": True, "approver": "teammate", "verdict": "allow_once"}]


def test_an_email_link_is_bound_to_its_moderator(
    make_session: SessionFactory, ops: Team, teammate: Any, owner: Any
) -> None:
    session = pending_session(make_session, ops)
    other = make_user("second_mod")
    Membership.objects.create(team=ops, user=other, role="moderator")
    path = email_link(teammate)
    for user in (other, owner):
        response = logged_in(user).post(path, {"verdict": "allow_once"})
        assert response.status_code == 403 and "sent to someone else" in response.content.decode()
    assert decisions(session) == []


def test_a_webhook_link_lets_whoever_may_decide_decide_after_login(
    make_session: SessionFactory, ops: Team, owner: Any, outsider: Any
) -> None:
    session = pending_session(make_session, ops)
    path = path_of(links.link_url("ask_1", links.WEBHOOK))
    refused = logged_in(outsider).post(path, {"verdict": "allow_once"})
    assert refused.status_code == 403 and decisions(session) == []
    done = logged_in(owner).post(path, {"verdict": "allow_once"})
    assert done.status_code == 200 and decisions(session)[0]["approver"] == "owner"


@pytest.mark.parametrize(
    "token",
    [
        "nonsense",
        signing.dumps({"a": "ask_1", "c": "webhook", "u": None, "n": "x"}, salt="another salt"),
        signing.dumps({"a": "ask_1", "c": "email", "u": None, "n": "x"}, salt=links.LINK_SALT),
        signing.dumps(["ask_1"], salt=links.LINK_SALT),
    ],
    # Fixed ids: a signed token carries its time, and parallel test workers (pytest-xdist)
    # must collect the same test names.
    ids=["nonsense", "other-salt", "email-without-user", "not-a-dict"],
)
def test_a_forged_or_altered_token_decides_nothing(
    make_session: SessionFactory, ops: Team, teammate: Any, token: str
) -> None:
    session = pending_session(make_session, ops)
    response = logged_in(teammate).post(f"/approvals/act/{token}/", {"verdict": "allow_once"})
    assert response.status_code == 404 and "not a valid Sectr link" in response.content.decode()
    assert decisions(session) == []


def test_an_altered_signature_decides_nothing(make_session: SessionFactory, ops: Team, teammate: Any) -> None:
    session = pending_session(make_session, ops)
    token = email_link(teammate).split("/")[3]
    forged = token[:-1] + ("A" if token[-1] != "A" else "B")
    assert logged_in(teammate).post(f"/approvals/act/{forged}/", {"verdict": "allow_once"}).status_code == 404
    assert decisions(session) == []


def test_a_link_expires_after_24_hours(make_session: SessionFactory, ops: Team, teammate: Any) -> None:
    session = pending_session(make_session, ops)
    with mock.patch("django.core.signing.time.time", return_value=1_000_000_000.0):
        path = email_link(teammate)
    response = logged_in(teammate).post(path, {"verdict": "allow_once"})
    assert response.status_code == 410 and "expired" in response.content.decode()
    assert decisions(session) == []


def test_a_link_of_a_decided_ask_says_so(make_session: SessionFactory, ops: Team, teammate: Any, owner: Any) -> None:
    session = pending_session(make_session, ops)
    logged_in(owner).post("/asks/ask_1/decide", {"verdict": "deny"})
    page = logged_in(teammate).get(email_link(teammate))
    assert page.status_code == 410 and "no longer waiting: it was denied by owner" in page.content.decode()
    assert len(decisions(session)) == 1


def test_a_used_link_is_refused_even_by_a_second_ask_path(
    make_session: SessionFactory, ops: Team, teammate: Any
) -> None:
    pending_session(make_session, ops)
    path = email_link(teammate)
    token = path.split("/")[3]
    ActionLinkUse.objects.create(digest=links.read_token(token).digest, ask_id="ask_1", used_by="teammate")
    response = logged_in(teammate).get(path)
    assert response.status_code == 410 and "used already" in response.content.decode()


def test_a_link_takes_only_approve_once_or_deny(make_session: SessionFactory, ops: Team, teammate: Any) -> None:
    session = pending_session(make_session, ops)
    path = email_link(teammate)
    response = logged_in(teammate).post(path, {"verdict": "allow_always"})
    assert response.status_code == 400 and "approves once or denies" in response.content.decode()
    assert decisions(session) == [] and not ActionLinkUse.objects.exists()  # the link is not spent


def test_the_webhook_notice_of_a_new_ask_carries_a_webhook_link(
    make_session: SessionFactory, ops: Team, teammate: Any
) -> None:
    TeamWebhook.objects.create(team=ops, url="https://hooks.example.com/sectr")
    pending_session(make_session, ops)
    delivery = NotificationDelivery.objects.get(channel=NotificationDelivery.WEBHOOK, ask_id="ask_1")
    link = links.read_token(path_of(delivery.payload["action_url"]).split("/")[3])
    assert (link.ask_id, link.channel, link.user_id) == ("ask_1", links.WEBHOOK, None)
