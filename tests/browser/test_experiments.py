"""An experiment in a real browser: a moderator replays a member's session on a new
agent version from /review/ (Replay with…), reads the comparison, and a reviewer judges
the pair blind; at 1280 and 390 px wide, against a real Sectr (Daphne, its embedded
worker, the demo model).

Team `lab`: alice (member, owns the session), erin (moderator), finn (reviewer).

Set SECTR_SCREENSHOTS=1 to refresh docs/screenshots/experiment-*.png (otherwise they go
to a temp dir, so a test run leaves the repository as it was)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.browser.conftest import PASSWORD, log_in, new_session, send
from tests.liveserver import ROOT, LiveSectr

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]
PHONE = {"width": 390, "height": 844}
DESK = {"width": 1280, "height": 800}
SHOTS = ROOT / "docs" / "screenshots" if os.environ.get("SECTR_SCREENSHOTS") else Path(tempfile.gettempdir())


@pytest.fixture(scope="module")
def lab(live: LiveSectr) -> str:
    code = (
        "from django.contrib.auth import get_user_model; U = get_user_model(); "
        f"U.objects.create_user('erin', password={PASSWORD!r}); U.objects.create_user('finn', password={PASSWORD!r}); "
        "from sessions_app import actions; actions.do_create_team('lab'); "
        "actions.do_set_membership('lab', 'alice', 'member'); actions.do_set_membership('lab', 'erin', 'moderator'); "
        "actions.do_set_membership('lab', 'finn', 'reviewer'); "
        "erin = U.objects.get(username='erin'); "
        "actions.do_create_agent(erin, 'lab', 'helper', {'name': 'Helper', 'instructions': 'one'})"
    )
    live.manage("shell", "-c", code)
    return "lab"


def no_sideways_scroll(page: Page) -> None:
    assert page.evaluate("document.scrollingElement.scrollWidth") <= page.viewport_size["width"]  # type: ignore[index]


def test_replay_compare_and_judge_blind(alice: Page, browser: Browser, live: LiveSectr, lab: str) -> None:
    new_session(alice, team=lab)  # the team's first agent: helper, version 1
    send(alice, "calculate 6*7")
    expect(alice.locator("[data-role=assistant]").last).to_contain_text("42")
    send(alice, "!system")
    expect(alice.locator("[data-role=assistant]").last).to_contain_text("system: one")
    live.manage(
        "shell",
        "-c",
        "from django.contrib.auth import get_user_model; from sessions_app import actions; "
        "actions.do_save_agent_version(get_user_model().objects.get(username='erin'), 'lab/helper', "
        "{'instructions': 'two'})",
    )

    erin = browser.new_context(base_url=live.base_url, viewport=DESK).new_page()
    log_in(erin, "erin")
    erin.goto("/review/?team=lab")
    erin.get_by_role("link", name="Replay with…").click()
    expect(erin.locator("textarea[name=sessions]")).not_to_have_value("")
    erin.get_by_label("Name").fill("helper v2 trial")
    erin.get_by_label("Candidate B").select_option(label="lab/helper v2: Helper")
    erin.get_by_role("button", name="Start the replays").click()
    expect(erin.get_by_role("heading", name="helper v2 trial")).to_be_visible()
    expect(erin.get_by_text("All replays have ended.")).to_be_visible(timeout=60_000)
    expect(erin.locator("td[data-label=State]").first).to_have_text("done")
    erin.locator("td[data-label=Source] a").first.click()
    turns = erin.locator(".compare-turn")
    expect(turns).to_have_count(2)
    # The recorded calculator call was answered from the recording; the new version's
    # instructions show in the second turn's answer, marked as a difference.
    expect(turns.nth(0).locator(".compare-side").nth(1)).to_contain_text("42")
    expect(turns.nth(1).locator(".compare-side").nth(1).locator("ins")).to_contain_text("two")
    expect(turns.nth(1).locator(".compare-side").nth(0)).to_contain_text("system: one")
    erin.set_viewport_size(PHONE)
    no_sideways_scroll(erin)
    erin.screenshot(path=str(SHOTS / "experiment-compare-390.png"), full_page=True)
    erin.set_viewport_size(DESK)
    erin.screenshot(path=str(SHOTS / "experiment-compare-1280.png"), full_page=True)

    finn = browser.new_context(base_url=live.base_url, viewport=PHONE, is_mobile=True).new_page()
    log_in(finn, "finn")
    finn.goto("/review/experiments/")
    finn.get_by_role("link", name="helper v2 trial").click()
    finn.get_by_role("link", name="Judge pairs (blind)").click()
    expect(finn.get_by_role("heading", name="Which answers better?")).to_be_visible()
    expect(finn.get_by_text("as recorded")).to_have_count(0)  # blind
    no_sideways_scroll(finn)
    finn.screenshot(path=str(SHOTS / "experiment-judge-390.png"), full_page=True)
    finn.get_by_role("button", name="Tie").click()
    expect(finn.get_by_role("status")).to_contain_text("You have judged every pair")
    finn.get_by_role("link", name="See the verdicts").click()
    expect(finn.locator("td[data-label=Verdicts]")).to_have_text("0 better · 0 worse · 1 tie")
    no_sideways_scroll(finn)
    finn.screenshot(path=str(SHOTS / "experiment-390.png"), full_page=True)
    erin.goto(finn.url)
    erin.screenshot(path=str(SHOTS / "experiment-1280.png"), full_page=True)

    # Replays stay out of people's own lists.
    alice.goto("/")
    expect(alice.get_by_text("Replay of")).to_have_count(0)
