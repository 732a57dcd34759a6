"""Run by var/mcp1-venv's Python (the `mcp` package 1.x, pinned by
scripts/ensure_mcp1_client.sh): one MCP session (initialize, Mcp-Session-Id) making the
`approval_prompt` calls it reads from its argument ({"url", "token", "calls", "progress"}),
printing one JSON line per answer."""

import asyncio
import json
import sys
from datetime import timedelta

from mcp import ClientSession
from mcp.client.streamable_http import streamablehttp_client
from mcp.types import Implementation


async def main() -> None:
    request = json.loads(sys.argv[1])
    headers = {"Authorization": f"Bearer {request['token']}"}
    async with streamablehttp_client(request["url"], headers=headers, timeout=30, sse_read_timeout=600) as (
        read,
        write,
        _session_id,
    ):
        async with ClientSession(
            read, write, client_info=Implementation(name="claude-code-v1", version="1.30.0")
        ) as session:
            init = await session.initialize()
            for arguments in request["calls"]:
                seen = []

                async def on_progress(value, total, message, seen=seen):
                    seen.append(value)

                result = await session.call_tool(
                    "approval_prompt",
                    arguments,
                    read_timeout_seconds=timedelta(seconds=600),
                    progress_callback=on_progress if request.get("progress") else None,
                )
                text = result.content[0].text if result.content else "{}"
                row = {
                    "data": json.loads(text),
                    "is_error": bool(result.isError),
                    "progress": seen,
                    "protocol_version": str(init.protocolVersion),
                }
                print(json.dumps(row), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
