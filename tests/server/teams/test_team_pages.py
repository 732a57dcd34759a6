"""The team settings pages (/teams/, /teams/<name>/, an agent's page), the members API,
the New session form's Agent picker and the chat header's agent.

Standing users: owner (member of crew), member, reviewer, moderator of crew; outsider
(moderator of another team); staff. Every page, route and form POST is checked for each:
404 for the outsider, 403 for members and reviewers trying to change something (and
nothing changes), the change for moderators and staff.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import pytest
from django.test import Client

from sessions_app import actions
from sessions_app.actions import members as member_actions
from sessions_app.actions.tokens import do_issue_token
from sessions_app.models import Agent, AgentVersion, ApprovalRule, Membership, Session, Team, TeamBudget
from sessions_app.runtime import _AGENT_VERSIONS
from tests.server.conftest import crew_people

ROLES = ("outsider", "member", "reviewer", "moderator", "staff")
INSTRUCTIONS = "You are the release assistant. Be brief."


@pytest.fixture
def people(db: None) -> dict[str, Any]:
    users = crew_people("newbie")
    _AGENT_VERSIONS.clear()
    return users


@pytest.fixture
def release(people: dict[str, Any]) -> Agent:
    definition = {"name": "Release assistant", "instructions": INSTRUCTIONS, "tools": ["get_time", "write_note"]}
    return actions.do_create_agent(people["moderator"], "crew", "release", definition, note="first cut")


@pytest.fixture
def crew_rules(people: dict[str, Any]) -> list[ApprovalRule]:
    first = actions.do_create_rule(people["moderator"], "crew", {"tool": "write_note", "action": "allow"})
    second = actions.do_create_rule(people["moderator"], "crew", {"tool": "delete_*", "action": "deny"})
    return [first, second]


def client_for(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def api_client(user: Any) -> Client:
    return Client(HTTP_AUTHORIZATION=f"Bearer {do_issue_token(user, 't')[1]}")


def crew_state() -> Any:
    """Everything the team page can change, to compare before and after a refused POST."""
    team = Team.objects.get(name="crew")
    return (
        sorted(Membership.objects.filter(team=team).values_list("user__username", "role")),
        sorted(AgentVersion.objects.filter(agent__team=team).values_list("agent__slug", "number", "instructions")),
        list(ApprovalRule.objects.filter(team=team).order_by("position").values_list("pk", "tool", "action")),
        list(TeamBudget.objects.filter(team=team).values_list("monthly_tokens", "monthly_cost")),
        team.retention_days,
        sorted(Team.objects.values_list("name", flat=True)),
    )


AGENT_FORM = {
    "name": "Triage",
    "instructions": "Sort the tickets.",
    "tools": ["get_time"],
    "globs": "",
    "handler": "default",
    "note": "",
}


def post_routes(rules: list[ApprovalRule]) -> list[tuple[str, dict[str, Any]]]:
    first = rules[0].pk
    return [
        ("/teams/crew/members/add", {"user": "newbie", "role": "member"}),
        ("/teams/crew/members/owner/role", {"role": "reviewer"}),
        ("/teams/crew/members/owner/remove", {}),
        ("/teams/crew/agents/new", {**AGENT_FORM, "slug": "triage"}),
        ("/teams/crew/agents/release/", {**AGENT_FORM, "name": "Release assistant", "note": "v2"}),
        ("/teams/crew/rules/new", {"tool": "get_time", "action": "allow"}),
        (f"/teams/crew/rules/{first}/edit", {"tool": "write_*", "action": "allow"}),
        (f"/teams/crew/rules/{first}/move", {"direction": "down"}),
        (f"/teams/crew/rules/{first}/delete", {}),
        ("/teams/crew/budget", {"monthly_tokens": "1000", "monthly_cost": "", "alert_thresholds": "80, 100"}),
        ("/teams/crew/retention", {"retention_days": "30"}),
    ]


# ---- the role matrix ----


@pytest.mark.parametrize("role", ROLES)
def test_team_page_gives_404_to_outsider_and_the_page_to_every_role(
    people: dict[str, Any], release: Agent, role: str
) -> None:
    response = client_for(people[role]).get("/teams/crew/")
    if role == "outsider":
        assert response.status_code == 404
        return
    assert response.status_code == 200
    html = response.content.decode()
    for heading in ("Members", "Agents", "Tools", "Rules", "Notifications", "Budget", "Retention"):
        assert f">{heading}</h2>" in html
    assert "Release assistant" in html
    can_edit = role in ("moderator", "staff")
    assert ("Add person" in html) is can_edit
    assert ("New agent" in html) is can_edit
    assert ("Save budget" in html) is can_edit


@pytest.mark.parametrize("role", ROLES)
def test_agent_page_gives_404_to_outsider_and_the_form_to_moderators(
    people: dict[str, Any], release: Agent, role: str
) -> None:
    response = client_for(people[role]).get("/teams/crew/agents/release/")
    if role == "outsider":
        assert response.status_code == 404
        return
    assert response.status_code == 200
    html = response.content.decode()
    assert INSTRUCTIONS in html and "History" in html
    assert ("Save version 2" in html) is (role in ("moderator", "staff"))


@pytest.mark.parametrize("role", ROLES)
def test_new_agent_page_and_rule_test_follow_the_roles(people: dict[str, Any], role: str) -> None:
    client = client_for(people[role])
    expected = {"outsider": 404, "member": 403, "reviewer": 403, "moderator": 200, "staff": 200}[role]
    assert client.get("/teams/crew/agents/new").status_code == expected
    assert client.get("/teams/crew/rules/test", {"tool": "x", "action": "allow"}).status_code == expected


@pytest.mark.parametrize("role", ROLES)
def test_every_form_post_follows_the_roles_and_a_refusal_changes_nothing(
    people: dict[str, Any], release: Agent, crew_rules: list[ApprovalRule], role: str
) -> None:
    client = client_for(people[role])
    for url, data in post_routes(crew_rules):
        before = crew_state()
        response = client.post(url, data)
        if role == "outsider":
            assert response.status_code == 404, url
        elif role in ("member", "reviewer"):
            assert response.status_code == 403, url
        else:
            assert response.status_code == 302, url
            assert crew_state() != before, f"{url} changed nothing"
            continue
        assert crew_state() == before, url


@pytest.mark.parametrize("role", ROLES)
def test_only_staff_create_teams(people: dict[str, Any], role: str) -> None:
    response = client_for(people[role]).post("/teams/new", {"name": "launch", "moderator": "member@example.org"})
    made = Team.objects.filter(name="launch").first()
    if role == "staff":
        assert response.status_code == 302 and made is not None
        assert Membership.objects.get(team=made).user == people["member"]
        assert Membership.objects.get(team=made).role == "moderator"
    else:
        assert response.status_code == 403 and made is None


# ---- the pages' behaviour ----


def test_teams_page_lists_the_users_teams_and_roles(people: dict[str, Any]) -> None:
    html = client_for(people["reviewer"]).get("/teams/").content.decode()
    assert 'href="/teams/crew/"' in html and "reviewer" in html
    assert "/teams/other/" not in html
    assert "New team" not in html
    staff_html = client_for(people["staff"]).get("/teams/").content.decode()
    assert "/teams/crew/" in staff_html and "/teams/other/" in staff_html and "New team" in staff_html


def test_a_user_without_a_team_sees_how_to_get_one_and_no_menu_link(people: dict[str, Any]) -> None:
    client = client_for(people["newbie"])
    html = client.get("/teams/").content.decode()
    assert "You are in no team yet" in html and "moderators" in html
    assert 'href="/teams/"' not in client.get("/").content.decode()
    assert 'href="/teams/">Teams</a>' in client_for(people["member"]).get("/").content.decode()


def test_moderator_adds_a_person_by_email_and_changes_their_role(people: dict[str, Any]) -> None:
    client = client_for(people["moderator"])
    client.post("/teams/crew/members/add", {"user": "NEWBIE@example.org", "role": "reviewer"})
    assert Membership.objects.get(team__name="crew", user=people["newbie"]).role == "reviewer"
    response = client.post("/teams/crew/members/add", {"user": "newbie", "role": "member"}, follow=True)
    assert "already" in response.content.decode()
    assert Membership.objects.get(team__name="crew", user=people["newbie"]).role == "reviewer"
    client.post("/teams/crew/members/newbie/role", {"role": "moderator"})
    assert Membership.objects.get(team__name="crew", user=people["newbie"]).role == "moderator"


def test_adding_an_unknown_person_says_so_and_adds_nobody(people: dict[str, Any]) -> None:
    before = crew_state()
    response = client_for(people["moderator"]).post(
        "/teams/crew/members/add", {"user": "ghost", "role": "member"}, follow=True
    )
    assert "no user" in response.content.decode()
    assert crew_state() == before


def test_the_last_moderator_cannot_be_removed_or_demoted(people: dict[str, Any]) -> None:
    client = client_for(people["moderator"])
    before = crew_state()
    response = client.post("/teams/crew/members/moderator/remove", follow=True)
    assert "at least one moderator" in response.content.decode()
    client.post("/teams/crew/members/moderator/role", {"role": "member"})
    assert crew_state() == before
    member_actions.do_add_member(people["moderator"], "crew", "newbie", "moderator")
    client.post("/teams/crew/members/moderator/role", {"role": "member"})
    assert Membership.objects.get(team__name="crew", user=people["moderator"]).role == "member"


def test_moderator_creates_an_agent_with_two_tools_and_saves_a_second_version(people: dict[str, Any]) -> None:
    client = client_for(people["moderator"])
    page = client.get("/teams/crew/agents/new").content.decode()
    for tool in ("get_time", "calculator", "write_note", "delete_note"):
        assert f'value="{tool}"' in page  # every tool the installation knows
    assert "write_note (gated, mutating)" in page or "write_note (" in page
    response = client.post(
        "/teams/crew/agents/new",
        {**AGENT_FORM, "slug": "triage", "tools": ["get_time", "calculator"], "globs": "git__*"},
    )
    assert response.status_code == 302
    agent = Agent.objects.get(team__name="crew", slug="triage")
    assert actions.get_version(agent).spec().tools == ("get_time", "calculator", "git__*")
    client.post(
        "/teams/crew/agents/triage/",
        {**AGENT_FORM, "instructions": "Sort the tickets <b>now</b>.", "tools": ["get_time"], "note": "stricter"},
    )
    agent.refresh_from_db()
    assert agent.latest_version == 2
    v2 = actions.get_version(agent, 2)
    assert v2.note == "stricter" and v2.author_name == "moderator"
    diff = client.get("/teams/crew/agents/triage/", {"a": "1", "b": "2"}).content.decode()
    assert "v1 → v2" in diff
    assert "+Sort the tickets &lt;b&gt;now&lt;/b&gt;." in diff  # escaped
    assert "<b>now</b>" not in diff


@pytest.mark.parametrize("role", ROLES)
def test_installation_wide_agents_are_read_by_everyone_and_changed_by_staff(people: dict[str, Any], role: str) -> None:
    definition = {"name": "Helper", "instructions": "Answer in one line.", "tools": ["get_time"]}
    agent = actions.do_create_agent(people["staff"], None, "helper", definition)
    client = client_for(people[role])
    listing = client.get("/teams/").content.decode()
    assert 'href="/agents/helper/"' in listing and "Installation-wide agents" in listing
    assert ('href="/agents/new"' in listing) is (role == "staff")
    page = client.get("/agents/helper/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "Answer in one line." in html and "every user may pick it" in html
    assert ("Save version 2" in html) is (role == "staff")
    assert client.get("/agents/new").status_code == (200 if role == "staff" else 403)
    saved = client.post("/agents/helper/", {**AGENT_FORM, "name": "Helper", "instructions": "Two lines."})
    created = client.post("/agents/new", {**AGENT_FORM, "slug": "second"})
    agent.refresh_from_db()
    if role == "staff":
        assert saved.status_code == 302 and saved["Location"] == "/agents/helper/"
        assert created.status_code == 302 and created["Location"] == "/agents/second/"
        assert agent.latest_version == 2 and actions.get_version(agent).spec().instructions == "Two lines."
        assert Agent.objects.get(slug="second").team is None
        diff = client.get("/agents/helper/", {"a": "1", "b": "2"}).content.decode()
        assert "+Two lines." in diff
    else:
        assert saved.status_code == 403 and created.status_code == 403
        assert agent.latest_version == 1 and not Agent.objects.filter(slug="second").exists()
    assert client.get("/agents/nobody/").status_code == 404
    assert client.get("/agents/release/").status_code == 404  # a team's agent is not installation-wide


def test_installation_wide_agent_pages_need_a_login(people: dict[str, Any]) -> None:
    actions.do_create_agent(people["staff"], None, "helper", {"name": "Helper"})
    for url in ("/agents/helper/", "/agents/new"):
        response = Client().get(url)
        assert response.status_code == 302 and response["Location"].startswith("/accounts/login/"), url


def test_an_invalid_agent_form_creates_nothing(people: dict[str, Any]) -> None:
    client = client_for(people["moderator"])
    response = client.post("/teams/crew/agents/new", {**AGENT_FORM, "slug": "Bad Slug!"})
    assert response.status_code == 200
    assert not Agent.objects.exists()
    response = client.post("/teams/crew/agents/new", {**AGENT_FORM, "slug": "ok", "globs": "bad/glob"})
    assert "not a tool name" in response.content.decode()
    assert not Agent.objects.exists()


def test_rules_are_edited_and_reordered_in_place(people: dict[str, Any], crew_rules: list[ApprovalRule]) -> None:
    client = client_for(people["moderator"])
    first, second = crew_rules
    client.post(f"/teams/crew/rules/{first.pk}/move", {"direction": "down"})
    assert [r.pk for r in actions.list_rules(people["moderator"], "crew")] == [second.pk, first.pk]
    client.post(
        f"/teams/crew/rules/{first.pk}/edit",
        {"tool": "write_note", "arguments": "title=draft*", "action": "ask", "approvals_required": "2"},
    )
    first.refresh_from_db()
    assert first.arguments == {"title": "draft*"} and first.approvals_required == 2 and first.position == 1


def test_test_this_rule_keeps_the_draft_and_shows_matches(people: dict[str, Any]) -> None:
    client = client_for(people["moderator"])
    query = {"tool": "deploy_*", "arguments": "env=prod", "action": "deny"}
    page = client.get("/teams/crew/rules/test", query).content.decode()
    assert 'value="deploy_*"' in page and "env=prod</textarea>" in page
    assert "would have matched <strong>0</strong>" in page
    partial = client.get("/teams/crew/rules/test", query, HTTP_HX_REQUEST="true").content.decode()
    assert "would have matched" in partial and "<h1>" not in partial
    assert not ApprovalRule.objects.exists()


def test_budget_and_retention_are_saved_and_shown(people: dict[str, Any]) -> None:
    client = client_for(people["moderator"])
    client.post("/teams/crew/budget", {"monthly_tokens": "5000", "monthly_cost": "12.5", "alert_thresholds": "50, 90"})
    budget = TeamBudget.objects.get(team__name="crew")
    assert budget.monthly_tokens == 5000 and str(budget.monthly_cost) == "12.5000"
    assert budget.alert_thresholds == [0.5, 0.9]
    client.post("/teams/crew/retention", {"retention_days": "0"})
    assert Team.objects.get(name="crew").retention_days == 0
    page = client_for(people["member"]).get("/teams/crew/").content.decode()
    assert "kept for ever" in page and "<meter" in page
    client.post("/teams/crew/retention", {"retention_days": "-3"})
    assert Team.objects.get(name="crew").retention_days == 0


def test_approval_rules_page_links_to_the_team_page_and_explains_the_way_in(people: dict[str, Any]) -> None:
    assert 'href="/teams/crew/#rules"' in client_for(people["moderator"]).get("/approvals/rules/").content.decode()
    lonely = client_for(people["newbie"]).get("/approvals/rules/").content.decode()
    assert "You moderate no team" in lonely and 'href="/teams/"' in lonely


# ---- the New session form and the chat header ----


def test_new_session_form_offers_the_teams_agents_and_pins_the_chosen_one(
    people: dict[str, Any], release: Agent
) -> None:
    client = client_for(people["member"])
    home = client.get("/").content.decode()
    assert 'name="agent"' in home and 'value="crew/release"' in home and "selected>Release assistant" in home
    assert "/teams/other/" not in home
    response = client.post(
        "/sessions/new", {"title": "", "mode": "", "model": "", "team": "crew", "agent": "crew/release"}
    )
    assert response.status_code == 302
    session = Session.objects.get(owner=people["member"])
    assert session.agent_id == release.pk and session.agent_version == 1
    header = client.get(f"/sessions/{session.pk}/").content.decode()
    assert '<a href="/teams/crew/agents/release/">Release assistant v1</a>' in header


def test_new_session_form_refuses_another_teams_agent(people: dict[str, Any], release: Agent) -> None:
    client = client_for(people["outsider"])
    client.post("/sessions/new", {"title": "", "mode": "", "model": "", "team": "other", "agent": "crew/release"})
    assert not Session.objects.filter(owner=people["outsider"]).exists()


def test_a_session_without_an_agent_says_default(people: dict[str, Any]) -> None:
    client = client_for(people["newbie"])
    client.post("/sessions/new", {"title": "", "mode": "", "model": "", "team": ""})
    session = Session.objects.get(owner=people["newbie"])
    assert session.agent_id is None
    html = client.get(f"/sessions/{session.pk}/").content.decode()
    header = re.search(r'<span id="chat-agent" class="agent-name"[^>]*>(.*?)</span>', html)
    assert header is not None and header.group(1) == "Default"  # the built-in agent


# ---- the API ----


def test_api_lists_the_callers_teams(people: dict[str, Any]) -> None:
    body = api_client(people["reviewer"]).get("/api/v1/teams").json()
    assert body == {"teams": [{"name": "crew", "role": "reviewer", "staff": False}]}
    staff = api_client(people["staff"]).get("/api/v1/teams").json()
    assert [t["name"] for t in staff["teams"]] == ["crew", "other"]


@pytest.mark.parametrize("role", ROLES)
def test_members_api_follows_the_roles(people: dict[str, Any], role: str) -> None:
    client = api_client(people[role])
    listing = client.get("/api/v1/teams/crew/members")
    write_status = {"outsider": 404, "member": 403, "reviewer": 403}.get(role)
    if role == "outsider":
        assert listing.status_code == 404
    else:
        assert listing.status_code == 200
        assert {"username": "moderator", "role": "moderator"}.items() <= listing.json()["members"][0].items()
    calls: list[Callable[[], Any]] = [
        lambda: client.post(
            "/api/v1/teams/crew/members", {"email": "newbie@example.org"}, content_type="application/json"
        ),
        lambda: client.put("/api/v1/teams/crew/members/owner", {"role": "reviewer"}, content_type="application/json"),
        lambda: client.delete("/api/v1/teams/crew/members/owner"),
    ]
    expected = (201, 200, 204)
    for call, ok in zip(calls, expected, strict=True):
        before = crew_state()
        response = call()
        if write_status is not None:
            assert response.status_code == write_status, response.content
            assert crew_state() == before
        else:
            assert response.status_code == ok, response.content


def test_members_api_refuses_bad_input_and_the_last_moderator(people: dict[str, Any]) -> None:
    client = api_client(people["moderator"])
    before = crew_state()
    bad = client.post(
        "/api/v1/teams/crew/members", {"username": "newbie", "role": "boss"}, content_type="application/json"
    )
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_role"
    both = client.post(
        "/api/v1/teams/crew/members", {"username": "newbie", "email": "x@y.z"}, content_type="application/json"
    )
    assert both.status_code == 400
    last = client.delete("/api/v1/teams/crew/members/moderator")
    assert last.status_code == 409 and last.json()["error"]["code"] == "last_moderator"
    again = client.post("/api/v1/teams/crew/members", {"username": "owner"}, content_type="application/json")
    assert again.status_code == 409 and again.json()["error"]["code"] == "already_member"
    assert client.delete("/api/v1/teams/crew/members/nobody").status_code == 404
    assert crew_state() == before


def test_openapi_describes_the_members_routes(people: dict[str, Any]) -> None:
    document = json.loads(Client().get("/api/v1/openapi.json").content)
    assert set(document["paths"]["/api/v1/teams/{name}/members"]) >= {"get", "post"}
    assert set(document["paths"]["/api/v1/teams/{name}/members/{username}"]) >= {"put", "delete"}
    assert document["components"]["schemas"]["Member"]["additionalProperties"] is False
