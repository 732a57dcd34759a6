"""The Run lifecycle: every change of a Run row's status, lease or control slots.

A Run is one client-visible run (docs/sessions.md) and the work queue's row for it. This
module is the only code that changes a Run row; actions call it for the changes people
and programs ask for, the worker (sessions_app.worker, the asyncio loop) for the ones
it makes as it claims, executes and heartbeats. Nothing else saves a Run.

The states and every transition, with the function that makes it and who calls it, are
in one table: docs/architecture.md, "The Run state machine" (keep it in step with this
module).

The fence. A worker's journal writes carry (run id, lease token). Inside every fenced
append, DatabaseJournal (sessions_app.journal.database) locks the Run row after the
Session row and refuses the write (LeaseLost) unless the row still carries that token
and is not finished: the lease columns written here are what fences a presumed-dead
worker. So a run's row is finished with its terminal envelope, in the append's
transaction (`finish_statement`, which the journal runs for a fenced terminal append:
the statement lives here), or after it (`finish_run`), never before.

Locking order, everywhere: the Session row, then the Run row (the journal's order). The
other order deadlocks against a cancel or a steer.

How the ends of a run look in the journal (orphaned tool results, the terminal
envelope) is decided in the core, sectr.operations (`cancelled_events`,
`lost_run_failed_events`), for the runtime and this module alike.

Wake-ups: a queued run wakes the workers after commit (the channel layer for other
processes, `LocalListeners` for a worker in this process); a cancel request pokes the
worker that holds the run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import select
import threading
import time
import uuid
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Protocol, cast

from django.conf import settings
from django.db import connection, transaction
from django.db.models import BooleanField, Field, Q, QuerySet
from django.db.models.expressions import RawSQL
from django.utils import timezone

from sectr import operations
from sectr.errors import LeaseLost, StaleRunControl
from sectr.events import Envelope, EventType
from sectr.fold import fold_messages, open_tool_calls
from sectr.journal import NewEvent
from sectr.state import SessionState
from sessions_app.attribution import current_api_token_key
from sessions_app.compiled import Compiled
from sessions_app.journal import get_journal
from sessions_app.journal.database import RunFence
from sessions_app.journal.publish import poke_run_control, wake_workers_on_commit
from sessions_app.models import Run, Session
from sessions_app.plain_sql import hot_cursor, insert_instance, model_columns, model_instances
from sessions_app.telemetry import metrics

log = logging.getLogger("sectr.runs")

#: Runs that still hold (or wait for) a worker.
ACTIVE_RUN_STATUSES = (Run.QUEUED, Run.RUNNING)
TERMINAL_RUN_STATUS = {
    EventType.INVOCATION_COMPLETED: Run.COMPLETED,
    EventType.INVOCATION_SUSPENDED: Run.SUSPENDED,
    EventType.INVOCATION_FAILED: Run.FAILED,
    EventType.INVOCATION_CANCELLED: Run.CANCELLED,
}


def lease_seconds() -> float:
    return float(settings.SECTR_LEASE_SECONDS)


@dataclass(frozen=True)
class Claim:
    """A worker's hold on a running run: its lease token is the journal fence."""

    run_id: str
    session_id: str
    invocation_id: str
    token: str
    recovered: bool
    #: The claim found the run's steer slot empty: its first step boundary need not read
    #: it again a moment later (take_parked_steer says why a steer parked since is safe).
    steer_slot_empty: bool = False
    #: The session as the claim read it, locked (its state and team id), for the run's
    #: start (sessions_app.runtime.session_start); None for a recovery, which journaled
    #: since. Whether nothing was journaled since the claim is checked as it starts.
    session: tuple[SessionState, int | None] | None = field(default=None, compare=False, repr=False)
    #: With `session` on PostgreSQL: the transcript since its newest compaction, read in
    #: the claim's transaction for the whole batch (one statement for all its runs, where
    #: each run's start read its own: a statement and a thread hop fewer per run). The
    #: start takes it as it is: what is journaled between the claim and the start (a
    #: rename, a setting: a window of milliseconds) reaches the run as if it came just
    #: after the start (the journal's own state stays right: appends read the row).
    transcript: list[Envelope] | None = field(default=None, compare=False, repr=False)

    @functools.cached_property
    def fence(self) -> RunFence:
        """The journal fence of this claim's writes, one object for the claim's life: the
        append of the run's terminal event records the run's end with it (`RunFence`)."""
        return RunFence(self.run_id, self.token, finish_statement)


# ---- listeners in this process (the embedded worker, test workers) ----


class RunListener(Protocol):
    def wake_threadsafe(self) -> None: ...

    def poke_threadsafe(self, run_id: str) -> None: ...


class LocalListeners:
    """Workers of this process that want to hear of queued runs and cancel requests at
    once, without the channel layer (which the in-memory layer cannot carry across
    event loops, and which delayed the embedded worker's frames)."""

    def __init__(self) -> None:
        self._listeners: set[RunListener] = set()
        self._lock = threading.Lock()

    def add(self, listener: RunListener) -> None:
        with self._lock:
            self._listeners.add(listener)

    def discard(self, listener: RunListener) -> None:
        with self._lock:
            self._listeners.discard(listener)

    def snapshot(self) -> list[RunListener]:
        with self._lock:
            return list(self._listeners)

    def wake(self) -> None:
        for listener in self.snapshot():
            listener.wake_threadsafe()

    def poke(self, run_id: str) -> None:
        for listener in self.snapshot():
            listener.poke_threadsafe(run_id)


local_listeners = LocalListeners()


def _wake_on_commit() -> None:
    wake_workers_on_commit()  # workers in other processes, through the channel layer
    transaction.on_commit(local_listeners.wake)  # a worker in this process (the embedded one)


def poke_run(run_id: str, worker_id: str | None) -> None:
    """Tell the worker holding `run_id` (`worker_id`, its row's lease owner) to re-read
    its cancel flag now. A run no worker holds needs no poke: its claim, which locks its
    row after the caller's change committed, reads the flag and the steer slot itself."""
    local_listeners.poke(run_id)
    # The in-memory layer cannot reach other processes.
    if worker_id and getattr(settings, "REDIS_URL", ""):
        poke_run_control(run_id, worker_id)


def poke_run_on_commit(run: Run) -> None:
    """`poke_run` once the caller's transaction commits, to the worker that holds `run`
    as the caller locked it (no other worker can claim it before that commit)."""
    run_id, worker_id = run.pk, run.lease_owner
    transaction.on_commit(lambda: poke_run(run_id, worker_id))


