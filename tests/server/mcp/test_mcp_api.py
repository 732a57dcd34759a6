"""A team's MCP servers through the API (docs/mcp.md): who may see and change them, the
address guard, discovery on save and Refresh, and header secrets that never come back."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from sessions_app.actions.tokens import do_issue_token
from sessions_app.models import TeamMcpServer

URL = "/api/v1/teams/crew/mcp-servers"


def api(user: Any) -> Client:
    return Client(HTTP_AUTHORIZATION=f"Bearer {do_issue_token(user, 't')[1]}")


@pytest.mark.django_db
def test_a_moderator_enables_an_installation_server_and_its_tools_are_discovered(
    people: dict[str, Any], installation: Path
) -> None:
    response = api(people["moderator"]).post(URL, {"name": "time"}, content_type="application/json")
    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["name"], body["kind"], body["url"], body["health"], body["last_error"]) == (
        "time",
        "stdio",
        None,
        "ok",
        None,
    )
    assert body["protocol_version"] == "2026-07-28"
    tools = {t["name"]: t for t in body["discovered_tools"]}
    assert set(tools) == {"time__get_current_time", "time__convert_time"}
    assert tools["time__get_current_time"]["gate"] == "runs without asking"
    assert tools["time__get_current_time"]["input_schema"]["properties"]["timezone"]["type"] == "string"
    listed = api(people["member"]).get(URL).json()
    assert [s["name"] for s in listed["servers"]] == ["time"]
    assert listed["installation_servers"] == [{"name": "git", "enabled": False}, {"name": "time", "enabled": True}]


@pytest.mark.django_db
def test_git_commit_asks_and_git_status_runs_without_asking(people: dict[str, Any], installation: Path) -> None:
    body = api(people["moderator"]).post(URL, {"name": "git"}, content_type="application/json").json()
    gates = {t["name"]: t["gate"] for t in body["discovered_tools"]}
    assert gates["git__git_commit"] == "asks" and gates["git__git_status"] == "runs without asking"


@pytest.mark.django_db
@pytest.mark.parametrize("who", ["member", "reviewer", "owner"])
def test_members_read_the_list_but_cannot_change_it(people: dict[str, Any], installation: Path, who: str) -> None:
    api(people["moderator"]).post(URL, {"name": "time"}, content_type="application/json")
    client = api(people[who])
    assert client.get(URL).status_code == 200
    assert client.get(f"{URL}/time").status_code == 200
    assert client.post(URL, {"name": "git"}, content_type="application/json").status_code == 403
    assert client.put(f"{URL}/time", {"enabled": False}, content_type="application/json").status_code == 403
    assert client.post(f"{URL}/time/refresh", content_type="application/json").status_code == 403
    assert client.delete(f"{URL}/time").status_code == 403
    assert list(TeamMcpServer.objects.values_list("name", "enabled")) == [("time", True)]


@pytest.mark.django_db
def test_a_moderator_of_another_team_sees_none_of_it(people: dict[str, Any], installation: Path) -> None:
    api(people["moderator"]).post(URL, {"name": "time"}, content_type="application/json")
    client = api(people["outsider"])
    for response in (
        client.get(URL),
        client.get(f"{URL}/time"),
        client.post(URL, {"name": "git"}, content_type="application/json"),
        client.put(f"{URL}/time", {"enabled": False}, content_type="application/json"),
        client.post(f"{URL}/time/refresh", content_type="application/json"),
        client.delete(f"{URL}/time"),
    ):
        assert response.status_code == 404, response.content
    assert TeamMcpServer.objects.count() == 1 and TeamMcpServer.objects.get().enabled


@pytest.mark.django_db
@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:9/mcp",
        "http://localhost/mcp",
        "http://10.1.2.3/mcp",
        "http://169.254.169.254/latest",
        "http://[::1]/mcp",
        "http://metadata.google.internal/x",
        "ftp://example.org/mcp",
        "http://user:pw@example.org/mcp",
    ],
)
def test_an_internal_or_odd_url_is_refused_and_nothing_is_saved(people: dict[str, Any], url: str) -> None:
    response = api(people["moderator"]).post(URL, {"name": "x", "url": url}, content_type="application/json")
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_url", response.content
    assert not TeamMcpServer.objects.exists()


@pytest.mark.django_db
def test_bad_fields_are_refused(people: dict[str, Any], installation: Path) -> None:
    client = api(people["moderator"])
    cases = [
        ({"name": "Bad Name", "url": "https://example.org/mcp"}, "invalid_name"),
        ({"name": "nope"}, "invalid_name"),  # not an installation server
        ({"name": "t", "url": "https://example.org/mcp", "timeout_s": 0}, "invalid_timeout"),
        ({"name": "t", "url": "https://example.org/mcp", "tools": "x"}, "invalid_tools"),
        ({"name": "t", "url": "https://example.org/mcp", "headers": {"X": "a\nb"}}, "invalid_headers"),
        ({"name": "time", "command": "rm"}, "invalid_field"),  # nobody makes a worker run a command
    ]
    for body, code in cases:
        response = client.post(URL, body, content_type="application/json")
        assert response.status_code == 400 and response.json()["error"]["code"] == code, (body, response.content)
    assert not TeamMcpServer.objects.exists()


@pytest.mark.django_db
def test_an_http_server_on_an_allowed_host_is_registered_with_write_only_headers(
    people: dict[str, Any], everything_http: str, settings: Any
) -> None:
    settings.SECTR_MCP_ALLOWED_HOSTS = ["127.0.0.1"]
    secret = "Bearer s3cr3t-token-value-4242"
    client = api(people["moderator"])
    body = {"name": "every", "url": everything_http, "headers": {"Authorization": secret}, "tools": ["echo", "get-*"]}
    response = client.post(URL, body, content_type="application/json")
    assert response.status_code == 201, response.content
    server = response.json()
    assert (server["health"], server["protocol_version"], server["header_names"]) == (
        "ok",
        "2025-11-25",
        ["Authorization"],
    )
    offered = {t["name"] for t in server["discovered_tools"] if t["offered"]}
    assert "every__echo" in offered and all(n == "every__echo" or n.startswith("every__get-") for n in offered)
    assert secret not in response.content.decode()
    # The same name again: 409, nothing changed.
    again = client.post(URL, body, content_type="application/json")
    assert again.status_code == 409 and again.json()["error"]["code"] == "mcp_server_exists"
    # PUT without headers keeps them; Refresh discovers again.
    assert client.put(f"{URL}/every", {"timeout_s": 5}, content_type="application/json").json()["timeout_s"] == 5
    refreshed = client.post(f"{URL}/every/refresh", content_type="application/json")
    assert refreshed.status_code == 200 and refreshed.json()["header_names"] == ["Authorization"]
    for response in (client.get(URL), client.get(f"{URL}/every"), refreshed):
        assert secret not in response.content.decode() and "s3cr3t" not in response.content.decode()
    row = TeamMcpServer.objects.get(name="every")
    assert "s3cr3t" not in row.headers_sealed and row.header_names == ["Authorization"]
    # Moved to another host, the stored headers do not follow unless given again.
    moved = everything_http.replace("127.0.0.1", "localhost")
    settings.SECTR_MCP_ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
    refused = client.put(f"{URL}/every", {"url": moved}, content_type="application/json")
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "headers_required"
    assert TeamMcpServer.objects.get(name="every").url == everything_http
    again = client.put(f"{URL}/every", {"url": moved, "headers": {}}, content_type="application/json")
    assert again.status_code == 200 and again.json()["header_names"] == [] and again.json()["url"] == moved


@pytest.mark.django_db
def test_an_unreachable_server_is_saved_with_its_error_and_refresh_tries_again(
    people: dict[str, Any], settings: Any
) -> None:
    from .conftest import free_port

    settings.SECTR_MCP_ALLOWED_HOSTS = ["127.0.0.1"]
    url = f"http://127.0.0.1:{free_port()}/mcp"
    client = api(people["moderator"])
    response = client.post(URL, {"name": "gone", "url": url}, content_type="application/json")
    assert response.status_code == 201
    body = response.json()
    assert body["health"] == "error" and "MCP server gone is unreachable" in body["last_error"]
    assert body["discovered_tools"] == []
    assert client.post(f"{URL}/gone/refresh", content_type="application/json").json()["health"] == "error"


@pytest.mark.django_db
def test_delete_disables_an_installation_server_for_the_team(people: dict[str, Any], installation: Path) -> None:
    client = api(people["moderator"])
    client.post(URL, {"name": "time"}, content_type="application/json")
    assert client.put(f"{URL}/time", {"enabled": False}, content_type="application/json").json()["health"] == "disabled"
    assert client.delete(f"{URL}/time").status_code == 204
    assert client.get(f"{URL}/time").status_code == 404
    assert client.get(URL).json()["installation_servers"][1] == {"name": "time", "enabled": False}


@pytest.mark.django_db
def test_staff_define_an_installation_server_in_the_admin_and_a_team_enables_it(people: dict[str, Any]) -> None:
    from .conftest import bin_path

    admin = Client()
    admin.force_login(people["staff"])
    people["staff"].is_superuser = True
    people["staff"].save()
    add = "/admin/sessions_app/installationmcpserver/add/"
    bad = {"name": "clock", "command": bin_path("mcp-server-time"), "args": '"not a list"', "env": "{}"}
    bad |= {"cwd": "", "timeout_s": "60", "created_at_0": "2026-01-01", "created_at_1": "00:00:00"}
    assert "args must be a list of strings" in admin.post(add, bad).content.decode()
    good = {**bad, "args": "[]"}
    assert admin.post(add, good).status_code == 302
    response = api(people["moderator"]).post(URL, {"name": "clock"}, content_type="application/json")
    assert response.status_code == 201 and response.json()["health"] == "ok", response.content
    assert "clock__get_current_time" in {t["name"] for t in response.json()["discovered_tools"]}
