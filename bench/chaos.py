"""Chaos: kill -9 a random worker every few seconds under streaming sessions.

Run (PostgreSQL; Redis from REDIS_URL or a private one):
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/x REDIS_URL=redis://127.0.0.1:6379/0 \
        .venv/bin/python bench/chaos.py --kills 100 [--sessions 20] [--workers 3] [--interval 3]

The production topology (tests/cluster.py: HAProxy, 2 Daphne, --workers workers). Each of
--sessions sessions streams `!slow --ticks` runs back to back (a new message through the
balancer as soon as its run completes). Every --interval seconds a random worker gets
SIGKILL and a new one is started in its place, --kills times. Then every run is let finish.

Reported, from the journal and the demo model's production stamps
(SECTR_DEMO_STAMP_FILE, see bench/live.py):
- envelopes lost: gaps in a session's seq (must be 0);
- duplicate seqs (must be 0; the schema's unique key makes it so, checked anyway);
- ticks lost or doubled in a run's reply as the fold shows it (crash stitching);
- runs not recovered: not `completed` when everything settled;
- recovery time: for every pause of a session's stream longer than 3 ticks, its length
  (kill -> streaming again on another worker), as a distribution.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import signal
import sys
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from live import PASSWORD, create_sessions, log_in, percentile  # noqa: E402

from tests.cluster import Cluster  # noqa: E402
from tests.server.runs.test_worker_processes import LiveDriver, reply_ticks  # noqa: E402


def starts_a_run(envelope: dict[str, Any]) -> bool:
    reason = envelope["payload"].get("reason", {})
    return envelope["type"] == "INVOCATION_STARTED" and reason.get("kind") == "user_message"


def stream_pauses(stamp_file: Path, tick_ms: int) -> list[float]:
    """Seconds of every pause longer than 3 ticks between two chunks of a session (and the file removed)."""
    pauses: list[float] = []
    last: dict[str, float] = {}
    for line in stamp_file.read_text().splitlines() if stamp_file.exists() else []:
        session_id, tick, produced = line.split()
        t = float(produced)
        if int(tick) > 1 and session_id in last and t - last[session_id] > 3 * tick_ms / 1000:
            pauses.append(t - last[session_id])
        last[session_id] = t
    stamp_file.unlink(missing_ok=True)
    return pauses


async def chaos(kills: int, sessions_count: int, workers: int, interval: float, ticks: int, tick_ms: int) -> None:
    stamp_file = Path(f"/tmp/sectr-chaos-stamps-{time.time_ns()}.txt")
    env = {
        "SECTR_DEMO_SLOW_MS": str(tick_ms),
        "SECTR_DEMO_STAMP_FILE": str(stamp_file),
        "LOG_LEVEL": "ERROR",
        "SECTR_LOG_LEVEL": "WARNING",
    }
    with Cluster(daphnes=2, workers=workers, worker_args=("--concurrency", "32"), env=env) as cluster:
        cluster.create_user("bench", password=PASSWORD)
        driver = LiveDriver(cluster)
        sessions = [session_id for session_id, _ in create_sessions(cluster, sessions_count)]
        sessionid, csrftoken = log_in(cluster.base_url, "bench")
        headers = {"X-CSRFToken": csrftoken, "Cookie": f"sessionid={sessionid}; csrftoken={csrftoken}"}
        stop = asyncio.Event()
        posted = 0

        def latest_status(session_id: str) -> str:
            rows = driver._rows(
                "SELECT status FROM sessions_app_run WHERE session_id = %s ORDER BY created_at DESC LIMIT 1",
                (session_id,),
            )
            return str(rows[0][0]) if rows else ""

        async def stream_forever(http: httpx.AsyncClient, session_id: str) -> None:
            nonlocal posted
            while not stop.is_set():
                response = await http.post(f"/sessions/{session_id}/messages", data={"content": f"!slow {ticks}"})
                if response.status_code >= 400:
                    raise RuntimeError(f"post failed: {response.status_code}")
                posted += 1
                while latest_status(session_id) not in {"completed", "failed", "cancelled"}:
                    await asyncio.sleep(0.5)
                    if stop.is_set():
                        return

        async def kill_loop() -> list[float]:
            kill_times = []
            for number in range(kills):
                await asyncio.sleep(interval)
                alive = [i for i, proc in enumerate(cluster.workers) if proc.poll() is None]
                victim = random.choice(alive)
                cluster.kill_worker(victim, signal.SIGKILL)
                kill_times.append(time.time())
                cluster.start_worker("--concurrency", "32")
                print(f"kill {number + 1}/{kills}: worker {victim}", flush=True)
            stop.set()
            return kill_times

        async with httpx.AsyncClient(base_url=cluster.base_url, headers=headers, timeout=60) as http:
            streams = [asyncio.ensure_future(stream_forever(http, s)) for s in sessions]
            await kill_loop()
            await asyncio.gather(*streams)
        # Let every run settle: recovered runs finish, nothing is left running.
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            states = [latest_status(s) for s in sessions]
            if all(state in {"completed", "failed", "cancelled"} for state in states):
                break
            await asyncio.sleep(1)

        lost = duplicates = ticks_bad = 0
        for session_id in sessions:
            envelopes = driver.envelopes(session_id)
            seqs = [e["seq"] for e in envelopes]
            duplicates += len(seqs) - len(set(seqs))
            lost += (max(seqs) - len(set(seqs))) if seqs else 0
            # Each run's reply: the ticks between one INVOCATION_STARTED of a user message and the next.
            run_start = [i for i, e in enumerate(envelopes) if starts_a_run(e)]
            for start, end in zip(run_start, [*run_start[1:], len(envelopes)], strict=True):
                got = reply_ticks(envelopes[start:end])
                if got and got != list(range(1, ticks + 1)):
                    ticks_bad += 1
        rows = driver._rows("SELECT status, count(*) FROM sessions_app_run GROUP BY status", ())
        by_status = {str(status): int(count) for status, count in rows}
        driver.close()

    pauses = stream_pauses(stamp_file, tick_ms)
    not_recovered = sum(count for status, count in by_status.items() if status != "completed")
    print(f"kills {kills}, sessions {sessions_count}, runs posted {posted}, runs by status {by_status}")
    print(f"envelopes lost {lost}, duplicate seqs {duplicates}, runs with ticks lost/doubled {ticks_bad}, "
          f"runs not recovered {not_recovered}")  # fmt: skip
    if pauses:
        print(f"recovery time (stream paused > 3 ticks): {len(pauses)} pauses, p50 {percentile(pauses, 0.5):.2f} s, "
              f"p90 {percentile(pauses, 0.9):.2f} s, max {max(pauses):.2f} s")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--kills", type=int, default=100)
    parser.add_argument("--sessions", type=int, default=20)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--interval", type=float, default=3.0, help="seconds between two kills")
    parser.add_argument("--ticks", type=int, default=60)
    parser.add_argument("--tick-ms", type=int, default=100)
    args = parser.parse_args()
    asyncio.run(chaos(args.kills, args.sessions, args.workers, args.interval, args.ticks, args.tick_ms))


if __name__ == "__main__":
    main()
