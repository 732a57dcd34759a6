"""Crash recovery time: `kill -9` of a worker mid-stream -> the run streams again elsewhere.

Run: .venv/bin/python bench/recovery.py [--reps 5] [--lease 6] [--poll 1.0]

For each backend (SQLite; PostgreSQL too when DATABASE_URL-style SECTR_BENCH_POSTGRES_URL,
default postgres://postgres@127.0.0.1:5432/sectr, is reachable - with the Redis channel
layer when SECTR_BENCH_REDIS_URL, default redis://127.0.0.1:6379/0, answers) it starts a
real Daphne and two `manage.py sectr_worker` processes on a scratch database
(tests/liveserver.py), posts `!slow 300`, and once the reply streams, kills the worker
holding the run with SIGKILL. The figure is the time from the kill to the first
MESSAGE_DELTA of the `recover` invocation another worker starts (the journal's
created_at of that delta, against the wall clock at the kill: same machine). The run is
then cancelled, a fresh worker replaces the dead one, and the next repetition starts.

The lease and poll interval are the workers' defaults unless given: recovery waits for
the lease to expire (it was last renewed up to lease/3 before the kill), then for a
worker's next poll. Aim: < 10 s.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scripts.reachable import reachable  # noqa: E402
from tests.liveserver import LiveSectr  # noqa: E402
from tests.server.runs.test_worker_processes import LiveDriver, streamed_ticks, wait_for  # noqa: E402

AIM_SECONDS = 10.0
POSTGRES_URL = os.environ.get("SECTR_BENCH_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/sectr")
REDIS_URL = os.environ.get("SECTR_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")


def first_recovered_delta(driver: LiveDriver, session_id: str, after_seq: int) -> dict[str, Any] | None:
    recover_invocation = None
    for envelope in driver.envelopes(session_id, after_seq=after_seq):
        if envelope["type"] == "INVOCATION_STARTED" and envelope["payload"]["reason"]["kind"] == "recover":
            recover_invocation = envelope["invocation_id"]
        elif envelope["type"] == "MESSAGE_DELTA" and recover_invocation is not None:
            if envelope["invocation_id"] == recover_invocation:
                return envelope
    return None


def kill_and_time_recovery(live: LiveSectr, driver: LiveDriver, workers: dict[str, subprocess.Popen[bytes]]) -> float:
    """Seconds from kill -9 of the worker streaming a run to its first recovered delta."""
    session_id, run_id = driver.post("bench", "!slow 300")
    wait_for(lambda: len(streamed_ticks(driver.envelopes(session_id))) >= 5, 60, "the stream")
    victim = workers.pop(driver.run(run_id)["lease_owner"])
    seen = len(driver.envelopes(session_id))
    killed_at = datetime.now(UTC)
    victim.send_signal(signal.SIGKILL)
    victim.wait(10)
    delta = wait_for(lambda: first_recovered_delta(driver, session_id, seen), 60, "the recovered stream", 0.02)
    seconds = (delta["created_at"] - killed_at).total_seconds()
    driver.act(
        f"""
        from sessions_app.models import Run
        run = Run.objects.get(pk={run_id!r})
        actions.do_cancel(run.session.owner, run.pk)
        result = None
        """
    )
    wait_for(lambda: driver.run(run_id)["status"] == "cancelled", 30, "the cancel")
    return seconds


def measure(backend: str, reps: int, worker_args: list[str]) -> list[float]:
    with LiveSectr(embedded_worker=False) as live:
        driver = LiveDriver(live)
        try:
            driver.create_user("bench")
            workers = {f"w{i}": live.start_worker(*worker_args, "--worker-id", f"w{i}") for i in range(2)}
            figures: list[float] = []
            for rep in range(reps):
                seconds = kill_and_time_recovery(live, driver, workers)
                figures.append(seconds)
                print(f"  {backend} #{rep + 1}: streaming again {seconds:.2f} s after kill -9", flush=True)
                name = f"w{2 + rep}"  # back to two workers
                workers[name] = live.start_worker(*worker_args, "--worker-id", name)
                time.sleep(1.0)  # let it start before the next kill
            return figures
        finally:
            driver.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--lease", type=float, default=None, help="worker lease seconds (default: the workers')")
    parser.add_argument("--poll", type=float, default=None, help="worker poll interval (default: the workers')")
    parser.add_argument("--backend", choices=("all", "sqlite", "postgresql"), default="all")
    args = parser.parse_args()
    worker_args: list[str] = []
    if args.lease is not None:
        worker_args += ["--lease", str(args.lease)]
    if args.poll is not None:
        worker_args += ["--poll", str(args.poll)]
    lease = args.lease if args.lease is not None else float(os.environ.get("SECTR_LEASE_SECONDS", "6"))
    poll = args.poll if args.poll is not None else 1.0

    backends: list[tuple[str, dict[str, str]]] = [("sqlite", {"DATABASE_URL": "", "REDIS_URL": ""})]
    if reachable(POSTGRES_URL):
        redis = REDIS_URL if reachable(REDIS_URL) else ""
        name = "postgresql + redis" if redis else "postgresql"
        backends.append((name, {"DATABASE_URL": POSTGRES_URL, "REDIS_URL": redis}))
    else:
        print(f"PostgreSQL not reachable at {POSTGRES_URL}: SQLite only")

    backends = [(n, e) for n, e in backends if args.backend == "all" or n.startswith(args.backend)]
    print(f"kill -9 -> streaming again on another worker (lease {lease:g} s, poll {poll:g} s, {args.reps} reps)")
    results: list[tuple[str, list[float]]] = []
    for name, env in backends:
        os.environ.update(env)
        results.append((name, measure(name, args.reps, worker_args)))

    print()
    print(f"{'backend':<20} {'median':>8} {'max':>8}   aim")
    for name, figures in results:
        median, worst = statistics.median(figures), max(figures)
        verdict = "ok" if worst < AIM_SECONDS else "MISSED"
        print(f"{name:<20} {median:>7.2f}s {worst:>7.2f}s   < {AIM_SECONDS:g} s ({verdict})")


if __name__ == "__main__":
    main()
