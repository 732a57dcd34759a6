"""The real `mcp` clients the approval service's tests drive: 2.x (in the project's venv;
the stateless 2026-07-28 revision) in process, and 1.x (in var/mcp1-venv, made by
scripts/ensure_mcp1_client.sh; the session-based 2025-11-25 revision) through
`mcp1_client.py` in a subprocess."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
MCP1_PYTHON = ROOT / "var" / "mcp1-venv" / "bin" / "python"
MCP1_SCRIPT = Path(__file__).with_name("mcp1_client.py")
STATELESS = "2026-07-28"


@dataclass
class Answer:
    """What `approval_prompt` answered: the JSON of its one text content."""

    data: dict[str, Any]
    is_error: bool = False
    progress: list[float] = field(default_factory=list)
    protocol_version: str | None = None

    @property
    def behavior(self) -> str | None:
        return self.data.get("behavior")


async def call_v2(
    url: str,
    token: str,
    arguments: dict[str, Any],
    *,
    client_name: str = "claude-code",
    meta: dict[str, Any] | None = None,
    progress: bool = False,
    timeout: float = 120.0,
) -> Answer:
    """One `approval_prompt` call with the 2.x client, forced to the stateless revision."""
    from mcp import Client, Implementation
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    seen: list[float] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append(progress)

    http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"}, timeout=None)
    async with Client(
        streamable_http_client(url, http_client=http),
        mode=STATELESS,
        client_info=Implementation(name=client_name, version="2.0.0"),
    ) as client:
        async with asyncio.timeout(timeout):
            result = await client.call_tool(
                "approval_prompt",
                arguments,
                progress_callback=on_progress if progress else None,
                meta=meta,  # type: ignore[arg-type]
            )
        version = client.protocol_version
    text = result.content[0].text if result.content else "{}"  # type: ignore[union-attr]
    return Answer(json.loads(text), bool(result.is_error), seen, version)


async def list_tools_v2(url: str, token: str) -> list[Any]:
    from mcp import Client, Implementation
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    async with Client(
        streamable_http_client(url, http_client=http), mode=STATELESS, client_info=Implementation(name="t", version="1")
    ) as client:
        return list((await client.list_tools()).tools)


def start_v1(url: str, token: str, calls: list[dict[str, Any]], *, progress: bool = False) -> subprocess.Popen[str]:
    """The 1.x client in a subprocess: one MCP session making `calls` one after another;
    `finish_v1` reads its answers."""
    request = {"url": url, "token": token, "calls": calls, "progress": progress}
    proc = subprocess.Popen(  # noqa: S603 - our own script, the pinned client
        [str(MCP1_PYTHON), str(MCP1_SCRIPT), json.dumps(request)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": ""},
    )
    return proc


def finish_v1(proc: subprocess.Popen[str], timeout: float = 120.0) -> list[Answer]:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"the 1.x client did not finish:\n{err[-3000:]}") from None
    if proc.returncode != 0:
        raise AssertionError(f"the 1.x client failed ({proc.returncode}):\n{err[-3000:]}")
    answers = []
    for line in out.splitlines():
        row = json.loads(line)
        answers.append(Answer(row["data"], row["is_error"], row["progress"], row["protocol_version"]))
    return answers


def call_v1(
    url: str, token: str, *calls: dict[str, Any], progress: bool = False, timeout: float = 120.0
) -> list[Answer]:
    return finish_v1(start_v1(url, token, list(calls), progress=progress), timeout)
