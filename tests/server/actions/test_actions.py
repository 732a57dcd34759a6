"""Actions: every state change of a session (sessions_app.actions) and who may make it.

Each test asserts what an action writes, and that a refused action writes nothing (the
Session, Envelope and Run rows are counted before and after). Runs that must really
happen are executed by a worker in this process (`run_worker`).

Run on SQLite (in-memory channel layer) and on PostgreSQL (Redis channel layer).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AnonymousUser
from django.core.files.base import ContentFile
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from sectr.errors import (
    AskNotPending,
    Forbidden,
    NotAtTurnBoundary,
    NotFound,
    RetryIneligible,
    SectrError,
    SessionBusy,
    StaleRunControl,
    ValidationFailed,
)
from sectr.events import Envelope, EventType
from sectr.fold import fold_messages, last_assistant_text
from sectr.journal import NewEvent
from sectr.providers import DemoProvider
from sectr.runtime import Runtime
from sectr.state import DEFAULT_LIMITS
from sessions_app import actions
from sessions_app.access import check_access, get_session_for_user, has_any_role, visible_sessions
from sessions_app.dbthread import run_in_db_thread
from sessions_app.journal import DatabaseJournal
from sessions_app.models import Envelope as EnvelopeRow
from sessions_app.models import MediaBlob, Run, Session, SessionMedia
from sessions_app.runs import Claim, finish_run
from sessions_app.worker import Worker
from tests.server.conftest import join_team, make_user, run_threads

E = EventType
RUNTIME = Runtime(DatabaseJournal(), provider=DemoProvider(delay=0.0005, slow_delay=0.02))


# ---- helpers ----


@pytest.fixture
def reviewer(owner: Any) -> Any:
    # A reviewer of the owner's team (the owner's sessions, made before or after, are in it).
    return join_team(make_user("reviewer"), "reviewer", owner)


@pytest.fixture
def moderator(owner: Any) -> Any:
    return join_team(make_user("moderator"), "moderator", owner)


@pytest.fixture
def superuser(db: None) -> Any:
    return make_user("root", is_superuser=True, is_staff=True)


def rows() -> tuple[int, int, int, list[tuple[str, int]]]:
    return (
        Session.objects.count(),
        EnvelopeRow.objects.count(),
        Run.objects.count(),
        list(Run.objects.order_by("id").values_list("status", "attempts")),
    )


@contextmanager
def writes_nothing() -> Iterator[None]:
    before = rows()
    yield
    assert rows() == before


def journal_of(session: Session | str) -> list[Envelope]:
    session_id = session if isinstance(session, str) else session.pk
    return [row.to_envelope() for row in EnvelopeRow.objects.filter(session_id=session_id).order_by("seq")]


def kinds(session: Session | str) -> list[str]:
    return [e.type.value for e in journal_of(session) if e.type is not E.MESSAGE_DELTA]


def state_of(session: Session | str) -> Any:
    session_id = session if isinstance(session, str) else session.pk
    return Session.objects.get(pk=session_id).projection()


def run_worker(timeout: float = 30.0) -> None:
    """Run a worker in this thread until no run is queued, running or about to start."""

    def busy() -> bool:
        return Run.objects.filter(status__in=[Run.QUEUED, Run.RUNNING]).exists()

    async def main() -> None:
        worker = Worker(concurrency=4, poll_interval=0.05, lease=5.0, runtime=RUNTIME, listen=False)
        task = asyncio.ensure_future(worker.run(drain_timeout=5))
        deadline = time.monotonic() + timeout
        try:
            quiet = 0
            while quiet < 3:  # idle three looks in a row: a finishing run may promote another
                quiet = quiet + 1 if not await run_in_db_thread(busy) and not worker.tasks else 0
                assert time.monotonic() < deadline, "runs did not finish in time"
                await asyncio.sleep(0.02)
        finally:
            worker.stop()
            await task

    asyncio.run(main())


def finished_run(owner: Any, session: Session, text: str) -> Run:
    run = actions.do_post_message(owner, session.pk, text)
    run_worker()
    return Run.objects.get(pk=run.pk)


def awaiting_session(owner: Any, **options: Any) -> tuple[Session, Run, str]:
    """A session paused on a write_note ask: (session, its suspended run, ask_id)."""
    session = actions.do_create_session(owner, **options)
    run = finished_run(owner, session, "note: hello world")
    assert run.status == Run.SUSPENDED
    ask = state_of(session).pending_ask
    return session, run, ask["ask_id"]


def fail_run(run: Run, *, retryable: bool) -> None:
    """End a queued run as a failed one (as a worker would journal a provider error)."""
    DatabaseJournal().append_sync(
        run.session_id,
        [NewEvent(E.INVOCATION_FAILED, {"error": "provider said 503", "retryable": retryable}, run.invocation_id)],
    )
    Run.objects.filter(pk=run.pk).update(status=Run.FAILED, stop_reason="error")


# ---- create ----


@pytest.mark.django_db
def test_it_creates_a_session_and_journals_its_settings(owner: Any) -> None:
    limits = {"max_turns": 3, "max_run_tokens": 1000}
    session = actions.do_create_session(
        owner, title="  Trip   plans ", mode="plan", model="gpt-4o", limits=limits, reasoning_effort="low"
    )
    assert session.owner == owner
    (created,) = journal_of(session)
    assert (created.seq, created.type) == (1, E.SESSION_CREATED)
    assert created.payload == {
        "title": "Trip plans",
        "mode": "plan",
        "model": "gpt-4o",
        "limits": {**DEFAULT_LIMITS, **limits},
        "reasoning_effort": "low",
    }
    state = state_of(session)
    assert (state.status, state.title, state.title_source, state.mode, state.model) == (
        "idle",
        "Trip plans",
        "user",
        "plan",
        "gpt-4o",
    )
    assert state.limits == {**DEFAULT_LIMITS, **limits}


@pytest.mark.django_db
def test_it_creates_a_session_with_the_defaults(owner: Any) -> None:
    session = actions.do_create_session(owner)
    (created,) = journal_of(session)
    assert created.payload == {"mode": "default", "model": "demo", "limits": DEFAULT_LIMITS}
    assert state_of(session).title is None


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("options", "code"),
    [
        ({"title": ""}, "invalid_title"),
        ({"title": "   "}, "invalid_title"),
        ({"title": "x" * 121}, "invalid_title"),
        ({"title": 7}, "invalid_title"),
        ({"mode": "yolo"}, "invalid_mode"),
        ({"model": "   "}, "invalid_model"),
        ({"model": "m" * 201}, "invalid_model"),
        ({"model": 3}, "invalid_model"),
        ({"limits": {"max_turns": -1}}, "invalid_limits"),
        ({"limits": {"max_turns": "3"}}, "invalid_limits"),
        ({"limits": {"max_turns": True}}, "invalid_limits"),
        ({"limits": {"max_turns": 10**10}}, "invalid_limits"),
        ({"limits": {"max_wishes": 3}}, "invalid_limits"),
        ({"limits": [3]}, "invalid_limits"),
        ({"reasoning_effort": "extreme"}, "invalid_reasoning_effort"),
    ],
)
def test_it_refuses_bad_settings_and_creates_nothing(owner: Any, options: dict[str, Any], code: str) -> None:
    with writes_nothing(), pytest.raises(ValidationFailed) as refused:
        actions.do_create_session(owner, **options)
    assert (refused.value.code, refused.value.status) == (code, 400)


# ---- post a message ----


@pytest.mark.django_db
def test_it_queues_a_run_for_a_message(owner: Any, session: Session) -> None:
    run = actions.do_post_message(owner, session.pk, "hello")
    assert (run.status, run.invocation_ids, run.start_seq) == (Run.QUEUED, [run.invocation_id], 2)
    started = journal_of(session)[-1]
    assert (started.type, started.invocation_id) == (E.INVOCATION_STARTED, run.invocation_id)
    assert started.payload["reason"] == {"kind": "user_message", "input": {"content": "hello"}, "author": "owner"}
    assert run.reason == started.payload["reason"]
    assert state_of(session).status == "running"


@pytest.mark.django_db
def test_posting_a_message_reads_the_session_row_once(owner: Any, session: Session) -> None:
    """The access check runs on the row the action locks, and the append reuses that
    row: one read of the Session (with its state JSON) for a message, where it was three."""
    with CaptureQueriesContext(connection) as queries:
        actions.do_post_message(owner, session.pk, "hello")
    session_reads = [q["sql"] for q in queries if q["sql"].startswith('SELECT "sessions_app_session"."id"')]
    assert len(session_reads) == 1, session_reads


@pytest.mark.django_db
def test_appends_with_the_same_locked_row_stay_gapless(owner: Any, session: Session) -> None:
    """An append given the caller's locked row leaves that object as the row is now, so
    a second append with it is right too (and another session's row is refused)."""
    journal = DatabaseJournal()
    error = NewEvent(E.SESSION_ERROR, {"error": "x", "retryable": False}, None)
    with transaction.atomic():
        locked = Session.objects.select_for_update().get(pk=session.pk)
        journal.append_sync(session.pk, [error], locked=locked)
        journal.append_sync(session.pk, [error, error], locked=locked)
        assert locked.last_seq == 4
    assert [e.seq for e in journal_of(session)] == [1, 2, 3, 4]
    assert Session.objects.get(pk=session.pk).last_seq == 4
    with pytest.raises(ValueError, match="locked"):
        journal.append_sync("ses_another", [error], locked=locked)  # not that session's row


@pytest.mark.django_db
def test_a_stranger_is_refused_before_anything_is_written(owner: Any, session: Session) -> None:
    stranger = get_user_model().objects.create_user(username="stranger")
    with writes_nothing(), pytest.raises(NotFound):
        actions.do_post_message(stranger, session.pk, "hello")


@pytest.mark.django_db
@pytest.mark.parametrize(
    "content", ["", "   ", [], [{"type": "video", "url": "x"}], [{"type": "text"}], 5, "x" * 200_001]
)
def test_it_refuses_a_bad_message_and_writes_nothing(owner: Any, session: Session, content: Any) -> None:
    with writes_nothing(), pytest.raises(ValidationFailed) as refused:
        actions.do_post_message(owner, session.pk, content)
    assert refused.value.code == "prompt"


@pytest.mark.django_db
def test_it_refuses_a_message_while_a_run_is_active(owner: Any, session: Session) -> None:
    actions.do_post_message(owner, session.pk, "first")
    with writes_nothing(), pytest.raises(SessionBusy) as refused:
        actions.do_post_message(owner, session.pk, "second")
    assert (refused.value.status, refused.value.code) == (409, "session_busy")


@pytest.mark.django_db
def test_it_parks_a_queued_message_without_journaling_it(owner: Any, session: Session) -> None:
    actions.do_post_message(owner, session.pk, "first")
    before = len(journal_of(session))
    queued = actions.do_post_message(owner, session.pk, "second", queue=True)
    assert (queued.status, queued.invocation_id) == (Run.PENDING, None)
    assert queued.reason == {"kind": "user_message", "input": {"content": "second"}, "author": "owner"}
    assert len(journal_of(session)) == before


@pytest.mark.django_db
def test_it_promotes_queued_messages_in_order_when_the_run_ends(owner: Any, session: Session) -> None:
    active = actions.do_post_message(owner, session.pk, "first")
    second = actions.do_post_message(owner, session.pk, "second", queue=True)
    third = actions.do_post_message(owner, session.pk, "third", queue=True)
    assert actions.promote_pending_run(session.pk) is None  # the first run is still active

    DatabaseJournal().append_sync(
        session.pk, [NewEvent(E.INVOCATION_COMPLETED, {"stop_reason": "end_turn", "usage": {}}, active.invocation_id)]
    )
    promoted = actions.promote_pending_run(session.pk)
    assert promoted is not None and promoted.pk == second.pk
    assert (promoted.status, promoted.start_seq) == (Run.QUEUED, len(journal_of(session)))
    assert journal_of(session)[-1].payload["reason"]["input"] == {"content": "second"}
    assert actions.promote_pending_run(session.pk) is None  # "second" is active now
    assert Run.objects.get(pk=third.pk).status == Run.PENDING
    # A prompt posted now does not overtake the queue.
    with pytest.raises(SessionBusy):
        actions.do_post_message(owner, session.pk, "fourth")


@pytest.mark.django_db(transaction=True)
def test_it_runs_queued_messages_one_after_another(owner: Any) -> None:
    session = actions.do_create_session(owner)
    runs = [actions.do_post_message(owner, session.pk, text, queue=True) for text in ("one", "two", "three")]
    assert [r.status for r in runs] == [Run.QUEUED, Run.PENDING, Run.PENDING]
    run_worker()
    assert [Run.objects.get(pk=r.pk).status for r in runs] == [Run.COMPLETED] * 3
    replies = [m["content"] for m in fold_messages(journal_of(session)) if m["role"] == "assistant"]
    assert replies == ["You said: one", "You said: two", "You said: three"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("queue", [False, True])
def test_it_refuses_a_message_while_an_ask_waits(owner: Any, queue: bool) -> None:
    session, _run, _ask = awaiting_session(owner)
    with writes_nothing(), pytest.raises(SessionBusy) as refused:
        actions.do_post_message(owner, session.pk, "anything", queue=queue)
    assert (refused.value.status, refused.value.code) == (409, "awaiting_approval")


@pytest.mark.django_db
def test_it_titles_the_session_from_the_first_prompt_until_it_is_renamed(owner: Any) -> None:
    session = actions.do_create_session(owner)
    long_prompt = "plan   a trip " + "very " * 60
    run = actions.do_post_message(owner, session.pk, long_prompt)
    titled = journal_of(session)[1]
    assert titled.type is E.SESSION_UPDATED
    assert titled.payload == {"title": " ".join(long_prompt.split())[:120], "title_source": "prompt"}
    assert len(state_of(session).title) == 120

    DatabaseJournal().append_sync(
        session.pk, [NewEvent(E.INVOCATION_COMPLETED, {"stop_reason": "end_turn", "usage": {}}, run.invocation_id)]
    )
    actions.do_post_message(owner, session.pk, "another prompt entirely")
    assert state_of(session).title == " ".join(long_prompt.split())[:120]  # only the first prompt titles

    actions.do_rename(owner, session.pk, "My trip")
    assert (state_of(session).title, state_of(session).title_source) == ("My trip", "user")


@pytest.mark.django_db
def test_it_keeps_a_title_given_at_creation(owner: Any) -> None:
    session = actions.do_create_session(owner, title="Chosen")
    actions.do_post_message(owner, session.pk, "a prompt")
    assert state_of(session).title == "Chosen"
    assert E.SESSION_UPDATED.value not in kinds(session)


# ---- decide ----


@pytest.mark.django_db(transaction=True)
def test_it_records_the_first_verdict_and_refuses_a_second(owner: Any) -> None:
    session, suspended, ask_id = awaiting_session(owner)
    resumed = actions.do_decide(owner, ask_id, "allow_once", note="fine")
    assert (resumed.status, resumed.session_id) == (Run.QUEUED, session.pk)
    started = journal_of(session)[-1]
    assert (started.type, started.invocation_id) == (E.INVOCATION_STARTED, resumed.invocation_id)
    assert started.payload["reason"] == {
        "kind": "approval_decision",
        "ask_id": ask_id,
        "decision": {"approved": True, "approver": "owner", "verdict": "allow_once", "note": "fine"},
    }
    assert state_of(session).asks[ask_id]["status"] == "approved"

    with writes_nothing(), pytest.raises(AskNotPending) as refused:
        actions.do_decide(owner, ask_id, "deny")
    assert (refused.value.status, refused.value.code) == (409, "ask_not_pending")

    run_worker()
    assert Run.objects.get(pk=resumed.pk).status == Run.COMPLETED
    assert state_of(session).notes == {"hello world": "hello world"}
    assert Run.objects.get(pk=suspended.pk).status == Run.SUSPENDED


@pytest.mark.django_db(transaction=True)
def test_it_gives_the_model_a_denial_and_goes_on(owner: Any) -> None:
    session, _run, ask_id = awaiting_session(owner)
    actions.do_decide(owner, ask_id, "deny", note="not now")
    run_worker()
    messages = fold_messages(journal_of(session))
    assert messages[-2]["role"] == "tool" and messages[-2]["content"].startswith("denied: owner denied this call")
    assert last_assistant_text(messages) == "write_note was denied"
    assert state_of(session).status == "completed" and state_of(session).notes == {}


@pytest.mark.django_db(transaction=True)
def test_it_remembers_allow_always_for_the_session(owner: Any) -> None:
    session, _run, ask_id = awaiting_session(owner)
    actions.do_decide(owner, ask_id, "allow_always")
    run_worker()
    assert state_of(session).grants == ["write_note"]
    again = finished_run(owner, session, "note: second thought")
    assert (again.status, again.stop_reason) == (Run.COMPLETED, "end_turn")  # no new ask
    assert state_of(session).notes["second thought"] == "second thought"


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("verdict", "note"), [("maybe", None), ("", None), ("allow_once", "n" * 2001)])
def test_it_refuses_a_bad_verdict_and_writes_nothing(owner: Any, verdict: str, note: str | None) -> None:
    _session, _run, ask_id = awaiting_session(owner)
    with writes_nothing(), pytest.raises(ValidationFailed):
        actions.do_decide(owner, ask_id, verdict, note=note)


THREE_NOTES = (
    '!tools write_note {"title": "a", "body": "1"} ; write_note {"title": "b", "body": "2"} ; '
    'write_note {"title": "c", "body": "3"}'
)


@pytest.mark.django_db(transaction=True)
def test_approve_all_runs_the_turns_other_gated_calls_and_audits_each(owner: Any, moderator: Any) -> None:
    from sessions_app.models import AuditEntry

    session = actions.do_create_session(owner)
    assert finished_run(owner, session, THREE_NOTES).status == Run.SUSPENDED
    ask_id = state_of(session).pending_ask["ask_id"]
    resumed = actions.do_decide(moderator, ask_id, "allow_once", scope="turn")
    assert journal_of(session)[-1].payload["reason"]["decision"] == {
        "approved": True,
        "approver": "moderator",
        "verdict": "allow_once",
        "scope": "turn",
    }
    run_worker()
    assert Run.objects.get(pk=resumed.pk).status == Run.COMPLETED  # no second pause
    state = state_of(session)
    assert state.notes == {"a": "1", "b": "2", "c": "3"} and state.pending_ask is None
    rows = AuditEntry.objects.filter(session=session, kind=AuditEntry.DECISION).order_by("seq")
    assert [(r.actor, r.verdict, r.arguments["title"]) for r in rows] == [
        ("moderator", "allow_once", "a"),
        ("moderator", "allow_once", "b"),
        ("moderator", "allow_once", "c"),
    ]
    # b and c were approved with a's ask: their time to decide is a's, counted once
    assert [r.seconds_to_decide is None for r in rows] == [False, True, True]
    assert [r.note for r in rows] == ["", f"Approve all, with {ask_id}", f"Approve all, with {ask_id}"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("verdict", "scope", "code"),
    [
        ("deny", "turn", "invalid_scope"),
        ("allow_once", "session", "invalid_scope"),
        ("allow_always", 3, "invalid_scope"),
    ],
)
def test_it_refuses_a_bad_scope_and_writes_nothing(owner: Any, verdict: str, scope: Any, code: str) -> None:
    _session, _run, ask_id = awaiting_session(owner)
    with writes_nothing(), pytest.raises(ValidationFailed) as refused:
        actions.do_decide(owner, ask_id, verdict, scope=scope)
    assert refused.value.code == code and refused.value.status == 400


@pytest.mark.django_db(transaction=True)
def test_it_hides_asks_from_outsiders_and_teammates(owner: Any, teammate: Any, outsider: Any, reviewer: Any) -> None:
    _session, _run, ask_id = awaiting_session(owner)
    for user in (outsider, teammate):
        with writes_nothing(), pytest.raises(NotFound):
            actions.do_decide(user, ask_id, "allow_once")
    with writes_nothing(), pytest.raises(Forbidden):
        actions.do_decide(reviewer, ask_id, "allow_once")  # may read, may not decide
    for bad_id in ("ask_missing", "nope", "ask_" + "x" * 100):
        with writes_nothing(), pytest.raises(NotFound):
            actions.do_decide(owner, bad_id, "allow_once")


@pytest.mark.django_db(transaction=True)
def test_it_lets_a_moderator_decide_and_records_the_approver(owner: Any, moderator: Any) -> None:
    session, _run, ask_id = awaiting_session(owner)
    actions.do_decide(moderator, ask_id, "deny")
    decision = journal_of(session)[-1].payload["reason"]["decision"]
    assert decision == {"approved": False, "approver": "moderator", "verdict": "deny"}
    assert state_of(session).asks[ask_id]["approver"] == "moderator"


@pytest.mark.django_db(transaction=True)
def test_it_resumes_exactly_once_when_two_decisions_race(owner: Any, moderator: Any) -> None:
    session, _run, ask_id = awaiting_session(owner)
    deciders = [owner, moderator]
    results, errors = run_threads(2, lambda i: actions.do_decide(deciders[i], ask_id, "allow_once"))
    assert len(results) == 1 and len(errors) == 1
    assert isinstance(errors[0], AskNotPending)
    resumed = Run.objects.filter(session=session, reason__kind="approval_decision")
    assert [r.pk for r in resumed] == [results[0].pk]
    starts = [e for e in journal_of(session) if e.type is E.INVOCATION_STARTED]
    assert [e.payload["reason"]["kind"] for e in starts] == ["user_message", "approval_decision"]


# ---- steer ----


@pytest.mark.django_db
def test_it_parks_steers_on_the_active_run(owner: Any, session: Session) -> None:
    run = actions.do_post_message(owner, session.pk, "!slow 10")
    with writes_nothing():
        actions.do_steer(owner, run.pk, "shorter please")
        actions.do_steer(owner, run.pk, "and in French")
    parked = Run.objects.get(pk=run.pk)
    assert (parked.pending_steer, parked.steer_author) == ("shorter please\n\nand in French", "owner")


@pytest.mark.django_db(transaction=True)
def test_it_refuses_a_steer_after_the_run_ended(owner: Any) -> None:
    session = actions.do_create_session(owner)
    run = finished_run(owner, session, "hello")
    with writes_nothing(), pytest.raises(StaleRunControl) as refused:
        actions.do_steer(owner, run.pk, "too late")
    assert (refused.value.status, refused.value.code) == (409, "stale_run_control")
    assert Run.objects.get(pk=run.pk).pending_steer == ""


@pytest.mark.django_db
@pytest.mark.parametrize("text", ["", "   ", "x" * 20_001])
def test_it_refuses_an_empty_or_huge_steer(owner: Any, session: Session, text: str) -> None:
    run = actions.do_post_message(owner, session.pk, "!slow 10")
    with writes_nothing(), pytest.raises(ValidationFailed):
        actions.do_steer(owner, run.pk, text)
    assert Run.objects.get(pk=run.pk).pending_steer == ""


@pytest.mark.django_db
def test_it_hides_runs_from_outsiders(owner: Any, outsider: Any, session: Session) -> None:
    run = actions.do_post_message(owner, session.pk, "!slow 10")
    for control in (lambda: actions.do_steer(outsider, run.pk, "hi"), lambda: actions.do_cancel(outsider, run.pk)):
        with writes_nothing(), pytest.raises(NotFound):
            control()
    with writes_nothing(), pytest.raises(NotFound):
        actions.do_cancel(owner, "run_missing")


# ---- cancel ----


@pytest.mark.django_db
def test_it_cancels_a_run_no_worker_has_claimed(owner: Any, session: Session) -> None:
    run = actions.do_post_message(owner, session.pk, "hello")
    cancelled = actions.do_cancel(owner, run.pk)
    assert (cancelled.status, cancelled.stop_reason) == (Run.CANCELLED, "cancelled")
    assert cancelled.finished_at is not None
    last = journal_of(session)[-1]
    assert (last.type, last.invocation_id, last.payload) == (E.INVOCATION_CANCELLED, run.invocation_id, {"by": "owner"})
    assert state_of(session).status == "cancelled"
    # The next message reopens the session.
    again = actions.do_post_message(owner, session.pk, "hello again")
    assert again.status == Run.QUEUED and state_of(session).status == "running"


@pytest.mark.django_db
def test_it_cancels_a_queued_message_without_journaling(owner: Any, session: Session) -> None:
    actions.do_post_message(owner, session.pk, "first")
    queued = actions.do_post_message(owner, session.pk, "second", queue=True)
    before = len(journal_of(session))
    assert actions.do_cancel(owner, queued.pk).status == Run.CANCELLED
    assert len(journal_of(session)) == before


@pytest.mark.django_db(transaction=True)
def test_it_cancels_a_suspended_run_by_withdrawing_its_ask(owner: Any) -> None:
    session, suspended, ask_id = awaiting_session(owner)
    cancelled = actions.do_cancel(owner, suspended.pk)
    assert (cancelled.status, cancelled.stop_reason) == (Run.CANCELLED, "cancelled")
    result, end = journal_of(session)[-2:]
    assert result.type is E.TOOL_RESULT
    assert result.payload["content"] == "tool call interrupted by cancellation" and result.payload["is_error"]
    assert result.payload["tool_call_id"] == state_of(session).asks[ask_id]["tool_call_id"]
    assert (end.type, end.payload) == (E.INVOCATION_CANCELLED, {"ask_id": ask_id, "by": "owner"})
    state = state_of(session)
    assert (state.status, state.pending_ask, state.asks[ask_id]["status"]) == ("cancelled", None, "withdrawn")
    with writes_nothing(), pytest.raises(AskNotPending):
        actions.do_decide(owner, ask_id, "allow_once")
    # The orphaned call is answered, so the next turn's history is valid.
    finished_run(owner, session, "hello")
    assert last_assistant_text(fold_messages(journal_of(session))) == "You said: hello"


@pytest.mark.django_db(transaction=True)
def test_it_starts_the_queued_message_when_a_run_is_cancelled_without_a_worker(owner: Any) -> None:
    session = actions.do_create_session(owner)
    active = actions.do_post_message(owner, session.pk, "first")
    queued = actions.do_post_message(owner, session.pk, "second", queue=True)
    actions.do_cancel(owner, active.pk)
    promoted = Run.objects.get(pk=queued.pk)
    assert promoted.status == Run.QUEUED and state_of(session).current_invocation_id == promoted.invocation_id
    run_worker()
    assert last_assistant_text(fold_messages(journal_of(session))) == "You said: second"


@pytest.mark.django_db(transaction=True)
def test_it_cancels_a_run_whose_worker_has_not_recorded_its_ask_yet(owner: Any) -> None:
    session, suspended, ask_id = awaiting_session(owner)
    # The worker journaled the ask but has not marked its row yet (it still holds it).
    Run.objects.filter(pk=suspended.pk).update(status=Run.RUNNING, lease_token="tok", finished_at=None)
    cancelled = actions.do_cancel(owner, suspended.pk)
    assert (cancelled.status, cancelled.lease_token) == (Run.CANCELLED, None)
    assert state_of(session).asks[ask_id]["status"] == "withdrawn"
    # The worker's late bookkeeping changes nothing.
    terminal = next(e for e in journal_of(session) if e.type is E.INVOCATION_SUSPENDED)
    claim = Claim(suspended.pk, session.pk, suspended.invocation_id or "", "tok", recovered=False)
    assert finish_run(claim, terminal) is False
    assert Run.objects.get(pk=suspended.pk).status == Run.CANCELLED


@pytest.mark.django_db(transaction=True)
def test_it_refuses_to_cancel_a_run_whose_end_is_journaled(owner: Any) -> None:
    session = actions.do_create_session(owner)
    run = finished_run(owner, session, "hello")
    # As if its worker had journaled the end and not yet updated the row.
    Run.objects.filter(pk=run.pk).update(status=Run.RUNNING, lease_token="tok", finished_at=None)
    with writes_nothing(), pytest.raises(StaleRunControl):
        actions.do_cancel(owner, run.pk)
    assert Run.objects.get(pk=run.pk).cancel_requested is False


@pytest.mark.django_db(transaction=True)
def test_it_refuses_to_cancel_a_finished_run(owner: Any) -> None:
    session = actions.do_create_session(owner)
    run = finished_run(owner, session, "hello")
    with writes_nothing(), pytest.raises(StaleRunControl):
        actions.do_cancel(owner, run.pk)


# ---- retry ----


@pytest.mark.django_db(transaction=True)
def test_it_retries_a_retryable_failure(owner: Any) -> None:
    session = actions.do_create_session(owner)
    failed = actions.do_post_message(owner, session.pk, "hello")
    fail_run(failed, retryable=True)
    retried = actions.do_retry(owner, session.pk)
    assert retried.status == Run.QUEUED
    assert journal_of(session)[-1].payload["reason"] == {"kind": "retry", "of_invocation_id": failed.invocation_id}
    run_worker()
    assert Run.objects.get(pk=retried.pk).status == Run.COMPLETED
    assert last_assistant_text(fold_messages(journal_of(session))) == "You said: hello"


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("situation", ["idle", "running", "completed", "awaiting", "permanent failure"])
def test_it_refuses_a_retry_unless_the_session_failed_retryably(owner: Any, situation: str) -> None:
    session = actions.do_create_session(owner)
    if situation == "running":
        actions.do_post_message(owner, session.pk, "hello")
    elif situation == "completed":
        finished_run(owner, session, "hello")
    elif situation == "awaiting":
        session, _run, _ask = awaiting_session(owner)
    elif situation == "permanent failure":
        fail_run(actions.do_post_message(owner, session.pk, "hello"), retryable=False)
    with writes_nothing(), pytest.raises(RetryIneligible) as refused:
        actions.do_retry(owner, session.pk)
    assert (refused.value.status, refused.value.code) == (409, "failed_step_retry_ineligible")


# ---- fork ----


@pytest.mark.django_db(transaction=True)
def test_it_forks_a_session_now(owner: Any) -> None:
    source = actions.do_create_session(owner, title="Source", mode="plan", limits={"max_turns": 7})
    finished_run(owner, source, "hello")
    finished_run(owner, source, "again")
    fork = actions.do_fork(owner, source.pk)

    assert fork.owner == owner and fork.pk != source.pk
    created, compacted = journal_of(fork)
    source_state = state_of(source)
    assert created.payload["forked_from"] == {"session_id": source.pk, "seq": source_state.last_seq}
    assert (created.payload["title"], created.payload["mode"]) == ("Fork of Source", "plan")
    assert created.payload["limits"]["max_turns"] == 7
    assert compacted.type is E.TRANSCRIPT_COMPACTED
    assert compacted.payload["messages"] == fold_messages(journal_of(source))
    assert fold_messages(journal_of(fork)) == fold_messages(journal_of(source))
    forked = state_of(fork)
    assert (forked.status, forked.usage, forked.total_usage["input_tokens"], forked.turns) == ("idle", {}, 0, 0)
    assert Session.objects.get(pk=fork.pk).token_total == 0 and source_state.total_usage["input_tokens"] > 0
    # The fork goes on by itself.
    finished_run(owner, fork, "third")
    assert [m["content"] for m in fold_messages(journal_of(fork)) if m["role"] == "user"] == ["hello", "again", "third"]


@pytest.mark.django_db(transaction=True)
def test_it_forks_at_an_earlier_seq(owner: Any) -> None:
    source = actions.do_create_session(owner)
    finished_run(owner, source, "hello")
    first_end = next(e.seq for e in journal_of(source) if e.type is E.INVOCATION_COMPLETED)
    finished_run(owner, source, "again")
    fork = actions.do_fork(owner, source.pk, at_seq=first_end, title="Back then", model="other-model")
    created, compacted = journal_of(fork)
    assert created.payload["forked_from"] == {"session_id": source.pk, "seq": first_end}
    assert (created.payload["title"], created.payload["model"]) == ("Back then", "other-model")
    assert compacted.payload["messages"] == [
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "You said: hello"},
    ]


