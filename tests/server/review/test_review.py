"""Team review (docs/review.md): search and its filters, the read page, ratings, queues,
export/import, share links, usage, and who may see any of it.

Three standing users (conftest): owner, teammate (made a reviewer here), outsider.
Journals are written directly through DatabaseJournal, as a run would write them, so
the search index and the usage rollup are exercised on the journal's real write path.
"""

from __future__ import annotations

import io
import json
import re
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from sectr.errors import NotFound, ValidationFailed
from sectr.events import EventType
from sectr.fold import fold_messages
from sectr.journal import NewEvent
from sessions_app import actions as session_actions
from sessions_app.attribution import current_api_token_key
from sessions_app.journal import DatabaseJournal
from sessions_app.models import (
    ApiToken,
    ForkLink,
    ModelPrice,
    Rating,
    ReviewQueue,
    ReviewQueueItem,
    SearchEntry,
    Session,
    ShareLink,
    UsageDaily,
)
from sessions_app.review import actions, export, search, usage
from tests.server.chat.test_web import append, asked, completed, logged_in, reply, started
from tests.server.conftest import join_team


@pytest.fixture
def reviewer(teammate: Any, owner: Any) -> Any:
    """A reviewer of the owner's team "crew" (the owner's sessions are in it)."""
    return join_team(teammate, "reviewer", owner)


@pytest.fixture
def reviewer_client(reviewer: Any) -> Client:
    return logged_in(reviewer)


def converse(session: Session, prompt: str, answer: str, inv: str = "inv_1", mid: str = "msg_1") -> None:
    append(session, [started(prompt, inv), *reply(answer, inv, mid), completed(inv)], publish=False)


# ---- the search index is kept by the journal ----


def test_the_journal_indexes_user_assistant_and_tool_text_once_per_message(session: Session) -> None:
    append(session, [started("how do penguins swim", "inv_1")], publish=False)
    append(session, [NewEvent(EventType.MESSAGE_START, {"message_id": "m1", "role": "assistant"}, "inv_1")])
    # Streaming deltas alone (the hot path) index nothing ...
    for word in ("Penguins ", "flap ", "their ", "flippers"):
        append(session, [NewEvent(EventType.MESSAGE_DELTA, {"message_id": "m1", "text": word}, "inv_1")], publish=False)
    assert list(SearchEntry.objects.filter(session=session).values_list("kind", flat=True)) == ["user"]
    # ... the MESSAGE_END indexes the whole message, read back from its deltas.
    append(
        session,
        [
            NewEvent(
                EventType.TOOL_CALL,
                {"message_id": "m1", "tool_call_id": "c1", "name": "get_time", "arguments": "{}"},
                "inv_1",
            ),
            NewEvent(
                EventType.MESSAGE_END, {"message_id": "m1", "usage": {"input_tokens": 4, "output_tokens": 4}}, "inv_1"
            ),
        ],
        publish=False,
    )
    entries = {kind: text for kind, text in SearchEntry.objects.filter(session=session).values_list("kind", "text")}
    assert entries == {"user": "how do penguins swim", "assistant": "Penguins flap their flippers", "tool": "get_time"}


def _projections() -> tuple[list[Any], list[Any], list[Any]]:
    entries = sorted(SearchEntry.objects.values_list("session_id", "seq", "kind", "text"))
    usage_rows = sorted(
        UsageDaily.objects.values_list(
            "day", "user_id", "team_key", "api_token_key", "model", "input_tokens", "output_tokens", "messages"
        )
    )
    forks = sorted(ForkLink.objects.values_list("child_id", "source_id", "seq"))
    return entries, usage_rows, forks


