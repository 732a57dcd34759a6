"""The Tools section of the team page (templates/teams/_mcp.html): a moderator adds,
edits, refreshes and deletes servers and enables the installation's; members read; a
header's value is never on the page."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from sessions_app.models import TeamMcpServer


def browser(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def flash(response: Any) -> str:
    return " ".join(str(m) for m in response.context["messages"])


@pytest.mark.django_db
def test_a_moderator_enables_an_installation_server_and_sees_its_tools_and_gates(
    people: dict[str, Any], installation: Path
) -> None:
    client = browser(people["moderator"])
    page = client.get("/teams/crew/").content.decode()
    assert 'aria-label="Enable git for crew"' in page and "No MCP servers yet." in page
    response = client.post("/teams/crew/mcp/enable", {"server": "git"}, follow=True)
    assert re.fullmatch(r"MCP server git enabled for the team: \d+ tools found\.", flash(response)), flash(response)
    page = response.content.decode()
    section = page[page.index('id="mcp-servers"') :]
    assert "<code>git__git_commit</code>" in section and "healthy" in section
    commit_row = re.search(r"<td><code>git__git_commit</code>.*?</tr>", section, re.DOTALL)
    status_row = re.search(r"<td><code>git__git_status</code>.*?</tr>", section, re.DOTALL)
    assert commit_row and ">asks<" in commit_row.group(0)
    assert status_row and ">runs without asking<" in status_row.group(0)
    assert "enabled for crew" in section


@pytest.mark.django_db
def test_members_read_the_servers_without_any_form(people: dict[str, Any], installation: Path) -> None:
    browser(people["moderator"]).post("/teams/crew/mcp/enable", {"server": "time"})
    client = browser(people["member"])
    page = client.get("/teams/crew/").content.decode()
    assert "<code>time__get_current_time</code>" in page
    assert "Add an HTTP server" not in page and "Refresh time" not in page
    assert client.post("/teams/crew/mcp/enable", {"server": "git"}).status_code == 403
    assert client.post("/teams/crew/mcp/time/delete").status_code == 403
    assert client.post("/teams/crew/mcp/time/refresh").status_code == 403
    assert list(TeamMcpServer.objects.values_list("name", flat=True)) == ["time"]


@pytest.mark.django_db
def test_a_moderator_of_another_team_gets_404_everywhere(people: dict[str, Any], installation: Path) -> None:
    browser(people["moderator"]).post("/teams/crew/mcp/enable", {"server": "time"})
    client = browser(people["outsider"])
    assert client.get("/teams/crew/").status_code == 404
    for path in ("/teams/crew/mcp/enable", "/teams/crew/mcp/add", "/teams/crew/mcp/time/edit"):
        assert client.post(path, {"server": "git"}).status_code == 404, path
    assert client.post("/teams/crew/mcp/time/delete").status_code == 404
    assert TeamMcpServer.objects.count() == 1


@pytest.mark.django_db
def test_an_http_server_added_on_the_page_shows_its_headers_as_set_never_their_value(
    people: dict[str, Any], everything_http: str, settings: Any
) -> None:
    settings.SECTR_MCP_ALLOWED_HOSTS = ["127.0.0.1"]
    secret = "page-secret-0123456789"
    client = browser(people["moderator"])
    form = {
        "mcp-new-name": "every",
        "mcp-new-url": everything_http,
        "mcp-new-headers": f"Authorization: Bearer {secret}\nX-Team: crew",
        "mcp-new-timeout_s": "30",
        "mcp-new-tools": "echo get-*",
        "mcp-new-enabled": "on",
    }
    response = client.post("/teams/crew/mcp/add", form, follow=True)
    assert "MCP server every added" in flash(response), flash(response)
    page = response.content.decode()
    assert secret not in page
    assert "headers <code>Authorization</code>, <code>X-Team</code> set" in page
    assert "set: Authorization, X-Team; leave empty to keep them" in page
    assert "<code>every__echo</code>" in page and "not offered" in page  # the globs leave some out
    # An edit without headers keeps them; the server is disabled.
    edit = {"mcp-every-url": everything_http, "mcp-every-timeout_s": "10", "mcp-every-tools": ""}
    response = client.post("/teams/crew/mcp/every/edit", edit, follow=True)
    row = TeamMcpServer.objects.get(name="every")
    assert (row.enabled, row.timeout_s, row.tools, row.header_names) == (False, 10.0, None, ["Authorization", "X-Team"])
    assert "MCP server every saved (disabled)." in flash(response)
    assert secret not in response.content.decode()


@pytest.mark.django_db
def test_a_refused_url_on_the_page_says_why_and_saves_nothing(people: dict[str, Any]) -> None:
    client = browser(people["moderator"])
    form = {"mcp-new-name": "local", "mcp-new-url": "http://127.0.0.1:9/mcp", "mcp-new-timeout_s": "60"}
    response = client.post("/teams/crew/mcp/add", form, follow=True)
    assert "loopback, private, link-local or metadata address" in flash(response)
    assert not TeamMcpServer.objects.exists()


@pytest.mark.django_db
def test_the_agent_forms_tool_picker_lists_the_teams_mcp_tools_with_their_gates(
    people: dict[str, Any], installation: Path
) -> None:
    client = browser(people["moderator"])
    client.post("/teams/crew/mcp/enable", {"server": "git"})
    form = client.get("/teams/crew/agents/new").content.decode()
    assert 'value="git__git_commit"' in form and "git__git_commit (gated)" in form
    assert "git__git_status (runs freely)" in form
    created = client.post(
        "/teams/crew/agents/new",
        {"slug": "gitbot", "name": "Git bot", "tools": ["git__git_status", "git__git_commit"], "handler": "default"},
    )
    assert created.status_code == 302, created.content.decode()[:2000]
    from sessions_app.models import AgentVersion

    assert AgentVersion.objects.get(agent__slug="gitbot").spec().tools == ("git__git_status", "git__git_commit")
    edit = client.get("/teams/crew/agents/gitbot/").content.decode()
    assert re.search(r'value="git__git_commit"[^>]*checked', edit)
