"""The worker, in this process: a Worker running as an asyncio task beside the test.

Runs complete; an approval ask suspends and a decision resumes; cancel and steer reach a
running run; a fenced worker writes nothing more; two workers never run one run; a run
whose lease expired is recovered by another worker (crash stitching); max_attempts ends
in a retryable failure; a commit wakes an idle worker long before its poll interval.

Run on SQLite (in-memory channel layer) and on PostgreSQL (Redis channel layer).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from datetime import timedelta
from typing import Any, ParamSpec, TypeVar

import pytest
from django.db import connection, transaction
from django.utils import timezone

from sectr import operations
from sectr.errors import LeaseLost
from sectr.events import TERMINAL_TYPES, Envelope, EventType
from sectr.fold import fold_messages, last_assistant_text
from sectr.journal import NewEvent
from sectr.providers import DemoProvider
from sectr.runtime import Runtime
from sessions_app import actions
from sessions_app import runs as runs_module
from sessions_app.dbthread import run_in_db_thread
from sessions_app.journal import DatabaseJournal, get_journal
from sessions_app.models import Envelope as EnvelopeRow
from sessions_app.models import Run, Session
from sessions_app.worker import Worker
from tests.server.conftest import compiled_models

E = EventType
P = ParamSpec("P")
R = TypeVar("R")

TICK = 0.1  # seconds between two `!slow` ticks (docs/journal.md)


class RecordingJournal(DatabaseJournal):
    """The database journal, remembering the LeaseLost errors its appends raised."""

    def __init__(self) -> None:
        super().__init__()
        self.lease_lost: list[tuple[str, int]] = []  # (session_id, last_seq when refused)

    async def append(self, session_id: str, events: Sequence[NewEvent], *, fence: Any = None) -> list[Envelope]:
        try:
            return await super().append(session_id, events, fence=fence)
        except LeaseLost:
            self.lease_lost.append((session_id, await run_in_db_thread(last_seq, session_id)))
            raise


def make_runtime() -> Runtime:
    return Runtime(RecordingJournal(), provider=DemoProvider(delay=0.001, slow_delay=TICK))


async def db(func: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
    return await run_in_db_thread(func, *args, **kwargs)


def last_seq(session_id: str) -> int:
    return EnvelopeRow.objects.filter(session_id=session_id).count()


def envelopes(session_id: str) -> list[Envelope]:
    return [row.to_envelope() for row in EnvelopeRow.objects.filter(session_id=session_id).order_by("seq")]


def types(session_id: str) -> list[str]:
    return list(EnvelopeRow.objects.filter(session_id=session_id).order_by("seq").values_list("type", flat=True))


def streamed_text(session_id: str) -> str:
    return "".join(e.payload.get("text", "") for e in envelopes(session_id) if e.type is E.MESSAGE_DELTA)


def ticks(text: str) -> list[int]:
    return [int(n) for n in re.findall(r"tick (\d+)", text)]


def run_of(run_id: str) -> Run:
    return Run.objects.get(pk=run_id)


async def wait_until(check: Callable[[], Any], timeout: float = 10.0, interval: float = 0.02) -> Any:
    """Poll `check` (sync, run in a database thread) until it returns something truthy."""
    deadline = time.monotonic() + timeout
    while True:
        value = await db(check)
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {getattr(check, '__name__', check)}")
        await asyncio.sleep(interval)


def run_in(*statuses: str) -> Callable[[str], Callable[[], Run | None]]:
    def for_run(run_id: str) -> Callable[[], Run | None]:
        def check() -> Run | None:
            run = Run.objects.get(pk=run_id)
            return run if run.status in statuses else None

        return check

    return for_run


finished = run_in(Run.SUSPENDED, Run.COMPLETED, Run.FAILED, Run.CANCELLED)


StartWorker = Callable[..., Awaitable[Worker]]


@pytest.fixture
async def start_worker() -> AsyncIterator[StartWorker]:
    """Start Workers (concurrency 4, poll 0.1 s, lease 2 s) as tasks; stopped after the test."""
    started: list[tuple[Worker, asyncio.Task[None]]] = []

    async def start(**options: Any) -> Worker:
        settings = {"concurrency": 4, "poll_interval": 0.1, "lease": 2.0, "runtime": make_runtime(), **options}
        worker = Worker(**settings)
        task = asyncio.ensure_future(worker.run(drain_timeout=5))
        started.append((worker, task))
        await asyncio.sleep(0)
        return worker

    yield start
    for worker, _task in started:
        worker.stop()
    for _worker, task in started:
        if not task.done():
            await asyncio.wait_for(task, 15)


async def new_session(owner: Any, **options: Any) -> Session:
    return await db(actions.do_create_session, owner, **options)


async def post(owner: Any, session: Session, content: str, **options: Any) -> Run:
    return await db(actions.do_post_message, owner, session.pk, content, **options)


def terminal_counts(session_id: str) -> dict[str, int]:
    """How many terminal envelopes each invocation of the session has."""
    counts: dict[str, int] = {}
    for envelope in envelopes(session_id):
        if envelope.type is E.INVOCATION_STARTED:
            counts.setdefault(envelope.invocation_id or "", 0)
        elif envelope.type in TERMINAL_TYPES:
            counts[envelope.invocation_id or ""] = counts.get(envelope.invocation_id or "", 0) + 1
    return counts


# ---- runs ----


@pytest.mark.django_db(transaction=True)
async def test_it_completes_queued_runs(owner: Any, start_worker: StartWorker) -> None:
    await start_worker()
    sessions = [await new_session(owner) for _ in range(3)]
    runs = [await post(owner, s, f"hello {i}") for i, s in enumerate(sessions)]
    for run in runs:
        await wait_until(finished(run.pk))

    for i, (session, run) in enumerate(zip(sessions, runs, strict=True)):
        done = await db(run_of, run.pk)
        assert (done.status, done.stop_reason, done.attempts) == (Run.COMPLETED, "end_turn", 1)
        assert done.lease_token is None and done.finished_at is not None
        assert done.usage == {"input_tokens": 2, "output_tokens": 4}  # "hello N" -> "You said: hello N"
        journal = await db(envelopes, session.pk)
        assert [e.type.value for e in journal if e.type is not E.MESSAGE_DELTA] == [
            "SESSION_CREATED",
            "SESSION_UPDATED",  # the first prompt titles the session
            "INVOCATION_STARTED",
            "MESSAGE_START",
            "MESSAGE_END",
            "INVOCATION_COMPLETED",
        ]
        assert last_assistant_text(fold_messages(journal)) == f"You said: hello {i}"
        state = (await db(Session.objects.get, pk=session.pk)).projection()
        assert (state.status, state.title, state.last_seq) == ("completed", f"hello {i}", len(journal))


@pytest.mark.django_db(transaction=True)
async def test_it_suspends_on_an_ask_and_a_decision_resumes_it(owner: Any, start_worker: StartWorker) -> None:
    await start_worker()
    session = await new_session(owner)
    run = await post(owner, session, "note: hello world")
    suspended = await wait_until(finished(run.pk))
    assert (suspended.status, suspended.stop_reason) == (Run.SUSPENDED, "awaiting_approval")
    state = (await db(Session.objects.get, pk=session.pk)).projection()
    assert state.status == "awaiting" and state.pending_ask is not None
    assert state.pending_ask["name"] == "write_note"

    resumed = await db(actions.do_decide, owner, state.pending_ask["ask_id"], "allow_once")
    done = await wait_until(finished(resumed.pk))
    assert (done.status, done.stop_reason) == (Run.COMPLETED, "end_turn")
    journal = await db(envelopes, session.pk)
    started = [e for e in journal if e.type is E.INVOCATION_STARTED]
    assert [e.payload["reason"]["kind"] for e in started] == ["user_message", "approval_decision"]
    assert started[1].payload["reason"]["decision"] == {"approved": True, "approver": "owner", "verdict": "allow_once"}
    result = next(e for e in journal if e.type is E.TOOL_RESULT)
    assert result.payload["name"] == "write_note" and not result.payload.get("is_error")
    assert last_assistant_text(fold_messages(journal)).startswith("write_note returned: ")
    state = (await db(Session.objects.get, pk=session.pk)).projection()
    assert state.status == "completed" and state.notes == {"hello world": "hello world"}
    assert await db(terminal_counts, session.pk) == {run.invocation_id: 1, resumed.invocation_id: 1}


# ---- cancel and steer reach a running run ----


@pytest.mark.django_db(transaction=True)
async def test_it_cancels_a_running_run_within_a_second_and_keeps_its_partial_text(
    owner: Any, start_worker: StartWorker
) -> None:
    await start_worker()
    session = await new_session(owner)
    run = await post(owner, session, "!slow 30")
    await wait_until(lambda: len(ticks(streamed_text(session.pk))) >= 3)

    asked = time.monotonic()
    await db(actions.do_cancel, owner, run.pk)
    cancelled = await wait_until(finished(run.pk), timeout=5, interval=0.01)
    took = time.monotonic() - asked
    assert took < 1.0, f"the cancel took {took:.2f}s"
    assert (cancelled.status, cancelled.stop_reason) == (Run.CANCELLED, "cancelled")

    journal = await db(envelopes, session.pk)
    assert journal[-1].type is E.INVOCATION_CANCELLED
    assert journal[-1].invocation_id == run.invocation_id
    assert journal[-1].payload.get("by") == owner.get_username()  # who stopped it is journaled
    end = next(e for e in journal if e.type is E.MESSAGE_END)
    assert end.payload["finish_reason"] == "cancelled"
    partial = last_assistant_text(fold_messages(journal))
    kept = ticks(partial)
    assert len(kept) >= 3 and kept == list(range(1, len(kept) + 1)) and kept[-1] < 30
    assert (await db(Session.objects.get, pk=session.pk)).status == "cancelled"
    # Nothing more is written after the cancel.
    await asyncio.sleep(3 * TICK)
    assert await db(last_seq, session.pk) == len(journal)


@pytest.mark.django_db(transaction=True)
async def test_a_stop_from_another_process_reaches_the_worker_through_its_control_group(
    owner: Any, start_worker: StartWorker, settings: Any
) -> None:
    """A Stop asked in another process is a poke on the channel layer, to the control
    group of the worker the run's row names as its lease owner: the worker joined it at
    its start (no run subscribes on its own) and re-reads the flag when poked, long
    before its heartbeat's look (once a second) would."""
    settings.REDIS_URL = settings.REDIS_URL or "redis://in-memory"  # poke_run sends through the layer
    worker = await start_worker(listen=True, lease=30.0)
    poked: list[str] = []
    check_cancel = worker._check_cancel

    async def recording(run_id: str) -> None:
        poked.append(run_id)
        await check_cancel(run_id)

    worker._check_cancel = recording  # type: ignore[method-assign]
    session = await new_session(owner)
    run = await post(owner, session, "!slow 30")
    await wait_until(lambda: len(ticks(streamed_text(session.pk))) >= 2)
    runs_module.local_listeners.discard(worker)  # as a worker of another process: the layer only

    asked = time.monotonic()
    await db(actions.do_cancel, owner, run.pk)
    cancelled = await wait_until(finished(run.pk), timeout=5, interval=0.01)
    took = time.monotonic() - asked
    assert poked == [run.pk]
    assert took < 1.0, f"the cancel took {took:.2f}s"
    assert (cancelled.status, cancelled.stop_reason, cancelled.lease_owner) == (
        Run.CANCELLED,
        "cancelled",
        worker.worker_id,
    )


