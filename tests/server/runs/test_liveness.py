"""Worker liveness on PostgreSQL: a session-level advisory lock per worker.

A running run whose worker holds its lock is not claimable before its lease expires; the
moment the lock is free (the worker's database session ended: kill -9), another worker
claims it, lease or not. SQLite has no such locks (its workers wait for the lease).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.utils import timezone

from sectr.providers import DemoProvider
from sectr.runtime import Runtime
from sessions_app import actions, runs
from sessions_app.dbthread import run_in_db_thread
from sessions_app.journal import DatabaseJournal
from sessions_app.models import Run, Session
from sessions_app.worker import Worker

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def postgres_only() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("advisory locks are PostgreSQL's; SQLite's workers wait for the lease")


def test_a_run_is_recovered_at_once_when_its_workers_lock_is_free(owner: Any) -> None:
    session = actions.do_create_session(owner)
    posted = actions.do_post_message(owner, session.pk, "!slow 50")
    alive = runs.LivenessLock("alive-worker")
    alive.acquire()
    try:
        claim = runs.claim_next_run("alive-worker", 60.0)
        assert claim is not None and claim.run_id == posted.pk
        # Its worker lives (lock held) and the lease has a minute to go: nobody takes it.
        assert runs.claim_next_run("other-worker", 60.0) is None
        with pytest.raises(RuntimeError, match="another live worker"):
            runs.LivenessLock("alive-worker").acquire()
    finally:
        alive.release()  # what kill -9 does to its connection
    # PostgreSQL frees the lock when that backend has exited, a moment after the close.
    deadline = time.monotonic() + 5
    while (recovered := runs.claim_next_run("other-worker", 60.0)) is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert recovered is not None and recovered.run_id == posted.pk and recovered.recovered
    assert recovered.token != claim.token  # the dead worker's late writes are fenced off
    run = Run.objects.get(pk=posted.pk)
    assert run.lease_owner == "other-worker" and run.attempts == 2


def _holders(worker_id: str) -> list[int]:
    """The pids of the backends holding `worker_id`'s liveness lock."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND classid = %s"
            " AND objsubid = 2 AND objid = hashtext(%s)::oid"
            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            [runs.LIVENESS_LOCK_CLASS, worker_id],
        )
        return [row[0] for row in cursor.fetchall()]


def _terminate(lock: runs.LivenessLock) -> int:
    """What a PostgreSQL restart does to the lock's connection (the worker lives on)."""
    pid = int(lock.connection.info.backend_pid)
    assert _holders(lock.worker_id) == [pid]
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s, 5000)", [pid])
    deadline = time.monotonic() + 10
    while pid in _holders(lock.worker_id):
        assert time.monotonic() < deadline, "the terminated backend still holds the lock"
        time.sleep(0.02)
    return pid


def test_a_lock_whose_connection_died_is_taken_again_and_its_runs_are_safe_again(owner: Any) -> None:
    session = actions.do_create_session(owner)
    posted = actions.do_post_message(owner, session.pk, "!slow 50")
    lock = runs.LivenessLock("living-worker")
    lock.acquire()
    try:
        assert lock.ensure() and lock.reacquired == 0  # held: nothing to do
        claim = runs.claim_next_run("living-worker", 60.0)
        assert claim is not None and claim.run_id == posted.pk
        _terminate(lock)
        # The lock is gone: the run looks abandoned to every claimer.
        assert Run.objects.filter(runs._runnable(timezone.now()), pk=posted.pk).exists()
        assert lock.ensure() and lock.reacquired == 1
        assert len(_holders("living-worker")) == 1
        assert runs.claim_next_run("other-worker", 60.0) is None  # its worker lives again
        assert Run.objects.get(pk=posted.pk).lease_owner == "living-worker"
    finally:
        lock.release()


