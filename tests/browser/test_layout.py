"""The team pages at 1280x800 and 390x844 (a phone), light and dark, in Chromium.

* Every page fits the screen: each role (member, reviewer, moderator, outsider, staff,
  and a visitor who is not logged in) visits every page it can reach, and a few it
  cannot, and the document never scrolls sideways
  (`document.documentElement.scrollWidth <= window.innerWidth`). Failures are collected
  across pages and reported together, each with the elements that stick out.
* On a phone, tables are cards (no column one letter wide); /review/'s filter bar fits
  with each label over its own control, Team and User are selects; the review page puts
  the transcript before the snapshot, and at 1280 its usage table is not cut.
* Share links: a revoked or expired link says so on a plain page, Revoke asks first,
  Copy link copies it.
* The usage dashboard: stacked columns per day with a legend and a table view, top users
  and agents, asks and failed runs; its empty state is one sentence; the missing cost
  points to the admin.
* Form controls follow the dark theme (the file picker, search and date inputs), and
  axe-core finds nothing serious on the pages touched, in both themes.

The team's data is made once for the module: two sessions with messages (one waiting for
an approval), a review queue, a live and a revoked share link.

Set SECTR_SCREENSHOTS=1 to refresh the team pages' screenshots in docs/screenshots/.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.browser.conftest import PASSWORD, log_in, new_session, send
from tests.browser.test_team_pages import serious_violations
from tests.liveserver import ROOT, LiveSectr

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]

SHOTS = ROOT / "docs" / "screenshots" if os.environ.get("SECTR_SCREENSHOTS") else Path(tempfile.gettempdir())

DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}
TEAM = "layout"
MEMBER, REVIEWER, MODERATOR, OUTSIDER, STAFF = (
    "lay_member",
    "lay_reviewer",
    "lay_moderator",
    "lay_outsider",
    "lay_staff",
)

SETUP = """
import json
from django.contrib.auth import get_user_model
from sessions_app.models import Membership, ReviewQueue, ReviewQueueItem, Session, ShareLink, Team
from django.utils import timezone
U = get_user_model()
team, _ = Team.objects.get_or_create(name=%(team)r)
for name, role in ((%(member)r, "member"), (%(reviewer)r, "reviewer"), (%(moderator)r, "moderator")):
    Membership.objects.update_or_create(team=team, user=U.objects.get(username=name), defaults={"role": role})
from sessions_app import actions
actions.do_create_agent(U.objects.get(username=%(staff)r), None, "layout-helper", {
    "name": "Layout helper", "instructions": "Answer with " + "a_very_long_unbroken_instruction_word_" * 4,
    "tools": ["get_time", "write_note"]})
"""

DATA = """
import json
from django.contrib.auth import get_user_model
from sessions_app.models import ReviewQueue, ReviewQueueItem, Session, ShareLink, Team
from django.utils import timezone
U = get_user_model()
team = Team.objects.get(name=%(team)r)
reviewer = U.objects.get(username=%(reviewer)r)
sessions = list(Session.objects.filter(owner__username=%(member)r).order_by("created_at"))
queue = ReviewQueue.objects.create(team=team, name="Weekly layout check", created_by=reviewer)
queue.reviewers.add(reviewer)
for n, s in enumerate(sessions):
    ReviewQueueItem.objects.create(queue=queue, session=s, position=n, assignee=reviewer, added_by=reviewer)
live = ShareLink.objects.create(session=sessions[0], seq=sessions[0].last_seq, created_by=reviewer)
gone = ShareLink.objects.create(session=sessions[0], seq=sessions[0].last_seq, created_by=reviewer,
                                revoked_at=timezone.now())
old = ShareLink.objects.create(session=sessions[0], seq=sessions[0].last_seq, created_by=reviewer,
                               expires_at=timezone.now() - timezone.timedelta(days=1))
print(json.dumps({"sessions": [s.pk for s in sessions], "queue": queue.pk, "live": live.token, "gone": gone.token,
                  "old": old.token}))
