"""A shared review queue worked by two reviewers with the team's own scores, in Chromium
at 1280x800 and at 390x844: the moderator defines the scores on the team page, makes a
queue and adds sessions one at a time (each goes to the next reviewer in turn, and the
message says to whom), sees every item with its assignee and state and reassigns one;
each reviewer rates with the team's scores (a refused value shows in the form, a saved
rating swaps in place without moving the page) and is told when their part is done;
the dashboard and the search know the scores; the timeline shows a tool result after
its ask. No page scrolls sideways, and axe-core finds nothing serious.

Set SECTR_SCREENSHOTS=1 to refresh docs/screenshots/review-queue*.png and
review-rating*.png.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.browser.conftest import PASSWORD, log_in
from tests.browser.test_team_pages import overflow, serious_violations, widest
from tests.liveserver import LiveSectr

ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "docs" / "screenshots" if os.environ.get("SECTR_SCREENSHOTS") else Path(tempfile.gettempdir())

#: Per width its own team and people: the live server is shared by every browser test.
CASTS = {
    1280: {"team": "harbor", "mod": "hana", "first": "ivan", "second": "jude", "owner": "owen"},
    390: {"team": "delta", "mod": "kira", "first": "leon", "second": "maya", "owner": "nils"},
}

SETUP = """
from django.contrib.auth import get_user_model
from sectr.events import EventType
from sectr.journal import NewEvent
from sessions_app.journal import DatabaseJournal
from sessions_app.models import Membership, Session, Team

team = Team.objects.create(name=TEAM)
users = get_user_model().objects
for name, role in ROLES:
    Membership.objects.create(team=team, user=users.get(username=name), role=role)
owner = users.get(username=OWNER)


def journal(title, events):
    session = Session.objects.create(owner=owner, team=team, title=title)
    DatabaseJournal(publish=False).append_sync(
        session.pk, [NewEvent(EventType.SESSION_CREATED, {"title": title, "model": "demo", "mode": "default"})]
    )
    DatabaseJournal(publish=False).append_sync(session.pk, events)


def turn(inv, prompt, mid, answer):
    start = {"reason": {"kind": "user_message", "input": {"content": prompt}, "author": OWNER}}
    return [
        NewEvent(EventType.INVOCATION_STARTED, start, inv),
        NewEvent(EventType.MESSAGE_START, {"message_id": mid, "role": "assistant", "model": "demo"}, inv),
        NewEvent(EventType.MESSAGE_DELTA, {"message_id": mid, "text": answer}, inv),
        NewEvent(EventType.MESSAGE_END, {"message_id": mid, "usage": {"input_tokens": 3, "output_tokens": 4}}, inv),
        NewEvent(EventType.INVOCATION_COMPLETED, {"stop_reason": "end_turn", "usage": {}}, inv),
    ]


for topic in ("Refund policy", "Shipping delay"):
    answer = f"Here is what I know about {topic.lower()}."
    journal(topic, turn("inv_1", f"question about {topic.lower()}", "m1", answer))

call = {"message_id": "m1", "tool_call_id": "c1", "name": "write_note", "arguments": '{"title": "follow up"}'}
ask = {"ask_id": "ask_" + TEAM, "tool_call_id": "c1", "name": "write_note", "arguments": {"title": "follow up"}}
decision = {"kind": "approval_decision", "ask_id": ask["ask_id"],
            "decision": {"approved": True, "approver": MOD, "verdict": "allow_once"}}
