"""Benchmark of a run's start: the CPU a worker spends from a queued run to the model's
first call (building the context: transcript, state, rules, and now the pinned agent and
the team's budget), for sessions of a team with a budget and an agent.

    DATABASE_URL=sqlite:////tmp/run-start.sqlite3 .venv/bin/python bench/run_start.py --runs 300
    DATABASE_URL=postgres://postgres@127.0.0.1/sectr_run_start .venv/bin/python bench/run_start.py --runs 300

Migrates the database, makes a team with N sessions (bench/team_runs.py: pinned to a
team agent and under a team budget, where this version of Sectr has them), each with a
short conversation already journaled, and a queued message. Then starts each run's
invocation the way the worker does (`Runtime.build_context`, then the budget check)
in-process, one after the other, and prints the CPU time (of the whole process: the
event loop and the database threads) and wall time per run start. Runs on older versions
of Sectr too (with bench/team_runs.py beside it; without agents and budgets it measures
what they had), so the same script compares before and after.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "sectr_web.settings")
os.environ.setdefault("ALLOWED_HOSTS", "testserver,localhost")

import django  # noqa: E402

django.setup()

from team_runs import migrate_and_users, queue_runs, team_extras  # noqa: E402

from sessions_app.runtime import get_runtime  # noqa: E402


def setup(count: int) -> list[tuple[str, str]]:
    """N sessions of team bench-start with a queued run each: (session id, invocation id)."""
    owner, moderator = migrate_and_users("bench-start")
    extras = team_extras("bench-start", owner, moderator, "bench", "Bench")
    started = []
    for run in queue_runs(owner, count, extras, "hello there, a short question"):
        run.refresh_from_db()
        started.append((run.session_id, str(run.invocation_id)))
    return started


async def start_all(started: list[tuple[str, str]]) -> tuple[list[float], list[float]]:
    runtime = get_runtime()
    budget = getattr(runtime, "_budget_source", None)
    cpu: list[float] = []
    wall: list[float] = []
    for session_id, invocation_id in started:
        c0, w0 = time.process_time(), time.perf_counter()
        ctx = await runtime.build_context(session_id, invocation_id)
        if budget is not None:
            await budget(session_id)
        _ = ctx.model_messages() if hasattr(ctx, "model_messages") else ctx.messages
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - w0)
    return cpu, wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=300)
    args = parser.parse_args()
    started = setup(args.runs)
    asyncio.run(start_all(started[:20]))  # warm: imports, connections, caches
    cpu, wall = asyncio.run(start_all(started))
    ms = 1000.0
    print(f"run starts: {len(cpu)}")
    print(
        f"CPU per run start (process): median {statistics.median(cpu) * ms:.3f} ms, "
        f"mean {statistics.mean(cpu) * ms:.3f} ms"
    )
    print(
        f"wall per run start: median {statistics.median(wall) * ms:.3f} ms, "
        f"p99 {sorted(wall)[int(len(wall) * 0.99) - 1] * ms:.3f} ms"
    )


if __name__ == "__main__":
    main()
