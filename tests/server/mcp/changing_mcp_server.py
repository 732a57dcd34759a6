"""A stdio MCP server (on the `mcp` package's own server) whose tool list changes: calling
`grow` adds a tool `extra_<n>` (read-only, it answers "extra <n>"), calling `shrink`
removes the newest one; each change then tells the client so (unless `shrink` is asked
to do it quietly).

`CHANGING_MCP_ERA` picks the protocol revision it speaks:

- ``legacy`` (the session-based 2025-11-25 revision only): a change sends
  `notifications/tools/list_changed` on the connection, as a TypeScript SDK 1.x server
  would. The `mcp` package's servers answer both revisions, choosing by the client's
  first request, so this one serves the handshake loop directly.
- ``modern`` (the default; the stateless 2026-07-28 revision): a change is an event on
  the `subscriptions/listen` streams clients keep open (it declares the `tools`
  capability's `listChanged`), unless `CHANGING_MCP_LISTEN=0`, which serves no such
  stream and declares nothing; `tools/list` carries a cache hint of
  `CHANGING_MCP_TTL_MS` milliseconds (0: none).

It speaks stdio, or Streamable HTTP at `http://127.0.0.1:<CHANGING_MCP_HTTP_PORT>/mcp`
when that is set (at the stateless revision: no session, each request on its own).

No published server changes its tools on request, which is why the tool-list tests use
this one.
"""

from __future__ import annotations

import os

import anyio
from mcp.server.caching import CacheHint
from mcp.server.mcpserver import Context, MCPServer
from mcp.types import ToolAnnotations

ERA = os.environ.get("CHANGING_MCP_ERA", "modern")
TTL_MS = int(os.environ.get("CHANGING_MCP_TTL_MS", "0"))
LISTEN = os.environ.get("CHANGING_MCP_LISTEN", "1") != "0"
HTTP_PORT = int(os.environ.get("CHANGING_MCP_HTTP_PORT", "0"))

server = MCPServer(
    "changing",
    cache_hints={"tools/list": CacheHint(ttl_ms=TTL_MS)} if TTL_MS else None,
    subscriptions=None if LISTEN else False,
)
added: list[str] = []


async def _changed(ctx: Context) -> None:
    if ctx.protocol_version in (None, "") or not ctx.protocol_version.startswith("2026"):
        await ctx.session.send_tool_list_changed()
    else:
        await ctx.notify_tools_changed()


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
async def grow(ctx: Context) -> str:
    """Add a tool extra_<n> to this server's list."""
    name = f"extra_{len(added) + 1}"

    def extra() -> str:
        return f"extra {name.removeprefix('extra_')}"

    server.add_tool(
        extra,
        name=name,
        description=f"A tool added by grow ({name}).",
        annotations=ToolAnnotations(read_only_hint=True),
    )
    added.append(name)
    await _changed(ctx)
    return f"added {name}"


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
async def shrink(ctx: Context, quietly: bool = False) -> str:
    """Remove the newest extra_<n> tool (without telling the client, if `quietly`)."""
    if not added:
        return "nothing to remove"
    name = added.pop()
    server.remove_tool(name)
    if not quietly:
        await _changed(ctx)
    return f"removed {name}"


async def _serve_legacy() -> None:
    # The handshake era's loop only: `server/discover` is refused, so the client falls
    # back to `initialize` and the connection stays session-based.
    from mcp.server.runner import _serve_legacy_stream
    from mcp.server.stdio import stdio_server

    low = server._lowlevel_server
    async with stdio_server() as (read, write), low.lifespan(low) as state:
        await _serve_legacy_stream(
            low,
            read,
            write,
            lifespan_state=state,
            session_id=None,
            init_options=low.create_initialization_options(),
            raise_exceptions=False,
        )


if __name__ == "__main__":
    if ERA == "legacy":
        anyio.run(_serve_legacy)
    elif HTTP_PORT:
        server.run("streamable-http", host="127.0.0.1", port=HTTP_PORT, stateless_http=True)
    else:
        server.run("stdio")
