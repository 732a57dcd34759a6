"""Teams and their members (`sectr_team`, the admin) and a new session's team.

The management command and the Django admin call these; each validates first and
writes once.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.utils.text import slugify

from sectr.errors import NotFound, ValidationFailed
from sessions_app import access
from sessions_app.models import Membership, Team


class _DefaultTeam:
    """The `team` argument left out: the owner's team when they have exactly one."""

    def __repr__(self) -> str:
        return "DEFAULT_TEAM"


DEFAULT_TEAM: Any = _DefaultTeam()


def check_team_name(name: Any) -> str:
    if not isinstance(name, str) or not name or len(name) > 64 or slugify(name) != name:
        raise ValidationFailed(
            "a team name is 1-64 lower-case letters, digits, hyphens or underscores", code="invalid_team"
        )
    return name


def get_team(name: Any) -> Team:
    if not isinstance(name, str) or len(name) > 64:
        raise NotFound("no such team")
    team = Team.objects.filter(name=name).first()
    if team is None:
        raise NotFound("no such team")
    return team


def get_team_for_user(user: Any, name: Any) -> Team:
    """The team if `user` has a role in it (staff: any team); NotFound otherwise (a
    stranger does not learn that the team exists)."""
    team = Team.objects.filter(name=name).first() if isinstance(name, str) and len(name) <= 64 else None
    if team is None or access.team_role(user, team.pk) is None:
        raise NotFound("no such team")
    return team


def check_session_team(owner: Any, team: Any) -> Team | None:
    """The team a new session of `owner` belongs to: `team` by name (the owner must be one
    of its members, or staff), None (personal), or DEFAULT_TEAM (the owner's one team,
    if they have exactly one; personal otherwise)."""
    if team is DEFAULT_TEAM:
        teams = list(access.member_teams(owner)[:2])
        return teams[0] if len(teams) == 1 else None
    if team is None or team == "":
        return None
    if not isinstance(team, str) or len(team) > 64:
        raise ValidationFailed("team must be a team's name or null", code="invalid_team")
    found = Team.objects.filter(name=team).first()
    if found is None or not (access.is_staff(owner) or found.memberships.filter(user_id=owner.pk).exists()):
        raise ValidationFailed(f"you are not a member of a team named {team!r}", code="invalid_team")
    return found


def do_create_team(name: str, *, ask_expires_after_s: int | None = None) -> Team:
    name = check_team_name(name)
    if ask_expires_after_s is not None and (not isinstance(ask_expires_after_s, int) or ask_expires_after_s < 1):
        raise ValidationFailed("ask_expires_after_s must be a positive whole number", code="invalid_team")
    try:
        with transaction.atomic():
            return Team.objects.create(name=name, ask_expires_after_s=ask_expires_after_s)
    except IntegrityError:
        raise ValidationFailed(f"a team named {name!r} exists already", code="team_exists", status=409) from None


def _user(username: str) -> Any:
    user = get_user_model().objects.filter(username=username).first()
    if user is None:
        raise NotFound(f"no user {username!r}")
    return user


def do_set_membership(team_name: str, username: str, role: str = Membership.MEMBER) -> Membership:
    """Add a user to a team with a role, or change their role there."""
    if role not in Membership.ROLES:
        raise ValidationFailed(f"role must be one of {', '.join(Membership.ROLES)}", code="invalid_role")
    team = get_team(team_name)
    user = _user(username)
    with transaction.atomic():
        membership, _created = Membership.objects.update_or_create(team=team, user=user, defaults={"role": role})
    return membership


def do_remove_membership(team_name: str, username: str) -> bool:
    """Remove a user from a team; False if they were not in it. Their sessions stay in
    the team (they keep them as owners)."""
    team = get_team(team_name)
    user = _user(username)
    deleted, _ = Membership.objects.filter(team=team, user=user).delete()
    return deleted > 0