result = {"tool_call_id": "c1", "name": "write_note", "content": "saved note 7", "is_error": False}
journal("Note for later", [
    NewEvent(EventType.INVOCATION_STARTED,
             {"reason": {"kind": "user_message", "input": {"content": "note it"}, "author": OWNER}}, "inv_1"),
    NewEvent(EventType.MESSAGE_START, {"message_id": "m1", "role": "assistant", "model": "demo"}, "inv_1"),
    NewEvent(EventType.TOOL_CALL, call, "inv_1"),
    NewEvent(EventType.MESSAGE_END, {"message_id": "m1", "usage": {"input_tokens": 3, "output_tokens": 4}}, "inv_1"),
    NewEvent(EventType.APPROVAL_REQUESTED, ask, "inv_1"),
    NewEvent(EventType.INVOCATION_SUSPENDED, {"ask_id": ask["ask_id"]}, "inv_1"),
    NewEvent(EventType.INVOCATION_STARTED, {"reason": decision}, "inv_2"),
    NewEvent(EventType.TOOL_RESULT, result, "inv_2"),
    NewEvent(EventType.MESSAGE_START, {"message_id": "m2", "role": "assistant", "model": "demo"}, "inv_2"),
    NewEvent(EventType.MESSAGE_DELTA, {"message_id": "m2", "text": "Noted."}, "inv_2"),
    NewEvent(EventType.MESSAGE_END, {"message_id": "m2", "usage": {"input_tokens": 3, "output_tokens": 1}}, "inv_2"),
    NewEvent(EventType.INVOCATION_COMPLETED, {"stop_reason": "end_turn", "usage": {}}, "inv_2"),
])
"""


def person(browser: Browser, live: LiveSectr, width: int, username: str) -> Page:
    height = 800 if width == 1280 else 844
    phone = width < 600
    context = browser.new_context(
        base_url=live.base_url, viewport={"width": width, "height": height}, is_mobile=phone, has_touch=phone
    )
    page = context.new_page()
    log_in(page, username)
    return page


def fits(page: Page, what: str) -> None:
    assert overflow(page) <= 0, (what, widest(page))


def flash(page: Page) -> str:
    return page.locator(".messages .flash").first.inner_text()


@pytest.mark.timeout(400)
@pytest.mark.parametrize("width", [1280, 390])
def test_two_reviewers_work_a_shared_queue_with_the_teams_scores(browser: Browser, live: LiveSectr, width: int) -> None:
    cast = CASTS[width]
    for key in ("mod", "first", "second", "owner"):
        live.create_user(cast[key], password=PASSWORD)
    roles = [(cast["mod"], "moderator"), (cast["first"], "reviewer"), (cast["second"], "reviewer")]
    roles.append((cast["owner"], "member"))
    code = (
        SETUP.replace("TEAM", repr(cast["team"]))
        .replace("ROLES", repr(roles))
        .replace("OWNER", repr(cast["owner"]))
        .replace("MOD", repr(cast["mod"]))
    )
    live.manage("shell", "-c", code)
    team = cast["team"]
    # The round robin goes by account order: the first reviewer created is first.
    first, second = cast["first"], cast["second"]

    # The moderator defines two scores on the team page.
    mod = person(browser, live, width, cast["mod"])
    mod.goto(f"/teams/{team}/#scores")
    form = mod.get_by_role("form", name="New score")
    form.get_by_label("Name").fill("helpfulness")
    form.get_by_label("Kind").select_option("categorical")
    form.get_by_label("Labels").fill("good, partly, bad")
    form.get_by_label("Description").fill("Did it help the customer?")
    form.get_by_role("button", name="Add score").click()
    expect(mod.locator(".messages")).to_contain_text("Score helpfulness added.")
    form = mod.get_by_role("form", name="New score")
    form.get_by_label("Name").fill("accuracy")
    form.get_by_label("Kind").select_option("numeric")
    form.get_by_label("Minimum").fill("0")
    form.get_by_label("Maximum").fill("10")
    form.get_by_role("button", name="Add score").click()
    expect(mod.locator("#score-accuracy")).to_contain_text("0 to 10")
    expect(mod.locator("#score-helpfulness")).to_contain_text("good, partly, bad")
    fits(mod, "team page")

    # A queue for two reviewers; three sessions added one at a time go to each in turn.
    mod.goto("/review/queues/")
    mod.get_by_label("Team").select_option(team)
    mod.get_by_label("Name").fill("Escalations")
    mod.get_by_label("Reviewers").fill(f"{second}, {first}")
    mod.get_by_role("button", name="Create queue").click()
    queue_url = mod.url
    assert re.search(r"/review/queues/\d+/$", queue_url)
    mod.goto("/review/")
    titles = ["Refund policy", "Shipping delay", "Note for later"]
    expected = [first, second, first]
    for title, reviewer in zip(titles, expected, strict=True):
        mod.goto(f"/review/?q={title.split()[0]}")
        mod.locator("table[aria-label=Sessions] a", has_text=title).click()
        mod.get_by_label("Queue", exact=True).select_option(label="Escalations")
        mod.get_by_role("button", name="Add to queue").click()
        assert flash(mod) == f"Added 1 session to Escalations, assigned to {reviewer} (1)."

    # The moderator sees every item, its assignee and its state, and reassigns the third.
    mod.goto(queue_url)
    rows = mod.locator("table.queue-items tbody tr[data-item]")
    expect(rows).to_have_count(3)
    assert [rows.nth(i).get_attribute("data-assignee") for i in range(3)] == expected
    expect(mod.locator('[data-role="progress"]')).to_contain_text(
        f"0 of 3 done. 2 left for {first}; 1 left for {second}."
    )
    mod.get_by_label("Assignee of item 3").select_option(second)
    mod.locator("table.queue-items tbody tr").nth(2).get_by_role("button", name="Reassign").click()
    expect(mod.locator(".messages")).to_contain_text(f"Item 3 assigned to {second}.")
    expect(rows.nth(2)).to_have_attribute("data-assignee", second)
    fits(mod, "queue page (moderator)")
    assert serious_violations(mod) == [], "queue page"
    mod.emulate_media(color_scheme="dark")
    assert serious_violations(mod) == [], "queue page, dark"
    mod.emulate_media(color_scheme="light")
    mod.screenshot(
        path=str(SHOTS / ("review-queue.png" if width == 1280 else "review-queue-phone.png")), full_page=True
    )

    # The first reviewer: one item; a refused value stays in the form, then the rating saves in place.
    one = person(browser, live, width, first)
    one.goto(queue_url)
    expect(one.locator("table.queue-items tbody tr[data-item]")).to_have_count(1)
    expect(one.locator('[data-role="progress"]')).to_contain_text(f"1 of your 1 item left; 2 left for {second}.")
    one.get_by_role("link", name="Start reviewing").click()
    expect(one.locator(".queue-nav")).to_contain_text("item 1 of 1")
    message = one.locator("li[data-role=assistant]").first
    message.locator("details summary").click()
    rating = message.locator("form.rating-form")
    rating.get_by_label("helpfulness").select_option("good")
    rating.get_by_label("accuracy").fill("11")
    rating.get_by_label("Comment").fill("clear answer")
    one.evaluate("window.scrollTo(0, document.body.scrollHeight)")
    scrolled = one.evaluate("window.scrollY")
    url = one.url
    rating.get_by_role("button", name="Save rating").click()
    block = one.locator("li[data-role=assistant] .rating-block").first
    expect(block.locator('[data-role="rating-error"]')).to_have_text("accuracy is a number from 0 to 10")
    assert one.url == url
    block.get_by_label("accuracy").fill("8")
    expect(block.get_by_label("Comment")).to_have_value("clear answer")  # kept after the refusal
    block.get_by_role("button", name="Save rating").click()
    expect(block.locator('[data-role="rating-saved"]')).to_have_text("Rating saved.")
    expect(block.locator('[data-role="rating"]')).to_contain_text(
        f"{first}: accuracy 8 helpfulness good — clear answer"
    )
    assert one.url == url
    assert scrolled > 0 and one.evaluate("window.scrollY") > 0  # not back at the top of the page
    fits(one, "review page")
    assert serious_violations(one) == [], "review page"
    one.emulate_media(color_scheme="dark")
    assert serious_violations(one) == [], "review page, dark"
    one.emulate_media(color_scheme="light")
    block.locator("details summary").click()  # the form again, with the reviewer's values, for the picture
    expect(block.get_by_label("accuracy")).to_have_value("8")
    block.scroll_into_view_if_needed()
    one.screenshot(
        path=str(SHOTS / ("review-rating.png" if width == 1280 else "review-rating-phone.png")), full_page=True
    )
    one.get_by_role("button", name="Done").click()
    assert flash(one) == f"Done: Your 1 item is done; 2 left for {second}."

    # The second reviewer: two items, one of them the session with the gated tool.
    two = person(browser, live, width, second)
    two.goto(queue_url)
    expect(two.locator("table.queue-items tbody tr[data-item]")).to_have_count(2)
    two.get_by_role("link", name="Start reviewing").click()
    for _ in range(2):
        if "Note for later" in two.locator("h1").inner_text():
            entries = two.locator("ol.timeline > li")
            kinds = [str(entries.nth(i).get_attribute("class")) for i in range(entries.count())]
            asked = next((i for i, k in enumerate(kinds) if "tl-ask" in k), None)
            result = next((i for i, k in enumerate(kinds) if "tl-result" in k), None)
            assert asked is not None and result is not None, kinds
            assert asked < result, kinds
            seqs = [int(entries.nth(i).get_attribute("data-seq") or 0) for i in range(entries.count())]
            assert seqs == sorted(seqs)
        two.get_by_text("Rate this session").click()
        session_form = two.get_by_role("form", name="Rating of the session")
        session_form.get_by_label("helpfulness").select_option("partly")
        session_form.get_by_label("Up", exact=True).check()
        session_form.get_by_role("button", name="Save rating").click()
        expect(two.locator('[data-role="rating-saved"]')).to_be_visible()
        two.get_by_role("button", name="Done").click()
    assert flash(two) == "Done: Your 2 items are done."

    # The moderator: all done; the dashboard and the search know the scores.
    mod.goto(queue_url)
    expect(mod.locator('[data-role="progress"]')).to_contain_text("3 of 3 done.")
    expect(mod.locator("table.queue-items")).not_to_contain_text("open")
    mod.goto(f"/review/usage/?team={team}")
    summary = mod.locator('[data-role="score-summary"]')
    expect(summary.locator('tr[data-score="helpfulness"]')).to_contain_text("good: 1 · partly: 2")
    expect(summary.locator('tr[data-score="accuracy"]')).to_contain_text("average 8.00")
    fits(mod, "usage page")
    mod.goto("/review/")
    mod.get_by_label("Score", exact=True).select_option("helpfulness")
    mod.get_by_label("Score value").fill("partly")
    mod.get_by_role("button", name="Filter").click()
    found = mod.locator("table[aria-label=Sessions] tbody tr[data-session]")
    expect(found).to_have_count(2)
    expect(mod.locator("table[aria-label=Sessions]")).not_to_contain_text("Refund policy")
    for page in (mod, one, two):
        page.context.close()
