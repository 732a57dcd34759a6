"""The approval queue and the audit in a real browser, with team roles, against a real
Sectr (Daphne, its embedded worker, the demo model).

Team `ops`: alice (member, owns the sessions), bob and dana (moderators). mallory is
in no team. A webhook of `ops` points at an HTTP server in this test process.
"""

from __future__ import annotations

import csv
import hashlib
import hmac
import io
import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.browser.conftest import PASSWORD, log_in, new_session, send
from tests.liveserver import LiveSectr

# The first test also starts the server and makes the team (manage.py calls take seconds
# each on a loaded machine).
pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]
SECRET = "browser-test-secret"


class WebhookReceiver:
    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                stamp = self.headers["X-Sectr-Timestamp"]
                good = "sha256=" + hmac.new(SECRET.encode(), f"{stamp}.".encode() + body, hashlib.sha256).hexdigest()
                receiver.calls.append(
                    {"signed": hmac.compare_digest(good, self.headers["X-Sectr-Signature"]), **json.loads(body)}
                )
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture(scope="module")
def webhook(live: LiveSectr) -> Iterator[WebhookReceiver]:
    receiver = WebhookReceiver()
    code = (
        "from django.contrib.auth import get_user_model; "
        f"[get_user_model().objects.create_user(n, password={PASSWORD!r}) for n in ('bob', 'dana')]; "
        "from sessions_app.models import Team, Membership, TeamWebhook; U = get_user_model(); "
        "t = Team.objects.create(name='ops'); "
        "Membership.objects.create(team=t, user=U.objects.get(username='alice'), role='member'); "
        "[Membership.objects.create(team=t, user=U.objects.get(username=n), role='moderator') "
        "for n in ('bob', 'dana')]; "
        f"TeamWebhook.objects.create(team=t, url={receiver.url!r}, secret={SECRET!r})"
    )
    live.manage("shell", "-c", code)
    yield receiver
    receiver.server.shutdown()
    receiver.server.server_close()


def page_for(browser: Browser, live: LiveSectr, username: str) -> Page:
    context = browser.new_context(base_url=live.base_url, viewport={"width": 1200, "height": 900})
    page = context.new_page()
    log_in(page, username)
    return page


def ops_session(alice: Page) -> str:
    return new_session(alice, team="ops")


def test_a_moderator_approves_from_the_queue_and_the_chat_follows(
    alice: Page, browser: Browser, live: LiveSectr, webhook: WebhookReceiver
) -> None:
    session_id = ops_session(alice)
    bob = page_for(browser, live, "bob")
    bob.goto("/approvals/")
    expect(bob.locator("#live")).to_have_text("live")
    send(alice, "note: order pizza")
    card = bob.locator("[data-role=approval]").filter(has_text="order pizza")
    expect(card).to_be_visible()  # pushed live
    expect(card).to_contain_text("requested by alice")
    expect(card).to_contain_text("note: order pizza")  # the conversation before the ask
    expect(card.locator(".tool-args")).to_have_count(1)
    expect(card.locator("time[data-age]")).to_have_text(re.compile(r"\d+ s ago"))
    expect(bob.locator("#approvals-badge")).to_have_text("1")
    # The chat shows the arguments once too: on the pending card, not on the tool call.
    chat_card = alice.locator("[data-role=approval]").last
    # (The closed `Edit arguments` field holds them too, as an editable copy.)
    expect(alice.locator("pre").filter(has_text='"title": "order pizza"')).to_have_count(1)
    card.focus()
    bob.keyboard.press("a")  # a: approve once
    expect(card).to_contain_text("Approved once by bob")
    expect(chat_card).to_contain_text("Approved once by bob")  # live in the owner's chat
    expect(alice.locator("[data-role=assistant]").last).to_contain_text("write_note returned")
    expect(alice.locator("#notes")).to_contain_text("order pizza")
    expect(bob.locator("#approvals-badge")).to_be_hidden()
    expect(card).to_have_count(0, timeout=15_000)  # a decided card leaves the queue
    events = [
        (call["event"], call["session_id"], call["signed"])
        for call in webhook.calls
        if call["session_id"] == session_id
    ]
    assert events[:2] == [("ask.requested", session_id, True), ("ask.decided", session_id, True)]
    assert webhook.calls[-1]["actor"] == "bob" and webhook.calls[-1]["url"].endswith(webhook.calls[-1]["ask_id"])
    bob.context.close()