# ---- queue (inside the caller's session lock) ----


def queue_run(session: Session, invocation_id: str, events: list[NewEvent]) -> Run:
    """Journal the events that start an invocation and queue its Run.

    Precondition: `session` is the row as the caller locked it in the current
    transaction (actions' `_locked`); the append reuses it (no second lock and read)."""
    envelopes = get_journal().append_sync(session.pk, events, locked=session)
    start = next(e for e in envelopes if e.type is EventType.INVOCATION_STARTED)
    run = Run(
        session=session,
        invocation_id=invocation_id,
        invocation_ids=[invocation_id],
        reason=start.payload["reason"],
        status=Run.QUEUED,
        start_seq=start.seq,
        api_token_key=current_api_token_key.get(),
    )
    insert_instance(connection, run)  # Run.objects.create, without compiling the INSERT
    if session.closed_at is not None:
        Session.objects.filter(pk=session.pk).update(closed_at=None)
    _wake_on_commit()
    return run


def queue_pending_run(session: Session, reason: dict[str, Any]) -> Run:
    """A run that waits behind the active one; nothing is journaled until it is promoted."""
    return Run.objects.create(
        session=session, reason=reason, status=Run.PENDING, api_token_key=current_api_token_key.get()
    )


def has_pending_run(session: Session) -> bool:
    """Whether a message waits behind the session's active run. Plain SQL: every run's
    POST asks, and the queryset's compilation cost more than the read."""
    qn = connection.ops.quote_name
    with hot_cursor(connection) as cursor:
        cursor.execute(
            f"SELECT 1 FROM {qn(Run._meta.db_table)} WHERE {qn('session_id')} = %s AND {qn('status')} = %s LIMIT 1",  # noqa: S608 - quoted names
            [session.pk, Run.PENDING],
        )
        return cursor.fetchone() is not None


def has_active_run(session: Session) -> bool:
    return Run.objects.filter(session=session, status__in=ACTIVE_RUN_STATUSES).exists()


def promote_pending_run(session_id: str) -> Run | None:
    """Start the oldest pending run of an idle session (called when a run ends)."""
    # Nearly every run ends with nothing queued behind it: one unlocked look settles that
    # instead of a transaction that locks the session. No race: a message is queued as
    # a pending run only while a run is active (do_post_message, under the session's
    # lock), so one queued before the caller's run ended is seen here, and one posted
    # after it starts at once.
    # Plain SQL: every run's end asks, and the queryset's compilation cost more than the read.
    table = connection.ops.quote_name(Run._meta.db_table)
    with hot_cursor(connection) as cursor:
        cursor.execute(
            f"SELECT 1 FROM {table} WHERE session_id = %s AND status = %s LIMIT 1",  # noqa: S608 - quoted name
            [session_id, Run.PENDING],
        )
        if cursor.fetchone() is None:
            return None
    with transaction.atomic():
        session = Session.objects.select_for_update().filter(pk=session_id).first()
        if session is None:
            return None
        state = session.projection()
        if state.is_active or state.status == "awaiting":
            return None
        run = Run.objects.filter(session=session, status=Run.PENDING).order_by("created_at", "id").first()
        if run is None:
            return None
        if run.reason.get("kind") == "retry":
            if not (state.status == "failed" and state.last_error and state.last_error.get("retryable")):
                Run.objects.filter(pk=run.pk).update(
                    status=Run.CANCELLED, finished_at=timezone.now(), error="no longer retryable"
                )
                return None
            invocation_id, events = operations.retry_events(state)
        else:
            content = run.reason["input"]["content"]
            invocation_id, events = operations.message_events(state, content, author=run.reason.get("author"))
        envelopes = get_journal().append_sync(session.pk, events)
        start = next(e for e in envelopes if e.type is EventType.INVOCATION_STARTED)
        run.invocation_id = invocation_id
        run.invocation_ids = [invocation_id]
        run.reason = start.payload["reason"]
        run.status = Run.QUEUED
        run.start_seq = start.seq
        run.save(update_fields=["invocation_id", "invocation_ids", "reason", "status", "start_seq"])
        _wake_on_commit()
        return run


# ---- claim, recover (sync, in a database thread) ----


def claim_next_run(worker_id: str, lease: float) -> Claim | None:
    """Claim the oldest runnable run (see `claim_next_runs`), or None."""
    claims = claim_next_runs(worker_id, lease, 1)
    return claims[0] if claims else None


#: Pause before looking again when every candidate's session was locked by someone else.
_BUSY_PAUSE = 0.01


def claim_next_runs(
    worker_id: str,
    lease: float,
    limit: int,
    executing: Collection[str] = (),
    *,
    tidy_stranded: bool = True,
    probe: bool = False,
) -> list[Claim]:
    """Claim up to `limit` of the oldest runnable runs: queued, or running with an
    expired lease (or, on PostgreSQL, a dead owner), in one thread hop. Never one of
    `executing`, the runs the caller is executing itself: one that looks abandoned (its
    lease ran out while the worker was starved, or its liveness lock's connection died
    an instant before this claim) is still the caller's, and claiming it again would
    run it twice in one worker.

    A run whose lease expired is recovered here, under the session lock, in the same
    transaction as its claim. On PostgreSQL a batch is claimed in one transaction that
    never waits for a lock (`_claim_batch`); a batch that found every candidate's
    session held by someone looks again after a moment. On SQLite, which has one writer,
    the batch is claimed in one IMMEDIATE transaction too (`_claim_sqlite_batch`).

    With `tidy_stranded`, sessions whose queued message lost its promotion are looked for
    first (`_stranded_pending_sessions`); a worker asks for that once a poll interval, not
    at every claim of a burst.

    With `probe` (PostgreSQL), one statement outside any transaction looks whether any
    run is runnable first (`_any_runnable`), and the claim's transaction is only opened
    when one is: the worker's once-a-second poll of an empty queue, otherwise BEGIN, the
    locking SELECT and COMMIT, three round trips of every idle worker every second.
    """
    tidied: list[str] = _stranded_pending_sessions() if tidy_stranded else []
    try:
        if connection.vendor == "postgresql":
            if probe and not tidied and not _any_runnable(timezone.now(), executing):
                return []
            for _ in range(3):
                batch, busy = _claim_batch(worker_id, lease, limit, tidied, executing)
                if batch or not busy:
                    return batch
                time.sleep(_BUSY_PAUSE)  # their holders commit within milliseconds
            return batch
        return _claim_sqlite_batch(worker_id, lease, limit, tidied, executing)
    finally:
        # Runs ended here (their journal had ended them already, or they were lost too
        # often, or cancelled while their worker was dead) may free a queued message.
        # The claims are committed by now: a promotion that fails must not take them
        # away from the caller (they would wait for their leases to lapse). Its session
        # stays stranded, and the next tidying claim tries again.
        for session_id in dict.fromkeys(tidied):
            try:
                promote_pending_run(session_id)
            except Exception:
                log.exception("session %s: could not start its queued message; trying again later", session_id)


