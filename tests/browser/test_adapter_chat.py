"""Adapted agents in the chat, in Chromium: a team agent whose `handler` is a PydanticAI
agent (and one whose handler is an OpenAI Agents SDK agent), registered by the plugin
modules in examples/, streams its reply into the chat page; its `publish_release` tool
needs approval, so the run pauses with a card; a moderator approves it in the queue;
the run resumes and the reply shows in the owner's chat; and the session is in review.

The model is tests/openai_stub_server.py (the installation's OpenAI-compatible
endpoint for this server), scripted: "publish" asks for the tool, a tool result is
answered "Done: <result>", anything else gets a reply streamed in slow pieces.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.browser.conftest import PASSWORD, log_in, send
from tests.liveserver import LiveSectr
from tests.openai_stub_server import STUB_MODEL, OpenAIStubServer, SSEStream, text_stream, tool_call_stream

pytest.importorskip("pydantic_ai")
pytest.importorskip("agents")

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]
PIECES = ("Hello ", "from ", "the ", "release ", "agent")
HANDLERS = {"pydantic": "pydantic-ai-release", "openai": "openai-agents-release"}
SETUP = """
from django.contrib.auth import get_user_model
from sessions_app import actions
users = get_user_model().objects
actions.do_create_team("forge")
actions.do_set_membership("forge", "owen", "member")
actions.do_set_membership("forge", "maya", "moderator")
for key, handler in HANDLERS.items():
    actions.do_create_agent(
        users.get(username="maya"), "forge", f"{key}-release", {"name": f"Release ({key})", "handler": handler}
    )
"""


def scripted(body: dict[str, Any]) -> SSEStream:
    last = body["messages"][-1]
    if last["role"] == "tool":
        return text_stream("Done: ", str(last["content"]))
    if "publish" in str(last.get("content")):
        return tool_call_stream([("call_publish", "publish_release", '{"version": "1.4.0"}')])
    return text_stream(*PIECES, chunk_delay=0.4)


@pytest.fixture(scope="module")
def adapted() -> Iterator[LiveSectr]:
    """A Sectr of its own: the examples' plugins, the stub model as its endpoint."""
    with OpenAIStubServer(fallback=scripted) as stub:
        env = {
            "SECTR_PLUGINS": "examples.pydantic_ai_agent,examples.openai_agents_agent",
            "OPENAI_BASE_URL": stub.base_url,
            "OPENAI_API_KEY": "test-key",
            "SECTR_MODEL": STUB_MODEL,
            "SECTR_LOGIN_LIMIT_PER_ACCOUNT": "1000/300",
            "SECTR_LOGIN_LIMIT_PER_ADDRESS": "1000/300",
        }
        with LiveSectr(embedded_worker=True, env=env) as server:
            for name in ("owen", "maya"):
                server.create_user(name, password=PASSWORD)
            server.manage("shell", "-c", SETUP.replace("HANDLERS", repr(HANDLERS)))
            yield server


def page_for(browser: Browser, live: LiveSectr, username: str) -> Page:
    page = browser.new_context(base_url=live.base_url, viewport={"width": 1280, "height": 900}).new_page()
    log_in(page, username)
    return page


@pytest.mark.parametrize("framework", sorted(HANDLERS))
def test_an_adapted_agent_streams_pauses_for_the_queue_resumes_and_is_in_review(
    browser: Browser, adapted: LiveSectr, framework: str
) -> None:
    owen = page_for(browser, adapted, "owen")
    owen.get_by_label("Team").select_option("forge")
    owen.get_by_label("Agent").select_option(f"forge/{framework}-release")
    owen.get_by_role("button", name="New session").click()
    owen.wait_for_url(re.compile(r"/sessions/ses_[0-9a-f]+/$"))
    session_id = owen.url.rstrip("/").rsplit("/", 1)[-1]
    expect(owen.locator("#live")).to_have_text("live")
    expect(owen.locator(".agent-name")).to_have_text(f"Release ({framework}) v1")

    # A streamed reply: the page shows it growing, piece by piece, before the end.
    send(owen, "hello")
    reply = owen.locator('[data-role="assistant"]').last
    owen.wait_for_function(
        """() => {
            const replies = document.querySelectorAll('[data-role="assistant"]');
            const text = replies.length ? replies[replies.length - 1].textContent : '';
            return text.includes('Hello from') && !text.includes('agent');
        }""",
        timeout=15_000,
    )
    expect(reply).to_contain_text("Hello from the release agent")

    # The tool that needs approval: the run pauses on a card.
    send(owen, "publish 1.4.0 please")
    chat_card = owen.locator("[data-role=approval]").filter(has_text="publish_release")
    expect(chat_card).to_be_visible()
    expect(chat_card).to_contain_text("1.4.0")

    # The moderator approves it in the queue.
    maya = page_for(browser, adapted, "maya")
    maya.goto("/approvals/")
    card = maya.locator("[data-role=approval]").filter(has_text="publish_release")
    expect(card).to_be_visible()
    expect(card).to_contain_text("requested by owen")
    card.get_by_role("button", name="Approve once").click()
    expect(card).to_contain_text("Approved once by maya")

    # The run resumes as a new invocation; the reply shows in the owner's chat.
    expect(chat_card).to_contain_text("Approved once by maya")
    expect(owen.locator('[data-role="assistant"]').last).to_contain_text("Done: published 1.4.0")

    # And the session is in review like any other: found by its tool, the reply on its page.
    maya.goto("/review/?q=publish_release")
    link = maya.locator(f'a[href*="{session_id}"]').first
    expect(link).to_be_visible()
    link.click()
    expect(maya.locator("main")).to_contain_text("Done: published 1.4.0")
    expect(maya.locator("main")).to_contain_text("publish_release")
    maya.context.close()
    owen.context.close()
