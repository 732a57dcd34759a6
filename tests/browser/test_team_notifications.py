"""The team page's Notifications section in Chromium: a moderator adds a Slack-style
webhook with a secret (never shown again), is told why an internal URL is refused,
turns `Links decide without login` on, deletes the webhook; at phone width the section
fits and works, and in dark mode too; a member sees only how many webhooks there are.

The webhook URL is a literal public address (judged without DNS) in a team with no
sessions: no ask is made, so it is never called.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.browser.conftest import PASSWORD, log_in
from tests.browser.test_team_pages import overflow, serious_violations, widest
from tests.liveserver import LiveSectr

HOOK = "https://93.184.215.14/services/T1/B2/relay"
SECRET = "relay-secret-never-shown-42"
SHOTS = Path(tempfile.gettempdir())
TEAM_SETUP = """
from django.contrib.auth import get_user_model
from sessions_app.models import Membership, Team
team, _ = Team.objects.get_or_create(name="relay")
users = get_user_model().objects
Membership.objects.update_or_create(team=team, user=users.get(username="wren"), defaults={"role": "moderator"})
Membership.objects.update_or_create(team=team, user=users.get(username="pip"), defaults={"role": "member"})
"""


def notifications(page: Page) -> None:
    page.goto("/teams/relay/")
    page.get_by_role("navigation", name="Team settings").get_by_role("link", name="Notifications").click()
    expect(page.get_by_role("heading", name="Notifications")).to_be_in_viewport()


def add_webhook(page: Page, url: str, kind: str, secret: str = "") -> None:
    form = page.get_by_role("form", name="Add a webhook")
    form.get_by_label("URL").fill(url)
    form.get_by_label("Kind").select_option(kind)
    form.get_by_label("Secret").fill(secret)
    form.get_by_role("button", name="Add webhook").click()


@pytest.mark.timeout(300)
def test_a_moderator_manages_webhooks_and_the_links_switch_at_desk_and_phone_width(
    browser: Browser, live: LiveSectr
) -> None:
    live.create_user("wren", password=PASSWORD)
    live.create_user("pip", password=PASSWORD)
    live.manage("shell", "-c", TEAM_SETUP)

    desk = browser.new_context(base_url=live.base_url, viewport={"width": 1280, "height": 900}).new_page()
    log_in(desk, "wren")
    notifications(desk)
    expect(desk.locator("#notifications .empty")).to_have_text("No webhooks.")
    expect(desk.locator("#links-state")).to_contain_text("Off: every link asks for a login first.")

    # An internal address is refused, with the reason, and nothing is added.
    add_webhook(desk, "http://169.254.169.254/latest/meta-data", "json")
    expect(desk.locator(".messages")).to_contain_text("webhooks may not call internal addresses")
    expect(desk.locator(".webhook-item")).to_have_count(0)

    # A Slack-style webhook with a secret: listed, the secret nowhere on the page.
    add_webhook(desk, HOOK, "slack", SECRET)
    expect(desk.locator(".messages")).to_contain_text("added (slack).")
    row = desk.locator(".webhook-item")
    expect(row).to_have_count(1)
    expect(row.locator(".webhook-url")).to_have_text(HOOK)
    expect(row.locator(".webhook-kind")).to_have_text("slack")
    assert SECRET not in desk.content()
    expect(desk.get_by_role("form", name="Add a webhook").get_by_label("Secret")).to_have_value("")

    # The switch.
    desk.get_by_label("Links decide without login").check()
    desk.get_by_role("form", name="Action links").get_by_role("button", name="Save").click()
    expect(desk.locator(".messages")).to_contain_text("Links in emails now decide without a login.")
    expect(desk.get_by_label("Links decide without login")).to_be_checked()
    expect(desk.locator("#links-state")).to_contain_text("On: a link in an email")
    assert serious_violations(desk) == [], "team page with a webhook"
    desk.locator("#notifications").screenshot(path=str(SHOTS / "team-notifications.png"))

    # A member sees how many webhooks there are, not their URLs, and no switch.
    member = browser.new_context(base_url=live.base_url, viewport={"width": 1280, "height": 900}).new_page()
    log_in(member, "pip")
    notifications(member)
    expect(member.locator("#webhook-count")).to_have_text("1 webhook; the team's moderators see and manage it.")
    assert HOOK not in member.content()
    expect(member.get_by_label("Links decide without login")).to_have_count(0)
    expect(member.locator("#links-state")).to_contain_text("On:")
    member.context.close()

    # At phone width, in dark mode: the section fits, and the forms work.
    phone_context = browser.new_context(
        base_url=live.base_url,
        viewport={"width": 390, "height": 844},
        is_mobile=True,
        has_touch=True,
        color_scheme="dark",
    )
    phone_context.add_cookies(desk.context.cookies())
    phone = phone_context.new_page()
    notifications(phone)
    assert overflow(phone) <= 0, widest(phone)
    url_box = phone.get_by_role("form", name="Add a webhook").get_by_label("URL").bounding_box()
    assert url_box is not None and url_box["x"] >= 0 and url_box["x"] + url_box["width"] <= 390
    add_webhook(phone, "https://93.184.215.14/json-hook", "json")
    expect(phone.locator(".messages")).to_contain_text("added (json).")
    expect(phone.locator(".webhook-item")).to_have_count(2)
    assert overflow(phone) <= 0, widest(phone)
    background = phone.evaluate("getComputedStyle(document.querySelector('#notifications')).backgroundColor")
    assert background not in ("rgb(255, 255, 255)", "rgba(0, 0, 0, 0)"), background
    phone.get_by_label("Links decide without login").uncheck()
    phone.get_by_role("form", name="Action links").get_by_role("button", name="Save").click()
    expect(phone.locator(".messages")).to_contain_text("Links now ask for a login first.")
    phone.locator("#notifications").screenshot(path=str(SHOTS / "team-notifications-phone-dark.png"))
    assert serious_violations(phone) == [], "team page at phone width, dark"

    # Delete both, from the phone.
    phone.get_by_role("button", name=f"Delete webhook {HOOK}").click()
    expect(phone.locator(".messages")).to_contain_text("deleted.")
    phone.get_by_role("button", name="Delete webhook https://93.184.215.14/json-hook").click()
    expect(phone.locator("#notifications .empty")).to_have_text("No webhooks.")
    phone_context.close()
    desk.context.close()
