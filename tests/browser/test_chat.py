"""The web chat in a real browser (headless Chromium) against a real Sectr with the demo model.

Set SECTR_SCREENSHOTS=1 to refresh docs/screenshots/ (otherwise they go to a temp dir).
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.browser.conftest import log_in, new_session, send
from tests.liveserver import ROOT, LiveSectr

pytestmark = pytest.mark.browser

SHOTS = ROOT / "docs" / "screenshots" if os.environ.get("SECTR_SCREENSHOTS") else Path(tempfile.gettempdir())


def assistant(page: Page) -> object:
    return page.locator("[data-role=assistant]").last


def state(page: Page) -> object:
    return page.locator("[data-role=state]")


def ticks(text: str) -> list[int]:
    return [int(n) for n in re.findall(r"tick (\d+)", text)]


def test_a_reply_streams_in_and_the_meter_counts_it(alice: Page) -> None:
    new_session(alice)
    box = alice.get_by_label("Message", exact=True)
    # Shift+Enter is a new line; Enter sends.
    box.type("!slow")
    box.press("Shift+Enter")
    expect(box).to_have_value("!slow\n")
    box.fill("!slow 8")
    box.press("Enter")
    expect(box).to_have_value("")
    reply = alice.locator("[data-role=assistant]").last
    expect(reply).to_contain_text("tick 2")
    expect(state(alice)).to_have_text("running")
    assert 8 not in ticks(reply.inner_text())  # still streaming: not all of it yet
    expect(alice.get_by_role("button", name="Stop")).to_be_visible()
    expect(alice.get_by_role("button", name="Steer")).to_be_visible()
    expect(reply).to_contain_text("tick 8")
    expect(state(alice)).to_have_text("completed")
    assert ticks(reply.inner_text()) == list(range(1, 9))
    expect(alice.locator("[data-role=usage]")).not_to_have_attribute("data-total", "0")
    expect(alice.get_by_role("button", name="Stop")).to_have_count(0)
    expect(alice.locator("[data-role=user]")).to_have_text(re.compile("!slow 8"))


def test_stop_ends_a_slow_run(alice: Page) -> None:
    new_session(alice)
    send(alice, "!slow 60")
    reply = alice.locator("[data-role=assistant]").last
    expect(reply).to_contain_text("tick 2")
    alice.get_by_role("button", name="Stop").click()
    expect(state(alice)).to_have_text("cancelled")
    expect(alice.locator("[data-role=notice]").last).to_contain_text("Stopped")
    count = len(ticks(reply.inner_text()))
    alice.wait_for_timeout(400)
    assert len(ticks(reply.inner_text())) == count < 60  # nothing streams after the stop
    # The next message reopens the session.
    send(alice, "hello again")
    expect(assistant(alice)).to_have_text(re.compile("You said: hello again"))
    expect(state(alice)).to_have_text("completed")


def test_steer_a_running_run(alice: Page) -> None:
    new_session(alice)
    send(alice, "!slow 12")
    expect(assistant(alice)).to_contain_text("tick 2")
    alice.get_by_label("Message", exact=True).fill("answer in one word")
    alice.get_by_role("button", name="Steer").click()
    expect(alice.locator("#flash")).to_contain_text("Steer sent")
    expect(alice.locator("[data-role=steer]")).to_contain_text("answer in one word")
    expect(assistant(alice)).to_contain_text("Steer received: answer in one word")
    expect(state(alice)).to_have_text("completed")


def test_approve_then_deny_write_note(alice: Page, browser: Browser, live: LiveSectr) -> None:
    session_id = new_session(alice)
    # A second tab on the same session sees every step live.
    other_context = browser.new_context(base_url=live.base_url, viewport={"width": 1200, "height": 900})
    other = other_context.new_page()
    log_in(other, "alice")
    other.goto(f"/sessions/{session_id}/")
    expect(other.locator("#live")).to_have_text("live")

    send(alice, "note: buy milk")
    card = alice.locator("[data-role=approval]").last
    expect(card).to_contain_text("write_note")
    expect(card).to_contain_text('"body": "buy milk"')
    expect(state(alice)).to_have_text("awaiting")
    expect(other.locator("[data-role=approval]")).to_have_count(1)
    alice.screenshot(path=str(SHOTS / "approval.png"), full_page=True)

    card.get_by_role("button", name="Approve once").click()
    expect(card).to_contain_text("Approved once by alice")
    expect(card.get_by_role("button", name="Approve once")).to_have_count(0)  # decided cards stay decided
    expect(assistant(alice)).to_contain_text("write_note returned: saved note 'buy milk'")
    expect(alice.locator("#notes")).to_contain_text("buy milk")
    expect(other.locator("[data-role=approval]").last).to_contain_text("Approved once by alice")
    expect(other.locator("#notes")).to_contain_text("buy milk")

    send(alice, "note: sell the car")
    card = alice.locator("[data-role=approval]").last
    expect(card).to_contain_text("sell the car")
    card.get_by_role("button", name="Deny").click()
    expect(card).to_contain_text("Denied by alice")
    expect(assistant(alice)).to_contain_text("write_note was denied")
    expect(state(alice)).to_have_text("completed")
    expect(alice.locator("#notes")).not_to_contain_text("sell the car")
    expect(alice.locator("[data-role=tool-call]").last).to_contain_text("denied")
    expect(other.locator("[data-role=approval]").last).to_contain_text("Denied by alice")
    alice.screenshot(path=str(SHOTS / "chat.png"), full_page=True)
    other_context.close()


def test_reload_mid_stream_shows_the_full_text(alice: Page) -> None:
    new_session(alice)
    send(alice, "!slow 20")
    expect(assistant(alice)).to_contain_text("tick 4")
    alice.reload()
    # The server renders everything journaled so far; the socket resumes after it.
    seen = ticks(assistant(alice).inner_text())
    assert seen[:4] == [1, 2, 3, 4] and seen == list(range(1, len(seen) + 1))
    expect(assistant(alice)).to_contain_text("tick 20")
    expect(state(alice)).to_have_text("completed")
    assert ticks(assistant(alice).inner_text()) == list(range(1, 21))  # nothing missing, nothing twice


def test_missed_deltas_arrive_after_the_server_restarts(alice: Page, live: LiveSectr) -> None:
    new_session(alice)
    send(alice, "!slow 16")
    expect(assistant(alice)).to_contain_text("tick 3")
    live.restart()  # the socket drops, the run's worker dies with the server
    # The page reconnects by itself and resumes from its cursor; a worker recovers
    # the run (crash stitching) and the deltas it journals while the page is away arrive.
    expect(alice.locator("#live")).to_have_text("live", timeout=20_000)
    reply = alice.locator("[data-role=assistant]").last
    expect(reply).to_contain_text("tick 16", timeout=30_000)
    expect(state(alice)).to_have_text("completed", timeout=10_000)
    text = " ".join(node.inner_text() for node in alice.locator("[data-role=assistant]").all())
    assert ticks(text) == list(range(1, 17))  # every tick exactly once, across the crash
    expect(alice.locator("[data-role=notice]").filter(has_text="Recovered")).to_have_count(1)


def test_an_outsider_gets_404_for_the_page_and_the_socket(alice: Page, browser: Browser, live: LiveSectr) -> None:
    session_id = new_session(alice)
    send(alice, "private")
    context = browser.new_context(base_url=live.base_url)
    mallory = context.new_page()
    log_in(mallory, "mallory")
    response = mallory.goto(f"/sessions/{session_id}/")
    assert response is not None and response.status == 404
    assert "private" not in mallory.content()
    outcome = mallory.evaluate(
        """(path) => new Promise((resolve) => {
            const socket = new WebSocket(`ws://${location.host}${path}`);
            socket.onopen = () => resolve("open");
            socket.onmessage = (event) => resolve("message: " + event.data);
            socket.onclose = (event) => resolve("closed " + event.code);
        })""",
        f"/ws/sessions/{session_id}/?after=0",
    )
    assert outcome.startswith("closed"), outcome
    assert mallory.request.post(f"/sessions/{session_id}/messages", form={"content": "x"}).status in (403, 404)
    context.close()


def test_markup_from_users_and_models_renders_inert(alice: Page) -> None:
    dialogs: list[str] = []
    alice.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    new_session(alice)
    send(alice, '<img src=x onerror="window.__pwned = 1; alert(1)"> hi')
    expect(assistant(alice)).to_contain_text("You said:")
    user = alice.locator("[data-role=user]").last
    expect(user).to_contain_text('<img src=x onerror="window.__pwned = 1; alert(1)"> hi')
    assert user.locator("img").count() == 0
    send(alice, "[click me](javascript:window.__pwned=2) and <script>window.__pwned=3</script>")
    reply = alice.locator("[data-role=assistant]").last
    expect(reply).to_contain_text("[click me](javascript:window.__pwned=2)")
    expect(state(alice)).to_have_text("completed")
    assert alice.locator("a[href^='javascript' i], [onerror], [onclick], #transcript script").count() == 0
    assert alice.evaluate("window.__pwned") is None
    assert dialogs == []


def test_the_approval_queue_fills_live_and_its_decision_reaches_the_chat(alice: Page) -> None:
    new_session(alice)
    queue = alice.context.new_page()
    queue.goto("/approvals/")
    expect(queue.get_by_text("Nothing is waiting for a decision.")).to_be_visible()
    send(alice, "note: call mom")
    card = queue.locator("[data-role=approval]").filter(has_text="call mom")
    expect(card).to_be_visible()  # pushed to the queue page, no reload
    expect(queue.get_by_text("Nothing is waiting for a decision.")).to_be_hidden()
    card.get_by_role("button", name="Always allow").click()
    expect(card).to_contain_text("Always allowed by alice")
    chat_card = alice.locator("[data-role=approval]").last
    expect(chat_card).to_contain_text("Always allowed by alice")
    expect(chat_card.get_by_role("button", name="Deny")).to_have_count(0)
    expect(assistant(alice)).to_contain_text("write_note returned")
    # The grant holds for the rest of the session: the next note needs no decision.
    send(alice, "note: water plants")
    expect(assistant(alice)).to_contain_text("saved note 'water plants'")
    expect(alice.locator("[data-role=approval]")).to_have_count(1)
    queue.close()


def test_an_image_attachment_goes_with_the_message(alice: Page) -> None:
    from tests.server.chat.test_web import PNG

    new_session(alice)
    alice.locator("#composer input[type=file]").set_input_files(
        {"name": "dot.png", "mimeType": "image/png", "buffer": PNG}
    )
    send(alice, "what is in this picture?")
    user = alice.locator("[data-role=user]").last
    expect(user.locator("img")).to_have_count(1)
    # Served back to the page by the session's media view (decode() waits for the load).
    assert user.locator("img").evaluate("img => img.decode().then(() => img.naturalWidth)") == 1
    expect(assistant(alice)).to_contain_text("You said: what is in this picture?")
    expect(alice.locator("[data-role=assistant] .reasoning").last).to_contain_text("I received 1 image")
