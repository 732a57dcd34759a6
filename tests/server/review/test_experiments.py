"""Experiments (docs/experiments.md): a team's recorded sessions replayed on a candidate
agent version through the ordinary queue and worker, with recorded results reused, a
divergence recorded instead of a side effect, the pages, blind judging, the API and the
role matrix.

Standing users: owner (member of crew), reviewer, moderator of crew; outsider
(moderator of another team).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from sectr import tool
from sectr.errors import Forbidden, NotFound, ValidationFailed
from sectr.events import EventType
from sectr.journal import NewEvent
from sectr.providers import DemoProvider, OpenAIProvider
from sectr.runtime import Runtime
from sessions_app import access, actions
from sessions_app.actions.tokens import do_issue_token
from sessions_app.experiments import actions as experiments
from sessions_app.experiments import compare
from sessions_app.journal import DatabaseJournal
from sessions_app.models import AskIndex, Experiment, PairVerdict, Session
from sessions_app.review import search
from sessions_app.runtime import _AGENT_VERSIONS, session_agent, session_policy
from sessions_app.team_budgets import session_budget_spent
from tests.openai_stub_server import STUB_MODEL, OpenAIStubServer, text_stream, tool_call_stream
from tests.server.conftest import make_user, work_until_idle

E = EventType
WRITTEN: dict[str, Path] = {}


@tool(gated=True, mutating=True)
def write_file(path: str, text: str) -> str:
    """Write a file in the test's folder."""
    (WRITTEN["folder"] / path).write_text(text)
    return f"wrote {len(text)} bytes to {path}"


RUNTIME = Runtime(
    DatabaseJournal(),
    provider=DemoProvider(delay=0.0005),
    tools=[write_file],
    rules=session_policy,
    agent=session_agent,
    budget=session_budget_spent,
)


@pytest.fixture
def people(db: None, tmp_path: Path) -> dict[str, Any]:
    WRITTEN["folder"] = tmp_path
    actions.do_create_team("crew")
    actions.do_create_team("other")
    users = {name: make_user(name) for name in ("owner", "reviewer", "moderator", "outsider")}
    actions.do_set_membership("crew", "owner", "member")
    actions.do_set_membership("crew", "reviewer", "reviewer")
    actions.do_set_membership("crew", "moderator", "moderator")
    actions.do_set_membership("other", "outsider", "moderator")
    _AGENT_VERSIONS.clear()
    agent = actions.do_create_agent(
        users["moderator"], "crew", "helper", {"name": "Helper", "instructions": "v1", "tools": ["*"]}
    )
    actions.do_save_agent_version(users["moderator"], agent.pk, {"instructions": "v2: be brief"})
    users["agent"] = agent
    return users


def run_worker(timeout: float = 60.0, runtime: Runtime = RUNTIME) -> None:
    """Until every replay's queued turns (pending runs) have run too."""
    work_until_idle(runtime, timeout=timeout, pending=True)


def recorded_session(people: dict[str, Any], *, approve: bool = True) -> Session:
    """A crew session on version 1: a gated write the moderator decides, then a thank-you."""
    session = actions.do_create_session(people["owner"], agent=people["agent"].pk, agent_version=1)
    args = json.dumps({"path": "out.txt", "text": "hello"})
    actions.do_post_message(people["owner"], session.pk, f"!tool write_file {args}")
    run_worker()
    ask = Session.objects.get(pk=session.pk).projection().pending_ask
    assert ask is not None
    verdict = "allow_once" if approve else "deny"
    actions.do_decide(people["moderator"], ask["ask_id"], verdict)
    run_worker()
    actions.do_post_message(people["owner"], session.pk, "thanks")
    run_worker()
    return Session.objects.get(pk=session.pk)


def journal_of(session_id: str) -> list[Any]:
    return DatabaseJournal().load_sync(session_id)


