"""The team settings pages: /teams/ (the user's teams; staff: every team and New team;
everyone: the installation-wide agents) and /teams/<name>/ with its sections Members,
Agents, Tools, Rules, Scores, Notifications, Budget and Retention; an agent's own page
(edit, History with the difference between two versions), a team's under
/teams/<name>/agents/<slug>/, an installation-wide one's under /agents/<slug>/.

Every check is the actions' (sessions_app.actions): anyone without a role in the team
gets 404, members and reviewers read, moderators (and staff) change. A refused POST
changes nothing; its message is shown on the page it came from.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Callable
from functools import wraps
from typing import Any, ParamSpec

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from sectr.errors import Forbidden, NotFound, SectrError, ValidationFailed
from sectr.tools import Tool
from sessions_app import access, actions
from sessions_app.actions import mcp_servers as mcp_actions
from sessions_app.actions import members as member_actions
from sessions_app.actions import webhooks as webhook_actions
from sessions_app.actions.agents import DEFINITION_FIELDS, can_edit_agent
from sessions_app.actions.rules import do_move_rule
from sessions_app.actions.team_budgets import do_set_budget
from sessions_app.mcp_servers import described_tools, installation_servers, picker_tools
from sessions_app.models import Agent, AgentVersion, ApprovalRule, Membership, Team, TeamMcpServer
from sessions_app.moderation import rules as rule_preview
from sessions_app.moderation.rules import rule_data_from_form
from sessions_app.ops.retention import default_retention_days
from sessions_app.review import scores as review_scores
from sessions_app.runtime import get_runtime
from sessions_app.team_budgets import budget_status
from sessions_app.teams.forms import (
    AddMemberForm,
    AgentForm,
    BudgetForm,
    McpServerForm,
    NewTeamForm,
    RetentionForm,
    RoleForm,
    tool_gate,
)
from sessions_app.teams.notifications import LinksForm, WebhookForm, notifications_context
from sessions_app.web import HtmxHttpRequest

_P = ParamSpec("_P")

SECTIONS = (
    ("members", "Members"),
    ("agents", "Agents"),
    ("tools", "Tools"),
    ("rules", "Rules"),
    ("scores", "Scores"),
    ("notifications", "Notifications"),
    ("budget", "Budget"),
    ("retention", "Retention"),
)


def _team_or_404(request: HtmxHttpRequest, name: str) -> Team:
    try:
        return actions.get_team_for_user(request.user, name)
    except NotFound:
        raise Http404("no such team") from None


def _team_url(name: str, section: str = "") -> str:
    return reverse("team", args=[name]) + (f"#{section}" if section else "")


def team_change(section: str) -> Callable[[Callable[_P, str]], Callable[_P, HttpResponse]]:
    """A POST that changes one section: the view returns the message to show; a refusal
    becomes 404 (a stranger), 403 (a reader) or an error message on the team page."""

    def decorate(view: Callable[_P, str]) -> Callable[_P, HttpResponse]:
        @wraps(view)
        def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> HttpResponse:
            request = args[0]
            assert isinstance(request, HttpRequest)
            name = str(kwargs["name"])
            try:
                done = view(*args, **kwargs)
            except NotFound:
                raise Http404("not found") from None
            except Forbidden as exc:
                raise PermissionDenied(exc.message) from None
            except SectrError as exc:
                messages.error(request, exc.message)
            else:
                messages.info(request, done)
            return redirect(_team_url(name, section))

        return login_required(require_POST(wrapper))

    return decorate


def known_tools() -> list[Tool]:
    """Every tool the installation knows (built-ins and configured or plugin tools)."""
    return sorted(get_runtime().tools, key=lambda tool: tool.name)


# ---- /teams/ ----


@login_required
@require_GET
def teams(request: HtmxHttpRequest) -> HttpResponse:
    user: Any = request.user
    roles = dict(Membership.objects.filter(user_id=user.pk).values_list("team_id", "role"))
    listed = access.teams_for(user).order_by("name") if access.is_staff(user) else access.member_teams(user)
    rows = [{"team": team, "role": roles.get(team.pk) or ("staff" if access.is_staff(user) else "")} for team in listed]
    installation_agents = [
        {"agent": agent, "name": version.name if version else agent.slug, "version": agent.latest_version}
        for agent, version in _with_latest(Agent.objects.filter(team__isnull=True).order_by("slug"))
    ]
    return render(
        request,
        "teams/teams.html",
        {
            "rows": rows,
            "is_staff": access.is_staff(user),
            "new_team_form": NewTeamForm(),
            "installation_agents": installation_agents,
        },
    )


def _with_latest(agents: Any) -> list[tuple[Agent, AgentVersion | None]]:
    """Each agent with its latest version (two queries)."""
    listed = list(agents)
    latest = {
        (version.agent_id, version.number): version
        for version in AgentVersion.objects.filter(agent__in=listed).order_by()
    }
    return [(agent, latest.get((agent.pk, agent.latest_version))) for agent in listed]


@login_required
@require_POST
def create_team(request: HtmxHttpRequest) -> HttpResponse:
    if not access.is_staff(request.user):
        raise PermissionDenied("only staff can create teams")
    form = NewTeamForm(request.POST)
    if not form.is_valid():
        messages.error(request, "; ".join(str(e) for errors in form.errors.values() for e in errors))
        return redirect("teams")
    try:
        team = member_actions.do_create_team_as(request.user, form.cleaned_data["name"], form.cleaned_data["moderator"])
    except SectrError as exc:
        messages.error(request, exc.message)
        return redirect("teams")
    messages.info(request, f"Team {team.name} created.")
    return redirect("team", team.name)


# ---- /teams/<name>/ ----


def _budget_context(team: Team) -> dict[str, Any]:
    status = budget_status(team.pk)
    share: float | None = None
    if status["monthly_tokens"]:
        share = status["spent_tokens"] / status["monthly_tokens"]
    if status["monthly_cost"] and float(status["monthly_cost"]) > 0:
        cost_share = float(status["spent_cost"]) / float(status["monthly_cost"])
        share = max(share or 0.0, cost_share)
    form = BudgetForm(
        initial={
            "monthly_tokens": status["monthly_tokens"],
            "monthly_cost": status["monthly_cost"],
            "alert_thresholds": ", ".join(f"{t * 100:g}" for t in status["alert_thresholds"]),
        }
    )
    return {
        "status": status,
        "share": share,
        "percent": None if share is None else round(share * 100),
        "bar": None if share is None else min(round(share * 100), 100),
        "form": form,
    }


def _agent_rows(team: Team) -> list[dict[str, Any]]:
    agents = list(Agent.objects.filter(team=team).order_by("created_at", "id"))
    latest = {
        (v.agent_id, v.number): v for v in AgentVersion.objects.filter(agent__in=agents).select_related("agent__team")
    }
    rows = []
    for agent in agents:
        version = latest.get((agent.pk, agent.latest_version))
        if version is not None:
            rows.append({"agent": agent, "version": version, "spec": version.spec()})
    return rows


def _team_tools(agent_rows: list[dict[str, Any]], tools: list[Tool]) -> list[dict[str, Any]]:
    """The installation's tools, each with the team's agents that may use it."""
    listed = []
    for tool in tools:
        users = [row["agent"].slug for row in agent_rows if row["spec"].offers(tool.name)]
        # Names, not the Tool: a template would call the callable tool instead of reading it.
        listed.append({"name": tool.name, "description": tool.description, "gate": tool_gate(tool), "agents": users})
    return listed


def _rule_draft(rule: ApprovalRule) -> dict[str, Any]:
    """A rule as its in-place edit form shows it (the new-rule form's fields)."""
    return {
        "tool": rule.tool,
        "arguments": "\n".join(f"{name}={glob}" for name, glob in (rule.arguments or {}).items()),
        "action": rule.action,
        "approvals_required": rule.approvals_required,
        "expires_after_s": rule.expires_after_s or "",
    }


def team_context(request: HtmxHttpRequest, team: Team, **extra: Any) -> dict[str, Any]:
    user = request.user
    can_edit = access.can_moderate_team(user, team)
    tools = known_tools()
    agent_rows = _agent_rows(team)
    team_tools = _team_tools(agent_rows, tools)
    if agent_rows:
        team_tools = [row for row in team_tools if row["agents"]]
    rules = [{"rule": rule, "draft": _rule_draft(rule)} for rule in actions.list_rules(user, team.name)]
    context: dict[str, Any] = {
        "team": team,
        "sections": SECTIONS,
        "role": access.team_role(user, team.pk),
        "is_staff": access.is_staff(user),
        "can_edit": can_edit,
        "members": member_actions.list_members(user, team.name),
        "add_member_form": AddMemberForm(),
        "roles": Membership.ROLES,
        "agents": agent_rows,
        "tools": team_tools,
        "all_tools_offered": not agent_rows,
        "rules": rules,
        "scores": review_scores.team_scores(team.pk),
        "score_kinds": review_scores.KINDS,
        "rule_actions": [value for value, _label in ApprovalRule.ACTION_CHOICES],
        "budget": _budget_context(team),
        "retention_form": RetentionForm(initial={"retention_days": team.retention_days}),
        "default_retention_days": default_retention_days(),
        "rule_draft": None,
        "preview": None,
        **_mcp_context(team, can_edit),
    }
    context.update(notifications_context(team, can_edit))
    context.update(extra)
    return context


def _mcp_context(team: Team, can_edit: bool) -> dict[str, Any]:
    """The Tools section's MCP part: the team's servers (health, last error, their tools
    and gates; an edit form per HTTP server, headers never filled in) and the
    installation's stdio servers the team may enable."""
    servers = list(TeamMcpServer.objects.filter(team=team).order_by("name"))
    rows = []
    for server in servers:
        form = None
        if can_edit and server.url:
            form = McpServerForm(editing=True, initial=McpServerForm.initial_from(server), prefix=f"mcp-{server.name}")
        rows.append({"server": server, "tools": described_tools(server), "form": form})
    enabled = {server.name for server in servers if not server.url}
    return {
        "mcp_servers": rows,
        "mcp_installation": [{"name": name, "enabled": name in enabled} for name in sorted(installation_servers())],
        "mcp_form": McpServerForm(prefix="mcp-new", initial={"enabled": True, "timeout_s": 60}) if can_edit else None,
    }


@login_required
@require_GET
def team(request: HtmxHttpRequest, name: str) -> HttpResponse:
    found = _team_or_404(request, name)
    return render(request, "teams/team.html", team_context(request, found))


# ---- members ----


@team_change("members")
def add_member(request: HtmxHttpRequest, name: str) -> str:
    form = AddMemberForm(request.POST)
    if not form.is_valid():
        member_actions.moderated_team(request.user, name)  # 404/403 before a form error
        raise ValidationFailed("give a username or email and a role", code="invalid_member")
    membership = member_actions.do_add_member(request.user, name, form.cleaned_data["user"], form.cleaned_data["role"])
    return f"{membership.user.get_username()} added as {membership.role}."


@team_change("members")
def change_role(request: HtmxHttpRequest, name: str, username: str) -> str:
    form = RoleForm(request.POST)
    role = form.cleaned_data["role"] if form.is_valid() else request.POST.get("role")
    membership = member_actions.do_change_role(request.user, name, username, role)
    return f"{username} is now {membership.role}."


@team_change("members")
def remove_member(request: HtmxHttpRequest, name: str, username: str) -> str:
    member_actions.do_remove_member(request.user, name, username)
    return f"{username} removed from {name}."


# ---- rules ----


@team_change("rules")
def create_rule(request: HtmxHttpRequest, name: str) -> str:
    member_actions.moderated_team(request.user, name, "its approval rules")
    rule = actions.do_create_rule(request.user, name, rule_data_from_form(request.POST))
    return f"Rule {rule.pk} added."


@team_change("rules")
def update_rule(request: HtmxHttpRequest, name: str, rule_id: int) -> str:
    member_actions.moderated_team(request.user, name, "its approval rules")
    rule = actions.do_update_rule(request.user, name, rule_id, rule_data_from_form(request.POST))
    return f"Rule {rule.pk} saved."


@team_change("rules")
def move_rule(request: HtmxHttpRequest, name: str, rule_id: int) -> str:
    offset = -1 if request.POST.get("direction") == "up" else 1
    rule = do_move_rule(request.user, name, rule_id, offset)
    return f"Rule {rule.pk} moved {'up' if offset < 0 else 'down'}."


@team_change("rules")
def delete_rule(request: HtmxHttpRequest, name: str, rule_id: int) -> str:
    actions.do_delete_rule(request.user, name, rule_id)
    return f"Rule {rule_id} deleted."


@login_required
@require_GET
def test_rule(request: HtmxHttpRequest, name: str) -> HttpResponse:
    """Test this rule: the team's past asks the draft would have matched. htmx swaps just
    the result under the form; without script the page comes back with the draft kept."""
    try:
        found = member_actions.moderated_team(request.user, name, "its approval rules")
    except NotFound:
        raise Http404("no such team") from None
    except Forbidden as exc:
        raise PermissionDenied(exc.message) from None
    draft = {
        key: request.GET.get(key, "")
        for key in ("tool", "arguments", "action", "approvals_required", "expires_after_s", "position")
    }
    status = 200
    try:
        data = rule_data_from_form(request.GET)
        preview: dict[str, Any] = {"rule": data, "result": rule_preview.preview_rule(found, data)}
    except ValidationFailed as exc:
        preview, status = {"error": exc.message}, 400
    if request.htmx:
        return render(request, "teams/_rule_preview.html", {"preview": preview}, status=200)
    return render(
        request, "teams/team.html", team_context(request, found, rule_draft=draft, preview=preview), status=status
    )


# ---- budget and retention ----


@team_change("budget")
def set_budget(request: HtmxHttpRequest, name: str) -> str:
    form = BudgetForm(request.POST)
    if not form.is_valid():
        member_actions.moderated_team(request.user, name, "its budget")
        raise ValidationFailed(
            "; ".join(f"{field}: {e}" for field, errors in form.errors.items() for e in errors), code="invalid_budget"
        )
    do_set_budget(request.user, name, form.budget_data())
    return "Budget saved."


@team_change("retention")
def set_retention(request: HtmxHttpRequest, name: str) -> str:
    form = RetentionForm(request.POST)
    if not form.is_valid():
        member_actions.moderated_team(request.user, name, "its retention")
        raise ValidationFailed("retention is a whole number of days from 0, or empty", code="invalid_retention")
    member_actions.do_set_retention(request.user, name, form.cleaned_data["retention_days"])
    return "Retention saved."


# ---- agents (a team's, and installation-wide ones: team None) ----
#
# An installation-wide agent (every user may pick it) has the same pages under /agents/:
# everyone logged in reads them, staff create and edit (can_edit_agent).


def _agent_of(request: HtmxHttpRequest, team: Team | None, slug: str) -> Agent:
    try:
        return actions.get_agent_for_user(request.user, f"{team.name}/{slug}" if team else slug)
    except NotFound:
        raise Http404("no such agent") from None


def _agent_url(team: Team | None, slug: str) -> str:
    return reverse("team_agent", args=[team.name, slug]) if team else reverse("agent", args=[slug])


def _form_errors(form: forms.Form) -> str:
    return "; ".join(
        f"{form.fields[f].label if f in form.fields else f}: {e}" for f, errs in form.errors.items() for e in errs
    )


def _picker(team: Team | None) -> list[Tool]:
    """The tool picker's choices: the installation's tools and, for a team's agent, its
    enabled MCP servers' tools (an installation-wide agent names MCP tools by glob)."""
    return known_tools() + (picker_tools(team.pk) if team else [])


def _new_agent(request: HtmxHttpRequest, team: Team | None) -> HttpResponse:
    if team is None and not access.is_staff(request.user):
        raise PermissionDenied("only staff create installation-wide agents")
    if team is not None and not access.can_moderate_team(request.user, team):
        raise PermissionDenied("only the team's moderators can create its agents")
    tools = _picker(team)
    if request.method == "POST":
        form = AgentForm(request.POST, tools=tools, creating=True)
        if form.is_valid():
            try:
                agent = actions.do_create_agent(
                    request.user,
                    team.name if team else None,
                    form.cleaned_data["slug"],
                    form.definition(),
                    form.cleaned_data["note"],
                )
            except NotFound:
                raise Http404("no such team") from None
            except Forbidden as exc:
                raise PermissionDenied(exc.message) from None
            except SectrError as exc:
                messages.error(request, exc.message)
            else:
                messages.info(request, f"Agent {agent.slug} created (version 1).")
                return redirect(_agent_url(team, agent.slug))
        else:
            messages.error(request, _form_errors(form))
    elif request.method == "GET":
        form = AgentForm(tools=tools, creating=True, initial={"handler": "default"})
    else:
        return HttpResponse(status=405)
    return render(request, "teams/agent_form.html", {"team": team, "form": form, "agent": None})


@login_required
def new_agent(request: HtmxHttpRequest, name: str) -> HttpResponse:
    return _new_agent(request, _team_or_404(request, name))


@login_required
def new_installation_agent(request: HtmxHttpRequest) -> HttpResponse:
    return _new_agent(request, None)


def _field_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)


