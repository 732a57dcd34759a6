"""Benchmark: the group commit's linger (SECTR_JOURNAL_LINGER_MS) under a steady load.

    .venv/bin/python bench/linger.py [--postgres URL] [--streams 50] [--rate 10] \
        [--seconds 8] [--lingers 0,5,10,20] [--rounds 2]

One worker's share of bench/peers.py's workload, without the HTTP tiers: --streams
sessions each append one delta every 1/--rate seconds (their phases spread evenly),
through one DatabaseJournal that publishes to the in-memory channel layer, one after
another per session as a run's writer does. For each linger (milliseconds, interleaved
over --rounds) it prints the groups the streaming lane wrote (appends per group), each
append's wait from the call to its return (p50 / p99 ms), and CPU per append: this
process's (every thread) and that of PostgreSQL's backends connected to the scratch
database (/proc/<pid>/stat; run as a user who may read them). CPU figures are robust to
the machine's other load, waits are not: the 1-minute load average is printed beside.

The scratch database (default "sectr_bench_linger_paced" on the local server) is created and
dropped here.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import django  # noqa: E402
from journal import create_scratch_postgres, delta_payload, drop_scratch_postgres, make_session  # noqa: E402

PG_DEFAULT = "postgres://postgres@127.0.0.1:5432/sectr_bench_linger_paced"
TICK = os.sysconf("SC_CLK_TCK")


def configure(pg_url: str, scratch: Path) -> None:
    """The project's settings, on the scratch database and the in-memory channel layer."""
    os.environ.update(DATABASE_URL=pg_url, REDIS_URL="", SECTR_VAR_DIR=str(scratch))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "sectr_web.settings")
    django.setup()


def backend_cpu(pg_url: str) -> dict[int, float]:
    """CPU seconds so far of each PostgreSQL backend connected to the scratch database."""
    import psycopg

    with psycopg.connect(pg_url.replace("postgres://", "postgresql://", 1), autocommit=True) as db:
        pids = [
            row[0]
            for row in db.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        ]
    found = {}
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        found[pid] = (int(fields[11]) + int(fields[12])) / TICK
    return found


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def measure(session_ids: list[str], linger_ms: float, rate: float, seconds: float, pg_url: str) -> dict[str, Any]:
    from sectr.events import EventType
    from sectr.journal import NewEvent
    from sessions_app.journal import DatabaseJournal, publish

    journal = DatabaseJournal()
    group = journal._group.get()
    group.linger = linger_ms / 1000
    waits: list[float] = []
    period = 1 / rate
    loop = asyncio.get_running_loop()

    async def stream(index: int, session_id: str) -> None:
        start = loop.time() + index * period / len(session_ids)
        tick = 0
        while (at := start + tick * period) < end:
            await asyncio.sleep(max(0.0, at - loop.time()))
            called = loop.time()
            event = NewEvent(EventType.MESSAGE_DELTA, delta_payload(tick), "inv_bench")
            await journal.append(session_id, [event])
            waits.append(loop.time() - called)
            tick += 1

    before_pg, before_cpu = backend_cpu(pg_url), time.process_time()
    end = loop.time() + seconds
    await asyncio.gather(*(stream(i, s) for i, s in enumerate(session_ids)))
    await publish.aflush_publications()
    cpu = time.process_time() - before_cpu
    after_pg = backend_cpu(pg_url)
    pg = sum(total - before_pg.get(pid, 0.0) for pid, total in after_pg.items())
    appends = group.appends
    return {
        "linger": linger_ms,
        "appends": appends,
        "groups": group.groups,
        "wait_p50": percentile(waits, 0.5) * 1000,
        "wait_p99": percentile(waits, 0.99) * 1000,
        "process_ms": cpu * 1000 / appends,
        "postgres_ms": pg * 1000 / appends,
    }


async def run(args: argparse.Namespace, session_ids: list[str]) -> None:
    lingers = [float(value) for value in args.lingers.split(",")]
    print(f"{args.streams} streams x {args.rate:g} deltas/s for {args.seconds:g} s each; CPU in ms per append")
    header = ("linger", "load", "appends", "/group", "wait p50", "p99", "process", "postgres")
    print(" ".join(f"{name:>{width}}" for name, width in zip(header, (6, 5, 7, 6, 8, 6, 7, 8), strict=True)))
    for round_index in range(args.rounds):
        for offset in range(len(lingers)):
            linger = lingers[(offset + round_index) % len(lingers)]
            load = os.getloadavg()[0]
            row = await measure(session_ids, linger, args.rate, args.seconds, args.postgres)
            print(
                f"{row['linger']:>6g} {load:>5.2f} {row['appends']:>7} {row['appends'] / max(row['groups'], 1):>6.1f} "
                f"{row['wait_p50']:>8.1f} {row['wait_p99']:>6.1f} {row['process_ms']:>7.3f} {row['postgres_ms']:>8.3f}",
                flush=True,
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--postgres", default=PG_DEFAULT, help=f"scratch PostgreSQL database URL ({PG_DEFAULT})")
    parser.add_argument("--streams", type=int, default=50, help="sessions streaming at once (default 50)")
    parser.add_argument("--rate", type=float, default=10.0, help="deltas per second per stream (default 10)")
    parser.add_argument("--seconds", type=float, default=8.0, help="length of one measurement (default 8)")
    parser.add_argument("--lingers", default="0,5,10,20", help="lingers to compare, ms (default 0,5,10,20)")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds (default 2)")
    args = parser.parse_args()
    if not create_scratch_postgres(args.postgres):
        sys.exit(1)
    scratch = Path(tempfile.mkdtemp(prefix="sectr-linger-"))
    configure(args.postgres, scratch)
    from django.core.management import call_command

    try:
        call_command("migrate", verbosity=0)
        session_ids = [make_session("default") for _ in range(args.streams)]
        asyncio.run(run(args, session_ids))
    finally:
        drop_scratch_postgres(args.postgres, alias="default")


if __name__ == "__main__":
    main()