@pytest.mark.django_db(transaction=True)
async def test_it_journals_a_steer_at_a_step_boundary_and_answers_it(owner: Any, start_worker: StartWorker) -> None:
    await start_worker()
    session = await new_session(owner)
    run = await post(owner, session, "!slow 10")
    await wait_until(lambda: len(ticks(streamed_text(session.pk))) >= 2)
    await db(actions.do_steer, owner, run.pk, "answer in French")
    done = await wait_until(finished(run.pk))
    assert (done.status, done.stop_reason) == (Run.COMPLETED, "end_turn")
    assert done.pending_steer == ""

    journal = await db(envelopes, session.pk)
    kinds = [e.type for e in journal if e.type is not E.MESSAGE_DELTA]
    steer_at = kinds.index(E.STEER_RECEIVED)
    # At the step boundary: after the slow message ended, before the next model step.
    assert kinds[steer_at - 1] is E.MESSAGE_END and kinds[steer_at + 1] is E.MESSAGE_START
    steer = next(e for e in journal if e.type is E.STEER_RECEIVED)
    assert steer.payload == {"text": "answer in French", "author": "owner"}
    messages = fold_messages(journal)
    assert ticks(messages[-3]["content"]) == list(range(1, 11))  # the slow reply, whole
    assert messages[-2] == {"role": "user", "content": "answer in French"}
    assert last_assistant_text(messages) == "Steer received: answer in French"


