"""Sectr beside LangGraph's local Agent Server, the same streaming workload, same run.

Run (LangGraph is a benchmark dependency only, in a venv of its own, never in
requirements.txt):
    python3 -m venv var/langgraph-venv && var/langgraph-venv/bin/pip install "langgraph-cli[inmem]"
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/x REDIS_URL=redis://127.0.0.1:6379/0 \
        .venv/bin/python bench/peers.py --sizes 10,100 --topologies embedded,cluster

The workload: N conversations at once, each streaming --ticks chunks --tick-ms apart.

- LangGraph: `langgraph dev` (the in-memory Agent Server, --n-jobs-per-worker N so no run
  queues) serving bench/langgraph_peer/ticker.py, a graph that writes one custom stream
  chunk per tick carrying the time it was produced. N threads, then N
  POST /threads/<id>/runs/stream (SSE, stream_mode custom) at once.
- Sectr: bench/live.py's measure(): N sessions with a page websocket each, N `!slow`
  posts at once, the demo model stamping each tick as it produces it; on the embedded
  default (SQLite, in-memory layer) and/or through the production topology (tests/cluster.py: HAProxy, 2 Daphne,
  2 workers, PostgreSQL, Redis; needs DATABASE_URL on PostgreSQL).

Both sides report the same columns: per-chunk lag (arrival - production), admission
(POST sent to first chunk, per run), drift of the producer behind its schedule, and the
server's CPU ms per chunk (every server process; LangGraph's whole process tree).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from lean_http import LeanClient  # noqa: E402
from live import HEADER, cpu_seconds, format_row, measure, percentile  # noqa: E402

from tests.liveserver import free_port  # noqa: E402

PEER_DIR = ROOT / "bench" / "langgraph_peer"


def process_tree(pid: int) -> list[int]:
    """pid and all its descendants (langgraph dev may run the server in a child)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    tree, todo = [], [pid]
    while todo:
        current = todo.pop()
        tree.append(current)
        todo.extend(children.get(current, []))
    return tree


def start_langgraph(langgraph: str, n: int) -> tuple[subprocess.Popen[bytes], str]:
    """`langgraph dev` on a free port, once it answers /ok."""
    port = free_port()
    env = {**os.environ, "LANGSMITH_TRACING": "false", "LANGGRAPH_CLI_NO_ANALYTICS": "1", "LOG_LEVEL": "WARNING"}
    log = open(Path(os.environ.get("TMPDIR", "/tmp")) / f"langgraph-peer-{port}.log", "wb")  # noqa: SIM115
    server = subprocess.Popen(
        [langgraph, "dev", "--no-browser", "--no-reload", "--port", str(port), "--n-jobs-per-worker", str(max(10, n))],
        cwd=PEER_DIR, env=env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(base + "/ok", timeout=1).status_code == 200:
                return server, base
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline or server.poll() is not None:
            server.kill()
            raise RuntimeError(f"langgraph dev did not start (see {log.name})")
        time.sleep(0.2)


async def measure_langgraph(langgraph: str, n: int, ticks: int, tick_ms: int) -> dict[str, Any]:
    server, base = start_langgraph(langgraph, n)
    # The lean client of bench/lean_http.py, as bench/live.py's POSTs: httpx's cost per
    # request and per streamed line is this machine's CPU, taken from the servers.
    http = LeanClient(base, connections=n)
    try:
        threads = [(await http.post("/threads", json_body={})).json()["thread_id"] for _ in range(n)]  # type: ignore[index]
        # Warm-up run: the first run loads the graph; Sectr's server is warm too (it served the login).
        warm_body = {"assistant_id": "ticker", "input": {"ticks": 1, "tick_ms": tick_ms}, "stream_mode": ["custom"]}
        async with http.stream("POST", f"/threads/{threads[0]}/runs/stream", json_body=warm_body) as (_s, _h, body):
            async for _ in body:
                pass
        lags: list[float] = []
        admissions: list[float] = []
        drifts: list[float] = []

        async def run(thread_id: str) -> None:
            request = {
                "assistant_id": "ticker",
                "input": {"ticks": ticks, "tick_ms": tick_ms},
                "stream_mode": ["custom"],
            }
            posted = time.time()
            first = None
            stamps: dict[int, float] = {}
            async with http.stream("POST", f"/threads/{thread_id}/runs/stream", json_body=request) as (_s, _h, body):
                event = ""
                async for line in http.sse_lines(body):
                    if line.startswith("event:"):
                        event = line[6:].strip()
                    elif line.startswith("data:") and event == "custom":
                        arrived = time.time()
                        chunk = json.loads(line[5:])
                        lags.append(arrived - chunk["t"])
                        stamps[chunk["tick"]] = chunk["t"]
                        if first is None:
                            first = arrived
            if first is not None:
                admissions.append(first - posted)
            if 1 in stamps:
                drifts.extend(t - stamps[1] - (k - 1) * tick_ms / 1000 for k, t in stamps.items() if k > 1)

        pids = process_tree(server.pid)
        # One connection per stream, opened before the clock starts (as bench/live.py's).
        await asyncio.gather(*(http.get("/ok") for _ in range(n)))
        before = {pid: cpu_seconds(pid) for pid in pids}
        started = time.monotonic()
        await asyncio.gather(*(run(thread_id) for thread_id in threads))
        wall = time.monotonic() - started
        cpu = {pid: cpu_seconds(pid) - before[pid] for pid in pids}
    finally:
        await http.aclose()
        server.terminate()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
    chunks = len(lags)
    return {
        "system": "langgr.",
        "n": n,
        "topology": "langgraph dev",
        "backend": "in-memory runtime",
        "chunks": chunks,
        "expected": n * ticks,
        "frames": chunks,
        "wall": wall,
        "p50": percentile(lags, 0.5) * 1000,
        "p99": percentile(lags, 0.99) * 1000,
        "max": max(lags, default=float("nan")) * 1000,
        "admit_p50": percentile(admissions, 0.5) * 1000,
        "admit_p99": percentile(admissions, 0.99) * 1000,
        "drift_p99": percentile(drifts, 0.99) * 1000,
        "cpu_ms_per_chunk": sum(cpu.values()) * 1000 / max(chunks, 1),
        "cpu_by_process": {"server": sum(cpu.values()) * 1000 / max(chunks, 1)},
        "bare_p50": float("nan"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--sizes", default="10,100")
    parser.add_argument("--ticks", type=int, default=30)
    parser.add_argument("--tick-ms", type=int, default=100)
    parser.add_argument("--topologies", default="embedded,cluster", help="Sectr's: embedded, cluster or both")
    parser.add_argument("--langgraph", default=str(ROOT / "var" / "langgraph-venv" / "bin" / "langgraph"))
    parser.add_argument("--json", default="", help="append each result as a JSON line to this file")
    args = parser.parse_args()
    sizes = [int(size) for size in re.split(r"[,\s]+", args.sizes) if size]
    topologies = [t for t in args.topologies.split(",") if t]
    print(HEADER + "   (times in ms)")
    for n in sizes:
        results = [asyncio.run(measure_langgraph(args.langgraph, n, args.ticks, args.tick_ms))]
        print(format_row(results[-1]), flush=True)
        for topology in topologies:
            results.append(asyncio.run(measure(n, args.ticks, args.tick_ms, topology)))
            print(format_row(results[-1]), flush=True)
        if args.json:
            with open(args.json, "a") as out:
                out.writelines(json.dumps(r) + "\n" for r in results)
    print(f"(each conversation: {args.ticks} chunks {args.tick_ms} ms apart; lag = arrival - production)")


if __name__ == "__main__":
    main()
