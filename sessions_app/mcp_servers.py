"""A team's MCP servers as the workers and the pages use them (docs/mcp.md).

- **Installation servers** (stdio commands) come from the operator's file
  (SECTR_MCP_SERVERS: ``{name: {command, args, env, cwd}}``) and from staff's
  `InstallationMcpServer` rows; the file wins on a shared name. A team enables one by
  name (a `TeamMcpServer` without a url).
- **Discovery** (`discover_now`) connects once, lists the tools, closes: on save and on
  Refresh. What it found is stored on the row and is what the workers offer, so a run
  never waits on a server to start before its first model call. A worker discovers
  again, on its own connection and in the background, when a server says its tools
  changed (`notifications/tools/list_changed`) or when a run needs tools after the
  server's cache hint ran out (`tools_fresh_until`), and stores what it found the same
  way (`rediscover`).
- **The worker** (`team_mcp_tools`, through the runtime's `extra_tools`): the tools of the
  session's team's enabled servers that its agent's `tools` select, bound to this
  process's `McpPool` (one connection per server, reused across runs, restarted with
  backoff, closed when the worker drains: `close_worker_pool`). Calls are counted per
  server on /metrics; a server found down marks the row's health. The images and audio
  of results are stored as the session's media (sessions_app.media.store_tool_media).

Header values are secrets: they are unsealed only to build a connection's config, whose
`repr` leaves them out, and never logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import json
import logging
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.db import connection
from django.utils import timezone

from sectr.agents import AgentSpec
from sectr.errors import ValidationFailed
from sectr.mcp import McpPool, McpServer, McpToolError, ServerConfig, gates_from_annotations, tool_name
from sectr.tools import SchemaTool, Tool
from sessions_app.addresses import AddressRefused, check_public_host
from sessions_app.dbthread import run_in_db_thread
from sessions_app.media import store_tool_media
from sessions_app.models import InstallationMcpServer, Session, Team, TeamMcpServer
from sessions_app.plain_sql import model_columns, model_instances
from sessions_app.sealed import SealBroken, unseal
from sessions_app.telemetry.metrics import MCP_CALL_SECONDS, MCP_CALLS, MCP_ERRORS

log = logging.getLogger("sectr.mcp")

#: How long discovery (start, agree on a protocol, list every page) may take on a save.
DISCOVERY_SECONDS = 30.0
#: A team server's host passes the address guard again after this long (DNS may change).
GUARD_SECONDS = 300.0
#: A worker that starts a re-discovery because a server's cache hint ran out claims it
#: for this long: other workers leave it alone, and one that failed is tried again after.
REDISCOVERY_CLAIM_SECONDS = 30.0


# ---- installation servers ----

_file_cache: dict[str, Any] = {}


def installation_file_servers() -> dict[str, ServerConfig]:
    """The operator's file, read again when it changes; {} (and an error in the log) for
    a file that is missing or wrong."""
    path = settings.SECTR_MCP_SERVERS
    if not path:
        return {}
    try:
        stamp = Path(path).stat().st_mtime_ns
    except OSError as exc:
        log.error("SECTR_MCP_SERVERS: cannot read %s: %s", path, exc)
        return {}
    if _file_cache.get("key") == (path, stamp):
        return dict(_file_cache["servers"])
    try:
        from sectr.mcp import server_configs_from_json

        data = json.loads(Path(path).read_text(encoding="utf-8"))
        servers = server_configs_from_json(
            data,
            max_result_bytes=settings.SECTR_MCP_MAX_RESULT_BYTES,
            max_media_bytes=settings.SECTR_MCP_MAX_MEDIA_BYTES,
        )
    except (OSError, ValueError) as exc:
        log.error("SECTR_MCP_SERVERS: %s is not a valid MCP servers file: %s", path, exc)
        servers = {}
    _file_cache.update(key=(path, stamp), servers=servers)
    return dict(servers)


def installation_servers() -> dict[str, ServerConfig]:
    """Every installation-wide stdio server by name: staff's rows, then the file's."""
    servers: dict[str, ServerConfig] = {}
    for row in InstallationMcpServer.objects.order_by("name"):
        try:
            servers[row.name] = ServerConfig(
                name=row.name,
                command=row.command,
                args=[str(a) for a in row.args or ()],
                env={str(k): str(v) for k, v in (row.env or {}).items()} or None,
                cwd=row.cwd or None,
                timeout_s=row.timeout_s,
                max_result_bytes=settings.SECTR_MCP_MAX_RESULT_BYTES,
                max_media_bytes=settings.SECTR_MCP_MAX_MEDIA_BYTES,
            )
        except ValueError as exc:
            log.error("installation MCP server %s is not usable: %s", row.name, exc)
    servers.update(installation_file_servers())
    return servers


# ---- addresses and configs ----


def check_server_url(url: Any) -> str:
    """A team server's URL: http(s), with a host that is public or allowed by the
    operator (SECTR_MCP_ALLOWED_HOSTS); ValidationFailed (invalid_url) otherwise."""
    if not isinstance(url, str) or not url or len(url) > 2000:
        raise ValidationFailed("url must be an http(s) URL of at most 2000 characters", code="invalid_url")
    try:
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise ValidationFailed("url is not a valid URL", code="invalid_url") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValidationFailed("url must be an http(s) URL with a host", code="invalid_url")
    if parts.username or parts.password:
        raise ValidationFailed("put credentials in headers, not in the url", code="invalid_url")
    try:
        check_public_host(parts.hostname, port, settings.SECTR_MCP_ALLOWED_HOSTS)
    except AddressRefused as exc:
        raise ValidationFailed(
            f"url refused: {exc.message} (an operator may allow it in SECTR_MCP_ALLOWED_HOSTS)", code="invalid_url"
        ) from None
    return url


def connect_addresses(host: str, port: int) -> list[str]:
    """The addresses a connection to a team server's host may use: resolved once here
    and each checked (the guard of `check_server_url`), the `connect_guard` of every team
    server's config. The client connects to one of them and never resolves the name
    again, so a name that answers the save's check with a public address cannot send the
    connection to an internal one later (DNS rebinding). AddressRefused otherwise."""
    return [str(address) for address in check_public_host(host, port, settings.SECTR_MCP_ALLOWED_HOSTS)]


def server_config(row: TeamMcpServer, installation: Mapping[str, ServerConfig] | None = None) -> ServerConfig:
    """The connection config of a team's server. LookupError for an installation server
    that is gone; SealBroken for headers that cannot be read."""
    if row.url:
        return ServerConfig(
            name=row.name,
            url=row.url,
            headers=unseal(row.headers_sealed),
            timeout_s=row.timeout_s,
            max_result_bytes=settings.SECTR_MCP_MAX_RESULT_BYTES,
            max_media_bytes=settings.SECTR_MCP_MAX_MEDIA_BYTES,
            connect_guard=connect_addresses,
        )
    servers = installation_servers() if installation is None else installation
    config = servers.get(row.name)
    if config is None:
        raise LookupError(f"the installation has no MCP server named {row.name!r} any more")
    return config


def pool_key(team_name: str, row: TeamMcpServer) -> str:
    """A connection's key in a worker's pool: an installation server has one connection
    per worker whichever teams enabled it; a team's server is its team's."""
    return f"{team_name}/{row.name}" if row.url else row.name


# ---- discovery ----


@dataclass(frozen=True)
class Discovery:
    tools: list[dict[str, Any]]
    protocol_version: str | None
    error: str | None
    #: The server's cache hint for the list, in seconds (None: it gave none).
    ttl_s: float | None = None


def tools_json(listed: Sequence[Any]) -> list[dict[str, Any]]:
    """The `mcp` package's Tool objects as stored on a row (the server's own JSON)."""
    return [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in listed]


def fresh_until(ttl_s: float | None, discovered_at: datetime) -> datetime | None:
    """When a discovery stops being fresh, by the server's cache hint (None: no hint)."""
    return discovered_at + timedelta(seconds=ttl_s) if ttl_s else None


