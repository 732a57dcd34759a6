"""manage.py sectr_import FILE --owner USERNAME: restore an `Export JSON` file as a new
session of USERNAME (its fold equals the original's); prints the new session's id last.

`--owner` is required: who owns the restored session is the operator's decision, never
the file's (its header names the original owner, which anyone can write). A file that
breaks the journal's rules is refused with one line and exit status 1, nothing written
(sessions_app.review.export)."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from sectr.errors import ValidationFailed
from sessions_app.review.export import import_file


class Command(BaseCommand):
    help = (
        "Import a session exported with Export JSON (GET /api/v1/sessions/{id}/export) as a new session "
        "owned by --owner. Votes and decisions in it are attributed to imported:<name>."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("file", help="the exported JSON file")
        parser.add_argument("--owner", help="who owns the new session (required; the file's owner is never used)")

    def handle(self, *args: Any, **options: Any) -> None:
        path, username = options["file"], options.get("owner")
        if not username:
            raise CommandError("pass --owner USERNAME: the user who will own the imported session")
        owner = get_user_model().objects.filter(username=username, is_active=True).first()
        if owner is None:
            raise CommandError(f"no active user {username[:150]!r}: pass --owner USERNAME")
        try:
            session = import_file(path, owner)
        except ValidationFailed as exc:
            raise CommandError(f"cannot import {path}: {exc.message}") from None
        self.stdout.write(f"imported {session.last_seq} envelopes into a new session owned by {owner.get_username()}")
        self.stdout.write(session.pk)