def test_two_moderators_decide_one_card_at_once_and_one_wins(
    alice: Page, browser: Browser, live: LiveSectr, webhook: WebhookReceiver
) -> None:
    ops_session(alice)
    bob, dana = page_for(browser, live, "bob"), page_for(browser, live, "dana")
    for page in (bob, dana):
        page.goto("/approvals/")
        expect(page.locator("#live")).to_have_text("live")
    send(alice, "note: race")
    cards = [page.locator("[data-role=approval]").filter(has_text="note: race") for page in (bob, dana)]
    for card in cards:
        expect(card.get_by_role("button", name="Approve once")).to_be_visible()
    dana_note = cards[1].get_by_label("Note")
    dana_note.fill("too risky")
    buttons = [
        cards[0].get_by_role("button", name="Approve once").element_handle(),
        cards[1].get_by_role("button", name="Deny").element_handle(),
    ]
    for button in buttons:  # both at once: no waiting between the two clicks
        button.evaluate("b => b.click()")
    outcome = re.compile(r"(Approved once by bob|Denied by dana: too risky)")
    for card in cards:
        expect(card.locator(".verdict")).to_have_text(outcome)
    verdicts = {card.locator(".verdict").inner_text() for card in cards}
    assert len(verdicts) == 1, verdicts  # both see the same winner
    chat_card = alice.locator("[data-role=approval]").last
    expect(chat_card).to_contain_text(verdicts.pop())
    decisions = alice.request.get("/api/v1/audit?kind=decision&tool=write_note", headers=_auth(live, "bob")).json()
    race = [e for e in decisions["entries"] if e["arguments"].get("title") == "race"]
    assert len(race) == 1 and race[0]["actor"] in ("bob", "dana")
    bob.context.close()
    dana.context.close()


def test_approve_all_on_a_card_runs_every_gated_call_of_the_turn(
    alice: Page, browser: Browser, live: LiveSectr, webhook: WebhookReceiver
) -> None:
    session_id = ops_session(alice)
    bob = page_for(browser, live, "bob")
    bob.goto("/approvals/")
    expect(bob.locator("#live")).to_have_text("live")
    titles = ("all one", "all two", "all three")
    send(alice, "!tools " + " ; ".join(f'write_note {{"title": "{t}", "body": "x"}}' for t in titles))
    card = bob.locator("[data-role=approval]").filter(has_text="all one")
    expect(card).to_be_visible()  # pushed live
    waiting = card.locator("[data-role=turn-calls] li")
    expect(waiting).to_have_count(2)
    expect(waiting.nth(0)).to_contain_text('"title": "all two"')
    expect(waiting.nth(1)).to_contain_text('"title": "all three"')
    for name in ("Approve once", "Always allow", "Deny"):
        expect(card.get_by_role("button", name=name, exact=True)).to_be_visible()
    card.get_by_role("button", name="Approve all", exact=True).click()
    expect(card).to_contain_text("Approved once by bob")
    reply = alice.locator("[data-role=assistant]").last
    for title in titles:  # every tool result, then the final reply naming each
        expect(reply).to_contain_text(f"write_note returned: saved note '{title}' (created)")
        expect(alice.locator("#notes")).to_contain_text(title)
    expect(alice.locator("[data-role=state]")).to_have_text("completed")
    expect(alice.locator("[data-role=approval]").filter(has_text="Approved once by bob")).to_have_count(3)
    bob.goto(f"/approvals/audit/?kind=decision&session={session_id}")
    rows = bob.locator("[data-role=audit-row]")
    expect(rows).to_have_count(3)  # one row per call, each decided by bob
    for index in range(3):
        expect(rows.nth(index).locator("td").nth(2)).to_have_text("bob")
        expect(rows.nth(index).locator("td").nth(3)).to_have_text("Approved once")
    arguments = [json.loads(text) for text in rows.locator("td:nth-child(8) pre").all_inner_texts()]
    assert sorted(a["title"] for a in arguments) == sorted(titles)
    bob.context.close()


