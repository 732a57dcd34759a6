"""The approval queue, the audit (page, CSV, API, rebuild) and their access rules.

Standing users (conftest.py): owner (member of team ops, owns the sessions), teammate
(moderator of ops), outsider (no team), and stranger (moderator of another team, `other`).
"""

from __future__ import annotations

import csv
import io
import json
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from django.test import Client
from django.utils import timezone

from sectr.events import EventType
from sectr.journal import NewEvent
from sessions_app import actions
from sessions_app.journal.moderation import rebuild_audit
from sessions_app.models import ApiToken, AskIndex, AuditEntry, Envelope, Membership, Session, Team
from tests.server.chat.test_consumers import connect, frames_until_ready, next_frame
from tests.server.chat.test_web import HTMX, append, asked, logged_in, started
from tests.server.conftest import SessionFactory, make_user

pytestmark = pytest.mark.django_db


def team_session(make_session: SessionFactory, team: Team, title: str = "Ops session") -> Session:
    session = make_session(title=title)
    Session.objects.filter(pk=session.pk).update(team=team)
    session.refresh_from_db()
    return session


def pending(session: Session, ask_id: str = "ask_1", inv: str = "inv_2", **terms: Any) -> None:
    events = [
        started("note: buy milk", inv=inv),
        *asked(inv=inv, mid=f"msg_{inv}", ask_id=ask_id, call_id=f"c_{ask_id}"),
    ]
    if terms:
        for index, event in enumerate(events):
            if event.type is EventType.APPROVAL_REQUESTED:
                events[index] = NewEvent(event.type, {**event.payload, **terms}, event.invocation_id)
    append(session, events)


def decision_rows(session: Session) -> list[tuple[Any, ...]]:
    return list(
        AuditEntry.objects.filter(session=session)
        .order_by("seq", "kind")
        .values_list("seq", "kind", "ask_id", "actor", "verdict", "note", "tool", "arguments", "rule", "requester")
    )


# ---- the audit projection ----


def test_asks_and_decisions_are_audited_in_the_append(make_session: SessionFactory, ops: Team, teammate: Any) -> None:
    session = team_session(make_session, ops)
    pending(session)
    actions.do_decide(teammate, "ask_1", "deny", note="not today")
    ask, decision = AuditEntry.objects.filter(session=session).order_by("seq")
    assert (ask.kind, ask.actor, ask.tool, ask.arguments["body"]) == ("ask", "owner", "write_note", "buy milk")
    assert (decision.kind, decision.actor, decision.verdict, decision.note) == (
        "decision",
        "teammate",
        "deny",
        "not today",
    )
    assert decision.asked_at == ask.at and decision.seconds_to_decide is not None
    assert decision.seconds_to_decide == pytest.approx((decision.at - ask.at).total_seconds())
    journal_decision = Envelope.objects.get(session=session, type="INVOCATION_STARTED", seq=decision.seq)
    assert journal_decision.payload["reason"]["ask_id"] == "ask_1"


def test_rule_decisions_votes_and_withdrawals_are_audited(make_session: SessionFactory, ops: Team) -> None:
    session = team_session(make_session, ops)
    rule_decided = {"approved": True, "approver": "rule:r7", "verdict": "allow_once"}
    append(
        session,
        [
            started("note: a", inv="inv_a"),
            NewEvent(
                EventType.APPROVAL_REQUESTED,
                {
                    "ask_id": "ask_r",
                    "tool_call_id": "c_r",
                    "name": "write_note",
                    "arguments": {"title": "a"},
                    "rule_id": "r7",
                    "decision": rule_decided,
                },
                "inv_a",
            ),
        ],
    )
    pending(session, "ask_q", inv="inv_q", approvals_required=2, rule_id="r2")
    append(
        session,
        [NewEvent(EventType.APPROVAL_VOTED, {"ask_id": "ask_q", "approver": "teammate", "verdict": "allow_once"})],
    )
    rows = {
        (kind, ask_id): (actor, verdict, rule)
        for _seq, kind, ask_id, actor, verdict, _n, _t, _a, rule, _r in decision_rows(session)
    }
    assert rows[("rule", "ask_r")] == ("rule:r7", "allow_once", "r7")
    assert rows[("ask", "ask_q")] == ("owner", "", "r2")
    assert rows[("vote", "ask_q")] == ("teammate", "allow_once", "r2")