def test_sectr_reindex_restores_deleted_projections_equal_to_the_live_ones(
    reviewer: Any, owner: Any, session: Session, make_session: Any
) -> None:
    converse(session, "how do penguins swim", "they flap their flippers")
    append(
        session,
        [
            started("and tools?", "inv_2"),
            NewEvent(EventType.MESSAGE_START, {"message_id": "m2", "role": "assistant", "model": "other"}, "inv_2"),
            NewEvent(EventType.MESSAGE_DELTA, {"message_id": "m2", "text": "calling "}, "inv_2"),
            NewEvent(
                EventType.TOOL_CALL,
                {"message_id": "m2", "tool_call_id": "c1", "name": "get_time", "arguments": "{}"},
                "inv_2",
            ),
            NewEvent(EventType.MESSAGE_DELTA, {"message_id": "m2", "text": "a clock"}, "inv_2"),
            NewEvent(
                EventType.MESSAGE_END, {"message_id": "m2", "usage": {"input_tokens": 7, "output_tokens": 2}}, "inv_2"
            ),
            NewEvent(EventType.STEER_RECEIVED, {"text": "be brief", "author": "owner"}, "inv_2"),
            completed("inv_2"),
        ],
        publish=False,
    )
    token, _ = ApiToken.issue(owner, "script")
    reset = current_api_token_key.set(token.pk)
    try:
        run = session_actions.do_post_message(owner, session.pk, "via the api")
    finally:
        current_api_token_key.reset(reset)
    append(
        session, [*reply("four five six", run.invocation_id, "msg_api"), completed(run.invocation_id)], publish=False
    )
    other = make_session(title="other")
    converse(other, "budget report", "the budget is fine")
    session_actions.do_fork(owner, session.pk)
    live = _projections()
    assert live[0] and live[1] and live[2]
    assert {row[4] for row in live[1]} == {"demo", "other"} and {row[3] for row in live[1]} == {0, token.pk}

    SearchEntry.objects.all().delete()
    UsageDaily.objects.all().delete()
    ForkLink.objects.all().delete()
    out = io.StringIO()
    call_command("sectr_reindex", stdout=out)
    assert _projections() == live
    assert "usage rollup" in out.getvalue()
    # The rebuilt index is searchable (on SQLite its FTS5 table follows by triggers).
    assert [s.pk for s in search.search_sessions(reviewer, search.Filters(q="flippers"))] == [session.pk]

    # One session: its search entries come back, the others' and the rollup are untouched.
    SearchEntry.objects.filter(session=other).delete()
    call_command("sectr_reindex", "--session", other.pk, stdout=io.StringIO())
    assert _projections() == live
    assert [s.pk for s in search.search_sessions(reviewer, search.Filters(q="budget"))] == [other.pk]


def test_sectr_reindex_refuses_an_unknown_session_and_changes_nothing(session: Session) -> None:
    converse(session, "hi", "hello")
    live = _projections()
    with pytest.raises(CommandError, match="no such session: ses_nope"):
        call_command("sectr_reindex", "--session", session.pk, "--session", "ses_nope", stdout=io.StringIO())
    assert _projections() == live


def test_search_finds_message_text_and_tool_names_with_a_highlighted_escaped_snippet(
    reviewer_client: Client, make_session: Any
) -> None:
    penguins = make_session(title="Penguins")
    converse(penguins, "tell me about <b>penguins</b>", "Penguins are flightless birds")
    tools = make_session(title="Tools")
    append(tools, [started("what time is it"), *asked(inv="inv_1", mid="m1")], publish=False)
    other = make_session(title="Other")
    converse(other, "hello", "You said: hello")

    page = reviewer_client.get("/review/", {"q": "penguins"}).content.decode()
    assert "Penguins" in page and "Tools" not in page and "Other" not in page
    assert "<mark>penguins</mark>" in page.lower()
    # The user's markup never becomes markup (PostgreSQL's headline drops tags, SQLite's keeps them as text).
    assert "<b>penguins" not in page.lower()
    if connection.vendor == "sqlite":
        assert "&lt;b&gt;<mark>penguins</mark>&lt;/b&gt;" in page

    page = reviewer_client.get("/review/", {"q": "write_note"}).content.decode()
    assert "Tools" in page and "Penguins" not in page
    # FTS5 / tsquery syntax typed into the box is just words, never an error.
    assert reviewer_client.get("/review/", {"q": 'NEAR(" OR * -'}).status_code == 200


