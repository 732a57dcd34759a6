"""Retention: sessions idle past their team's or the default retention are deleted with
their journal, runs and media; held sessions (awaiting a decision, or held by a
registered check such as a review queue or a share link) are kept; a dry run deletes
nothing. Through `manage.py sectr_retention`, the real database and real media files.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import timedelta
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.utils import timezone

from sessions_app import actions
from sessions_app.models import Envelope, MediaBlob, Run, Session, SessionMedia, Team
from sessions_app.ops import retention
from tests.server.test_media import PNG, image_part

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