def test_the_audit_rebuilds_from_the_journal_alone(
    make_session: SessionFactory, ops: Team, teammate: Any, owner: Any
) -> None:
    session = team_session(make_session, ops)
    pending(session)
    actions.do_decide(teammate, "ask_1", "allow_once")
    before = decision_rows(session)
    assert len(before) == 2
    AuditEntry.objects.all().delete()
    assert rebuild_audit() == 2
    assert decision_rows(session) == before
    entry = AuditEntry.objects.get(session=session, kind="decision")
    assert entry.seconds_to_decide is not None and entry.seconds_to_decide >= 0


# ---- the queue ----


def test_the_queue_shows_a_moderator_the_team_card_with_its_context(
    make_session: SessionFactory, ops: Team, teammate: Any, outsider_client: Client, stranger: Any
) -> None:
    session = team_session(make_session, ops)
    pending(session)
    html = logged_in(teammate).get("/approvals/").content.decode()
    assert 'id="ask-ask_1"' in html
    assert 'requested by <span class="requester">owner</span>' in html and '<span class="team">ops</span>' in html
    assert "note: buy milk" in html  # the conversation before the ask
    # the arguments, once shown and once in the `Edit arguments` field
    assert html.count("&quot;body&quot;: &quot;buy milk&quot;") == 2
    assert '<label class="note">Note' in html and "Approve once</button>" in html
    assert 'id="approvals-badge" class="badge" data-count="1"' in html
    for outsider in (outsider_client, logged_in(stranger)):
        other = outsider.get("/approvals/").content.decode()
        assert "ask-ask_1" not in other and 'data-count="0"' in other and ">ops<" not in other


def test_the_queue_filters_by_team_tool_and_age(make_session: SessionFactory, ops: Team, teammate: Any) -> None:
    session = team_session(make_session, ops)
    pending(session)
    client = logged_in(teammate)

    def shown(query: str) -> bool:
        return 'id="ask-ask_1"' in client.get("/approvals/?" + query).content.decode()

    assert shown("team=ops") and shown("tool=write_note") and shown("age=")
    assert not shown("team=other") and not shown("tool=delete_note") and not shown("age=1h")
    AskIndex.objects.filter(pk="ask_1").update(requested_at=timezone.now() - timedelta(hours=2))
    assert shown("age=1h") and not shown("age=1d")
    assert shown("age=bogus")  # an unknown age is no filter


def test_the_queue_lists_oldest_first(make_session: SessionFactory, ops: Team, teammate: Any) -> None:
    first = team_session(make_session, ops, "first")
    second = team_session(make_session, ops, "second")
    pending(second, "ask_2")
    pending(first, "ask_1")
    AskIndex.objects.filter(pk="ask_2").update(requested_at=timezone.now() - timedelta(minutes=5))
    html = logged_in(teammate).get("/approvals/").content.decode()
    assert html.index('id="ask-ask_2"') < html.index('id="ask-ask_1"')


def test_a_card_decided_by_someone_else_shows_who(
    make_session: SessionFactory, ops: Team, teammate: Any, owner: Any
) -> None:
    session = team_session(make_session, ops)
    pending(session)
    actions.do_decide(owner, "ask_1", "deny", note="changed my mind")
    response = logged_in(teammate).post("/asks/ask_1/decide", {"verdict": "allow_once", "where": "queue"}, **HTMX)
    html = response.content.decode()
    assert 'data-status="denied"' in html and "Denied by owner: changed my mind" in html
    assert "Approve once</button>" not in html and "decided by owner" in html  # the flash says who


def test_the_note_reaches_the_decision(make_session: SessionFactory, ops: Team, teammate: Any) -> None:
    session = team_session(make_session, ops)
    pending(session)
    logged_in(teammate).post("/asks/ask_1/decide", {"verdict": "deny", "note": " too risky ", "where": "queue"}, **HTMX)
    decision = Envelope.objects.get(
        session=session, type="INVOCATION_STARTED", payload__reason__kind="approval_decision"
    )
    assert decision.payload["reason"]["decision"] == {
        "approved": False,
        "approver": "teammate",
        "verdict": "deny",
        "note": "too risky",
    }


