"""Benchmark of a run's whole life in a worker: the CPU from a queued run to its finished
row (claim, context, the handler's one-chunk reply, the terminal append, the end), for a
burst of N runs queued at once and executed by one Worker in this process.

    DATABASE_URL=sqlite:////tmp/run-life.sqlite3 .venv/bin/python bench/run_lifecycle.py --runs 100
    DATABASE_URL=postgres://postgres@127.0.0.1/sectr_run_life .venv/bin/python bench/run_lifecycle.py
    # with publication to Redis, 30 chunks 100 ms apart per reply:
    ... REDIS_URL=redis://127.0.0.1:6379/0 .venv/bin/python bench/run_lifecycle.py --ticks 30 --tick-ms 100

Migrates the database and makes N sessions (`--team`: of a team with an agent and a
budget, as bench/run_start.py, both by bench/team_runs.py; else plain sessions, as
bench/admission.py's), each with a queued `!slow 1` message (one chunk, no pause;
`--ticks 30 --tick-ms 100` streams bench/peers.py's replies instead, and the difference
from the one-chunk figure is the worker's CPU per streamed chunk). Then
starts a Worker (the default concurrency; `--listen`: on the channel layer, as a worker
process does, its Redis costs counted) and waits until every run has finished; prints
the process's CPU (the event loop and the database threads) per run, the wall time of
the burst, and the SQL statements per run by kind; on a PostgreSQL of this machine also
its backends' CPU per run and how many backends the burst opened (round 0's pool starts
cold: the difference from later rounds is what new connections cost the server). The same burst is run `--rounds`
times (fresh runs each time, the first one a warm-up; profile the later ones from
outside, e.g. `py-spy record --pid`, or with `--profile FILE`: cProfile of every thread).
`--callgrind` counts the later bursts' instructions (repeatable to ~2%, unlike the CPU time):

    valgrind --tool=callgrind --callgrind-out-file=/tmp/life.cg --instr-atstart=no \\
        .venv/bin/python bench/run_lifecycle.py --runs 100 --rounds 3 --listen --callgrind
    callgrind_annotate /tmp/life.cg | head  # the total, divided by 100 x (rounds - 1)
 Runs on older versions of Sectr too (with
bench/team_runs.py beside it), so the same script compares before and after.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "sectr_web.settings")
os.environ.setdefault("ALLOWED_HOSTS", "testserver,localhost")


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--team", action="store_true", help="sessions of a team with an agent and a budget")
    parser.add_argument("--sql", action="store_true", help="print each statement of the last round, counted")
    parser.add_argument(
        "--ticks",
        type=int,
        default=1,
        help="chunks per reply (`!slow <ticks>`): more than one adds the streaming appends to each run's cost",
    )
    parser.add_argument("--tick-ms", type=int, default=0, help="the demo model's pause between two chunks")
    parser.add_argument(
        "--listen",
        action="store_true",
        help="the worker listens on the channel layer (REDIS_URL), as a worker process does: its Redis costs count",
    )
    parser.add_argument(
        "--profile",
        metavar="FILE",
        help="cProfile of the rounds after the first, every thread's (the loop's and the database threads'), to FILE",
    )
    parser.add_argument(
        "--callgrind",
        action="store_true",
        help="toggle callgrind collection around the rounds after the first (valgrind --instr-atstart=no)",
    )
    return parser.parse_args()


#: parsed before Django starts: the demo model reads its pace from the environment then
ARGS = arguments()
os.environ["SECTR_DEMO_SLOW_MS"] = str(ARGS.tick_ms)

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.contrib.auth import get_user_model  # noqa: E402
from django.db.backends import utils as db_utils  # noqa: E402
from team_runs import migrate_and_users, queue_runs, team_extras  # noqa: E402

from sessions_app.dbthread import run_in_db_thread  # noqa: E402
from sessions_app.models import Run  # noqa: E402
from sessions_app.worker import Worker  # noqa: E402

TEAM = "bench-life"
OWNER = f"{TEAM}-owner"
#: A burst in which no run finishes for this long is stuck: the bench stops.
STALL_SECONDS = 60.0


class StatementCounter:
    """Counts the SQL statements of every thread by their first words (Django's cursor)."""

    def __init__(self) -> None:
        #: the statements themselves, counted
        self.full: collections.Counter[str] = collections.Counter()
        self.on = False
        self._lock = threading.Lock()
        counter = self
        original = getattr(db_utils.CursorWrapper, "_execute_with_wrappers")  # noqa: B009 - private

        def counted(self: Any, sql: str, params: Any, many: bool, executor: Any) -> Any:
            if counter.on:
                with counter._lock:  # classified at the end: counting must cost next to nothing
                    counter.full[sql] += 1
            return original(self, sql, params, many, executor)

        setattr(db_utils.CursorWrapper, "_execute_with_wrappers", counted)  # noqa: B010 - private

    @staticmethod
    def kind(sql: str) -> str:
        words = sql.split()
        head = words[0].upper() if words else "?"
        table = ""
        upper = [w.upper() for w in words]
        for marker in ("FROM", "INTO", "UPDATE"):
            if marker in upper:
                i = upper.index(marker) + (0 if marker == "UPDATE" and head != "UPDATE" else 1)
                if marker == "UPDATE" and head == "UPDATE":
                    i = 1
                if i < len(words):
                    table = words[i].strip('"`(').split('"')[0]
                    break
        return f"{head} {table}".strip()


def setup(team: bool) -> dict[str, object]:
    """The owner (and the team, its agent and budget): the sessions' extra arguments."""
    owner, moderator = migrate_and_users(TEAM)
    return team_extras(TEAM, owner, moderator, "life", "Life") if team else {}


def queue(count: int, extras: dict[str, object], ticks: int = 1) -> None:
    """N fresh sessions (the last round's deleted), each with a queued message."""
    queue_runs(get_user_model().objects.get(username=OWNER), count, extras, f"!slow {ticks}")


def unfinished() -> int:
    return Run.objects.filter(session__owner__username=OWNER, status__in=(Run.QUEUED, Run.RUNNING)).count()


class PostgresCpu:
    """CPU of this server's PostgreSQL backends connected to the database (PostgreSQL on
    this machine only): each backend's /proc/<pid>/schedstat (to the nanosecond) is read
    every 50 ms while a burst runs, so a backend the pool opens during it counts too.
    Their sum over a burst, beside the process's own CPU, is what the database spent."""

    def __init__(self) -> None:
        self.connection: Any = None
        database = settings.DATABASES["default"]
        if database["ENGINE"] != "django.db.backends.postgresql" or database["HOST"] not in ("127.0.0.1", "localhost"):
            return
        import psycopg

        self.connection = psycopg.connect(
            host=database["HOST"],
            port=database["PORT"] or 5432,
            user=database["USER"],
            dbname="postgres",
            autocommit=True,
        )
        self.name = database["NAME"]
        self.seen: dict[int, float] = {}
        self.start: dict[int, float] = {}
        self.stopping = threading.Event()

    def _sample(self) -> dict[int, float]:
        rows = self.connection.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()", [self.name]
        ).fetchall()
        found = {}
        for (pid,) in rows:
            try:
                found[pid] = int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e9
            except OSError:
                pass
        return found

    def _loop(self) -> None:
        while not self.stopping.wait(0.05):
            for pid, used in self._sample().items():
                self.seen[pid] = max(used, self.seen.get(pid, 0.0))

    def begin(self) -> None:
        if self.connection is None:
            return
        self.start = self._sample()
        self.seen = dict(self.start)
        self.stopping.clear()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def end(self) -> tuple[float, int]:
        """(CPU seconds, backends opened) since `begin`; (nan, 0) without a local PostgreSQL."""
        if self.connection is None:
            return float("nan"), 0
        self.stopping.set()
        self.thread.join()
        for pid, used in self._sample().items():
            self.seen[pid] = max(used, self.seen.get(pid, 0.0))
        return sum(used - self.start.get(pid, 0.0) for pid, used in self.seen.items()), len(
            set(self.seen) - set(self.start)
        )