def _stranded_query() -> QuerySet[Run, str]:
    return (
        Run.objects.filter(status=Run.PENDING)
        .exclude(session__status__in=("running", "awaiting"))
        .values_list("session_id", flat=True)
        .distinct()[:20]
    )


#: _stranded_pending_sessions' statement, compiled once: its parameters are constants.
_stranded = Compiled(_stranded_query)


def _stranded_pending_sessions() -> list[str]:
    """Up to 20 sessions with a queued message but no run going (its promotion was lost:
    a worker died between recording a run's end and starting the next message).

    Every worker asks once a poll interval (a second), idle or not; compiling the
    queryset each time (a join, an exclude, DISTINCT) cost about 1 ms of CPU a look,
    more than the query itself and the largest of an idle worker's periodic costs."""
    return [row[0] for row in _stranded.rows()]


#: classid of the workers' session-level advisory locks (objid: hashtext(worker id)).
LIVENESS_LOCK_CLASS = 0x5EC7  # "SECT"
_OWNER_HOLDS_NO_LOCK = (
    "NOT EXISTS (SELECT 1 FROM pg_locks l WHERE l.locktype = 'advisory' AND l.granted"
    " AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
    " AND l.classid = %s AND l.objsubid = 2"
    " AND l.objid = hashtext(sessions_app_run.lease_owner)::oid)"
)


#: On PostgreSQL, how many leases past its expiry a run waits before it is taken over
#: while its owner still holds its liveness lock. An owner that holds it is alive (its
#: database session is); one that renews late is starved, typically, by an overloaded
#: machine, and taking its runs over makes the fleet redo them on top of the load
#: (bench/live.py at N=500: 242 recoveries in one run). A dead owner's runs (lock free)
#: are taken at once, whatever the lease says.
LIVE_OWNER_GRACE_LEASES = 4


def _runnable(now: Any) -> Q:
    # A running run without a lease token was released by its worker (release_lease).
    released = Q(status=Run.RUNNING, lease_token__isnull=True)
    if connection.vendor != "postgresql":
        return Q(status=Run.QUEUED) | released | Q(status=Run.RUNNING, lease_expires_at__lt=now)
    # A running run whose worker's liveness lock is free lost its worker (its database
    # session ended: kill -9, a crash, a lost machine's connection reset): recovered at
    # once instead of after the lease. The lease stays the fence: if that worker is in
    # fact alive, its writes are refused once the run is claimed.
    owner_gone = RawSQL(_OWNER_HOLDS_NO_LOCK, [LIVENESS_LOCK_CLASS], output_field=BooleanField())  # noqa: S611 - constant SQL
    patience = timedelta(seconds=lease_seconds() * LIVE_OWNER_GRACE_LEASES)
    return (
        Q(status=Run.QUEUED)
        | released
        | Q(owner_gone, status=Run.RUNNING)
        | Q(status=Run.RUNNING, lease_expires_at__lt=now - patience)
    )


class LivenessLock:
    """A worker's session-level advisory lock on PostgreSQL, held on a connection of its
    own for as long as the worker lives: PostgreSQL frees it the moment that connection
    dies, which tells claimers the worker is gone (see _runnable). Nothing on SQLite.

    `ensure()` takes it, and takes it again after its connection died while the worker
    lives (PostgreSQL restarted, the connection reset or its backend terminated); the
    worker calls it at its start, before each claim pass and every second. A refusal
    (PostgreSQL full: "sorry, too many clients already", or still starting) is logged and
    the next call tries again: the worker claims nothing meanwhile, but lives on. Until
    the lock is taken again the worker's runs look abandoned and another worker may take
    them over; the lease token fences the first worker's writes off, and its heartbeat
    stops those runs. `close()` releases it for good when the worker stops.
    """

    def __init__(self, worker_id: str) -> None:
        self.worker_id = worker_id
        self.connection: Any = None
        self._guard = threading.Lock()  # the worker's claim loop and its watcher both ensure()
        #: taken at least once: a later take is a take-over after a lost connection
        self._taken = False
        #: consecutive failed takes (one warning a streak, not one a second)
        self._refused = 0
        #: released for good (the worker stopped): never taken again
        self._closed = False
        #: times the lock was lost and taken again (for tests and logs)
        self.reacquired = 0

    def ensure(self) -> bool:
        """Whether the lock is held, taking it (again) when it is not. A failure to take
        it is logged, not raised: the caller claims nothing and asks again later."""
        if connection.vendor != "postgresql":
            return True
        import psycopg

        with self._guard:
            if self._closed:
                return False
            if self.connection is not None:
                if self.looks_held():
                    return True  # nothing came from the server: the same session, the lock ours
                try:
                    self.connection.execute("SELECT 1")  # something came: a notice, or the end
                    return True  # the same database session: the lock is still ours
                except psycopg.Error:
                    log.warning("worker %s: its liveness connection died; taking the lock again", self.worker_id)
                    self.release()
            again = self._taken
            try:
                self.acquire()
            except (psycopg.Error, RuntimeError) as exc:
                self._refused += 1
                if self._refused == 1:
                    log.warning("worker %s: liveness lock not taken yet (claiming nothing): %s", self.worker_id, exc)
                else:
                    log.debug("worker %s: liveness lock not taken yet: %s", self.worker_id, exc)
                return False
            if self._closed:  # closed while this take was under way: give it back
                self.release()
                return False
            if again:
                self.reacquired += 1
                log.warning("worker %s: liveness lock taken again", self.worker_id)
            elif self._refused:
                log.warning("worker %s: liveness lock taken after %d refusal(s)", self.worker_id, self._refused)
            self._refused = 0
            return True

    def looks_held(self) -> bool:
        """Whether the lock's connection is open and nothing has arrived on it: no round
        trip, no lock, safe from any thread. An idle session's server sends nothing until
        it ends it, and then says so (a restart's or pg_terminate_backend's FATAL
        message) or closes the socket: either makes the socket readable, and ensure()
        then asks with a query. A `SELECT 1` per check cost each idle worker two round
        trips a second (the watcher's and the poll's claim pass), and its backend as much.
        False when in doubt: ensure() looks properly."""
        conn = self.connection
        if conn is None or self._closed:
            return False
        try:
            readable, _, _ = select.select([conn.fileno()], [], [], 0)
        except Exception:  # closed meanwhile (fileno() raises), or a bad descriptor
            return False
        return not readable

    def close(self) -> None:
        """Release the lock for good (the worker stopped): no later ensure() takes it."""
        self._closed = True  # before the guard: a take under way gives its lock back
        with self._guard:
            self.release()

    def acquire(self) -> None:
        if connection.vendor != "postgresql":
            return
        import psycopg

        config = settings.DATABASES["default"]
        conn = psycopg.connect(
            dbname=config["NAME"], user=config.get("USER") or None, password=config.get("PASSWORD") or None,
            host=config.get("HOST") or None, port=str(config.get("PORT") or "") or None, autocommit=True,
            connect_timeout=5, application_name=f"sectr worker {self.worker_id} liveness",
        )  # fmt: skip
        try:
            row = conn.execute(
                "SELECT pg_try_advisory_lock(%s, hashtext(%s))", (LIVENESS_LOCK_CLASS, self.worker_id)
            ).fetchone()
        except BaseException:
            conn.close()
            raise
        if not row or not row[0]:
            conn.close()
            raise RuntimeError(f"another live worker holds the id {self.worker_id!r}")
        # Only now: looks_held() (from any thread) takes a connection for a held lock.
        self.connection = conn
        self._taken = True

    def release(self) -> None:
        if self.connection is not None:
            with contextlib.suppress(Exception):
                self.connection.close()
            self.connection = None


