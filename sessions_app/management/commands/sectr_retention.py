"""Delete sessions past their retention: `python manage.py sectr_retention [--dry-run]`."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from sessions_app.ops.retention import apply_retention, default_retention_days


class Command(BaseCommand):
    help = (
        "Deletes sessions idle longer than their team's retention_days or SECTR_RETENTION_DAYS "
        "(with their journal, runs, search rows and media); sessions held (awaiting a decision, "
        "under review, shared) are kept. The workers also sweep every SECTR_RETENTION_INTERVAL_S seconds."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--dry-run", action="store_true", help="list what would be deleted; delete nothing")

    def handle(self, *args: Any, **options: Any) -> None:
        dry_run = bool(options["dry_run"])
        report = apply_retention(dry_run=dry_run)
        for session_id, owner, updated_at in report.would_delete:
            self.stdout.write(f"would delete {session_id} (owner {owner}, idle since {updated_at.isoformat()})")
        for deleted in report.deleted:
            self.stdout.write(
                f"deleted {deleted.session_id} (owner {deleted.owner}, idle since {deleted.updated_at.isoformat()}, "
                f"{deleted.envelopes} envelopes, {deleted.media_blobs} media blobs)"
            )
        for session_id, reason in report.kept:
            self.stdout.write(f"kept {session_id}: {reason}")
        verb = "would delete" if dry_run else "deleted"
        count = len(report.would_delete) if dry_run else len(report.deleted)
        self.stdout.write(
            f"retention: {verb} {count} session(s), kept {len(report.kept)} "
            f"(default retention {default_retention_days() or 'off'} days)"
        )
