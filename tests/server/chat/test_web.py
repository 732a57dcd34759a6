"""The web pages and their form posts (Django's test client; no worker runs here).

Transcripts are journaled directly (the `journal_*` helpers below write the envelopes a
run would), so each page is checked against a known journal. The consumer tests import
these helpers too.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.test import Client

from sectr.events import EventType
from sectr.journal import NewEvent
from sessions_app.journal import DatabaseJournal
from sessions_app.models import Envelope, Run, Session
from tests.server.conftest import join_team

HTMX = {"HTTP_HX_REQUEST": "true"}

# ---- journals a run would write ----


def started(text: str | list[dict[str, Any]], inv: str = "inv_1", author: str | None = "owner") -> NewEvent:
    reason: dict[str, Any] = {"kind": "user_message", "input": {"content": text}}
    if author:
        reason["author"] = author
    return NewEvent(EventType.INVOCATION_STARTED, {"reason": reason}, inv)


def reply(
    text: str, inv: str = "inv_1", mid: str = "msg_1", *, reasoning: str = "", end: bool = True
) -> list[NewEvent]:
    events = [NewEvent(EventType.MESSAGE_START, {"message_id": mid, "role": "assistant", "model": "demo"}, inv)]
    if reasoning:
        events.append(NewEvent(EventType.MESSAGE_DELTA, {"message_id": mid, "reasoning": reasoning}, inv))
    for word in re.findall(r"\S+\s*", text):
        events.append(NewEvent(EventType.MESSAGE_DELTA, {"message_id": mid, "text": word}, inv))
    if end:
        usage = {"input_tokens": 3, "output_tokens": len(text.split())}
        events.append(NewEvent(EventType.MESSAGE_END, {"message_id": mid, "usage": usage, "model": "demo"}, inv))
    return events


def completed(inv: str = "inv_1") -> NewEvent:
    return NewEvent(EventType.INVOCATION_COMPLETED, {"stop_reason": "end_turn", "usage": {}}, inv)


def asked(inv: str = "inv_2", mid: str = "msg_2", ask_id: str = "ask_1", call_id: str = "call_1") -> list[NewEvent]:
    arguments = {"title": "buy milk", "body": "buy milk"}
    return [
        NewEvent(EventType.MESSAGE_START, {"message_id": mid, "role": "assistant", "model": "demo"}, inv),
        NewEvent(
            EventType.MESSAGE_DELTA, {"message_id": mid, "reasoning": "The user asked me to call write_note."}, inv
        ),
        NewEvent(
            EventType.TOOL_CALL,
            {"message_id": mid, "tool_call_id": call_id, "name": "write_note", "arguments": '{"title": "buy milk"}'},
            inv,
        ),
        NewEvent(EventType.MESSAGE_END, {"message_id": mid, "usage": {"input_tokens": 5, "output_tokens": 9}}, inv),
        NewEvent(
            EventType.APPROVAL_REQUESTED,
            {"ask_id": ask_id, "tool_call_id": call_id, "name": "write_note", "arguments": arguments},
            inv,
        ),
        NewEvent(EventType.INVOCATION_SUSPENDED, {"ask_id": ask_id}, inv),
    ]


def append(session: Session, events: list[NewEvent], *, publish: bool = True) -> list[Any]:
    return DatabaseJournal(publish=publish).append_sync(session.pk, events)


def logged_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def chat_url(session: Session) -> str:
    return f"/sessions/{session.pk}/"


# ---- the sessions list ----


def test_home_lists_only_my_sessions_and_offers_new_session(
    owner_client: Client, make_session: Any, outsider: Any
) -> None:
    make_session(title="Mine")
    make_session(outsider, title="Not mine")
    response = owner_client.get("/")
    assert response.status_code == 200
    html = response.content.decode()
    assert "Mine" in html and "Not mine" not in html
    assert re.search(r"<button[^>]*>New session</button>", html)


def test_new_session_creates_and_opens_it(owner_client: Client, owner: Any) -> None:
    response = owner_client.post("/sessions/new", {"mode": "plan", "model": "demo", "title": "Planning"})
    session = Session.objects.get(owner=owner)
    assert response.status_code == 302 and response["Location"] == chat_url(session)
    assert (session.mode, session.title, session.status) == ("plan", "Planning", "idle")


def test_new_session_refuses_a_bad_mode(owner_client: Client, owner: Any) -> None:
    response = owner_client.post("/sessions/new", {"mode": "yolo"})
    assert response.status_code == 302 and response["Location"] == "/"
    assert not Session.objects.filter(owner=owner).exists()


# ---- the chat page ----


def test_chat_page_has_the_names_people_and_tests_rely_on(owner_client: Client, session: Session) -> None:
    html = owner_client.get(chat_url(session)).content.decode()
    assert '<label for="id_message">Message</label>' in html
    for name in ("Send", "Fork", "Clear", "Compact", "Rename"):
        assert re.search(rf"<button[^>]*>{name}</button>", html), name
    assert '<label for="id_mode">Mode</label>' in html and '<label for="id_model">Model</label>' in html
    assert re.search(r'data-role="state"[^>]*>idle</span>', html)
    assert 'data-role="usage"' in html
    assert f'data-last-seq="{session.last_seq}"' in html
    assert ">Stop</button>" not in html and ">Steer</button>" not in html  # no run is active


def test_chat_page_renders_the_transcript_from_the_journal(owner_client: Client, session: Session) -> None:
    append(session, [started("hello **there**"), *reply("Hi, *you*.", reasoning="thinking hard"), completed()])
    append(session, [started("note: buy milk", inv="inv_2"), *asked()])
    append(
        session,
        [NewEvent(EventType.STEER_RECEIVED, {"text": "shorter please", "author": "owner"}, "inv_2")],
    )
    html = owner_client.get(chat_url(session)).content.decode()
    assert html.count('data-role="user"') == 2
    assert html.count('data-role="assistant"') == 2
    assert "hello <strong>there</strong>" in html  # a user's text is the same safe Markdown
    assert "hello **there**</textarea>" in html  # and as written, in its Edit form
    assert "Hi, <em>you</em>." in html  # a finished reply is Markdown
    assert "thinking hard" in html and "Reasoning" in html
    assert 'data-role="tool-call"' in html and "write_note" in html
    assert re.search(r'data-role="approval" data-status="pending"', html)
    for name in ("Approve once", "Always allow", "Deny"):
        assert re.search(rf"<button[^>]*>{name}</button>", html)
    assert 'data-role="steer"' in html and "shorter please" in html
    assert re.search(r'data-role="state"[^>]*>awaiting</span>', html)
    assert re.search(r"<strong>\d+</strong> tokens", html)


def test_chat_page_shows_a_streaming_message_as_far_as_it_got(owner_client: Client, session: Session) -> None:
    append(session, [started("!slow 5"), *reply("tick 1 tick 2 ", end=False)])
    html = owner_client.get(chat_url(session)).content.decode()
    assert re.search(r'class="msg-text plain">tick 1 tick 2 </div>', html)
    assert ">Stop</button>" in html and ">Steer</button>" in html


def test_chat_page_escapes_user_and_model_markup(owner_client: Client, session: Session) -> None:
    evil_user = '<img src=x onerror="alert(1)"><script>alert(2)</script>'
    evil_reply = (
        "You said: [click](javascript:alert(1)) <img src=x onerror=alert(3)> <a href='javascript:alert(4)'>x</a>"
    )
    append(session, [started(evil_user), *reply(evil_reply), completed()])
    html = owner_client.get(chat_url(session)).content.decode()
    assert_inert(html)
    assert "&lt;img src=x" in html and "&lt;script&gt;alert(2)" in html


def assert_inert(html: str) -> None:
    """No element with an event handler, no script, no javascript: URL in any attribute."""
    assert not re.search(r"<[a-z][^>]*\son\w+\s*=", html, re.IGNORECASE)
    assert not re.search(r"<script(?![^>]*\bsrc=\"/static/)", html, re.IGNORECASE)
    assert not re.search(r"""<[^>]*=\s*["']?\s*javascript:""", html, re.IGNORECASE)
    assert "<img src=x" not in html


