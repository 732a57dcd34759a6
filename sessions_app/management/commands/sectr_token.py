"""Create (or revoke) an API token for a user; the new token is the last line printed."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from sectr.errors import SectrError
from sessions_app.actions.tokens import do_issue_token, do_revoke_token
from sessions_app.models import ApiToken


class Command(BaseCommand):
    help = (
        "Creates an API token for USERNAME and prints it as the last line (it is shown only once). "
        "--revoke PREFIX revokes the user's tokens with that prefix; --list lists them."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("--name", default="cli", help="a label for the token (default: cli)")
        parser.add_argument("--revoke", metavar="PREFIX", help="revoke the user's tokens starting with PREFIX")
        parser.add_argument("--list", action="store_true", help="list the user's tokens (prefixes only)")

    def handle(self, *args: Any, **options: Any) -> None:
        user = get_user_model().objects.filter(username=options["username"]).first()
        if user is None:
            raise CommandError(f"no user {options['username']!r}")
        try:
            if options["list"]:
                for token in ApiToken.objects.filter(user=user).order_by("created_at"):
                    state = "revoked" if token.is_revoked else "live"
                    self.stdout.write(
                        f"{token.prefix}…  {token.name}  {state}  created {token.created_at:%Y-%m-%d %H:%M}"
                    )
                return
            if options["revoke"]:
                count = do_revoke_token(user, options["revoke"])
                self.stdout.write(f"revoked {count} token(s) of {user.get_username()}")
                return
            token, raw = do_issue_token(user, options["name"])
        except SectrError as exc:
            raise CommandError(exc.message) from exc
        self.stderr.write(f"Token {token.prefix}… ({token.name}) for {user.get_username()}; it is shown only once:")
        self.stdout.write(raw)