"""


@dataclass
class Team:
    sessions: list[str]
    queue: int
    live_share: str
    revoked_share: str
    expired_share: str


@pytest.fixture(scope="module")
def team(live: LiveSectr, browser: Browser) -> Team:
    for name in (MEMBER, REVIEWER, MODERATOR, OUTSIDER):
        live.create_user(name, password=PASSWORD)
    live.create_user(STAFF, password=PASSWORD, is_staff=True, is_superuser=True)
    names = {"team": TEAM, "member": MEMBER, "reviewer": REVIEWER, "moderator": MODERATOR, "staff": STAFF}
    live.manage("shell", "-c", SETUP % names)
    context = browser.new_context(base_url=live.base_url, viewport=DESKTOP)
    page = context.new_page()
    log_in(page, MEMBER)
    new_session(page, team=TEAM)
    send(page, "tell me about the supercalifragilisticexpialidocious_long_identifier_that_never_breaks in prose")
    expect(page.locator("[data-role=assistant]").last).to_contain_text("You said:")
    new_session(page, team=TEAM)
    # A title with a word longer than the screen (the approval card links to it).
    send(page, "note: check_the_layout_of_the_approval_card_" + "x" * 150)
    expect(page.locator("[data-role=approval]")).to_have_count(1)
    context.close()
    made = json.loads(live.manage("shell", "-c", DATA % names).strip().splitlines()[-1])
    return Team(made["sessions"], made["queue"], made["live"], made["gone"], made["old"])


def pages_for(role: str, team: Team) -> list[str]:
    first, second = team.sessions
    common = [
        "/",
        "/approvals/",
        "/approvals/audit/",
        "/approvals/rules/",
        "/teams/",
        "/agents/layout-helper/",
        "/settings/shares/",
        "/settings/tokens/",
        "/accounts/password_change/",
    ]
    member = [f"/sessions/{first}/", f"/sessions/{second}/", f"/teams/{TEAM}/"]
    review = [
        "/review/",
        "/review/?q=supercalifragilisticexpialidocious",
        "/review/usage/",
        "/review/queues/",
        f"/review/queues/{team.queue}/",
        f"/review/{first}/",
        f"/review/{second}/?queue={team.queue}",
    ]
    moderate = [f"/teams/{TEAM}/agents/new"]
    if role == "member":
        return common + member
    if role == "reviewer":
        return common + member + review
    if role == "moderator":
        return common + member + review + moderate
    if role == "outsider":
        # Pages of the team they may not see: the refusal page must fit too.
        return [*common, f"/sessions/{first}/", f"/review/{first}/", "/review/"]
    if role == "staff":
        return common + member + review + moderate + ["/agents/new", "/admin/"]
    # Not logged in: the login page and share links (live and revoked).
    return [
        "/accounts/login/",
        f"/share/{team.live_share}/",
        f"/share/{team.revoked_share}/",
        f"/share/{team.expired_share}/",
    ]


USERS = {"member": MEMBER, "reviewer": REVIEWER, "moderator": MODERATOR, "outsider": OUTSIDER, "staff": STAFF}

WIDEST = """() => [...document.querySelectorAll('body *')]
    .filter(e => e.getBoundingClientRect().right > window.innerWidth + 1)
    .slice(-4)
    .map(e => e.tagName.toLowerCase() + '.' + String(e.className).trim().split(/\\s+/).join('.')
         + ' ' + Math.round(e.getBoundingClientRect().right) + 'px')"""


def overflow(page: Page) -> int:
    return int(page.evaluate("document.documentElement.scrollWidth - window.innerWidth"))


@pytest.mark.timeout(900)
@pytest.mark.parametrize("viewport", [DESKTOP, PHONE], ids=["1280", "390"])
def test_no_page_scrolls_sideways_for_any_role(
    browser: Browser, live: LiveSectr, team: Team, viewport: dict[str, int]
) -> None:
    failures: list[str] = []
    visited = 0
    for role in (*USERS, "visitor"):
        phone = viewport is PHONE
        context = browser.new_context(base_url=live.base_url, viewport=viewport, is_mobile=phone, has_touch=phone)
        page = context.new_page()
        if role in USERS:
            log_in(page, USERS[role])
        for path in pages_for(role, team):
            page.goto(path)
            page.wait_for_load_state("load")
            visited += 1
            extra = overflow(page)
            if extra > 0:
                failures.append(f"{role} {viewport['width']} {path}: {extra}px too wide: {page.evaluate(WIDEST)}")
        context.close()
    assert visited > 60
    assert failures == [], "\n".join(failures)


# ---- helpers ----


def signed_in(browser: Browser, live: LiveSectr, role: str, viewport: dict[str, int], scheme: str = "light") -> Page:
    phone = viewport is PHONE
    context = browser.new_context(
        base_url=live.base_url, viewport=viewport, is_mobile=phone, has_touch=phone, color_scheme=scheme
    )
    page = context.new_page()
    if role in USERS:
        log_in(page, USERS[role])
    return page


CRAMPED = """() => [...document.querySelectorAll('main table th, main table td')]
    .filter(cell => cell.offsetParent !== null && cell.textContent.trim().length >= 4)
    .filter(cell => !cell.closest('thead') || cell.closest('thead').getBoundingClientRect().width > 2)
    .filter(cell => cell.getBoundingClientRect().width < 80)
    .slice(0, 6)
    .map(cell => cell.tagName.toLowerCase() + ' "' + cell.textContent.trim().slice(0, 20) + '" '
         + Math.round(cell.getBoundingClientRect().width) + 'px')"""


def rgb(page: Page, selector: str, pseudo: str = "", prop: str = "backgroundColor") -> str:
    return str(
        page.evaluate(
            "([s, p, k]) => getComputedStyle(document.querySelector(s), p || null)[k]", [selector, pseudo, prop]
        )
    )


# ---- tables ----


def test_on_a_phone_tables_are_cards_with_no_column_one_letter_wide(
    browser: Browser, live: LiveSectr, team: Team
) -> None:
    page = signed_in(browser, live, "moderator", PHONE)
    for path in (
        "/review/",
        "/settings/shares/",
        "/approvals/audit/",
        f"/review/queues/{team.queue}/",
        "/review/usage/",
    ):
        page.goto(path)
        page.wait_for_load_state("load")
        assert page.evaluate(CRAMPED) == [], path
        assert overflow(page) <= 0, path
    # Each cell says which column it is.
    page.goto("/review/")
    row = page.locator("table[aria-label=Sessions] tbody tr[data-session]").first
    expect(row.locator("td").nth(1)).to_have_attribute("data-label", "Owner")
    box = row.bounding_box()
    assert box is not None and box["width"] > 300
    page.screenshot(path=str(SHOTS / "review-phone.png"), full_page=True)
    page.context.close()


# ---- /review/ ----


@pytest.mark.parametrize("viewport", [DESKTOP, PHONE], ids=["1280", "390"])
def test_the_review_filter_bar_fits_with_each_label_over_its_control(
    browser: Browser, live: LiveSectr, team: Team, viewport: dict[str, int]
) -> None:
    page = signed_in(browser, live, "reviewer", viewport)
    page.goto("/review/")
    bar = page.get_by_role("search", name="Find sessions")
    box = bar.bounding_box()
    assert box is not None and box["x"] + box["width"] <= viewport["width"]
    for name in ("Search", "Team", "User", "State", "Model", "Agent", "Version", "From", "To"):
        control = page.get_by_label(name, exact=True)
        label = page.locator(f"label[for='{control.get_attribute('id')}']")
        cbox, lbox = control.bounding_box(), label.bounding_box()
        assert cbox is not None and lbox is not None, name
        assert cbox["x"] + cbox["width"] <= viewport["width"], f"{name} is off screen"
        # Over its own control: just above it, starting where it starts.
        assert 0 <= cbox["y"] - (lbox["y"] + lbox["height"]) <= 8, name
        assert abs(cbox["x"] - lbox["x"]) <= 2, name
    for name in ("Has asks", "Failed"):
        check = page.get_by_label(name)
        cbox = check.bounding_box()
        assert cbox is not None and cbox["x"] + cbox["width"] <= viewport["width"], name
    button = page.get_by_role("button", name="Filter").bounding_box()
    assert button is not None and button["x"] + button["width"] <= viewport["width"]

    # Team and User: what the reviewer may see, nothing else.
    team_box = page.get_by_label("Team", exact=True)
    assert team_box.evaluate("e => e.tagName") == "SELECT"
    teams = team_box.locator("option").all_inner_texts()
    assert teams[0] == "any" and TEAM in teams and "ocean" not in teams
    people = page.get_by_label("User", exact=True).locator("option").all_inner_texts()
    assert MEMBER in people and OUTSIDER not in people
    page.get_by_label("User", exact=True).select_option(MEMBER)
    page.get_by_label("State").select_option("awaiting")
    page.get_by_role("button", name="Filter").click()
    expect(page.locator("table[aria-label=Sessions] tbody tr[data-session]")).to_have_count(1)
    expect(page.get_by_label("User", exact=True)).to_have_value(MEMBER)
    if viewport is DESKTOP:
        page.screenshot(path=str(SHOTS / "review.png"), full_page=True)
    page.context.close()


def test_the_review_page_reads_transcript_first_on_a_phone_and_shows_all_usage_columns_at_1280(
    browser: Browser, live: LiveSectr, team: Team
) -> None:
    first = team.sessions[0]
    desk = signed_in(browser, live, "reviewer", DESKTOP)
    desk.goto(f"/review/{first}/")
    usage = desk.locator("table[data-role=usage]")
    wrapper = usage.locator("xpath=..")
    assert usage.evaluate("t => t.scrollWidth") <= wrapper.evaluate("w => w.clientWidth")
    cached = desk.get_by_role("columnheader", name="Cached").bounding_box()
    frame = wrapper.bounding_box()
    assert cached is not None and frame is not None and cached["x"] + cached["width"] <= frame["x"] + frame["width"]
    transcript_x = desk.locator("section.transcript").bounding_box()
    snapshot_x = desk.locator("section.snapshot").bounding_box()
    assert transcript_x is not None and snapshot_x is not None and snapshot_x["x"] < transcript_x["x"]
    desk.screenshot(path=str(SHOTS / "review-session.png"), full_page=False)
    desk.context.close()

    phone = signed_in(browser, live, "reviewer", PHONE)
    phone.goto(f"/review/{first}/")
    transcript = phone.locator("section.transcript").bounding_box()
    snapshot = phone.locator("section.snapshot").bounding_box()
    assert transcript is not None and snapshot is not None
    assert transcript["y"] < snapshot["y"]
    assert transcript["y"] < PHONE["height"], "the transcript starts on the first screen"
    # A link jumps down to the snapshot, rating and sharing.
    phone.get_by_role("link", name="Snapshot, rating, notes and sharing").click()
    expect(phone.get_by_role("heading", name="Snapshot")).to_be_in_viewport()
    phone.goto(f"/review/{first}/")
    phone.screenshot(path=str(SHOTS / "review-session-phone.png"), full_page=False)
    phone.context.close()


# ---- share links ----


@pytest.mark.parametrize("which", ["revoked", "expired"])
def test_a_revoked_or_expired_link_says_so_on_a_plain_page(
    browser: Browser, live: LiveSectr, team: Team, which: str
) -> None:
    page = signed_in(browser, live, "visitor", PHONE)
    token = team.revoked_share if which == "revoked" else team.expired_share
    response = page.goto(f"/share/{token}/")
    assert response is not None and response.status == 404
    heading = "This share link was revoked" if which == "revoked" else "This share link has expired"
    expect(page.get_by_role("heading", level=1)).to_have_text(heading)
    expect(page.locator("main")).not_to_contain_text("supercalifragilistic")
    expect(page.locator("main")).to_contain_text("Ask")
    assert overflow(page) <= 0
    if which == "revoked":
        page.screenshot(path=str(SHOTS / "share-revoked-phone.png"), full_page=False)
    page.goto("/share/" + "x" * 32 + "/")
    expect(page.get_by_role("heading", level=1)).to_have_text("No such share link")
    page.context.close()


def test_share_links_copy_and_revoke_only_after_a_yes(browser: Browser, live: LiveSectr, team: Team) -> None:
    page = signed_in(browser, live, "reviewer", DESKTOP)
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    page.goto("/settings/shares/")
    row = page.locator(f"tr:has(input[value$='/share/{team.live_share}/'])")
    expect(row.get_by_role("cell").nth(2)).not_to_contain_text("#")
    expect(page.get_by_role("columnheader", name="Shows the chat as of").first).to_be_visible()
    row.get_by_role("button", name="Copy link").click()
    expect(row.get_by_role("button", name="Copy link")).to_have_class("copy copied")
    assert page.evaluate("navigator.clipboard.readText()").endswith(f"/share/{team.live_share}/")
    # Only a link that can still work offers Copy and Revoke.
    expired = page.locator(f"tr:has(input[value$='/share/{team.expired_share}/'])")
    expect(expired).to_contain_text("expired")
    expect(expired.get_by_role("button")).to_have_count(0)
    page.screenshot(path=str(SHOTS / "shares.png"), full_page=True)
    page.set_viewport_size(PHONE)
    page.screenshot(path=str(SHOTS / "shares-phone.png"), full_page=True)
    page.set_viewport_size(DESKTOP)

    asked: list[str] = []

    def answer(dialog: Any) -> None:
        asked.append(dialog.message)
        dialog.dismiss() if len(asked) == 1 else dialog.accept()

    page.on("dialog", answer)
    row.get_by_role("button", name="Revoke").click()  # No: nothing changes
    expect(row).to_contain_text("active")
    assert asked and "Revoke this share link?" in asked[0]
    row.get_by_role("button", name="Revoke").click()  # Yes
    expect(page.locator(".messages")).to_contain_text("Revoked the share link")
    expect(row).to_contain_text("revoked")
    response = page.goto(f"/share/{team.live_share}/")
    assert response is not None and response.status == 404
    expect(page.get_by_role("heading", level=1)).to_have_text("This share link was revoked")
    page.screenshot(path=str(SHOTS / "share-revoked.png"), full_page=False)
    page.context.close()


# ---- usage ----


@pytest.mark.parametrize("scheme", ["light", "dark"])
@pytest.mark.parametrize("viewport", [DESKTOP, PHONE], ids=["1280", "390"])
def test_the_usage_dashboard_charts_days_tops_asks_and_failures(
    browser: Browser, live: LiveSectr, team: Team, viewport: dict[str, int], scheme: str
) -> None:
    page = signed_in(browser, live, "staff", viewport, scheme)
    page.goto(f"/review/usage/?team={TEAM}")
    chart = page.locator("[data-role=chart-tokens]")
    expect(chart.locator("svg rect").first).to_be_attached()
    expect(chart.locator(".legend li")).to_contain_text(["demo"])
    assert chart.locator(".chart-days span").count() <= 5
    plot = chart.locator(".chart-plot").bounding_box()
    assert plot is not None and plot["x"] + plot["width"] <= viewport["width"] and plot["width"] > 200
    # The table view, for screen readers (and anyone): each day with usage, by model.
    chart.get_by_text("Table view").click()
    rows = chart.locator("table tbody tr")
    expect(rows).to_have_count(1)
    expect(rows.first.locator("th")).to_have_text(re.compile(r"^\d{4}-\d{2}-\d{2}$"))
    expect(page.locator("[data-role=top-users]")).to_contain_text(MEMBER)
    expect(page.locator("[data-role=top-agents]")).to_contain_text("default (built-in)")
    expect(page.locator("[data-role=runs-failed]")).to_have_text("0")
    # No price set: the cost says where prices are set (staff get the link).
    hint = page.locator("[data-role=cost-hint]").first
    expect(hint).to_contain_text("model prices")
    expect(hint.get_by_role("link", name="Set model prices in the admin")).to_have_attribute(
        "href", "/admin/sessions_app/modelprice/"
    )
    assert overflow(page) <= 0
    assert serious_violations(page) == [], "usage"
    suffix = "" if scheme == "light" else "-dark"
    page.screenshot(path=str(SHOTS / f"usage{'-phone' if viewport is PHONE else ''}{suffix}.png"), full_page=True)
    page.context.close()


def test_an_empty_range_is_one_sentence_and_a_reviewer_is_told_who_sets_prices(
    browser: Browser, live: LiveSectr, team: Team
) -> None:
    page = signed_in(browser, live, "reviewer", PHONE)
    page.goto("/review/usage/?from=2020-01-01&to=2020-01-30")
    expect(page.locator("[data-role=usage-empty]")).to_contain_text("No tokens were used from Jan 1 to Jan 30, 2020")
    expect(page.locator("main svg")).to_have_count(0)
    expect(page.locator("main table tbody tr")).to_have_count(0)
    expect(page.locator("main")).not_to_contain_text("2020-01-15")
    page.goto("/review/usage/")
    hint = page.locator("[data-role=cost-hint]").first
    expect(hint).to_contain_text("An administrator sets them in the admin")
    expect(hint.get_by_role("link")).to_have_count(0)
    page.context.close()


# ---- controls in the dark theme ----


def test_in_the_dark_theme_the_file_picker_and_search_inputs_are_themed(
    browser: Browser, live: LiveSectr, team: Team
) -> None:
    page = signed_in(browser, live, "member", PHONE, "dark")
    page.goto(f"/sessions/{team.sessions[0]}/")
    card = page.evaluate("getComputedStyle(document.body).getPropertyValue('--card')").strip()
    assert card == "#1b1f29"
    picker = "input[type=file]"
    assert rgb(page, picker, "::file-selector-button") == "rgb(27, 31, 41)"
    assert rgb(page, picker, "::file-selector-button", "borderTopLeftRadius") == "7px"
    page.context.close()

    page = signed_in(browser, live, "reviewer", DESKTOP, "dark")
    page.goto("/review/")
    for selector in ("#f-q", "#f-from", "#f-team"):
        assert rgb(page, selector) == "rgb(18, 21, 28)", selector  # --field-bg
        assert rgb(page, selector, "", "color") == "rgb(230, 233, 239)", selector  # --fg
    page.goto("/review/usage/")
    assert rgb(page, "#u-from") == "rgb(18, 21, 28)"
    # An input without a type (the audit's and the rules' text boxes) too.
    page.goto("/approvals/audit/")
    assert rgb(page, "input[name=actor]") == "rgb(18, 21, 28)"
    page.context.close()


# ---- accessibility ----


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_axe_finds_nothing_serious_on_the_review_and_share_pages(
    browser: Browser, live: LiveSectr, team: Team, scheme: str
) -> None:
    page = signed_in(browser, live, "reviewer", DESKTOP, scheme)
    first, second = team.sessions
    for path in ("/review/", f"/review/{first}/", f"/review/{second}/?queue={team.queue}", "/settings/shares/"):
        page.goto(path)
        assert serious_violations(page) == [], path
    page.context.close()
    page = signed_in(browser, live, "visitor", PHONE, scheme)
    for path in (f"/share/{team.revoked_share}/", f"/share/{team.expired_share}/", "/share/" + "y" * 32 + "/"):
        page.goto(path)
        assert serious_violations(page) == [], path
    page.context.close()
