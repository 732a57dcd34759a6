"""Benchmark of an experiment: the server CPU per replayed turn, beside the CPU per turn
of the same conversations run as ordinary sessions.

    DATABASE_URL=sqlite:////tmp/experiments.sqlite3 .venv/bin/python bench/experiments.py --sources 20 --turns 4
    DATABASE_URL=postgres://postgres@127.0.0.1/sectr_bench_exp .venv/bin/python bench/experiments.py

Migrates the database, makes a team with an agent (two versions), records `--sources`
sessions of `--turns` user messages each (plain questions and tool calls: calculator,
get_time) by running them through a worker in this process, then creates an experiment
replaying all of them on version 2 and runs its replays through the same worker. The
demo model answers without delay, so the figures are Sectr's own work: the CPU of the
whole process (event loop and database threads) per turn, for recording and for
replaying (the replay adds loading the source's journal, matching calls and answering
them from it), and the experiment's creation (queueing every turn).
"""

from __future__ import annotations

import argparse
import asyncio
import os
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

from sectr.providers import DemoProvider  # noqa: E402
from sectr.runtime import Runtime  # noqa: E402
from sessions_app import actions  # noqa: E402
from sessions_app.dbthread import run_in_db_thread  # noqa: E402
from sessions_app.experiments import actions as experiments  # noqa: E402
from sessions_app.experiments import compare  # noqa: E402
from sessions_app.journal import DatabaseJournal  # noqa: E402
from sessions_app.models import Experiment, Run, Session, Team  # noqa: E402
from sessions_app.runtime import session_agent, session_policy  # noqa: E402
from sessions_app.worker import Worker  # noqa: E402

MESSAGES = ("calculate 6*7", "what time is it?", "thanks, and a short summary please", "calculate 2**10")
TEAM = "bench-exp"


def runtime() -> Runtime:
    return Runtime(DatabaseJournal(), provider=DemoProvider(delay=0), rules=session_policy, agent=session_agent)


def work_off(rt: Runtime) -> None:
    """Run a worker in this process until no run is waiting."""

    def busy() -> bool:
        return Run.objects.filter(status__in=[Run.QUEUED, Run.RUNNING, Run.PENDING]).exists()

    async def main() -> None:
        worker = Worker(concurrency=8, poll_interval=0.01, lease=30.0, runtime=rt, listen=False)
        task = asyncio.ensure_future(worker.run(drain_timeout=5))
        try:
            quiet = 0
            while quiet < 3:
                idle = not await run_in_db_thread(busy) and not worker.tasks
                quiet = quiet + 1 if idle else 0
                await asyncio.sleep(0.02)
        finally:
            worker.stop()
            await task

    asyncio.run(main())


def measured(label: str, turns: int, work: object) -> tuple[float, float]:
    cpu, wall = time.process_time(), time.perf_counter()
    work()  # type: ignore[operator]
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    per_turn = f"{1000 * cpu / turns:7.2f} ms CPU/turn  {1000 * wall / turns:7.2f} ms wall/turn"
    print(f"{label:<34} {turns:>5} turns  {per_turn}")
    return cpu, wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sources", type=int, default=20)
    parser.add_argument("--turns", type=int, default=4)
    args = parser.parse_args()
    call_command("migrate", verbosity=0)
    User = get_user_model()  # noqa: N806
    owner, _ = User.objects.get_or_create(username="bench-exp-owner")
    moderator, _ = User.objects.get_or_create(username="bench-exp-mod")
    if not Team.objects.filter(name=TEAM).exists():
        actions.do_create_team(TEAM)
        actions.do_set_membership(TEAM, owner.username, "member")
        actions.do_set_membership(TEAM, moderator.username, "moderator")
        agent = actions.do_create_agent(moderator, TEAM, "bench", {"name": "Bench", "instructions": "One."})
        actions.do_save_agent_version(moderator, agent.pk, {"instructions": "Two."})
    Experiment.objects.filter(team__name=TEAM).delete()
    Session.objects.filter(team__name=TEAM).delete()
    rt = runtime()
    turns = args.sources * args.turns

    def record() -> None:
        for _ in range(args.sources):
            session = actions.do_create_session(owner, team=TEAM, agent=f"{TEAM}/bench", agent_version=1)
            for index in range(args.turns):
                actions.do_post_message(owner, session.pk, MESSAGES[index % len(MESSAGES)], queue=True)
        work_off(rt)

    measured("recording (ordinary runs)", turns, record)
    holder: dict[str, Experiment] = {}

    def create() -> None:
        holder["e"] = experiments.do_create_experiment(
            moderator, TEAM, name="bench", candidates=[{"agent": f"{TEAM}/bench", "version": 2}], last=args.sources
        )

    measured("creating the experiment", turns, create)
    measured("replaying (recorded results)", turns, lambda: work_off(rt))
    summary = compare.summarize(holder["e"])[0]
    print(f"replays: {summary.replays}, done {summary.done}, diverged {summary.diverged}, failed {summary.failed}")


if __name__ == "__main__":
    main()