def test_search_filters_by_user_state_model_dates_asks_and_failures(
    reviewer: Any, owner: Any, outsider: Any, make_session: Any
) -> None:
    plain = make_session(title="plain")
    converse(plain, "alpha", "beta")
    asking = make_session(title="asking", model="other-model")
    append(asking, [started("alpha"), *asked(inv="inv_1", mid="m1")], publish=False)
    failing = make_session(title="failing")
    append(
        failing,
        [started("alpha"), NewEvent(EventType.INVOCATION_FAILED, {"error": "boom", "retryable": True}, "inv_1")],
        publish=False,
    )
    theirs = make_session(outsider, title="outsiders")
    converse(theirs, "alpha", "beta")

    def titles(**params: str) -> set[str]:
        found = search.search_sessions(reviewer, search.Filters.from_query({"q": "alpha", **params}))
        return {s.title for s in found}

    assert titles() == {"plain", "asking", "failing"}  # not the outsider's personal session
    assert titles(user="owner") == {"plain", "asking", "failing"}
    assert titles(user="outsider") == set()
    assert titles(team="crew") == {"plain", "asking", "failing"}
    assert titles(state="awaiting") == {"asking"}
    assert titles(model="other-model") == {"asking"}
    assert titles(has_asks="1") == {"asking"}
    assert titles(failed="1") == {"failing"}
    today = timezone.now().date()
    assert titles(**{"from": today.isoformat(), "to": today.isoformat()}) == {"plain", "asking", "failing"}
    assert titles(**{"to": (today - timedelta(days=1)).isoformat()}) == set()
    assert titles(team="nobody") == set()
    bad = search.Filters.from_query({"from": "yesterday"})
    assert bad.date_from is None and bad.errors


def test_an_outsider_finds_none_of_the_owners_sessions(
    outsider_client: Client, outsider: Any, session: Session
) -> None:
    converse(session, "secret plans", "the plans")
    page = outsider_client.get("/review/", {"q": "secret"}).content.decode()
    assert "Test session" not in page and "plans" not in page
    sid = session.pk
    assert outsider_client.get(f"/review/{sid}/").status_code == 403  # no role anywhere: the same for any id
    assert outsider_client.get(f"/review/{sid}/export.json").status_code == 404
    assert outsider_client.post(f"/review/{sid}/rate", {"thumbs": "up"}).status_code == 404
    assert outsider_client.post(f"/review/{sid}/share", {"days": "7"}).status_code == 404
    assert outsider_client.get("/review/export.jsonl").status_code == 403
    assert outsider_client.get("/review/usage/").status_code == 403
    # A reviewer of another team finds nothing of this one.
    other = logged_in(join_team(outsider, "reviewer", team="elsewhere"))
    assert "Test session" not in other.get("/review/", {"q": "secret"}).content.decode()
    assert other.get(f"/review/{sid}/").status_code == 404
    assert "owner" not in other.get("/review/usage/").content.decode().split('<main id="main">')[1]
    assert not ShareLink.objects.exists() and not Rating.objects.exists()


def test_search_pages_results(reviewer_client: Client, make_session: Any) -> None:
    for i in range(30):
        converse(make_session(title=f"s{i:02d}"), "common word", "ok")
    first = reviewer_client.get("/review/", {"q": "common"}).content.decode()
    second = reviewer_client.get("/review/", {"q": "common", "page": "2"}).content.decode()
    assert "page 1" in first and "Older" in first and "page 2" in second and "Older" not in second
    assert first.count("data-session=") == 25 and second.count("data-session=") == 5
    assert "q=common" in first  # the pager keeps the search


def test_review_search_runs_a_fixed_number_of_queries(reviewer_client: Client, make_session: Any) -> None:
    for i in range(10):
        converse(make_session(title=f"s{i}"), "common word", "ok")
    reviewer_client.get("/review/", {"q": "common"})
    with CaptureQueriesContext(connection) as few:
        reviewer_client.get("/review/", {"q": "common"})
    for i in range(10):
        converse(make_session(title=f"t{i}"), "common word", "ok")
    with CaptureQueriesContext(connection) as more:
        reviewer_client.get("/review/", {"q": "common"})
    # django_session, user, is a reviewer?, their teams, the page, its snippets, its
    # reviewed marks, the queues, the Score filter's names; the approvals badge:
    # moderates?, the count; the filter bar's Team and User choices; may they run
    # experiments (Replay with…)?
    assert len(more) == len(few) == 14, [q["sql"][:90] for q in more.captured_queries]


