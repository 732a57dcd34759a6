"""Admission: how long N users who start a run at once wait for its first chunk.

Run:
    .venv/bin/python bench/admission.py [--n 100] [--ticks 30] [--tick-ms 100] [--mode get|post]
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/x REDIS_URL=redis://127.0.0.1:6379/0 \\
        .venv/bin/python bench/admission.py --topology cluster

`embedded` (default) is the zero-setup default (tests/liveserver.LiveSectr: one Daphne
with its embedded worker, a scratch SQLite database, the in-memory layer), started with
nothing set but the demo model's pace: the worker's concurrency is whatever the default
is. `cluster` is tests/cluster.Cluster (HAProxy, 2 Daphne, 2 workers at their default
concurrency, PostgreSQL, Redis), read through the balancer.

N sessions are created first and one keep-alive connection per user is opened; then all
N users at once post `!slow <ticks>` and read the run's events as a plain SSE client:
`--mode get` posts `POST /api/v1/sessions/{id}/runs` and then opens
`GET /api/v1/runs/{id}/events`; `--mode post` asks the POST itself for the stream
(`Accept: text/event-stream`). Admission is, per user, the first `message.delta`'s
arrival minus the moment its POST was sent; the bench prints its p50, p99 and max, and
how many runs completed, and each server process's CPU over the timed block in ms per
run (`cpu_ms_per_run`; with the embedded worker, the Daphne's includes running the runs).
`--py-spy PATH` records each Daphne meanwhile (raw stacks, --gil) into --py-spy-dir.
The POSTs and streams go through bench/lean_http.py's client (cheap enough not to take
the servers' CPU).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from lean_http import LeanClient  # noqa: E402
from live import cpu_meter, server_pids  # noqa: E402

from tests.cluster import Cluster  # noqa: E402
from tests.liveserver import LiveSectr  # noqa: E402


def percentile(values: list[float], fraction: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))]


def start_topology(topology: str, env: dict[str, str]) -> LiveSectr:
    if topology == "cluster":
        return Cluster(daphnes=2, workers=2, env=env)
    # The zero-setup default whatever this shell's DATABASE_URL / REDIS_URL say.
    saved = {name: os.environ.pop(name) for name in ("DATABASE_URL", "REDIS_URL") if name in os.environ}
    try:
        return LiveSectr(env={**env, "REDIS_URL": ""}, embedded_worker=True)
    finally:
        os.environ.update(saved)


def create_sessions(live: LiveSectr, n: int) -> tuple[str, list[str]]:
    code = (
        "from django.contrib.auth import get_user_model; from sessions_app import actions; "
        "from sessions_app.actions.tokens import do_issue_token; "
        "u = get_user_model().objects.create_user('bench'); print('TOKEN', do_issue_token(u)[1]); "
        f"print('\\n'.join(actions.do_create_session(u, title=f'bench {{i}}').pk for i in range({n})))"
    )
    out = live.manage("shell", "-c", code)
    token = out.split("TOKEN ", 1)[1].split()[0]
    sessions = re.findall(r"^(ses_[0-9a-f]+)$", out, re.MULTILINE)
    if len(sessions) != n:
        raise RuntimeError(f"created {len(sessions)} of {n} sessions")
    return token, sessions


async def first_chunk(http: LeanClient, chunks: Any) -> float | None:
    """The arrival of the stream's first message.delta (None if the stream had none);
    reads the stream to its `result`."""
    first = None
    kind = ""
    async for line in http.sse_lines(chunks):
        if line.startswith("event:"):
            kind = line[6:].strip()
        elif line.startswith("data:") and kind == "message.delta" and first is None:
            first = time.time()
        elif line.startswith("data:") and kind == "result":
            break
    async for _ in chunks:  # to the end of the body, so the connection is reusable
        pass
    return first


def record_daphnes(live: LiveSectr, py_spy: str, out: str) -> list[subprocess.Popen[bytes]]:
    """py-spy recorders of the topology's Daphnes (none without a py-spy path)."""
    if not py_spy:
        return []
    Path(out).mkdir(parents=True, exist_ok=True)
    return [
        subprocess.Popen(
            [py_spy, "record", "--gil", "-r", "200", "-f", "raw", "-p", str(pid), "-o", f"{out}/admission-{role}.txt"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for role, pid in server_pids(live).items()
        if role.startswith("daphne")
    ]


def stop_recorders(recorders: list[subprocess.Popen[bytes]]) -> None:
    for recorder in recorders:
        recorder.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
    for recorder in recorders:
        recorder.wait(30)


async def measure(
    live: LiveSectr, token: str, sessions: list[str], ticks: int, mode: str, spy: tuple[str, str] = ("", "")
) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {token}"}
    posts = LeanClient(live.base_url, headers=headers, connections=len(sessions))
    streams = LeanClient(
        live.base_url, headers={**headers, "Accept": "text/event-stream"}, connections=len(sessions)
    )  # fmt: skip
    admissions: list[float] = []
    answers: list[float] = []  # --mode get: the POST's answer, after its sending
    failed: list[str] = []

    async def user(session_id: str) -> None:
        posted = time.time()
        path = f"/api/v1/sessions/{session_id}/runs"
        if mode == "post":
            async with streams.stream("POST", path, json_body={"content": f"!slow {ticks}"}) as (status, _h, body):
                first = await first_chunk(streams, body) if status == 200 else None
        else:
            run = await posts.post(path, json_body={"content": f"!slow {ticks}"})
            answers.append(time.time() - posted)
            if run.status != 202:
                failed.append(f"POST {run.status}")
                return
            run_id = run.json()["run_id"]  # type: ignore[index]
            async with streams.stream("GET", f"/api/v1/runs/{run_id}/events") as (status, _h, body):
                first = await first_chunk(streams, body) if status == 200 else None
        if first is None:
            failed.append(f"no chunk ({status})")
        else:
            admissions.append(first - posted)

    try:
        # One connection per user for each client, opened before the clock starts.
        await asyncio.gather(*(posts.get("/healthz") for _ in sessions), *(streams.get("/healthz") for _ in sessions))
        recorders = record_daphnes(live, *spy)
        await asyncio.sleep(0.5 if recorders else 0)  # attached before the clock starts
        with cpu_meter(server_pids(live)) as cpu:
            started = time.monotonic()
            await asyncio.gather(*(user(session_id) for session_id in sessions))
            wall = time.monotonic() - started
        stop_recorders(recorders)
    finally:
        await posts.aclose()
        await streams.aclose()
    return {
        "n": len(sessions),
        "admitted": len(admissions),
        "failed": failed[:5],
        "p50": percentile(admissions, 0.5) * 1000,
        "p99": percentile(admissions, 0.99) * 1000,
        "max": max(admissions, default=float("nan")) * 1000,
        "answer_p50": percentile(answers, 0.5) * 1000,
        "answer_p99": percentile(answers, 0.99) * 1000,
        "wall": wall,
        "cpu_ms_per_run": {role: round(used * 1000 / len(sessions), 2) for role, used in cpu.items()},
    }


def server_side(live: LiveSectr) -> dict[str, float]:
    """From the database: per run, its claim after its creation, and its first chunk's
    append after its claim (p50 / p99, ms): where a late first chunk waited."""
    code = (
        "from sessions_app.models import Run, Envelope; "
        "rows = []\n"
        "for r in Run.objects.all():\n"
        "    d = Envelope.objects.filter(session_id=r.session_id, type='MESSAGE_DELTA').order_by('seq').first()\n"
        "    rows.append('%f %f %f' % (r.created_at.timestamp(), r.started_at.timestamp(), d.created_at.timestamp()))\n"
        "print('\\n'.join(rows))"
    )
    claimed, first = [], []
    for line in live.manage("shell", "-c", code).split("\n"):
        if line.count(" ") == 2:
            created, started, delta = map(float, line.split())
            claimed.append(started - created)
            first.append(delta - started)
    return {
        "claim_p50": percentile(claimed, 0.5) * 1000,
        "claim_p99": percentile(claimed, 0.99) * 1000,
        "first_append_p50": percentile(first, 0.5) * 1000,
        "first_append_p99": percentile(first, 0.99) * 1000,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--n", type=int, default=100)
    parser.add_argument("--ticks", type=int, default=30)
    parser.add_argument("--tick-ms", type=int, default=100)
    parser.add_argument("--topology", choices=("embedded", "cluster"), default="embedded")
    parser.add_argument("--mode", choices=("get", "post"), default="get")
    parser.add_argument("--py-spy", default="", help="path of a py-spy binary: record the Daphnes meanwhile")
    parser.add_argument("--py-spy-dir", default="var/py-spy", help="where --py-spy writes admission-<role>.txt")
    args = parser.parse_args()
    env = {
        "SECTR_DEMO_SLOW_MS": str(args.tick_ms),
        "SECTR_SESSION_CREATE_LIMIT": "100000/60",
        "SECTR_API_RATE_LIMIT": "0/60",
    }
    with start_topology(args.topology, env) as live:
        token, sessions = create_sessions(live, args.n)
        result = asyncio.run(measure(live, token, sessions, args.ticks, args.mode, (args.py_spy, args.py_spy_dir)))
        result.update(server_side(live))
    load = os.getloadavg()[0]
    print(json.dumps(result))
    print(
        f"{args.topology} N={result['n']} mode={args.mode}: admission p50 {result['p50']:.0f} ms,"
        f" p99 {result['p99']:.0f} ms, max {result['max']:.0f} ms; {result['admitted']}/{result['n']} runs"
        f" streamed, wall {result['wall']:.1f} s, load average {load:.2f}; CPU ms per run {result['cpu_ms_per_run']}"
    )


if __name__ == "__main__":
    main()