def pending_turn(session: Session, *, approvals_required: int = 1, ask_id: str = "ask_1") -> None:
    """An ask on the first of three calls of one assistant message: write_note (asked),
    delete_note (gated, waiting) and get_time (not gated)."""
    inv, mid = "inv_2", "msg_2"
    calls = [
        ("call_1", "write_note", '{"title": "buy milk", "body": "buy milk"}'),
        ("call_2", "delete_note", '{"title": "<b>old</b>"}'),
        ("call_3", "get_time", "{}"),
    ]
    ask: dict[str, Any] = {
        "ask_id": ask_id,
        "tool_call_id": "call_1",
        "name": "write_note",
        "arguments": {"title": "buy milk", "body": "buy milk"},
    }
    if approvals_required > 1:
        ask["approvals_required"] = approvals_required
    append(
        session,
        [
            started("three calls", inv=inv),
            NewEvent(EventType.MESSAGE_START, {"message_id": mid, "role": "assistant", "model": "demo"}, inv),
            *(
                NewEvent(EventType.TOOL_CALL, {"message_id": mid, "tool_call_id": c, "name": n, "arguments": a}, inv)
                for c, n, a in calls
            ),
            NewEvent(EventType.MESSAGE_END, {"message_id": mid, "finish_reason": "tool_calls"}, inv),
            NewEvent(EventType.APPROVAL_REQUESTED, ask, inv),
            NewEvent(EventType.INVOCATION_SUSPENDED, {"ask_id": ask_id}, inv),
        ],
    )


def test_queue_and_chat_cards_list_the_turns_waiting_gated_calls_with_approve_all(
    make_session: SessionFactory, ops: Team, teammate: Any
) -> None:
    session = team_session(make_session, ops)
    pending_turn(session)
    client = logged_in(teammate)
    for html in (client.get("/approvals/").content.decode(), client.get(f"/sessions/{session.pk}/").content.decode()):
        assert 'name="scope" value="turn">Approve all</button>' in html
        assert "Approve once</button>" in html and "Always allow</button>" in html and "Deny</button>" in html
        waiting = html.split('data-role="turn-calls"', 1)[1].split("</div>", 1)[0]
        assert '<code class="tool-name">delete_note</code>' in waiting
        assert "&lt;b&gt;old&lt;/b&gt;" in waiting and "<b>old" not in waiting  # the model's text, escaped
        assert "get_time" not in waiting  # not gated: it runs anyway


def test_no_approve_all_for_a_lone_call_or_a_quorum(make_session: SessionFactory, ops: Team, teammate: Any) -> None:
    lone = team_session(make_session, ops, title="Lone")
    pending(lone)
    quorum = team_session(make_session, ops, title="Quorum")
    pending_turn(quorum, approvals_required=2, ask_id="ask_2")
    client = logged_in(teammate)
    html = client.get("/approvals/").content.decode()
    assert html.count("Approve once</button>") == 2 and "Approve all" not in html
    assert "Approve all" not in client.get(f"/sessions/{quorum.pk}/").content.decode()


def test_the_approve_all_button_decides_for_the_turn_and_deny_with_a_scope_is_refused(
    make_session: SessionFactory, ops: Team, teammate: Any
) -> None:
    session = team_session(make_session, ops)
    pending_turn(session)
    client = logged_in(teammate)
    before = Envelope.objects.filter(session=session).count()
    refused = client.post("/asks/ask_1/decide", {"verdict": "deny", "scope": "turn", "where": "queue"}, **HTMX)
    assert refused.status_code == 400
    assert "not with deny" in refused.content.decode() and "Approve all</button>" in refused.content.decode()
    assert Envelope.objects.filter(session=session).count() == before  # nothing written
    decided = client.post("/asks/ask_1/decide", {"scope": "turn", "where": "queue"}, **HTMX)
    assert "Approved once by teammate" in decided.content.decode()
    decision = Envelope.objects.get(
        session=session, type="INVOCATION_STARTED", payload__reason__kind="approval_decision"
    )
    assert decision.payload["reason"]["decision"] == {
        "approved": True,
        "approver": "teammate",
        "verdict": "allow_once",
        "scope": "turn",
    }


# ---- the queue's socket ----