def _auth(live: LiveSectr, username: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {live.token_for(username)}"}


def test_a_non_member_sees_nothing_of_the_team_in_queue_and_audit(
    alice: Page, browser: Browser, live: LiveSectr, webhook: WebhookReceiver
) -> None:
    ops_session(alice)
    send(alice, "note: secret plan")
    expect(alice.locator("[data-role=approval]").last).to_contain_text("secret plan")
    bob = page_for(browser, live, "bob")
    bob.goto("/approvals/")
    expect(bob.locator("[data-role=approval]").filter(has_text="secret plan")).to_be_visible()
    mallory = page_for(browser, live, "mallory")
    mallory.goto("/approvals/")
    expect(mallory.locator("#live")).to_have_text("live")
    expect(mallory.get_by_text("Nothing is waiting for a decision.")).to_be_visible()
    expect(mallory.locator("[data-role=approval]")).to_have_count(0)
    expect(mallory.get_by_label("Team")).not_to_contain_text("ops")
    # Decided while mallory's queue is open: still nothing reaches her.
    bob.locator("[data-role=approval]").filter(has_text="secret plan").get_by_role("button", name="Deny").click()
    expect(alice.locator("[data-role=approval]").last).to_contain_text("Denied by bob")
    expect(mallory.locator("[data-role=approval]")).to_have_count(0)
    mallory.goto("/approvals/audit/")
    expect(mallory.locator("[data-role=audit-row]")).to_have_count(0)
    expect(mallory.get_by_text("secret plan")).to_have_count(0)
    with mallory.expect_download() as download:
        mallory.get_by_role("link", name="Download CSV").click()
    rows = list(csv.DictReader(io.StringIO(open(download.value.path(), encoding="utf-8").read())))
    assert rows == []
    bob.context.close()
    mallory.context.close()


def test_the_downloaded_csv_equals_the_journal_decisions(
    alice: Page, browser: Browser, live: LiveSectr, webhook: WebhookReceiver
) -> None:
    session_id = ops_session(alice)
    for text, verdict in (("note: one", "Approve once"), ("note: two", "Deny")):
        send(alice, text)
        card = alice.locator("[data-role=approval]").last
        card.get_by_role("button", name=verdict).click()
        expect(alice.locator("[data-role=state]")).to_have_text("completed")
    bob = page_for(browser, live, "bob")
    bob.goto("/approvals/audit/?kind=decision")
    expect(bob.locator(f"[data-role=audit-row] a[href='/sessions/{session_id}/']")).to_have_count(2)
    expect(bob.locator("tr[data-team=ops] [data-stat=median]")).to_have_text(re.compile(r"\d+\.\d s"))
    with bob.expect_download() as download:
        bob.get_by_role("link", name="Download CSV").click()
    exported = [
        (row["seq"], row["actor"], row["verdict"], row["ask_id"])
        for row in csv.DictReader(io.StringIO(open(download.value.path(), encoding="utf-8").read()))
        if row["session_id"] == session_id
    ]
    # The journal's decisions, straight from the database of the live server.
    code = (
        "import json; from sessions_app.models import Envelope; "
        f"rows = Envelope.objects.filter(session_id={session_id!r}, type='INVOCATION_STARTED').order_by('-seq'); "
        "print(json.dumps([[str(e.seq), e.payload['reason']['decision']['approver'], "
        "e.payload['reason']['decision']['verdict'], e.payload['reason']['ask_id']] "
        "for e in rows if e.payload['reason']['kind'] == 'approval_decision']))"
    )
    journal = [tuple(row) for row in json.loads(live.manage("shell", "-c", code).strip().splitlines()[-1])]
    assert exported == journal and [row[1:3] for row in journal] == [("alice", "deny"), ("alice", "allow_once")]
    bob.context.close()


def test_the_badge_on_a_chat_page_counts_a_new_ask_without_a_reload(
    alice: Page, browser: Browser, live: LiveSectr, webhook: WebhookReceiver
) -> None:
    ops_session(alice)
    bob = page_for(browser, live, "bob")
    new_session(bob)  # bob's own chat page: no queue, no queue socket
    badge = bob.locator("#approvals-badge")
    expect(badge).to_have_attribute("hx-get", "/approvals/badge")
    before = int(badge.get_attribute("data-count") or "0")
    bob.evaluate("window.notReloaded = true")
    send(alice, "note: badge ping")
    expect(alice.locator("[data-role=approval]").last).to_contain_text("badge ping")
    expect(badge).to_have_text(str(before + 1), timeout=20_000)  # polled every 5 s
    expect(badge).to_be_visible()
    assert bob.evaluate("window.notReloaded") is True
    alice.locator("[data-role=approval]").last.get_by_role("button", name="Deny").click()
    expect(badge).to_have_attribute("data-count", str(before), timeout=20_000)
    assert bob.evaluate("window.notReloaded") is True
    bob.context.close()


# ---- the team's approval rules: expiry, quorum, automatic decisions ----
# Rules of `ops` that match only the notes these tests write (by title glob), so the
# other tests' notes still meet the tool's own gate.

EXPIRES_AFTER_S = 3  # short, with room for a loaded machine to push the card first


@pytest.fixture(scope="module")
def ops_rules(live: LiveSectr, webhook: WebhookReceiver) -> dict[str, str]:
    code = (
        "import json; from sessions_app.models import ApprovalRule, Team; t = Team.objects.get(name='ops'); "
        "specs = {"
        f"'expiry': dict(action='ask', arguments={{'title': 'expiring*'}}, expires_after_s={EXPIRES_AFTER_S}), "
        "'quorum': dict(action='ask', arguments={'title': 'quorum*'}, approvals_required=2), "
        "'allow': dict(action='allow', arguments={'title': 'auto-allow*'}), "
        "'deny': dict(action='deny', arguments={'title': 'auto-deny*'})}; "
        "print(json.dumps({name: str(ApprovalRule.objects.create(team=t, position=i, tool='write_note', **spec).pk) "
        "for i, (name, spec) in enumerate(specs.items())}))"
    )
    return dict(json.loads(live.manage("shell", "-c", code).strip().splitlines()[-1]))


def test_an_expired_ask_is_denied_and_the_run_goes_on(
    alice: Page, browser: Browser, live: LiveSectr, ops_rules: dict[str, str]
) -> None:
    ops_session(alice)
    bob = page_for(browser, live, "bob")
    bob.goto("/approvals/")
    expect(bob.locator("#live")).to_have_text("live")
    send(alice, "note: expiring offer")
    card = bob.locator("[data-role=approval]").filter(has_text="expiring offer")
    expect(card.get_by_role("button", name="Approve once")).to_be_visible()  # pushed live, pending
    expect(card).to_contain_text(f"rule {ops_rules['expiry']}")
    # Nobody decides: the worker's sweep denies it once its deadline has passed.
    expired = re.compile(r"^Denied by policy:expired")
    expect(card.locator(".verdict")).to_have_text(expired, timeout=20_000)
    expect(card).to_have_count(0, timeout=20_000)  # and it leaves the queue
    chat_card = alice.locator("[data-role=approval]").last
    expect(chat_card.locator(".verdict")).to_have_text(expired)
    expect(alice.locator("[data-role=assistant]").last).to_contain_text("write_note was denied")
    expect(alice.locator("[data-role=state]")).to_have_text("completed")
    expect(alice.locator("#notes")).not_to_contain_text("expiring offer")
    bob.context.close()


def test_a_two_person_ask_needs_two_different_moderators(
    alice: Page, browser: Browser, live: LiveSectr, ops_rules: dict[str, str]
) -> None:
    ops_session(alice)
    bob, dana = page_for(browser, live, "bob"), page_for(browser, live, "dana")
    for page in (bob, dana):
        page.goto("/approvals/")
        expect(page.locator("#live")).to_have_text("live")
    send(alice, "note: quorum launch")
    bob_card, dana_card = (
        page.locator("[data-role=approval]").filter(has_text="quorum launch") for page in (bob, dana)
    )
    for card in (bob_card, dana_card):
        expect(card.locator("[data-role=votes]")).to_have_text("0 of 2 approvals")
    chat_card = alice.locator("[data-role=approval]").last
    # The requester's own approval would not count: her card offers only Deny.
    expect(chat_card.get_by_role("button", name="Approve once")).to_have_count(0)
    expect(chat_card.get_by_role("button", name="Deny")).to_be_visible()
    bob_card.get_by_role("button", name="Approve once").click()
    # The first approval shows live in the second moderator's browser; the run still waits.
    expect(dana_card.locator("[data-role=votes]")).to_have_text("1 of 2 approvals: bob")
    expect(bob_card.locator("[data-role=votes]")).to_have_text("1 of 2 approvals: bob")
    expect(chat_card.locator("[data-role=votes]")).to_have_text("1 of 2 approvals: bob")
    expect(dana_card.get_by_role("button", name="Approve once")).to_be_visible()
    expect(alice.locator("[data-role=state]")).to_have_text("awaiting")
    # The same moderator cannot vote twice: bob's card has no buttons left.
    expect(bob_card.locator("[data-role=waiting]")).to_have_text("You voted: waiting for 1 more")
    expect(bob_card.get_by_role("button")).to_have_count(0)
    dana_card.get_by_role("button", name="Approve once").click()
    for card in (dana_card, bob_card, chat_card):  # live to the first, too
        expect(card.locator(".verdict")).to_have_text("Approved by bob and dana")
    expect(alice.locator("[data-role=assistant]").last).to_contain_text("write_note returned")
    expect(alice.locator("#notes")).to_contain_text("quorum launch")
    bob.context.close()
    dana.context.close()


def test_rules_allow_and_deny_at_once_and_the_audit_names_the_rule(
    alice: Page, browser: Browser, live: LiveSectr, ops_rules: dict[str, str]
) -> None:
    ops_session(alice)
    send(alice, "note: auto-allow lunch")
    expect(alice.locator("[data-role=assistant]").last).to_contain_text("write_note returned")
    expect(alice.locator("#notes")).to_contain_text("auto-allow lunch")
    send(alice, "note: auto-deny dinner")
    expect(alice.locator("[data-role=assistant]").last).to_contain_text("write_note was denied")
    expect(alice.locator("[data-role=state]")).to_have_text("completed")
    expect(alice.locator("#notes")).not_to_contain_text("auto-deny dinner")
    expect(alice.get_by_role("button", name="Approve once")).to_have_count(0)  # nobody was asked
    bob = page_for(browser, live, "bob")
    bob.goto("/approvals/audit/?kind=rule")
    for title, rule, verdict in (
        ("auto-allow lunch", ops_rules["allow"], "Approved once"),
        ("auto-deny dinner", ops_rules["deny"], "Denied"),
    ):
        arguments = bob.locator("pre").filter(has_text=f'"title": "{title}"')  # (the session's title has both)
        row = bob.locator("[data-role=audit-row][data-kind=rule]").filter(has=arguments)
        expect(row).to_have_count(1)
        cells = row.locator("td")
        expect(cells.nth(2)).to_have_text(f"rule:{rule}")  # Who
        expect(cells.nth(3)).to_have_text(verdict)  # Verdict
        expect(cells.nth(9)).to_have_text(rule)  # Rule
    bob.context.close()


def test_the_queue_stops_reconnecting_once_its_user_logged_out(
    alice: Page, browser: Browser, live: LiveSectr, webhook: WebhookReceiver
) -> None:
    # The queue's socket is the chat's (static/live-socket.js): refused after a logout,
    # it checks that the page is still its user's and stops, instead of knocking forever.
    bob = page_for(browser, live, "bob")
    bob.goto("/approvals/")
    expect(bob.locator("#live")).to_have_text("live")
    other = bob.context.new_page()
    other.goto("/approvals/")
    other.locator("details.account-menu summary").click()
    other.get_by_role("button", name="Log out").click()
    expect(bob.locator("#live")).to_have_attribute("data-state", "refused", timeout=20_000)
    expect(bob.locator("#live")).to_have_text("disconnected: reload the page")
    bob.context.close()