# ---- read ----


def test_the_review_page_shows_tool_calls_decisions_steers_errors_and_forks(
    reviewer_client: Client, session: Session, owner: Any
) -> None:
    append(session, [started("note it"), *asked(inv="inv_1", mid="m1")], publish=False)
    decision = {
        "kind": "approval_decision",
        "ask_id": "ask_1",
        "decision": {"approved": False, "approver": "rule:7", "verdict": "deny", "note": "not today"},
    }
    append(
        session,
        [
            NewEvent(EventType.INVOCATION_STARTED, {"reason": decision}, "inv_2"),
            NewEvent(
                EventType.TOOL_RESULT,
                {"tool_call_id": "call_1", "name": "write_note", "content": "denied", "is_error": True},
                "inv_2",
            ),
            NewEvent(EventType.STEER_RECEIVED, {"text": "be brief", "author": "owner"}, "inv_2"),
            NewEvent(EventType.SESSION_ERROR, {"error": "provider hiccup", "retryable": True}, "inv_2"),
            completed("inv_2"),
        ],
        publish=False,
    )
    fork = session_actions.do_fork(owner, session.pk)
    page = reviewer_client.get(f"/review/{session.pk}/").content.decode()
    for text in (
        "write_note",
        "deny",
        "rule 7",
        "not today",
        "be brief",
        "provider hiccup",
        "Tool error",
        "Token usage",
    ):
        assert text in page, text
    assert f'href="/review/{fork.pk}/"' in page  # the child, as a link
    assert page.count("<time datetime=") >= 8
    assert ForkLink.objects.get(child=fork).source_id == session.pk
    child = reviewer_client.get(f"/review/{fork.pk}/").content.decode()
    assert f'href="/review/{session.pk}/"' in child  # the source, as a link


# ---- judge ----


def test_reviewers_rate_sessions_and_messages_apart_from_end_users(
    reviewer: Any, reviewer_client: Client, owner_client: Client, session: Session
) -> None:
    converse(session, "hi", "hello there")
    response = reviewer_client.post(
        f"/review/{session.pk}/rate",
        {"thumbs": "down", "score": "2", "tags": "rude, long", "comment": "meh", "message_id": "msg_1"},
    )
    assert response.status_code == 302
    reviewer_client.post(f"/review/{session.pk}/rate", {"thumbs": "up", "score": "4"})
    reviewer_client.post(f"/review/{session.pk}/rate", {"thumbs": "up", "score": "5"})  # replaces, not adds
    owner_client.post(f"/sessions/{session.pk}/messages/msg_1/feedback", {"thumbs": "up"})
    ratings = {(r.source, r.seq): r for r in Rating.objects.all()}
    assert len(ratings) == 3
    end_seq = session.envelopes.get(type="MESSAGE_END").seq
    message_rating = ratings[(Rating.REVIEWER, end_seq)]  # pinned to its MESSAGE_END
    assert (message_rating.thumbs, message_rating.score, message_rating.tags) == (-1, 2, ["rude", "long"])
    assert ratings[(Rating.REVIEWER, 0)].score == 5
    assert ratings[(Rating.END_USER, end_seq)].thumbs == 1
    page = reviewer_client.get(f"/review/{session.pk}/").content.decode()
    assert "End users&#x27; own feedback: 👍 1" in page or "own feedback: 👍 1" in page