def version_diff(older: AgentVersion, newer: AgentVersion) -> list[dict[str, Any]]:
    """The fields that differ between two versions, each as unified diff lines."""
    a, b = older.spec().to_dict(), newer.spec().to_dict()
    changed = []
    for key in DEFINITION_FIELDS:
        if a.get(key) == b.get(key):
            continue
        lines = difflib.unified_diff(
            _field_text(a.get(key)).splitlines(),
            _field_text(b.get(key)).splitlines(),
            fromfile=f"v{older.number}",
            tofile=f"v{newer.number}",
            lineterm="",
        )
        rows = []
        for line in lines:
            kind = (
                "add"
                if line.startswith("+")
                else "del"
                if line.startswith("-")
                else "hunk"
                if line.startswith("@@")
                else "same"
            )
            if line.startswith(("+++", "---")):
                kind = "file"
            rows.append({"kind": kind, "text": line})
        changed.append({"field": key, "lines": rows})
    return changed


def _agent_page(request: HtmxHttpRequest, team: Team | None, slug: str) -> HttpResponse:
    """An agent: its latest version, the edit form (who may edit it), its History and the
    difference between two chosen versions (?a=1&b=2)."""
    agent = _agent_of(request, team, slug)
    editable = can_edit_agent(request.user, agent)
    tools = _picker(team)
    latest = actions.get_version(agent)
    if request.method == "POST":
        if not editable:
            raise PermissionDenied(
                "only the team's moderators can change its agents" if team else "only staff change this agent"
            )
        form = AgentForm(request.POST, tools=tools, creating=False)
        if form.is_valid():
            try:
                version = actions.do_save_agent_version(
                    request.user, agent.pk, form.definition(), form.cleaned_data["note"]
                )
            except NotFound:
                raise Http404("no such agent") from None
            except Forbidden as exc:
                raise PermissionDenied(exc.message) from None
            except SectrError as exc:
                messages.error(request, exc.message)
            else:
                messages.info(request, f"Saved as version {version.number}.")
                return redirect(_agent_url(team, agent.slug))
        else:
            messages.error(request, _form_errors(form))
    elif request.method == "GET":
        names = {tool.name for tool in tools}
        form = AgentForm(tools=tools, creating=False, initial=AgentForm.initial_from(latest.spec().to_dict(), names))
    else:
        return HttpResponse(status=405)
    versions = list(AgentVersion.objects.filter(agent=agent).select_related("agent__team").order_by("-number"))
    diff = None
    chosen = (request.GET.get("a"), request.GET.get("b"))
    if all(chosen):
        try:
            first, second = (actions.get_version(agent, number) for number in chosen)
        except (NotFound, ValidationFailed) as exc:
            messages.error(request, exc.message)
        else:
            older, newer = sorted((first, second), key=lambda v: v.number)
            diff = {"older": older, "newer": newer, "fields": version_diff(older, newer)}
    default_a = versions[1].number if len(versions) > 1 else latest.number
    return render(
        request,
        "teams/agent_form.html",
        {
            "team": team,
            "agent": agent,
            "latest": latest,
            "spec": latest.spec(),
            "form": form,
            "editable": editable,
            "versions": versions,
            "diff": diff,
            "chosen_a": int(chosen[0]) if chosen[0] and chosen[0].isdigit() else default_a,
            "chosen_b": int(chosen[1]) if chosen[1] and chosen[1].isdigit() else latest.number,
        },
    )


