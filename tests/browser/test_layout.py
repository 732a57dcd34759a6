"""Every page fits the screen: each role (member, reviewer, moderator, outsider, staff,
and a visitor who is not logged in) visits every page it can reach, and a few it cannot,
at 1280x800 and at 390x844 (a phone), and the document never scrolls sideways
(`document.documentElement.scrollWidth <= window.innerWidth`). Failures are collected
across pages and reported together, each with the elements that stick out.

The team's data is made once for the module: two sessions with messages (one waiting for
an approval), a review queue, a live and a revoked share link, and usage for the usage
page.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.browser.conftest import PASSWORD, log_in, new_session, send
from tests.liveserver import LiveSectr

pytestmark = [pytest.mark.browser]

DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}
TEAM = "layout"
MEMBER, REVIEWER, MODERATOR, OUTSIDER, STAFF = "lay_member", "lay_reviewer", "lay_moderator", "lay_outsider", "lay_staff"

SETUP = """
import json
from django.contrib.auth import get_user_model
from sessions_app.models import Membership, ReviewQueue, ReviewQueueItem, Session, ShareLink, Team
from django.utils import timezone
U = get_user_model()
team, _ = Team.objects.get_or_create(name=%(team)r)
for name, role in ((%(member)r, "member"), (%(reviewer)r, "reviewer"), (%(moderator)r, "moderator")):
    Membership.objects.update_or_create(team=team, user=U.objects.get(username=name), defaults={"role": role})
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
print(json.dumps({"sessions": [s.pk for s in sessions], "queue": queue.pk, "live": live.token, "gone": gone.token}))
"""


@dataclass
class Team:
    sessions: list[str]
    queue: int
    live_share: str
    revoked_share: str


@pytest.fixture(scope="module")
def team(live: LiveSectr, browser: Browser) -> Team:
    for name in (MEMBER, REVIEWER, MODERATOR, OUTSIDER):
        live.create_user(name, password=PASSWORD)
    live.create_user(STAFF, password=PASSWORD, is_staff=True, is_superuser=True)
    names = {"team": TEAM, "member": MEMBER, "reviewer": REVIEWER, "moderator": MODERATOR}
    live.manage("shell", "-c", SETUP % names)
    context = browser.new_context(base_url=live.base_url, viewport=DESKTOP)
    page = context.new_page()
    log_in(page, MEMBER)
    new_session(page, team=TEAM)
    send(page, "tell me about the supercalifragilisticexpialidocious_long_identifier_that_never_breaks in prose")
    expect(page.locator("[data-role=assistant]").last).to_contain_text("You said:")
    new_session(page, team=TEAM)
    send(page, "note: check the layout of the approval card")
    expect(page.locator("[data-role=approval]")).to_have_count(1)
    context.close()
    made = json.loads(live.manage("shell", "-c", DATA % names).strip().splitlines()[-1])
    return Team(made["sessions"], made["queue"], made["live"], made["gone"])


def pages_for(role: str, team: Team) -> list[str]:
    first, second = team.sessions
    common = [
        "/",
        "/approvals/",
        "/approvals/audit/",
        "/approvals/rules/",
        "/teams/",
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
        return common + member + review + moderate + ["/admin/"]
    # Not logged in: the login page and share links (live and revoked).
    return ["/accounts/login/", f"/share/{team.live_share}/", f"/share/{team.revoked_share}/"]


USERS = {"member": MEMBER, "reviewer": REVIEWER, "moderator": MODERATOR, "outsider": OUTSIDER, "staff": STAFF}

WIDEST = """() => [...document.querySelectorAll('body *')]
    .filter(e => e.getBoundingClientRect().right > window.innerWidth + 1)
    .slice(-4)
    .map(e => e.tagName.toLowerCase() + (e.className && typeof e.className === 'string' ? '.' + e.className.trim().split(/\\s+/).join('.') : '')
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

