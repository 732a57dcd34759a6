"""Who may do what with a session, from team roles (docs/moderation.md).

- The owner may do everything with their session (deciding its asks too, except that
  their own approval never counts towards a quorum of two or more).
- Staff (`is_staff` or `is_superuser`) act as moderator of every team: they may do
  everything with every session.
- A session of a team (`Session.team`): the team's `member`s read it; `reviewer`s also
  rate, annotate, export and share it; `moderator`s also decide its asks and edit the
  team's approval rules. Roles apply to that team's sessions only.
- A personal session (no team) is its owner's and staff's alone.

Everybody else does not learn that the session exists: NotFound (404), not Forbidden.
A reader who may not act gets Forbidden (403).

The list helpers return querysets (one query, no per-row Python), for pages, the API
and the moderation queue alike. There are no global review or moderation
permissions: roles live in teams.
"""

from __future__ import annotations

from typing import Any, Literal

from django.db.models import Q, QuerySet

from sectr.errors import Forbidden, NotFound
from sessions_app.models import AskIndex, Membership, Session, Team

Need = Literal["read", "write", "approve", "review"]
Role = Literal["member", "reviewer", "moderator"]

#: The roles that include a role (each role includes the ones before it).
_AT_LEAST: dict[str, tuple[str, ...]] = {
    Membership.MEMBER: Membership.ROLES,
    Membership.REVIEWER: (Membership.REVIEWER, Membership.MODERATOR),
    Membership.MODERATOR: (Membership.MODERATOR,),
}


def is_staff(user: Any) -> bool:
    return bool(user is not None and user.is_authenticated and (user.is_staff or user.is_superuser))


def _roles(at_least: str) -> tuple[str, ...]:
    try:
        return _AT_LEAST[at_least]
    except KeyError:
        raise ValueError(f"unknown role {at_least!r}") from None


def team_role(user: Any, team_id: int | None) -> str | None:
    """The user's role in a team (None: none, or no team). Staff count as moderators."""
    if team_id is None or user is None or not user.is_authenticated:
        return None
    if is_staff(user):
        return Membership.MODERATOR
    # Not cached on the user: a websocket keeps its user for hours, and a removed
    # member must lose access at the next check.
    role: str | None = (
        Membership.objects.filter(team_id=team_id, user_id=user.pk).values_list("role", flat=True).first()
    )
    return role


def has_team_role(user: Any, team_id: int | None, at_least: Role) -> bool:
    role = team_role(user, team_id)
    return role is not None and role in _roles(at_least)


def _is_owner(user: Any, session: Session) -> bool:
    return bool(user is not None and user.is_authenticated and session.owner_id == user.pk)


def can_read(user: Any, session: Session) -> bool:
    return _is_owner(user, session) or is_staff(user) or has_team_role(user, session.team_id, "member")


def can_write(user: Any, session: Session) -> bool:
    """Send messages, steer, cancel, retry, rename, change mode or model, delete: the owner's."""
    return _is_owner(user, session) or is_staff(user)


def can_review(user: Any, session: Session) -> bool:
    """Rate, annotate, export and share."""
    return _is_owner(user, session) or is_staff(user) or has_team_role(user, session.team_id, "reviewer")


def can_approve(user: Any, session: Session) -> bool:
    """Decide (or vote on) the session's asks."""
    return _is_owner(user, session) or is_staff(user) or has_team_role(user, session.team_id, "moderator")


def can_moderate_team(user: Any, team: Team) -> bool:
    """Edit the team's approval rules (and see its whole queue)."""
    return has_team_role(user, team.pk, "moderator")


_CHECKS = {"write": can_write, "approve": can_approve, "review": can_review}
_REFUSALS = {
    "write": "only the session's owner can do this",
    "approve": "only the session's owner or a moderator of its team can decide its asks",
    "review": "only a reviewer of the session's team can do this",
}


def check_access(user: Any, session: Session, need: Need) -> Session:
    if not can_read(user, session):
        raise NotFound("no such session")
    check = _CHECKS.get(need)
    if check is not None and not check(user, session):
        raise Forbidden(_REFUSALS[need])
    return session


def check_session_id(session_id: Any) -> None:
    """NotFound for what cannot be a session id (not a string, or longer than the column)."""
    if not isinstance(session_id, str) or len(session_id) > 40:
        raise NotFound("no such session")


def get_session_for_user(user: Any, session_id: str, need: Need = "read") -> Session:
    """The session if `user` may `need` it; NotFound / Forbidden otherwise."""
    check_session_id(session_id)
    try:
        session = Session.objects.get(pk=session_id)
    except Session.DoesNotExist:
        raise NotFound("no such session") from None
    return check_access(user, session, need)