def test_the_chat_page_shows_the_users_own_earlier_thumbs_pressed_after_a_reload(
    reviewer_client: Client, owner_client: Client, session: Session
) -> None:
    converse(session, "hi", "hello there", inv="inv_1", mid="msg_1")
    converse(session, "again", "second answer", inv="inv_2", mid="msg_2")

    def buttons(page: str, message_id: str) -> list[str]:
        block = page.split(f'id="thumbs-{message_id}"', 1)[1].split("</span>", 1)[0]
        return re.findall(r'aria-label="(\w+) reply" aria-pressed="(\w+)"', block)

    page = owner_client.get(f"/sessions/{session.pk}/").content.decode()
    assert buttons(page, "msg_1") == [("Good", "false"), ("Bad", "false")]
    owner_client.post(f"/sessions/{session.pk}/messages/msg_1/feedback", {"thumbs": "down"})
    owner_client.post(f"/sessions/{session.pk}/messages/msg_2/feedback", {"thumbs": "up"})
    owner_client.post(f"/sessions/{session.pk}/messages/msg_2/feedback", {"thumbs": "down"})
    owner_client.post(f"/sessions/{session.pk}/messages/msg_2/feedback", {"thumbs": "up"})  # the last vote counts
    # A reviewer's rating of the same message is not the end user's vote.
    reviewer_client.post(f"/review/{session.pk}/rate", {"thumbs": "up", "message_id": "msg_1"})
    page = owner_client.get(f"/sessions/{session.pk}/").content.decode()  # the reload
    assert buttons(page, "msg_1") == [("Good", "false"), ("Bad", "true")]
    assert buttons(page, "msg_2") == [("Good", "true"), ("Bad", "false")]


def test_ratings_refuse_bad_input_and_write_nothing(reviewer: Any, session: Session, outsider: Any) -> None:
    stranger = outsider
    converse(session, "hi", "hello")
    for bad in ({"thumbs": "sideways"}, {"thumbs": "up", "score": 9}, {"thumbs": "up", "tags": ["x" * 50]}):
        with pytest.raises(ValidationFailed):
            actions.do_rate(reviewer, session.pk, **bad)
    with pytest.raises(NotFound):
        actions.do_rate(reviewer, session.pk, thumbs="up", message_id="msg_nope")
    with pytest.raises(NotFound):  # a reviewer's thumbs are not end-user feedback
        actions.do_end_user_feedback(stranger, session.pk, "msg_1", "up")
    assert not Rating.objects.exists()


def test_reviewed_state_toggles(reviewer_client: Client, session: Session) -> None:
    reviewer_client.post(f"/review/{session.pk}/reviewed", {"reviewed": "1"})
    assert "Reviewed by teammate" in reviewer_client.get(f"/review/{session.pk}/").content.decode()
    assert "reviewed</td>" in reviewer_client.get("/review/").content.decode()
    reviewer_client.post(f"/review/{session.pk}/reviewed", {"reviewed": "0"})
    assert "Unreviewed" in reviewer_client.get(f"/review/{session.pk}/").content.decode()


def test_queues_take_a_search_refuse_duplicates_and_walk_with_progress(
    reviewer: Any, reviewer_client: Client, make_session: Any
) -> None:
    sessions = [make_session(title=f"q{i}") for i in range(3)]
    for s in sessions:
        converse(s, "queue me", "ok")
    reviewer_client.post("/review/queues/", {"name": "Weekly", "reviewers": "teammate"})
    queue = ReviewQueue.objects.get(name="Weekly")
    queue_id = queue.pk
    reviewer_client.post("/review/queues/add", {"queue": queue_id, "q": "queue"})
    assert ReviewQueueItem.objects.filter(queue=queue).count() == 3
    added, duplicates, assigned = actions.do_add_to_queue(reviewer, queue_id, [sessions[0]])
    assert (added, duplicates, assigned) == (0, 1, {})
    assert ReviewQueueItem.objects.filter(queue=queue).count() == 3
    assert set(ReviewQueueItem.objects.values_list("assignee_id", flat=True)) == {reviewer.pk}
    assert reviewer_client.post("/review/queues/", {"name": "Weekly"}).status_code == 200  # refused, shown
    assert ReviewQueue.objects.count() == 1

    items = list(ReviewQueueItem.objects.filter(queue=queue).order_by("position"))
    first = reviewer_client.get(f"/review/{items[0].session_id}/?queue={queue_id}").content.decode()
    assert "item 1 of 3" in first and "0 of 3 done" in first and "Next" in first and "Previous</a>" not in first
    response = reviewer_client.post(f"/review/queue-items/{items[0].pk}/done", {"then": str(items[1].pk)})
    assert response["Location"] == f"/review/{items[1].session_id}/?queue={queue_id}"
    second = reviewer_client.get(response["Location"]).content.decode()
    assert "item 2 of 3" in second and "1 of 3 done" in second and "Previous" in second