@pytest.mark.django_db(transaction=True)
def test_it_forks_without_trailing_unanswered_tool_calls(owner: Any) -> None:
    source, _run, ask_id = awaiting_session(owner)
    fork = actions.do_fork(owner, source.pk)  # awaiting is a turn boundary
    assert journal_of(fork)[1].payload["messages"] == [{"role": "user", "content": "note: hello world"}]
    assert state_of(fork).pending_ask is None

    # In the past too: at the TOOL_CALL, before its result existed.
    actions.do_decide(owner, ask_id, "allow_once")
    run_worker()
    call_seq = next(e.seq for e in journal_of(source) if e.type is E.TOOL_CALL)
    past = actions.do_fork(owner, source.pk, at_seq=call_seq)
    messages = journal_of(past)[1].payload["messages"]
    assert messages[0] == {"role": "user", "content": "note: hello world"}
    assert all(not m.get("tool_calls") for m in messages)


@pytest.mark.django_db(transaction=True)
def test_it_forks_across_a_compaction(owner: Any) -> None:
    source = actions.do_create_session(owner)
    for text in ("one", "two", "three"):
        finished_run(owner, source, text)
    before_compaction = len(journal_of(source))
    assert actions.do_compact(owner, source.pk) is True
    finished_run(owner, source, "four")
    whole = journal_of(source)
    for at_seq in (before_compaction - 1, len(whole)):
        fork = actions.do_fork(owner, source.pk, at_seq=at_seq)
        expected = fold_messages(e for e in whole if e.seq <= at_seq)
        assert journal_of(fork)[1].payload["messages"] == expected