# ---- lists (querysets) ----


def teams_for(user: Any, at_least: Role = "member") -> QuerySet[Team]:
    """The teams in which `user` has at least that role (every team for staff)."""
    if user is None or not user.is_authenticated:
        return Team.objects.none()
    if is_staff(user):
        return Team.objects.all()
    return Team.objects.filter(memberships__user_id=user.pk, memberships__role__in=_roles(at_least))


def member_teams(user: Any) -> QuerySet[Team]:
    """The teams `user` belongs to (any role): where they may create sessions."""
    if user is None or not user.is_authenticated:
        return Team.objects.none()
    return Team.objects.filter(memberships__user_id=user.pk).order_by("name")


def _team_ids(user: Any, at_least: str) -> QuerySet[Membership, Any]:
    return Membership.objects.filter(user_id=user.pk, role__in=_roles(at_least)).values("team_id")


def sessions_with_role(
    user: Any, at_least: Role = "member", *, own: bool = True, teams_first: bool = False
) -> QuerySet[Session]:
    """The sessions of the teams where `user` has at least that role, and (with `own`)
    the user's own; every session for staff. One query, a subquery on memberships.

    `teams_first` reads the user's teams first (one more, small query) and puts them in
    as a list of ids, for the lists over every session (/review/ search):
    `team_id IN (1, 2) OR owner_id = 3` is an OR of indexed columns whose
    selectivity PostgreSQL can estimate, where for `team_id IN (SELECT ...) OR ...` it
    guessed half the table and read all 100,000 sessions."""
    if user is None or not user.is_authenticated:
        return Session.objects.none()
    if is_staff(user):
        return Session.objects.all()
    if not teams_first:
        condition = Q(team_id__in=_team_ids(user, at_least))
        if own:
            condition |= Q(owner_id=user.pk)
        return Session.objects.filter(condition)
    team_ids = sorted(set(_team_ids(user, at_least).values_list("team_id", flat=True)))
    if team_ids and own:
        return Session.objects.filter(Q(team_id__in=team_ids) | Q(owner_id=user.pk))
    if team_ids:
        return Session.objects.filter(team_id__in=team_ids)
    return Session.objects.filter(owner_id=user.pk) if own else Session.objects.none()


def session_ids_with_role(user: Any, at_least: Role) -> QuerySet[Session, Any]:
    """The ids of sessions_with_role (not staff) as a UNION ALL of the user's own and
    their teams' (a join on memberships): two indexed branches the planner estimates,
    for a subquery under a short list (the pending asks of the approvals badge), where
    `owner = user OR team IN (SELECT ...)` made PostgreSQL read all 100,000 sessions."""
    own = Session.objects.filter(owner_id=user.pk).values("pk")
    teams = Session.objects.filter(
        team__memberships__user_id=user.pk, team__memberships__role__in=_roles(at_least)
    ).values("pk")
    return own.union(teams, all=True)


def readable_sessions(user: Any) -> QuerySet[Session]:
    return sessions_with_role(user, "member")


def reviewable_sessions(user: Any, *, teams_first: bool = False) -> QuerySet[Session]:
    return sessions_with_role(user, "reviewer", teams_first=teams_first)


def approvable_sessions(user: Any) -> QuerySet[Session]:
    """The sessions whose asks `user` may decide: their own and their moderated teams'."""
    return sessions_with_role(user, "moderator")


def visible_asks(user: Any) -> QuerySet[AskIndex]:
    """The asks `user` may see: those of every session they may read."""
    if is_staff(user):
        return AskIndex.objects.all()
    return AskIndex.objects.filter(session__in=readable_sessions(user))


def visible_sessions(user: Any) -> QuerySet[Session]:
    """The sessions `user` sees in their own lists (home page, GET /sessions): their own.
    Their teams' sessions are listed by readable_sessions (team review, the queue).
    Replays (an experiment's) are listed by their experiment only."""
    return Session.objects.filter(owner=user, is_replay=False)


def has_any_role(user: Any, at_least: Role) -> bool:
    """Whether `user` has that role in some team (staff: always), for menus."""
    if is_staff(user):
        return True
    if user is None or not user.is_authenticated:
        return False
    return Membership.objects.filter(user_id=user.pk, role__in=_roles(at_least)).exists()


def usage_scope(user: Any) -> Q | None:
    """Which usage rollup rows (sessions_app.models.UsageDaily) `user` may see on
    /review/usage/: their own and those of teams where they review; None: all (staff)."""
    if is_staff(user):
        return None
    if user is None or not user.is_authenticated:
        return Q(pk__in=[])
    return Q(user_id=user.pk) | Q(team_key__in=_team_ids(user, "reviewer"))