async def _discover(config: ServerConfig) -> Discovery:
    async with McpServer(replace(config, connect_timeout_s=min(config.connect_timeout_s, DISCOVERY_SECONDS))) as server:
        listed = await server.list_tools()
        return Discovery(tools_json(listed), server.protocol_version, None, server.tools_ttl_s)


def discover_now(config: ServerConfig) -> Discovery:
    """Connect, list the server's tools, close: from sync code (an action). Never raises:
    a server that cannot be reached is a Discovery with its error."""
    outcome: list[Discovery] = []

    def work() -> None:
        try:
            outcome.append(asyncio.run(asyncio.wait_for(_discover(config), DISCOVERY_SECONDS + 5)))
        except McpToolError as exc:
            outcome.append(Discovery([], None, str(exc)))
        except Exception as exc:  # noqa: BLE001 - shown to the moderator as the server's last error
            outcome.append(Discovery([], None, f"MCP server {config.name}: discovery failed: {type(exc).__name__}"))

    # A thread of its own: the caller may be on an event loop's thread (asyncio.run refuses).
    thread = threading.Thread(target=work, name=f"mcp-discover-{config.name}", daemon=True)
    thread.start()
    thread.join(DISCOVERY_SECONDS + 10)
    return outcome[0] if outcome else Discovery([], None, f"MCP server {config.name}: discovery did not finish")