def _claim_sqlite_batch(
    worker_id: str, lease: float, limit: int, tidied: list[str], executing: Collection[str] = ()
) -> list[Claim]:
    """SQLite: up to `limit` claims in one IMMEDIATE transaction, which holds the
    database's only write lock from its BEGIN: no other claimer (or action) changes a
    row between the look and the claim, so every candidate listed is still runnable.

    One transaction a batch, not one a candidate: every BEGIN IMMEDIATE queues behind
    the appends of the runs already streaming, so claiming a burst of a hundred runs one
    transaction each kept the last of them waiting for seconds (bench/peers.py at N=100:
    POST to first chunk p99 11-20 s). Candidates its journal had ended already are
    tidied (`_take` returns None) and the next oldest are looked at, in the same
    transaction, until `limit` are claimed or none is left.
    """
    claims: list[Claim] = []
    seen: list[str] = [*executing]
    queued: list[Run] = []  # claimed queued runs, their rows written at the end (`_update_claimed`)
    with transaction.atomic():
        now = timezone.now()
        while len(claims) < limit:
            candidates = _lock_runnable(now, seen, limit - len(claims))
            if not candidates:
                break
            sessions = {session.pk: session for session in _lock_sessions({run.session_id for run in candidates})}
            for run in candidates:
                seen.append(run.pk)
                session = sessions.get(run.session_id)
                if session is None:
                    continue  # a run's row cannot outlive its session's; defensive
                claim = _take_in_batch(run, session, worker_id, lease, tidied, now, queued)
                if claim is not None:
                    claims.append(claim)
        _update_claimed(queued)
    return claims


def _claim_batch(
    worker_id: str, lease: float, limit: int, tidied: list[str], executing: Collection[str] = ()
) -> tuple[list[Claim], bool]:
    """PostgreSQL: up to `limit` claims in one transaction, and whether a candidate was
    skipped because someone held its session.

    The oldest runnable Run rows are locked with SKIP LOCKED (rows another worker is
    claiming right now are not even seen), then their sessions, SKIP LOCKED too. This
    transaction never waits for a lock, so taking the Run rows before the Session rows
    (the journal's order is the other way) cannot deadlock: whoever holds a session and
    waits for one of these runs (a cancel, a steer) goes on when this commits. Where
    both workers looked at the same oldest candidates and each tried them one by one
    in a transaction of their own, half the tries found the run taken (bench/live.py's
    100 runs posted at once: claims were 40% of a worker's CPU while they started).
    """
    claims: list[Claim] = []
    busy = False
    seen: list[str] = [*executing]
    queued: list[Run] = []  # claimed queued runs, their rows written at the end (`_update_claimed`)
    with transaction.atomic():
        now = timezone.now()
        # Again while candidates come back and the batch is short (some were tidied, or
        # their sessions busy): a short batch tells the worker the queue is empty.
        while len(claims) < limit:
            candidates = _lock_runnable(now, seen, limit - len(claims))
            if not candidates:
                break
            seen += [run.pk for run in candidates]
            sessions = {session.pk: session for session in _lock_sessions({run.session_id for run in candidates})}
            for run in candidates:
                session = sessions.get(run.session_id)
                if session is None:
                    busy = True  # an action holds it (a run's row cannot outlive its session's)
                    continue
                claim = _take_in_batch(run, session, worker_id, lease, tidied, now, queued)
                if claim is not None:
                    claims.append(claim)
        _update_claimed(queued)
        claims = _with_transcripts(claims)
    return claims, busy


def _with_transcripts(claims: list[Claim]) -> list[Claim]:
    """The claims, each fresh one with its transcript (`Claim.transcript`), all read in
    one statement under the sessions' locks: consistent with the state the claim read."""
    after = {
        claim.session_id: max(claim.session[0].compaction_seq, 1) - 1 for claim in claims if claim.session is not None
    }
    if not after:
        return claims
    transcripts = get_journal().transcripts_sync(after)
    return [
        dataclasses.replace(claim, transcript=transcripts[claim.session_id]) if claim.session is not None else claim
        for claim in claims
    ]


def _lock_runnable(now: Any, seen: Collection[str], limit: int) -> list[Run]:
    """`Run.objects.filter(_runnable(now)).exclude(pk__in=seen).order_by("created_at",
    "id")[:limit]`, on PostgreSQL `.select_for_update(skip_locked=True)`, in plain SQL:
    every claim runs it, and compiling the queryset was most of a claim's CPU (7-8% of a
    worker's under bench/peers.py at N=100). The same condition as `_runnable`."""
    qn = connection.ops.quote_name
    where, params = _runnable_where(now, seen)
    table = qn(Run._meta.db_table)
    with hot_cursor(connection) as cursor:
        cursor.execute(
            f"SELECT {model_columns(connection, Run, table)} FROM {table}"  # noqa: S608 - quoted names
            f" WHERE {where} ORDER BY {qn('created_at')}, {qn('id')} LIMIT %s"
            + (" FOR UPDATE SKIP LOCKED" if connection.vendor == "postgresql" else ""),
            [*params, limit],
        )
        rows = cursor.fetchall()
    runs: list[Run] = model_instances(connection, Run, rows)
    return runs