def test_a_held_lock_is_checked_without_a_round_trip_and_a_dead_one_is_seen(owner: Any) -> None:
    """Each worker checks its lock every second and before each claim pass: while nothing
    has arrived on its connection that takes no query (an idle worker's two round trips a
    second); a terminated backend's notice or closed socket is seen at the next check."""
    lock = runs.LivenessLock("quiet-worker")
    assert not lock.looks_held()  # not taken yet
    lock.acquire()
    try:
        queries: list[object] = []
        execute = lock.connection.execute
        lock.connection.execute = lambda *args, **kwargs: queries.append(args) or execute(*args, **kwargs)
        assert lock.looks_held()
        assert lock.ensure() and lock.ensure() and lock.reacquired == 0
        assert queries == [], "a held lock's check made a round trip"
        _terminate(lock)
        deadline = time.monotonic() + 5
        while lock.looks_held():
            assert time.monotonic() < deadline, "the terminated connection still looks held"
            time.sleep(0.01)
        assert lock.ensure() and lock.reacquired == 1  # taken again on a new connection
        assert lock.looks_held() and len(_holders("quiet-worker")) == 1
    finally:
        lock.close()
    assert not lock.looks_held()


def test_a_worker_never_claims_a_run_it_is_executing_however_abandoned_it_looks(owner: Any) -> None:
    session = actions.do_create_session(owner)
    posted = actions.do_post_message(owner, session.pk, "!slow 50")
    lock = runs.LivenessLock("busy-worker")
    lock.acquire()
    try:
        (claim,) = runs.claim_next_runs("busy-worker", 60.0, 4)
        _terminate(lock)  # its lock's connection died an instant before its next claim
        assert runs.claim_next_runs("busy-worker", 60.0, 4, executing=[claim.run_id]) == []
        assert Run.objects.get(pk=posted.pk).lease_token == claim.token  # still its first claim
        # What it would have done without knowing: take its own run over as abandoned.
        (again,) = runs.claim_next_runs("busy-worker", 60.0, 4)
        assert again.run_id == claim.run_id and again.token != claim.token and again.recovered
    finally:
        lock.release()


def test_a_run_its_living_worker_released_is_claimable_at_once(owner: Any) -> None:
    """A worker that stops a run and releases it (the journal became unavailable, a
    drain ran out of time) keeps its liveness lock: the release itself, not the lock,
    says the run is free (it waited LIVE_OWNER_GRACE_LEASES more leases: a 31.8 s
    stall after a PostgreSQL restart)."""
    session = actions.do_create_session(owner)
    posted = actions.do_post_message(owner, session.pk, "!slow 50")
    lock = runs.LivenessLock("releasing-worker")
    lock.acquire()
    try:
        claim = runs.claim_next_run("releasing-worker", 60.0)
        assert claim is not None and claim.run_id == posted.pk
        runs.release_lease(claim)
        assert _holders("releasing-worker") == [int(lock.connection.info.backend_pid)]  # alive
        recovered = runs.claim_next_run("other-worker", 60.0)
        assert recovered is not None and recovered.run_id == posted.pk and recovered.recovered
        run = Run.objects.get(pk=posted.pk)
        assert (run.lease_owner, run.lease_token, run.attempts) == ("other-worker", recovered.token, 2)
    finally:
        lock.release()


def test_a_release_by_a_worker_that_lost_the_run_changes_nothing(owner: Any) -> None:
    session = actions.do_create_session(owner)
    posted = actions.do_post_message(owner, session.pk, "!slow 50")
    first = runs.LivenessLock("first-worker")
    second = runs.LivenessLock("second-worker")
    first.acquire()
    second.acquire()
    try:
        claim = runs.claim_next_run("first-worker", 60.0)
        assert claim is not None
        Run.objects.filter(pk=posted.pk).update(lease_expires_at=timezone.now() - timedelta(hours=1))
        taken = runs.claim_next_run("second-worker", 60.0)
        assert taken is not None and taken.recovered
        runs.release_lease(claim)  # too late: the run is the second worker's now
        run = Run.objects.get(pk=posted.pk)
        assert (run.lease_owner, run.lease_token) == ("second-worker", taken.token)
        assert runs.claim_next_run("third-worker", 60.0) is None
    finally:
        first.release()
        second.release()


