"""MCP servers in Chromium (docs/mcp.md): a team's moderator registers an HTTP server
(npm's server-everything) and enables the installation's stdio `mcp-server-git` (on a
scratch repository) on the team page, gives an agent their tools; a member asks the
agent to commit, the moderator approves in the queue, the commit is there, and the audit
names the server, tool, arguments and approver. The Tools section fits 1280 and 390 px,
light and dark.

Its own server (not the shared one): it needs an operator's SECTR_MCP_SERVERS file and
the loopback allowed for the HTTP server."""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.browser.conftest import PASSWORD, log_in, send
from tests.liveserver import LiveSectr
from tests.server.mcp.conftest import GIT_ENV, bin_path, commits, make_repo, start_everything

pytestmark = [pytest.mark.browser, pytest.mark.timeout(400)]
ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "docs" / "screenshots" if os.environ.get("SECTR_SCREENSHOTS") else Path(tempfile.gettempdir())
PHONE = {"width": 390, "height": 844}
SETUP = """
from django.contrib.auth import get_user_model
from sessions_app.models import Membership, Team
U = get_user_model()
team = Team.objects.create(name="tools")
for name, role in (("moe", "moderator"), ("mel", "member")):
    user = U.objects.create_user(name, password=PASSWORD)
    Membership.objects.create(team=team, user=user, role=role)
"""


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_repo(tmp_path_factory.mktemp("mcp") / "repo")


@pytest.fixture(scope="module")
def everything() -> Iterator[str]:
    proc, url = start_everything()
    try:
        yield url
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def live(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveSectr]:
    servers = tmp_path_factory.mktemp("mcp-file") / "mcp-servers.json"
    git = {"command": bin_path("mcp-server-git"), "args": ["--repository", str(repo)], "env": GIT_ENV}
    servers.write_text(json.dumps({"git": git}))
    env = {
        "SECTR_MCP_SERVERS": str(servers),
        "SECTR_MCP_ALLOWED_HOSTS": "127.0.0.1",
        "SECTR_LOGIN_LIMIT_PER_ACCOUNT": "1000/300",
        "SECTR_LOGIN_LIMIT_PER_ADDRESS": "1000/300",
    }
    saved = {name: os.environ.pop(name, None) for name in ("DATABASE_URL", "REDIS_URL")}
    try:
        with LiveSectr(env=env) as server:
            server.manage("shell", "-c", SETUP.replace("PASSWORD", repr(PASSWORD)))
            yield server
    finally:
        for name, value in saved.items():
            if value is not None:
                os.environ[name] = value


def page_for(browser: Browser, live: LiveSectr, user: str, **options: object) -> Page:
    viewport = options.pop("viewport", {"width": 1280, "height": 900})
    page = browser.new_context(base_url=live.base_url, viewport=viewport, **options).new_page()  # type: ignore[arg-type]
    log_in(page, user)
    return page


def overflow(page: Page) -> int:
    return int(page.evaluate("document.documentElement.scrollWidth - window.innerWidth"))


