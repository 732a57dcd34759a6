"""Pairwise review in a real browser: a moderator sends an experiment to a new review
queue, a reviewer judges the pair blind on a phone (390 px, no sideways scroll) with the
team's score for each side (one out of range is refused, with what was typed kept), and
the moderator reads the verdict per candidate; against
a real Sectr (Daphne, its embedded worker, the demo model).

Team `duo`: alice (member, owns the session), gina (moderator), hank (reviewer)."""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.browser.conftest import PASSWORD, log_in, new_session, send
from tests.browser.test_experiments import no_sideways_scroll
from tests.liveserver import ROOT, LiveSectr

#: SECTR_SCREENSHOTS=1 refreshes docs/screenshots/; otherwise they go to a temporary folder.
SHOTS = ROOT / "docs" / "screenshots" if os.environ.get("SECTR_SCREENSHOTS") else Path(tempfile.gettempdir())

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]
PHONE = {"width": 390, "height": 844}
DESK = {"width": 1280, "height": 800}


@pytest.fixture(scope="module")
def duo(live: LiveSectr) -> str:
    code = (
        "from django.contrib.auth import get_user_model; U = get_user_model(); "
        f"U.objects.create_user('gina', password={PASSWORD!r}); U.objects.create_user('hank', password={PASSWORD!r}); "
        "from sessions_app import actions; from sessions_app.review import scores; actions.do_create_team('duo'); "
        "actions.do_set_membership('duo', 'alice', 'member'); actions.do_set_membership('duo', 'gina', 'moderator'); "
        "actions.do_set_membership('duo', 'hank', 'reviewer'); "
        "gina = U.objects.get(username='gina'); "
        "actions.do_create_agent(gina, 'duo', 'helper', {'name': 'Helper', 'instructions': 'one'}); "
        "scores.do_create_score(gina, 'duo', {'name': 'clarity', 'kind': 'numeric', 'minimum': 1, 'maximum': 5, "
        "'description': 'How clear the answer is'})"
    )
    live.manage("shell", "-c", code)
    return "duo"


def test_send_to_a_queue_judge_a_pair_blind_on_a_phone_and_read_the_verdict(
    alice: Page, browser: Browser, live: LiveSectr, duo: str
) -> None:
    new_session(alice, team=duo)  # the team's first agent: helper, version 1
    send(alice, "!system")
    expect(alice.locator("[data-role=assistant]").last).to_contain_text("system: one")
    live.manage(
        "shell",
        "-c",
        "from django.contrib.auth import get_user_model; from sessions_app import actions; "
        "from sessions_app.experiments import actions as experiments; "
        "gina = get_user_model().objects.get(username='gina'); "
        "actions.do_save_agent_version(gina, 'duo/helper', {'instructions': 'two'}); "
        "experiments.do_create_experiment(gina, 'duo', name='duo trial', "
        "candidates=[{'agent': 'duo/helper', 'version': 2}], last=1)",
    )

    gina = browser.new_context(base_url=live.base_url, viewport=DESK).new_page()
    log_in(gina, "gina")
    gina.goto("/review/experiments/")
    gina.get_by_role("link", name="duo trial").click()
    expect(gina.get_by_text("All replays have ended.")).to_be_visible(timeout=60_000)
    send_form = gina.get_by_role("form", name="Send to review queue")
    send_form.get_by_label("Queue name").fill("duo pairs")
    send_form.get_by_label("Reviewers").select_option("hank")
    send_form.get_by_role("button", name="Send to review queue").click()
    expect(gina.get_by_role("heading", name="duo pairs")).to_be_visible()
    expect(gina.get_by_text("Sent 1 pair to duo pairs.")).to_be_visible()
    expect(gina.locator("tr[data-assignee=hank]")).to_contain_text("Compare A/B")
    gina.screenshot(path=SHOTS / "experiment-queue-1280.png", full_page=True)

    hank = browser.new_context(base_url=live.base_url, viewport=PHONE, is_mobile=True).new_page()
    log_in(hank, "hank")
    hank.goto("/review/queues/")
    hank.get_by_role("link", name="duo pairs").click()
    hank.get_by_role("link", name="Compare A/B").click()
    expect(hank.get_by_role("heading", name="Compare A/B")).to_be_visible()
    assert re.fullmatch(r".*/review/pairs/\d+/", hank.url)
    # Blind: nothing on the page (text, title, markup) says which side is which.
    html = hank.content()
    for word in ("baseline", "candidate", "recorded", "Replay of", "duo/helper", "helper v2"):
        assert word not in html, word
    sides = hank.locator(".compare-side")
    expect(sides).to_have_count(2)
    texts = [sides.nth(0).inner_text(), sides.nth(1).inner_text()]
    assert sorted("system: two" in t for t in texts) == [False, True]
    new_side = "A" if "system: two" in texts[0] else "B"
    old_side = "B" if new_side == "A" else "A"
    expect(hank.get_by_role("navigation", name="Queue")).to_contain_text("item 1 of 1")
    new_clarity = hank.get_by_role("group", name=f"Scores for {new_side} (optional)").get_by_label("clarity")
    old_clarity = hank.get_by_role("group", name=f"Scores for {old_side} (optional)").get_by_label("clarity")
    new_clarity.fill("5")
    old_clarity.fill("3")
    hank.get_by_label("Note (optional)").fill("The new one is shorter")
    no_sideways_scroll(hank)
    hank.screenshot(path=SHOTS / "experiment-pair-390.png", full_page=True)
    # Out of range: refused, with everything typed still there.
    new_clarity.fill("9")
    hank.get_by_role("button", name=f"{new_side} is better").click()
    expect(hank.locator("[data-role=pair-error]")).to_have_text(
        f"Scores for {new_side}: clarity is a number from 1 to 5"
    )
    expect(new_clarity).to_have_value("9")
    expect(old_clarity).to_have_value("3")
    expect(hank.get_by_label("Note (optional)")).to_have_value("The new one is shorter")
    no_sideways_scroll(hank)
    hank.screenshot(path=SHOTS / "experiment-pair-refused-390.png", full_page=True)
    hank.set_viewport_size(DESK)
    hank.screenshot(path=Path(tempfile.gettempdir()) / "experiment-pair-refused-1280.png", full_page=True)
    hank.set_viewport_size(PHONE)
    new_clarity.fill("5")
    hank.get_by_role("button", name=f"{new_side} is better").click()
    # Back on the queue (hank's only item): done.
    expect(hank.get_by_text("Verdict saved.")).to_be_visible()
    expect(hank.locator("[data-role=progress]")).to_contain_text("1 of 1 done.")
    no_sideways_scroll(hank)

    gina.goto(gina.url.split("/review/")[0] + "/review/experiments/")
    gina.get_by_role("link", name="duo trial").click()
    expect(gina.locator("td[data-label=Verdicts]")).to_have_text("1 better · 0 worse · 0 tie")
    row = gina.locator("table[aria-label='Scores per side'] tr[data-score=clarity]")
    expect(row.locator("td[data-label=Recorded]")).to_contain_text("3.00")
    expect(row.locator("td[data-label=Candidate]")).to_contain_text("5.00")
    gina.screenshot(path=SHOTS / "experiment-scores-1280.png", full_page=True)
    gina.set_viewport_size(PHONE)
    no_sideways_scroll(gina)
    gina.screenshot(path=SHOTS / "experiment-scores-390.png", full_page=True)
