"""Retention: sessions idle past their team's or the default retention are deleted with
their journal, runs and media; held sessions (awaiting a decision, or held by a
registered check such as a review queue or a share link) are kept; a dry run deletes
nothing. Through `manage.py sectr_retention`, the real database and real media files.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.db import connection
from django.utils import timezone

from sectr.runtime import Runtime
from sessions_app import actions
from sessions_app.dbthread import run_in_db_thread
from sessions_app.journal import DatabaseJournal
from sessions_app.models import Envelope, MediaBlob, PeriodicJob, Run, Session, SessionMedia, Team
from sessions_app.ops import retention
from sessions_app.worker import Worker
from tests.server.chat.test_media import PNG, image_part
from tests.server.conftest import join_team

pytestmark = [pytest.mark.django_db]


@pytest.fixture(autouse=True)
def media_root(settings: Any, tmp_path: Path) -> Path:
    settings.MEDIA_ROOT = str(tmp_path)
    settings.SECTR_RETENTION_DAYS = 30
    return tmp_path


def idle_for(session: Session, days: float) -> None:
    Session.objects.filter(pk=session.pk).update(updated_at=timezone.now() - timedelta(days=days))


def run_command(*args: str) -> str:
    out = StringIO()
    call_command("sectr_retention", *args, stdout=out)
    return out.getvalue()


@pytest.fixture
def hold_registry() -> Iterator[list[retention.HoldCheck]]:
    added: list[retention.HoldCheck] = []
    yield added
    for check in added:
        retention._holds.remove(check)


def test_it_deletes_sessions_idle_past_the_default_with_journal_runs_and_media(
    make_session: Any, owner: Any, media_root: Path, django_capture_on_commit_callbacks: Any, caplog: Any
) -> None:
    old = make_session(title="old")
    run = actions.do_post_message_with_media(owner, old.pk, [{"type": "text", "text": "see"}, image_part(PNG)])
    actions.do_cancel(owner, run.pk)
    idle_for(old, 31)
    recent = make_session(title="recent")
    idle_for(recent, 29)
    assert MediaBlob.objects.count() == 1 and any(p.is_file() for p in media_root.rglob("*"))
    envelopes = Envelope.objects.filter(session=old).count()

    with caplog.at_level(logging.INFO, logger="sectr.retention"), django_capture_on_commit_callbacks(execute=True):
        out = run_command()

    assert not Session.objects.filter(pk=old.pk).exists()
    assert Session.objects.filter(pk=recent.pk).exists()
    assert not Envelope.objects.filter(session_id=old.pk).exists()
    assert not Run.objects.filter(session_id=old.pk).exists()
    assert MediaBlob.objects.count() == 0 and SessionMedia.objects.count() == 0
    assert not any(p.is_file() for p in media_root.rglob("*")), "its media files are gone too"
    assert f"deleted {old.pk} (owner owner" in out and f"{envelopes} envelopes, 1 media blobs" in out
    assert "retention: deleted 1 session(s), kept 0" in out
    assert any(f"deleted session {old.pk}" in r.getMessage() for r in caplog.records)


def test_a_dry_run_lists_what_it_would_delete_and_deletes_nothing(make_session: Any) -> None:
    old = make_session(title="old")
    idle_for(old, 40)
    out = run_command("--dry-run")
    assert f"would delete {old.pk} (owner owner" in out
    assert "retention: would delete 1 session(s)" in out
    assert Session.objects.filter(pk=old.pk).exists() and Envelope.objects.filter(session=old).exists()


def test_no_default_retention_keeps_everything(make_session: Any, settings: Any) -> None:
    settings.SECTR_RETENTION_DAYS = 0
    old = make_session(title="old")
    idle_for(old, 4000)
    assert "deleted 0 session(s)" in run_command()
    assert Session.objects.filter(pk=old.pk).exists()


def test_a_teams_retention_overrides_the_default(make_session: Any) -> None:
    short = Team.objects.create(name="short", retention_days=2)
    forever = Team.objects.create(name="forever", retention_days=0)
    unset = Team.objects.create(name="unset")
    sessions = {name: make_session(title=name) for name in ("short-3d", "short-1d", "forever", "unset", "personal")}
    for name, team in (("short-3d", short), ("short-1d", short), ("forever", forever), ("unset", unset)):
        Session.objects.filter(pk=sessions[name].pk).update(team=team)
    for name, days in (("short-3d", 3), ("short-1d", 1), ("forever", 400), ("unset", 31), ("personal", 31)):
        idle_for(sessions[name], days)

    run_command()
    left = set(Session.objects.values_list("title", flat=True))
    assert left == {"short-1d", "forever"}


def test_a_session_awaiting_a_decision_is_kept_until_decided(make_session: Any, owner: Any) -> None:
    session = make_session(title="asks")
    Session.objects.filter(pk=session.pk).update(status="awaiting")
    idle_for(session, 90)
    out = run_command()
    assert f"kept {session.pk}: awaiting an approval decision" in out
    assert Session.objects.filter(pk=session.pk).exists()

    Session.objects.filter(pk=session.pk).update(status="completed")
    run_command()
    assert not Session.objects.filter(pk=session.pk).exists()


def test_a_registered_hold_keeps_a_session_until_it_is_released(
    make_session: Any, hold_registry: list[retention.HoldCheck]
) -> None:
    shared = make_session(title="shared")
    other = make_session(title="other")
    idle_for(shared, 60)
    idle_for(other, 60)
    held = {shared.pk}

    def shared_sessions(session_ids: list[str]) -> dict[str, str]:
        return {pk: "shared" for pk in session_ids if pk in held}

    hold_registry.append(retention.add_retention_hold(shared_sessions))
    out = run_command()
    assert f"kept {shared.pk}: shared" in out
    assert set(Session.objects.values_list("title", flat=True)) == {"shared"}

    held.clear()  # the share link was revoked
    run_command()
    assert not Session.objects.exists()


def test_a_session_with_an_active_run_or_used_again_is_not_deleted(make_session: Any, owner: Any) -> None:
    busy = make_session(title="busy")
    actions.do_post_message(owner, busy.pk, "!slow 3")  # queued: a run is active
    idle_for(busy, 60)
    revived = make_session(title="revived")
    cutoff = timezone.now() - timedelta(days=30)
    # picked as expired, then used again before its turn came: the lock-side check keeps it
    assert actions.do_delete_expired(revived.pk, cutoff=cutoff) is None
    assert actions.do_delete_expired(busy.pk, cutoff=cutoff) is None
    out = run_command()
    assert f"kept {busy.pk}" in out
    assert set(Session.objects.values_list("title", flat=True)) == {"busy", "revived"}


def test_review_queues_and_live_share_links_keep_a_session_until_released(make_session: Any, owner: Any) -> None:
    from sessions_app.models import ReviewQueueItem
    from sessions_app.review import actions as review_actions

    owner.is_staff = True  # staff review every session
    owner.save(update_fields=["is_staff"])
    queued, shared, plain = make_session(title="queued"), make_session(title="shared"), make_session(title="plain")
    for session in (queued, shared, plain):
        idle_for(session, 60)
    join_team(owner, "moderator", owner)  # a queue is a team's: the sessions go in the owner's team
    queue = review_actions.do_create_queue(owner, "weekly")
    review_actions.do_add_to_queue(owner, queue.pk, [queued])
    link = review_actions.do_create_share(owner, shared.pk)

    out = run_command()
    assert f"kept {queued.pk}: in a review queue" in out
    assert f"kept {shared.pk}: shared by a live link" in out
    assert set(Session.objects.values_list("title", flat=True)) == {"queued", "shared"}

    item = ReviewQueueItem.objects.get(session=queued)
    review_actions.do_mark_item_done(owner, item.pk)
    review_actions.do_revoke_share(owner, link.pk)
    run_command()
    assert not Session.objects.exists()


# ---- the workers' periodic sweep ----


def finished_sweep() -> PeriodicJob | None:
    return PeriodicJob.objects.filter(name="retention", finished_at__isnull=False).first()


def test_one_claim_of_a_periodic_job_wins_per_interval() -> None:
    now = timezone.now()
    assert retention.claim_periodic_job("job", 60, "worker-a", now)
    assert not retention.claim_periodic_job("job", 60, "worker-b", now + timedelta(seconds=30))
    assert not retention.claim_periodic_job("job", 60, "worker-a", now + timedelta(seconds=59))
    assert retention.claim_periodic_job("job", 60, "worker-b", now + timedelta(seconds=61))
    job = PeriodicJob.objects.get(name="job")
    assert job.holder == "worker-b" and job.due_at == now + timedelta(seconds=121)


@pytest.mark.django_db(transaction=True)
def test_workers_claiming_a_sweep_at_once_get_one_winner() -> None:
    now = timezone.now()
    barrier = threading.Barrier(6)

    def claim(index: int) -> bool:
        barrier.wait(10)
        try:
            return retention.claim_periodic_job("sweep", 3600, f"worker-{index}", now)
        finally:
            connection.close()  # this thread's

    with ThreadPoolExecutor(6) as pool:
        won = list(pool.map(claim, range(6)))
    assert won.count(True) == 1, won
    assert PeriodicJob.objects.get(name="sweep").holder == f"worker-{won.index(True)}"


def test_the_sweep_interval_is_read_from_the_settings(settings: Any) -> None:
    settings.SECTR_RETENTION_INTERVAL_S = 120.0
    assert retention.retention_interval() == 120
    settings.SECTR_RETENTION_INTERVAL_S = 0.0
    assert retention.retention_interval() == 0
    assert Worker(runtime=Runtime(DatabaseJournal())).retention_interval == 0
    settings.SECTR_RETENTION_INTERVAL_S = -5.0
    with pytest.raises(ImproperlyConfigured, match="SECTR_RETENTION_INTERVAL_S"):
        retention.retention_interval()


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(60)
async def test_the_workers_sweep_retention_one_at_a_time_and_log_what_they_removed(
    make_session: Any, caplog: Any
) -> None:
    old = await run_in_db_thread(make_session, title="old")
    recent = await run_in_db_thread(make_session, title="recent")
    await run_in_db_thread(idle_for, old, 31)
    workers = [
        Worker(worker_id=f"sweeper-{i}", retention_interval=3600, poll_interval=0.1, runtime=Runtime(DatabaseJournal()))
        for i in range(3)
    ]
    with caplog.at_level(logging.INFO, logger="sectr.retention"):
        tasks = [asyncio.ensure_future(worker.run(drain_timeout=1)) for worker in workers]
        try:
            deadline = time.monotonic() + 30
            while await run_in_db_thread(Session.objects.filter(pk=old.pk).exists):
                assert time.monotonic() < deadline, "no worker swept"
                await asyncio.sleep(0.05)
            job = await run_in_db_thread(finished_sweep)
            deadline = time.monotonic() + 10
            while job is None:
                assert time.monotonic() < deadline, "the sweep did not record its end"
                await asyncio.sleep(0.05)
                job = await run_in_db_thread(finished_sweep)
            await asyncio.sleep(0.5)  # the others have looked too by now (each looks at start)
        finally:
            for worker in workers:
                worker.stop()
            await asyncio.wait_for(asyncio.gather(*tasks), 20)
    assert await run_in_db_thread(Session.objects.filter(pk=recent.pk).exists)
    assert job.holder in {w.worker_id for w in workers} and job.summary["deleted"] == [old.pk]
    sweeps = [r.getMessage() for r in caplog.records if r.getMessage().startswith("retention sweep by")]
    assert sweeps == [f"retention sweep by {job.holder}: deleted 1 session(s) (1 envelopes, 0 media blobs), kept 0"]
    assert any(f"deleted session {old.pk}" in r.getMessage() for r in caplog.records)


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(60)
async def test_a_worker_with_the_sweep_off_deletes_nothing(make_session: Any) -> None:
    old = await run_in_db_thread(make_session, title="old")
    await run_in_db_thread(idle_for, old, 31)
    worker = Worker(retention_interval=0, poll_interval=0.1, runtime=Runtime(DatabaseJournal()))
    task = asyncio.ensure_future(worker.run(drain_timeout=1))
    await asyncio.sleep(1.0)
    worker.stop()
    await asyncio.wait_for(task, 20)
    assert await run_in_db_thread(Session.objects.filter(pk=old.pk).exists)
    assert not await run_in_db_thread(PeriodicJob.objects.filter(name="retention").exists)
