"""A server's tool list changes while the workers use it (docs/mcp.md, Discovery): a
session-based server's `notifications/tools/list_changed`, and a stateless server's event
on the `subscriptions/listen` stream the worker's connection keeps open, make the worker
discover its tools again and store them, so the next run has the new tool without
Refresh; a stateless server's cache hint (`ttlMs`) is kept as `tools_fresh_until`, and a
run after it discovers again in the background; a tool removed since its discovery is an
error result; a failed discovery leaves when and why the tools were discovered as they
were; the team page says when the tools were discovered and why.

The server is tests/server/mcp/changing_mcp_server.py (calling `grow` adds a tool): an
installation stdio server (its state is the worker connection's own process), or a
team's Streamable HTTP server at the stateless revision."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from sectr.events import EventType
from sessions_app import actions
from sessions_app.actions import mcp_servers as mcp_actions
from sessions_app.dbthread import run_in_db_thread
from sessions_app.models import Run, Session, TeamMcpServer

from .conftest import servers_file
from .test_mcp_runs import of_type, with_worker

E = EventType
CHANGING = Path(__file__).with_name("changing_mcp_server.py")


def install_changing(tmp_path: Path, settings: Any, era: str, ttl_ms: int = 0, *, listen: bool = True) -> None:
    (tmp_path / "repo").mkdir()
    entry = {
        "command": sys.executable,
        "args": [str(CHANGING)],
        "env": {"CHANGING_MCP_ERA": era, "CHANGING_MCP_TTL_MS": str(ttl_ms), "CHANGING_MCP_LISTEN": str(int(listen))},
        "timeout_s": 20,
    }
    settings.SECTR_MCP_SERVERS = str(servers_file(tmp_path / "mcp-servers.json", tmp_path / "repo", changing=entry))


def changing_session(people: dict[str, Any]) -> Session:
    server = mcp_actions.do_add_server(people["moderator"], "crew", {"name": "changing"})
    assert server.health == "ok", server.last_error
    actions.do_create_agent(people["moderator"], "crew", "shifty", {"name": "Shifty", "tools": ["changing__*"]})
    return actions.do_create_session(people["owner"], team="crew", agent="crew/shifty")


def row() -> TeamMcpServer:
    return TeamMcpServer.objects.get(name="changing")


def listed(server: TeamMcpServer) -> list[str]:
    return sorted(str(t["name"]) for t in server.discovered)


async def until(check: Callable[[], bool], seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not await run_in_db_thread(check):
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


def results(session: Session) -> list[tuple[bool, str]]:
    return [(bool(r.get("is_error")), str(r["content"])) for r in of_type(session, E.TOOL_RESULT)]


def tools_section(people: dict[str, Any]) -> str:
    client = Client()
    client.force_login(people["member"])
    page = client.get("/teams/crew/").content.decode()
    return page[page.index('id="mcp-servers"') :]


class Runs:
    """Inside with_worker's body: post to the session as its owner and wait for the worker
    to finish the run."""

    def __init__(self, owner: Any, session: Session, idle: Callable[[], Awaitable[None]]) -> None:
        self.owner, self.session, self.idle = owner, session, idle

    async def post(self, content: str) -> None:
        await run_in_db_thread(actions.do_post_message, self.owner, self.session.pk, content)
        await self.idle()

    async def call(self, tool: str, arguments: str = "{}") -> None:
        """A run that calls the changing server's `tool`."""
        await self.post(f"!tool changing__{tool} {arguments}")

    async def grow_until_changed(self) -> None:
        """Call `grow` (the server adds extra_1 and says its tools changed) and wait until
        the worker, told so on its connection, stored the new list."""
        await self.call("grow")
        await until(lambda: row().discovery_reason == "changed")


#: The tools after `grow`, and the results of a run calling `grow` then one calling extra_1.
GROWN = ["extra_1", "grow", "shrink"]
GREW_AND_RAN_EXTRA_1 = [(False, "added extra_1"), (False, "extra 1")]


@pytest.mark.django_db(transaction=True)
def test_a_tool_list_change_reaches_the_next_run_without_refresh(
    people: dict[str, Any], tmp_path: Path, settings: Any
) -> None:
    install_changing(tmp_path, settings, "legacy")
    session = changing_session(people)
    saved = row()
    assert saved.protocol_version == "2025-11-25" and listed(saved) == ["grow", "shrink"]
    assert saved.discovery_reason == "saved" and saved.tools_fresh_until is None
    assert "when the server was saved" in tools_section(people)

    async def body(idle: Callable[[], Awaitable[None]]) -> None:
        runs = Runs(people["owner"], session, idle)
        await runs.grow_until_changed()
        await runs.call("extra_1")
        # Removed quietly (no notification): the next run still has it from the stored
        # discovery, and its call is an error result, not a failed run.
        await runs.call("shrink", '{"quietly": true}')
        await runs.call("extra_1")

    with_worker(body)
    changed = row()
    assert listed(changed) == GROWN and changed.refreshed_at > saved.refreshed_at
    assert changed.tools_fresh_until is None and changed.health == "ok"
    outcome = results(session)
    assert outcome[:3] == [*GREW_AND_RAN_EXTRA_1, (False, "removed extra_1")], outcome
    error, message = outcome[3]
    assert error and "MCP server changing: extra_1 reported an error: Unknown tool: extra_1" in message, message
    assert set(Run.objects.filter(session=session).values_list("status", flat=True)) == {Run.COMPLETED}
    section = tools_section(people)
    assert "because the server said its tools changed" in section and "<code>changing__extra_1</code>" in section
    assert "Fresh until" not in section