def test_a_moderator_connects_servers_and_a_members_commit_runs_after_approval(
    browser: Browser, live: LiveSectr, repo: Path, everything: str
) -> None:
    moe = page_for(browser, live, "moe")
    moe.goto("/teams/tools/")
    tools = moe.locator("#tools")

    # An HTTP server, with a secret header.
    form = tools.get_by_role("form", name="Add an MCP server")
    form.get_by_role("textbox", name=re.compile(r"^Name ")).fill("every")
    form.get_by_role("textbox", name=re.compile(r"^URL ")).fill(everything)
    form.get_by_role("textbox", name=re.compile(r"^Headers ")).fill("Authorization: Bearer browser-secret-123")
    form.get_by_role("textbox", name=re.compile(r"^Tools to offer ")).fill("echo get-*")
    form.get_by_role("button", name="Add server").click()
    expect(moe.locator(".messages")).to_contain_text(re.compile(r"MCP server every added: \d+ tools found"))
    every = moe.locator("#mcp-every")
    expect(every.locator(".health")).to_have_text("healthy")
    expect(every).to_contain_text("headers Authorization set")
    expect(every.locator("table")).to_contain_text("every__echo")
    assert "browser-secret-123" not in moe.content()

    # The installation's git server, enabled for the team.
    moe.get_by_role("button", name="Enable git for tools").click()
    enabled = re.compile(r"MCP server git enabled for the team: \d+ tools found")
    expect(moe.locator(".messages")).to_contain_text(enabled)
    git = moe.locator("#mcp-git")
    commit_row = git.locator("tr").filter(has=moe.locator("code", has_text=re.compile(r"^git__git_commit$")))
    expect(commit_row).to_contain_text("asks")
    status_row = git.locator("tr").filter(has=moe.locator("code", has_text=re.compile(r"^git__git_status$")))
    expect(status_row).to_contain_text("runs without asking")

    # Screenshots of the Tools section: desktop light, phone light and dark.
    moe.locator("#tools").screenshot(path=str(SHOTS / "teams-mcp.png"))
    for scheme in ("light", "dark"):
        phone = browser.new_context(
            base_url=live.base_url, viewport=PHONE, is_mobile=True, has_touch=True, color_scheme=scheme
        )
        phone.add_cookies(moe.context.cookies())
        page = phone.new_page()
        page.goto("/teams/tools/#tools")
        assert overflow(page) <= 0
        page.locator("#tools").screenshot(path=str(SHOTS / f"teams-mcp-phone-{scheme}.png"))
        # One screen each of a server and of the form, for a look at phone width.
        for part in ("#mcp-every", "form[aria-label='Add an MCP server']"):
            page.locator(part).scroll_into_view_if_needed()
            name = "server" if part.startswith("#") else "form"
            page.screenshot(path=str(Path(tempfile.gettempdir()) / f"mcp-phone-{scheme}-{name}.png"))
        phone.close()

    # An agent with both servers' tools.
    moe.get_by_role("link", name="New agent").click()
    moe.get_by_label("Slug").fill("gitbot")
    moe.get_by_label("Name", exact=True).fill("Git bot")
    moe.get_by_label("More tools by name or glob").fill("git__* every__echo every__get-tiny-image")
    moe.get_by_role("button", name="Create agent").click()
    expect(moe.get_by_role("heading", level=1)).to_contain_text("Git bot v1")

    # mel, a member, asks the agent to commit.
    mel = page_for(browser, live, "mel")
    mel.get_by_label("Team").select_option("tools")
    expect(mel.get_by_label("Agent")).to_have_value("tools/gitbot")
    mel.get_by_role("button", name="New session").click()
    mel.wait_for_url(re.compile(r"/sessions/ses_[0-9a-f]+/$"))
    expect(mel.locator("#live")).to_have_text("live")
    send(mel, "!tool git__git_commit " + json.dumps({"repo_path": str(repo), "message": "from the browser"}))
    chat_card = mel.locator("[data-role=approval]").last
    expect(chat_card).to_have_attribute("data-status", "pending")
    assert commits(repo) == ["first"]

    # moe approves in the queue.
    moe.goto("/approvals/")
    card = moe.locator("[data-role=approval]").filter(has_text="from the browser")
    expect(card).to_contain_text("git__git_commit")
    card.get_by_role("button", name="Approve once").click()
    expect(card).to_contain_text("Approved once by moe")
    expect(mel.locator("[data-role=assistant]").last).to_contain_text("Changes committed successfully")
    assert commits(repo) == ["from the browser", "first"]

    # An image in a result (read-only: no ask) is stored and shown on the tool card.
    send(mel, "!tool every__get-tiny-image {}")
    image = mel.locator("[data-tool='every__get-tiny-image'] [data-role=result-media] img")
    expect(image).to_have_attribute("src", re.compile(r"^/sessions/ses_[0-9a-f]+/media/[0-9a-f]{64}$"))
    image.scroll_into_view_if_needed()
    mel.wait_for_function("img => img.complete && img.naturalWidth > 0", arg=image.element_handle())
    assert image.evaluate("img => [img.naturalWidth, img.naturalHeight]") == [20, 20]

    # The audit names the server, the tool, the arguments and the approver.
    moe.goto("/approvals/audit/?kind=decision")
    row = moe.locator("[data-role=audit-row]").filter(has_text="from the browser")
    expect(row).to_contain_text("MCP server git, tool git_commit")
    expect(row).to_contain_text("moe")
    expect(row).to_contain_text('"message": "from the browser"')
    moe.screenshot(path=str(Path(tempfile.gettempdir()) / "mcp-audit.png"), full_page=True)
