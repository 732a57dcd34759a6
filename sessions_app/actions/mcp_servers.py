"""A team's MCP servers as its moderators change them from the team page and the API
(docs/mcp.md): register a Streamable HTTP server, enable an installation's stdio server,
change, delete, refresh.

Everyone without a role in the team gets NotFound; members and reviewers read the list
(never a header value: those are write-only), moderators (and staff) change it. A save
and a refresh run discovery (`tools/list`) before they write; a server that cannot be
reached is still saved, with its health and last error, so that a moderator can fix it.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

from django.db import IntegrityError, transaction
from django.utils import timezone

from sectr.errors import NotFound, SectrError, ValidationFailed
from sessions_app.actions.members import moderated_team
from sessions_app.actions.teams import get_team_for_user
from sessions_app.mcp_servers import (
    check_server_url,
    discover_now,
    fresh_until,
    installation_servers,
    server_config,
)
from sessions_app.models import Team, TeamMcpServer
from sessions_app.sealed import SealBroken, seal

#: A server's name: the prefix of its tools (sectr.mcp's rule).
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,31}$")
#: An HTTP header's name (RFC 9110 token).
HEADER_NAME_RE = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,100}$")
MAX_HEADERS = 20
MAX_HEADER_VALUE = 8192
MAX_SERVERS_PER_TEAM = 50
MAX_GLOBS = 100
TIMEOUT_RANGE = (1.0, 600.0)
HTTP_FIELDS = ("name", "url", "headers", "enabled", "timeout_s", "tools")
STDIO_FIELDS = ("name", "enabled", "tools")


def list_servers(actor: Any, team_name: Any) -> tuple[Team, list[TeamMcpServer]]:
    team = get_team_for_user(actor, team_name)
    return team, list(TeamMcpServer.objects.filter(team=team).order_by("name"))


def get_server(actor: Any, team_name: Any, name: Any) -> TeamMcpServer:
    team = get_team_for_user(actor, team_name)
    return _server_of(team, name)


def _server_of(team: Team, name: Any) -> TeamMcpServer:
    server = TeamMcpServer.objects.filter(team=team, name=name).first() if isinstance(name, str) else None
    if server is None:
        raise NotFound("no such MCP server")
    return server


def check_name(name: Any) -> str:
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise ValidationFailed("name must be 1-32 lower-case letters, digits or '-'", code="invalid_name")
    return name


def check_headers(headers: Any) -> dict[str, str]:
    if not isinstance(headers, dict) or len(headers) > MAX_HEADERS:
        raise ValidationFailed(f"headers must be an object of at most {MAX_HEADERS} names", code="invalid_headers")
    checked = {}
    for key, value in headers.items():
        if not isinstance(key, str) or not HEADER_NAME_RE.match(key):
            raise ValidationFailed("a header name must be an HTTP token", code="invalid_headers")
        if not isinstance(value, str) or len(value) > MAX_HEADER_VALUE or any(c in value for c in "\r\n\0"):
            # The message names the header, never its value.
            raise ValidationFailed(f"header {key}: the value must be one line of text", code="invalid_headers")
        checked[key] = value
    return checked


def check_timeout(value: Any) -> float:
    low, high = TIMEOUT_RANGE
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise ValidationFailed(f"timeout_s must be a number from {low:g} to {high:g}", code="invalid_timeout")
    return float(value)


def check_globs(value: Any) -> list[str] | None:
    if value is None:
        return None
    if (
        not isinstance(value, list)
        or len(value) > MAX_GLOBS
        or not all(isinstance(g, str) and 0 < len(g) <= 200 for g in value)
    ):
        raise ValidationFailed(
            f"tools must be null (all) or a list of at most {MAX_GLOBS} globs of the server's tool names",
            code="invalid_tools",
        )
    return list(value)


def _check_enabled(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValidationFailed("enabled must be true or false", code="invalid_enabled")
    return value


def _unknown(data: dict[str, Any], allowed: tuple[str, ...]) -> None:
    extra = sorted(set(data) - set(allowed))
    if extra:
        raise ValidationFailed(f"unknown field(s): {', '.join(extra)}", code="invalid_field")


def _discover_into(server: TeamMcpServer, reason: str) -> None:
    """Run discovery for `server` and keep what it found, when and why (not saved here).

    Only a discovery that worked moves `refreshed_at`, `discovery_reason` and
    `tools_fresh_until`: they say when the stored tools were listed, and a failure lists
    none. It is the row's health and last error instead; the tools stored before stay
    what the workers offer."""
    if not server.enabled:
        server.health, server.last_error = TeamMcpServer.DISABLED, ""
        return
    try:
        config = server_config(server)
    except (LookupError, SealBroken) as exc:
        server.health, server.last_error = TeamMcpServer.ERROR, str(exc)
        return
    found = discover_now(config)
    if found.error is not None:
        server.health, server.last_error = TeamMcpServer.ERROR, found.error[:2000]
        return
    server.discovered = found.tools
    server.protocol_version = found.protocol_version or ""
    server.refreshed_at = timezone.now()
    server.discovery_reason = reason
    server.tools_fresh_until = fresh_until(found.ttl_s, server.refreshed_at)
    server.health, server.last_error = TeamMcpServer.OK, ""


def do_add_server(actor: Any, team_name: Any, data: Any) -> TeamMcpServer:
    """Register an HTTP server (`url` given) or enable an installation server (`name` only)."""
    team = moderated_team(actor, team_name, "its MCP servers")
    if not isinstance(data, dict):
        raise ValidationFailed("expected a JSON object", code="invalid_body")
    name = check_name(data.get("name"))
    if "url" in data:
        _unknown(data, HTTP_FIELDS)
        headers = check_headers(data.get("headers") or {})
        timeout = check_timeout(data.get("timeout_s", 60.0))
        check_globs(data.get("tools"))
        # Last: it resolves the host, and a bad field should not wait on DNS.
        url = check_server_url(data["url"])
        server = TeamMcpServer(
            team=team,
            name=name,
            url=url,
            headers_sealed=seal(headers),
            header_names=sorted(headers),
            timeout_s=timeout,
        )
    else:
        _unknown(data, STDIO_FIELDS)
        if name not in installation_servers():
            raise ValidationFailed(
                f"the installation has no stdio MCP server named {name!r}; give a url to register an HTTP server",
                code="invalid_name",
            )
        server = TeamMcpServer(team=team, name=name)
    server.enabled = _check_enabled(data.get("enabled", True))
    server.tools = check_globs(data.get("tools"))
    server.created_by = actor.get_username()
    if TeamMcpServer.objects.filter(team=team, name=name).exists():
        raise _exists(name)
    if TeamMcpServer.objects.filter(team=team).count() >= MAX_SERVERS_PER_TEAM:
        raise ValidationFailed(f"a team has at most {MAX_SERVERS_PER_TEAM} MCP servers", code="too_many_servers")
    _discover_into(server, TeamMcpServer.SAVED)  # outside any transaction: it may take seconds
    try:
        with transaction.atomic():
            server.save()
    except IntegrityError:
        raise _exists(name) from None
    return server


def _exists(name: str) -> SectrError:
    return SectrError(f"the team already has an MCP server named {name!r}", code="mcp_server_exists", status=409)


def do_update_server(actor: Any, team_name: Any, name: Any, data: Any) -> TeamMcpServer:
    """Change a server's settings (a header set given replaces the whole set; left out,
    the stored one is kept), then discover its tools again."""
    team = moderated_team(actor, team_name, "its MCP servers")
    server = _server_of(team, name)
    if not isinstance(data, dict):
        raise ValidationFailed("expected a JSON object", code="invalid_body")
    _unknown(data, HTTP_FIELDS if server.url else STDIO_FIELDS)
    if "name" in data and data["name"] != server.name:
        raise ValidationFailed("a server's name cannot change (its tools are named after it)", code="invalid_name")
    if server.url:
        if "url" in data:
            url = check_server_url(data["url"])
            if _origin(url) != _origin(server.url) and server.header_names and "headers" not in data:
                # Stored secrets never follow a server to another origin unasked: whoever
                # moves it types them again.
                raise ValidationFailed(
                    "the url points to another host: enter the headers again (or an empty set)",
                    code="headers_required",
                )
            server.url = url
        if "headers" in data:
            headers = check_headers(data["headers"] or {})
            server.headers_sealed, server.header_names = seal(headers), sorted(headers)
        if "timeout_s" in data:
            server.timeout_s = check_timeout(data["timeout_s"])
    if "enabled" in data:
        server.enabled = _check_enabled(data["enabled"])
    if "tools" in data:
        server.tools = check_globs(data["tools"])
    server.updated_at = timezone.now()
    _discover_into(server, TeamMcpServer.SAVED)
    server.save()
    return server


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    return parts.scheme, (parts.hostname or "").lower(), parts.port


def do_refresh_server(actor: Any, team_name: Any, name: Any) -> TeamMcpServer:
    team = moderated_team(actor, team_name, "its MCP servers")
    server = _server_of(team, name)
    _discover_into(server, TeamMcpServer.REFRESH)
    server.save(
        update_fields=[
            "discovered",
            "protocol_version",
            "health",
            "last_error",
            "refreshed_at",
            "discovery_reason",
            "tools_fresh_until",
        ],
    )
    return server


def do_delete_server(actor: Any, team_name: Any, name: Any) -> None:
    """Delete a team's server, or disable an installation server for the team."""
    team = moderated_team(actor, team_name, "its MCP servers")
    _server_of(team, name).delete()
