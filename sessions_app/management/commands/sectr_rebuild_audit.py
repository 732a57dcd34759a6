"""Recompute the moderation audit (AuditEntry rows) from the journal alone."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from sessions_app.journal.moderation import rebuild_audit


class Command(BaseCommand):
    help = (
        "Rebuilds the moderation audit from the journal: every ask, vote, decision, expiry, "
        "rule decision and withdrawal (all sessions, or only those named)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("session_ids", nargs="*", metavar="SESSION_ID", help="only these sessions")

    def handle(self, *args: Any, **options: Any) -> None:
        ids = options["session_ids"] or None
        written = rebuild_audit(session_ids=ids)
        self.stdout.write(f"rebuilt the audit: {written} rows")