@pytest.mark.django_db(transaction=True)
def test_a_stateless_servers_cache_hint_expires_and_a_run_discovers_again(
    people: dict[str, Any], tmp_path: Path, settings: Any
) -> None:
    # Long enough for the first run to start within it on a busy machine. A server that
    # serves no `subscriptions/listen`: the hint is all it says.
    install_changing(tmp_path, settings, "modern", ttl_ms=8000, listen=False)
    session = changing_session(people)
    saved = row()
    assert saved.protocol_version == "2026-07-28" and saved.discovery_reason == "saved"
    assert saved.tools_fresh_until is not None and saved.refreshed_at is not None
    assert abs((saved.tools_fresh_until - saved.refreshed_at).total_seconds() - 8) < 0.01
    assert "Fresh until" in tools_section(people)

    async def body(idle: Callable[[], Awaitable[None]]) -> None:
        runs = Runs(people["owner"], session, idle)
        await runs.call("grow")
        # Nothing to listen to: the stored tools stay while the hint holds.
        assert await run_in_db_thread(lambda: (row().discovery_reason, listed(row()))) == ("saved", ["grow", "shrink"])
        fresh_until = saved.tools_fresh_until
        assert fresh_until is not None
        await asyncio.sleep(max(0.0, (fresh_until - timezone.now()).total_seconds()) + 0.2)
        # A run after the hint ran out uses the stored tools and starts a re-discovery.
        await runs.post("hello")
        await until(lambda: row().discovery_reason == "expired")
        await runs.call("extra_1")

    with_worker(body)
    expired = row()
    assert listed(expired) == GROWN and expired.tools_fresh_until is not None
    assert expired.refreshed_at is not None and expired.tools_fresh_until > expired.refreshed_at
    assert results(session) == GREW_AND_RAN_EXTRA_1
    assert "because the server's cache hint ran out" in tools_section(people)


