"""Team review in Chromium: a reviewer searches, opens a transcript, rates a message and
the session, queues the results and works through them, exports JSON and Markdown,
creates a share link that an anonymous browser opens, then revokes it (after a yes to
"Revoke this share link?"; the link then answers 404 with a page that says it was revoked)."""

from __future__ import annotations

import json
import re

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.browser.conftest import PASSWORD, log_in, new_session, send
from tests.liveserver import LiveSectr

TEAM_SETUP = """
from django.contrib.auth import get_user_model
from sessions_app.models import Membership, Team
team, _ = Team.objects.get_or_create(name="ocean")
users = get_user_model().objects
Membership.objects.update_or_create(team=team, user=users.get(username="alice"), defaults={"role": "member"})
Membership.objects.update_or_create(team=team, user=users.get(username="rita"), defaults={"role": "reviewer"})
"""


@pytest.mark.timeout(400)  # one long journey through eight pages on a shared machine
def test_a_reviewer_finds_rates_queues_exports_and_shares(page: Page, browser: Browser, live: LiveSectr) -> None:
    live.create_user("rita", password=PASSWORD)
    live.manage("shell", "-c", TEAM_SETUP)

    # alice (a member of the team) has two conversations about penguins.
    log_in(page, "alice")
    for text in ("tell me about penguins", "more penguins please"):
        new_session(page, team="ocean")
        send(page, text)
        expect(page.locator('[data-role="assistant"]').last).to_contain_text(f"You said: {text}")
    page.context.clear_cookies()

    # rita, a reviewer of the team, searches.
    log_in(page, "rita")
    page.goto("/review/")
    page.get_by_label("Search").fill("penguins")
    page.get_by_role("button", name="Filter").click()
    rows = page.locator("table[aria-label=Sessions] tbody tr[data-session]")
    expect(rows).to_have_count(2)
    expect(page.locator('[data-role="snippet"] mark').first).to_have_text(re.compile("penguins", re.I))

    # A queue for the results.
    page.goto("/review/queues/")
    page.get_by_label("Name").fill("Weekly")
    page.get_by_label("Reviewers").fill("rita")
    page.get_by_role("button", name="Create queue").click()
    expect(page.locator('[data-role="progress"]')).to_contain_text("0 of 0 done")
    page.goto("/review/?q=penguins")
    page.get_by_role("button", name="Add all results to queue").click()
    expect(page.get_by_text("Added 2 sessions to Weekly, assigned to rita (2).")).to_be_visible()
    page.get_by_role("button", name="Add all results to queue").click()
    expect(page.get_by_text("2 already in it, not added again")).to_be_visible()

    # Work through it: open the first, rate a message and the session.
    page.goto("/review/queues/")
    page.get_by_role("link", name="Weekly").click()
    page.get_by_role("link", name="Start reviewing").click()
    expect(page.locator(".queue-nav")).to_contain_text("item 1 of 2")
    expect(page.locator('[data-role="progress"]')).to_have_text("0 of 2 done")
    first_url = page.url
    page.locator("li[data-role=assistant] details summary").first.click()
    message_form = page.locator("li[data-role=assistant] form.rating-form").first
    message_form.get_by_label("Down").check()
    message_form.get_by_label("Score (1-5)").select_option("2")
    message_form.get_by_label("Tags").fill("terse")
    message_form.get_by_role("button", name="Save rating").click()
    expect(page.get_by_text("Rating saved.")).to_be_visible()
    expect(page.locator("li[data-role=assistant] .rating").first).to_contain_text("rita: 👎thumbs down score 2/5")
    page.get_by_text("Rate this session").click()
    session_form = page.get_by_role("form", name="Rating of the session")
    session_form.get_by_label("Up").check()
    session_form.get_by_label("Comment").fill("fine overall")
    session_form.get_by_role("button", name="Save rating").click()
    expect(page.locator("section.snapshot .rating")).to_contain_text("fine overall")

    # Export JSON (the journal exactly) and Markdown.
    with page.expect_download() as json_download:
        page.get_by_role("link", name="Export JSON", exact=True).click()
    exported = json.loads(open(json_download.value.path(), encoding="utf-8").read())
    assert exported["format"] == "sectr.journal"
    assert [e["seq"] for e in exported["envelopes"]] == list(range(1, len(exported["envelopes"]) + 1))
    assert exported["envelopes"][0]["type"] == "SESSION_CREATED"
    with page.expect_download() as md_download:
        page.get_by_role("link", name="Export Markdown").click()
    markdown = open(md_download.value.path(), encoding="utf-8").read()
    assert "## User" in markdown and "You said:" in markdown

    # Done: on to the next, with the progress count.
    page.get_by_role("button", name="Done").click()
    expect(page.locator(".queue-nav")).to_contain_text("item 2 of 2")
    expect(page.locator('[data-role="progress"]')).to_have_text("1 of 2 done")
    page.get_by_role("link", name="Previous").click()
    assert page.url == first_url

    # A share link, opened by an anonymous browser, then revoked.
    page.get_by_role("button", name="Share link").click()
    expect(page).to_have_url(re.compile(r"/settings/shares/"))
    share_url = page.get_by_label("Share URL").first.input_value()
    anonymous = browser.new_context()
    stranger = anonymous.new_page()
    response = stranger.goto(share_url)
    assert response is not None and response.status == 200
    expect(stranger.locator("[data-role=assistant]")).to_contain_text("You said:")
    expect(stranger.locator("body")).not_to_contain_text("fine overall")
    page.once("dialog", lambda dialog: dialog.accept())  # "Revoke this share link?"
    page.get_by_role("button", name="Revoke").first.click()
    expect(page.locator("tbody tr").first).to_contain_text("revoked")
    response = stranger.goto(share_url)
    assert response is not None and response.status == 404
    expect(stranger.get_by_role("heading", level=1)).to_have_text("This share link was revoked")
    expect(stranger.locator("body")).not_to_contain_text("You said:")
    anonymous.close()