def _any_runnable(now: Any, seen: Collection[str]) -> bool:
    """Whether `_lock_runnable` could find a run, in one statement that locks nothing (in
    autocommit: no transaction of its own to begin and commit). It sees the rows other
    claimers hold locked as well, so it says no only when a claim would find nothing."""
    qn = connection.ops.quote_name
    where, params = _runnable_where(now, seen)
    with hot_cursor(connection) as cursor:
        cursor.execute(
            f"SELECT 1 FROM {qn(Run._meta.db_table)} WHERE {where} LIMIT 1",  # noqa: S608 - quoted names
            params,
        )
        return cursor.fetchone() is not None


def _runnable_where(now: Any, seen: Collection[str]) -> tuple[str, list[Any]]:
    """`_runnable(now)` without the runs of `seen`, as a WHERE clause and its parameters."""
    qn = connection.ops.quote_name
    postgres = connection.vendor == "postgresql"
    status, token, expires = qn("status"), qn("lease_token"), qn("lease_expires_at")
    expires_field = Run._meta.get_field("lease_expires_at")
    if postgres:
        patience = timedelta(seconds=lease_seconds() * LIVE_OWNER_GRACE_LEASES)
        where = (
            f"({status} = %s OR ({status} = %s AND {token} IS NULL) OR ({_OWNER_HOLDS_NO_LOCK} AND {status} = %s)"
            f" OR ({status} = %s AND {expires} < %s))"
        )
        params: list[Any] = [
            Run.QUEUED, Run.RUNNING, LIVENESS_LOCK_CLASS, Run.RUNNING, Run.RUNNING,
            expires_field.get_db_prep_value(now - patience, connection),
        ]  # fmt: skip
    else:
        where = f"({status} = %s OR ({status} = %s AND {token} IS NULL) OR ({status} = %s AND {expires} < %s))"
        params = [Run.QUEUED, Run.RUNNING, Run.RUNNING, expires_field.get_db_prep_value(now, connection)]
    if postgres:
        # One array parameter, the same text however many were seen: prepared (the text
        # of an IN list changed with every batch, so PostgreSQL planned each claim anew).
        where += f" AND NOT ({qn('id')} = ANY(%s))"
        params.append(list(seen))
    elif seen:
        where += f" AND NOT ({qn('id')} IN ({', '.join(['%s'] * len(seen))}))"
        params += list(seen)
    return where, params


def _lock_sessions(session_ids: Collection[str]) -> list[Session]:
    """`Session.objects.filter(pk__in=session_ids)`, on PostgreSQL
    `.select_for_update(skip_locked=True)`, in plain SQL for the reason `_lock_runnable`
    gives."""
    qn = connection.ops.quote_name
    table = qn(Session._meta.db_table)
    params: list[Any]
    if connection.vendor == "postgresql":  # one array parameter: one text, prepared
        where, params = f"{qn('id')} = ANY(%s) FOR UPDATE SKIP LOCKED", [list(session_ids)]
    else:
        where, params = f"{qn('id')} IN ({', '.join(['%s'] * len(session_ids))})", list(session_ids)
    with hot_cursor(connection) as cursor:
        cursor.execute(
            f"SELECT {model_columns(connection, Session, table)} FROM {table} WHERE {where}",  # noqa: S608 - quoted names
            params,
        )
        rows = cursor.fetchall()
    sessions: list[Session] = model_instances(connection, Session, rows)
    return sessions


#: Attempts without progress a released run has beyond max_attempts (see `_take`).
RELEASED_EXTRA_ATTEMPTS = 10

#: The Run columns a claim (`_take`) sets.
_CLAIM_FIELDS = (
    "invocation_id", "invocation_ids", "claimed_seq", "status", "attempts", "lease_owner", "lease_token",
    "lease_expires_at", "heartbeat_at", "started_at",
)  # fmt: skip


def _take_in_batch(
    run: Run, session: Session, worker_id: str, lease: float, tidied: list[str], now: Any, queued: list[Run]
) -> Claim | None:
    """`_take` inside a batch's transaction. A recovery (a RUNNING run) journals, so it
    runs in a savepoint of its own: when it fails, it is logged and skipped, and the rest
    of the batch goes on. A queued run's claimed row joins `queued`, which the caller
    writes in one UPDATE before its transaction commits (`_update_claimed`)."""
    if run.status != Run.RUNNING:
        return _take(run, session, worker_id, lease, tidied, now, queued)
    try:
        with transaction.atomic():
            return _take(run, session, worker_id, lease, tidied, now)
    except Exception:
        log.exception("recovering run %s failed", run.pk)
        return None