def test_chat_page_shows_plan_mode_refusals(owner_client: Client, make_session: Any) -> None:
    session = make_session(mode="plan")
    call = {"message_id": "msg_1", "tool_call_id": "call_9", "name": "write_note", "arguments": "{}"}
    refusal = "refused: write_note changes things and this session is in plan mode (read-only tools only)"
    append(
        session,
        [
            started("note: x"),
            NewEvent(EventType.MESSAGE_START, {"message_id": "msg_1", "role": "assistant"}, "inv_1"),
            NewEvent(EventType.TOOL_CALL, call, "inv_1"),
            NewEvent(EventType.MESSAGE_END, {"message_id": "msg_1"}, "inv_1"),
            NewEvent(
                EventType.TOOL_RESULT,
                {"tool_call_id": "call_9", "name": "write_note", "content": refusal, "is_error": True},
                "inv_1",
            ),
        ],
    )
    html = owner_client.get(chat_url(session)).content.decode()
    assert "refused (plan mode)" in html
    assert "Plan mode is on" in html and "so it was refused" in html


def test_chat_page_is_404_for_an_outsider_and_403_free_for_a_reviewer(
    outsider_client: Client, teammate: Any, session: Session
) -> None:
    assert outsider_client.get(chat_url(session)).status_code == 404
    reviewer = logged_in(join_team(teammate, "reviewer", session))
    response = reviewer.get(chat_url(session))
    assert response.status_code == 200
    html = response.content.decode()
    assert 'id="composer"' not in html and ">Rename</button>" not in html