@login_required
def agent_page(request: HtmxHttpRequest, name: str, slug: str) -> HttpResponse:
    return _agent_page(request, _team_or_404(request, name), slug)


@login_required
def installation_agent_page(request: HtmxHttpRequest, slug: str) -> HttpResponse:
    return _agent_page(request, None, slug)


# ---- notifications: webhooks and action links ----


@team_change("notifications")
def add_webhook(request: HtmxHttpRequest, name: str) -> str:
    # 404/403 before the form: its URL check resolves the host, which is not a stranger's to ask for.
    member_actions.moderated_team(request.user, name, "its webhooks")
    form = WebhookForm(request.POST)
    if not form.is_valid():
        raise ValidationFailed(_form_errors(form), code="invalid_webhook")
    data = form.cleaned_data
    hook = webhook_actions.do_add_webhook(request.user, name, data["url"], data["kind"], data["secret"] or None)
    return f"Webhook {hook.pk} added ({hook.kind})."


@team_change("notifications")
def delete_webhook(request: HtmxHttpRequest, name: str, webhook_id: int) -> str:
    webhook_actions.do_delete_webhook(request.user, name, webhook_id)
    return f"Webhook {webhook_id} deleted."


@team_change("notifications")
def set_links(request: HtmxHttpRequest, name: str) -> str:
    form = LinksForm(request.POST)
    enabled = bool(form.is_valid() and form.cleaned_data["links_decide_without_login"])
    webhook_actions.do_set_links_decide_without_login(request.user, name, enabled)
    return "Links in emails now decide without a login." if enabled else "Links now ask for a login first."