def globs_offer(globs: Sequence[str] | None, tool: str) -> bool:
    """Whether a server's tool globs (None: all) offer one of its tools (its own name)."""
    return globs is None or any(fnmatch.fnmatchcase(tool, pattern) for pattern in globs)


def gate_words(gates: Mapping[str, bool]) -> str:
    return "asks" if gates["gated"] else "runs without asking"


def described_tools(row: TeamMcpServer) -> list[dict[str, Any]]:
    """The row's discovered tools as the page and the API show them: the model's name,
    the server's, the gate and whether the row's globs offer it."""
    from mcp import Tool as WireTool

    listed = []
    for data in row.discovered or ():
        try:
            wire = WireTool.model_validate(data)
        except ValueError:
            continue
        gates = gates_from_annotations(wire.annotations)
        offered = globs_offer(row.tools, wire.name)
        listed.append(
            {
                "name": tool_name(row.name, wire.name),
                "tool": wire.name,
                "description": wire.description or "",
                "gate": gate_words(gates),
                "read_only": not gates["gated"],
                "mutating": gates["mutating"],
                "idempotent": gates["idempotent"],
                "offered": offered,
                "input_schema": dict(wire.input_schema or {}),
            }
        )
    return listed


def discovered_input_schema(session_id: str, name: str) -> dict[str, Any] | None:
    """The input schema of the MCP tool the model knows as `name` (``<server>__<tool>``)
    among the session's team's enabled servers, as their last discovery stored it; None
    when no server of the team has a tool of that name."""
    from mcp import Tool as WireTool

    if "__" not in name:
        return None
    for row in TeamMcpServer.objects.filter(team__sessions__pk=session_id, enabled=True).order_by("name"):
        for data in row.discovered or ():
            if tool_name(row.name, str(data.get("name"))) != name:
                continue
            try:
                wire = WireTool.model_validate(data)
            except ValueError:
                return None
            return dict(wire.input_schema or {})
    return None


#: At most this many of an edit's schema violations are named in the refusal.
MAX_SCHEMA_PROBLEMS = 5


