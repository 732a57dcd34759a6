"""A stdio MCP server (on the `mcp` package's own server) with one slow tool that is not
idempotent: it appends a line (with the call's idempotency key from `_meta`) to the file
named by MCP_SIDE_EFFECT_FILE, then sleeps long enough for a test to `kill -9` the
worker calling it. Running it twice would leave two lines; no published server shows
that, which is why the crash test uses this one."""

from __future__ import annotations

import asyncio
import os

from mcp.server.mcpserver import Context, MCPServer
from mcp.types import ToolAnnotations

server = MCPServer("slow-side-effect")


@server.tool(annotations=ToolAnnotations(destructive_hint=False))
async def append_line(text: str, ctx: Context) -> str:
    """Append a line to the side-effect file, then take a while."""
    key = (ctx.request_context.meta or {}).get("sectr/idempotency_key")
    with open(os.environ["MCP_SIDE_EFFECT_FILE"], "a", encoding="utf-8") as file:
        file.write(f"{key} {text}\n")
        file.flush()
        os.fsync(file.fileno())
    await asyncio.sleep(float(os.environ.get("MCP_SIDE_EFFECT_SLEEP", "60")))
    return f"appended {text}"


if __name__ == "__main__":
    server.run("stdio")