@pytest.mark.django_db
def test_it_refuses_to_fork_mid_run(owner: Any, session: Session) -> None:
    actions.do_post_message(owner, session.pk, "hello")
    with writes_nothing(), pytest.raises(NotAtTurnBoundary) as refused:
        actions.do_fork(owner, session.pk)
    assert refused.value.status == 412
    # A fork of an earlier point is fine while a run goes on.
    assert actions.do_fork(owner, session.pk, at_seq=1).owner == owner


@pytest.mark.django_db
@pytest.mark.parametrize("at_seq", [0, -1, 99, True, "1", 1.0])
def test_it_refuses_a_fork_at_a_bad_seq(owner: Any, session: Session, at_seq: Any) -> None:
    with writes_nothing(), pytest.raises(ValidationFailed) as refused:
        actions.do_fork(owner, session.pk, at_seq=at_seq)
    assert refused.value.code == "invalid_seq"


@pytest.mark.django_db
def test_it_refuses_to_fork_someone_elses_session(owner: Any, outsider: Any, teammate: Any, session: Session) -> None:
    for user in (outsider, teammate):
        with writes_nothing(), pytest.raises(NotFound):
            actions.do_fork(user, session.pk)


@pytest.mark.django_db
def test_it_lets_a_reviewer_fork_into_a_session_of_their_own(owner: Any, reviewer: Any, session: Session) -> None:
    fork = actions.do_fork(reviewer, session.pk)
    assert fork.owner == reviewer
    assert Session.objects.get(pk=session.pk).owner == owner


