"""A lost database is never a run's failure, nor a 500.

Every database read and write a run makes outside the journal (its team's rules as it
starts, its media before each model call, its steer slot) goes through
`run_in_db_thread`, which takes a lost connection for JournalUnavailable: the runtime
stops the run and its worker releases it for recovery, at once. The API answers a lost
database with 503 and Retry-After; an SSE stream that loses it mid-way ends with a
``retry:`` field, and the client resumes with its Last-Event-ID.

The errors are raised by hand on both databases; on PostgreSQL a last test terminates
the backends of the test database for real mid-run (what a restart does; the fault
tests restart the machine's PostgreSQL under a cluster).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import timedelta
from typing import Any

import psycopg
import psycopg_pool
import pytest
from django.db import InterfaceError, OperationalError, connection
from django.test import Client
from django.utils import timezone

from sectr.errors import JournalUnavailable
from sectr.fold import fold_messages
from sectr.providers import DemoProvider
from sectr.providers.base import CompletionRequest
from sectr.runtime import Runtime
from sessions_app import actions, media, runs
from sessions_app.actions.tokens import do_issue_token
from sessions_app.api import sse
from sessions_app.api import views as api_views
from sessions_app.dbthread import check_connection_pools, run_in_db_thread
from sessions_app.journal import DatabaseJournal
from sessions_app.models import ApprovalRule, Envelope, Run
from sessions_app.runtime import session_policy
from sessions_app.worker import Worker

pytestmark = pytest.mark.django_db(transaction=True)

ADMIN_COMMAND = "terminating connection due to administrator command"


def _raise(error: BaseException) -> None:
    raise error


@pytest.mark.parametrize(
    "error",
    [
        OperationalError(ADMIN_COMMAND),
        InterfaceError("connection already closed"),
        psycopg.OperationalError("server closed the connection unexpectedly"),
        psycopg.InterfaceError("the connection is closed"),
        psycopg_pool.PoolTimeout("couldn't get a connection after 30.00 sec"),
    ],
    ids=["django-operational", "django-interface", "psycopg-operational", "psycopg-interface", "pool-timeout"],
)
async def test_every_db_thread_call_takes_a_lost_database_for_unavailable(error: Exception) -> None:
    with pytest.raises(JournalUnavailable, match="the database is unavailable") as raised:
        await run_in_db_thread(_raise, error)
    assert raised.value.__cause__ is error


async def test_a_db_thread_call_lets_other_errors_through() -> None:
    error = ValueError("not the database's fault")
    with pytest.raises(ValueError) as raised:
        await run_in_db_thread(_raise, error)
    assert raised.value is error


# ---- a run's reads outside the journal ----


def types_of(session_id: str) -> list[str]:
    return list(Envelope.objects.filter(session_id=session_id).order_by("seq").values_list("type", flat=True))


def run_ended(run_id: str) -> Run | None:
    run = Run.objects.get(pk=run_id)
    return run if run.status not in (Run.QUEUED, Run.RUNNING) else None


async def wait_until(check: Callable[[], Any], timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := await run_in_db_thread(check)):
        assert time.monotonic() < deadline, f"timed out waiting for {check}"
        await asyncio.sleep(0.02)
    return value


@pytest.fixture
async def worker() -> AsyncIterator[Worker]:
    """A worker in this process whose runs read their team's rules from the database."""
    runtime = Runtime(DatabaseJournal(), provider=DemoProvider(delay=0.001, slow_delay=0.05), rules=session_policy)
    found = Worker(concurrency=4, poll_interval=0.1, lease=2.0, runtime=runtime)
    task = asyncio.ensure_future(found.run(drain_timeout=5))
    yield found
    found.stop()
    await asyncio.wait_for(task, 15)


