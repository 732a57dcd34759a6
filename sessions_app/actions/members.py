"""A team's members and settings as its moderators change them from the team page and
the API (docs/agents.md, "Team settings"), and new teams made by staff.

Every function here checks its actor: everyone without a role in the team gets NotFound
(they do not learn that it exists), a member or reviewer gets Forbidden, a moderator
(or staff) may act. The unchecked `do_set_membership` / `do_remove_membership` of
sessions_app.actions.teams stay for `manage.py sectr_team`, which runs as the operator.

A team keeps at least one moderator: removing or demoting its last one is refused
(`last_moderator`, 409), so a team never ends up with nobody able to manage it but
staff. Changes to one team's memberships take the team's row lock, so two moderators
demoting each other at once cannot both succeed.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.db import transaction

from sectr.errors import Forbidden, NotFound, ValidationFailed
from sessions_app import access
from sessions_app.actions.teams import do_create_team, get_team_for_user
from sessions_app.models import Membership, Team

#: Retention a team may set, in days (0: keep for ever); about 100 years at most.
RETENTION_MAX_DAYS = 36_500


def moderated_team(actor: Any, team_name: Any, what: str = "its members") -> Team:
    """The team if `actor` moderates it: NotFound for strangers, Forbidden for readers."""
    team = get_team_for_user(actor, team_name)
    if not access.can_moderate_team(actor, team):
        raise Forbidden(f"only the team's moderators can change {what}")
    return team


def list_members(actor: Any, team_name: Any) -> list[Membership]:
    """The team's memberships (user loaded), moderators first, for anyone with a role."""
    team = get_team_for_user(actor, team_name)
    order = {role: index for index, role in enumerate(reversed(Membership.ROLES))}
    members = list(Membership.objects.filter(team=team).select_related("user"))
    return sorted(members, key=lambda m: (order.get(m.role, 9), m.user.get_username().lower()))


def check_role(role: Any) -> str:
    if role not in Membership.ROLES:
        raise ValidationFailed(f"role must be one of {', '.join(Membership.ROLES)}", code="invalid_role")
    return str(role)


def find_user(username_or_email: Any) -> Any:
    """A user by username, else by email (case-insensitive, only when one user has it)."""
    if not isinstance(username_or_email, str) or not username_or_email.strip() or len(username_or_email) > 254:
        raise ValidationFailed("give a username or an email address", code="invalid_user")
    wanted = username_or_email.strip()
    users = get_user_model().objects
    user = users.filter(username=wanted).first()
    if user is None and "@" in wanted:
        found = list(users.filter(email__iexact=wanted)[:2])
        user = found[0] if len(found) == 1 else None
    if user is None:
        raise ValidationFailed(f"no user {wanted!r}", code="unknown_user")
    return user


def _membership(team: Team, username: Any) -> Membership:
    if not isinstance(username, str) or len(username) > 150:
        raise NotFound("no such member")
    membership = Membership.objects.select_related("user").filter(team=team, user__username=username).first()
    if membership is None:
        raise NotFound("no such member")
    return membership


def _refuse_last_moderator(team: Team, membership: Membership) -> None:
    if membership.role != Membership.MODERATOR:
        return
    others = Membership.objects.filter(team=team, role=Membership.MODERATOR).exclude(pk=membership.pk)
    if not others.exists():
        raise ValidationFailed(
            "a team keeps at least one moderator: make someone else moderator first",
            code="last_moderator",
            status=409,
        )


def do_add_member(actor: Any, team_name: Any, username_or_email: Any, role: Any = Membership.MEMBER) -> Membership:
    """Add a person (by username or email) to the team with a role."""
    team = moderated_team(actor, team_name)
    role = check_role(role)
    user = find_user(username_or_email)
    with transaction.atomic():
        Team.objects.select_for_update().filter(pk=team.pk).first()
        if Membership.objects.filter(team=team, user=user).exists():
            raise ValidationFailed(
                f"{user.get_username()} is in {team.name} already: change their role instead",
                code="already_member",
                status=409,
            )
        membership = Membership.objects.create(team=team, user=user, role=role)
    return membership


def do_change_role(actor: Any, team_name: Any, username: Any, role: Any) -> Membership:
    """Change a member's role (not the last moderator's to a lesser one)."""
    team = moderated_team(actor, team_name)
    role = check_role(role)
    with transaction.atomic():
        Team.objects.select_for_update().filter(pk=team.pk).first()
        membership = _membership(team, username)
        if role != Membership.MODERATOR:
            _refuse_last_moderator(team, membership)
        if membership.role != role:
            membership.role = role
            membership.save(update_fields=["role"])
    return membership


def do_remove_member(actor: Any, team_name: Any, username: Any) -> None:
    """Remove a member (not the last moderator). Their sessions stay in the team, theirs."""
    team = moderated_team(actor, team_name)
    with transaction.atomic():
        Team.objects.select_for_update().filter(pk=team.pk).first()
        membership = _membership(team, username)
        _refuse_last_moderator(team, membership)
        membership.delete()


def do_create_team_as(actor: Any, name: Any, moderator: Any = None) -> Team:
    """A new team, made by staff; `moderator` (a username or email, optional) becomes its
    first moderator."""
    if not access.is_staff(actor):
        raise Forbidden("only staff can create teams")
    user = find_user(moderator) if moderator not in (None, "") else None
    with transaction.atomic():
        team = do_create_team(name)
        if user is not None:
            Membership.objects.create(team=team, user=user, role=Membership.MODERATOR)
    return team


def check_retention_days(days: Any) -> int | None:
    if days is None:
        return None
    if isinstance(days, bool) or not isinstance(days, int) or not 0 <= days <= RETENTION_MAX_DAYS:
        raise ValidationFailed(
            f"retention_days must be a whole number of days from 0 (keep for ever) to {RETENTION_MAX_DAYS},"
            " or empty for the installation's default",
            code="invalid_retention",
        )
    return days


def do_set_retention(actor: Any, team_name: Any, days: Any) -> Team:
    """Set how many idle days the team's sessions are kept (None: the default; 0: for ever)."""
    team = moderated_team(actor, team_name, "its retention")
    days = check_retention_days(days)
    Team.objects.filter(pk=team.pk).update(retention_days=days)
    team.retention_days = days
    return team
