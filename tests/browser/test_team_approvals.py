"""A two-person approval as a team runs it, in Chromium at 1280x800 and 390x844, against a
real Sectr (Daphne, its embedded worker, the demo model).

Team `crew`: quinn (member, owns the sessions), rhea and saul (moderators), tess and uma
(reviewers). Its one rule: every `write_note` needs two approvals and expires after 55
minutes. Each test here failed before the fix it names.

Set SECTR_SCREENSHOTS=1 to refresh docs/screenshots/approvals-*.png, chat-quorum-*.png,
audit-*.png and rules-*.png.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, BrowserContext, Page, expect

from tests.browser.conftest import PASSWORD, log_in, new_session, send
from tests.browser.test_chat_ui import document_overflow, serious_violations
from tests.liveserver import ROOT, LiveSectr

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]

SHOTS = ROOT / "docs" / "screenshots" if os.environ.get("SECTR_SCREENSHOTS") else Path(tempfile.gettempdir())
DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}
EXPIRES_AFTER_S = 55 * 60
TEAM_SETUP = f"""
from django.contrib.auth import get_user_model
from sessions_app.models import ApprovalRule, Membership, Team
U = get_user_model()
team = Team.objects.create(name="crew")
for name, role in (("quinn", "member"), ("rhea", "moderator"), ("saul", "moderator"), ("vic", "moderator"),
                   ("tess", "reviewer"), ("uma", "reviewer")):
    Membership.objects.create(team=team, user=U.objects.create_user(name, password={PASSWORD!r}), role=role)
ApprovalRule.objects.create(team=team, position=0, tool="write_note", action="ask", approvals_required=2,
                            expires_after_s={EXPIRES_AFTER_S})