# ---- clear, close, delete ----


@pytest.mark.django_db
def test_it_clears_into_a_new_session_with_the_same_settings(owner: Any) -> None:
    limits = {"max_turns": 4, "max_tool_calls": 9}
    source = actions.do_create_session(
        owner, title="Old", mode="accept_edits", model="m1", limits=limits, reasoning_effort="high"
    )
    actions.do_post_message(owner, source.pk, "hello")
    cleared = actions.do_clear(owner, source.pk)
    (created,) = journal_of(cleared)
    assert created.payload == {
        "mode": "accept_edits",
        "model": "m1",
        "limits": {**DEFAULT_LIMITS, **limits},
        "reasoning_effort": "high",
    }
    state = state_of(cleared)
    assert (state.status, state.title, cleared.owner) == ("idle", None, owner)
    assert fold_messages(journal_of(cleared)) == []


@pytest.mark.django_db
def test_it_refuses_to_clear_someone_elses_session(outsider: Any, session: Session) -> None:
    with writes_nothing(), pytest.raises(NotFound):
        actions.do_clear(outsider, session.pk)


@pytest.mark.django_db
def test_it_closes_and_a_new_message_reopens(owner: Any, session: Session) -> None:
    with writes_nothing():
        closed = actions.do_close(owner, session.pk)
    assert closed.closed_at is not None
    assert actions.do_close(owner, session.pk).closed_at == closed.closed_at  # closing twice keeps the time
    actions.do_post_message(owner, session.pk, "hello")
    assert Session.objects.get(pk=session.pk).closed_at is None


