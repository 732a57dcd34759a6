"""Worker liveness on PostgreSQL: a session-level advisory lock per worker.

A running run whose worker holds its lock is not claimable before its lease expires; the
moment the lock is free (the worker's database session ended: kill -9), another worker
claims it, lease or not. SQLite has no such locks (its workers wait for the lease).
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection

from sessions_app import actions, runs
from sessions_app.models import Run

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
    recovered = runs.claim_next_run("other-worker", 60.0)
    assert recovered is not None and recovered.run_id == posted.pk and recovered.recovered
    assert recovered.token != claim.token  # the dead worker's late writes are fenced off
    run = Run.objects.get(pk=posted.pk)
    assert run.lease_owner == "other-worker" and run.attempts == 2


def test_a_claim_skips_a_session_someone_holds_and_takes_the_next(owner: Any) -> None:
    """Workers look at the oldest candidates first; a session locked by another claim or
    an action is skipped at once (SKIP LOCKED), not waited for in lock-step."""
    import threading
    import time

    from django.db import transaction

    from sessions_app.models import Session

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