def test_an_outsider_cannot_see_or_fill_a_queue(reviewer: Any, outsider: Any, session: Session) -> None:
    queue = actions.do_create_queue(reviewer, "Mine")
    with pytest.raises(NotFound):
        actions.get_queue_for_user(outsider, queue.pk)
    assert logged_in(outsider).get(f"/review/queues/{queue.pk}/").status_code in (403, 404)


# ---- export and import ----


def test_export_json_is_the_journal_exactly_and_import_folds_equal(
    reviewer_client: Client, session: Session, owner: Any, tmp_path: Any
) -> None:
    converse(session, "calculate 2+2", "4")
    append(session, [started("note it", "inv_2"), *asked(inv="inv_2", mid="m2")], publish=False)
    response = reviewer_client.get(f"/review/{session.pk}/export.json")
    data = json.loads(response.content)
    rows = list(session.envelopes.order_by("seq"))
    assert [(r["seq"], r["type"], r["payload"], r["invocation_id"]) for r in data["envelopes"]] == [
        (e.seq, e.type, e.payload, e.invocation_id) for e in rows
    ]
    path = tmp_path / "export.json"
    path.write_bytes(response.content)
    out = io.StringIO()
    call_command("sectr_import", str(path), "--owner", "owner", stdout=out)
    new_id = out.getvalue().strip().splitlines()[-1]
    imported = Session.objects.get(pk=new_id)
    assert imported.pk != session.pk and imported.owner == owner
    journal = DatabaseJournal()
    assert fold_messages(journal.load_sync(imported.pk)) == fold_messages(journal.load_sync(session.pk))
    session.refresh_from_db()
    assert imported.status == session.status == "awaiting"
    # Searchable like any session.
    assert SearchEntry.objects.filter(session=imported, kind="assistant").exists()


def test_import_refuses_what_is_not_an_export(tmp_path: Any, owner: Any) -> None:
    with pytest.raises(ValidationFailed):
        export.import_session({"format": "other"}, owner)
    with pytest.raises(ValidationFailed):
        export.import_session({"format": "sectr.journal", "version": 1, "envelopes": [{"seq": 2}]}, owner)
    assert not Session.objects.exists()


def test_export_markdown_and_the_api_route(reviewer: Any, reviewer_client: Client, session: Session) -> None:
    converse(session, "hello *there*", "You said: hello")
    md = reviewer_client.get(f"/review/{session.pk}/export.markdown").content.decode()
    assert md.startswith("# Test session") and "## User" in md and "You said: hello" in md
    token, raw = ApiToken.issue(reviewer, "t")
    api = Client(HTTP_AUTHORIZATION=f"Bearer {raw}")
    as_json = api.get(f"/api/v1/sessions/{session.pk}/export")
    assert as_json.status_code == 200 and json.loads(as_json.content)["format"] == "sectr.journal"
    assert api.get(f"/api/v1/sessions/{session.pk}/export", {"format": "markdown"}).content.decode() == md
    assert api.get(f"/api/v1/sessions/{session.pk}/export", {"format": "pdf"}).status_code == 400


def test_bulk_jsonl_export_streams_every_search_result(reviewer_client: Client, make_session: Any) -> None:
    found = [make_session(title=f"b{i}") for i in range(3)]
    for s in found:
        converse(s, "bulk item", "ok")
    converse(make_session(title="unrelated"), "other", "ok")
    response = reviewer_client.get("/review/export.jsonl", {"q": "bulk"})
    assert response.streaming
    lines = [json.loads(line) for line in b"".join(response.streaming_content).decode().splitlines()]
    assert {line["session"]["id"] for line in lines} == {s.pk for s in found}
    for line in lines:
        rows = Session.objects.get(pk=line["session"]["id"]).envelopes.order_by("seq")
        assert [e["payload"] for e in line["envelopes"]] == [r.payload for r in rows]


# ---- share links ----


