"""The chat page at the standard of the peers' chats (issue 13), in headless Chromium.

Regenerate and Edit (branches linked both ways), Copy, server-side highlighting, the
dark theme and its remembered toggle, the one-line header that does not jump, the tab
title following a rename, every page at 390 px without horizontal scroll (also with a
long tool result), and axe-core (static/vendor/axe.min.js, vendored from npm, loaded from the server as a file) finding
no serious or critical violation on the login, sessions, chat, approvals and review
pages in both themes.

Set SECTR_SCREENSHOTS=1 to refresh docs/screenshots/ (light and dark, desktop and mobile).
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, BrowserContext, Page, expect

from tests.browser.conftest import PASSWORD, log_in, new_session, send
from tests.liveserver import ROOT, LiveSectr

# Generous: on a loaded machine starting the server and making users alone can take a minute.
pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]

SHOTS = ROOT / "docs" / "screenshots" if os.environ.get("SECTR_SCREENSHOTS") else Path(tempfile.gettempdir())
PHONE = {"width": 390, "height": 844}


def state(page: Page) -> Any:
    return page.locator("[data-role=state]")


def assistant(page: Page) -> Any:
    return page.locator("[data-role=assistant]").last


def session_id_of(page: Page) -> str:
    return page.url.rstrip("/").rsplit("/", 1)[-1]


@pytest.fixture(scope="module")
def reviewer_name(live: LiveSectr) -> str:
    live.create_user("carol", is_superuser=True, is_staff=True)
    return "carol"


def new_context(browser: Browser, live: LiveSectr, **options: Any) -> BrowserContext:
    options.setdefault("viewport", {"width": 1280, "height": 900})
    return browser.new_context(base_url=live.base_url, **options)


@pytest.fixture
def phone(browser: Browser, live: LiveSectr) -> Iterator[Page]:
    context = new_context(browser, live, viewport=PHONE, is_mobile=True, has_touch=True)
    page = context.new_page()
    yield page
    context.close()


def open_menu(page: Page) -> None:
    menu = page.locator("details.session-menu")
    if menu.get_attribute("open") is None:
        menu.locator("summary").click()


# ---- branches ----


def test_regenerate_answers_again_in_a_branch_and_the_pages_link_both_ways(alice: Page) -> None:
    source = new_session(alice)
    send(alice, "hello there")
    expect(state(alice)).to_have_text("completed")
    expect(alice.get_by_role("button", name="Regenerate")).to_have_count(1)
    alice.get_by_role("button", name="Regenerate").click()
    alice.wait_for_url(lambda url: source not in url)
    branch = session_id_of(alice)
    notice = alice.locator("[data-role=notice]").first
    expect(notice).to_contain_text("Regenerated reply")
    expect(alice.locator(".messages")).to_contain_text("Regenerating in a new branch")
    expect(assistant(alice)).to_have_text(re.compile("You said: hello there"))
    expect(state(alice)).to_have_text("completed")
    # The fork keeps the prompt once (inherited) and answers it again.
    expect(alice.locator("[data-role=user]")).to_have_count(1)
    notice.get_by_role("link").click()
    alice.wait_for_url(f"**/sessions/{source}/")
    expect(alice.locator("[data-role=user]").get_by_role("link", name="regenerated #1")).to_have_attribute(
        "href", f"/sessions/{branch}/"
    )
    expect(alice.locator(".branches-panel")).to_contain_text("regenerated at event")


def test_edit_sends_the_edited_text_in_a_branch(alice: Page) -> None:
    source = new_session(alice)
    send(alice, "first try")
    expect(state(alice)).to_have_text("completed")
    send(alice, "second message")
    expect(assistant(alice)).to_contain_text("You said: second message")
    expect(state(alice)).to_have_text("completed")
    first = alice.locator("[data-role=user]").first
    first.get_by_role("button", name="Edit").click()
    box = first.get_by_label("Edited text")
    expect(box).to_be_focused()
    expect(box).to_have_value("first try")
    box.fill("better try")
    first.get_by_role("button", name="Submit edit").click()
    alice.wait_for_url(lambda url: source not in url)
    expect(alice.locator("[data-role=notice]").first).to_contain_text("Edited message")
    expect(alice.locator("[data-role=notice]").first.get_by_role("link")).to_have_attribute(
        "href", f"/sessions/{source}/"
    )
    expect(assistant(alice)).to_have_text(re.compile("You said: better try"))
    expect(alice.locator("[data-role=user]")).to_have_count(1)  # the edited one; nothing after it
    # The sidebar tells the branch apart.
    expect(alice.locator("#sidebar .current .badge-fork")).to_have_text("branch")


# ---- reading ----


def test_code_is_highlighted_and_copy_copies_code_and_messages(alice: Page) -> None:
    alice.context.grant_permissions(["clipboard-read", "clipboard-write"])
    new_session(alice)
    send(alice, 'code:\n```python\ndef greet(name):\n    return "hi " + name\n```')
    reply = assistant(alice)
    expect(reply.locator("pre code.language-python span.k").first).to_have_text("def")
    colours = reply.evaluate(
        """node => [getComputedStyle(node.querySelector('span.k')).color,
                    getComputedStyle(node.querySelector('span.nf')).color,
                    getComputedStyle(node.querySelector('pre code')).color]"""
    )
    assert len(set(colours)) == 3, colours  # keywords, names and plain text differ
    reply.locator(".code-block").get_by_role("button", name="Copy").click()
    expect(reply.locator(".copy-code.copied")).to_have_count(1)
    assert alice.evaluate("navigator.clipboard.readText()") == 'def greet(name):\n    return "hi " + name'
    reply.locator(".msg-actions").get_by_role("button", name="Copy").click()
    copied = alice.evaluate("navigator.clipboard.readText()")
    assert copied.startswith("You said: code:") and "def greet(name):" in copied
    user = alice.locator("[data-role=user]").last
    user.locator(".msg-actions").get_by_role("button", name="Copy").click()
    assert alice.evaluate("navigator.clipboard.readText()").startswith("code:")
    # User messages are the same safe Markdown, and say when they were sent.
    expect(user.locator("pre code.language-python")).to_have_count(1)
    expect(user.locator("time")).to_have_text("just now")
    assert re.match(r"\d{4}-\d\d-\d\dT", user.locator("time").get_attribute("datetime") or "")
    assert user.locator("time").get_attribute("title")


def test_the_header_stays_one_line_while_a_run_streams_and_the_title_follows_rename(alice: Page) -> None:
    new_session(alice)
    head = alice.locator(".chat-head")
    before = head.bounding_box()
    assert before is not None and before["height"] < 60
    send(alice, "!slow 12")
    expect(state(alice)).to_have_text("running")
    expect(assistant(alice)).to_contain_text("tick 3")
    during = head.bounding_box()
    assert during is not None and during["height"] == before["height"]
    state_box = state(alice).bounding_box()
    expect(state(alice)).to_have_text("completed")
    after = head.bounding_box()
    assert after is not None and after["height"] == before["height"]
    assert state(alice).bounding_box() == state_box  # the state word's slot did not move
    open_menu(alice)
    alice.get_by_label("Title", exact=True).fill("Ticks and tocks")
    alice.get_by_role("button", name="Rename").click()
    expect(alice.locator("#flash")).to_contain_text("Renamed to “Ticks and tocks”.")
    expect(alice).to_have_title("Ticks and tocks · Sectr")
    alice.get_by_label("Mode", exact=True).select_option("plan")
    expect(alice.locator("#flash")).to_contain_text("Mode: Plan")
    # The change reaches the page live (the options are swapped in, the select stays).
    expect(alice.locator("#id_mode option[selected]")).to_have_attribute("value", "plan")
    alice.get_by_label("Mode", exact=True).select_option("default")
    expect(alice.locator("#flash")).to_contain_text("Mode: Default")


def test_dark_mode_follows_the_system_and_the_toggle_is_remembered(browser: Browser, live: LiveSectr) -> None:
    context = new_context(browser, live, color_scheme="dark")
    page = context.new_page()
    log_in(page, "alice")

    def background() -> str:
        return str(page.evaluate("getComputedStyle(document.body).backgroundColor"))

    dark = background()
    assert dark == "rgb(18, 21, 28)", dark
    toggle = page.get_by_role("button", name="Dark mode")
    expect(toggle).to_have_attribute("aria-pressed", "true")
    toggle.click()
    expect(toggle).to_have_attribute("aria-pressed", "false")
    assert background() == "rgb(244, 245, 248)"
    page.reload()
    assert background() == "rgb(244, 245, 248)"  # remembered (localStorage), before paint
    page.get_by_role("button", name="Dark mode").click()
    page.goto("/approvals/")
    assert background() == dark
    context.close()


# ---- small screens ----


def document_overflow(page: Page) -> int:
    return int(page.evaluate("document.documentElement.scrollWidth - window.innerWidth"))


def widest_elements(page: Page) -> list[str]:
    """The elements that stick out past the viewport's right edge (for a failure's message)."""
    return list(
        page.evaluate(
            """() => [...document.querySelectorAll('main *')]
                .filter(e => e.getBoundingClientRect().right > window.innerWidth + 1)
                .slice(0, 8)
                .map(e => e.tagName + '.' + e.className + ' ' + Math.round(e.getBoundingClientRect().width))"""
        )
    )


def test_the_chat_fits_390_px_with_long_lines_in_every_card(phone: Page, reviewer_name: str) -> None:
    log_in(phone, "alice")
    assert document_overflow(phone) == 0
    session = new_session(phone)
    long_word = "x" * 400  # no break opportunity anywhere
    send(phone, f"calculate {'+'.join(['1'] * 150)}")
    expect(phone.locator("[data-role=tool-call] .tool-result")).to_have_count(1)
    send(phone, f'!tool get_time {{"zone": "{long_word}"}}')
    expect(phone.locator("[data-role=tool-call] .tool-result")).to_have_count(2)
    send(phone, f"here it is: `{long_word}` and\n```\n{long_word}\n```")
    expect(assistant(phone)).to_contain_text("here it is")
    expect(state(phone)).to_have_text("completed")
    send(phone, f"note: {long_word}")
    expect(phone.locator("[data-role=approval]").last).to_be_visible()
    expect(phone.locator("#live")).to_have_text("live")
    assert document_overflow(phone) == 0
    phone.screenshot(path=str(SHOTS / "chat-mobile.png"), full_page=False)
    phone.emulate_media(color_scheme="dark")
    assert document_overflow(phone) == 0
    phone.screenshot(path=str(SHOTS / "chat-mobile-dark.png"), full_page=False)
    phone.emulate_media(color_scheme="light")
    # The top menu is collapsed behind a button, and opens.
    nav = phone.get_by_role("navigation", name="Main")
    expect(nav).to_be_hidden()
    phone.get_by_role("button", name="Menu").click()
    expect(nav.get_by_role("link", name="Approvals")).to_be_visible()
    assert document_overflow(phone) == 0
    # A reviewer reads the same long session on the review page.
    phone.context.clear_cookies()
    log_in(phone, reviewer_name)
    for path in ("/review/", f"/review/{session}/", f"/sessions/{session}/"):
        phone.goto(path)
        assert document_overflow(phone) == 0, (path, widest_elements(phone))


def test_the_other_pages_fit_390_px(phone: Page) -> None:
    phone.goto("/accounts/login/")
    assert document_overflow(phone) == 0
    log_in(phone, "alice")
    session = new_session(phone)
    for path in (
        "/",
        "/?q=nothing",
        "/approvals/",
        "/settings/tokens/",
        "/accounts/password_change/",
        f"/sessions/{session}/",
    ):
        phone.goto(path)
        assert document_overflow(phone) == 0, path


# ---- accessibility ----


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


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_axe_finds_nothing_serious_on_the_main_pages(
    browser: Browser, live: LiveSectr, reviewer_name: str, scheme: str
) -> None:
    context = new_context(browser, live, color_scheme=scheme)
    page = context.new_page()
    page.goto("/accounts/login/")
    assert serious_violations(page) == [], "login"
    log_in(page, "alice")
    session = new_session(page)
    send(page, "hello **world** with `code`")
    expect(state(page)).to_have_text("completed")
    send(page, "note: check contrast")
    expect(page.locator("[data-role=approval]")).to_have_count(1)
    expect(state(page)).to_have_text("awaiting")
    open_menu(page)
    assert serious_violations(page) == [], "chat"
    if scheme == "light":
        page.screenshot(path=str(SHOTS / "chat.png"), full_page=False)
        page.locator("[data-role=approval]").screenshot(path=str(SHOTS / "approval.png"))
    else:
        page.screenshot(path=str(SHOTS / "chat-dark.png"), full_page=False)
    for path in ("/", "/approvals/"):
        page.goto(path)
        assert serious_violations(page) == [], path
    if scheme == "light":
        page.goto("/")
        page.screenshot(path=str(SHOTS / "sessions.png"))
    page.context.clear_cookies()
    log_in(page, reviewer_name, PASSWORD)
    for path in ("/review/", f"/review/{session}/"):
        page.goto(path)
        assert serious_violations(page) == [], path
    context.close()


def test_controls_are_reachable_by_keyboard_with_a_focus_ring(alice: Page) -> None:
    new_session(alice)
    send(alice, "hi")
    expect(state(alice)).to_have_text("completed")
    summary = alice.locator("details.session-menu summary")
    summary.focus()
    alice.keyboard.press("Enter")
    expect(alice.locator("details.session-menu")).to_have_attribute("open", "")
    alice.keyboard.press("Tab")
    focused = alice.evaluate("document.activeElement.id")
    assert focused == "id_mode"
    outline = alice.evaluate("getComputedStyle(document.activeElement).outlineStyle")
    assert outline == "solid"
    alice.keyboard.press("Escape")
    expect(alice.locator("details.session-menu")).not_to_have_attribute("open", "")
    expect(summary).to_be_focused()
    # Landmarks and a heading per page; the announcer for new messages is polite.
    assert alice.locator("header.topbar").count() == 1 and alice.locator("main").count() == 1
    expect(alice.get_by_role("heading", level=1)).to_have_count(1)
    expect(alice.locator("#announce")).to_have_attribute("aria-live", "polite")
    send(alice, "announce me")
    expect(alice.locator("#announce")).to_contain_text("Assistant: You said: announce me")