@pytest.mark.timeout(60)
async def test_a_worker_takes_its_lost_lock_again_and_keeps_its_runs(owner: Any) -> None:
    session = await run_in_db_thread(actions.do_create_session, owner)
    runtime = Runtime(DatabaseJournal(), provider=DemoProvider(slow_delay=0.1))
    worker = Worker(concurrency=2, poll_interval=0.1, lease=30.0, runtime=runtime)
    task = asyncio.ensure_future(worker.run(drain_timeout=5))
    try:
        posted = await run_in_db_thread(actions.do_post_message, owner, session.pk, "!slow 30")

        def running() -> bool:
            return Run.objects.get(pk=posted.pk).status == Run.RUNNING

        await _wait(running)
        dead = await run_in_db_thread(_terminate, worker.liveness)
        # Within a second or so (its watcher), long before the 30 s lease would matter.
        await _wait(lambda: len(pids := _holders(worker.worker_id)) == 1 and dead not in pids, timeout=10)
        assert worker.liveness.reacquired == 1
        # Nobody may take its run now: its lock says it lives.
        assert await run_in_db_thread(runs.claim_next_run, "other-worker", 60.0) is None
        await _wait(lambda: Run.objects.get(pk=posted.pk).status == Run.COMPLETED, timeout=30)
        run = await run_in_db_thread(Run.objects.get, pk=posted.pk)
        assert (run.attempts, run.lease_owner) == (1, worker.worker_id)
    finally:
        worker.stop()
        await asyncio.wait_for(task, 15)