def _take(
    run: Run, session: Session, worker_id: str, lease: float, tidied: list[str], now: Any,
    queued: list[Run] | None = None,
) -> Claim | None:  # fmt: skip
    """Claim `run` (its row and its session's locked by the caller), or None when its
    journal ended it already (or it was lost too often, or cancelled while lost). With
    `queued`, a queued run's row is not written here but added to it, for the caller to
    write before it commits (`_update_claimed`)."""
    state = session.projection()
    if state.current_invocation_id != run.invocation_id or not state.is_active:
        # Its invocation already ended in the journal (the worker died after the
        # terminal append, or it was cancelled before any worker took it).
        _finish_run_from_state(run, state)
        tidied.append(session.pk)
        return None
    recovered = run.status == Run.RUNNING
    token = uuid.uuid4().hex
    appended: list[Envelope] = []  # the recovery's own events
    if recovered:
        if run.cancel_requested:
            _cancel_lost_run(run, state)
            tidied.append(session.pk)
            _count_lease_expiry("cancelled")
            return None
        progressed = run.claimed_seq is not None and session.last_seq > run.claimed_seq
        # A run its worker released (lease token None: the database went away under it)
        # did not take its worker down: it is not a poison run, and one database restart
        # can cost a run two or three attempts in a row (stopped, taken over while its
        # worker's liveness lock was gone, stopped again by a pooled connection that died
        # too). It still has a bound, so a run that keeps losing its database cannot grow
        # its journal for ever.
        allowed = run.max_attempts + (RELEASED_EXTRA_ATTEMPTS if run.lease_token is None else 0)
        if run.attempts >= allowed and not progressed:
            # Lost again without journaling anything: a poison run (one that takes
            # its worker down) is not retried for ever. One that keeps moving is
            # recovered however often its workers die (bench/chaos.py kills one
            # every 3 s: 8 of 901 runs failed while they were streaming fine).
            _fail_exhausted(run, state)
            tidied.append(session.pk)
            _count_lease_expiry("failed")
            return None
        _count_lease_expiry("recovered")
        invocation_id, events = operations.recover_events(
            state, run.invocation_id or "", error=f"worker {run.lease_owner} stopped answering"
        )
        appended = get_journal().append_sync(session.pk, events)
        run.invocation_id = invocation_id
        run.invocation_ids = [*run.invocation_ids, invocation_id]
    # Where this attempt starts: whatever is journaled after it is its progress.
    run.claimed_seq = appended[-1].seq if appended else session.last_seq
    run.status = Run.RUNNING
    run.attempts += 1
    run.lease_owner = worker_id
    run.lease_token = token
    run.lease_expires_at = now + timedelta(seconds=lease)
    run.heartbeat_at = now
    run.started_at = run.started_at or now
    if queued is not None and not recovered:
        queued.append(run)
    else:
        _update_columns(run, _CLAIM_FIELDS)  # the row is locked: only what a claim sets
    return Claim(
        run.pk, run.session_id, run.invocation_id or "", token, recovered, not run.pending_steer,
        None if recovered else (state, session.team_id),
    )  # fmt: skip


def _update_columns(run: Run, fields: Sequence[str]) -> None:
    """`run.save(update_fields=fields)` in plain SQL, each value through its field's own
    adapter: every claim saves its row, and compiling the ORM's UPDATE cost more than
    running it."""
    qn = connection.ops.quote_name
    assignments, params = [], []
    for name in fields:
        field = cast(Field, Run._meta.get_field(name))  # a concrete column of the model
        assignments.append(f"{qn(field.column)} = %s")
        params.append(field.get_db_prep_save(getattr(run, field.attname), connection))
    with hot_cursor(connection) as cursor:
        cursor.execute(
            f"UPDATE {qn(Run._meta.db_table)} SET {', '.join(assignments)} WHERE id = %s",  # noqa: S608 - quoted names
            [*params, run.pk],
        )


#: The Run columns the claim of a queued run sets (its invocation stays the one queued).
_QUEUED_CLAIM_FIELDS = tuple(name for name in _CLAIM_FIELDS if name not in ("invocation_id", "invocation_ids"))


def _update_claimed(runs: Sequence[Run]) -> None:
    """`_update_columns(run, _QUEUED_CLAIM_FIELDS)` of each of a batch's claimed queued
    runs (their rows locked by the caller), in one UPDATE: a claim of sixteen runs was
    sixteen statements. A column whose value is the same for every run (the status, the
    owner, the lease's expiry) is set once; one that differs (the token, the claimed
    seq) takes each run's through a CASE on the id."""
    if not runs:
        return
    qn = connection.ops.quote_name
    if connection.vendor == "postgresql":
        _update_claimed_postgres(runs)
        return
    assignments: list[str] = []
    params: list[Any] = []
    for name in _QUEUED_CLAIM_FIELDS:
        field = cast(Field, Run._meta.get_field(name))  # a concrete column of the model
        values = [field.get_db_prep_save(getattr(run, field.attname), connection) for run in runs]
        if all(value == values[0] for value in values):
            assignments.append(f"{qn(field.column)} = %s")
            params.append(values[0])
        else:
            assignments.append(f"{qn(field.column)} = CASE {qn('id')}{' WHEN %s THEN %s' * len(runs)} END")
            params += [v for run, value in zip(runs, values, strict=True) for v in (run.pk, value)]
    with hot_cursor(connection) as cursor:
        cursor.execute(
            f"UPDATE {qn(Run._meta.db_table)} SET {', '.join(assignments)}"  # noqa: S608 - quoted names
            f" WHERE {qn('id')} IN ({', '.join(['%s'] * len(runs))})",
            [*params, *(run.pk for run in runs)],
        )


def _update_claimed_postgres(runs: Sequence[Run]) -> None:
    """`_update_claimed` on PostgreSQL: each column's values as one array parameter,
    unnested beside the ids, so that the statement's text is the same for a batch of
    any size and runs prepared (a CASE per run made a new text, planned anew, at every
    batch)."""
    qn = connection.ops.quote_name
    columns: list[str] = []
    casts: list[str] = []
    params: list[Any] = [[run.pk for run in runs]]
    for name in _QUEUED_CLAIM_FIELDS:
        field = cast(Field, Run._meta.get_field(name))  # a concrete column of the model
        columns.append(qn(field.column))
        casts.append(f"%s::{field.db_type(connection)}[]")
        params.append([field.get_db_prep_save(getattr(run, field.attname), connection) for run in runs])
    names = [f"c{i}" for i in range(len(columns))]
    table = qn(Run._meta.db_table)
    with hot_cursor(connection) as cursor:
        cursor.execute(
            f"UPDATE {table} SET {', '.join(f'{c} = v.{n}' for c, n in zip(columns, names, strict=True))}"  # noqa: S608 - quoted names
            f" FROM unnest(%s::text[], {', '.join(casts)}) AS v(id, {', '.join(names)})"
            f" WHERE {table}.{qn('id')} = v.id",
            params,
        )


def _count_lease_expiry(outcome: str) -> None:
    """Count an expired lease (and a recovery) once its transaction commits."""

    def count() -> None:
        metrics.LEASE_EXPIRIES.labels(outcome).inc()
        if outcome == "recovered":
            metrics.RECOVERIES.inc()

    transaction.on_commit(count)


#: The Run columns `_end` writes (a cancel sets cancel_requested just before it).
_END_FIELDS = ("status", "stop_reason", "error", "lease_token", "lease_expires_at", "finished_at", "cancel_requested")


def _end(run: Run, status: str, stop_reason: str, *, error: str | None = None) -> None:
    """A finished row holds no lease (a late finish_run or fenced append is refused)."""
    run.status, run.stop_reason = status, stop_reason
    if error is not None:
        run.error = error
    run.lease_token, run.lease_expires_at = None, None
    run.finished_at = run.finished_at or timezone.now()
    run.save(update_fields=_END_FIELDS)


