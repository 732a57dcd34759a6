"""Stop latency across processes: POST cancel through the balancer -> INVOCATION_CANCELLED.

Run (PostgreSQL + Redis; the production topology of tests/cluster.py):
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/x REDIS_URL=redis://127.0.0.1:6379/0 \
        .venv/bin/python bench/stop.py [--reps 40] [--streams 10]

HAProxy, 2 Daphne, 2 workers. --streams sessions stream `!slow 600` runs at once (the
load); one at a time, a run is cancelled with `POST /api/v1/runs/<id>/cancel` through the
balancer (so a Daphne writes the cancel flag and a worker in another process must learn
it), and a new run takes its place. The figure: from just before the POST to the
journal's created_at of the run's INVOCATION_CANCELLED (same machine, same clock).
Aim: p99 under 250 ms.
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import datetime
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from live import percentile  # noqa: E402

from tests.cluster import Cluster  # noqa: E402
from tests.server.runs.test_worker_processes import LiveDriver, streamed_ticks, wait_for  # noqa: E402

AIM_MS = 250.0


def cancelled_at(driver: LiveDriver, session_id: str) -> float | None:
    for envelope in driver.envelopes(session_id):
        if envelope["type"] == "INVOCATION_CANCELLED":
            created: datetime = envelope["created_at"]
            return created.timestamp()
    return None


def bench(reps: int, streams: int) -> None:
    # No API rate limit nor new-session budget: the bench makes a session a rep, and
    # polls and posts far more than 600 requests a minute.
    env = {
        "SECTR_DEMO_SLOW_MS": "100",
        "LOG_LEVEL": "ERROR",
        "SECTR_LOG_LEVEL": "WARNING",
        "SECTR_API_RATE_LIMIT": "0/60",
        "SECTR_SESSION_CREATE_LIMIT": "0/60",
    }
    with Cluster(daphnes=2, workers=2, env=env) as cluster:
        cluster.create_user("bench")
        token = cluster.token_for("bench")
        driver = LiveDriver(cluster)
        http = httpx.Client(base_url=cluster.base_url + "/api/v1", headers={"Authorization": f"Bearer {token}"},
                            timeout=30)  # fmt: skip

        def start() -> tuple[str, str]:
            created = http.post("/sessions", json={"title": "stop"})
            if created.status_code != 201:
                raise RuntimeError(f"could not create a session: {created.status_code} {created.text[:300]}")
            session = created.json()["id"]
            run = http.post(f"/sessions/{session}/runs", json={"content": "!slow 600"}).json()["run_id"]
            return str(session), str(run)

        running = [start() for _ in range(streams)]
        latencies: list[float] = []
        answered: list[float] = []  # the POST's own round trip (the cancel flag is written by then)
        for rep in range(reps):
            session_id, run_id = running.pop(0)

            def streaming(s: str = session_id) -> bool:
                return len(streamed_ticks(driver.envelopes(s))) >= 2

            def cancelled(s: str = session_id) -> float | None:
                return cancelled_at(driver, s)

            wait_for(streaming, 60, "the run to stream")
            posted = time.time()
            response = http.post(f"/runs/{run_id}/cancel")
            answered.append((time.time() - posted) * 1000)
            if response.status_code != 202:
                raise RuntimeError(f"cancel: {response.status_code} {response.text}")
            at = float(wait_for(cancelled, 30, "INVOCATION_CANCELLED", interval=0.02))
            latencies.append((at - posted) * 1000)
            print(f"rep {rep + 1}/{reps}: {latencies[-1]:.0f} ms (POST answered in {answered[-1]:.0f} ms)", flush=True)
            running.append(start())
        print(f"stop latency over {reps} cancels ({streams} streams, 2 Daphne, 2 workers): "
              f"p50 {percentile(latencies, 0.5):.0f} ms, p99 {percentile(latencies, 0.99):.0f} ms, "
              f"max {max(latencies):.0f} ms (aim: p99 < {AIM_MS:.0f} ms); the POST alone: "
              f"p50 {percentile(answered, 0.5):.0f} ms, p99 {percentile(answered, 0.99):.0f} ms")  # fmt: skip
        for _session_id, run_id in running:
            http.post(f"/runs/{run_id}/cancel")
        http.close()
        driver.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--reps", type=int, default=40)
    parser.add_argument("--streams", type=int, default=10)
    args = parser.parse_args()
    bench(args.reps, args.streams)


if __name__ == "__main__":
    main()