def test_chat_page_redirects_anonymous_to_login(client: Client, session: Session) -> None:
    response = client.get(chat_url(session))
    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")


def test_chat_page_404s_for_a_session_that_does_not_exist(owner_client: Client) -> None:
    assert owner_client.get("/sessions/ses_nope/").status_code == 404


# ---- posting and run controls ----


def test_send_journals_the_message_and_queues_a_run(owner_client: Client, session: Session) -> None:
    response = owner_client.post(f"/sessions/{session.pk}/messages", {"content": "hello"}, **HTMX)
    assert response.status_code == 204
    assert "sectr:sent" in response["HX-Trigger"]
    run = Run.objects.get(session=session)
    assert run.status == Run.QUEUED and run.reason["input"]["content"] == "hello"
    assert Envelope.objects.filter(session=session, type="INVOCATION_STARTED").count() == 1


def test_send_without_javascript_redirects_back(owner_client: Client, session: Session) -> None:
    response = owner_client.post(f"/sessions/{session.pk}/messages", {"content": "hello"})
    assert response.status_code == 302 and response["Location"] == chat_url(session)


def test_send_while_a_run_is_active_queues_the_message(owner_client: Client, session: Session) -> None:
    owner_client.post(f"/sessions/{session.pk}/messages", {"content": "first"}, **HTMX)
    response = owner_client.post(f"/sessions/{session.pk}/messages", {"content": "second"}, **HTMX)
    assert response.status_code == 200 and "Queued" in response.content.decode()
    assert response["HX-Retarget"] == "#flash"
    assert Run.objects.filter(session=session, status=Run.PENDING).count() == 1


def test_send_refuses_an_empty_message_with_a_flash(owner_client: Client, session: Session) -> None:
    response = owner_client.post(f"/sessions/{session.pk}/messages", {"content": "  "}, **HTMX)
    assert response.status_code == 400
    assert response["HX-Retarget"] == "#flash" and "empty" in response.content.decode()
    assert not Run.objects.filter(session=session).exists()


