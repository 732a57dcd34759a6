"""Sectr as the approval service of other agents: the MCP endpoint `/mcp` and its tool
`approval_prompt` (docs/approval-service.md).

`asks` turns a call into an ask in a session of the caller (database code, run in the
journal's threads), `relay` is the handler that closes a decided ask's call in the
journal, `server` is the MCP server (the official `mcp` package's) and its ASGI app.
"""