# ---- fencing, exclusivity, recovery ----


@pytest.mark.django_db(transaction=True)
async def test_it_writes_nothing_more_once_its_lease_is_taken_over(owner: Any, start_worker: StartWorker) -> None:
    worker = await start_worker()
    journal = worker.runtime.journal
    assert isinstance(journal, RecordingJournal)
    session = await new_session(owner)
    run = await post(owner, session, "!slow 30")
    await wait_until(lambda: len(ticks(streamed_text(session.pk))) >= 2)

    # Another worker takes the run over (its lease, far in the future: nobody recovers it).
    far = timezone.now() + timedelta(minutes=5)
    await db(lambda: Run.objects.filter(pk=run.pk).update(lease_token="taken-over", lease_expires_at=far))
    await wait_until(lambda: journal.lease_lost, timeout=5)
    refused_at = journal.lease_lost[0][1]
    await wait_until(lambda: not worker.tasks, timeout=5)
    await asyncio.sleep(5 * TICK)

    assert await db(last_seq, session.pk) == refused_at  # nothing written after the refusal
    kinds = await db(types, session.pk)
    assert not any(kind in {t.value for t in TERMINAL_TYPES} for kind in kinds)
    taken = await db(run_of, run.pk)
    assert (taken.status, taken.lease_token) == (Run.RUNNING, "taken-over")  # the row is the new owner's


@pytest.mark.django_db(transaction=True)
async def test_it_never_runs_one_run_on_two_workers(owner: Any, start_worker: StartWorker) -> None:
    first, second = await start_worker(), await start_worker()
    sessions = [await new_session(owner) for _ in range(20)]
    runs = [await post(owner, s, "!slow 3") for s in sessions]
    for run in runs:
        await wait_until(finished(run.pk), timeout=30)

    owners = set()
    for session, run in zip(sessions, runs, strict=True):
        done = await db(run_of, run.pk)
        assert (done.status, done.attempts, done.invocation_ids) == (Run.COMPLETED, 1, [run.invocation_id])
        owners.add(done.lease_owner)
        kinds = await db(types, session.pk)
        assert kinds.count("INVOCATION_STARTED") == 1 and "SESSION_ERROR" not in kinds
        assert await db(terminal_counts, session.pk) == {run.invocation_id: 1}
        assert ticks(await db(streamed_text, session.pk)) == [1, 2, 3]
    assert owners <= {first.worker_id, second.worker_id}


@pytest.mark.django_db(transaction=True)
async def test_it_recovers_a_run_whose_worker_stopped_answering(owner: Any, start_worker: StartWorker) -> None:
    crashed = await start_worker()
    session = await new_session(owner)
    run = await post(owner, session, "!slow 20")
    await wait_until(lambda: len(ticks(streamed_text(session.pk))) >= 4)

    # The first worker "dies": its run task stops dead (nothing journaled, lease kept)
    # and it claims nothing more.
    crashed.stop()
    crashed.tasks[run.pk].cancel()
    await wait_until(lambda: not crashed.tasks)
    dead_at = time.monotonic()
    held = await db(run_of, run.pk)
    assert held.status == Run.RUNNING and held.lease_owner == crashed.worker_id

    rescuer = await start_worker()
    done = await wait_until(finished(run.pk), timeout=15)
    assert time.monotonic() - dead_at < 2.0 + 10 * TICK + 20 * TICK + 2.0  # lease + the rest of the stream
    assert (done.status, done.stop_reason, done.attempts) == (Run.COMPLETED, "end_turn", 2)
    assert done.lease_owner == rescuer.worker_id and len(done.invocation_ids) == 2

    journal = await db(envelopes, session.pk)
    error_at = next(i for i, e in enumerate(journal) if e.type is E.SESSION_ERROR)
    error, restart = journal[error_at], journal[error_at + 1]
    assert error.invocation_id == run.invocation_id and error.payload["retryable"] is True
    assert error.payload["message_id"]  # it closes the message the dead worker left open
    assert restart.type is E.INVOCATION_STARTED
    assert restart.payload["reason"] == {"kind": "recover", "of_invocation_id": run.invocation_id}
    assert restart.invocation_id == done.invocation_id
    # The partial message is kept and the continuation picks up at the next tick.
    replies = [m for m in fold_messages(journal) if m["role"] == "assistant"]
    assert ticks("".join(m["content"] for m in replies)) == list(range(1, 21))
    assert journal[-1].type is E.INVOCATION_COMPLETED


@pytest.mark.django_db(transaction=True)
async def test_it_fails_a_run_retryably_after_max_attempts(owner: Any, start_worker: StartWorker) -> None:
    session = await new_session(owner)
    run = await post(owner, session, "!slow 20")

    def lost_three_times() -> None:
        # As if three workers in turn claimed the run, wrote a little and died.
        DatabaseJournal().append_sync(
            session.pk,
            [
                NewEvent(E.MESSAGE_START, {"message_id": "msg_dead", "role": "assistant"}, run.invocation_id),
                NewEvent(E.MESSAGE_DELTA, {"message_id": "msg_dead", "text": "tick 1 "}, run.invocation_id),
            ],
        )
        Run.objects.filter(pk=run.pk).update(
            status=Run.RUNNING,
            attempts=3,
            lease_owner="dead-worker",
            lease_token="dead",
            lease_expires_at=timezone.now() - timedelta(seconds=1),
        )

    await db(lost_three_times)
    await start_worker()
    failed = await wait_until(finished(run.pk))
    assert (failed.status, failed.stop_reason, failed.attempts) == (Run.FAILED, "error", 3)
    assert failed.lease_token is None
    journal = await db(envelopes, session.pk)
    assert [e.type for e in journal[-2:]] == [E.SESSION_ERROR, E.INVOCATION_FAILED]
    assert journal[-2].payload["message_id"] == "msg_dead"
    assert journal[-1].payload["retryable"] is True and journal[-1].invocation_id == run.invocation_id
    state = (await db(Session.objects.get, pk=session.pk)).projection()
    assert state.status == "failed" and state.last_error is not None and state.last_error["retryable"]
    # A person may retry it: the failure is retryable.
    retried = await db(actions.do_retry, owner, session.pk)
    assert (await wait_until(finished(retried.pk))).status == Run.COMPLETED