def _finish_run_from_state(run: Run, state: SessionState) -> None:
    """Bring a Run row in line with its journal (its terminal event is there already)."""
    status = {"awaiting": Run.SUSPENDED, "completed": Run.COMPLETED, "failed": Run.FAILED, "cancelled": Run.CANCELLED}
    _end(run, status.get(state.status, Run.FAILED), state.last_stop_reason or "")


def _fail_exhausted(run: Run, state: SessionState) -> None:
    error = f"the run was lost {run.attempts} times (its workers stopped answering)"
    events = operations.lost_run_failed_events(run.invocation_id, open_message_id=state.open_message_id, error=error)
    get_journal().append_sync(run.session_id, events)
    _end(run, Run.FAILED, "error", error=error)


def _cancel_lost_run(run: Run, state: SessionState) -> None:
    """End a run that was cancelled while its worker was dead, as its worker would have."""
    journal = get_journal()
    messages = fold_messages(journal.load_since_compaction_sync(run.session_id))
    events = operations.cancelled_events(
        run.invocation_id,
        open_message_id=state.open_message_id,
        open_calls=open_tool_calls(messages),
        by=run.cancel_requested_by or None,
    )
    journal.append_sync(run.session_id, events)
    _end(run, Run.CANCELLED, "cancelled")


# ---- while running (the worker) ----


def finish_run(claim: Claim, terminal: Envelope) -> bool:
    """Record a run's end on its row (only while this worker still holds the lease).

    One plain UPDATE, not the ORM's: every run of a burst ends with it, and compiling the
    query cost more than running it."""
    return _finish_run(claim, terminal)[0]


def finish_statement(
    connection: Any, run_id: str, token: str, terminal_type: EventType, payload: dict[str, Any], now: Any
) -> tuple[str, list[Any], bool]:
    """The UPDATE that records a run's end (its terminal event's type and payload) on its
    row while the row still carries `token`: (SQL, parameters, whether it returns a row).
    Where the database can (RETURNING: PostgreSQL, SQLite >= 3.35) it returns one row
    for the run it ended: whether the session has a pending run, so that the end needs
    no second statement to know whether a queued message is due.

    `_finish_run` runs it on its own; the journal runs it inside the append of the run's
    terminal event (DatabaseJournal, `RunFence`), on PostgreSQL as a part of that
    append's one statement."""
    status = TERMINAL_RUN_STATUS.get(terminal_type, Run.FAILED)
    stop = payload.get("stop_reason") or {
        Run.SUSPENDED: "awaiting_approval",
        Run.FAILED: "error",
        Run.CANCELLED: "cancelled",
    }.get(status, "")
    ops = connection.ops
    table = ops.quote_name(Run._meta.db_table)
    returning = bool(connection.features.can_return_columns_from_insert)
    pending = (
        f" RETURNING EXISTS (SELECT 1 FROM {table} AS queued"  # noqa: S608 - quoted name
        f" WHERE queued.session_id = {table}.session_id AND queued.status = %s)"
    )
    sql = (
        f"UPDATE {table} SET status = %s, stop_reason = %s, usage = %s, error = %s,"  # noqa: S608 - quoted name
        " lease_token = NULL, lease_expires_at = NULL, finished_at = %s WHERE id = %s AND lease_token = %s"
        + (pending if returning else "")
    )
    params = [
        status,
        stop,
        json.dumps(payload.get("usage") or {}),
        str(payload.get("error") or ""),
        ops.adapt_datetimefield_value(now),
        run_id,
        token,
        *([Run.PENDING] if returning else []),
    ]
    return sql, params, returning


def _finish_run(claim: Claim, terminal: Envelope) -> tuple[bool, bool]:
    """`finish_run`: (whether it recorded the end, whether the session has a pending
    run). The second comes back with the UPDATE (RETURNING), where the database can: one
    statement, not two, as every run ends; True where it cannot tell."""
    sql, params, returning = finish_statement(
        connection, claim.run_id, claim.token, terminal.type, terminal.payload, timezone.now()
    )
    with hot_cursor(connection) as cursor:
        cursor.execute(sql, params)
        if not returning:
            return cursor.rowcount == 1, True
        row = cursor.fetchone()
        return row is not None, row is None or bool(row[0])


def end_run(claim: Claim, terminal: Envelope) -> bool:
    """`finish_run`, then start the session's next queued message if it has one
    (`promote_pending_run`): what a worker does as each run ends, in one thread hop.

    When the append of the terminal event recorded the end already (in its transaction:
    `claim.fence.ended`), only the promotion is left, and only when a message waits."""
    ended = claim.fence.ended
    if ended is None:
        finished, pending = _finish_run(claim, terminal)
    else:
        finished, pending = True, ended
    if pending:  # nearly never: a message queued behind this run
        promote_pending_run(claim.session_id)
    return finished


def end_needs_database(claim: Claim) -> bool:
    """Whether `end_run` has anything to do in the database for this claim: not when
    the terminal event's append recorded the run's end and no message waits behind it
    (nearly every run), which spares the worker a thread hop as each run ends."""
    return claim.fence.ended is not False