@pytest.mark.django_db(transaction=True)
def test_a_replay_reuses_recorded_results_asks_nobody_and_stays_out_of_peoples_lists(people: dict[str, Any]) -> None:
    source = recorded_session(people)
    out = WRITTEN["folder"] / "out.txt"
    assert out.read_text() == "hello"
    out.unlink()

    experiment = experiments.do_create_experiment(
        people["moderator"],
        "crew",
        name="v2 trial",
        candidates=[{"agent": "crew/helper", "version": 2}],
        sessions=[source.pk],
    )
    run_worker()

    (replay,) = experiment.replays.select_related("session")
    assert not out.exists()  # the recorded call was not run again
    assert not AskIndex.objects.filter(session=replay.session).exists()  # and nobody was asked
    replayed, recorded = journal_of(replay.session_id), journal_of(source.pk)
    result = [e.payload["content"] for e in replayed if e.type is E.TOOL_RESULT]
    assert result == [e.payload["content"] for e in recorded if e.type is E.TOOL_RESULT]
    users = [e.payload["reason"]["input"]["content"] for e in replayed if e.type is E.INVOCATION_STARTED]
    assert users[1] == "thanks" and len(users) == 2
    state = Session.objects.get(pk=replay.session_id).projection()
    assert state.agent is not None and state.agent["version"] == 2
    assert state.replay == {"source": source.pk, "live_reads": False, "turns": 2, "diverged": None}
    # Kept apart: not in the moderator's own list, nor in team review's search.
    assert Session.objects.get(pk=replay.session_id).is_replay
    assert not access.visible_sessions(people["moderator"]).filter(pk=replay.session_id).exists()
    found = search.search_sessions(people["reviewer"], search.Filters.from_query({}))
    assert replay.session_id not in {s.pk for s in found} and source.pk in {s.pk for s in found}
    (status,) = compare.replay_statuses(experiment)
    assert (status.state, status.turns_done) == (compare.DONE, 2)


def import_recorded(people: dict[str, Any], path: str) -> Session:
    """A session as another model recorded it: asked to write b.txt, it wrote `path`."""
    session = actions.do_create_session(people["owner"], agent=people["agent"].pk, agent_version=1)
    asked = json.dumps({"path": "b.txt", "text": "B"})
    called = json.dumps({"path": path, "text": "B"})
    events = [
        NewEvent(
            E.INVOCATION_STARTED,
            {"reason": {"kind": "user_message", "input": {"content": f"!tool write_file {asked}"}}},
            "inv_1",
        ),
        NewEvent(E.MESSAGE_START, {"message_id": "m1", "role": "assistant"}, "inv_1"),
        NewEvent(
            E.TOOL_CALL, {"message_id": "m1", "tool_call_id": "c1", "name": "write_file", "arguments": called}, "inv_1"
        ),
        NewEvent(E.MESSAGE_END, {"message_id": "m1", "usage": {"input_tokens": 3, "output_tokens": 2}}, "inv_1"),
        NewEvent(
            E.TOOL_RESULT, {"tool_call_id": "c1", "name": "write_file", "content": f"wrote 1 bytes to {path}"}, "inv_1"
        ),
        NewEvent(
            E.INVOCATION_COMPLETED,
            {"stop_reason": "end_turn", "usage": {"input_tokens": 3, "output_tokens": 2}},
            "inv_1",
        ),
        NewEvent(E.INVOCATION_STARTED, {"reason": {"kind": "user_message", "input": {"content": "and now?"}}}, "inv_2"),
        NewEvent(
            E.INVOCATION_COMPLETED,
            {"stop_reason": "end_turn", "usage": {"input_tokens": 0, "output_tokens": 0}},
            "inv_2",
        ),
    ]
    DatabaseJournal().append_sync(session.pk, events)
    return Session.objects.get(pk=session.pk)


@pytest.mark.django_db(transaction=True)
def test_another_call_is_a_divergence_and_the_file_is_never_written(people: dict[str, Any]) -> None:
    source = import_recorded(people, "a.txt")
    experiment = experiments.do_create_experiment(
        people["moderator"],
        "crew",
        name="diverge",
        candidates=[{"agent": "crew/helper", "version": 2}],
        sessions=[source.pk],
    )
    run_worker()
    assert not list(WRITTEN["folder"].iterdir())  # neither a.txt nor b.txt
    (status,) = compare.replay_statuses(experiment)
    assert status.state == compare.DIVERGED_STATE
    assert status.divergence == {"name": "write_file", "arguments": {"path": "b.txt", "text": "B"}, "turn": 1}
    ends = [
        e.payload.get("stop_reason") for e in journal_of(status.replay.session_id) if e.type is E.INVOCATION_COMPLETED
    ]
    assert ends == ["diverged", "replay_stopped"]
    (summary,) = compare.summarize(experiment)
    assert (summary.replays, summary.diverged, summary.done) == (1, 1, 0)

    comparison = compare.compare_source(experiment, source.pk)
    first = comparison.turns[0]
    assert first.sides[0].calls == [("write_file", '{"path": "a.txt", "text": "B"}')]
    assert first.sides[1].divergence is not None
    assert comparison.turns[1].sides[1].stopped

    moderator = Client()
    moderator.force_login(people["moderator"])
    page = moderator.get(f"/review/experiments/{experiment.pk}/sessions/{source.pk}/")
    assert page.status_code == 200
    assert b"would call <code>write_file</code>" in page.content