@pytest.mark.django_db(transaction=True)
async def test_the_socket_pushes_asks_and_votes_only_to_who_may_decide(
    owner: Any, teammate: Any, outsider: Any, make_session: SessionFactory
) -> None:
    ops = await database_sync_to_async(Team.objects.create)(name="ops")
    await database_sync_to_async(Membership.objects.create)(team=ops, user=teammate, role="moderator")
    session = await database_sync_to_async(team_session)(make_session, ops)
    sockets = {}
    for name, user in (("moderator", teammate), ("outsider", outsider)):
        communicator, connected, _ = await connect(user, "/ws/approvals/")
        assert connected and await frames_until_ready(communicator) == []
        sockets[name] = communicator
    await database_sync_to_async(pending)(session, approvals_required=2)
    html = (await next_frame(sockets["moderator"]))["html"]
    assert 'hx-swap-oob="beforeend:#approval-queue"' in html and "0 of 2 approvals" in html
    vote = NewEvent(EventType.APPROVAL_VOTED, {"ask_id": "ask_1", "approver": "stranger", "verdict": "allow_once"})
    await database_sync_to_async(append)(session, [vote])
    html = (await next_frame(sockets["moderator"]))["html"]
    assert 'id="ask-ask_1"' in html and 'hx-swap-oob="true"' in html
    assert "1 of 2 approvals: stranger" in html and "(Approved once)" not in html
    assert await sockets["outsider"].receive_nothing(timeout=0.3)
    for communicator in sockets.values():
        await communicator.disconnect()


@pytest.mark.django_db(transaction=True)
async def test_the_socket_filters_new_cards_by_tool(teammate: Any, make_session: SessionFactory) -> None:
    ops = await database_sync_to_async(Team.objects.create)(name="ops")
    await database_sync_to_async(Membership.objects.create)(team=ops, user=teammate, role="moderator")
    session = await database_sync_to_async(team_session)(make_session, ops)
    communicator, connected, _ = await connect(teammate, "/ws/approvals/?tool=delete_note")
    assert connected and await frames_until_ready(communicator) == []
    await database_sync_to_async(pending)(session)
    assert await communicator.receive_nothing(timeout=0.3)
    await communicator.disconnect()


# ---- the audit page, CSV and API ----


def csv_rows(response: Any) -> list[dict[str, str]]:
    async def collect() -> bytes:
        return b"".join([chunk async for chunk in response.streaming_content])

    return list(csv.DictReader(io.StringIO(async_to_sync(collect)().decode())))


def test_the_audit_page_shows_decisions_and_timing_to_who_may_audit(
    make_session: SessionFactory, ops: Team, teammate: Any, owner: Any, outsider_client: Client, stranger: Any
) -> None:
    session = team_session(make_session, ops)
    pending(session)
    actions.do_decide(teammate, "ask_1", "deny", note="nope")
    html = logged_in(teammate).get("/approvals/audit/").content.decode()
    assert 'data-role="audit-row" data-kind="decision" data-ask-id="ask_1"' in html and "nope" in html
    assert '<tr data-team="ops">' in html and 'data-stat="median"' in html and "Download CSV" in html
    assert 'data-ask-id="ask_1"' in logged_in(owner).get("/approvals/audit/").content.decode()  # their own session
    for other in (outsider_client, logged_in(stranger)):
        page = other.get("/approvals/audit/").content.decode()
        assert "ask_1" not in page and "Ops session" not in page
        assert csv_rows(other.get("/approvals/audit.csv")) == []
    assert logged_in(teammate).get("/approvals/audit/?verdict=maybe").status_code == 400
    filtered = logged_in(teammate).get("/approvals/audit/?verdict=allow_once").content.decode()
    assert 'data-ask-id="ask_1"' not in filtered


def test_the_csv_equals_the_journal_decisions(
    make_session: SessionFactory, ops: Team, teammate: Any, owner: Any
) -> None:
    session = team_session(make_session, ops)
    for number in range(1, 4):
        pending(session, f"ask_{number}", inv=f"inv_{number}")
        verdict = ("allow_once", "deny", "allow_always")[number - 1]
        actions.do_decide(teammate if number != 2 else owner, f"ask_{number}", verdict, note=f"n{number}")
        Session.objects.filter(pk=session.pk).update(status="completed")  # the resumed run, as if it ended
    response = logged_in(teammate).get("/approvals/audit.csv?kind=decision")
    assert response["Content-Type"].startswith("text/csv") and response.streaming
    exported = [(r["ask_id"], r["actor"], r["verdict"], r["note"], r["seq"]) for r in csv_rows(response)]
    journal = [
        (
            e.payload["reason"]["ask_id"],
            e.payload["reason"]["decision"]["approver"],
            e.payload["reason"]["decision"]["verdict"],
            e.payload["reason"]["decision"]["note"],
            str(e.seq),
        )
        for e in Envelope.objects.filter(session=session, type="INVOCATION_STARTED").order_by("-seq")
        if e.payload["reason"]["kind"] == "approval_decision"
    ]
    assert exported == journal and len(journal) == 3


