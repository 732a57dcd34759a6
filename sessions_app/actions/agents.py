"""Agents and their versions (docs/agents.md): created and saved by a team's moderators
(staff for installation-wide agents), picked by members for their new sessions, and the
journaled move of a session to another version.

A save never edits a version: it writes the next one, under the agent's row lock so two
moderators saving at once get consecutive numbers. Everyone without a role on an agent's
team gets NotFound for it, as for the team's sessions.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models import Q, QuerySet

from sectr.agent_definitions import check_agent_definition, check_slug
from sectr.agents import DEFAULT_AGENT, AgentSpec
from sectr.errors import Forbidden, NotFound, ValidationFailed
from sessions_app import access
from sessions_app.actions.teams import get_team_for_user
from sessions_app.models import Agent, AgentVersion, Team

#: The fields of a definition, as the API and the SDK name them.
DEFINITION_FIELDS = ("name", "description", "instructions", "model", "params", "tools", "mode", "limits", "handler")
MAX_AGENTS_PER_TEAM = 200
NOTE_MAX = 500


def usable_agents(user: Any) -> QuerySet[Agent]:
    """The agents `user` may see and pick: installation-wide ones and those of the teams
    where they have a role (staff: every agent)."""
    agents = Agent.objects.select_related("team")
    if access.is_staff(user):
        return agents
    return agents.filter(Q(team__isnull=True) | Q(team__memberships__user_id=user.pk)).distinct()


def list_agents(user: Any, team_name: str | None = None) -> list[Agent]:
    """The agents `user` may see, installation-wide first; only one team's with `team_name`
    (NotFound for a team without a role)."""
    if team_name is not None:
        team = get_team_for_user(user, team_name)
        return list(Agent.objects.select_related("team").filter(team=team).order_by("created_at", "id"))
    return sorted(usable_agents(user), key=lambda a: (a.team_id is not None, a.team_name or "", a.created_at, a.id))


def get_agent_for_user(user: Any, agent_ref: Any) -> Agent:
    """An agent by id (`agt_...`) or `team/slug` (a bare slug: an installation-wide agent),
    if `user` may see it; NotFound otherwise."""
    if not isinstance(agent_ref, str) or not agent_ref or len(agent_ref) > 200:
        raise NotFound("no such agent")
    agents = usable_agents(user)
    if agent_ref.startswith("agt_"):
        found = agents.filter(pk=agent_ref).first()
    elif "/" in agent_ref:
        team_name, _, slug = agent_ref.partition("/")
        found = agents.filter(team__name=team_name, slug=slug).first()
    else:
        found = agents.filter(team__isnull=True, slug=agent_ref).first()
    if found is None:
        raise NotFound("no such agent")
    return found


def can_edit_agent(user: Any, agent: Agent) -> bool:
    if agent.team_id is None:
        return access.is_staff(user)
    return access.has_team_role(user, agent.team_id, "moderator")


def get_version(agent: Agent, number: Any = None) -> AgentVersion:
    """A version of `agent` (the latest when `number` is None); NotFound for another."""
    if number is None:
        number = agent.latest_version
    if isinstance(number, str) and number.isascii() and number.isdigit():
        number = int(number)
    if not isinstance(number, int) or isinstance(number, bool) or number < 1:
        raise ValidationFailed("a version is a whole number from 1", code="invalid_version")
    version = AgentVersion.objects.select_related("agent__team").filter(agent=agent, number=number).first()
    if version is None:
        raise NotFound(f"agent {agent.slug} has no version {number}")
    return version


def _check_note(note: Any) -> str:
    if note is None:
        return ""
    if not isinstance(note, str) or len(note) > NOTE_MAX or "\x00" in note:
        raise ValidationFailed(f"note must be text of at most {NOTE_MAX} characters", code="invalid_note")
    return note.strip()


def _version_row(agent: Agent, number: int, fields: dict[str, Any], actor: Any, note: str) -> AgentVersion:
    return AgentVersion.objects.create(
        agent=agent,
        number=number,
        name=fields["name"],
        description=fields["description"],
        instructions=fields["instructions"],
        model=fields["model"] or "",
        params=fields["params"],
        tools=list(fields["tools"]) if fields["tools"] is not None else None,
        mode=fields["mode"] or "",
        limits=fields["limits"],
        handler=fields["handler"],
        note=note,
        author=actor if actor is not None and actor.is_authenticated else None,
        author_name=actor.get_username() if actor is not None and actor.is_authenticated else "",
    )


def do_create_agent(actor: Any, team_name: str | None, slug: Any, data: dict[str, Any], note: Any = None) -> Agent:
    """A new agent with its version 1. `team_name` None: installation-wide (staff only)."""
    team: Team | None = None
    if team_name is None:
        if not access.is_staff(actor):
            raise Forbidden("only staff can make installation-wide agents")
    else:
        team = get_team_for_user(actor, team_name)  # 404 for strangers
        if not access.can_moderate_team(actor, team):
            raise Forbidden("only the team's moderators can create its agents")
    slug = check_slug(slug)
    fields = check_agent_definition(data)
    note = _check_note(note)
    with transaction.atomic():
        if team is not None:
            Team.objects.select_for_update().filter(pk=team.pk).first()  # one creator at a time
            if Agent.objects.filter(team=team).count() >= MAX_AGENTS_PER_TEAM:
                raise ValidationFailed(f"a team has at most {MAX_AGENTS_PER_TEAM} agents", code="invalid_agent")
        if Agent.objects.filter(team=team, slug=slug).exists():
            raise ValidationFailed(f"an agent named {slug!r} exists already", code="slug_taken")
        agent = Agent.objects.create(team=team, slug=slug, latest_version=1, created_by=actor)
        _version_row(agent, 1, fields, actor, note)
    return agent


def do_save_agent_version(actor: Any, agent_ref: Any, data: dict[str, Any], note: Any = None) -> AgentVersion:
    """Save the next version of an agent: the latest version's fields with `data`'s on top.
    Sessions pinned to earlier versions stay on them until moved."""
    agent = get_agent_for_user(actor, agent_ref)
    if not can_edit_agent(actor, agent):
        raise Forbidden("only the team's moderators can change its agents")
    if not isinstance(data, dict):
        raise ValidationFailed("an agent must be an object", code="invalid_agent")
    unknown = set(data) - set(DEFINITION_FIELDS)
    if unknown:
        raise ValidationFailed(f"unknown fields: {', '.join(sorted(unknown))}", code="invalid_agent")
    note = _check_note(note)
    with transaction.atomic():
        locked = Agent.objects.select_for_update().get(pk=agent.pk)
        latest = get_version(locked).spec().to_dict()
        fields = check_agent_definition({**{k: latest[k] for k in DEFINITION_FIELDS}, **data})
        number = locked.latest_version + 1
        version = _version_row(locked, number, fields, actor, note)
        Agent.objects.filter(pk=locked.pk).update(latest_version=number)
    return version


# ---- sessions and their agents ----


def resolve_new_session_agent(
    owner: Any, team: Team | None, agent_ref: Any = None, version: Any = None
) -> AgentVersion | None:
    """The agent version a new session of `owner` in `team` pins: `agent_ref` (an id,
    `team/slug` or an installation-wide slug) at `version` (default its latest), or, when
    none is named, the team's first agent; None: the built-in default agent.

    A team's agent serves only that team's sessions."""
    if agent_ref in (None, ""):
        if version is not None:
            raise ValidationFailed("agent_version needs an agent", code="invalid_agent")
        if team is None:
            return None
        first = Agent.objects.select_related("team").filter(team=team).order_by("created_at", "id").first()
        return get_version(first) if first is not None else None
    if agent_ref == DEFAULT_AGENT.slug and not Agent.objects.filter(team__isnull=True, slug=agent_ref).exists():
        if version not in (None, 1):
            raise NotFound("the built-in agent has only version 1")
        return None
    try:
        agent = get_agent_for_user(owner, agent_ref)
    except NotFound:
        raise ValidationFailed(f"no agent {agent_ref!r} you may use", code="invalid_agent") from None
    if agent.team_id is not None and (team is None or agent.team_id != team.pk):
        raise ValidationFailed(
            f"the agent {agent} belongs to the team {agent.team_name}: create the session in that team",
            code="invalid_agent",
        )
    try:
        return get_version(agent, version)
    except NotFound as exc:  # the agent exists: a version it lacks is bad input, not a missing page
        raise ValidationFailed(exc.message, code="invalid_agent") from None


def agent_spec_of(version: AgentVersion | None) -> AgentSpec | None:
    return version.spec() if version is not None else None