async def test_a_lost_database_while_reading_the_rules_leaves_the_run_to_recovery(
    owner: Any, worker: Worker, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = ApprovalRule.policy_and_team_for_session
    failures = [OperationalError(ADMIN_COMMAND)]

    def policy_for_session(session_id: str) -> Any:
        if failures:
            raise failures.pop()
        return real(session_id)

    monkeypatch.setattr(ApprovalRule, "policy_and_team_for_session", policy_for_session)
    session = await run_in_db_thread(actions.do_create_session, owner)
    posted = await run_in_db_thread(actions.do_post_message, owner, session.pk, "hello")
    run = await wait_until(lambda: run_ended(posted.pk))
    assert failures == []
    assert (run.status, run.attempts) == (Run.COMPLETED, 2)  # recovered, not failed for good
    kinds = await run_in_db_thread(types_of, session.pk)
    assert "INVOCATION_FAILED" not in kinds
    assert kinds.count("INVOCATION_STARTED") == 2 and "SESSION_ERROR" in kinds
    assert kinds[-1] == "INVOCATION_COMPLETED"


async def test_a_stopped_run_is_released_once_the_database_is_back(owner: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The database still away when the worker stops the run: it keeps trying to release
    it, so the run is recovered as soon as the database is back, not after its lease
    (and, on PostgreSQL, the living owner's grace: LIVE_OWNER_GRACE_LEASES more)."""
    real_policy, real_release = ApprovalRule.policy_and_team_for_session, runs.release_lease
    policy_failures = [OperationalError(ADMIN_COMMAND)]
    release_failures = [OperationalError("connection refused")] * 3

    def policy_for_session(session_id: str) -> Any:
        if policy_failures:
            raise policy_failures.pop()
        return real_policy(session_id)

    def release_lease(claim: runs.Claim) -> None:
        if release_failures:
            raise release_failures.pop()
        real_release(claim)

    monkeypatch.setattr(ApprovalRule, "policy_and_team_for_session", policy_for_session)
    monkeypatch.setattr(runs, "release_lease", release_lease)
    lease = 10.0
    runtime = Runtime(DatabaseJournal(), provider=DemoProvider(delay=0.001), rules=session_policy)
    worker = Worker(concurrency=4, poll_interval=0.1, lease=lease, runtime=runtime)
    task = asyncio.ensure_future(worker.run(drain_timeout=5))
    try:
        session = await run_in_db_thread(actions.do_create_session, owner)
        posted = await run_in_db_thread(actions.do_post_message, owner, session.pk, "hello")
        started = time.monotonic()
        run = await wait_until(lambda: run_ended(posted.pk), timeout=3 * lease)
        took = time.monotonic() - started
    finally:
        worker.stop()
        await asyncio.wait_for(task, 15)
    assert release_failures == [] and (run.status, run.attempts) == (Run.COMPLETED, 2)
    assert took < lease / 2, f"recovered {took:.1f} s after the stop"


@pytest.mark.parametrize(
    ("released", "attempts", "outcome"), [(True, 3, "recovered"), (False, 3, "failed"), (True, 13, "failed")]
)
def test_a_run_its_worker_released_is_not_lost_too_often_as_soon(
    owner: Any, released: bool, attempts: int, outcome: str
) -> None:
    """Released by its living worker (the database went away), a run that made no
    progress since its last claim is recovered past max_attempts (3), up to 10 more; one
    whose worker stopped answering is not."""
    session = actions.do_create_session(owner)
    posted = actions.do_post_message(owner, session.pk, "hello")
    claim = runs.claim_next_run("first-worker", 60.0)
    assert claim is not None
    if released:
        runs.release_lease(claim)
    else:
        Run.objects.filter(pk=posted.pk).update(lease_expires_at=timezone.now() - timedelta(hours=1))
    Run.objects.filter(pk=posted.pk).update(attempts=attempts, lease_owner="gone-worker")
    taken = runs.claim_next_run("other-worker", 60.0)
    run = Run.objects.get(pk=posted.pk)
    if outcome == "recovered":
        assert taken is not None and taken.recovered and run.status == Run.RUNNING
    else:
        assert taken is None and run.status == Run.FAILED
        assert run.error == f"the run was lost {attempts} times (its workers stopped answering)"


async def test_a_lost_database_while_resolving_media_is_unavailable_not_a_failure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(media, "_blob_data", lambda sha256: _raise(OperationalError(ADMIN_COMMAND)))
    provider = media.MediaResolvingProvider(DemoProvider(delay=0))
    image = {"type": "image_url", "image_url": {"url": media.MEDIA_SCHEME + "ab" * 32}}
    request = CompletionRequest(model="demo", messages=[{"role": "user", "content": [image]}])
    with pytest.raises(JournalUnavailable, match=ADMIN_COMMAND):
        async for _event in provider.stream(request):
            pass


# ---- the API and its event streams ----


def test_the_api_answers_a_lost_database_with_503_and_retry_after(owner: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    session = actions.do_create_session(owner)
    run = actions.do_post_message(owner, session.pk, "hello")
    _, raw = do_issue_token(owner, "t")
    monkeypatch.setattr(api_views, "_run_for", lambda user, run_id: _raise(OperationalError(ADMIN_COMMAND)))
    client = Client()
    for path in (f"/api/v1/runs/{run.pk}/events", f"/api/v1/runs/{run.pk}"):
        response = client.get(path, HTTP_AUTHORIZATION=f"Bearer {raw}")
        assert response.status_code == 503, path
        assert response["Retry-After"] == "2"
        assert response.json()["error"]["code"] == "unavailable"
        assert ADMIN_COMMAND not in response.content.decode()  # the cause stays in the log


async def test_an_event_stream_that_loses_the_database_ends_with_retry(
    owner: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    session = await run_in_db_thread(actions.do_create_session, owner)
    posted = await run_in_db_thread(actions.do_post_message, owner, session.pk, "hello")
    run = await run_in_db_thread(Run.objects.get, pk=posted.pk)
    monkeypatch.setattr(sse, "read_envelopes", lambda *args: _raise(OperationalError(ADMIN_COMMAND)))
    frames = [frame async for frame in sse.RunStream(run, 0).frames()]
    assert frames[-1] == b": the database is unavailable\nretry: 2000\n\n"
    assert len(frames) == 2 and frames[0].startswith(b": stream of ")


# ---- PostgreSQL: the backends terminated for real ----


def terminate_other_backends() -> int:
    """What a restart does to this database's connections (but this test's own)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid, 5000)) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return int(cursor.fetchone()[0])


def reply_ticks(session_id: str) -> list[int]:
    rows = Envelope.objects.filter(session_id=session_id).order_by("seq")
    text = "".join(
        m.get("content") or "" for m in fold_messages(r.to_envelope() for r in rows) if m["role"] == "assistant"
    )
    return [int(n) for n in re.findall(r"tick (\d+)", text)]


@pytest.fixture
def postgres(transactional_db: None) -> Iterator[None]:
    if connection.vendor != "postgresql":
        pytest.skip("terminating backends is PostgreSQL's (SQLite has no server to lose)")
    yield
    # The test's own connection died too (its pool cannot tell until it is used): give it
    # back and have the pool test its idle ones, so the teardown and later tests get live ones.
    connection.close()
    check_connection_pools()


@pytest.mark.timeout(120)
async def test_a_run_whose_database_connections_are_terminated_mid_stream_completes(
    postgres: None, owner: Any, worker: Worker
) -> None:
    ticks = 40
    session = await run_in_db_thread(actions.do_create_session, owner)
    posted = await run_in_db_thread(actions.do_post_message, owner, session.pk, f"!slow {ticks}")
    for at in (5, 15, 25):  # three "restarts" in one run
        await wait_until(lambda n=at: len(reply_ticks(session.pk)) >= n)
        assert await run_in_db_thread(terminate_other_backends) >= 1
    run = await wait_until(lambda: run_ended(posted.pk), timeout=60)
    kinds = await run_in_db_thread(types_of, session.pk)
    print(f"attempts {run.attempts}, recoveries {kinds.count('SESSION_ERROR')}")  # pytest -s: which way it went
    assert "INVOCATION_FAILED" not in kinds, kinds
    assert run.status == Run.COMPLETED and kinds[-1] == "INVOCATION_COMPLETED"
    assert await run_in_db_thread(reply_ticks, session.pk) == list(range(1, ticks + 1))
    seqs = await run_in_db_thread(
        lambda: list(Envelope.objects.filter(session_id=session.pk).order_by("seq").values_list("seq", flat=True))
    )
    assert seqs == list(range(1, len(seqs) + 1))