def test_send_is_404_for_an_outsider_and_403_for_a_reviewer(
    outsider_client: Client, teammate: Any, session: Session
) -> None:
    assert outsider_client.post(f"/sessions/{session.pk}/messages", {"content": "hi"}).status_code == 404
    reviewer = logged_in(join_team(teammate, "reviewer", session))
    assert reviewer.post(f"/sessions/{session.pk}/messages", {"content": "hi"}).status_code == 403
    assert Session.objects.get(pk=session.pk).last_seq == session.last_seq


def test_send_refuses_get(owner_client: Client, session: Session) -> None:
    assert owner_client.get(f"/sessions/{session.pk}/messages").status_code == 405


def test_stop_cancels_the_active_run(owner_client: Client, session: Session) -> None:
    owner_client.post(f"/sessions/{session.pk}/messages", {"content": "!slow 50"}, **HTMX)
    response = owner_client.post(f"/sessions/{session.pk}/stop", **HTMX)
    assert response.status_code == 204
    session.refresh_from_db()
    assert session.status == "cancelled"
    assert Run.objects.get(session=session).status == Run.CANCELLED


def test_stop_while_awaiting_withdraws_the_ask(owner_client: Client, session: Session) -> None:
    append(session, [started("note: buy milk", inv="inv_2"), *asked()])
    Run.objects.create(session=session, invocation_id="inv_2", invocation_ids=["inv_2"], status=Run.SUSPENDED)
    html = owner_client.get(chat_url(session)).content.decode()
    assert ">Stop</button>" in html and ">Steer</button>" not in html
    assert owner_client.post(f"/sessions/{session.pk}/stop", **HTMX).status_code == 204
    html = owner_client.get(chat_url(session)).content.decode()
    assert 'data-status="withdrawn"' in html and "Approve once</button>" not in html
    assert re.search(r'data-role="state"[^>]*>cancelled</span>', html)


def test_stop_with_no_active_run_says_so(owner_client: Client, session: Session) -> None:
    response = owner_client.post(f"/sessions/{session.pk}/stop", **HTMX)
    assert response.status_code == 409 and "no run is active" in response.content.decode()


def test_steer_parks_the_text_on_the_active_run(owner_client: Client, session: Session) -> None:
    owner_client.post(f"/sessions/{session.pk}/messages", {"content": "!slow 50"}, **HTMX)
    response = owner_client.post(f"/sessions/{session.pk}/steer", {"content": "say hi"}, **HTMX)
    assert response.status_code == 200 and "Steer sent" in response.content.decode()
    assert "sectr:sent" in response["HX-Trigger"]
    assert Run.objects.get(session=session).pending_steer == "say hi"


def test_steer_after_the_run_ended_is_refused(owner_client: Client, session: Session) -> None:
    append(session, [started("hi"), *reply("You said: hi"), completed()])
    response = owner_client.post(f"/sessions/{session.pk}/steer", {"content": "late"}, **HTMX)
    assert response.status_code == 409


def test_retry_restarts_a_failed_step(owner_client: Client, session: Session) -> None:
    append(
        session,
        [started("hi"), NewEvent(EventType.INVOCATION_FAILED, {"error": "rate limited", "retryable": True}, "inv_1")],
    )
    html = owner_client.get(chat_url(session)).content.decode()
    assert ">Retry</button>" in html and "rate limited" in html
    response = owner_client.post(f"/sessions/{session.pk}/retry", **HTMX)
    assert response.status_code == 204
    assert Run.objects.get(session=session).reason["kind"] == "retry"


def test_retry_of_a_healthy_session_is_refused(owner_client: Client, session: Session) -> None:
    response = owner_client.post(f"/sessions/{session.pk}/retry", **HTMX)
    assert response.status_code == 409


# ---- approvals ----


