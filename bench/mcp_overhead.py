"""What Sectr adds to an MCP tool call.

Run: .venv/bin/python bench/mcp_overhead.py [N] [--server]

`mcp-server-time` (stdio) answers `get_current_time` N times (default 300) three ways:
(a) directly with the `mcp` package's own client (the server's time plus the protocol),
(b) through `sectr.mcp.McpServer.call` (Sectr's client layer: the connection check, the
    timeout, the result's text and cap), and
(c) as a tool call inside a run of `LocalRuntime` (the in-memory journal, the offline demo
    model's `!tool`, the agent's selection, the journaled call and result), timed from
    the send to the run's end, minus the same run calling the built-in `get_time`
    instead, so the model and journal cost of a run with one tool call is taken out.
(d) the MCP call's own step inside those runs: from the journaled end of the model's
    message that asked for it (MESSAGE_END) to its journaled TOOL_RESULT (the agent's
    tool lookup, the gate, the call through `McpServer`, the result's text and its
    envelope).
(e) with --server, the same step on the server's path: a real Sectr (Daphne with its
    embedded worker on a scratch database: SQLite, or PostgreSQL when DATABASE_URL says
    so) runs N sessions of a team agent whose tools are the operator's `time` server
    (the SECTR_MCP_SERVERS file), each posted through the API; the step is read from the
    journal's timestamps (MESSAGE_END to TOOL_RESULT: the worker's connection pool, the
    agent's tool lookup, the rules, the journaled TOOL_STARTED, the call, the result).
Prints p50/p99 of each and the overhead Sectr adds to a call: (d) - (a) at p50 and at
p99 (the quantiles of the two distributions, subtracted), and the p50 differences of
(b) and (c). Run it on an idle machine: under load the differences drown in the noise.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mcp import Client, StdioServerParameters  # noqa: E402

import sectr  # noqa: E402
from sectr.agents import AgentSpec  # noqa: E402
from sectr.events import EventType  # noqa: E402
from sectr.mcp import McpServer, ServerConfig  # noqa: E402
from sectr.providers import DemoProvider  # noqa: E402

SERVER = str(Path(sys.executable).parent / "mcp-server-time")
ARGS = {"timezone": "UTC"}


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def show(label: str, values: list[float]) -> None:
    print(f"{label:<48} p50 {pct(values, 0.5):7.3f} ms   p99 {pct(values, 0.99):7.3f} ms")


async def direct(n: int) -> list[float]:
    times = []
    async with Client(StdioServerParameters(command=SERVER), cache=None) as client:
        await client.call_tool("get_current_time", ARGS)
        for _ in range(n):
            start = time.perf_counter()
            await client.call_tool("get_current_time", ARGS)
            times.append(time.perf_counter() - start)
    return times


async def through_client(n: int) -> list[float]:
    times = []
    async with McpServer(ServerConfig(name="time", command=SERVER)) as server:
        await server.call("get_current_time", ARGS)
        for _ in range(n):
            start = time.perf_counter()
            await server.call("get_current_time", ARGS)
            times.append(time.perf_counter() - start)
    return times


def tool_step(rt: sectr.LocalRuntime, sid: str) -> float:
    """Seconds from the model's message end to the tool's result, from the journal."""
    envelopes = rt.journal.read(sid)
    end = next(e for e in envelopes if e.type is EventType.MESSAGE_END)
    result = next(e for e in envelopes if e.type is EventType.TOOL_RESULT)
    assert not result.payload.get("is_error"), result.payload
    return (result.created_at - end.created_at).total_seconds()


async def through_runs(n: int) -> tuple[list[float], list[float], list[float]]:
    async with McpServer(ServerConfig(name="time", command=SERVER)) as server:
        rt = sectr.LocalRuntime(
            tools=await server.discover(),
            provider=DemoProvider(delay=0),
            agent=AgentSpec(tools=("get_time", "time__*")),
        )
        mcp_times, builtin_times, steps = [], [], []
        for i in range(n + 1):
            sid = await rt.create_session()
            start = time.perf_counter()
            await rt.send(sid, '!tool time__get_current_time {"timezone": "UTC"}')
            elapsed = time.perf_counter() - start
            step = tool_step(rt, sid)
            sid = await rt.create_session()
            start = time.perf_counter()
            await rt.send(sid, "!tool get_time {}")
            if i:  # the first of each warms up
                mcp_times.append(elapsed)
                builtin_times.append(time.perf_counter() - start)
                steps.append(step)
    return mcp_times, builtin_times, steps


def through_server(n: int) -> list[float]:
    """(e): N runs through a live Sectr's API, each one MCP call; the journal's step."""
    import json
    import tempfile

    import httpx

    from tests.liveserver import LiveSectr
    from tests.server.runs.test_worker_processes import LiveDriver

    servers = Path(tempfile.mkdtemp(prefix="sectr-bench-mcp-")) / "mcp-servers.json"
    servers.write_text(json.dumps({"time": {"command": SERVER}}))
    steps: list[float] = []
    env = {"SECTR_MCP_SERVERS": str(servers), "SECTR_DEMO_DELAY_MS": "0", "SECTR_API_RATE_LIMIT": "0/60"}
    with LiveSectr(env=env) as live:
        driver = LiveDriver(live)
        try:
            session_ids = driver.act(
                f"""
                from sessions_app.actions import mcp_servers
                alice = User.objects.create_user("alice")
                actions.do_create_team("crew")
                actions.do_set_membership("crew", "alice", "moderator")
                server = mcp_servers.do_add_server(alice, "crew", {{"name": "time"}})
                assert server.health == "ok", server.last_error
                actions.do_create_agent(alice, "crew", "clock", {{"name": "Clock", "tools": ["time__*"]}})
                result = [actions.do_create_session(alice, team="crew", agent="crew/clock").pk for _ in range({n + 1})]
                """
            )
            token = live.token_for("alice")
            text = "!tool time__get_current_time " + json.dumps(ARGS)
            with httpx.Client(base_url=live.base_url, headers={"Authorization": f"Bearer {token}"}, timeout=60) as http:
                for i, session_id in enumerate(session_ids):
                    posted = http.post(f"/api/v1/sessions/{session_id}/runs", json={"content": text})
                    posted.raise_for_status()
                    with http.stream("GET", posted.json()["events_url"]) as events:
                        for _line in events.iter_lines():
                            pass  # the stream ends with the run
                    journal = driver.envelopes(session_id)
                    end = next(e for e in journal if e["type"] == "MESSAGE_END")
                    result = next(e for e in journal if e["type"] == "TOOL_RESULT")
                    assert not result["payload"].get("is_error"), result["payload"]
                    if i:  # the first warms the worker's connection up
                        steps.append((result["created_at"] - end["created_at"]).total_seconds())
        finally:
            driver.close()
    return steps


async def main(n: int, server: bool = False) -> None:
    a = await direct(n)
    b = await through_client(n)
    runs, builtin, steps = await through_runs(n)
    show("(a) mcp client, directly", a)
    show("(b) sectr.mcp McpServer.call", b)
    show("(c) run with the MCP call", runs)
    show("    run with the built-in get_time", builtin)
    show("(d) the MCP call's step in the run", steps)
    base = statistics.median(a)
    print(f"Sectr's client layer, p50 (b) - (a): {(statistics.median(b) - base) * 1000:+.3f} ms")
    run_cost = statistics.median(runs) - statistics.median(builtin)
    print(f"a run's MCP call, p50 ((c) - built-in run) - (a): {(run_cost - base) * 1000:+.3f} ms")
    for label, q in (("p50", 0.5), ("p99", 0.99)):
        print(f"Sectr's overhead on a call in a run, {label} (d) - (a): {pct(steps, q) - pct(a, q):+.3f} ms")
    if server:
        served = await asyncio.to_thread(through_server, n)
        show("(e) the MCP call's step on the server's path", served)
        for label, q in (("p50", 0.5), ("p99", 0.99)):
            added = pct(served, q) - pct(a, q)
            print(f"Sectr's overhead on a call through the server, {label} (e) - (a): {added:+.3f} ms")


if __name__ == "__main__":
    numbers = [arg for arg in sys.argv[1:] if arg.isdigit()]
    asyncio.run(main(int(numbers[0]) if numbers else 300, server="--server" in sys.argv[1:]))
