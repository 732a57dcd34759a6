"""Manage teams and their members (docs/moderation.md).

python manage.py sectr_team create NAME [--expires-after SECONDS]
python manage.py sectr_team add NAME USERNAME --role member|reviewer|moderator
python manage.py sectr_team remove NAME USERNAME
python manage.py sectr_team list [NAME]
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from sectr.errors import SectrError
from sessions_app.actions.teams import do_create_team, do_remove_membership, do_set_membership, get_team
from sessions_app.models import Membership, Team


class Command(BaseCommand):
    help = "Creates teams and adds or removes their members (roles: member, reviewer, moderator)."

    def add_arguments(self, parser: CommandParser) -> None:
        commands = parser.add_subparsers(dest="command", required=True)
        create = commands.add_parser("create", help="create a team")
        create.add_argument("name")
        create.add_argument(
            "--expires-after", type=int, default=None, metavar="SECONDS", help="default expiry of the team's asks"
        )
        add = commands.add_parser("add", help="add a user to a team (or change their role)")
        add.add_argument("name")
        add.add_argument("username")
        add.add_argument("--role", choices=Membership.ROLES, default=Membership.MEMBER)
        remove = commands.add_parser("remove", help="remove a user from a team")
        remove.add_argument("name")
        remove.add_argument("username")
        show = commands.add_parser("list", help="list teams, or one team's members")
        show.add_argument("name", nargs="?")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            command = options["command"]
            if command == "create":
                team = do_create_team(options["name"], ask_expires_after_s=options["expires_after"])
                self.stdout.write(f"created team {team.name}")
            elif command == "add":
                membership = do_set_membership(options["name"], options["username"], options["role"])
                self.stdout.write(f"{options['username']} is {membership.role} of {options['name']}")
            elif command == "remove":
                removed = do_remove_membership(options["name"], options["username"])
                if not removed:
                    raise CommandError(f"{options['username']} is not in team {options['name']}")
                self.stdout.write(f"removed {options['username']} from {options['name']}")
            elif options["name"]:
                team = get_team(options["name"])
                for membership in team.memberships.select_related("user").order_by("user__username"):
                    self.stdout.write(f"{membership.user.get_username()}  {membership.role}")
            else:
                for team in Team.objects.order_by("name"):
                    self.stdout.write(team.name)
        except SectrError as exc:
            raise CommandError(exc.message) from None