def bearer(user: Any) -> dict[str, str]:
    _token, raw = ApiToken.issue(user, "test")
    return {"HTTP_AUTHORIZATION": f"Bearer {raw}"}


def test_the_audit_api_pages_filters_and_exports(
    make_session: SessionFactory, ops: Team, teammate: Any, outsider: Any
) -> None:
    session = team_session(make_session, ops)
    for number in range(1, 4):
        pending(session, f"ask_{number}", inv=f"inv_{number}")
        actions.do_decide(teammate, f"ask_{number}", "deny" if number == 2 else "allow_once")
        Session.objects.filter(pk=session.pk).update(status="completed")
    client, auth = Client(), bearer(teammate)
    first = client.get("/api/v1/audit?limit=2", **auth).json()
    assert first["count"] == 3 and first["next_offset"] == 2 and len(first["entries"]) == 2
    assert [e["ask_id"] for e in first["entries"]] == ["ask_3", "ask_2"]  # newest first
    entry = first["entries"][1]
    assert entry["kind"] == "decision" and entry["verdict"] == "deny" and entry["team"] == "ops"
    assert entry["tool"] == "write_note" and entry["arguments"] == {"title": "buy milk", "body": "buy milk"}
    assert entry["seconds_to_decide"] is not None
    second = client.get("/api/v1/audit?limit=2&offset=2", **auth).json()
    assert [e["ask_id"] for e in second["entries"]] == ["ask_1"] and second["next_offset"] is None
    assert client.get("/api/v1/audit?verdict=deny", **auth).json()["count"] == 1
    assert client.get("/api/v1/audit?kind=ask", **auth).json()["count"] == 3
    exported = csv_rows(client.get("/api/v1/audit?format=csv&verdict=allow_once", **auth))
    assert sorted(r["ask_id"] for r in exported) == ["ask_1", "ask_3"]
    bad = client.get("/api/v1/audit?format=xml", **auth)
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_format"
    assert client.get("/api/v1/audit?from=yesterday", **auth).status_code == 400
    assert client.get("/api/v1/audit").status_code == 401
    assert client.get("/api/v1/audit", **bearer(outsider)).json()["count"] == 0
    assert csv_rows(client.get("/api/v1/audit?format=csv", **bearer(outsider))) == []
    document = client.get("/api/v1/openapi.json").json()
    operation = document["paths"]["/api/v1/audit"]["get"]
    assert "text/csv" in operation["responses"]["200"]["content"]
    assert {p["name"] for p in operation["parameters"]} >= {"limit", "offset", "format", "team", "tool", "verdict"}


def test_a_staff_user_audits_every_team(make_session: SessionFactory, ops: Team, teammate: Any) -> None:
    session = team_session(make_session, ops)
    pending(session)
    actions.do_decide(teammate, "ask_1", "allow_once")
    staff = make_user("boss")
    staff.is_staff = True
    staff.save()
    data = Client().get("/api/v1/audit", **bearer(staff)).json()
    assert [e["ask_id"] for e in data["entries"]] == ["ask_1"]
    assert json.dumps(data)  # plain JSON


def test_the_owner_approves_all_from_the_chat_card(make_session: SessionFactory, ops: Team, owner: Any) -> None:
    session = team_session(make_session, ops)
    pending_turn(session)
    response = logged_in(owner).post("/asks/ask_1/decide", {"scope": "turn"}, **HTMX)
    html = response.content.decode()
    assert 'class="approval approval-approved"' in html and "Approved once by owner" in html
    assert "Approve all" not in html  # decided: no buttons, no list
    decision = Envelope.objects.get(
        session=session, type="INVOCATION_STARTED", payload__reason__kind="approval_decision"
    )
    assert decision.payload["reason"]["decision"]["scope"] == "turn"