POSTGRES = PostgresCpu()


class ThreadProfiles:
    """cProfile of every thread: the loop's, and each pool thread's work items (one
    profiler per thread, merged at the end), while `on`."""

    def __init__(self) -> None:
        import cProfile
        from concurrent.futures import thread as futures_thread

        self.on = False
        self.profiles: list[Any] = []
        self._local = threading.local()
        self._make = cProfile.Profile
        original = futures_thread._WorkItem.run
        profiles = self

        def run(item: Any) -> None:
            if not profiles.on:
                return original(item)
            profile = profiles.mine()
            profile.enable()
            try:
                return original(item)
            finally:
                profile.disable()

        futures_thread._WorkItem.run = run  # type: ignore[method-assign,assignment]

    def mine(self) -> Any:
        profile = getattr(self._local, "profile", None)
        if profile is None:
            profile = self._local.profile = self._make()
            self.profiles.append(profile)
        return profile

    def dump(self, path: str) -> None:
        import pstats

        stats = pstats.Stats(self.profiles[0])
        for profile in self.profiles[1:]:
            stats.add(profile)
        stats.dump_stats(path)


PROFILES = ThreadProfiles() if ARGS.profile else None
#: seconds between two looks for unfinished runs: under valgrind a look costs as much as a
#: run, and a burst lasts 50 times longer
POLL_SECONDS = 2.0 if ARGS.callgrind else 0.05