@pytest.mark.django_db(transaction=True)
def test_blind_judging_stores_what_won_and_the_summary_counts_it(people: dict[str, Any]) -> None:
    source = recorded_session(people)
    experiment = experiments.do_create_experiment(
        people["moderator"], "crew", name="judge", candidates=[{"agent": "crew/helper", "version": 2}], last=1
    )
    run_worker()
    reviewer = Client()
    reviewer.force_login(people["reviewer"])
    page = reviewer.get(f"/review/experiments/{experiment.pk}/judge")
    assert page.status_code == 200 and b"A is better" in page.content
    assert b"as recorded" not in page.content  # blind: no side is named
    flipped = experiments.blind_flip(experiment, source.pk, 0, people["reviewer"])
    response = reviewer.post(
        f"/review/experiments/{experiment.pk}/judge", {"source": source.pk, "candidate": 0, "choice": "a", "note": "hm"}
    )
    assert response.status_code == 302
    verdict = PairVerdict.objects.get(experiment=experiment, reviewer=people["reviewer"])
    assert verdict.winner == (PairVerdict.CANDIDATE if flipped else PairVerdict.BASELINE)
    (summary,) = compare.summarize(experiment)
    assert (summary.wins, summary.losses) == ((1, 0) if flipped else (0, 1))
    assert b"You have judged every pair" in reviewer.get(f"/review/experiments/{experiment.pk}/judge").content


@pytest.mark.django_db
def test_the_role_matrix(people: dict[str, Any]) -> None:
    source = import_recorded(people, "a.txt")
    candidates = [{"agent": "crew/helper", "version": 2}]
    for who in ("owner", "reviewer", "outsider"):
        error = NotFound if who == "outsider" else Forbidden
        with pytest.raises(error):
            experiments.do_create_experiment(people[who], "crew", name="x", candidates=candidates, sessions=[source.pk])
    experiment = experiments.do_create_experiment(
        people["moderator"], "crew", name="crew secret trial", candidates=candidates, sessions=[source.pk]
    )
    for who, status in (("reviewer", 200), ("moderator", 200), ("owner", 404), ("outsider", 404)):
        client = Client()
        client.force_login(people[who])
        assert client.get(f"/review/experiments/{experiment.pk}/").status_code == status, who
        assert client.get(f"/review/experiments/{experiment.pk}/sessions/{source.pk}/").status_code == status, who
        assert client.get(f"/review/experiments/{experiment.pk}/judge").status_code == status, who
    outsider = Client()
    outsider.force_login(people["outsider"])
    assert b"crew secret trial" not in outsider.get("/review/experiments/").content
    reviewer = Client()
    reviewer.force_login(people["reviewer"])
    assert b"crew secret trial" in reviewer.get("/review/experiments/").content
    assert outsider.get("/review/experiments/new").status_code == 200  # a moderator elsewhere: their own teams only
    assert "crew" not in outsider.get("/review/experiments/new").content.decode().split('name="team"')[1][:300]


@pytest.mark.django_db
def test_bad_input_is_refused_and_creates_nothing(people: dict[str, Any]) -> None:
    source = import_recorded(people, "a.txt")
    other = actions.do_create_session(people["outsider"], team="other")
    moderator = people["moderator"]
    good = [{"agent": "crew/helper", "version": 2}]
    cases: list[dict[str, Any]] = [
        {"name": "", "candidates": good, "sessions": [source.pk]},
        {"name": "x", "candidates": [], "sessions": [source.pk]},
        {"name": "x", "candidates": [{"agent": "crew/helper", "version": 9}], "sessions": [source.pk]},
        {"name": "x", "candidates": good, "sessions": [other.pk]},  # another team's session
        {"name": "x", "candidates": good, "sessions": [source.pk], "last": 3},  # two kinds of sources
        {"name": "x", "candidates": good, "last": 0},
        {"name": "x", "candidates": good, "queue": 12345},
        {"name": "x", "candidates": good, "sessions": [source.pk], "live_reads": "yes"},
    ]
    for case in cases:
        with pytest.raises((ValidationFailed, NotFound)):
            experiments.do_create_experiment(moderator, "crew", **case)
    assert not Experiment.objects.exists()
    assert not Session.objects.filter(is_replay=True).exists()