@pytest.mark.django_db(transaction=True)
async def test_it_starts_a_queued_run_on_commit_not_at_the_next_poll(owner: Any, start_worker: StartWorker) -> None:
    await start_worker(poll_interval=10.0)
    session = await new_session(owner)
    await asyncio.sleep(0.3)  # the worker has polled once and sleeps for 10 s
    posted = time.monotonic()
    run = await post(owner, session, "hello")
    await wait_until(run_in(Run.RUNNING, Run.COMPLETED)(run.pk), timeout=5, interval=0.01)
    took = time.monotonic() - posted
    assert took < 1.0, f"the run started {took:.2f}s after the commit"
    assert (await wait_until(finished(run.pk), timeout=5)).status == Run.COMPLETED


@pytest.mark.django_db(transaction=True)
async def test_it_starts_a_queued_message_when_the_active_run_ends(owner: Any, start_worker: StartWorker) -> None:
    await start_worker()
    session = await new_session(owner)
    first = await post(owner, session, "!slow 5")
    second = await post(owner, session, "second", queue=True)
    third = await post(owner, session, "third", queue=True)
    assert (second.status, third.status) == (Run.PENDING, Run.PENDING)
    for run in (first, second, third):
        assert (await wait_until(finished(run.pk))).status == Run.COMPLETED
    prompts = [
        e.payload["reason"]["input"]["content"]
        for e in await db(envelopes, session.pk)
        if e.type is E.INVOCATION_STARTED
    ]
    assert prompts == ["!slow 5", "second", "third"]