def test_decide_approves_once_and_shows_the_decided_card(owner_client: Client, session: Session) -> None:
    append(session, [started("note: buy milk", inv="inv_2"), *asked()])
    response = owner_client.post("/asks/ask_1/decide", {"verdict": "allow_once"}, **HTMX)
    assert response.status_code == 200
    html = response.content.decode()
    assert 'data-status="approved"' in html and "Approved once by owner" in html
    assert "Approve once</button>" not in html
    assert Run.objects.get(session=session).reason["decision"]["verdict"] == "allow_once"


def test_the_second_decision_loses(owner_client: Client, session: Session) -> None:
    append(session, [started("note: buy milk", inv="inv_2"), *asked()])
    owner_client.post("/asks/ask_1/decide", {"verdict": "deny"}, **HTMX)
    response = owner_client.post("/asks/ask_1/decide", {"verdict": "allow_once"}, **HTMX)
    html = response.content.decode()
    assert 'data-status="denied"' in html and "not pending" in html
    assert Run.objects.filter(session=session).count() == 1


def test_decide_is_404_for_an_outsider(outsider_client: Client, session: Session) -> None:
    append(session, [started("note: buy milk", inv="inv_2"), *asked()])
    assert outsider_client.post("/asks/ask_1/decide", {"verdict": "allow_once"}, **HTMX).status_code == 404
    assert not Run.objects.filter(session=session).exists()


def test_a_reviewer_sees_the_card_but_cannot_decide(teammate: Any, session: Session) -> None:
    append(session, [started("note: buy milk", inv="inv_2"), *asked()])
    reviewer = logged_in(join_team(teammate, "reviewer", session))
    html = reviewer.get(chat_url(session)).content.decode()
    assert 'data-role="approval"' in html and "Approve once</button>" not in html
    assert reviewer.post("/asks/ask_1/decide", {"verdict": "allow_once"}, **HTMX).status_code == 403


def test_a_moderator_decides_someone_elses_ask(teammate: Any, session: Session) -> None:
    append(session, [started("note: buy milk", inv="inv_2"), *asked()])
    moderator = logged_in(join_team(teammate, "moderator", session))
    response = moderator.post("/asks/ask_1/decide", {"verdict": "allow_always", "where": "queue"}, **HTMX)
    assert "Always allowed by teammate" in response.content.decode()


def test_approvals_page_lists_pending_asks_by_who_may_decide(
    owner_client: Client, outsider_client: Client, teammate: Any, session: Session
) -> None:
    append(session, [started("note: buy milk", inv="inv_2"), *asked()])
    assert "ask-ask_1" in owner_client.get("/approvals/").content.decode()
    assert "ask-ask_1" not in outsider_client.get("/approvals/").content.decode()
    moderator = logged_in(join_team(teammate, "moderator", session))
    html = moderator.get("/approvals/").content.decode()
    assert "ask-ask_1" in html and "Approve once</button>" in html
    assert 'requested by <span class="requester">owner</span>' in html
    partial = moderator.get("/approvals/?partial=queue", **HTMX).content.decode()
    assert "ask-ask_1" in partial and "<html" not in partial


# ---- session operations ----


def test_fork_from_here_opens_a_new_session_up_to_that_reply(
    owner_client: Client, session: Session, owner: Any
) -> None:
    append(session, [started("one"), *reply("You said: one"), completed()])
    end_of_first = Session.objects.get(pk=session.pk).last_seq
    append(
        session, [started("two", inv="inv_2"), *reply("You said: two", inv="inv_2", mid="msg_2"), completed("inv_2")]
    )
    html = owner_client.get(chat_url(session)).content.decode()
    assert f'name="at_seq" value="{end_of_first - 1}"' in html  # the first reply's MESSAGE_END
    response = owner_client.post(f"/sessions/{session.pk}/fork", {"at_seq": end_of_first - 1}, **HTMX)
    fork = Session.objects.exclude(pk=session.pk).get(owner=owner)
    assert response["HX-Redirect"] == chat_url(fork)
    forked_html = owner_client.get(chat_url(fork)).content.decode()
    assert "Forked conversation" in forked_html and "You said: one" in forked_html and "two" not in forked_html


