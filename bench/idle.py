"""What the production topology costs when nobody uses it: CPU per process per second, idle.

Run (DATABASE_URL names a PostgreSQL server: a scratch database is made there):
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/x .venv/bin/python bench/idle.py \
        [--targets cluster,cluster=../base] [--rounds 2] [--seconds 45] [--settle 10] [--json out.jsonl]
    # per statement too: the pg_stat_statements extension in DATABASE_URL's database, and
    PGOPTIONS="-c pg_stat_statements.track=top" ... bench/idle.py --statements

The topology starts as bench/peers.py starts it (scripts/cluster.sh's: HAProxy, 2 Daphne,
2 workers, a scratch PostgreSQL database, a Redis of its own), serves one warm-up
conversation (a run of one tick: views and worker loaded, connection pools opened), waits
--settle seconds, then samples for --seconds with no load at all:

- CPU per process (its threads' schedstat, to the nanosecond), in ms per second;
- PostgreSQL's backends of the scratch database by owner (bench/pg_backends.py: the Daphne
  or worker whose socket each serves, a worker's liveness connection), ms per second;
- the database's transactions per second (pg_stat_database, read FLUSH_SECONDS after the
  window: a backend flushes its counters late), and with --statements the statements per
  second by shape;
- Redis's commands per second by name (INFO commandstats of the private Redis).

What a mostly idle deployment pays all day, and where: worker polls, heartbeats, liveness
checks, periodic sweeps, channel-layer receives, the servers' own timers. Targets
alternate round by round as in bench/peers.py.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from lean_http import LeanClient  # noqa: E402
from live import cpu_seconds_exact, server_pids  # noqa: E402
from peers import checkout, create_conversations, load_average, start_sectr  # noqa: E402
from pg_backends import PostgresBackends, StatementLedger  # noqa: E402

from tests.cluster import Cluster  # noqa: E402


def redis_commands(cluster: Cluster) -> dict[str, int]:
    """Calls so far per Redis command (INFO commandstats of the cluster's own Redis)."""
    if cluster.redis is None:
        return {}
    out = subprocess.run(
        ["redis-cli", "-p", str(cluster.redis.port), "info", "commandstats"], capture_output=True, text=True
    ).stdout
    found: dict[str, int] = {}
    for line in out.splitlines():
        if line.startswith("cmdstat_"):
            name, _, fields = line[8:].partition(":")
            found[name] = int(dict(f.split("=", 1) for f in fields.split(","))["calls"])
    return found


async def warm_up(cluster: Cluster) -> None:
    """One conversation of one tick, as bench/peers.py warms each target."""
    session_id, token = create_conversations(cluster, 1)[0]
    http = LeanClient(cluster.base_url, connections=1)
    try:
        async with http.stream(
            "POST",
            f"/api/v1/sessions/{session_id}/runs",
            json_body={"content": "!slow 1"},
            headers={"Authorization": f"Bearer {token}", "Accept": "text/event-stream"},
        ) as (status, _headers, chunks):
            if status >= 400:
                raise RuntimeError(f"POST runs: {status}")
            async for line in http.sse_lines(chunks):
                if line.startswith("event:") and line[6:].strip() == "result":
                    break
    finally:
        await http.aclose()


def measure(spec: str, seconds: float, settle: float, statements: bool) -> dict[str, Any]:
    target, _, root = spec.partition("=")
    if target != "cluster":
        raise SystemExit(f"unknown target {spec!r}: cluster or cluster=PATH")
    load = load_average()
    stamp = Path(os.environ.get("TMPDIR", "/tmp")) / f"sectr-idle-{os.getpid()}-{time.time_ns()}.txt"
    with checkout(Path(root).resolve() if root else None), start_sectr("cluster", stamp) as live:
        assert isinstance(live, Cluster)
        asyncio.run(warm_up(live))
        time.sleep(settle)
        pids = server_pids(live)
        admin = live.database_url.rsplit("/", 1)[0] + "/postgres"
        backends = PostgresBackends(admin, live.db_name, pids)
        ledger = StatementLedger(os.environ["DATABASE_URL"], live.db_name, live.database_url) if statements else None
        commands_before = redis_commands(live)
        cpu_before = {role: cpu_seconds_exact(pid) for role, pid in pids.items()}
        began = time.monotonic()
        with backends:
            if ledger is not None:
                ledger.__enter__()
            time.sleep(seconds)
            cpu = {role: cpu_seconds_exact(pid) - cpu_before[role] for role, pid in pids.items()}
            commands = {k: v - commands_before.get(k, 0) for k, v in redis_commands(live).items()}
        wall = time.monotonic() - began
        if ledger is not None:
            ledger.__exit__()
    stamp.unlink(missing_ok=True)
    accounting = backends.accounting()
    result: dict[str, Any] = {
        "target": f"cluster@{Path(root).resolve().name}" if root else "cluster",
        "load": load,
        "seconds": wall,
        "cpu_ms_per_s": {role: used * 1000 / wall for role, used in cpu.items()},
        "pg_ms_per_s": {owner: row["cpu"] * 1000 / wall for owner, row in accounting.items()},
        "redis_per_s": {name: calls / wall for name, calls in commands.items() if calls},
    }
    if ledger is not None:
        difference = ledger.difference()
        result["commits_per_s"] = difference["database"].get("commits", 0) / (wall + StatementLedger.FLUSH_SECONDS)
        result["statements_per_s"] = {
            " ".join(q.split())[:120]: s["calls"] / wall for q, s in difference["statements"].items()
        }
    return result


def report(result: dict[str, Any]) -> str:
    cpu = result["cpu_ms_per_s"]
    pg = result["pg_ms_per_s"]
    total = sum(cpu.values()) + sum(pg.values())
    lines = [
        f"{result['target']:<18} round {result['round']} load {result['load']:.2f}: {total:.2f} ms CPU/s in all "
        f"({result['seconds']:.0f} s idle)",
        "  processes: " + ", ".join(f"{role} {ms:.2f}" for role, ms in cpu.items()),
        f"  postgres {sum(pg.values()):.2f}: " + ", ".join(f"{o} {ms:.2f}" for o, ms in sorted(pg.items())),
        "  redis commands/s: " + ", ".join(f"{k} {v:.2f}" for k, v in sorted(result["redis_per_s"].items())),
    ]
    if "commits_per_s" in result:
        lines.append(f"  commits/s {result['commits_per_s']:.2f}; statements/s:")
        for query, rate in sorted(result["statements_per_s"].items(), key=lambda kv: -kv[1]):
            lines.append(f"    {rate:6.2f}  {query}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--targets", default="cluster", help="cluster and/or cluster=PATH (another checkout)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=45.0, help="the idle window sampled")
    parser.add_argument("--settle", type=float, default=10.0, help="seconds after the warm-up before sampling")
    parser.add_argument("--statements", action="store_true", help="statements per second (pg_stat_statements)")
    parser.add_argument("--json", default="", help="append each result as a JSON line to this file")
    args = parser.parse_args()
    if not os.environ.get("DATABASE_URL", "").startswith(("postgres://", "postgresql://")):
        parser.error("the cluster needs DATABASE_URL on a PostgreSQL server (a scratch database is made there)")
    targets = [t for t in args.targets.split(",") if t]
    for index in range(args.rounds):
        for spec in targets[index % len(targets) :] + targets[: index % len(targets)]:
            result = measure(spec, args.seconds, args.settle, args.statements)
            result["round"] = index + 1
            print(report(result), flush=True)
            if args.json:
                with open(args.json, "a") as out:
                    out.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