"""


@pytest.fixture(scope="module")
def crew(live: LiveSectr) -> str:
    live.manage("shell", "-c", TEAM_SETUP)
    return "crew"


class Pages:
    """Browser pages of several people at once, closed at the end of the test."""

    def __init__(self, browser: Browser, live: LiveSectr) -> None:
        self.browser, self.live = browser, live
        self.contexts: list[BrowserContext] = []

    def __call__(self, username: str, viewport: dict[str, int] = DESKTOP, scheme: str = "light") -> Page:
        phone = viewport["width"] < 500
        context = self.browser.new_context(
            base_url=self.live.base_url, viewport=viewport, color_scheme=scheme, is_mobile=phone, has_touch=phone
        )
        self.contexts.append(context)
        page = context.new_page()
        log_in(page, username)
        return page


@pytest.fixture
def people(browser: Browser, live: LiveSectr, crew: str) -> Iterator[Pages]:
    pages = Pages(browser, live)
    yield pages
    for context in pages.contexts:
        context.close()


def queue_of(page: Page) -> None:
    page.goto("/approvals/")
    expect(page.locator("#live")).to_have_text("live")


EXPIRES = re.compile(r"^expires in 5[45] min$")


def test_the_requester_gets_no_approve_buttons_on_their_own_two_person_ask(people: Pages) -> None:
    # Before: Approve once, Always allow and Deny; a click put a bare "403 Forbidden" in the
    # card, and the queue then said "Nothing is waiting for a decision".
    quinn = people("quinn")
    new_session(quinn, team="crew")
    send(quinn, "note: launch checklist")
    card = quinn.locator("[data-role=approval]").last
    expect(card).to_have_attribute("data-status", "pending")
    expect(card.locator("[data-role=votes]")).to_have_text("0 of 2 approvals")
    expect(card.locator("[data-role=waiting]")).to_have_text(
        "Your own approval does not count on an ask needing 2 approvals: "
        "waiting for 2 more approvals from the team's moderators."
    )
    expect(card.locator("[data-role=expires]")).to_have_text(EXPIRES)
    for name in ("Approve once", "Always allow", "Edit arguments", "Respond"):
        expect(card.get_by_role("button", name=name)).to_have_count(0)
    expect(card.get_by_role("button", name="Deny")).to_be_visible()  # a refusal by anyone denies

    queue_of(quinn)
    mine = quinn.locator("[data-role=approval]").filter(has_text="launch checklist")
    expect(mine).to_have_attribute("data-waits", "others")
    expect(mine.locator(".tool-label")).to_have_text("Waiting for others:")
    expect(mine.get_by_role("button", name="Approve once")).to_have_count(0)
    expect(quinn.get_by_text("Nothing is waiting for a decision.")).to_be_hidden()
    expect(quinn.locator("#approvals-badge")).to_be_hidden()  # nothing waits for quinn herself
    # Denying her own ask is hers to do.
    mine.get_by_role("button", name="Deny").click()
    expect(mine.locator(".verdict")).to_have_text("Denied by quinn")


def test_votes_expiry_and_approvers_show_live_on_the_chat_and_queue_cards(people: Pages) -> None:
    # Before: the voter kept the three buttons (a second click: "already voted"), the
    # requester's card never showed "1 of 2", the decided card named only the last
    # approver, and the expiry was shown nowhere.
    quinn, rhea, saul = people("quinn"), people("rhea"), people("saul")
    new_session(quinn, team="crew")
    for page in (rhea, saul):
        queue_of(page)
    send(quinn, "note: launch window")
    chat_card = quinn.locator("[data-role=approval]").last
    rhea_card, saul_card = (p.locator("[data-role=approval]").filter(has_text="launch window") for p in (rhea, saul))
    for card in (chat_card, rhea_card, saul_card):
        expect(card.locator("[data-role=votes]")).to_have_text("0 of 2 approvals")
        expect(card.locator("[data-role=expires]")).to_have_text(EXPIRES)
    expect(rhea_card).to_have_attribute("data-waits", "you")
    # "Always allow" says what it allows.
    always = saul_card.get_by_role("button", name="Always allow")
    expect(always).to_have_accessible_description("Always allow: write_note runs without asking again in this session.")

    rhea_card.get_by_role("button", name="Approve once").click()
    expect(rhea_card.locator("[data-role=votes]")).to_have_text("1 of 2 approvals: rhea")
    expect(rhea_card.locator("[data-role=waiting]")).to_have_text("You voted: waiting for 1 more")
    expect(rhea_card.get_by_role("button")).to_have_count(0)
    expect(rhea_card).to_have_attribute("data-waits", "others")
    # Live to the other moderator and to the requester's chat.
    expect(saul_card.locator("[data-role=votes]")).to_have_text("1 of 2 approvals: rhea")
    expect(saul_card.get_by_role("button", name="Approve once")).to_be_visible()
    expect(chat_card.locator("[data-role=votes]")).to_have_text("1 of 2 approvals: rhea")
    expect(quinn.locator("[data-role=state]")).to_have_text("awaiting")

    saul_card.get_by_role("button", name="Approve once").click()
    for card in (saul_card, rhea_card, chat_card):
        expect(card.locator(".verdict")).to_have_text("Approved by rhea and saul")
    expect(quinn.locator("[data-role=assistant]").last).to_contain_text("write_note returned")
    expect(quinn.locator("#notes")).to_contain_text("launch window")


def test_a_refused_decision_shows_the_servers_message_in_the_page(people: Pages, live: LiveSectr) -> None:
    # Before: htmx swapped Django's bare 403 page into the card.
    quinn, vic = people("quinn"), people("vic")
    session = new_session(quinn, team="crew")
    send(quinn, "note: launch budget")
    vic.goto(f"/sessions/{session}/")
    card = vic.locator("[data-role=approval]").last
    expect(card.get_by_role("button", name="Approve once")).to_be_visible()
    # vic stops being a moderator while the page is open: the click is refused (403).
    live.manage(
        "shell",
        "-c",
        "from sessions_app.models import Membership; "
        "Membership.objects.filter(team__name='crew', user__username='vic').update(role='member')",
    )
    card.get_by_role("button", name="Approve once").click()
    expect(vic.locator("#flash [role=alert]")).to_have_text(
        "only the session's owner or a moderator of its team can decide its asks"
    )
    expect(card).to_have_attribute("data-status", "pending")  # the card, not an error page
    expect(vic.get_by_text("Forbidden")).to_have_count(0)

    # A stale page (its user logged out and in again in another tab: a new CSRF token).
    other = quinn.context.new_page()
    other.goto("/")
    other.locator("details.account-menu summary").click()
    other.get_by_role("button", name="Log out").click()
    log_in(other, "quinn")
    chat_card = quinn.locator("[data-role=approval]").last
    chat_card.get_by_role("button", name="Deny").click()
    expect(quinn.locator("#flash [role=alert]")).to_contain_text("This page is out of date")
    expect(chat_card).to_have_attribute("data-status", "pending")
    expect(quinn.get_by_text("CSRF verification failed")).to_have_count(0)


def test_the_chat_opens_at_the_top_with_a_hint_and_the_sidebar_follows_the_title(people: Pages) -> None:
    # Before: the page opened scrolled 50 px down (the navigation hidden), a new chat gave no
    # hint of what to type, and the sidebar kept "Untitled session".
    quinn = people("quinn")
    new_session(quinn)
    assert quinn.evaluate("window.scrollY") == 0
    expect(quinn.get_by_role("navigation", name="Main").get_by_role("link", name="Approvals")).to_be_in_viewport()
    hint = quinn.locator("[data-role=hint]")
    expect(hint).to_contain_text("note: buy milk")
    quinn.screenshot(path=str(Path(tempfile.gettempdir()) / "chat-new-session.png"))
    current = quinn.locator("#sidebar-list li.current .sidebar-title")
    expect(current).to_have_text("Untitled session")
    send(quinn, "plan the launch party")
    expect(quinn.locator("[data-role=assistant]").last).to_contain_text("You said: plan the launch party")
    expect(hint).to_be_hidden()
    expect(quinn.locator("#session-title")).to_have_text("plan the launch party")
    expect(current).to_have_text("plan the launch party")
    assert quinn.evaluate("window.scrollY") == 0  # the reply did not push the page down either
    quinn.reload()
    expect(quinn.locator("#live")).to_have_text("live")
    assert quinn.evaluate("window.scrollY") == 0


def test_the_audit_reads_as_words_and_local_times(people: Pages) -> None:
    # Before: raw ISO times ("2026-12-04T18:20:05") and verdicts as codes (`allow_once`).
    quinn, rhea = people("quinn"), people("rhea")
    session = new_session(quinn, team="crew")
    send(quinn, "note: launch audit")
    card = quinn.locator("[data-role=approval]").last
    card.get_by_role("button", name="Deny").click()
    expect(card.locator(".verdict")).to_have_text("Denied by quinn")
    rhea.goto(f"/approvals/audit/?session={session}")
    row = rhea.locator("[data-role=audit-row]").first
    expect(row.locator("td").nth(3)).to_have_text("Denied")
    when = row.locator("time")
    expect(when).to_have_attribute("data-local", "1")
    assert not re.search(r"\d{4}-\d\d-\d\dT", when.inner_text()), when.inner_text()
    expected = rhea.evaluate(
        "iso => new Date(iso).toLocaleString(undefined, {dateStyle: 'medium', timeStyle: 'medium'})",
        when.get_attribute("datetime"),
    )
    expect(when).to_have_text(expected)


def test_the_rules_inputs_are_styled_in_dark_mode(people: Pages) -> None:
    # Before: the inputs without a type kept the browser's white field on the dark page.
    rhea = people("rhea", scheme="dark")
    rhea.goto("/approvals/rules/")
    tool = rhea.get_by_role("textbox", name="Tool").first
    assert tool.evaluate("e => getComputedStyle(e).backgroundColor") == "rgb(18, 21, 28)"
    assert tool.evaluate("e => getComputedStyle(e).color") == "rgb(230, 233, 239)"


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_the_team_pages_pass_axe_and_fit_both_widths(people: Pages, scheme: str) -> None:
    quinn, rhea = people("quinn", scheme=scheme), people("rhea", scheme=scheme)
    session = new_session(quinn, team="crew")
    send(quinn, f"note: launch {scheme} check")
    expect(quinn.locator("[data-role=approval]").last).to_have_attribute("data-status", "pending")
    queue_of(rhea)
    card = rhea.locator("[data-role=approval]").filter(has_text=f"launch {scheme} check")
    card.get_by_role("button", name="Approve once").click()
    expect(card.locator("[data-role=waiting]")).to_have_text("You voted: waiting for 1 more")
    chat_card = quinn.locator("[data-role=approval]").last
    expect(chat_card.locator("[data-role=votes]")).to_have_text("1 of 2 approvals: rhea")
    # A second ask, which waits for rhea (the queue's screenshot shows both kinds of card).
    new_session(quinn, team="crew")
    send(quinn, f"note: launch {scheme} supplies")
    expect(quinn.locator("[data-role=approval]").last).to_have_attribute("data-status", "pending")
    suffix = "" if scheme == "light" else "-dark"
    pages = {
        "approvals": (rhea, "/approvals/"),
        "chat-quorum": (quinn, f"/sessions/{session}/"),
        "audit": (rhea, "/approvals/audit/"),
        "rules": (rhea, "/approvals/rules/"),
    }
    for name, (page, path) in pages.items():
        page.goto(path)
        if name == "approvals":
            expect(page.locator("#live")).to_have_text("live")
        assert serious_violations(page) == [], (scheme, path)
        page.screenshot(path=str(SHOTS / f"{name}{suffix}.png"), full_page=name != "chat-quorum")
    # The same pages on a phone.
    for who, page in (("quinn", quinn), ("rhea", rhea)):
        phone = people(who, PHONE, scheme)
        for name, (owner, path) in pages.items():
            if owner is not page:
                continue
            phone.goto(path)
            assert document_overflow(phone) <= 0, (scheme, path)
            phone.screenshot(path=str(SHOTS / f"{name}-phone{suffix}.png"), full_page=name != "chat-quorum")
