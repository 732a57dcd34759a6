"""The Content-Security-Policy holds on every page and nothing on them breaks it: the
pages are walked in Chromium while `securitypolicyviolation` events and console errors
are collected."""

from __future__ import annotations

from typing import Any

from playwright.sync_api import Page, expect

from tests.browser.conftest import log_in, new_session, send

COLLECT_VIOLATIONS = """
window.__csp = [];
document.addEventListener("securitypolicyviolation", (e) => {
  window.__csp.push({directive: e.violatedDirective, blocked: e.blockedURI, sample: e.sample, source: e.sourceFile});
});
"""


def violations(page: Page) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = page.evaluate("window.__csp || []")
    return found


def test_every_page_has_the_policy_and_breaks_none_of_it(page: Page) -> None:
    console: list[str] = []
    page.on("console", lambda message: console.append(message.text) if message.type == "error" else None)
    page.add_init_script(COLLECT_VIOLATIONS)
    policies: dict[str, str] = {}
    page.on(
        "response",
        lambda response: (
            policies.__setitem__(response.url, response.headers.get("content-security-policy", ""))
            if response.request.resource_type == "document"
            else None
        ),
    )
    seen: list[dict[str, Any]] = []

    log_in(page, "alice")
    seen += violations(page)
    new_session(page)  # the socket connects: connect-src allows it
    assert page.evaluate("typeof window.htmx") == "object", "htmx did not load"
    send(page, "| left | right |\n|:-----|------:|\n| a | b |\n\n**bold** and `code`")
    expect(page.locator(".msg-assistant").last).to_contain_text("right", timeout=15_000)
    seen += violations(page)
    for path in ("/", "/approvals/", "/settings/tokens/"):
        page.goto(path)
        expect(page.locator("main")).to_be_visible()
        seen += violations(page)
    page.goto("/settings/tokens/")
    page.get_by_label("Name").fill("csp")
    page.get_by_role("button", name="Create token").click()
    seen += violations(page)

    assert seen == [], seen
    assert not [text for text in console if "Content Security Policy" in text], console
    assert policies and all("script-src 'self'" in policy for policy in policies.values()), policies

    # The listener does catch a violation, and the policy does block inline script.
    page.evaluate(
        "() => { const s = document.createElement('script'); s.textContent = 'window.__ran = 1';"
        " document.body.appendChild(s); }"
    )
    page.wait_for_function("window.__csp.length > 0")
    assert page.evaluate("window.__ran") is None
    assert violations(page)[0]["directive"].startswith("script-src")