def check_edited_mcp_arguments(session_id: str, name: str, arguments: dict[str, Any]) -> bool:
    """Arguments a person edited on the ask of an MCP tool, checked against the tool's
    input JSON Schema (the `jsonschema` package, the dialect the schema names, else 2020-12,
    MCP's): ValidationFailed (invalid_arguments) naming where and what is wrong. True when
    `name` is one of the team's MCP tools (checked), False otherwise. A schema that is
    itself invalid, or refers to documents elsewhere, cannot judge anything: the server
    does, when the call runs."""
    import jsonschema
    import referencing.exceptions

    schema = discovered_input_schema(session_id, name)
    if schema is None:
        return False
    schema.setdefault("type", "object")
    validator_class = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        validator_class.check_schema(schema)
        errors = sorted(
            validator_class(schema).iter_errors(arguments), key=lambda error: [str(p) for p in error.absolute_path]
        )
    except (jsonschema.SchemaError, referencing.exceptions.Unresolvable) as exc:
        log.warning("MCP tool %s: its input schema cannot check edited arguments: %s", name, type(exc).__name__)
        return True
    if errors:
        problems = [f"{error.json_path}: {error.message}" for error in errors[:MAX_SCHEMA_PROBLEMS]]
        if len(errors) > MAX_SCHEMA_PROBLEMS:
            problems.append(f"and {len(errors) - MAX_SCHEMA_PROBLEMS} more")
        raise ValidationFailed(
            f"the edited arguments do not fit the tool's input schema: {'; '.join(problems)}",
            code="invalid_arguments",
        )
    return True


def picker_tools(team_id: int) -> list[Tool]:
    """The tools of a team's enabled servers, from their last discovery, as the agent
    form's tool picker lists them (name and gate). Stand-ins: they never run (a run gets
    its MCP tools from the worker's connections)."""
    from mcp import Tool as WireTool

    def never(arguments: dict[str, Any], context: Any = None) -> str:
        raise RuntimeError("a stand-in of the agent form")

    listed: list[Tool] = []
    for row in TeamMcpServer.objects.filter(team_id=team_id, enabled=True).order_by("name"):
        for data in row.discovered or ():
            try:
                wire = WireTool.model_validate(data)
            except ValueError:
                continue
            if not globs_offer(row.tools, wire.name):
                continue
            tool = SchemaTool(
                never,
                name=tool_name(row.name, wire.name),
                description=wire.description or wire.name,
                parameters=dict(wire.input_schema or {}),
                **gates_from_annotations(wire.annotations),
            )
            tool.mcp_server = row.name
            listed.append(tool)
    return listed


# ---- the worker ----


@dataclass(frozen=True)
class _Usable:
    key: str
    team_id: int
    name: str
    config: ServerConfig
    discovered: list[dict[str, Any]]
    globs: tuple[str, ...] | None
    stamp: str
    fresh_until: datetime | None


_guarded: dict[str, float] = {}


def _guard_passes(url: str) -> bool:
    """The address guard again at run time (DNS may have changed since the save), at most
    once per GUARD_SECONDS per URL."""
    now = time.monotonic()
    if now - _guarded.get(url, -GUARD_SECONDS) < GUARD_SECONDS:
        return True
    try:
        check_server_url(url)
    except ValidationFailed as exc:
        log.warning("MCP server %s: %s", url, exc.message)
        _guarded.pop(url, None)
        return False
    _guarded[url] = now
    return True


def _enabled_rows(session_id: str) -> list[tuple[TeamMcpServer, str]]:
    """The enabled servers of the session's team, by name, each with its team's name.

    One plain statement: every run start of an agent with tools asks, nearly always to
    find none, and the queryset's compilation cost ten times the indexed read."""
    qn = connection.ops.quote_name
    server, team, session = (qn(m._meta.db_table) for m in (TeamMcpServer, Team, Session))
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {model_columns(connection, TeamMcpServer, 'm')}, t.name FROM {server} m"  # noqa: S608 - quoted names
            f" JOIN {team} t ON t.id = m.team_id JOIN {session} s ON s.team_id = m.team_id"
            " WHERE s.id = %s AND m.enabled = %s ORDER BY m.name",
            [session_id, True],
        )
        rows = cursor.fetchall()
    return list(zip(model_instances(connection, TeamMcpServer, rows), (row[-1] for row in rows), strict=True))


