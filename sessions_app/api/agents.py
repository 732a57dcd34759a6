"""The agents API (docs/agents.md): list, create, read and save versions of agents,
move a session to another version, and a team's budget. Thin: parse, call an action, shape the answer."""

from __future__ import annotations

from typing import Any

from asgiref.sync import sync_to_async
from django.http import HttpResponse

from sectr.errors import NotFound, ValidationFailed
from sessions_app import actions
from sessions_app.actions.agents import DEFINITION_FIELDS, can_edit_agent
from sessions_app.actions.team_budgets import do_set_budget
from sessions_app.api.views import ApiCall, check_fields, check_id, json_response, optional
from sessions_app.display.snapshots import snapshot
from sessions_app.models import Agent, AgentVersion
from sessions_app.team_budgets import budget_status


def version_dict(version: AgentVersion) -> dict[str, Any]:
    spec = version.spec().to_dict()
    return {
        "agent_id": version.agent_id,
        "version": version.number,
        **{key: spec[key] for key in DEFINITION_FIELDS},
        "note": version.note,
        "author": version.author_name or None,
        "created_at": version.created_at.isoformat(),
    }


def agent_dict(agent: Agent, user: Any, latest: AgentVersion | None = None) -> dict[str, Any]:
    latest = latest or actions.get_version(agent)
    return {
        "id": agent.pk,
        "slug": agent.slug,
        "team": agent.team_name,
        "name": latest.name,
        "description": latest.description,
        "latest_version": agent.latest_version,
        "editable": can_edit_agent(user, agent),
        "created_at": agent.created_at.isoformat(),
        "current": version_dict(latest),
    }


def _agents_page(user: Any, team: str | None) -> dict[str, Any]:
    agents = actions.list_agents(user, team)
    latest = {
        (v.agent_id, v.number): v for v in AgentVersion.objects.select_related("agent__team").filter(agent__in=agents)
    }
    return {"agents": [agent_dict(a, user, latest.get((a.pk, a.latest_version))) for a in agents]}


async def list_all_agents(call: ApiCall) -> HttpResponse:
    return json_response(await sync_to_async(_agents_page)(call.user, None))


async def list_team_agents(call: ApiCall, name: str) -> HttpResponse:
    return json_response(await sync_to_async(_agents_page)(call.user, name))


def _definition(body: dict[str, Any]) -> dict[str, Any]:
    """The definition fields given; a null is "not given", as everywhere in the API."""
    return {key: body[key] for key in DEFINITION_FIELDS if body.get(key) is not None}


async def create_agent(call: ApiCall, name: str) -> HttpResponse:
    body = call.body
    check_fields(body, "slug", "note", *DEFINITION_FIELDS)
    if "slug" not in body:
        raise ValidationFailed("slug is required", code="invalid_slug")

    def create() -> dict[str, Any]:
        agent = actions.do_create_agent(call.user, name, body["slug"], _definition(body), body.get("note"))
        return agent_dict(agent, call.user)

    return json_response(await sync_to_async(create)(), status=201)


async def get_agent(call: ApiCall, agent_id: str) -> HttpResponse:
    def read() -> dict[str, Any]:
        return agent_dict(actions.get_agent_for_user(call.user, check_id(agent_id, "agent")), call.user)

    return json_response(await sync_to_async(read)())


async def get_team_agent(call: ApiCall, name: str, slug: str) -> HttpResponse:
    def read() -> dict[str, Any]:
        return agent_dict(actions.get_agent_for_user(call.user, f"{name}/{slug}"), call.user)

    return json_response(await sync_to_async(read)())


async def save_agent(call: ApiCall, agent_id: str) -> HttpResponse:
    body = call.body
    check_fields(body, "note", *DEFINITION_FIELDS)

    def save() -> dict[str, Any]:
        version = actions.do_save_agent_version(
            call.user, check_id(agent_id, "agent"), _definition(body), body.get("note")
        )
        return version_dict(version)

    return json_response(await sync_to_async(save)())


async def list_versions(call: ApiCall, agent_id: str) -> HttpResponse:
    def read() -> dict[str, Any]:
        agent = actions.get_agent_for_user(call.user, check_id(agent_id, "agent"))
        versions = AgentVersion.objects.select_related("agent__team").filter(agent=agent).order_by("-number")
        return {"agent_id": agent.pk, "versions": [version_dict(v) for v in versions]}

    return json_response(await sync_to_async(read)())


async def get_agent_version(call: ApiCall, agent_id: str, number: str) -> HttpResponse:
    def read() -> dict[str, Any]:
        agent = actions.get_agent_for_user(call.user, check_id(agent_id, "agent"))
        if not (number.isascii() and number.isdigit() and 0 < int(number) <= agent.latest_version):
            raise NotFound(f"agent {agent.slug} has no version {number[:20]}")  # as any missing version
        return version_dict(actions.get_version(agent, int(number)))

    return json_response(await sync_to_async(read)())


async def move_session_agent(call: ApiCall, session_id: str) -> HttpResponse:
    body = call.body
    check_fields(body, "version", "agent")

    def move() -> dict[str, Any]:
        session = actions.do_move_agent(
            call.user,
            check_id(session_id, "session"),
            optional(body, "version", int),
            optional(body, "agent", str),
        )
        return snapshot(session)

    return json_response(await sync_to_async(move)())


# ---- a team's budget ----


async def get_budget(call: ApiCall, name: str) -> HttpResponse:
    def read() -> dict[str, Any]:
        team = actions.get_team_for_user(call.user, name)
        return budget_status(team.pk)

    return json_response(await sync_to_async(read)())


async def set_budget(call: ApiCall, name: str) -> HttpResponse:
    def save() -> dict[str, Any]:
        budget = do_set_budget(call.user, name, call.body)
        return budget_status(budget.team_id)

    return json_response(await sync_to_async(save)())