@pytest.mark.django_db
def test_it_refuses_to_delete_while_a_run_is_active(owner: Any, session: Session) -> None:
    actions.do_post_message(owner, session.pk, "hello")
    with writes_nothing(), pytest.raises(NotAtTurnBoundary) as refused:
        actions.do_delete(owner, session.pk)
    assert refused.value.status == 412


@pytest.mark.django_db
def test_it_deletes_the_session_its_journal_runs_and_media(
    owner: Any, make_session: Any, settings: Any, tmp_path: Any, django_capture_on_commit_callbacks: Any
) -> None:
    settings.MEDIA_ROOT = str(tmp_path)
    doomed, other = make_session(), make_session()
    run = actions.do_post_message(owner, doomed.pk, "hello")
    actions.do_cancel(owner, run.pk)
    own = MediaBlob(sha256="a" * 64, mime_type="image/png", size=3, kind="image")
    own.file.save("own.png", ContentFile(b"png"))
    shared = MediaBlob(sha256="b" * 64, mime_type="image/png", size=3, kind="image")
    shared.file.save("shared.png", ContentFile(b"png"))
    SessionMedia.objects.create(session=doomed, blob=own)
    SessionMedia.objects.create(session=doomed, blob=shared)
    SessionMedia.objects.create(session=other, blob=shared)

    with django_capture_on_commit_callbacks(execute=True):
        actions.do_delete(owner, doomed.pk)
    assert not Session.objects.filter(pk=doomed.pk).exists()
    assert not EnvelopeRow.objects.filter(session_id=doomed.pk).exists()
    assert not Run.objects.filter(session_id=doomed.pk).exists()
    assert not SessionMedia.objects.filter(session_id=doomed.pk).exists()
    assert list(MediaBlob.objects.values_list("sha256", flat=True)) == ["b" * 64]
    assert not (tmp_path / own.file.name).exists() and (tmp_path / shared.file.name).exists()
    assert len(journal_of(other)) == 1