@pytest.mark.django_db(transaction=True)
async def test_it_does_not_lose_a_wake_up_that_arrives_while_it_claims(
    owner: Any, start_worker: StartWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    session = await new_session(owner)
    posted: list[Run] = []
    real_claim = runs_module.claim_next_runs

    def claim_then_post(worker_id: str, lease: float, limit: int, executing: Sequence[str] = (), **kw: Any) -> Any:
        claim = real_claim(worker_id, lease, limit, executing, **kw)
        if not posted:
            # Committed after this claim looked and found nothing: its wake-up arrives
            # while the worker is still busy claiming.
            posted.append(actions.do_post_message(owner, session.pk, "hello"))
        return claim

    monkeypatch.setattr(runs_module, "claim_next_runs", claim_then_post)
    await start_worker(poll_interval=10.0)
    await wait_until(lambda: posted, timeout=5)
    done = await wait_until(finished(posted[0].pk), timeout=5)
    assert done.status == Run.COMPLETED


@pytest.mark.django_db(transaction=True)
async def test_only_a_claim_the_poll_alone_asked_for_probes_first(
    owner: Any, start_worker: StartWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The poll of a worker nobody woke claims with `probe` (one statement that locks
    nothing, PostgreSQL); a claim after a wake-up (a run queued) claims at once."""
    session = await new_session(owner)
    calls: list[tuple[bool, int]] = []  # (probe, runs claimed) of each claim
    real_claim = runs_module.claim_next_runs

    def recorded(worker_id: str, lease: float, limit: int, executing: Sequence[str] = (), **kw: Any) -> Any:
        claims = real_claim(worker_id, lease, limit, executing, **kw)
        calls.append((bool(kw.get("probe")), len(claims)))
        return claims

    monkeypatch.setattr(runs_module, "claim_next_runs", recorded)
    polling = await start_worker(poll_interval=0.1)
    await wait_until(lambda: len(calls) >= 4, timeout=5)
    polling.stop()
    assert calls[0] == (False, 0)  # its first look, at its start
    assert set(calls[1:4]) == {(True, 0)}  # the polls of an empty queue
    calls.clear()
    await start_worker(poll_interval=30.0)  # no poll during the test: only its start's look and the wake-up's
    await wait_until(lambda: calls, timeout=5)
    run = await post(owner, session, "hello")
    done = await wait_until(finished(run.pk), timeout=5)
    assert done.status == Run.COMPLETED
    assert (False, 1) in calls and all(not probe for probe, _claimed in calls)


@pytest.mark.django_db(transaction=True)
async def test_the_expiry_sweep_tells_the_notification_sender_what_is_due(
    start_worker: StartWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sender does not look every second on its own: the expiry sweep's thread hop
    looks (anything_due) and tells it; then it claims and sends at once. After the
    sweep stops (a draining worker), it looks on its own again."""
    from sessions_app import worker as worker_module
    from sessions_app.moderation import notifications

    looks: list[float] = []
    due = [False]
    monkeypatch.setattr(notifications, "_deliver_in_thread", lambda limit: looks.append(time.monotonic()) or 0)
    monkeypatch.setattr(worker_module, "anything_due", lambda: due[0])
    worker = await start_worker(expiry_interval=0.1)
    assert worker.notifications.told
    await asyncio.sleep(2.5)
    assert len(looks) == 1  # its first look, at its start; the sweep found nothing due since
    due[0] = True
    told_at = time.monotonic()
    await asyncio.sleep(0.5)
    assert len(looks) >= 2 and looks[1] - told_at < 0.4
    due[0] = False
    worker.notifications.look_yourself()
    count = len(looks)
    await asyncio.sleep(1.5)
    assert len(looks) > count  # its own look, every interval again


@pytest.mark.django_db(transaction=True)
async def test_it_claims_and_cancels_side_by_side_without_deadlocks(
    owner: Any, start_worker: StartWorker, caplog: pytest.LogCaptureFixture
) -> None:
    await start_worker()
    await start_worker()
    sessions = [await new_session(owner) for _ in range(20)]

    def post_and_cancel(session: Session) -> Run:
        try:
            run = actions.do_post_message(owner, session.pk, "!slow 30")
            return actions.do_cancel(owner, run.pk)  # while the workers claim it
        finally:
            connection.close()

    # In threads of their own: the workers' journal threads stay free for the workers.
    runs = await asyncio.gather(*(asyncio.to_thread(post_and_cancel, s) for s in sessions))
    for session, run in zip(sessions, runs, strict=True):
        done = await wait_until(finished(run.pk), timeout=20)
        assert (done.status, done.stop_reason) == (Run.CANCELLED, "cancelled")
        assert await db(terminal_counts, session.pk) == {run.invocation_id: 1}
    assert "claiming failed" not in caplog.text and "deadlock" not in caplog.text.lower()


@pytest.mark.django_db(transaction=True)
async def test_it_ends_a_run_cancelled_while_its_worker_was_dead(owner: Any, start_worker: StartWorker) -> None:
    crashed = await start_worker()
    session = await new_session(owner)
    run = await post(owner, session, "!slow 20")
    await wait_until(lambda: len(ticks(streamed_text(session.pk))) >= 2)
    crashed.stop()
    crashed.tasks[run.pk].cancel()
    await wait_until(lambda: not crashed.tasks)

    await db(actions.do_cancel, owner, run.pk)  # nobody answers: the flag waits on the row
    await start_worker()
    done = await wait_until(finished(run.pk), timeout=10)
    assert (done.status, done.stop_reason, done.invocation_ids) == (Run.CANCELLED, "cancelled", [run.invocation_id])
    journal = await db(envelopes, session.pk)
    assert [e.type for e in journal[-2:]] == [E.MESSAGE_END, E.INVOCATION_CANCELLED]
    assert journal[-2].payload["finish_reason"] == "cancelled"
    assert {e.invocation_id for e in journal[-2:]} == {run.invocation_id}
    assert "SESSION_ERROR" not in await db(types, session.pk)  # cancelled, not recovered
    assert 2 <= len(ticks(last_assistant_text(fold_messages(journal)))) < 20


@pytest.mark.django_db(transaction=True)
async def test_it_finishes_its_runs_when_stopped(owner: Any, start_worker: StartWorker) -> None:
    worker = await start_worker()
    session = await new_session(owner)
    run = await post(owner, session, "!slow 5")
    await wait_until(lambda: ticks(streamed_text(session.pk)))
    worker.stop()
    assert (await wait_until(finished(run.pk), timeout=5)).status == Run.COMPLETED
    assert ticks(await db(streamed_text, session.pk)) == [1, 2, 3, 4, 5]


@pytest.mark.django_db(transaction=True)
async def test_it_hands_over_runs_it_could_not_finish_in_its_drain_time(owner: Any) -> None:
    leaving = Worker(concurrency=4, poll_interval=0.1, lease=30.0, runtime=make_runtime())
    task = asyncio.ensure_future(leaving.run(drain_timeout=0.3))
    session = await new_session(owner)
    run = await post(owner, session, "!slow 20")
    await wait_until(lambda: ticks(streamed_text(session.pk)))
    leaving.stop()
    await asyncio.wait_for(task, 10)
    released = await db(run_of, run.pk)
    # Not finished, but its 30 s lease is released: the next worker recovers it at once.
    assert released.status == Run.RUNNING
    assert released.lease_expires_at is not None and released.lease_expires_at <= timezone.now()
    written = await db(last_seq, session.pk)
    await asyncio.sleep(3 * TICK)
    assert await db(last_seq, session.pk) == written  # the stopped worker writes nothing more

    rescuer = Worker(concurrency=4, poll_interval=0.1, lease=30.0, runtime=make_runtime())
    rescue = asyncio.ensure_future(rescuer.run(drain_timeout=5))
    try:
        done = await wait_until(finished(run.pk), timeout=10)
    finally:
        rescuer.stop()
        await asyncio.wait_for(rescue, 10)
    assert (done.status, done.attempts) == (Run.COMPLETED, 2)
    replies = [m for m in fold_messages(await db(envelopes, session.pk)) if m["role"] == "assistant"]
    assert ticks("".join(m["content"] for m in replies)) == list(range(1, 21))


@pytest.mark.django_db(transaction=True)
async def test_it_starts_a_queued_message_whose_promotion_was_lost(owner: Any, start_worker: StartWorker) -> None:
    session = await new_session(owner)
    first = await post(owner, session, "first")
    second = await post(owner, session, "second", queue=True)

    def ended_without_promotion() -> None:
        # A worker journaled the end, recorded it on the row, and died before it could
        # start the queued message.
        end = NewEvent(E.INVOCATION_COMPLETED, {"stop_reason": "end_turn", "usage": {}}, first.invocation_id)
        DatabaseJournal().append_sync(session.pk, [end])
        Run.objects.filter(pk=first.pk).update(status=Run.COMPLETED, finished_at=timezone.now())

    await db(ended_without_promotion)
    await start_worker()
    done = await wait_until(finished(second.pk))
    assert done.status == Run.COMPLETED
    assert last_assistant_text(fold_messages(await db(envelopes, session.pk))) == "You said: second"


def strand_a_queued_message(owner: Any) -> tuple[Session, Run]:
    """A session whose queued message lost its promotion: its worker journaled the first
    run's end, recorded it on the row, and died before it could start the next."""
    session = actions.do_create_session(owner)
    first = actions.do_post_message(owner, session.pk, "first")
    second = actions.do_post_message(owner, session.pk, "second", queue=True)
    end = NewEvent(E.INVOCATION_COMPLETED, {"stop_reason": "end_turn", "usage": {}}, first.invocation_id)
    DatabaseJournal().append_sync(session.pk, [end])
    Run.objects.filter(pk=first.pk).update(status=Run.COMPLETED, finished_at=timezone.now())
    return session, second


@pytest.mark.django_db(transaction=True)
def test_the_stranded_look_is_compiled_once_and_finds_the_stranded(owner: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every worker looks for stranded messages once a second, idle or not: the statement
    is compiled once, and finds the sessions the queryset would."""
    from django.db.models.sql.compiler import SQLCompiler

    stranded, _waiting = strand_a_queued_message(owner)
    busy = actions.do_create_session(owner)  # a queued message behind a running one: not stranded
    actions.do_post_message(owner, busy.pk, "first")
    actions.do_post_message(owner, busy.pk, "second", queue=True)
    runs_module._stranded.clear()
    as_sql = SQLCompiler.as_sql
    compiled = compiled_models(monkeypatch)
    assert runs_module._stranded_pending_sessions() == [stranded.pk]
    assert runs_module._stranded_pending_sessions() == [stranded.pk]
    assert len(compiled) == 1, compiled
    monkeypatch.setattr(SQLCompiler, "as_sql", as_sql)
    expected = (
        Run.objects.filter(status=Run.PENDING)
        .exclude(session__status__in=("running", "awaiting"))
        .values_list("session_id", flat=True)
        .distinct()
    )
    assert list(expected) == [stranded.pk]


@pytest.mark.django_db(transaction=True)
def test_a_claim_keeps_its_runs_when_a_tidied_sessions_promotion_fails(
    owner: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The stranded messages are promoted after the claims committed: a promotion that
    fails is logged and tried again at the next tidying claim, and the runs claimed are
    the claimer's (raising, it lost them until their leases lapsed)."""
    from django.db import OperationalError

    stranded, waiting = strand_a_queued_message(owner)
    queued = actions.do_post_message(owner, actions.do_create_session(owner).pk, "hello")
    real_promote = runs_module.promote_pending_run

    def failing(session_id: str) -> Any:
        if session_id == stranded.pk:
            raise OperationalError("server closed the connection unexpectedly")
        return real_promote(session_id)

    monkeypatch.setattr(runs_module, "promote_pending_run", failing)
    lock = runs_module.LivenessLock("w-tidy")  # PostgreSQL: its claims stay its own
    lock.ensure()
    try:
        claims = runs_module.claim_next_runs("w-tidy", 60.0, 4, tidy_stranded=True)
        assert [c.run_id for c in claims] == [queued.pk]
        assert Run.objects.get(pk=queued.pk).lease_token == claims[0].token
        assert f"session {stranded.pk}: could not start its queued message" in caplog.text
        assert "server closed the connection unexpectedly" in caplog.text
        assert Run.objects.get(pk=waiting.pk).status == Run.PENDING  # still stranded: tried again later
        monkeypatch.setattr(runs_module, "promote_pending_run", real_promote)
        assert runs_module.claim_next_runs("w-tidy", 60.0, 4, [queued.pk], tidy_stranded=True) == []
        assert Run.objects.get(pk=waiting.pk).status == Run.QUEUED  # promoted this time, for the next claim
    finally:
        lock.release()


@pytest.mark.django_db(transaction=True)
async def test_a_steer_parked_while_the_run_ends_is_answered_not_lost(owner: Any, start_worker: StartWorker) -> None:
    from sectr.agent import default_handler
    from sectr.context import SessionContext

    rounds = 0

    async def late_steer_handler(ctx: SessionContext) -> None:
        # The steer lands after the handler's last step boundary, as if do_steer won the
        # race against the run's end: the journal must refuse the end and the runtime
        # must answer the steer.
        nonlocal rounds
        rounds += 1
        await default_handler(ctx)
        if rounds == 1:
            await db(
                lambda: Run.objects.filter(invocation_id=ctx.invocation_id).update(
                    pending_steer="turn left", steer_author="owner"
                )
            )

    runtime = Runtime(DatabaseJournal(), handler=late_steer_handler, provider=DemoProvider(delay=0))
    await start_worker(runtime=runtime)
    session = await new_session(owner)
    run = await post(owner, session, "hello")
    done = await wait_until(finished(run.pk), timeout=10)
    assert (done.status, done.stop_reason) == (Run.COMPLETED, "end_turn")
    assert rounds == 2
    journal = await db(envelopes, session.pk)
    types = [e.type for e in journal]
    assert types.count(E.INVOCATION_COMPLETED) == 1
    steer = next(e for e in journal if e.type is E.STEER_RECEIVED)
    assert steer.payload == {"text": "turn left", "author": "owner"}
    assert last_assistant_text(fold_messages(journal)) == "Steer received: turn left"
    assert (await db(Run.objects.get, pk=run.pk)).pending_steer == ""


@pytest.mark.django_db(transaction=True)
async def test_it_starts_at_most_its_start_window_of_runs_at_once(owner: Any, monkeypatch: Any) -> None:
    """Runs claimed but not at their first step yet count against START_WINDOW: the
    worker claims no more until one gets there (then the rest, as the window frees)."""
    from sessions_app import worker as worker_module

    monkeypatch.setattr(worker_module, "START_WINDOW", 3)
    monkeypatch.setattr(worker_module, "START_SECONDS", 60.0)
    release = asyncio.Event()
    runtime = make_runtime()
    real_run_invocation = runtime.run_invocation

    async def held_start(*args: Any, **kwargs: Any) -> Any:
        await release.wait()  # a context that takes long to load: no step boundary yet
        return await real_run_invocation(*args, **kwargs)

    monkeypatch.setattr(runtime, "run_invocation", held_start)
    posted = [await post(owner, await new_session(owner), "hi") for _ in range(6)]
    worker = Worker(concurrency=10, poll_interval=0.1, lease=30.0, runtime=runtime)
    task = asyncio.ensure_future(worker.run(drain_timeout=5))
    try:
        await wait_until(lambda: len(worker.tasks) == 3 or None, timeout=10)
        await asyncio.sleep(0.5)  # several polls: still three
        assert len(worker.tasks) == 3 and len(worker.starting) == 3
        release.set()  # they reach their first step; the window frees and the rest start
        for run in posted:
            assert (await wait_until(finished(run.pk), timeout=15)).status == Run.COMPLETED
    finally:
        release.set()
        worker.stop()
        await asyncio.wait_for(task, 15)
    assert not worker.starting


@pytest.mark.django_db(transaction=True)
def test_a_heartbeat_renews_only_the_leases_it_still_holds(owner: Any) -> None:
    sessions = [actions.do_create_session(owner) for _ in range(3)]
    for session in sessions:
        actions.do_post_message(owner, session.pk, "!slow 50")
    claims = runs_module.claim_next_runs("beating-worker", 60.0, 3)
    assert len(claims) == 3
    taken, kept = claims[0], claims[1:]
    Run.objects.filter(pk=taken.run_id).update(lease_token="another-workers-token", lease_expires_at=None)
    Run.objects.filter(pk=kept[1].run_id).update(cancel_requested=True, cancel_requested_by="alice")
    before = timezone.now()

    beats = runs_module.heartbeat_runs(claims, 120.0, renew=True)

    assert beats == {taken.run_id: (False, None), kept[0].run_id: (True, None), kept[1].run_id: (True, "alice")}
    assert Run.objects.get(pk=taken.run_id).lease_expires_at is None  # not renewed: not ours any more
    for claim in kept:
        renewed = Run.objects.get(pk=claim.run_id).lease_expires_at
        assert renewed is not None and renewed > before + timedelta(seconds=100)


@pytest.mark.django_db(transaction=True)
def test_a_claim_leaves_the_runs_the_claimer_is_executing(owner: Any) -> None:
    session = actions.do_create_session(owner)
    actions.do_post_message(owner, session.pk, "!slow 50")
    (claim,) = runs_module.claim_next_runs("starved-worker", 60.0, 4)
    # Its lease ran out while its worker was starved: the run looks abandoned to everyone.
    Run.objects.filter(pk=claim.run_id).update(lease_expires_at=timezone.now() - timedelta(hours=1))
    assert runs_module.claim_next_runs("starved-worker", 60.0, 4, executing=[claim.run_id]) == []
    assert Run.objects.get(pk=claim.run_id).lease_token == claim.token
    (taken,) = runs_module.claim_next_runs("other-worker", 60.0, 4)  # another worker recovers it
    assert taken.run_id == claim.run_id and taken.recovered


@pytest.mark.django_db(transaction=True)
def test_two_claimers_taking_batches_at_once_claim_every_run_exactly_once(owner: Any) -> None:
    """A batch is one transaction (SQLite: one BEGIN IMMEDIATE; PostgreSQL: SKIP LOCKED):
    two workers claiming batches of 16 side by side never take one run twice, and between
    them take every queued run. A run whose journal ended it before any claim is tidied,
    not claimed, and the batch takes the next one in its place."""
    import threading

    posted = [actions.do_post_message(owner, actions.do_create_session(owner).pk, "!slow 5").pk for _ in range(40)]
    ended = Run.objects.get(pk=posted[0])  # the oldest: ended in its journal, its row still queued
    cancel = operations.cancelled_events(ended.invocation_id, open_message_id=None, open_calls=(), by=None)
    get_journal().append_sync(ended.session_id, cancel)
    claimed: dict[str, list[str]] = {"w-one": [], "w-two": []}
    # Both claimers live (PostgreSQL: their liveness locks held), so neither takes the
    # other's running runs for a dead worker's.
    alive = [runs_module.LivenessLock(worker_id) for worker_id in claimed]
    for lock in alive:
        lock.acquire()
    start = threading.Barrier(2)

    def claim_all(worker_id: str) -> None:
        try:
            start.wait(10)
            while batch := runs_module.claim_next_runs(worker_id, 60.0, 16):
                claimed[worker_id] += [claim.run_id for claim in batch]
        finally:
            connection.close()

    threads = [threading.Thread(target=claim_all, args=(worker_id,)) for worker_id in claimed]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    for lock in alive:
        lock.release()
    first, second = claimed.values()
    every = first + second
    assert len(every) == len(set(every))  # nobody claimed a run twice, nor two claimers one
    assert set(every) == set(posted[1:])
    assert Run.objects.get(pk=ended.pk).status == Run.CANCELLED
    owners = dict(Run.objects.filter(pk__in=posted).values_list("pk", "lease_owner"))
    assert all(owners[run_id] == worker for worker, ids in claimed.items() for run_id in ids)
    assert all(Run.objects.get(pk=run_id).attempts == 1 for run_id in posted[1:])


@pytest.mark.django_db(transaction=True)
async def test_it_does_not_claim_again_while_the_queue_is_known_empty(
    owner: Any, start_worker: StartWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A claim that came back short says the queue is empty: runs ending (slots freeing)
    are no reason to look again, a run queued since is."""
    posted = [await post(owner, await new_session(owner), "!slow 2") for _ in range(8)]
    real_claim = runs_module.claim_next_runs
    calls: list[int] = []

    def counted(*args: Any, **kwargs: Any) -> Any:
        claims = real_claim(*args, **kwargs)
        calls.append(len(claims))
        return claims

    monkeypatch.setattr(runs_module, "claim_next_runs", counted)
    await start_worker(concurrency=16, poll_interval=30.0, lease=30.0)
    for run in posted:
        assert (await wait_until(finished(run.pk), timeout=15)).status == Run.COMPLETED
    # All eight in the first claim, which came back short; eight ends made no claim.
    assert calls == [8]
    late = await post(owner, await new_session(owner), "hi")  # queued since: looked for
    assert (await wait_until(finished(late.pk), timeout=10)).status == Run.COMPLETED
    assert calls[1:2] == [1]


@pytest.mark.django_db(transaction=True)
async def test_it_polls_on_time_however_often_it_is_woken(owner: Any, start_worker: StartWorker) -> None:
    """Wake-ups that queue nothing (a slot freeing up, a run reaching its first step) do not
    put the poll off: a run whose worker died is still recovered once its lease expires."""
    run = await post(owner, await new_session(owner), "!slow 3")
    (claim,) = await db(runs_module.claim_next_runs, "dead-worker", 0.3, 1)  # and it dies at once
    worker = await start_worker(poll_interval=0.5)

    async def nag() -> None:
        while True:
            worker._wake.set()
            await asyncio.sleep(0.05)

    nagging = asyncio.ensure_future(nag())
    try:
        done = await wait_until(finished(run.pk), timeout=15)
    finally:
        nagging.cancel()
    assert (done.status, done.attempts, done.lease_owner) == (Run.COMPLETED, 2, worker.worker_id)
    assert claim.run_id == run.pk


@pytest.mark.django_db(transaction=True)
async def test_it_claims_queued_runs_within_a_poll_interval_when_every_wake_up_is_lost(
    owner: Any, start_worker: StartWorker
) -> None:
    poll = 1.5
    worker = await start_worker(poll_interval=poll, lease=30.0)
    lost: list[float] = []
    worker._run_queued = lambda: lost.append(time.monotonic())  # type: ignore[method-assign]
    posted = [await post(owner, await new_session(owner), "hello") for _ in range(5)]
    for run in posted:
        assert (await wait_until(finished(run.pk), timeout=10)).status == Run.COMPLETED
    assert len(lost) >= len(posted)  # every commit woke it, and every wake-up was lost
    for run in posted:
        row = await db(run_of, run.pk)
        assert row.started_at is not None
        waited = (row.started_at - row.created_at).total_seconds()
        assert waited < poll + 1.0, f"claimed {waited:.2f} s after it was queued (poll every {poll} s)"


@pytest.fixture
def embedded(settings: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The embedded worker module with no worker started and no death behind it, and
    restart waits of 0.1 s doubling up to 0.4 s (2 s and 60 s in production)."""
    from sessions_app import worker as worker_module

    settings.SECTR_EMBEDDED_WORKER = True
    for name, value in (
        ("_embedded", None),
        ("_embedded_task", None),
        ("_restart_wait", 0.0),
        ("_restart_at", 0.0),
        ("_started_at", 0.0),
    ):
        monkeypatch.setattr(worker_module, name, value)
    monkeypatch.setattr(worker_module, "EMBEDDED_RESTART_MIN", 0.1)
    monkeypatch.setattr(worker_module, "EMBEDDED_RESTART_MAX", 0.4)
    return worker_module


def embedded_deaths(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "sectr.worker" and "embedded worker" in r.getMessage()]


async def until_started(worker_module: Any, timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while worker_module._embedded is None:
        assert time.monotonic() < deadline, "no embedded worker started"
        await asyncio.sleep(0.01)
    return worker_module._embedded


@pytest.mark.django_db(transaction=True)
async def test_an_embedded_workers_death_is_logged_and_another_starts_after_a_wait(
    owner: Any, embedded: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    real_adopt = embedded.adopt_server_loop
    calls: list[int] = []

    def adopt_failing_once() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("the worker's start failed")
        real_adopt()

    monkeypatch.setattr(embedded, "adopt_server_loop", adopt_failing_once)
    first = embedded.start_embedded_worker()
    dying = embedded._embedded_task
    assert first is not None and dying is not None
    with pytest.raises(RuntimeError):
        await dying
    died = embedded_deaths(caplog)
    assert [r.levelname for r in died] == ["ERROR"] and "another starts in 0.1 s" in died[0].getMessage()
    assert died[0].exc_info is not None and "the worker's start failed" in str(died[0].exc_info[1])
    assert embedded.start_embedded_worker() is None  # a connection during the wait starts none
    second = await until_started(embedded)  # the wait's timer did
    assert second is not first and len(calls) == 2
    try:
        run = await post(owner, await new_session(owner), "hello")
        assert (await wait_until(finished(run.pk), timeout=10)).status == Run.COMPLETED
    finally:
        second.stop()
        assert embedded._embedded_task is not None
        await asyncio.wait_for(embedded._embedded_task, 15)


@pytest.mark.django_db(transaction=True)
async def test_an_embedded_worker_that_dies_at_once_every_time_restarts_ever_less_often(
    owner: Any, embedded: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The wait after a death doubles while each worker dies soon after its start (within
    EMBEDDED_RESTART_MAX), up to that; a worker that lived longer starts the count again."""
    real_adopt = embedded.adopt_server_loop
    starts: list[float] = []

    def adopt() -> None:  # each worker's first step
        starts.append(time.monotonic())
        if len(starts) <= 5:
            raise RuntimeError("the worker's start failed")
        if len(starts) == 6:
            time.sleep(0.5)  # lives longer than EMBEDDED_RESTART_MAX, then dies
            raise RuntimeError("the worker failed later")
        real_adopt()

    monkeypatch.setattr(embedded, "adopt_server_loop", adopt)
    assert embedded.start_embedded_worker() is not None
    deadline = time.monotonic() + 20
    while len(starts) < 7:
        assert time.monotonic() < deadline, f"only {len(starts)} starts"
        await asyncio.sleep(0.01)
    last = await until_started(embedded)
    try:
        waits = [0.1, 0.2, 0.4, 0.4, 0.4, 0.5 + 0.1]
        gaps = [later - earlier for earlier, later in zip(starts, starts[1:], strict=False)]
        assert all(wait <= gap < wait + 1.0 for wait, gap in zip(waits, gaps, strict=True)), gaps
        said = [re.search(r"another starts in (\S+) s", r.getMessage()) for r in embedded_deaths(caplog)]
        assert [m.group(1) for m in said if m] == ["0.1", "0.2", "0.4", "0.4", "0.4", "0.1"]
        run = await post(owner, await new_session(owner), "hello")
        assert (await wait_until(finished(run.pk), timeout=10)).status == Run.COMPLETED
    finally:
        last.stop()
        assert embedded._embedded_task is not None
        await asyncio.wait_for(embedded._embedded_task, 15)


@pytest.mark.django_db(transaction=True)
def test_the_claims_plain_query_finds_what_the_runnable_condition_does(make_session: Any) -> None:
    """`_lock_runnable` (the claim's statement, plain SQL) and the queryset of `_runnable`
    agree on every kind of Run row, in the same order, less the runs already seen."""
    now = timezone.now()
    lease, patience = timedelta(seconds=60), timedelta(seconds=runs_module.lease_seconds() * 10)
    holder = runs_module.LivenessLock("a-living-worker")
    holder.acquire()  # PostgreSQL: its runs are not abandoned (nothing on SQLite)
    rows = {
        "queued": {"status": Run.QUEUED},
        "released": {"status": Run.RUNNING, "lease_token": None, "lease_owner": "a-living-worker"},
        "leased": {"status": Run.RUNNING, "lease_token": "t", "lease_owner": "a-living-worker",
                   "lease_expires_at": now + lease},
        "expired long ago": {"status": Run.RUNNING, "lease_token": "t", "lease_owner": "a-living-worker",
                             "lease_expires_at": now - patience},
        "expired just now": {"status": Run.RUNNING, "lease_token": "t", "lease_owner": "a-living-worker",
                             "lease_expires_at": now - timedelta(seconds=1)},
        "owner gone": {"status": Run.RUNNING, "lease_token": "t", "lease_owner": "a-dead-worker",
                       "lease_expires_at": now + lease},
        "pending": {"status": Run.PENDING},
        "completed": {"status": Run.COMPLETED},
        "seen": {"status": Run.QUEUED},
    }  # fmt: skip
    made = {}
    for index, (name, fields) in enumerate(rows.items()):
        created_at = now - timedelta(seconds=100 - index)
        made[name] = Run.objects.create(session=make_session(), created_at=created_at, **fields)
    try:
        with transaction.atomic():
            found = [run.pk for run in runs_module._lock_runnable(now, [made["seen"].pk], 100)]
        expected = list(
            Run.objects.filter(runs_module._runnable(now))
            .exclude(pk=made["seen"].pk)
            .order_by("created_at", "id")
            .values_list("pk", flat=True)
        )
    finally:
        holder.release()
    assert found == expected
    names = {run.pk: name for name, run in made.items()}
    runnable = {"queued", "released", "expired long ago"}
    if connection.vendor == "postgresql":
        runnable.add("owner gone")
    else:
        runnable.add("expired just now")
    assert {names[pk] for pk in found} == runnable
