"""Browser tests: Playwright's sync API driving Debian's headless Chromium against a real
Sectr (tests/liveserver.LiveSectr: Daphne with its embedded worker, a scratch database).

Run them in their own pytest process without pytest-asyncio (its event loop and
Playwright's sync API clash):

    .venv/bin/pytest -q -p no:asyncio tests/browser

Chromium comes from apt (scripts/ensure_chromium.sh), never from `playwright install`.
One server serves the whole run (starting one takes seconds); tests that restart it
leave it running again.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import Browser, BrowserContext, Page, Playwright, expect, sync_playwright

from tests.liveserver import LiveSectr

CHROMIUM = os.environ.get("SECTR_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
PASSWORD = "pw-Secret-123"
USERS = ("alice", "mallory")

expect.set_options(timeout=10_000)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if shutil.which(CHROMIUM) is None and not os.path.exists(CHROMIUM):
        skip = pytest.mark.skip(reason=f"{CHROMIUM} is missing: run `bash scripts/ensure_chromium.sh`")
        for item in items:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def live() -> Iterator[LiveSectr]:
    # Browser tests always run on the embedded defaults (SQLite, in-memory channel layer).
    # Many tests log the same users in within minutes: the login throttle is not under test here.
    env = {
        "SECTR_WS_RESYNC_SECONDS": "5",
        "SECTR_LOGIN_LIMIT_PER_ACCOUNT": "1000/300",
        "SECTR_LOGIN_LIMIT_PER_ADDRESS": "1000/300",
        # The moderation tests' webhook receiver listens on the loopback, which the
        # address guard refuses unless an operator allows it.
        "SECTR_WEBHOOK_ALLOWED_HOSTS": "127.0.0.1",
    }
    saved = {name: os.environ.pop(name, None) for name in ("DATABASE_URL", "REDIS_URL")}
    try:
        with LiveSectr(env=env) as server:
            for name in USERS:
                server.create_user(name, password=PASSWORD)
            yield server
    finally:
        for name, value in saved.items():
            if value is not None:
                os.environ[name] = value


@pytest.fixture(scope="session")
def playwright() -> Iterator[Playwright]:
    with sync_playwright() as driver:
        yield driver


@pytest.fixture(scope="session")
def browser(playwright: Playwright) -> Iterator[Browser]:
    chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
    yield chromium
    chromium.close()


@pytest.fixture
def context(browser: Browser, live: LiveSectr) -> Iterator[BrowserContext]:
    ctx = browser.new_context(base_url=live.base_url, viewport={"width": 1200, "height": 900})
    yield ctx
    ctx.close()


@pytest.fixture
def page(context: BrowserContext) -> Page:
    return context.new_page()


def log_in(page: Page, username: str, password: str = PASSWORD) -> None:
    page.goto("/accounts/login/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("button", name="New session")).to_be_visible()


def new_session(page: Page, **choices: Any) -> str:
    """Start a session from the sessions list; returns its id."""
    page.goto("/")
    for label, value in choices.items():
        page.get_by_label(label.capitalize()).select_option(value)
    page.get_by_role("button", name="New session").click()
    page.wait_for_url(re.compile(r"/sessions/ses_[0-9a-f]+/$"))
    expect(page.locator("#live")).to_have_text("live")
    return page.url.rstrip("/").rsplit("/", 1)[-1]


def send(page: Page, text: str) -> None:
    box = page.get_by_label("Message", exact=True)
    box.fill(text)
    page.get_by_role("button", name="Send").click()
    expect(box).to_have_value("")


@pytest.fixture
def alice(page: Page) -> Page:
    log_in(page, "alice")
    return page
