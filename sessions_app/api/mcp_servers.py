"""The team MCP servers API (docs/mcp.md). Thin: parse, call an action, shape the answer.

A server's headers are write-only: a response names them (`header_names`), never their
values."""

from __future__ import annotations

from typing import Any

from asgiref.sync import sync_to_async
from django.http import HttpResponse

from sessions_app.actions import mcp_servers as mcp_actions
from sessions_app.api.views import ApiCall, json_response
from sessions_app.mcp_servers import described_tools, installation_servers
from sessions_app.models import TeamMcpServer


def server_dict(server: TeamMcpServer) -> dict[str, Any]:
    return {
        "name": server.name,
        "kind": server.kind,
        "url": server.url or None,
        "header_names": list(server.header_names or []),
        "enabled": server.enabled,
        "timeout_s": server.timeout_s,
        "tools": server.tools,
        "health": server.health,
        "last_error": server.last_error or None,
        "protocol_version": server.protocol_version or None,
        "refreshed_at": server.refreshed_at.isoformat() if server.refreshed_at else None,
        "discovery_reason": server.discovery_reason or None,
        "tools_fresh_until": server.tools_fresh_until.isoformat() if server.tools_fresh_until else None,
        "discovered_tools": [
            {key: tool[key] for key in ("name", "tool", "description", "gate", "read_only", "offered", "input_schema")}
            for tool in described_tools(server)
        ],
    }


def _list(user: Any, team_name: str) -> dict[str, Any]:
    team, servers = mcp_actions.list_servers(user, team_name)
    enabled = {s.name for s in servers if not s.url}
    return {
        "team": team.name,
        "servers": [server_dict(s) for s in servers],
        "installation_servers": [{"name": name, "enabled": name in enabled} for name in sorted(installation_servers())],
    }


async def list_servers(call: ApiCall, name: str) -> HttpResponse:
    return json_response(await sync_to_async(_list)(call.user, name))


async def add_server(call: ApiCall, name: str) -> HttpResponse:
    def add() -> dict[str, Any]:
        return server_dict(mcp_actions.do_add_server(call.user, name, call.body))

    return json_response(await sync_to_async(add)(), status=201)


async def get_server(call: ApiCall, name: str, server: str) -> HttpResponse:
    def read() -> dict[str, Any]:
        return server_dict(mcp_actions.get_server(call.user, name, server))

    return json_response(await sync_to_async(read)())


async def update_server(call: ApiCall, name: str, server: str) -> HttpResponse:
    def update() -> dict[str, Any]:
        return server_dict(mcp_actions.do_update_server(call.user, name, server, call.body))

    return json_response(await sync_to_async(update)())


async def refresh_server(call: ApiCall, name: str, server: str) -> HttpResponse:
    def refresh() -> dict[str, Any]:
        return server_dict(mcp_actions.do_refresh_server(call.user, name, server))

    return json_response(await sync_to_async(refresh)())


async def delete_server(call: ApiCall, name: str, server: str) -> HttpResponse:
    await sync_to_async(mcp_actions.do_delete_server)(call.user, name, server)
    return HttpResponse(status=204)
