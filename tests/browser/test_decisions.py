"""Edit arguments on a chat card, and an email's action link on a phone-sized screen, in
a real browser against a real Sectr (Daphne, its embedded worker, the demo model).

Team `links`: alice (member, owns the sessions) and dora (moderator)."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.browser.conftest import PASSWORD, new_session, send
from tests.liveserver import LiveSectr

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]
PHONE = {"width": 390, "height": 844}


@pytest.fixture(scope="module")
def team(live: LiveSectr) -> str:
    code = (
        "from django.contrib.auth import get_user_model; U = get_user_model(); "
        f"U.objects.create_user('dora', password={PASSWORD!r}); "
        "from sessions_app.models import Team, Membership; t = Team.objects.create(name='links'); "
        "Membership.objects.create(team=t, user=U.objects.get(username='alice'), role='member'); "
        "Membership.objects.create(team=t, user=U.objects.get(username='dora'), role='moderator')"
    )
    live.manage("shell", "-c", code)
    return "links"


def email_link(live: LiveSectr, session_id: str) -> str:
    code = (
        "from sessions_app.models import Session; from django.contrib.auth import get_user_model; "
        "from sessions_app.action_links import EMAIL, link_url; "
        f"s = Session.objects.get(pk={session_id!r}); ask = s.projection().pending_ask['ask_id']; "
        "print(link_url(ask, EMAIL, get_user_model().objects.get(username='dora').pk))"
    )
    url = live.manage("shell", "-c", code).strip().splitlines()[-1]
    return "/approvals/act/" + url.split("/approvals/act/", 1)[1]


def test_edit_arguments_checks_the_json_and_runs_the_edited_call(alice: Page, team: str) -> None:
    new_session(alice, team=team)
    send(alice, "note: buy milk")
    card = alice.locator("[data-role=approval]").last
    card.get_by_text("Edit arguments").click()
    field = card.locator("textarea[name=arguments]")
    expect(field).to_be_visible()
    field.fill('{"title": "buy milk", ')
    card.get_by_role("button", name="Run with these arguments").click()
    assert field.evaluate("f => f.validationMessage").startswith("Not JSON")  # refused in the page
    expect(card).to_have_attribute("data-status", "pending")
    # JSON, but not what the tool takes: the server's 400 keeps the card and says why.
    field.fill('{"title": "buy milk", "colour": "red"}')
    card.get_by_role("button", name="Run with these arguments").click()
    expect(alice.locator("#flash")).to_contain_text("unknown argument 'colour'")
    card = alice.locator("[data-role=approval]").last
    expect(card).to_have_attribute("data-status", "pending")
    card.get_by_text("Edit arguments").click()
    field = card.locator("textarea[name=arguments]")
    field.fill('{"title": "buy milk", "body": "buy oat milk"}')
    card.get_by_role("button", name="Run with these arguments").click()
    expect(card).to_contain_text("Approved once by alice")
    expect(alice.locator("#notes")).to_contain_text("buy oat milk")


def test_an_email_link_decides_on_a_phone_after_login_and_only_once(
    alice: Page, browser: Browser, live: LiveSectr, team: str
) -> None:
    session_id = new_session(alice, team=team)
    send(alice, "note: call the bank")
    expect(alice.locator("[data-role=approval]").last).to_have_attribute("data-status", "pending")
    path = email_link(live, session_id)
    phone = browser.new_context(base_url=live.base_url, viewport=PHONE, is_mobile=True, has_touch=True)
    page = phone.new_page()
    page.goto(path)
    expect(page).to_have_url(re.compile(r"/accounts/login/\?next="))  # login first
    page.get_by_label("Username").fill("dora")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    expect(page.locator("[data-role=action-link]")).to_be_visible()
    expect(page.locator(".tool-args")).to_contain_text("call the bank")
    expect(page.locator(".ask-context")).to_contain_text("note: call the bank")
    expect(page.locator(".requester")).to_have_text("alice")
    # One screen on a phone: nothing wider than it, the buttons without scrolling.
    assert page.evaluate("document.scrollingElement.scrollWidth") <= PHONE["width"]
    for name in ("Approve once", "Deny"):
        box = page.get_by_role("button", name=name).bounding_box()
        assert box is not None and box["y"] + box["height"] <= PHONE["height"] and box["x"] + box["width"] <= 390
    expect(alice.locator("[data-role=approval]").last).to_have_attribute(
        "data-status", "pending"
    )  # GET decided nothing
    page.get_by_role("textbox", name="Note").fill("ask me tomorrow")
    page.get_by_role("button", name="Deny").click()
    expect(page.get_by_role("status")).to_have_text("Denied by dora: ask me tomorrow")
    expect(alice.locator("[data-role=approval]").last).to_contain_text("Denied by dora")
    page.goto(path)
    expect(page.get_by_role("alert")).to_contain_text("used already")
    phone.close()