def test_fork_refuses_a_bad_seq(owner_client: Client, session: Session) -> None:
    response = owner_client.post(f"/sessions/{session.pk}/fork", {"at_seq": "x"}, **HTMX)
    assert response.status_code == 400


def test_clear_opens_a_new_empty_session(owner_client: Client, make_session: Any, owner: Any) -> None:
    session = make_session(mode="plan")
    response = owner_client.post(f"/sessions/{session.pk}/clear")
    cleared = Session.objects.exclude(pk=session.pk).get(owner=owner)
    assert response.status_code == 302 and response["Location"] == chat_url(cleared)
    assert cleared.mode == "plan"


def test_rename_and_mode_and_model(owner_client: Client, session: Session) -> None:
    # Each answers in the page's #flash, where the menu was used (the socket brings the change).
    for action, data, said in (
        ("rename", {"title": "Groceries"}, "Renamed to “Groceries”."),
        ("mode", {"mode": "plan"}, "Mode: Plan"),
        ("model", {"model": "demo"}, "Model: demo."),
    ):
        response = owner_client.post(f"/sessions/{session.pk}/{action}", data, **HTMX)
        assert response.status_code == 200 and response["HX-Retarget"] == "#flash", action
        assert said in response.content.decode(), action
    session.refresh_from_db()
    assert (session.title, session.mode, session.model) == ("Groceries", "plan", "demo")


def test_rename_refuses_an_empty_title(owner_client: Client, session: Session) -> None:
    response = owner_client.post(f"/sessions/{session.pk}/rename", {"title": " "}, **HTMX)
    assert response.status_code == 400 and "title" in response.content.decode()


def test_mode_change_mid_run_is_refused(owner_client: Client, session: Session) -> None:
    owner_client.post(f"/sessions/{session.pk}/messages", {"content": "!slow 5"}, **HTMX)
    response = owner_client.post(f"/sessions/{session.pk}/mode", {"mode": "plan"}, **HTMX)
    assert response.status_code == 409


def test_outsider_cannot_operate_on_the_session(outsider_client: Client, session: Session) -> None:
    for action in ("stop", "steer", "retry", "fork", "clear", "compact", "rename", "mode", "model", "delete"):
        assert outsider_client.post(f"/sessions/{session.pk}/{action}", {"title": "x"}).status_code == 404, action
    assert Session.objects.count() == 1


def test_delete_removes_the_session(owner_client: Client, session: Session) -> None:
    response = owner_client.post(f"/sessions/{session.pk}/delete", **HTMX)
    assert response["HX-Redirect"] == "/"
    assert not Session.objects.filter(pk=session.pk).exists()


def test_compact_answers_with_a_flash(owner_client: Client, session: Session) -> None:
    response = owner_client.post(f"/sessions/{session.pk}/compact", **HTMX)
    assert response.status_code == 200 and response["HX-Retarget"] == "#flash"


# ---- team review ----


def test_review_is_for_reviewers_only(owner_client: Client, teammate: Any, session: Session) -> None:
    assert owner_client.get("/review/").status_code == 403
    assert owner_client.get(f"/review/{session.pk}/").status_code == 403
    reviewer = logged_in(join_team(teammate, "reviewer", session))
    html = reviewer.get("/review/").content.decode()
    assert "Test session" in html and "owner" in html


def test_review_session_shows_snapshot_usage_and_a_read_only_transcript(teammate: Any, session: Session) -> None:
    append(session, [started("note: buy milk", inv="inv_2"), *asked()])
    reviewer = logged_in(join_team(teammate, "reviewer", session))
    html = reviewer.get(f"/review/{session.pk}/").content.decode()
    assert "Snapshot" in html and "Context window" in html and "Token usage" in html
    assert 'data-role="approval"' in html and "Approve once</button>" not in html
    assert "Fork from here" not in html


# ---- attachments ----

# A 1x1 transparent PNG.
PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d49484452000000010000000108060000001f15c489"
    "0000000d49444154789c6360000002000001e221bc330000000049454e44ae426082"
)


