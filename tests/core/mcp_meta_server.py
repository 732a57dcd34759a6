"""A stdio MCP server (on the `mcp` package's own server) whose one tool answers with the
`_meta` its call carried: the tests check what Sectr sends, which no published server shows."""

from __future__ import annotations

import json

from mcp.server.mcpserver import Context, MCPServer
from mcp.types import ToolAnnotations

server = MCPServer("meta-echo")


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
async def show_meta(ctx: Context) -> str:
    """Answer with this call's _meta."""
    return json.dumps(dict(ctx.request_context.meta or {}), default=str)


if __name__ == "__main__":
    server.run("stdio")
