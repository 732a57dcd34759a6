"""A team's MCP servers through the Python SDK against a real server (docs/mcp.md):
`client.teams.add_mcp_server` and the rest, sync and async, and an agent that uses the
server's tool in a run. alice is a member of team crew, mod its moderator, bob an outsider."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from sectr.client import AsyncClient, Client, NotFoundError, PermissionDeniedError
from tests.server.api.test_api_support import LiveApi, live_api

from .conftest import bin_path


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveApi]:
    servers: Path = tmp_path_factory.mktemp("mcp") / "mcp-servers.json"
    servers.write_text(json.dumps({"time": {"command": bin_path("mcp-server-time")}}))
    with live_api(env={"SECTR_MCP_SERVERS": str(servers)}) as live:
        yield live


def test_a_moderator_enables_a_server_and_a_members_agent_calls_its_tool(api: LiveApi) -> None:
    with Client(api.base_url, token=api.tokens["mod"]) as mod, Client(api.base_url, token=api.tokens["alice"]) as alice:
        server = mod.teams.add_mcp_server("crew", "time", tools=["get_*"])
        assert (server.kind, server.health, server.url, server.tools) == ("stdio", "ok", None, ["get_*"])
        # No cache hint from mcp-server-time: the tools stay until a save or Refresh.
        assert (server.discovery_reason, server.tools_fresh_until) == ("saved", None) and server.refreshed_at
        offered = {t["name"]: t["offered"] for t in server.discovered_tools}
        assert offered == {"time__get_current_time": True, "time__convert_time": False}
        assert [s.name for s in alice.teams.mcp_servers("crew")] == ["time"]
        with pytest.raises(PermissionDeniedError):
            alice.teams.update_mcp_server("crew", "time", enabled=False)
        mod.agents.create("crew", "clock", "Clock", tools=["time__*"])
        session = alice.sessions.create(agent="crew/clock")
        assert session.run("!offered").result().text == "tools: time__get_current_time"
        result = session.run('!tool time__get_current_time {"timezone": "UTC"}').result()
        assert "time__get_current_time returned" in result.text and "UTC" in result.text


def test_an_outsider_gets_not_found_and_the_async_client_changes_and_deletes(api: LiveApi) -> None:
    async def main() -> None:
        async with AsyncClient(api.base_url, token=api.tokens["bob"]) as bob:
            with pytest.raises(NotFoundError):
                await bob.teams.mcp_servers("crew")
            with pytest.raises(NotFoundError):
                await bob.teams.add_mcp_server("crew", "time")
        async with AsyncClient(api.base_url, token=api.tokens["mod"]) as mod:
            if not [s for s in await mod.teams.mcp_servers("crew") if s.name == "time"]:
                await mod.teams.add_mcp_server("crew", "time")
            changed = await mod.teams.update_mcp_server("crew", "time", enabled=False)
            assert (changed.enabled, changed.health) == (False, "disabled")
            changed = await mod.teams.update_mcp_server("crew", "time", enabled=True)
            refreshed = await mod.teams.refresh_mcp_server("crew", "time")
            assert (refreshed.health, refreshed.discovery_reason) == ("ok", "refresh")
            await mod.teams.delete_mcp_server("crew", "time")
            with pytest.raises(NotFoundError):
                await mod.teams.mcp_server("crew", "time")

    asyncio.run(main())