def test_a_share_link_shows_the_transcript_up_to_its_seq_and_nothing_else(
    reviewer: Any, reviewer_client: Client, session: Session, client: Client
) -> None:
    converse(session, "first question", "first answer")
    actions.do_add_note(reviewer, session.pk, "private reviewer note")
    reviewer_client.post(f"/review/{session.pk}/share", {"days": "7"})
    share = ShareLink.objects.get()
    assert share.seq == Session.objects.get(pk=session.pk).last_seq
    assert share.expires_at - timezone.now() > timedelta(days=6, hours=23)
    converse(session, "later question", "later answer", inv="inv_9", mid="msg_9")
    page = client.get(f"/share/{share.token}/")
    text = page.content.decode()
    assert page.status_code == 200
    assert "first answer" in text and "later answer" not in text and "private reviewer note" not in text
    assert "Rate this" not in text and "/review/" not in text.split('<main id="main">')[1]
    listing = reviewer_client.get("/settings/shares/").content.decode()
    assert share.token in listing and "Revoke" in listing
    reviewer_client.post(f"/settings/shares/{share.pk}/revoke")
    assert client.get(f"/share/{share.token}/").status_code == 404


def test_expired_login_required_and_unknown_links_are_404(reviewer: Any, session: Session, client: Client) -> None:
    expired = actions.do_create_share(reviewer, session.pk, days=1)
    ShareLink.objects.filter(pk=expired.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert client.get(f"/share/{expired.token}/").status_code == 404
    private = actions.do_create_share(reviewer, session.pk, require_login=True)
    assert client.get(f"/share/{private.token}/").status_code == 404
    assert logged_in(reviewer).get(f"/share/{private.token}/").status_code == 200
    assert client.get("/share/" + "x" * 32 + "/").status_code == 404
    with pytest.raises(ValidationFailed):
        actions.do_create_share(reviewer, session.pk, days=0)


def test_an_outsider_cannot_revoke_a_share(reviewer: Any, outsider: Any, session: Session) -> None:
    share = actions.do_create_share(reviewer, session.pk)
    assert logged_in(outsider).post(f"/settings/shares/{share.pk}/revoke").status_code == 404
    assert ShareLink.objects.get().revoked_at is None


# ---- usage ----


def test_usage_rolls_up_per_day_user_token_and_model_with_costs(
    reviewer: Any, reviewer_client: Client, owner: Any, session: Session
) -> None:
    converse(session, "one", "two three")  # web UI: 3 in, 2 out on "demo"
    token, _ = ApiToken.issue(owner, "script")
    reset = current_api_token_key.set(token.pk)
    try:
        run = session_actions.do_post_message(owner, session.pk, "via the api")
    finally:
        current_api_token_key.reset(reset)
    inv = run.invocation_id
    append(session, [*reply("four five six", inv, "msg_api"), completed(inv)], publish=False)
    rows = {(r.api_token_key, r.model): (r.input_tokens, r.output_tokens, r.messages) for r in UsageDaily.objects.all()}
    assert rows == {(0, "demo"): (3, 2, 1), (token.pk, "demo"): (3, 3, 1)}
    ModelPrice.objects.create(model="demo", input_per_million=Decimal("1000000"), output_per_million=Decimal("2000000"))
    page = reviewer_client.get("/review/usage/").content.decode()
    assert "script (" in page and "web UI" in page and "owner" in page
    assert "Total: 6 input + 5 output tokens, cost 16.0000 USD" in page  # 6*1 + 5*2
    assert "<svg" in page and "<rect" in page


def test_usage_page_queries_do_not_grow_with_sessions(reviewer_client: Client, make_session: Any) -> None:
    converse(make_session(), "a", "b c")
    with CaptureQueriesContext(connection) as few:
        reviewer_client.get("/review/usage/")
    for _ in range(5):
        converse(make_session(), "a", "b c")
    with CaptureQueriesContext(connection) as more:
        reviewer_client.get("/review/usage/")
    # The session, the user, the role check, the teams, the prices, the day/model sums,
    # the asks, the runs, the users, tokens, models and agents; the menu's three; the
    # score summary: the teams' scores, the ratings.
    assert len(more) == len(few) <= 19


def test_an_outsider_sees_no_usage_of_others(outsider: Any, session: Session) -> None:
    converse(session, "a", "b c")
    report = usage.build_report(outsider, {})
    assert report.total is not None and report.total.input_tokens == 0 and report.by_user == []