@pytest.mark.django_db
def test_it_refuses_deletes_by_others(outsider: Any, reviewer: Any, session: Session) -> None:
    with writes_nothing(), pytest.raises(NotFound):
        actions.do_delete(outsider, session.pk)
    with writes_nothing(), pytest.raises(Forbidden):
        actions.do_delete(reviewer, session.pk)


# ---- rename, mode, model ----


@pytest.mark.django_db
@pytest.mark.parametrize("title", ["x", "y" * 120, "  spaced   out  "])
def test_it_renames(owner: Any, session: Session, title: str) -> None:
    actions.do_rename(owner, session.pk, title)
    expected = " ".join(title.split())
    assert journal_of(session)[-1].payload == {"title": expected, "title_source": "user"}
    assert state_of(session).title == expected and Session.objects.get(pk=session.pk).title == expected


@pytest.mark.django_db
@pytest.mark.parametrize("title", ["", "   ", "z" * 121, None])
def test_it_refuses_a_bad_title(owner: Any, session: Session, title: Any) -> None:
    with writes_nothing(), pytest.raises(ValidationFailed) as refused:
        actions.do_rename(owner, session.pk, title)
    assert refused.value.code == "invalid_title"


@pytest.mark.django_db
def test_it_changes_the_mode_between_runs_only(owner: Any, session: Session) -> None:
    actions.do_set_mode(owner, session.pk, "plan")
    assert journal_of(session)[-1].payload == {"mode": "plan"} and state_of(session).mode == "plan"
    with writes_nothing(), pytest.raises(ValidationFailed):
        actions.do_set_mode(owner, session.pk, "anything-goes")
    actions.do_post_message(owner, session.pk, "hello")
    with writes_nothing(), pytest.raises(SessionBusy) as refused:
        actions.do_set_mode(owner, session.pk, "default")
    assert refused.value.status == 409