async def _wait(check: Callable[[], Any], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not await run_in_db_thread(check):
        assert time.monotonic() < deadline, f"timed out waiting for {check}"
        await asyncio.sleep(0.05)


def test_a_claim_skips_a_session_someone_holds_and_takes_the_next(owner: Any) -> None:
    """Workers look at the oldest candidates first; a session locked by another claim or
    an action is skipped at once (SKIP LOCKED), not waited for in lock-step."""

    held_session = actions.do_create_session(owner)
    free_session = actions.do_create_session(owner)
    held_run = actions.do_post_message(owner, held_session.pk, "!slow 5")  # the oldest
    free_run = actions.do_post_message(owner, free_session.pk, "!slow 5")
    locked, release = threading.Event(), threading.Event()

    def hold() -> None:
        try:
            with transaction.atomic():
                Session.objects.select_for_update().get(pk=held_session.pk)
                locked.set()
                release.wait(30)
        finally:
            connection.close()

    holder = threading.Thread(target=hold)
    holder.start()
    alive = runs.LivenessLock("w-skip")  # its claims stay its own (a live worker's)
    alive.acquire()
    try:
        assert locked.wait(10)
        started = time.monotonic()
        claims = runs.claim_next_runs("w-skip", 60.0, 2)
        assert time.monotonic() - started < 2.0  # not behind the holder's 30 s
        assert [c.run_id for c in claims] == [free_run.pk]
        assert Run.objects.get(pk=held_run.pk).status == Run.QUEUED
    finally:
        release.set()
        holder.join(10)
    try:
        later = runs.claim_next_runs("w-skip", 60.0, 2)
        assert [c.run_id for c in later] == [held_run.pk]
    finally:
        alive.release()


def test_a_live_owners_expired_lease_is_waited_for_a_while(owner: Any) -> None:
    """An owner that holds its lock is alive, only late (starved): its run is taken over
    after LIVE_OWNER_GRACE_LEASES leases past the expiry, not at once."""

    session = actions.do_create_session(owner)
    posted = actions.do_post_message(owner, session.pk, "!slow 50")
    alive = runs.LivenessLock("late-worker")
    alive.acquire()
    try:
        claim = runs.claim_next_run("late-worker", 60.0)
        assert claim is not None and claim.run_id == posted.pk
        lease = runs.lease_seconds()
        Run.objects.filter(pk=posted.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
        assert runs.claim_next_run("other-worker", 60.0) is None  # late, but alive
        long_ago = timezone.now() - timedelta(seconds=lease * (runs.LIVE_OWNER_GRACE_LEASES + 1))
        Run.objects.filter(pk=posted.pk).update(lease_expires_at=long_ago)
        taken = runs.claim_next_run("other-worker", 60.0)
        assert taken is not None and taken.run_id == posted.pk and taken.recovered
    finally:
        alive.release()


def test_a_heartbeat_skips_a_run_row_a_journal_write_holds(owner: Any) -> None:
    """The heartbeat renews the rows nobody holds and leaves a held one for its next
    beat. A plain UPDATE of all the worker's rows waited for the row a group commit held
    (its fence check) while holding the next one that group wanted: a deadlock, which
    PostgreSQL broke after deadlock_timeout (1 s) with every stream of the worker stalled."""

    sessions = [actions.do_create_session(owner) for _ in range(2)]
    posted = [actions.do_post_message(owner, s.pk, "!slow 50") for s in sessions]
    alive = runs.LivenessLock("w-beat")
    alive.acquire()
    locked, release = threading.Event(), threading.Event()
    try:
        claims = runs.claim_next_runs("w-beat", 60.0, 2)
        assert sorted(c.run_id for c in claims) == sorted(r.pk for r in posted)
        held, free = claims
        before = dict(Run.objects.values_list("pk", "lease_expires_at"))

        def write() -> None:  # what a group commit's fence check does to its run's row
            try:
                with transaction.atomic():
                    list(Run.objects.select_for_update(no_key=True).filter(pk=held.run_id))
                    locked.set()
                    release.wait(30)
            finally:
                connection.close()

        writer = threading.Thread(target=write)
        writer.start()
        assert locked.wait(10)
        started = time.monotonic()
        beats = runs.heartbeat_runs(claims, 60.0, renew=True)
        assert time.monotonic() - started < 0.5  # not behind the writer's transaction
        assert beats == {held.run_id: (True, None), free.run_id: (True, None)}
        after = dict(Run.objects.values_list("pk", "lease_expires_at"))
        assert after[held.run_id] == before[held.run_id]  # left for the next beat
        assert after[free.run_id] > before[free.run_id]
        release.set()
        writer.join(10)
        runs.heartbeat_runs(claims, 60.0, renew=True)
        assert Run.objects.get(pk=held.run_id).lease_expires_at > before[held.run_id]
    finally:
        release.set()
        alive.release()


def test_two_workers_claiming_at_once_share_the_runs_without_overlap(owner: Any) -> None:
    """Batch claims lock the oldest Run rows SKIP LOCKED, then their sessions: two
    workers claiming side by side get disjoint sets that together are every run."""

    posted = {actions.do_post_message(owner, actions.do_create_session(owner).pk, "!slow 5").pk for _ in range(24)}
    locks = [runs.LivenessLock(f"w-pair-{i}") for i in range(2)]
    for lock in locks:
        lock.acquire()
    claimed: dict[str, list[str]] = {lock.worker_id: [] for lock in locks}
    start = threading.Barrier(2)

    def claim_all(worker_id: str) -> None:
        try:
            start.wait(10)
            while batch := runs.claim_next_runs(worker_id, 60.0, 4):
                claimed[worker_id] += [c.run_id for c in batch]
        finally:
            connection.close()

    try:
        threads = [threading.Thread(target=claim_all, args=(lock.worker_id,)) for lock in locks]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        first, second = claimed.values()
        assert not set(first) & set(second)
        assert set(first) | set(second) == posted
        assert first and second  # both got some: neither waited behind the other
        owners = dict(Run.objects.filter(pk__in=posted).values_list("pk", "lease_owner"))
        assert all(owners[run_id] == worker for worker, ids in claimed.items() for run_id in ids)
    finally:
        for lock in locks:
            lock.release()


class RefusingConnect:
    """psycopg.connect, refusing the liveness connections of `worker_id` while `refusing`
    is set, with the error PostgreSQL gives a connection over max_connections. Every
    other connection (the pool's, the test's) goes through."""

    def __init__(self, worker_id: str) -> None:
        import psycopg

        self.real = psycopg.connect
        self.worker_id = worker_id
        self.refusing = threading.Event()
        self.refusals = 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        import psycopg

        if self.refusing.is_set() and kwargs.get("application_name") == f"sectr worker {self.worker_id} liveness":
            self.refusals += 1
            raise psycopg.OperationalError(
                'connection failed: connection to server at "127.0.0.1", port 5432 failed:'
                " FATAL:  sorry, too many clients already"
            )
        return self.real(*args, **kwargs)


@pytest.mark.timeout(60)
async def test_a_worker_refused_its_lock_at_start_lives_and_claims_once_postgresql_accepts(
    owner: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """PostgreSQL full at a worker's start ("too many clients already") delays its first
    claim; it used to end the worker's task before that claim (an embedded worker's
    silently), leaving every queued run queued."""
    import psycopg

    session = await run_in_db_thread(actions.do_create_session, owner)
    posted = await run_in_db_thread(actions.do_post_message, owner, session.pk, "hello")
    runtime = Runtime(DatabaseJournal(), provider=DemoProvider(slow_delay=0.1))
    worker = Worker(concurrency=2, poll_interval=0.1, lease=30.0, runtime=runtime)
    connect = RefusingConnect(worker.worker_id)
    connect.refusing.set()
    monkeypatch.setattr(psycopg, "connect", connect)
    caplog.set_level("WARNING", logger="sectr.runs")
    task = asyncio.ensure_future(worker.run(drain_timeout=5))
    try:
        # Refused at its start and at the checks after it: alive, claiming nothing.
        deadline = time.monotonic() + 10
        while connect.refusals < 3:
            assert not task.done(), f"the worker ended: {task.exception()!r}"
            assert time.monotonic() < deadline, "the worker stopped trying to take its lock"
            await asyncio.sleep(0.05)
        assert (await run_in_db_thread(Run.objects.get, pk=posted.pk)).status == Run.QUEUED
        assert await run_in_db_thread(_holders, worker.worker_id) == []
        assert "liveness lock not taken yet (claiming nothing)" in caplog.text
        assert "too many clients already" in caplog.text
        connect.refusing.clear()  # PostgreSQL accepts again
        await _wait(lambda: Run.objects.get(pk=posted.pk).status == Run.COMPLETED, timeout=15)
        run = await run_in_db_thread(Run.objects.get, pk=posted.pk)
        assert (run.attempts, run.lease_owner) == (1, worker.worker_id)
        assert len(await run_in_db_thread(_holders, worker.worker_id)) == 1
        assert "liveness lock taken after" in caplog.text
        assert worker.liveness.reacquired == 0  # a first take, not a take-over
    finally:
        worker.stop()
        await asyncio.wait_for(task, 15)


@pytest.mark.timeout(60)
async def test_a_stopped_worker_releases_its_lock_even_with_a_check_under_way(
    owner: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker stopped while a liveness check is taking its lock again (a connect that
    takes a while) holds no lock once stopped: a lock held past the worker's end (the
    embedded worker's process lives on) would make its runs look alive to every claimer."""
    import psycopg

    runtime = Runtime(DatabaseJournal(), provider=DemoProvider())
    worker = Worker(concurrency=2, poll_interval=0.1, lease=3.0, runtime=runtime)
    task = asyncio.ensure_future(worker.run(drain_timeout=5))
    stopped = threading.Event()
    task.add_done_callback(lambda _: stopped.set())
    connecting = threading.Event()
    real = psycopg.connect

    def slow_connect(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("application_name") == f"sectr worker {worker.worker_id} liveness":
            connecting.set()
            stopped.wait(2.0)  # a loaded server's slow answer: until the worker stopped, at most 2 s
        return real(*args, **kwargs)

    try:
        await _wait(lambda: len(_holders(worker.worker_id)) == 1)
        monkeypatch.setattr(psycopg, "connect", slow_connect)
        await run_in_db_thread(_terminate, worker.liveness)  # the next check takes it again
        assert await asyncio.to_thread(connecting.wait, 10)
    finally:
        worker.stop()
        await asyncio.wait_for(task, 15)
    with worker.liveness._guard:  # the check under way has ended
        pass
    deadline = time.monotonic() + 5  # PostgreSQL frees a lock when its backend has exited
    while held := await run_in_db_thread(_holders, worker.worker_id):
        assert time.monotonic() < deadline, f"the stopped worker still holds its lock: {held}"
        await asyncio.sleep(0.02)
    assert not worker.liveness.ensure()  # closed for good


@pytest.mark.timeout(60)
async def test_a_worker_claims_while_asyncios_default_threads_are_all_busy(owner: Any) -> None:
    """Sync tools run in asyncio's default thread pool; the liveness check, which every
    claim pass waits for, has a thread of its own and is not queued behind them."""
    from concurrent.futures import ThreadPoolExecutor

    loop = asyncio.get_running_loop()
    busy = ThreadPoolExecutor(max_workers=2)
    loop.set_default_executor(busy)
    release = threading.Event()
    blockers = [loop.run_in_executor(None, release.wait, 30) for _ in range(2)]
    session = await run_in_db_thread(actions.do_create_session, owner)
    posted = await run_in_db_thread(actions.do_post_message, owner, session.pk, "hello")
    runtime = Runtime(DatabaseJournal(), provider=DemoProvider())
    worker = Worker(concurrency=2, poll_interval=0.1, lease=30.0, runtime=runtime)
    task = asyncio.ensure_future(worker.run(drain_timeout=5))
    try:
        await _wait(lambda: Run.objects.get(pk=posted.pk).status != Run.QUEUED, timeout=10)
    finally:
        release.set()
        await asyncio.gather(*blockers)
        worker.stop()
        await asyncio.wait_for(task, 15)


def test_the_polls_probe_opens_no_claim_on_an_empty_queue_and_claims_what_a_claim_would(
    owner: Any, monkeypatch: Any
) -> None:
    """claim_next_runs(probe=True), an idle worker's poll: nothing runnable is one
    statement that locks nothing, no claim transaction; a queued run, a dead worker's run
    and an expired lease are still claimed at that poll; a run the worker executes
    itself, however abandoned it looks, is neither claimed nor worth a claim."""
    from django.test.utils import CaptureQueriesContext

    real_batch = runs._claim_batch
    batches: list[str] = []

    def counted_batch(*args: Any, **kwargs: Any) -> Any:
        batches.append(args[0])
        return real_batch(*args, **kwargs)

    monkeypatch.setattr(runs, "_claim_batch", counted_batch)
    with CaptureQueriesContext(connection) as captured:
        assert runs.claim_next_runs("w-probe", 60.0, 4, probe=True, tidy_stranded=False) == []
    assert batches == [] and len(captured.captured_queries) == 1
    assert "FOR UPDATE" not in captured.captured_queries[0]["sql"]

    session = actions.do_create_session(owner)
    posted = actions.do_post_message(owner, session.pk, "!slow 50")
    dying = runs.LivenessLock("dying-worker")
    dying.acquire()
    try:
        (claim,) = runs.claim_next_runs("dying-worker", 60.0, 4, probe=True, tidy_stranded=False)
        assert claim.run_id == posted.pk
        assert runs.claim_next_runs("w-probe", 60.0, 4, probe=True, tidy_stranded=False) == []  # its owner lives
        _terminate(dying)
        batches.clear()
        assert runs.claim_next_runs("dying-worker", 60.0, 4, [claim.run_id], probe=True, tidy_stranded=False) == []
        assert batches == []
    finally:
        dying.release()
    # Its worker died (lock free): the next worker's poll recovers it, lease or not.
    (recovered,) = runs.claim_next_runs("w-probe", 60.0, 4, probe=True, tidy_stranded=False)
    assert recovered.run_id == posted.pk and recovered.recovered
    # A living owner's lease past its expiry and the patience: claimable by the probe too.
    alive = runs.LivenessLock("w-alive")
    alive.acquire()
    try:
        Run.objects.filter(pk=posted.pk).update(lease_owner="w-alive", lease_expires_at=timezone.now())
        assert runs.claim_next_runs("w-probe-2", 60.0, 4, probe=True, tidy_stranded=False) == []
        Run.objects.filter(pk=posted.pk).update(lease_expires_at=timezone.now() - timedelta(hours=1))
        (taken,) = runs.claim_next_runs("w-probe-2", 60.0, 4, probe=True, tidy_stranded=False)
        assert taken.run_id == posted.pk and taken.recovered
    finally:
        alive.release()