@pytest.fixture(autouse=True)
def _media_in_tmp(settings: Any, tmp_path: Any) -> None:
    settings.MEDIA_ROOT = str(tmp_path / "media")


def test_an_image_attachment_is_stored_journaled_by_reference_and_shown(
    owner_client: Client, outsider_client: Client, session: Session
) -> None:
    from django.core.files.uploadedfile import SimpleUploadedFile

    upload = SimpleUploadedFile("dot.png", PNG, content_type="image/png")
    response = owner_client.post(
        f"/sessions/{session.pk}/messages", {"content": "what is this?", "attachments": [upload]}, **HTMX
    )
    assert response.status_code == 204, response.content
    content = Run.objects.get(session=session).reason["input"]["content"]
    assert content[0] == {"type": "text", "text": "what is this?"}
    url = content[1]["image_url"]["url"]
    assert url.startswith("sectr-media://")  # a reference, not the bytes
    sha256 = url.removeprefix("sectr-media://")
    html = owner_client.get(chat_url(session)).content.decode()
    media_url = f"/sessions/{session.pk}/media/{sha256}"
    assert f'<img src="{media_url}"' in html and "what is this?" in html
    image = owner_client.get(media_url)
    assert image.status_code == 200 and image["Content-Type"] == "image/png"
    assert b"".join(image.streaming_content) == PNG
    assert outsider_client.get(media_url).status_code == 404


def test_an_attachment_that_is_not_media_is_refused(owner_client: Client, session: Session) -> None:
    from django.core.files.uploadedfile import SimpleUploadedFile

    upload = SimpleUploadedFile("notes.txt", b"hello", content_type="text/plain")
    response = owner_client.post(f"/sessions/{session.pk}/messages", {"content": "x", "attachments": [upload]}, **HTMX)
    assert response.status_code == 400 and "images and audio" in response.content.decode()
    assert not Run.objects.filter(session=session).exists()


def test_an_image_whose_bytes_lie_is_refused(owner_client: Client, session: Session) -> None:
    from django.core.files.uploadedfile import SimpleUploadedFile

    upload = SimpleUploadedFile("fake.png", b"GIF89a not a png", content_type="image/png")
    response = owner_client.post(f"/sessions/{session.pk}/messages", {"content": "x", "attachments": [upload]}, **HTMX)
    assert response.status_code == 400
    assert not Run.objects.filter(session=session).exists()


# ---- API tokens ----


def test_a_token_is_shown_once_and_stored_hashed(owner_client: Client, owner: Any) -> None:
    from sessions_app.models import ApiToken

    response = owner_client.post("/settings/tokens/", {"name": "laptop"})
    assert response.status_code == 200 and response["Cache-Control"] == "no-store"
    secret = re.search(r'id="new-token"[^>]*>(sectr_[^<]+)<', response.content.decode())
    assert secret is not None
    token = ApiToken.objects.get(user=owner)
    assert token.name == "laptop" and secret.group(1) not in (token.token_hash, token.prefix)
    assert ApiToken.authenticate(secret.group(1)) == token
    listing = owner_client.get("/settings/tokens/").content.decode()
    assert "laptop" in listing and secret.group(1) not in listing


def test_a_token_is_revoked_by_its_owner_only(owner_client: Client, outsider_client: Client, owner: Any) -> None:
    from sessions_app.actions.tokens import do_issue_token
    from sessions_app.models import ApiToken

    token, secret = do_issue_token(owner, "ci")
    assert outsider_client.post(f"/settings/tokens/{token.pk}/revoke").status_code == 404
    assert ApiToken.authenticate(secret) is not None
    response = owner_client.post(f"/settings/tokens/{token.pk}/revoke")
    assert response.status_code == 302
    assert ApiToken.authenticate(secret) is None


def test_tokens_page_needs_a_login(client: Client) -> None:
    assert client.get("/settings/tokens/").status_code == 302
