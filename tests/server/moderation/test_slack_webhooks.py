"""The `slack` webhook kind: an incoming-webhook body with Block Kit blocks, sent to a
loopback receiver (Slack's own servers cannot be reached from tests), its shape checked
against the limits Slack documents for incoming webhooks and Block Kit."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.test import Client

from sessions_app import action_links as links
from sessions_app import actions
from sessions_app.models import Envelope, NotificationDelivery, Team, TeamWebhook
from sessions_app.moderation.notifications import deliver_due
from sessions_app.moderation.slack import escape, slack_message
from tests.server.chat.test_web import logged_in
from tests.server.conftest import SessionFactory
from tests.server.moderation.test_moderation_notifications import SECRET, Receiver, receiver  # noqa: F401 - a fixture
from tests.server.moderation.test_moderation_ui import pending, team_session

pytestmark = pytest.mark.django_db

# Block Kit's documented rules for the blocks Sectr sends (api.slack.com/reference/block-kit).
BLOCK_TYPES = {"header", "section", "actions", "context", "divider"}
MAX_BLOCKS = 50


def plain_text(value: Any, limit: int) -> None:
    assert isinstance(value, dict) and value["type"] == "plain_text", value
    assert isinstance(value["text"], str) and 1 <= len(value["text"]) <= limit, value
    assert set(value) <= {"type", "text", "emoji"}


def check_slack_body(body: Any) -> None:
    """Fail unless `body` is a valid incoming-webhook message with Block Kit blocks."""
    assert isinstance(body, dict) and set(body) <= {"text", "blocks"}
    assert isinstance(body["text"], str) and body["text"]  # the fallback for notifications
    blocks = body["blocks"]
    assert isinstance(blocks, list) and 1 <= len(blocks) <= MAX_BLOCKS
    for block in blocks:
        assert block["type"] in BLOCK_TYPES, block
        if block["type"] == "header":
            assert set(block) <= {"type", "text", "block_id"}
            plain_text(block["text"], 150)
        elif block["type"] == "section":
            assert set(block) <= {"type", "text", "block_id", "fields", "accessory"}
            text = block["text"]
            assert text["type"] == "mrkdwn" and 1 <= len(text["text"]) <= 3000
        elif block["type"] == "actions":
            elements = block["elements"]
            assert 1 <= len(elements) <= 25
            ids = [element["action_id"] for element in elements]
            assert len(ids) == len(set(ids)) and all(0 < len(i) <= 255 for i in ids)
            for element in elements:
                assert element["type"] == "button"
                assert set(element) <= {"type", "text", "url", "action_id", "style", "value"}
                plain_text(element["text"], 75)
                assert re.match(r"https?://", element["url"]) and len(element["url"]) <= 3000
                assert element.get("style", "primary") in ("primary", "danger")


def test_a_slack_webhook_gets_block_kit_with_working_buttons(
    make_session: SessionFactory,
    ops: Team,
    teammate: Any,
    owner: Any,
    receiver: Receiver,  # noqa: F811 - the fixture
    settings: Any,
) -> None:
    settings.SECTR_BASE_URL = "https://sectr.example.com"
    settings.SECTR_WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]  # the receiver is on the loopback
    TeamWebhook.objects.create(team=ops, url=receiver.url, secret=SECRET, kind=TeamWebhook.SLACK)
    session = team_session(make_session, ops)
    pending(session)
    deliver_due()
    (call,) = receiver.calls
    body = call["body"]
    assert call["signed"] and call["event"] == "ask.requested"
    check_slack_body(body)
    header, asks, arguments, buttons = body["blocks"]
    assert header["text"]["text"] == "Approval needed: write_note"
    assert asks["text"]["text"] == "owner's agent asks to run `write_note` in “Ops session” (team ops)"
    assert arguments["text"]["text"] == '```{\n  "body": "buy milk",\n  "title": "buy milk"\n}```'
    decide, queue = buttons["elements"]
    assert (decide["text"]["text"], decide["style"], queue["text"]["text"]) == (
        "Approve or deny",
        "primary",
        "Open the queue",
    )
    assert queue["url"] == "https://sectr.example.com/approvals/#ask-ask_1"
    # The button leads to the ask's action page: after a login it decides, its GET does not.
    path = decide["url"].removeprefix("https://sectr.example.com")
    assert links.read_token(path.split("/")[3]).channel == links.WEBHOOK
    assert Client().get(path).status_code == 302  # a webhook's link always needs a login
    client = logged_in(teammate)
    assert client.get(path).status_code == 200
    assert not Envelope.objects.filter(session=session, payload__reason__kind="approval_decision").exists()
    assert client.post(path, {"verdict": "allow_once"}).status_code == 200
    deliver_due()
    decided = receiver.calls[-1]["body"]
    check_slack_body(decided)
    assert decided["text"] == "teammate approved once `write_note` in “Ops session” (team ops)"


def test_a_json_webhook_is_unchanged_by_the_slack_kind(
    make_session: SessionFactory,
    ops: Team,
    teammate: Any,
    receiver: Receiver,  # noqa: F811 - the fixture
    settings: Any,
) -> None:
    settings.SECTR_WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]  # the receiver is on the loopback
    TeamWebhook.objects.create(team=ops, url=receiver.url, secret=SECRET)
    pending(team_session(make_session, ops))
    deliver_due()
    body = receiver.calls[0]["body"]
    assert "blocks" not in body and body["event"] == "ask.requested" and "/approvals/act/" in body["action_url"]
    actions.do_decide(teammate, "ask_1", "deny")
    deliver_due()
    assert receiver.calls[-1]["body"]["action_url"] is None  # only a new ask's notice has a link


def test_slack_text_is_escaped_and_cut_to_slacks_limits() -> None:
    payload = {
        "event": "ask.requested",
        "tool": "t" * 200,
        "session_title": "<!channel> & <https://evil.example|click>",
        "team": "ops",
        "requester": "<@U123>",
        "arguments": {"blob": "x" * 5000, "fence": "```"},
        "url": "https://sectr.example.com/approvals/",
        "action_url": "https://sectr.example.com/approvals/act/t/",
    }
    body = slack_message(payload)
    check_slack_body(body)
    asks = body["blocks"][1]["text"]["text"]
    assert "<!channel>" not in asks and "&lt;!channel&gt; &amp; &lt;https://evil.example|click&gt;" in asks
    assert "<@U123>" not in asks
    assert body["blocks"][2]["text"]["text"].count("```") == 2  # the arguments cannot close the fence
    assert escape("a<b>&") == "a&lt;b&gt;&amp;"
    for event in ("ask.voted", "ask.decided", "ask.withdrawn"):
        check_slack_body(slack_message({**payload, "event": event, "actor": "bob", "verdict": "deny"}))


def test_without_a_base_url_a_slack_notice_has_no_buttons_slack_would_refuse() -> None:
    body = slack_message(
        {"event": "ask.requested", "tool": "t", "url": "/approvals/", "action_url": "/approvals/act/x/"}
    )
    check_slack_body(body)
    assert [block["type"] for block in body["blocks"]] == ["header", "section", "section"]


def test_the_admin_offers_the_kind(admin_client: Client, ops: Team) -> None:
    html = admin_client.get("/admin/sessions_app/teamwebhook/add/").content.decode()
    assert 'name="kind"' in html and "Slack-style" in html
    assert NotificationDelivery.objects.count() == 0
