"""manage.py sectr_import FILE [--owner USERNAME]: restore an `Export JSON` file as a new
session (its fold equals the original's); prints the new session's id last."""

from __future__ import annotations

import json
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from sectr.errors import ValidationFailed
from sessions_app.review.export import import_session


class Command(BaseCommand):
    help = "Import a session exported with Export JSON (GET /api/v1/sessions/{id}/export) as a new session."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("file", help="the exported JSON file")
        parser.add_argument("--owner", help="who owns the new session (default: the export's owner)")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            with open(options["file"], encoding="utf-8") as handle:
                data = json.load(handle)
        except (OSError, ValueError) as exc:
            raise CommandError(f"cannot read {options['file']}: {exc}") from None
        username = options.get("owner") or (data.get("session") or {}).get("owner") if isinstance(data, dict) else None
        owner = get_user_model().objects.filter(username=username).first() if username else None
        if owner is None:
            raise CommandError(f"no such user {username!r}: pass --owner USERNAME")
        try:
            session = import_session(data, owner)
        except ValidationFailed as exc:
            raise CommandError(exc.message) from None
        self.stdout.write(f"imported {session.last_seq} envelopes into a new session owned by {owner.get_username()}")
        self.stdout.write(session.pk)