async def burst(counter: StatementCounter, listen: bool = False) -> tuple[float, float]:
    """Run the queued runs with a fresh Worker: (CPU s, wall s) until all finished."""
    worker = Worker(
        concurrency=settings.SECTR_WORKER_CONCURRENCY,
        poll_interval=0.5,
        expiry_interval=0,
        retention_interval=0,
        notify=False,
        listen=listen,
    )
    counter.full.clear()
    counter.on = True
    POSTGRES.begin()
    c0, w0 = time.process_time(), time.perf_counter()
    task = asyncio.ensure_future(worker.run())
    left, moved_at = -1, time.monotonic()
    while left:
        await asyncio.sleep(POLL_SECONDS)
        now_left = await run_in_db_thread(unfinished)
        if now_left != left:
            left, moved_at = now_left, time.monotonic()
        elif time.monotonic() - moved_at > STALL_SECONDS:
            raise SystemExit(f"no run finished for {STALL_SECONDS} s ({left} left): see the worker's log above")
    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    postgres, opened = POSTGRES.end()
    if postgres == postgres:  # not nan
        print(f"  PostgreSQL backends: {postgres / ARGS.runs * 1000:.2f} ms CPU per run, {opened} opened")
    counter.on = False
    worker.stop()
    await task
    failed = await run_in_db_thread(
        lambda: Run.objects.filter(session__owner__username=OWNER).exclude(status=Run.COMPLETED).count()
    )
    if failed:
        print(f"warning: {failed} runs did not complete", file=sys.stderr)
    return cpu, wall


async def rounds(
    runs: int, extras: dict[str, object], count: int, counter: StatementCounter, ticks: int = 1, listen: bool = False
) -> list[float]:
    """CPU per run (ms) of each round after the first (one event loop for all, as a server)."""
    cpus: list[float] = []
    for round_ in range(count):
        await run_in_db_thread(queue, runs, extras, ticks)
        measured(round_ > 0)
        cpu, wall = await burst(counter, listen)
        measured(False)
        per_run = cpu / runs * 1000
        print(f"round {round_}: CPU per run {per_run:.2f} ms, burst wall {wall:.2f} s")
        if round_:
            cpus.append(per_run)
    if PROFILES is not None:
        PROFILES.dump(ARGS.profile)
    return cpus


def measured(on: bool) -> None:
    """Profile (--profile) and count instructions (--callgrind) of a burst, not of the queueing."""
    if not on:
        if ARGS.callgrind:
            os.system(f"callgrind_control -i off {os.getpid()} >/dev/null")  # noqa: S605 - between bursts
        if PROFILES is not None and PROFILES.on:
            PROFILES.mine().disable()
            PROFILES.on = False
        return
    if ARGS.callgrind:
        os.system(f"callgrind_control -i on {os.getpid()} >/dev/null")  # noqa: S605 - between bursts
    if PROFILES is not None:
        PROFILES.on = True
        PROFILES.mine().enable()


def main() -> None:
    args = ARGS
    extras = setup(args.team)
    counter = StatementCounter()
    cpus = asyncio.run(rounds(args.runs, extras, args.rounds, counter, args.ticks, args.listen))
    statements = sum(counter.full.values())
    kinds: collections.Counter[str] = collections.Counter()
    for sql, count in counter.full.items():
        kinds[counter.kind(sql)] += count
    load = os.getloadavg()[0]
    print(
        f"runs per burst: {args.runs}; ticks {args.ticks} {args.tick_ms} ms apart; team: {args.team};"
        f" listen: {args.listen}; load {load:.2f}"
    )
    print(f"CPU per run (rounds after the first): median {statistics.median(cpus):.2f} ms, min {min(cpus):.2f} ms")
    print(f"SQL statements per run (last round): {statements / args.runs:.1f}")
    for kind, count in kinds.most_common():
        print(f"  {count / args.runs:6.2f}  {kind}")
    if args.sql:
        for sql, count in counter.full.most_common():
            print(f"{count / args.runs:6.2f}  {sql[:300]}")


if __name__ == "__main__":
    main()
