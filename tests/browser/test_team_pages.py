"""The team settings pages in Chromium: a moderator adds a member and creates an agent
with instructions and two tools on /teams/<name>/; the member starts a session with it
from the New session form, and the demo model's `!system` and `!offered` show what the
model was given; the chat header names the agent and its version. The pages fit a
phone, and axe-core finds nothing serious on them.

Set SECTR_SCREENSHOTS=1 to refresh docs/screenshots/teams.png and teams-phone.png.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.browser.conftest import PASSWORD, log_in, send
from tests.liveserver import LiveSectr

ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "docs" / "screenshots" if os.environ.get("SECTR_SCREENSHOTS") else Path(tempfile.gettempdir())
INSTRUCTIONS = "You are the launch assistant. Answer in one line."
TEAM_SETUP = """
from django.contrib.auth import get_user_model
from sessions_app.models import Membership, Team
team, _ = Team.objects.get_or_create(name="launch")
Membership.objects.update_or_create(
    team=team, user=get_user_model().objects.get(username="mia"), defaults={"role": "moderator"}
)
"""


def serious_violations(page: Page) -> list[str]:
    # From the same origin, as a file: the pages' CSP refuses inline scripts.
    page.add_script_tag(url="/static/vendor/axe.min.js")
    found = page.evaluate(
        """async () => {
            const result = await axe.run(document, {resultTypes: ['violations']});
            return result.violations
                .filter(v => v.impact === 'serious' || v.impact === 'critical')
                .map(v => v.id + ': ' + v.nodes.slice(0, 3).map(n => n.target.join(' ')).join(' | '));
        }"""
    )
    return list(found)


def overflow(page: Page) -> int:
    return int(page.evaluate("document.documentElement.scrollWidth - window.innerWidth"))


def widest(page: Page) -> list[str]:
    return list(
        page.evaluate(
            """() => [...document.querySelectorAll('main *')]
                .filter(e => e.getBoundingClientRect().right > window.innerWidth + 1)
                .slice(0, 8)
                .map(e => e.tagName + '.' + e.className + ' ' + Math.round(e.getBoundingClientRect().width))"""
        )
    )


@pytest.mark.timeout(300)
def test_a_moderator_makes_an_agent_and_a_member_runs_it(browser: Browser, live: LiveSectr) -> None:
    # Their own users: the live server is shared, and a team (with its first agent) would
    # change the default of every later test's new sessions for alice.
    live.create_user("mia", password=PASSWORD)
    live.create_user("milo", password=PASSWORD)
    live.manage("shell", "-c", TEAM_SETUP)

    # mia, the team's moderator, finds the team from the top menu.
    mia = browser.new_context(base_url=live.base_url, viewport={"width": 1280, "height": 900}).new_page()
    log_in(mia, "mia")
    mia.get_by_role("navigation", name="Main").get_by_role("link", name="Teams").click()
    mia.get_by_role("link", name="launch").click()
    expect(mia.get_by_role("heading", name="launch", level=1)).to_be_visible()

    # Members: she adds milo.
    mia.get_by_label("Username or email").fill("milo")
    mia.get_by_role("button", name="Add person").click()
    expect(mia.locator(".messages")).to_contain_text("milo added as member")
    expect(mia.locator("table.members")).to_contain_text("milo")

    # Agents: a new agent with instructions and two tools from the picker.
    mia.get_by_role("link", name="New agent").click()
    mia.get_by_label("Slug").fill("launch-helper")
    mia.get_by_label("Name", exact=True).fill("Launch assistant")
    mia.get_by_label("Instructions").fill(INSTRUCTIONS)
    mia.get_by_label(re.compile(r"^get_time \(")).check()
    mia.get_by_label(re.compile(r"^calculator \(")).check()
    mia.get_by_label("Change note").fill("first cut")
    mia.get_by_role("button", name="Create agent").click()
    expect(mia.get_by_role("heading", level=1)).to_contain_text("Launch assistant v1")
    expect(mia.locator(".agent-config")).to_contain_text(INSTRUCTIONS)
    assert serious_violations(mia) == [], "agent page"
    mia.screenshot(path=str(Path(tempfile.gettempdir()) / "teams-agent.png"), full_page=True)

    mia.goto("/teams/launch/")
    expect(mia.locator("table.agents")).to_contain_text("Launch assistant")
    assert serious_violations(mia) == [], "team page"
    mia.screenshot(path=str(SHOTS / "teams.png"), full_page=True)
    mia.goto("/teams/")
    assert serious_violations(mia) == [], "teams list"

    # The team page fits a phone.
    phone_context = browser.new_context(
        base_url=live.base_url, viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True
    )
    phone_context.add_cookies(mia.context.cookies())
    phone = phone_context.new_page()
    for path in ("/teams/", "/teams/launch/", "/teams/launch/agents/launch-helper/", "/teams/launch/agents/new"):
        phone.goto(path)
        assert overflow(phone) <= 0, (path, widest(phone))
        # For a look at the forms at phone width (not kept in docs/).
        phone.screenshot(
            path=str(Path(tempfile.gettempdir()) / f"teams-phone{path.replace('/', '_')}.png"), full_page=True
        )
    phone.goto("/teams/launch/")
    phone.screenshot(path=str(SHOTS / "teams-phone.png"), full_page=True)
    phone_context.close()

    # milo, now a member, starts a session with the team's agent from the New session form.
    milo = browser.new_context(base_url=live.base_url, viewport={"width": 1280, "height": 900}).new_page()
    log_in(milo, "milo")
    milo.get_by_label("Team").select_option("launch")
    expect(milo.get_by_label("Agent")).to_have_value("launch/launch-helper")
    milo.get_by_role("button", name="New session").click()
    milo.wait_for_url(re.compile(r"/sessions/ses_[0-9a-f]+/$"))
    expect(milo.locator("#live")).to_have_text("live")
    header = milo.locator(".agent-name")
    expect(header).to_have_text("Launch assistant v1")
    expect(header.get_by_role("link")).to_have_attribute("href", "/teams/launch/agents/launch-helper/")

    send(milo, "!system")
    expect(milo.locator('[data-role="assistant"]').last).to_contain_text(f"system: {INSTRUCTIONS}")
    send(milo, "!offered")
    expect(milo.locator('[data-role="assistant"]').last).to_contain_text("tools: calculator, get_time")

    # A member reads the team page but gets no edit forms.
    milo.goto("/teams/launch/")
    expect(milo.get_by_role("heading", name="Members")).to_be_visible()
    expect(milo.get_by_role("button", name="Add person")).to_have_count(0)
    expect(milo.get_by_role("link", name="New agent")).to_have_count(0)
    milo.context.close()
    mia.context.close()