@pytest.fixture
def changing_http(settings: Any) -> Iterator[str]:
    """The changing server over Streamable HTTP at the stateless revision (no session, each
    request on its own), as a team registers it by URL."""
    from .conftest import free_port

    settings.SECTR_MCP_ALLOWED_HOSTS = ["127.0.0.1"]
    port = free_port()
    env = {**os.environ, "CHANGING_MCP_ERA": "modern", "CHANGING_MCP_HTTP_PORT": str(port)}
    proc = subprocess.Popen(
        [sys.executable, str(CHANGING)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, "the changing server did not start"
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.django_db(transaction=True)
def test_a_stateless_http_servers_change_reaches_the_next_run_without_refresh(
    people: dict[str, Any], changing_http: str
) -> None:
    """A stateless server says its tools changed only on a `subscriptions/listen` stream:
    the worker's connection keeps one open, and stores the new list as for a session-based
    server's notification."""
    server = mcp_actions.do_add_server(people["moderator"], "crew", {"name": "changing", "url": changing_http})
    assert server.health == "ok", server.last_error
    assert server.protocol_version == "2026-07-28" and server.tools_fresh_until is None
    actions.do_create_agent(people["moderator"], "crew", "shifty", {"name": "Shifty", "tools": ["changing__*"]})
    session = actions.do_create_session(people["owner"], team="crew", agent="crew/shifty")
    saved = row()

    async def body(idle: Callable[[], Awaitable[None]]) -> None:
        runs = Runs(people["owner"], session, idle)
        await runs.grow_until_changed()
        await runs.call("extra_1")

    with_worker(body)
    changed = row()
    assert listed(changed) == GROWN and changed.refreshed_at > saved.refreshed_at
    assert results(session) == GREW_AND_RAN_EXTRA_1
    assert "because the server said its tools changed" in tools_section(people)


@pytest.mark.django_db
def test_the_api_says_when_and_why_the_tools_were_discovered(
    people: dict[str, Any], tmp_path: Path, settings: Any
) -> None:
    from sessions_app.actions.tokens import do_issue_token

    install_changing(tmp_path, settings, "modern", ttl_ms=60000)
    changing_session(people)
    client = Client(HTTP_AUTHORIZATION=f"Bearer {do_issue_token(people['moderator'], 't')[1]}")
    body = client.get("/api/v1/teams/crew/mcp-servers/changing").json()
    assert body["discovery_reason"] == "saved" and body["tools_fresh_until"] > body["refreshed_at"]
    refreshed = client.post("/api/v1/teams/crew/mcp-servers/changing/refresh", content_type="application/json").json()
    assert refreshed["discovery_reason"] == "refresh" and refreshed["refreshed_at"] > body["refreshed_at"]
    assert json.dumps(refreshed).count("changing__grow") == 1


@pytest.mark.django_db
def test_a_failed_discovery_leaves_when_and_why_the_tools_were_discovered(
    people: dict[str, Any], tmp_path: Path, settings: Any
) -> None:
    from sessions_app.actions.tokens import do_issue_token

    install_changing(tmp_path, settings, "modern", ttl_ms=60000)
    changing_session(people)
    saved = row()
    assert saved.refreshed_at is not None and saved.tools_fresh_until is not None
    # The same server, now a command that exits at once: Refresh cannot list its tools.
    broken = {"command": sys.executable, "args": ["-c", "raise SystemExit(3)"], "timeout_s": 20}
    settings.SECTR_MCP_SERVERS = str(servers_file(tmp_path / "broken.json", tmp_path / "repo", changing=broken))
    client = Client(HTTP_AUTHORIZATION=f"Bearer {do_issue_token(people['moderator'], 't')[1]}")
    body = client.post("/api/v1/teams/crew/mcp-servers/changing/refresh", content_type="application/json").json()
    assert body["health"] == "error" and "MCP server changing is unreachable" in body["last_error"], body
    failed = row()
    assert (failed.refreshed_at, failed.discovery_reason, failed.tools_fresh_until) == (
        saved.refreshed_at,
        "saved",
        saved.tools_fresh_until,
    )
    assert listed(failed) == ["grow", "shrink"]  # the tools stored before stay offered
    section = tools_section(people)
    assert "when the server was saved" in section and "Last error: MCP server changing is unreachable" in section
    # A save that cannot discover is the same.
    changed = client.put(
        "/api/v1/teams/crew/mcp-servers/changing", {"tools": ["grow"]}, content_type="application/json"
    ).json()
    assert (
        changed["health"] == "error"
        and changed["refreshed_at"] == body["refreshed_at"] == saved.refreshed_at.isoformat()
    )
    # Reachable again: Refresh moves them, and the error is gone.
    settings.SECTR_MCP_SERVERS = str(tmp_path / "mcp-servers.json")
    body = client.post("/api/v1/teams/crew/mcp-servers/changing/refresh", content_type="application/json").json()
    assert (body["health"], body["last_error"], body["discovery_reason"]) == ("ok", None, "refresh")
    assert row().refreshed_at > saved.refreshed_at


@pytest.mark.slow
@pytest.mark.timeout(300)  # its own server, migrations and a worker process: slow on a loaded machine
def test_a_worker_process_stores_a_changed_tool_list_for_the_next_run(tmp_path: Path) -> None:
    from tests.liveserver import LiveSectr
    from tests.server.runs.test_worker_processes import LiveDriver, wait_for, worker_args

    servers = tmp_path / "mcp-servers.json"
    entry = {"command": sys.executable, "args": [str(CHANGING)], "env": {"CHANGING_MCP_ERA": "legacy"}}
    servers.write_text(json.dumps({"changing": entry}))
    with LiveSectr(embedded_worker=False, env={"SECTR_MCP_SERVERS": str(servers)}) as live:
        driver = LiveDriver(live)
        try:
            session_id, first = driver.act(
                """
                from sessions_app.actions import mcp_servers
                alice = User.objects.create_user("alice")
                actions.do_create_team("crew")
                actions.do_set_membership("crew", "alice", "moderator")
                server = mcp_servers.do_add_server(alice, "crew", {"name": "changing"})
                assert server.health == "ok", server.last_error
                actions.do_create_agent(alice, "crew", "shifty", {"name": "Shifty", "tools": ["changing__*"]})
                session = actions.do_create_session(alice, team="crew", agent="crew/shifty")
                run = actions.do_post_message(alice, session.pk, "!tool changing__grow {}")
                result = [session.pk, run.pk]
                """
            )
            live.start_worker(*worker_args("w0"))
            wait_for(lambda: driver.run(first)["status"] == "completed", 90, "the first run")

            def stored() -> tuple[str, list[str]]:
                ((reason, discovered),) = driver._rows(
                    "SELECT discovery_reason, discovered FROM sessions_app_teammcpserver WHERE name = %s", ("changing",)
                )
                tools = json.loads(discovered) if isinstance(discovered, str) else discovered
                return str(reason), sorted(t["name"] for t in tools)

            wait_for(lambda: stored()[0] == "changed", 30, "the worker's re-discovery")
            assert stored() == ("changed", GROWN)
            second = driver.act(
                f"""
                alice = User.objects.get(username="alice")
                result = actions.do_post_message(alice, {session_id!r}, "!tool changing__extra_1 {{}}").pk
                """
            )
            wait_for(lambda: driver.run(second)["status"] == "completed", 60, "the second run")
            contents = [e["payload"]["content"] for e in driver.envelopes(session_id) if e["type"] == "TOOL_RESULT"]
            assert contents == ["added extra_1", "extra 1"]
        finally:
            driver.close()