def _usable_servers(session_id: str) -> list[_Usable]:
    # Here, in a database thread, not on the worker's loop: the first import of the `mcp`
    # package takes seconds on a busy machine, and the loop must keep heartbeating.
    import mcp  # noqa: F401

    rows = _enabled_rows(session_id)
    installation = installation_servers() if any(not row.url for row, _team in rows) else {}
    usable = []
    for row, team_name in rows:
        try:
            config = server_config(row, installation)
        except (LookupError, SealBroken) as exc:
            log.warning("MCP server %s of team %s is not usable: %s", row.name, team_name, exc)
            continue
        if row.url and not _guard_passes(row.url):
            continue
        stamp = row.refreshed_at.isoformat() if row.refreshed_at else ""
        globs = tuple(row.tools) if row.tools is not None else None
        usable.append(
            _Usable(
                pool_key(team_name, row),
                row.team_id,
                row.name,
                config,
                list(row.discovered),
                globs,
                stamp,
                row.tools_fresh_until,
            )
        )
    return usable


_pools: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, McpPool] = weakref.WeakKeyDictionary()
#: The tools built for a connection from a row's discovery, by connection: (stamp, globs, tools).
_built: weakref.WeakKeyDictionary[McpServer, tuple[str, tuple[str, ...] | None, list[SchemaTool]]] = (
    weakref.WeakKeyDictionary()
)
#: Where each pool key's health is written (team id, server name), and what was written last.
_rows: dict[str, tuple[int, str]] = {}
_health: dict[str, str] = {}


def _count_call(key: str, tool: str, seconds: float, error: McpToolError | None) -> None:
    MCP_CALLS.labels(server=key).inc()
    MCP_CALL_SECONDS.labels(server=key).observe(seconds)
    if error is not None:
        MCP_ERRORS.labels(server=key).inc()
    message = str(error) if error is not None else ""
    # "The server is down" is the server's health; a tool's own error result is not.
    down = " is unreachable" in message or " is down" in message or " timed out after " in message
    health = TeamMcpServer.ERROR if down else TeamMcpServer.OK
    if _health.get(key) != health and key in _rows:
        _health[key] = health
        with contextlib.suppress(RuntimeError):
            asyncio.get_running_loop().create_task(_write_health(key, health, message if down else ""))


def _rows_of(key: str) -> Any:
    """The rows a pool key's connection serves (a QuerySet)."""
    team_id, name = _rows[key]
    rows = TeamMcpServer.objects.filter(name=name, enabled=True)
    # An installation server's connection is shared: what it says is every enabling team's.
    return rows.filter(url="") if "/" not in key else rows.filter(team_id=team_id).exclude(url="")


async def _write_health(key: str, health: str, error: str) -> None:
    rows = _rows_of(key)
    try:
        await run_in_db_thread(lambda: rows.update(health=health, last_error=error[:2000]))
    except Exception:  # noqa: BLE001 - the health display is not worth a failed run
        log.warning("MCP server %s: could not record its health", key, exc_info=True)


# ---- re-discovery in the worker ----

#: The re-discovery running for each pool key (one at a time per server in a worker), and
#: the keys whose server said its tools changed again while it ran.
_rediscovering: dict[str, asyncio.Task[None]] = {}
_again: set[str] = set()


def _tools_changed(key: str) -> None:
    """A pool's listener: the server of `key` said its tools changed."""
    if key in _rows:
        rediscover(key, TeamMcpServer.CHANGED)


def rediscover(key: str, reason: str) -> None:
    """Discover the tools of `key` again on this worker's connection, in the background,
    and store them on its rows as the Refresh button does, with `reason` (changed, or
    expired). One at a time per server: a change notification during a re-discovery runs
    one more after it (its list may predate the change); an expiry then is already served.
    Never raises, never waits."""
    running = _rediscovering.get(key)
    if running is not None and not running.done():
        if reason == TeamMcpServer.CHANGED:
            _again.add(key)
        return
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return
    _rediscovering[key] = loop.create_task(_rediscover(key, reason), name=f"mcp-rediscover:{key}")


async def _rediscover(key: str, reason: str) -> None:
    try:
        while True:
            _again.discard(key)
            await _rediscover_once(key, reason)
            if key not in _again:
                return
            reason = TeamMcpServer.CHANGED
    except Exception:  # noqa: BLE001 - the stored tools stay; the next change or expiry tries again
        log.warning("MCP server %s: re-discovery failed", key, exc_info=True)
    finally:
        if _rediscovering.get(key) is asyncio.current_task():
            del _rediscovering[key]