@pytest.mark.django_db
def test_it_changes_the_model_between_runs_only(owner: Any, session: Session) -> None:
    actions.do_set_model(owner, session.pk, "gpt-4o", reasoning_effort="medium")
    assert journal_of(session)[-1].payload == {"model": "gpt-4o", "reasoning_effort": "medium"}
    actions.do_post_message(owner, session.pk, "hello")
    with writes_nothing(), pytest.raises(SessionBusy):
        actions.do_set_model(owner, session.pk, "demo")


# ---- compaction ----


@pytest.mark.django_db(transaction=True)
def test_it_compacts_once_then_has_nothing_to_do(owner: Any) -> None:
    session = actions.do_create_session(owner)
    assert actions.do_compact(owner, session.pk) is False  # nothing to compact yet
    for text in ("one", "two", "three"):
        finished_run(owner, session, text)
    before = fold_messages(journal_of(session))
    assert actions.do_compact(owner, session.pk) is True
    compacted = journal_of(session)[-1]
    assert compacted.type is E.TRANSCRIPT_COMPACTED
    assert compacted.payload["through_seq"] == compacted.seq - 1
    after = fold_messages(journal_of(session))
    assert len(after) < len(before) and after[0]["role"] == "system"
    assert after[1:] == before[-4:]  # the recent messages, verbatim
    assert state_of(session).compaction_seq == compacted.seq

    with writes_nothing():
        assert actions.do_compact(owner, session.pk) is False
    # The next run sees the compacted history and goes on.
    finished_run(owner, session, "four")
    assert last_assistant_text(fold_messages(journal_of(session))) == "You said: four"