@pytest.mark.django_db(transaction=True)
def test_the_api_creates_reads_and_judges(people: dict[str, Any]) -> None:
    source = import_recorded(people, "a.txt")
    token = do_issue_token(people["moderator"], "t")[1]
    api = Client(HTTP_AUTHORIZATION=f"Bearer {token}")
    body = {"name": "api", "candidates": [{"agent": "crew/helper", "version": 2}], "sessions": [source.pk]}
    created = api.post("/api/v1/teams/crew/experiments", body, content_type="application/json")
    assert created.status_code == 201, created.content
    experiment_id = created.json()["id"]
    run_worker()
    read = api.get(f"/api/v1/experiments/{experiment_id}").json()
    assert read["replays"][0]["state"] == "diverged" and read["summary"][0]["diverged"] == 1
    assert api.get("/api/v1/teams/crew/experiments").json()["experiments"][0]["id"] == experiment_id
    judged = api.post(
        f"/api/v1/experiments/{experiment_id}/verdicts",
        {"source": source.pk, "candidate": 0, "winner": "baseline"},
        content_type="application/json",
    )
    assert judged.status_code == 201 and judged.json()["winner"] == "baseline"
    bad = api.post(
        "/api/v1/teams/crew/experiments", {**body, "sessions": ["ses_nope"]}, content_type="application/json"
    )
    assert bad.status_code == 400
    outsider = Client(HTTP_AUTHORIZATION=f"Bearer {do_issue_token(people['outsider'], 't')[1]}")
    assert outsider.get(f"/api/v1/experiments/{experiment_id}").status_code == 404
    assert outsider.get("/api/v1/teams/crew/experiments").status_code == 404
    # A member of the team reads none of them: not one (404), not the list (403).
    member = Client(HTTP_AUTHORIZATION=f"Bearer {do_issue_token(people['owner'], 't')[1]}")
    assert member.get(f"/api/v1/experiments/{experiment_id}").status_code == 404
    assert member.get("/api/v1/teams/crew/experiments").status_code == 403


@pytest.mark.django_db(transaction=True)
def test_a_real_providers_candidate_gets_the_recorded_result_or_diverges(people: dict[str, Any]) -> None:
    """The candidate talks to a local OpenAI-compatible server through the `openai`
    package: its model sees the recorded result of the call it repeats; the call it makes
    differently on purpose stops its replay, and nothing is written."""
    source = recorded_session(people)
    (WRITTEN["folder"] / "out.txt").unlink()
    same = json.dumps({"text": "hello", "path": "out.txt"})  # other key order: the same call
    other = json.dumps({"path": "elsewhere.txt", "text": "hello"})
    with OpenAIStubServer() as stub:
        stub.script(
            [
                tool_call_stream([("call_1", "write_file", same)]),
                text_stream("Done, as before."),
                text_stream("You are welcome."),
                tool_call_stream([("call_2", "write_file", other)]),
            ]
        )
        provider = OpenAIProvider(base_url=stub.base_url, api_key="sk-test", default_model=STUB_MODEL)
        runtime = Runtime(
            DatabaseJournal(), provider=provider, tools=[write_file], rules=session_policy, agent=session_agent
        )
        candidates = [{"agent": "crew/helper", "version": 2, "model": STUB_MODEL}]
        kept = experiments.do_create_experiment(
            people["moderator"], "crew", name="same", candidates=candidates, sessions=[source.pk]
        )
        run_worker(runtime=runtime)
        diverged = experiments.do_create_experiment(
            people["moderator"], "crew", name="other", candidates=candidates, sessions=[source.pk]
        )
        run_worker(runtime=runtime)
        requests = list(stub.requests)
    assert not list(WRITTEN["folder"].iterdir())
    (status,) = compare.replay_statuses(kept)
    assert status.state == compare.DONE
    recorded = next(e.payload["content"] for e in journal_of(source.pk) if e.type is E.TOOL_RESULT)
    tool_messages = [m for m in requests[1]["messages"] if m["role"] == "tool"]
    assert [m["content"] for m in tool_messages] == [recorded]  # what the model was told happened
    assert requests[0]["model"] == STUB_MODEL and "v2: be brief" in json.dumps(requests[0]["messages"][0])
    (status,) = compare.replay_statuses(diverged)
    assert status.state == compare.DIVERGED_STATE
    assert status.divergence == {
        "name": "write_file",
        "arguments": {"path": "elsewhere.txt", "text": "hello"},
        "turn": 1,
    }
    assert len(requests) == 4  # the diverged replay's second turn never reached the model