def heartbeat_runs(claims: Sequence[Claim], lease: float, *, renew: bool) -> dict[str, tuple[bool, str | None]]:
    """Renew leases and read cancel flags: {run_id: (still held, who asked to cancel)}.

    "Who asked" is None when nobody did, else the username ("" when unknown).

    One UPDATE (when `renew`) and one SELECT for all of a worker's runs, instead of a
    query or two per run every second (a hundred runs made a hundred queries a second,
    each a thread hop and a pool checkout, on the worker that also journals their
    deltas). Without `renew` only the cancel flags are read and every lease counts as
    held (a poll between renewals).
    """
    if not claims:
        return {}
    if renew:
        now = timezone.now()
        renewed = {"lease_expires_at": now + timedelta(seconds=lease), "heartbeat_at": now}
        # Each claim's token is its own (a uuid4 per claim), so "id among ours and token
        # among ours" is "the row still holds its claim's token": two IN lists, where an
        # OR of a (id, token) pair per run cost more to compile than to run (a hundred
        # runs: 6% of the embedded server's CPU, py-spy).
        beating = Run.objects.filter(
            pk__in=[c.run_id for c in claims], lease_token__in=[c.token for c in claims], status=Run.RUNNING
        )
        if connection.vendor == "postgresql":
            # Only the rows nobody holds right now. A plain UPDATE of many rows locks them
            # in its scan order, while this worker's group commit holds some of them (its
            # fence checks) and waits for others: a deadlock, which PostgreSQL broke only
            # after deadlock_timeout (1 s), stalling every stream of the worker meanwhile
            # (bench/live.py: produced-to-appended p99 1 s). A row skipped now is renewed
            # at the next beat, lease/3 later; its lease still has two beats to go.
            free = beating.order_by("pk").select_for_update(no_key=True, skip_locked=True).values("pk")
            with transaction.atomic():
                Run.objects.filter(pk__in=free).update(**renewed)
        else:
            beating.update(**renewed)
    rows = {
        pk: (token, status, cancel_requested, cancel_by)
        for pk, token, status, cancel_requested, cancel_by in Run.objects.filter(
            pk__in=[c.run_id for c in claims]
        ).values_list("pk", "lease_token", "status", "cancel_requested", "cancel_requested_by")
    }
    beats: dict[str, tuple[bool, str | None]] = {}
    for claim in claims:
        row = rows.get(claim.run_id)
        if row is None:  # deleted with its session
            beats[claim.run_id] = (not renew, None)
            continue
        token, status, cancel_requested, cancel_by = row
        held = not renew or (token == claim.token and status == Run.RUNNING)
        beats[claim.run_id] = (held, cancel_by if cancel_requested else None)
    return beats


def release_lease(claim: Claim) -> None:
    """Let another worker recover the run at once: its worker stopped it (a shutdown past
    its drain time, the journal unavailable mid-run) and writes nothing more for it.

    The lease token goes (None: nobody holds the run, so a late write of this worker is
    fenced off), which `_runnable` takes as "claimable now": the worker still lives and
    holds its liveness lock, and an expiry alone would keep the run waiting out the
    living owner's grace (LIVE_OWNER_GRACE_LEASES). Nothing when the run is not this
    claim's any more."""
    Run.objects.filter(pk=claim.run_id, lease_token=claim.token, status=Run.RUNNING).update(
        lease_token=None, lease_expires_at=timezone.now()
    )


def take_parked_steer(claim: Claim) -> tuple[str, str | None] | None:
    """Empty the run's steer slot: (text, author), or None when it is empty.

    LeaseLost when this worker no longer holds the run.

    Every step boundary of every run asks, and the slot is nearly always empty: one
    plain read answers that (the locked take was a transaction and two compiled
    queries a step: 7% of a worker's CPU while 100 runs started). A steer parked just
    after the read is taken at the next boundary, or refused to the run's end by the
    completing fence check (SteerArrived), so it is never lost."""
    table = connection.ops.quote_name(Run._meta.db_table)
    with hot_cursor(connection) as cursor:
        cursor.execute(
            f"SELECT lease_token, pending_steer <> '' FROM {table} WHERE id = %s",  # noqa: S608 - quoted name
            [claim.run_id],
        )
        row = cursor.fetchone()
    if row is None or row[0] != claim.token:
        raise LeaseLost(f"run {claim.run_id}: lease lost")
    if not row[1]:
        return None
    with transaction.atomic():
        run = Run.objects.select_for_update().filter(pk=claim.run_id, lease_token=claim.token).first()
        if run is None:
            raise LeaseLost(f"run {claim.run_id}: lease lost")
        if not run.pending_steer:
            return None
        text, author = run.pending_steer, run.steer_author or None
        run.pending_steer, run.steer_author = "", ""
        run.save(update_fields=["pending_steer", "steer_author"])
        return text, author


# ---- controls people ask for (actions call these under the session lock) ----


def park_steer(run: Run, state: SessionState, text: str, author: str | None) -> Run:
    """Park a steer in the run's slot; its worker journals it at the next step boundary.

    Precondition: the caller holds the session's row lock (the Run row is locked here,
    after it)."""
    run = Run.objects.select_for_update().get(pk=run.pk)
    if run.status not in ACTIVE_RUN_STATUSES or state.current_invocation_id != run.invocation_id:
        raise StaleRunControl("the run has ended; send a new message instead")
    operations.check_steer(state, text)
    run.pending_steer = f"{run.pending_steer}\n\n{text}" if run.pending_steer else text
    run.steer_author = run.steer_author or (author or "")
    run.save(update_fields=["pending_steer", "steer_author"])
    poke_run_on_commit(run)
    return run


def cancel_run(run: Run, state: SessionState, by: str | None) -> tuple[Run, bool]:
    """Cancel a run: (the run, whether it ended here).

    A run no worker holds (pending, queued, suspended) ends here; a running one gets
    its cancel flag set and its worker poked, and ends when its worker sees it. The
    journal decides whether the run is still going, not the Run row: a worker updates
    its row just after it journals the run's end, and a cancel may fall in between.

    Precondition: the caller holds the session's row lock (the Run row is locked here,
    after it).
    """
    run = Run.objects.select_for_update().get(pk=run.pk)
    if run.status == Run.PENDING:
        run.status, run.stop_reason, run.finished_at = Run.CANCELLED, "cancelled", timezone.now()
        run.save(update_fields=["status", "stop_reason", "finished_at"])
        return run, False  # nothing was journaled: no next message is due
    ask = state.pending_ask
    if (
        run.status in (Run.SUSPENDED, Run.RUNNING)
        and state.status == "awaiting"
        and ask is not None
        and ask.get("invocation_id") == run.invocation_id
    ):
        # Paused on an ask (its worker may not have recorded that on the row yet):
        # withdraw the ask. Clearing the lease makes a late finish_run a no-op.
        get_journal().append_sync(run.session_id, operations.cancel_awaiting_events(state, by))
        _end(run, Run.CANCELLED, "cancelled")
        return run, True
    if run.status not in ACTIVE_RUN_STATUSES or state.current_invocation_id != run.invocation_id:
        raise StaleRunControl("the run has already ended")
    if run.status == Run.QUEUED and run.lease_token is None:
        # No worker holds it yet: end it here, under the lock, so no worker starts it.
        events = operations.cancelled_events(run.invocation_id, open_message_id=None, open_calls=(), by=by)
        get_journal().append_sync(run.session_id, events)
        run.cancel_requested = True
        _end(run, Run.CANCELLED, "cancelled")
        return run, True
    run.cancel_requested = True
    run.cancel_requested_by = by or ""
    run.save(update_fields=["cancel_requested", "cancel_requested_by"])
    poke_run_on_commit(run)
    return run, False