# ---- MCP servers (the Tools section) ----


def _mcp_form_errors(form: McpServerForm) -> str:
    # Field errors only: none of them repeats what was typed (a header may be a secret).
    return "; ".join(
        f"{form.fields[f].label if f in form.fields else f}: {e}" for f, errs in form.errors.items() for e in errs
    )


def _saved(server: TeamMcpServer, verb: str) -> str:
    if server.health == TeamMcpServer.ERROR:
        return f"MCP server {server.name} {verb}, but it could not be reached: {server.last_error}"
    if server.health == TeamMcpServer.DISABLED:
        return f"MCP server {server.name} {verb} (disabled)."
    count = len(server.discovered or ())
    return f"MCP server {server.name} {verb}: {count} tool{'s' if count != 1 else ''} found."


@team_change("tools")
def mcp_add(request: HtmxHttpRequest, name: str) -> str:
    member_actions.moderated_team(request.user, name, "its MCP servers")
    form = McpServerForm(request.POST, prefix="mcp-new")
    if not form.is_valid():
        raise ValidationFailed(_mcp_form_errors(form), code="invalid_mcp_server")
    return _saved(mcp_actions.do_add_server(request.user, name, form.server_data()), "added")


@team_change("tools")
def mcp_enable(request: HtmxHttpRequest, name: str) -> str:
    server = mcp_actions.do_add_server(request.user, name, {"name": request.POST.get("server", "")})
    return _saved(server, "enabled for the team")


@team_change("tools")
def mcp_update(request: HtmxHttpRequest, name: str, server: str) -> str:
    member_actions.moderated_team(request.user, name, "its MCP servers")
    form = McpServerForm(request.POST, editing=True, prefix=f"mcp-{server}")
    if not form.is_valid():
        raise ValidationFailed(_mcp_form_errors(form), code="invalid_mcp_server")
    return _saved(mcp_actions.do_update_server(request.user, name, server, form.server_data()), "saved")


@team_change("tools")
def mcp_refresh(request: HtmxHttpRequest, name: str, server: str) -> str:
    return _saved(mcp_actions.do_refresh_server(request.user, name, server), "refreshed")


@team_change("tools")
def mcp_delete(request: HtmxHttpRequest, name: str, server: str) -> str:
    found = mcp_actions.get_server(request.user, name, server)
    mcp_actions.do_delete_server(request.user, name, server)
    return f"MCP server {server} {'deleted' if found.url else 'disabled for the team'}."