@pytest.mark.django_db
def test_it_refuses_to_compact_mid_run(owner: Any, outsider: Any, session: Session) -> None:
    actions.do_post_message(owner, session.pk, "hello")
    with writes_nothing(), pytest.raises(NotAtTurnBoundary) as refused:
        actions.do_compact(owner, session.pk)
    assert refused.value.status == 412
    with writes_nothing(), pytest.raises(NotFound):
        actions.do_compact(outsider, session.pk)


# ---- limits, through a worker ----


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("limits", "prompt", "stop_reason"),
    [
        ({"max_turns": 1}, "what time is it", "max_turns"),
        ({"max_tool_calls": 1}, "what time is it", "max_tool_calls"),
        ({"max_run_tokens": 5}, "what time is it", "budget"),
        ({"max_consecutive_failures": 1}, "!tool no_such_tool {}", "max_consecutive_failures"),
    ],
)
def test_it_ends_a_run_at_a_limit_with_its_stop_reason(
    owner: Any, limits: dict[str, int], prompt: str, stop_reason: str
) -> None:
    session = actions.do_create_session(owner, limits=limits)
    run = finished_run(owner, session, prompt)
    assert (run.status, run.stop_reason) == (Run.COMPLETED, stop_reason)
    end = journal_of(session)[-1]
    assert end.type is E.INVOCATION_COMPLETED and end.payload["stop_reason"] == stop_reason
    state = state_of(session)
    assert (state.status, state.last_stop_reason) == ("completed", stop_reason)
    assert state.turns == 1  # it stopped after the first model step


@pytest.mark.django_db(transaction=True)
def test_it_runs_to_the_end_with_limits_off(owner: Any) -> None:
    session = actions.do_create_session(
        owner, limits={"max_turns": 0, "max_tool_calls": 0, "max_run_tokens": 0, "max_consecutive_failures": 0}
    )
    run = finished_run(owner, session, "what time is it")
    assert (run.status, run.stop_reason) == (Run.COMPLETED, "end_turn")
    assert last_assistant_text(fold_messages(journal_of(session))).startswith("get_time returned: ")


# ---- access ----


ACCESS = {
    # user: (read, write, approve); "ok", or the error raised
    "owner": ("ok", "ok", "ok"),
    "superuser": ("ok", "ok", "ok"),
    "moderator": ("ok", Forbidden, "ok"),
    "reviewer": ("ok", Forbidden, Forbidden),
    "teammate": (NotFound, NotFound, NotFound),
    "outsider": (NotFound, NotFound, NotFound),
    "anonymous": (NotFound, NotFound, NotFound),
}


@pytest.mark.django_db
@pytest.mark.parametrize("who", list(ACCESS))
def test_it_applies_the_access_rules(
    who: str,
    session: Session,
    owner: Any,
    teammate: Any,
    outsider: Any,
    superuser: Any,
    reviewer: Any,
    moderator: Any,
) -> None:
    users = {
        "owner": owner,
        "superuser": superuser,
        "moderator": moderator,
        "reviewer": reviewer,
        "teammate": teammate,
        "outsider": outsider,
        "anonymous": AnonymousUser(),
    }
    user = users[who]
    session.refresh_from_db()  # the reviewer and moderator fixtures moved it into their team
    for need, expected in zip(("read", "write", "approve"), ACCESS[who], strict=True):
        if expected == "ok":
            assert get_session_for_user(user, session.pk, need) == session  # type: ignore[arg-type]
        else:
            with pytest.raises(expected) as refused:  # type: ignore[call-overload]
                check_access(user, session, need)  # type: ignore[arg-type]
            assert isinstance(refused.value, SectrError)
    assert has_any_role(user, "moderator") == (who in ("superuser", "moderator"))
    assert has_any_role(user, "reviewer") == (who in ("superuser", "moderator", "reviewer"))


@pytest.mark.django_db
def test_it_answers_not_found_for_unknown_and_malformed_ids(owner: Any) -> None:
    for session_id in ("ses_missing", "", "x" * 41, None, 5):
        with pytest.raises(NotFound):
            get_session_for_user(owner, session_id)  # type: ignore[arg-type]


@pytest.mark.django_db
def test_it_lists_only_a_users_own_sessions(owner: Any, outsider: Any, make_session: Any) -> None:
    mine = make_session()
    theirs = make_session(outsider)
    assert list(visible_sessions(owner)) == [mine]
    assert list(visible_sessions(outsider)) == [theirs]


@pytest.mark.django_db
def test_it_lets_only_the_owner_or_a_superuser_post(
    owner: Any, superuser: Any, reviewer: Any, moderator: Any, outsider: Any, session: Session
) -> None:
    with writes_nothing(), pytest.raises(NotFound):
        actions.do_post_message(outsider, session.pk, "hi")
    for reader in (reviewer, moderator):
        with writes_nothing(), pytest.raises(Forbidden):
            actions.do_post_message(reader, session.pk, "hi")
    run = actions.do_post_message(superuser, session.pk, "hi from an admin")
    assert run.reason["author"] == "root"
