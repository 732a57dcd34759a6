"""Agents on the server (docs/agents.md): versions saved by a team's moderators, sessions
pinned at creation and moved only by the journaled action, the worker running each
session with its pinned version, the API and the role matrix.

Standing users: owner (member of crew), member, reviewer, moderator of crew; outsider
(moderator of another team); staff.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db.models import ProtectedError
from django.test import Client

from sectr.errors import Forbidden, NotFound, SessionBusy, ValidationFailed
from sectr.events import EventType
from sectr.fold import fold_messages, last_assistant_text
from sectr.providers import DemoProvider
from sectr.runtime import Runtime
from sessions_app import actions
from sessions_app.actions.tokens import do_issue_token
from sessions_app.journal import DatabaseJournal
from sessions_app.models import Agent, AgentVersion, Session
from sessions_app.runtime import _AGENT_VERSIONS, session_agent, session_policy
from sessions_app.team_budgets import session_budget_spent
from tests.server.conftest import crew_people, work_until_idle

E = EventType
RUNTIME = Runtime(
    DatabaseJournal(),
    provider=DemoProvider(delay=0.0005),
    rules=session_policy,
    agent=session_agent,
    budget=session_budget_spent,
)
INSTRUCTIONS = "You are the release assistant. Be brief."


@pytest.fixture
def people(db: None) -> dict[str, Any]:
    users = crew_people()
    _AGENT_VERSIONS.clear()
    return users


def release_agent(people: dict[str, Any], **fields: Any) -> Agent:
    definition = {"name": "Release assistant", "instructions": INSTRUCTIONS, "tools": ["get_time", "*_note"], **fields}
    return actions.do_create_agent(people["moderator"], "crew", "release", definition, note="first cut")


def run_worker(timeout: float = 30.0) -> None:
    """Run a worker (with the agents' source, as the server's runtime has) until idle."""
    work_until_idle(RUNTIME, timeout=timeout)


def reply_to(session: Session, owner: Any, text: str) -> str:
    actions.do_post_message(owner, session.pk, text)
    run_worker()
    return last_assistant_text(fold_messages(DatabaseJournal().load_sync(session.pk)))


def api_client(user: Any) -> Client:
    return Client(HTTP_AUTHORIZATION=f"Bearer {do_issue_token(user, 't')[1]}")


# ---- versions ----


@pytest.mark.django_db
def test_a_moderator_creates_an_agent_with_version_1(people: dict[str, Any]) -> None:
    agent = release_agent(people)
    version = AgentVersion.objects.get(agent=agent)
    assert (agent.latest_version, version.number, version.note, version.author_name) == (1, 1, "first cut", "moderator")
    assert version.spec().instructions == INSTRUCTIONS
    assert version.spec().tools == ("get_time", "*_note")


@pytest.mark.django_db
@pytest.mark.parametrize("who", ["owner", "member", "reviewer"])
def test_only_moderators_create_and_save_agents(people: dict[str, Any], who: str) -> None:
    with pytest.raises(Forbidden):
        actions.do_create_agent(people[who], "crew", "x", {"name": "X"})
    agent = release_agent(people)
    with pytest.raises(Forbidden):
        actions.do_save_agent_version(people[who], agent.pk, {"instructions": "no"})


@pytest.mark.django_db
def test_an_outsider_gets_not_found_for_a_teams_agents(people: dict[str, Any]) -> None:
    agent = release_agent(people)
    with pytest.raises(NotFound):
        actions.do_create_agent(people["outsider"], "crew", "x", {"name": "X"})
    with pytest.raises(NotFound):
        actions.get_agent_for_user(people["outsider"], agent.pk)
    with pytest.raises(NotFound):
        actions.get_agent_for_user(people["outsider"], "crew/release")
    assert actions.list_agents(people["outsider"]) == []


@pytest.mark.django_db
def test_only_staff_make_installation_wide_agents_and_everyone_may_use_them(people: dict[str, Any]) -> None:
    with pytest.raises(Forbidden):
        actions.do_create_agent(people["moderator"], None, "helper", {"name": "Helper"})
    helper = actions.do_create_agent(people["staff"], None, "helper", {"name": "Helper", "instructions": "Help."})
    assert actions.get_agent_for_user(people["outsider"], "helper").pk == helper.pk
    session = actions.do_create_session(people["outsider"], agent="helper")
    assert session.agent_id == helper.pk


@pytest.mark.django_db
def test_a_save_makes_the_next_version_and_never_edits_one(people: dict[str, Any]) -> None:
    agent = release_agent(people)
    v2 = actions.do_save_agent_version(people["moderator"], agent.pk, {"instructions": "Version two."}, note="shorter")
    assert v2.number == 2 and v2.note == "shorter"
    assert v2.spec().tools == ("get_time", "*_note")  # what was not given stays
    v1 = AgentVersion.objects.get(agent=agent, number=1)
    assert v1.instructions == INSTRUCTIONS
    agent.refresh_from_db()
    assert agent.latest_version == 2


@pytest.mark.django_db
def test_a_bad_save_is_refused_and_writes_nothing(people: dict[str, Any]) -> None:
    agent = release_agent(people)
    for bad in ({"tools": "get_time"}, {"params": {"temperature": 9}}, {"colour": "red"}, {"name": ""}):
        with pytest.raises(ValidationFailed):
            actions.do_save_agent_version(people["moderator"], agent.pk, bad)
    assert AgentVersion.objects.filter(agent=agent).count() == 1
    with pytest.raises(ValidationFailed):
        actions.do_create_agent(people["moderator"], "crew", "release", {"name": "Again"})  # slug taken
    with pytest.raises(ValidationFailed):
        actions.do_create_agent(people["moderator"], "crew", "Bad Slug", {"name": "X"})


# ---- sessions pinned to versions ----


@pytest.mark.django_db(transaction=True)
def test_a_session_runs_with_its_agents_instructions_and_tools(people: dict[str, Any]) -> None:
    release_agent(people)
    session = actions.do_create_session(people["owner"])  # the team's first agent by default
    assert reply_to(session, people["owner"], "!system") == f"system: {INSTRUCTIONS}"
    assert reply_to(session, people["owner"], "!offered") == "tools: delete_note, get_time, write_note"
    reply_to(session, people["owner"], "calculate 6*7")
    results = [e for e in DatabaseJournal().load_sync(session.pk) if e.type is E.TOOL_RESULT]
    assert results[-1].payload["content"] == "tool not available to this agent"
    assert results[-1].payload["is_error"] is True


@pytest.mark.django_db(transaction=True)
def test_a_session_without_agents_runs_as_before(people: dict[str, Any]) -> None:
    session = actions.do_create_session(people["owner"])
    assert session.agent_id is None
    assert reply_to(session, people["owner"], "!system") == "system: (none)"
    assert reply_to(session, people["owner"], "!offered") == "tools: calculator, delete_note, get_time, write_note"


@pytest.mark.django_db(transaction=True)
def test_a_new_version_serves_new_sessions_while_old_ones_stay_until_moved(people: dict[str, Any]) -> None:
    agent = release_agent(people)
    old = actions.do_create_session(people["owner"], agent=agent.pk)
    actions.do_save_agent_version(people["moderator"], agent.pk, {"instructions": "Version two."})
    new = actions.do_create_session(people["owner"], agent="crew/release")
    assert (old.agent_version, new.agent_version) == (1, 2)
    assert reply_to(old, people["owner"], "!system") == f"system: {INSTRUCTIONS}"
    assert reply_to(new, people["owner"], "!system") == "system: Version two."
    moved = actions.do_move_agent(people["owner"], old.pk, 2)
    assert moved.agent_version == 2
    updates = [e for e in DatabaseJournal().load_sync(old.pk) if e.type is E.SESSION_UPDATED]
    assert updates[-1].payload == {"agent": {"id": agent.pk, "slug": "release", "team": "crew", "version": 2}}
    assert reply_to(old, people["owner"], "!system") == "system: Version two."
    # the cached columns are a projection: rebuilt from the journal alone they agree
    old.refresh_from_db()
    old.rebuild_projection()
    assert (old.agent_id, old.agent_version) == (agent.pk, 2)


@pytest.mark.django_db(transaction=True)
async def test_the_open_chat_shows_a_move_to_another_version_live(people: dict[str, Any]) -> None:
    from channels.db import database_sync_to_async

    from tests.server.chat.test_consumers import chat_path, connect, frames_until_ready, next_frame

    def prepare() -> Session:
        agent = release_agent(people)
        actions.do_save_agent_version(people["moderator"], agent.pk, {"name": "Release v2 <b>bold</b>"})
        return actions.do_create_session(people["owner"], agent=agent.pk, agent_version=1)

    session = await database_sync_to_async(prepare)()
    owner = Client()
    await database_sync_to_async(owner.force_login)(people["owner"])
    html = (await database_sync_to_async(owner.get)(f"/sessions/{session.pk}/")).content.decode()
    assert 'id="chat-agent"' in html and "Release assistant v1" in html
    communicator, connected, _ = await connect(people["owner"], chat_path(session))
    assert connected
    await frames_until_ready(communicator)
    await database_sync_to_async(actions.do_move_agent)(people["owner"], session.pk, 2)
    frame = await next_frame(communicator)
    header = frame["html"][frame["html"].index('id="chat-agent"') :]
    assert 'hx-swap-oob="true"' in header.split(">", 1)[0]
    assert "Release v2 &lt;b&gt;bold&lt;/b&gt; v2" in header  # escaped, the new version
    assert 'href="/teams/crew/agents/release/"' in header  # the owner has a role in crew
    await communicator.disconnect()


@pytest.mark.django_db
def test_a_session_pins_an_earlier_version_when_asked(people: dict[str, Any]) -> None:
    agent = release_agent(people)
    actions.do_save_agent_version(people["moderator"], agent.pk, {"instructions": "Two."})
    session = actions.do_create_session(people["owner"], agent=agent.pk, agent_version=1)
    created = DatabaseJournal().load_sync(session.pk)[0]
    assert created.payload["agent"] == {"id": agent.pk, "slug": "release", "team": "crew", "version": 1}
    with pytest.raises(ValidationFailed, match="has no version 9"):  # 400: the field is wrong, not the route
        actions.do_create_session(people["owner"], agent=agent.pk, agent_version=9)


@pytest.mark.django_db
def test_fork_and_clear_keep_the_pin_or_take_another_version(people: dict[str, Any]) -> None:
    agent = release_agent(people)
    session = actions.do_create_session(people["owner"])
    actions.do_save_agent_version(people["moderator"], agent.pk, {"instructions": "Two."})
    assert actions.do_fork(people["owner"], session.pk).agent_version == 1
    assert actions.do_clear(people["owner"], session.pk).agent_version == 1
    assert actions.do_fork(people["owner"], session.pk, agent_version=2).agent_version == 2
    assert actions.do_clear(people["owner"], session.pk, agent_version=2).agent_version == 2


@pytest.mark.django_db
def test_a_teams_agent_serves_only_that_teams_sessions(people: dict[str, Any]) -> None:
    agent = release_agent(people)
    with pytest.raises(ValidationFailed, match="belongs to the team crew"):
        actions.do_create_session(people["owner"], team=None, agent=agent.pk)
    with pytest.raises(ValidationFailed):
        actions.do_create_session(people["outsider"], agent=agent.pk)  # not theirs to see


@pytest.mark.django_db
def test_the_pin_moves_only_between_runs_and_only_by_the_owner(people: dict[str, Any]) -> None:
    agent = release_agent(people)
    session = actions.do_create_session(people["owner"])
    actions.do_save_agent_version(people["moderator"], agent.pk, {"instructions": "Two."})
    with pytest.raises(Forbidden):
        actions.do_move_agent(people["member"], session.pk, 2)
    with pytest.raises(NotFound):
        actions.do_move_agent(people["outsider"], session.pk, 2)
    actions.do_post_message(people["owner"], session.pk, "hello")  # a run is now queued
    with pytest.raises(SessionBusy):
        actions.do_move_agent(people["owner"], session.pk, 2)


@pytest.mark.django_db
def test_an_agent_in_use_is_never_deleted(people: dict[str, Any]) -> None:
    agent = release_agent(people)
    actions.do_create_session(people["owner"])
    with pytest.raises(ProtectedError):
        agent.delete()


# ---- the API ----


@pytest.mark.django_db(transaction=True)
def test_the_agents_api(people: dict[str, Any]) -> None:
    mod = api_client(people["moderator"])
    created = mod.post(
        "/api/v1/teams/crew/agents",
        data={"slug": "release", "name": "Release", "instructions": INSTRUCTIONS, "tools": ["get_time"]},
        content_type="application/json",
    )
    assert created.status_code == 201, created.content
    agent = created.json()
    assert (agent["slug"], agent["team"], agent["latest_version"], agent["editable"]) == ("release", "crew", 1, True)
    saved = mod.put(
        f"/api/v1/agents/{agent['id']}", data={"instructions": "Two.", "note": "v2"}, content_type="application/json"
    )
    assert saved.status_code == 200, saved.content
    assert (saved.json()["version"], saved.json()["note"], saved.json()["tools"]) == (2, "v2", ["get_time"])
    versions = mod.get(f"/api/v1/agents/{agent['id']}/versions").json()["versions"]
    assert [v["version"] for v in versions] == [2, 1]
    assert mod.get(f"/api/v1/agents/{agent['id']}/versions/1").json()["instructions"] == INSTRUCTIONS
    assert mod.get(f"/api/v1/agents/{agent['id']}/versions/7").status_code == 404
    assert [a["slug"] for a in mod.get("/api/v1/teams/crew/agents").json()["agents"]] == ["release"]

    owner = api_client(people["owner"])
    snap = owner.post(
        "/api/v1/sessions", data={"agent": "crew/release", "agent_version": 1}, content_type="application/json"
    )
    assert snap.status_code == 201, snap.content
    assert snap.json()["agent"] == {
        "id": agent["id"],
        "slug": "release",
        "name": "Release",
        "version": 1,
        "team": "crew",
    }
    moved = owner.post(
        f"/api/v1/sessions/{snap.json()['id']}/agent", data={"version": 2}, content_type="application/json"
    )
    assert moved.status_code == 200, moved.content
    assert moved.json()["agent"]["version"] == 2
    assert owner.get(f"/api/v1/agents/{agent['id']}").json()["editable"] is False
    denied = owner.put(f"/api/v1/agents/{agent['id']}", data={"name": "x"}, content_type="application/json")
    assert denied.status_code == 403
    plain = owner.post("/api/v1/sessions", data={"team": None}, content_type="application/json").json()
    assert plain["agent"] == {"id": None, "slug": "default", "name": "Default", "version": 1, "team": None}


@pytest.mark.django_db(transaction=True)
def test_the_agents_api_gives_an_outsider_404(people: dict[str, Any]) -> None:
    agent = release_agent(people)
    outsider = api_client(people["outsider"])
    for method, path, body in [
        ("get", "teams/crew/agents", None),
        ("post", "teams/crew/agents", {"slug": "x", "name": "X"}),
        ("get", f"agents/{agent.pk}", None),
        ("put", f"agents/{agent.pk}", {"name": "X"}),
        ("get", f"agents/{agent.pk}/versions", None),
        ("get", f"agents/{agent.pk}/versions/1", None),
    ]:
        call = getattr(outsider, method)
        response = (
            call(f"/api/v1/{path}", data=body, content_type="application/json") if body else call(f"/api/v1/{path}")
        )
        assert response.status_code == 404, (method, path, response.content)
    assert outsider.get("/api/v1/agents").json() == {"agents": []}


@pytest.mark.django_db(transaction=True)
def test_the_api_refuses_bad_agents_with_400(people: dict[str, Any]) -> None:
    mod = api_client(people["moderator"])
    for body in (
        {"name": "X"},
        {"slug": "x", "name": "X", "tools": "get_time"},
        {"slug": "x", "name": "X", "params": {"top_p": 1}},
        {"slug": "x", "name": "X", "colour": "red"},
    ):
        response = mod.post("/api/v1/teams/crew/agents", data=body, content_type="application/json")
        assert response.status_code == 400, (body, response.content)
        assert set(response.json()["error"]) >= {"code", "message"}
    assert not Agent.objects.exists()


# ---- review ----


@pytest.mark.django_db
def test_review_filters_by_agent_and_version_and_names_the_pin(people: dict[str, Any]) -> None:
    agent = release_agent(people)
    first = actions.do_create_session(people["owner"], title="first")
    actions.do_save_agent_version(people["moderator"], agent.pk, {"instructions": "Two."})
    second = actions.do_create_session(people["owner"], title="second")
    plain = actions.do_create_session(people["owner"], team=None, title="plain")
    client = Client()
    client.force_login(people["moderator"])

    def titles(query: str) -> list[str]:
        page = client.get(f"/review/?{query}").content.decode()
        return sorted(title for title in ("first", "second", "plain") if f">{title}<" in page)

    assert titles("agent=crew/release") == ["first", "second"]
    assert titles("agent=release&version=2") == ["second"]
    assert titles(f"agent={agent.pk}&version=1") == ["first"]
    staff = Client()
    staff.force_login(people["staff"])
    page = staff.get("/review/?agent=default").content.decode()
    assert ">plain<" in page and ">first<" not in page
    review = client.get(f"/review/{second.pk}/").content.decode()
    assert "crew/Release assistant (release, version 2)" in review
    assert first.pk and plain.pk


@pytest.mark.django_db(transaction=True)
def test_usage_is_rolled_up_and_shown_per_agent_version(people: dict[str, Any]) -> None:
    from django.core.management import call_command

    from sessions_app.models import UsageDaily

    agent = release_agent(people)
    first = actions.do_create_session(people["owner"])
    reply_to(first, people["owner"], "!long 5")
    actions.do_save_agent_version(people["moderator"], agent.pk, {"instructions": "Two."})
    second = actions.do_create_session(people["owner"])
    reply_to(second, people["owner"], "!long 7")
    plain = actions.do_create_session(people["owner"], team=None)
    reply_to(plain, people["owner"], "!long 9")

    def rollup() -> dict[str, int]:
        return {row.agent_key: row.output_tokens for row in UsageDaily.objects.all()}

    live = rollup()
    assert live == {f"{agent.pk}:1": 5, f"{agent.pk}:2": 7, "": 9}
    call_command("sectr_reindex", verbosity=0)  # rebuilt from the journal alone: the same
    assert rollup() == live
    page = Client()
    page.force_login(people["staff"])
    usage = page.get("/review/usage/").content.decode()
    assert "Per agent" in usage and "crew/release v1" in usage and "crew/release v2" in usage
    assert "default (built-in)" in usage
