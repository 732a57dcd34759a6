"""Benchmark of a run's start: the CPU a worker spends from a queued run to the model's
first call (building the context: transcript, state, rules, and now the pinned agent and
the team's budget), for sessions of a team with a budget and an agent.

    DATABASE_URL=sqlite:////tmp/run-start.sqlite3 .venv/bin/python bench/run_start.py --runs 300
    DATABASE_URL=postgres://postgres@127.0.0.1/sectr_run_start .venv/bin/python bench/run_start.py --runs 300

Migrates the database, makes a team with N sessions (pinned to a team agent and under a
team budget, where this version of Sectr has them), each with a short conversation
already journaled, and a queued message. Then starts each run's invocation the way the
worker does (`Runtime.build_context`, then the budget check) in-process, one after the
other, and prints the CPU time (of the whole process: the event loop and the database
threads) and wall time per run start. Runs on older versions
of Sectr too (without agents and budgets it measures what they had), so the same
script compares before and after.
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
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "sectr_web.settings")
os.environ.setdefault("ALLOWED_HOSTS", "testserver,localhost")

import django  # noqa: E402

django.setup()

from django.contrib.auth import get_user_model  # noqa: E402
from django.core.management import call_command  # noqa: E402

from sessions_app import actions  # noqa: E402
from sessions_app.models import Run, Session, Team  # noqa: E402
from sessions_app.runtime import get_runtime  # noqa: E402


def setup(count: int) -> list[tuple[str, str]]:
    """N sessions of team bench-start with a queued run each: (session id, invocation id)."""
    call_command("migrate", verbosity=0)
    User = get_user_model()  # noqa: N806
    owner, _ = User.objects.get_or_create(username="bench-start-owner")
    moderator, _ = User.objects.get_or_create(username="bench-start-mod")
    if not Team.objects.filter(name="bench-start").exists():
        actions.do_create_team("bench-start")
        actions.do_set_membership("bench-start", owner.username, "member")
        actions.do_set_membership("bench-start", moderator.username, "moderator")
    extras: dict[str, object] = {}
    if hasattr(actions, "do_create_agent"):  # agents exist in this version
        from sessions_app.models import Agent

        if not Agent.objects.filter(slug="bench").exists():
            actions.do_create_agent(
                moderator, "bench-start", "bench", {"name": "Bench", "instructions": "Be brief.", "tools": ["get_time"]}
            )
        extras["agent"] = "bench-start/bench"
        from sessions_app.actions.team_budgets import do_set_budget

        do_set_budget(moderator, "bench-start", {"monthly_tokens": 10**12})
    Run.objects.filter(session__owner=owner).delete()
    Session.objects.filter(owner=owner).delete()
    started = []
    for _ in range(count):
        session = actions.do_create_session(owner, team="bench-start", **extras)  # type: ignore[arg-type]
        run = actions.do_post_message(owner, session.pk, "hello there, a short question")
        run.refresh_from_db()
        started.append((session.pk, str(run.invocation_id)))
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
