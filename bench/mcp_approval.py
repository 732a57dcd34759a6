"""The approval service (/mcp) under measure. Run: .venv/bin/python bench/mcp_approval.py [N] [W]

Starts a live Sectr (Daphne and its worker, as tests/liveserver.py does: SQLite, or
PostgreSQL and Redis when DATABASE_URL and REDIS_URL name them) and, with the `mcp`
package's 2.x client on the stateless revision (one HTTP request a call):

1. N calls (default 200) of `approval_prompt` that a team rule allows, one after another,
   timed at the client, beside N `tools/list` requests on the same client (the same
   transport, authentication and MCP layer, and no ask): the difference of their
   p50/p99 is what deciding by rule adds (the ask's session, the journal, the audit).
2. W calls (default 50) left waiting for a person at once: the server process's threads
   and resident memory before (after a warm-up) and while they wait, and the memory per
   waiting call. Then a moderator denies them all and every call must answer deny.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.server.mcp_approval import test_approval_service as live_tests  # noqa: E402
from tests.server.mcp_approval.mcp_clients import STATELESS  # noqa: E402


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


async def timed_calls(url: str, token: str, n: int) -> tuple[list[float], list[float]]:
    from mcp import Client, Implementation
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    calls: list[float] = []
    lists: list[float] = []
    async with Client(
        streamable_http_client(url, http_client=http),
        mode=STATELESS,
        client_info=Implementation(name="bench", version="1"),
    ) as client:
        for i in range(n + 10):  # the first 10 of each warm up
            started = time.perf_counter()
            await client.list_tools()
            listed = time.perf_counter()
            result = await client.call_tool("approval_prompt", {"tool_name": "BenchRead", "input": {"i": i}})
            done = time.perf_counter()
            assert '"allow"' in result.content[0].text, result  # type: ignore[union-attr]
            if i >= 10:
                lists.append(listed - started)
                calls.append(done - listed)
    return calls, lists


def main(n: int, waiting: int) -> None:
    live = live_tests.start_server()
    try:
        url, alice = live_tests.mcp_url(live), live_tests.token(live, "alice")
        rule = live_tests.api(live, "carol", "POST", "/teams/ops/rules", json={"tool": "BenchRead", "action": "allow"})
        assert rule.status_code == 201, rule.text
        calls, lists = asyncio.run(timed_calls(url, alice, n))
        database = "PostgreSQL + Redis" if live.postgres else "SQLite"
        print(f"{database}; {n} calls each, one after another")
        print(f"  approval_prompt decided by a rule: p50 {pct(calls, 0.5):.1f} ms  p99 {pct(calls, 0.99):.1f} ms")
        print(f"  tools/list (the MCP round trip):   p50 {pct(lists, 0.5):.1f} ms  p99 {pct(lists, 0.99):.1f} ms")
        print(
            f"  added by the rule's ask:           p50 {pct(calls, 0.5) - pct(lists, 0.5):.1f} ms"
            f"  p99 {pct(calls, 0.99) - pct(lists, 0.99):.1f} ms  (mean {statistics.mean(calls) * 1000:.1f} ms)"
        )
        measure_waiting(live, url, alice, waiting)
    finally:
        live.close()


def measure_waiting(live: Any, url: str, token: str, count: int) -> None:
    from concurrent.futures import ThreadPoolExecutor

    assert live.server is not None
    pid = live.server.pid

    async def warm_up() -> list[Any]:  # the database threads' pool grown to its size, first
        return await asyncio.gather(
            *(live_tests.call_v2(url, token, {"tool_name": "BenchRead", "input": {}}) for _ in range(25))
        )

    asyncio.run(warm_up())
    before_threads, before_rss = live_tests._threads_and_rss(pid)

    async def many() -> list[Any]:
        return await asyncio.gather(
            *(
                live_tests.call_v2(
                    url, token, {"tool_name": "BenchWait", "input": {"i": i}}, client_name="bench-wait", timeout=600
                )
                for i in range(count)
            )
        )

    with ThreadPoolExecutor(max_workers=8) as pool:
        calls = pool.submit(asyncio.run, many())
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            pending = live_tests.asks(live, "BenchWait", "pending")
            if len(pending) >= count:
                break
            time.sleep(0.5)
        time.sleep(2.0)
        during_threads, during_rss = live_tests._threads_and_rss(pid)
        print(f"{count} calls waiting for a person at once (server process {pid}):")
        print(f"  threads {before_threads} -> {during_threads}")
        print(
            f"  resident memory {before_rss / 2**20:.1f} -> {during_rss / 2**20:.1f} MiB: "
            f"{(during_rss - before_rss) / count / 1024:.0f} KiB a waiting call"
        )
        list(pool.map(lambda a: live_tests.decide(live, "carol", a["ask_id"], verdict="deny"), pending))
        answers = calls.result(300)
    assert all(a.data["behavior"] == "deny" for a in answers)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 200, int(sys.argv[2]) if len(sys.argv) > 2 else 50)