async def _rediscover_once(key: str, reason: str) -> None:
    server = worker_pool().current(key)
    if server is None:
        return
    if reason == TeamMcpServer.EXPIRED and not await run_in_db_thread(_claim_expired, key):
        return  # another worker is on it, or it was discovered again meanwhile
    try:
        listed = await server.list_tools()
    except McpToolError as exc:
        log.warning("MCP server %s: re-discovery (%s) failed: %s", key, reason, exc)
        return
    tools = tools_json(listed)
    ttl_s, protocol = server.tools_ttl_s, server.protocol_version or ""

    def store() -> int:
        now = timezone.now()
        return int(
            _rows_of(key).update(
                discovered=tools,
                protocol_version=protocol,
                refreshed_at=now,
                discovery_reason=reason,
                tools_fresh_until=fresh_until(ttl_s, now),
                health=TeamMcpServer.OK,
                last_error="",
            )
        )

    stored = await run_in_db_thread(store)
    _health[key] = TeamMcpServer.OK
    log.info("MCP server %s: %d tools discovered again (%s), stored on %d rows", key, len(tools), reason, stored)


def _claim_expired(key: str) -> bool:
    """Take the re-discovery of an expired server: its rows' `tools_fresh_until` moves
    a claim's length ahead, so other workers (and this one, should it fail) leave it
    until then. False when no row of it is expired any more."""
    now = timezone.now()
    claimed = (
        _rows_of(key)
        .filter(tools_fresh_until__lte=now)
        .update(tools_fresh_until=now + timedelta(seconds=REDISCOVERY_CLAIM_SECONDS))
    )
    return bool(claimed)


def worker_pool() -> McpPool:
    """This event loop's pool of MCP connections (a worker's; tests run several loops)."""
    loop = asyncio.get_running_loop()
    pool = _pools.get(loop)
    if pool is None:
        pool = _pools[loop] = McpPool(
            on_call=_count_call, on_tools_changed=_tools_changed, store_media=store_tool_media
        )
    return pool


async def close_worker_pool() -> None:
    """Close this loop's connections (stop its stdio servers): the worker drains."""
    pool = _pools.pop(asyncio.get_running_loop(), None)
    if pool is not None:
        await pool.close()


def _tools_of(server: McpServer, usable: _Usable) -> list[SchemaTool]:
    built = _built.get(server)
    if built is not None and built[0] == usable.stamp and built[1] == usable.globs:
        return built[2]
    tools = []
    for data in usable.discovered:
        if not globs_offer(usable.globs, str(data.get("name"))):
            continue
        try:
            tools.append(server.make_tool(data))
        except ValueError as exc:
            log.warning("MCP server %s: tool %s skipped: %s", usable.key, data.get("name"), exc)
    _built[server] = (usable.stamp, usable.globs, tools)
    return tools


async def team_mcp_tools(session_id: str, agent: AgentSpec) -> list[Tool]:
    """The MCP tools of the session's team that `agent` selects (none for an agent
    without a `tools` list: the built-in agent offers none). sessions_app.runtime's
    `session_mcp_tools` (the runtime's `extra_tools`) calls this."""
    if agent.tools is None or not session_id:
        return []
    usable = await run_in_db_thread(_usable_servers, session_id)
    if not usable:
        return []
    pool = worker_pool()
    offered: list[Tool] = []
    now = timezone.now()
    for entry in usable:
        _rows[entry.key] = (entry.team_id, entry.name)
        server = pool.server(entry.key, entry.config)
        # This run gets the stored tools; newer ones are for the runs after the
        # re-discovery has stored them.
        offered.extend(t for t in _tools_of(server, entry) if agent.offers(t.name))
        if entry.fresh_until is not None and entry.fresh_until <= now:
            rediscover(entry.key, TeamMcpServer.EXPIRED)
    return offered
