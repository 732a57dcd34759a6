"""Retention: sessions idle longer than their retention are deleted (issue 11, item 6).

A session's retention, in days, is its team's (`Team.retention_days`) or else the
default, SECTR_RETENTION_DAYS; 0 (the default) keeps sessions for ever. "Idle" counts
from the session's last journal entry (`Session.updated_at`). `manage.py
sectr_retention [--dry-run]` applies it by hand (the workers apply it on their own, below); each
deletion goes through the delete action (`do_delete_expired`: the session, its
journal, runs, search rows and media, under the session's lock) and is logged.

The workers also run the sweep themselves, every SECTR_RETENTION_INTERVAL_S seconds
(3600; 0 turns it off), one worker at a time: `sweep_if_due`, which does it only when
its conditional update of the `retention` PeriodicJob row wins (`claim_periodic_job`),
so however many workers run, the fleet sweeps once an interval.

Kept until released, whatever their age (`retention_holds`): sessions waiting on an
approval decision, sessions in a review queue (not yet done there) and sessions with a
live share link (not revoked, not expired).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db.models import Q
from django.utils import timezone

from sessions_app.actions import DeletedSession, do_delete_expired
from sessions_app.models import PeriodicJob, ReviewQueueItem, Session, ShareLink, Team

log = logging.getLogger("sectr.retention")

#: Functions that name why sessions must be kept: given session ids, {id: reason} for
#: the held ones. Review queues and share links (sessions_app.review) add theirs with
#: `add_retention_hold`; each is asked again under the session's lock before a delete.
HoldCheck = Callable[[list[str]], dict[str, str]]
_holds: list[HoldCheck] = []


def add_retention_hold(check: HoldCheck) -> HoldCheck:
    """Register a hold (usable as a decorator); registering one twice keeps one."""
    if check not in _holds:
        _holds.append(check)
    return check


def awaiting_decision(session_ids: list[str]) -> dict[str, str]:
    """A session paused on an approval ask is kept until the ask is decided (or expires)."""
    awaiting = Session.objects.filter(pk__in=session_ids, status="awaiting").values_list("pk", flat=True)
    return dict.fromkeys(awaiting, "awaiting an approval decision")


def under_review(session_ids: list[str]) -> dict[str, str]:
    """A session in a review queue and not yet done there is kept until it is reviewed."""
    queued = ReviewQueueItem.objects.filter(session_id__in=session_ids, done_at__isnull=True)
    return dict.fromkeys(queued.values_list("session_id", flat=True), "in a review queue")


def shared(session_ids: list[str]) -> dict[str, str]:
    """A session with a live share link (not revoked, not expired) is kept until it is released."""
    live = ShareLink.objects.filter(session_id__in=session_ids, revoked_at__isnull=True, expires_at__gt=timezone.now())
    return dict.fromkeys(live.values_list("session_id", flat=True), "shared by a live link")


add_retention_hold(awaiting_decision)
add_retention_hold(under_review)
add_retention_hold(shared)


def retention_holds(session_ids: Iterable[str]) -> dict[str, str]:
    """{session id: why it is kept} for the held ones among `session_ids`."""
    ids = list(session_ids)
    held: dict[str, str] = {}
    for check in _holds:
        if not ids:
            break
        for session_id, reason in check(ids).items():
            held.setdefault(session_id, reason)
        ids = [session_id for session_id in ids if session_id not in held]
    return held


def default_retention_days() -> int:
    return max(int(getattr(settings, "SECTR_RETENTION_DAYS", 0) or 0), 0)


@dataclass
class RetentionReport:
    deleted: list[DeletedSession] = field(default_factory=list)
    #: expired but kept: (session id, reason)
    kept: list[tuple[str, str]] = field(default_factory=list)
    #: what a dry run would delete: (session id, owner, updated_at)
    would_delete: list[tuple[str, str, datetime]] = field(default_factory=list)


def expired_sessions(now: datetime | None = None) -> list[tuple[str, str, datetime, datetime]]:
    """(session id, owner, updated_at, cutoff) of every session idle past its retention,
    oldest first."""
    now = now or timezone.now()
    default = default_retention_days()
    # Teams with a retention of their own; every other session (personal, or of a team
    # without one) takes the default.
    overrides = dict(Team.objects.filter(retention_days__isnull=False).values_list("pk", "retention_days"))
    rules: list[tuple[Q, int]] = [(Q(team_id=team_id), days or 0) for team_id, days in overrides.items()]
    rules.append((~Q(team_id__in=list(overrides)) | Q(team_id__isnull=True), default))
    found: list[tuple[str, str, datetime, datetime]] = []
    for scope, days in rules:
        if days <= 0:
            continue  # kept for ever
        cutoff = now - timedelta(days=days)
        rows = (
            Session.objects.filter(scope, updated_at__lt=cutoff)
            .order_by("updated_at")
            .values_list("pk", "owner__username", "updated_at")
        )
        found.extend((pk, owner, updated_at, cutoff) for pk, owner, updated_at in rows)
    found.sort(key=lambda row: row[2])
    return found


def apply_retention(*, dry_run: bool = False, now: datetime | None = None) -> RetentionReport:
    """Delete (or, dry, list) the sessions past their retention; log each one."""
    report = RetentionReport()
    candidates = expired_sessions(now)
    held = retention_holds(pk for pk, _owner, _updated, _cutoff in candidates)

    def still_held(session_id: str) -> str | None:
        return retention_holds([session_id]).get(session_id)

    for session_id, owner, updated_at, cutoff in candidates:
        reason = held.get(session_id)
        if reason is not None:
            report.kept.append((session_id, reason))
            log.info("retention: kept session %s (%s)", session_id, reason)
            continue
        if dry_run:
            report.would_delete.append((session_id, owner, updated_at))
            log.info("retention: would delete session %s of %s, idle since %s", session_id, owner, updated_at)
            continue
        deleted = do_delete_expired(session_id, cutoff=cutoff, held=still_held)
        if deleted is None:
            report.kept.append((session_id, "in use again, or held, when it came to deleting it"))
            log.info("retention: kept session %s (in use again or held)", session_id)
            continue
        report.deleted.append(deleted)
        log.info(
            "retention: deleted session %s of %s, idle since %s (%d envelopes, %d media blobs)",
            deleted.session_id,
            deleted.owner,
            deleted.updated_at.isoformat(),
            deleted.envelopes,
            deleted.media_blobs,
            extra={"session_id": deleted.session_id},
        )
    return report


# ---- the workers' periodic sweep ----

RETENTION_JOB = "retention"


def retention_interval() -> float:
    """Seconds between two sweeps by the workers (SECTR_RETENTION_INTERVAL_S, 3600; 0: off)."""
    interval = float(settings.SECTR_RETENTION_INTERVAL_S)
    if interval < 0:
        raise ImproperlyConfigured(f"SECTR_RETENTION_INTERVAL_S must be 0 (off) or more, not {interval!r}")
    return interval


def claim_periodic_job(name: str, interval: float, holder: str, now: datetime | None = None) -> bool:
    """Whether `holder` does job `name` now: True for exactly one caller per interval.

    One conditional UPDATE (`due_at <= now` moves to now + interval): on PostgreSQL
    concurrent callers queue on the row's lock and re-check the condition after the
    winner commits; on SQLite writers are serialised. A holder that dies mid-job leaves
    the next run to whoever comes after `due_at`.
    """
    now = now or timezone.now()
    PeriodicJob.objects.get_or_create(name=name, defaults={"due_at": now})
    won = PeriodicJob.objects.filter(name=name, due_at__lte=now).update(
        due_at=now + timedelta(seconds=interval), holder=holder, started_at=now, finished_at=None
    )
    return won == 1


def sweep_if_due(holder: str, interval: float, now: datetime | None = None) -> RetentionReport | None:
    """The worker's periodic retention sweep: apply_retention when this worker's claim of
    the interval wins (None otherwise); what it removed is logged (`sectr.retention`)."""
    if not claim_periodic_job(RETENTION_JOB, interval, holder, now):
        return None
    report = apply_retention(now=now)
    summary = {
        "deleted": [deleted.session_id for deleted in report.deleted],
        "kept": len(report.kept),
        "envelopes": sum(deleted.envelopes for deleted in report.deleted),
        "media_blobs": sum(deleted.media_blobs for deleted in report.deleted),
    }
    PeriodicJob.objects.filter(name=RETENTION_JOB, holder=holder).update(finished_at=timezone.now(), summary=summary)
    log.info(
        "retention sweep by %s: deleted %d session(s) (%d envelopes, %d media blobs), kept %d",
        holder,
        len(report.deleted),
        summary["envelopes"],
        summary["media_blobs"],
        len(report.kept),
    )
    return report
