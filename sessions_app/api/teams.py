"""The teams API (docs/agents.md, "Team settings"): the caller's teams and roles, a
team's members (moderators add, change and remove them) and its webhooks (moderators
add and delete them; the secret is write-only). Thin: parse, call an action,
shape the answer."""

from __future__ import annotations

from typing import Any

from asgiref.sync import sync_to_async
from django.http import HttpResponse

from sectr.errors import ValidationFailed
from sessions_app import access
from sessions_app.actions import members as member_actions
from sessions_app.actions import webhooks as webhook_actions
from sessions_app.actions.webhooks import webhook_dict
from sessions_app.api.views import ApiCall, check_fields, json_response
from sessions_app.models import Membership, TeamWebhook


def member_dict(membership: Membership) -> dict[str, Any]:
    return {
        "username": membership.user.get_username(),
        "role": membership.role,
        "added_at": membership.created_at.isoformat(),
    }


def _teams(user: Any) -> dict[str, Any]:
    roles = dict(Membership.objects.filter(user_id=user.pk).values_list("team_id", "role"))
    staff = access.is_staff(user)
    teams = access.teams_for(user).order_by("name") if staff else access.member_teams(user)
    return {"teams": [{"name": team.name, "role": roles.get(team.pk), "staff": staff} for team in teams]}


async def list_teams(call: ApiCall) -> HttpResponse:
    return json_response(await sync_to_async(_teams)(call.user))


def _members(user: Any, name: str) -> dict[str, Any]:
    return {"team": name, "members": [member_dict(m) for m in member_actions.list_members(user, name)]}


async def list_members(call: ApiCall, name: str) -> HttpResponse:
    return json_response(await sync_to_async(_members)(call.user, name))


async def add_member(call: ApiCall, name: str) -> HttpResponse:
    body = call.body
    check_fields(body, "username", "email", "role")
    who = body.get("username") if body.get("username") is not None else body.get("email")
    if body.get("username") is not None and body.get("email") is not None:
        raise ValidationFailed("give a username or an email, not both", code="invalid_user")
    if who is None:
        raise ValidationFailed("username or email is required", code="invalid_user")

    def add() -> dict[str, Any]:
        membership = member_actions.do_add_member(call.user, name, who, body.get("role") or Membership.MEMBER)
        return member_dict(membership)

    return json_response(await sync_to_async(add)(), status=201)


async def change_member(call: ApiCall, name: str, username: str) -> HttpResponse:
    body = call.body
    check_fields(body, "role")
    if "role" not in body:
        raise ValidationFailed("role is required", code="invalid_role")

    def change() -> dict[str, Any]:
        return member_dict(member_actions.do_change_role(call.user, name, username, body["role"]))

    return json_response(await sync_to_async(change)())


async def remove_member(call: ApiCall, name: str, username: str) -> HttpResponse:
    await sync_to_async(member_actions.do_remove_member)(call.user, name, username)
    return HttpResponse(status=204)


def _webhooks(user: Any, name: str) -> dict[str, Any]:
    return {"team": name, "webhooks": [webhook_dict(w) for w in webhook_actions.list_webhooks(user, name)]}


async def list_webhooks(call: ApiCall, name: str) -> HttpResponse:
    return json_response(await sync_to_async(_webhooks)(call.user, name))


async def add_webhook(call: ApiCall, name: str) -> HttpResponse:
    body = call.body
    check_fields(body, "url", "kind", "secret")

    kind = TeamWebhook.JSON if body.get("kind") is None else body["kind"]

    def add() -> dict[str, Any]:
        hook = webhook_actions.do_add_webhook(call.user, name, body.get("url"), kind, body.get("secret"))
        return webhook_dict(hook)

    return json_response(await sync_to_async(add)(), status=201)


async def delete_webhook(call: ApiCall, name: str, webhook_id: str) -> HttpResponse:
    await sync_to_async(webhook_actions.do_delete_webhook)(call.user, name, webhook_id)
    return HttpResponse(status=204)
