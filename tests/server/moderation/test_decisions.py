"""More verdicts through the one decision path: allow_once with edited arguments and
respond, from the queue and chat cards (Django's test client, no worker) and from the
API and the Python SDK against a real server (the resumed run executes the edited call
or gets the person's answer)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import Client

from sectr.client import Client as SdkClient
from sectr.client import Edit, Respond
from sessions_app.actions.tokens import do_issue_token
from sessions_app.models import AuditEntry, Envelope, Session, Team
from tests.server.api.test_api_support import LiveApi, live_api, sse_events
from tests.server.chat.test_web import HTMX, append, asked, logged_in, started
from tests.server.conftest import SessionFactory

# ---- the cards (no worker: the decision is journaled, the run only queued) ----


def pending_session(make_session: SessionFactory, team: Team, **terms: Any) -> Session:
    session = make_session(title="Ops session")
    Session.objects.filter(pk=session.pk).update(team=team)
    events = [started("note: buy milk", inv="inv_2"), *asked(inv="inv_2", mid="msg_2")]
    if terms:
        events[-2].payload.update(terms)  # the APPROVAL_REQUESTED
    append(session, events)
    return session


def decision_of(session: Session) -> dict[str, Any] | None:
    envelope = Envelope.objects.filter(
        session=session, type="INVOCATION_STARTED", payload__reason__kind="approval_decision"
    ).first()
    return envelope.payload["reason"]["decision"] if envelope is not None else None


@pytest.mark.django_db
def test_the_queue_and_chat_cards_offer_edit_arguments_and_respond(
    make_session: SessionFactory, ops: Team, teammate: Any, owner: Any
) -> None:
    session = pending_session(make_session, ops)
    queue = logged_in(teammate).get("/approvals/").content.decode()
    chat = logged_in(owner).get(f"/sessions/{session.pk}/").content.decode()
    for html in (queue, chat):
        assert "<summary>Edit arguments</summary>" in html and "<summary>Respond</summary>" in html
        assert 'name="arguments" rows="6" spellcheck="false" required data-json-object>{\n' in html
        assert '<button type="submit" name="verdict" value="respond">Send answer</button>' in html
        assert "<script>" not in html.split("</head>")[1]  # no inline script (CSP)


@pytest.mark.django_db
@pytest.mark.parametrize("may_have_run", [True, False])
def test_a_re_ask_after_a_crash_says_on_the_cards_and_the_api_that_the_call_may_have_run(
    make_session: SessionFactory, ops: Team, teammate: Any, owner: Any, may_have_run: bool
) -> None:
    session = pending_session(make_session, ops, **({"may_have_run": True} if may_have_run else {}))
    queue = logged_in(teammate).get("/approvals/").content.decode()
    chat = logged_in(owner).get(f"/sessions/{session.pk}/").content.decode()
    for html in (queue, chat):
        assert ('data-role="may-have-run"' in html) is may_have_run
        assert ("The first attempt may have run." in html) is may_have_run
    api = Client(HTTP_AUTHORIZATION=f"Bearer {do_issue_token(teammate, 't')[1]}")
    (listed,) = api.get("/api/v1/asks").json()["asks"]
    assert listed["may_have_run"] is may_have_run
    reader = Client(HTTP_AUTHORIZATION=f"Bearer {do_issue_token(owner, 't')[1]}")
    assert reader.get(f"/api/v1/sessions/{session.pk}").json()["pending_ask"]["may_have_run"] is may_have_run


@pytest.mark.django_db
def test_no_edit_nor_respond_on_an_ask_needing_several_approvals(
    make_session: SessionFactory, ops: Team, teammate: Any
) -> None:
    pending_session(make_session, ops, approvals_required=2)
    html = logged_in(teammate).get("/approvals/").content.decode()
    assert "Approve once</button>" in html
    assert "Edit arguments" not in html and "<summary>Respond</summary>" not in html


@pytest.mark.django_db
def test_the_edit_form_decides_with_the_edited_arguments(
    make_session: SessionFactory, ops: Team, teammate: Any
) -> None:
    session = pending_session(make_session, ops)
    edited = json.dumps({"title": "buy milk", "body": "buy oat milk"})
    response = logged_in(teammate).post(
        "/asks/ask_1/decide", {"verdict": "allow_once", "arguments": edited, "where": "queue"}, **HTMX
    )
    assert response.status_code == 200 and 'data-status="approved"' in response.content.decode()
    assert decision_of(session) == {
        "approved": True,
        "approver": "teammate",
        "verdict": "allow_once",
        "arguments": {"title": "buy milk", "body": "buy oat milk"},
    }
    (row,) = AuditEntry.objects.filter(session=session, kind=AuditEntry.DECISION)
    assert row.edited and row.run_arguments == {"title": "buy milk", "body": "buy oat milk"}
    assert row.arguments == {"title": "buy milk", "body": "buy milk"}  # what was asked
    audit = logged_in(teammate).get("/approvals/audit/").content.decode()
    assert '<p data-role="audit-edited"><strong>edited</strong>, ran with:</p>' in audit
    assert "buy oat milk" in audit
    # The chat card and the review timeline show what was asked and what ran.
    chat = logged_in(teammate).get(f"/sessions/{session.pk}/").content.decode()
    assert (
        "Approved once by teammate: ran with edited arguments {&quot;body&quot;: &quot;buy oat milk&quot;, "
        "&quot;title&quot;: &quot;buy milk&quot;}" in chat
    )
    timeline = logged_in(teammate).get(f"/review/{session.pk}/").content.decode()
    assert '<p data-role="edited">Edited: the call ran with</p>' in timeline
    assert (
        "&quot;body&quot;: &quot;buy oat milk&quot;" in timeline
        and "&quot;body&quot;: &quot;buy milk&quot;" in timeline
    )


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "the edited arguments are not JSON"),
        ('["a"]', "the edited arguments must be a JSON object"),
        ('{"title": "x", "colour": "red"}', "unknown argument &#x27;colour&#x27;"),
        ('{"body": "x"}', "missing required argument &#x27;title&#x27;"),
    ],
)
def test_bad_edited_arguments_leave_the_ask_pending_and_say_why(
    make_session: SessionFactory, ops: Team, teammate: Any, text: str, message: str
) -> None:
    session = pending_session(make_session, ops)
    response = logged_in(teammate).post(
        "/asks/ask_1/decide", {"verdict": "allow_once", "arguments": text, "where": "queue"}, **HTMX
    )
    html = response.content.decode()
    assert response.status_code == 400 and 'data-status="pending"' in html
    assert message in html
    assert decision_of(session) is None
    assert not AuditEntry.objects.filter(session=session, kind=AuditEntry.DECISION).exists()


@pytest.mark.django_db
def test_the_respond_form_answers_instead_of_running(
    make_session: SessionFactory, ops: Team, owner: Any, teammate: Any
) -> None:
    session = pending_session(make_session, ops)
    client: Client = logged_in(owner)
    blank = client.post("/asks/ask_1/decide", {"verdict": "respond", "result": "  "}, **HTMX)
    assert 'data-status="pending"' in blank.content.decode() and decision_of(session) is None
    response = client.post("/asks/ask_1/decide", {"verdict": "respond", "result": "Milk is bought."}, **HTMX)
    html = response.content.decode()
    assert 'data-status="denied"' in html and "Answered by owner" in html
    assert decision_of(session) == {
        "approved": False,
        "approver": "owner",
        "verdict": "respond",
        "result": "Milk is bought.",
    }
    (row,) = AuditEntry.objects.filter(session=session, kind=AuditEntry.DECISION)
    assert (row.verdict, row.note, row.edited) == ("respond", "Milk is bought.", False)
    listed = logged_in(teammate).get("/approvals/audit/?verdict=respond").content.decode()
    assert 'data-kind="decision"' in listed and "Milk is bought." in listed
    timeline = logged_in(teammate).get(f"/review/{session.pk}/").content.decode()
    assert '<p class="note">Answer: Milk is bought.</p>' in timeline
    assert "Answered by owner: Milk is bought." in logged_in(owner).get(f"/sessions/{session.pk}/").content.decode()


# ---- the API and the SDK against a real server ----


@pytest.fixture(scope="module")
def api() -> Iterator[LiveApi]:
    with live_api() as live:
        yield live


def awaiting(api: LiveApi, arguments: dict[str, Any]) -> tuple[str, str]:
    http = api.http()
    session_id = http.post("/sessions", json={}).json()["id"]
    run = http.post(f"/sessions/{session_id}/runs", json={"content": f"!tool write_note {json.dumps(arguments)}"})
    assert run.status_code == 202, run.text
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        snapshot = http.get(f"/sessions/{session_id}").json()
        if snapshot["state"] == "awaiting":
            return session_id, snapshot["pending_ask"]["ask_id"]
        time.sleep(0.05)
    raise AssertionError("the run never asked")


def run_frames(api: LiveApi, run_id: str, user: str = "alice") -> list[dict[str, Any]]:
    with api.http(user).stream("GET", f"/runs/{run_id}/events") as response:
        return [frame for frame in sse_events(response) if "event" in frame]


def tool_results(frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [frame["data"]["payload"] for frame in frames if frame["event"] == "tool.result"]


@pytest.mark.slow
def test_the_api_runs_the_edited_call_and_audits_it_as_edited(api: LiveApi) -> None:
    session_id, ask_id = awaiting(api, {"title": "plan", "body": "asked"})
    decided = api.http("mod").post(
        f"/asks/{ask_id}", json={"verdict": "allow_once", "arguments": {"title": "plan", "body": "edited"}}
    )
    assert decided.status_code == 202, decided.text
    assert decided.json()["ask"]["verdict"] == "allow_once"
    (result,) = tool_results(run_frames(api, decided.json()["run_id"]))
    assert result["content"] == (
        '(arguments edited by mod: {"body": "edited", "title": "plan"})\nsaved note \'plan\' (created)'
    )
    entries = api.http().get("/audit", params={"session": session_id, "kind": "decision"}).json()["entries"]
    assert [(e["actor"], e["edited"], e["run_arguments"], e["arguments"]["body"]) for e in entries] == [
        ("mod", True, {"title": "plan", "body": "edited"}, "asked")
    ]


@pytest.mark.slow
def test_the_api_answers_a_call_with_a_persons_text(api: LiveApi) -> None:
    session_id, ask_id = awaiting(api, {"title": "plan", "body": "b"})
    decided = api.http().post(f"/asks/{ask_id}", json={"verdict": "respond", "result": "Done by hand."})
    assert decided.status_code == 202, decided.text
    frames = run_frames(api, decided.json()["run_id"])
    (result,) = tool_results(frames)
    assert result["content"] == "(answered by alice instead of running write_note) Done by hand."
    assert not result.get("is_error")
    assert decided.json()["ask"]["verdict"] == "respond"


@pytest.mark.slow
def test_the_api_refuses_a_bad_edit_or_response_and_changes_nothing(api: LiveApi) -> None:
    session_id, ask_id = awaiting(api, {"title": "plan", "body": "b"})
    http = api.http()
    for body, code in (
        ({"verdict": "deny", "arguments": {"title": "x"}}, "invalid_arguments"),
        ({"verdict": "allow_once", "arguments": ["x"]}, "invalid_arguments"),
        ({"verdict": "allow_once", "arguments": {"title": "x", "nope": 1}}, "invalid_arguments"),
        ({"verdict": "respond"}, "invalid_result"),
        ({"verdict": "respond", "result": 5}, "invalid_result"),
        ({"verdict": "allow_once", "result": "x"}, "invalid_result"),
        ({"verdict": "maybe"}, "invalid_verdict"),
    ):
        refused = http.post(f"/asks/{ask_id}", json=body)
        assert refused.status_code == 400, (body, refused.text)
        assert refused.json()["error"]["code"] == code, body
    assert http.get(f"/sessions/{session_id}").json()["pending_ask"]["ask_id"] == ask_id


@pytest.mark.slow
def test_sdk_responders_may_edit_or_respond(api: LiveApi) -> None:
    with SdkClient(api.base_url, token=api.tokens["alice"]) as client:
        session = client.sessions.create()
        edited = session.run(
            '!tool write_note {"title": "t", "body": "asked"}',
            on_permission_ask=lambda ask: Edit({**ask.arguments, "body": "from the SDK"}),
        ).result()
        assert "arguments edited by alice" in edited.text and "from the SDK" in edited.text
        answered = session.run(
            '!tool write_note {"title": "u", "body": "b"}', on_permission_ask=lambda ask: Respond("no need")
        ).result()
        assert "(answered by alice instead of running write_note) no need" in answered.text
        stopped = session.run('!tool write_note {"title": "v", "body": "b"}').result()
        assert stopped.ask is not None
        resumed = client.asks.resolve(stopped.ask.ask_id, "allow_once", arguments={"title": "v", "body": "resolved"})
        assert "resolved" in resumed.result().text
