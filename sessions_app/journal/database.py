"""DatabaseJournal: the sectr.journal.Journal protocol on Django's database.

Appends are atomic and gapless on SQLite and PostgreSQL. In one transaction an append
locks the Session row, reads last_seq, inserts the envelopes with the next seqs and
updates the Session row (last_seq and the cached projection). On PostgreSQL the lock is
``SELECT ... FOR NO KEY UPDATE`` on the Session row; on SQLite the settings' IMMEDIATE
transaction mode takes the database's write lock at BEGIN, which serialises writers
just as well. The unique (session, seq) constraint is the last line of defence.

Locking order: Session row, then Run row (the fence). Code that locks both in one
transaction (cancel, steer, claiming or finishing a run: sessions_app.runs) take them in
the same order, the Session row first, or PostgreSQL may have to break a deadlock.

Fencing: ``fence=(run_id, lease_token)``. Inside the append's transaction, after the
Session lock, the Run row is locked and must still carry that lease_token and not be
finished (suspended, completed, failed, cancelled, or finished_at set); otherwise
LeaseLost is raised and nothing is written. A worker therefore journals a run's
terminal envelope before (or in the same transaction as, ahead of) marking the run
finished: a fenced append of the run's terminal event finishes the row itself, in its
transaction (`RunFence`).

Streaming fast path: MESSAGE_DELTA changes nothing in the projection but last_seq and
updated_at, so a batch made only of deltas bumps those two columns with one
``UPDATE ... RETURNING last_seq`` (which is also the row lock) and leaves the state JSON
alone; `Session.projection()` takes last_seq from the column. updated_at moves only when
it is UPDATED_AT_STEP (a second) behind, so most of these UPDATEs change no indexed
column (PostgreSQL's HOT updates; on SQLite, which rewrites the indexes of every
column an UPDATE assigns, the bump leaves updated_at out and a second UPDATE moves it
when it is behind, `_sqlite_bump`). On PostgreSQL the deltas of a group commit (many
streams at once) go further: one statement locks their sessions in id order, then their
fences' Run rows in id order, checks the fences, bumps all their last_seq and inserts
every envelope (`_bump_and_insert_deltas`), instead of two or three statements per
append. A group made only of deltas is that one statement in autocommit (no BEGIN or
COMMIT: a statement is atomic); when a fence refuses, it writes nothing and the group
goes append by append. That statement is prepared on the server (`_prepared_cursor`):
PostgreSQL planned it anew for every chunk, and the plan cost more than the write.
In a group with other appends (a run starting or ending) those
go append by append in the same transaction, every session locked first in id order. SQLite (3.35 or newer: UPDATE ...
FROM and RETURNING) takes the same path, its sessions and fences named by one JSON
parameter read with json_each, and no row locks (its transaction holds the database's
write lock).

A lost database (PostgreSQL restarted, a backend terminated, the pool timed out) is
JournalUnavailable to every async caller of `run_in_db_thread`, the journal's own methods
and any other read or write a run makes (its team's rules, its media, its steer slot):
not the invocation's failure; the runtime stops and the worker lets the run be
recovered. The first such error has the process's pools test their idle connections.

Sync methods (`append_sync`, `load_sync`, `load_since_compaction_sync`, `state_sync`)
are for code that already runs in a thread, such as actions inside their own
``transaction.atomic()``: `append_sync` joins the caller's transaction and publishes on
its commit. The async protocol methods run the same code in a thread pool (not the one
thread-sensitive thread: many invocations append at once), closing stale connections
around the work like channels' database_sync_to_async, and publish after the commit.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar, cast

from django.conf import settings
from django.db import (
    DEFAULT_DB_ALIAS,
    InterfaceError,
    OperationalError,
    connections,
    transaction,
)
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Field, Q
from django.utils import timezone

from sectr.asks import ask_changes
from sectr.errors import LeaseLost, NotFound, SteerArrived
from sectr.events import Envelope, EventType
from sectr.journal import NewEvent
from sectr.loops import PerLoop
from sectr.payloads import strings_only
from sectr.state import SessionState, apply_envelope
from sessions_app import models
from sessions_app.dbthread import (
    LOST_DATABASE_ERRORS,
    database_unavailable,
    reset_connection,
    run_in_db_thread,
    run_plain_in_db_thread,
)
from sessions_app.journal.ask_index import update_ask_index
from sessions_app.journal.moderation import record_moderation
from sessions_app.journal.projections import ReviewProjection
from sessions_app.journal.publish import publish_on_commit, queue_publications
from sessions_app.plain_sql import hot_cursor, kept_converters
from sessions_app.plain_sql import prepared_cursor as _prepared_cursor
from sessions_app.telemetry.metrics import appended_numbers, count_appended_numbers
from sessions_app.telemetry.tracing import observe_decisions_on_commit

logger = logging.getLogger("sectr.journal")

#: (run_id, lease_token) of the worker that writes.
Fence = tuple[str, str]


#: What ends a run's row (`sessions_app.runs.finish_statement`, which the run lifecycle
#: owns): (connection, run id, lease token, terminal type, its payload, now) -> (SQL,
#: parameters, whether it returns a row: whether the session has a pending run).
FinishStatement = Callable[
    [BaseDatabaseWrapper, str, str, EventType, dict[str, Any], datetime], tuple[str, list[Any], bool]
]


class RunFence(tuple[str, str]):
    """A worker's fence (run id, lease token) that ends its run with its terminal event.

    The append of the run's terminal event (its current invocation's) records the run's
    end on its Run row in the same transaction (on PostgreSQL in the same statement)
    with `finish`, and sets `ended`: whether the session has a pending run then. None
    until then (or when the append did not end the row, which the worker then ends
    itself). A plain tuple fence leaves the row to its worker.

    The worker wrote the terminal event and then finished the row in a transaction (and
    a thread hop) of its own: three statements less a run on PostgreSQL with the
    MESSAGE_END append, and no moment when the journal has ended a run that its row
    still calls running."""

    ended: bool | None
    finish: FinishStatement

    def __new__(cls, run_id: str, lease_token: str, finish: FinishStatement) -> RunFence:
        fence = super().__new__(cls, (run_id, lease_token))
        fence.ended = None
        fence.finish = finish
        return fence


INVOCATION_ID_MAX = 40
#: A JSON array of strings as a PostgreSQL text[] (one parameter, `json.dumps(list)`):
#: psycopg's client-side binding quotes a list parameter element by element in Python,
#: and a group commit's statements name a hundred sessions and runs under load.
JSON_TEXTS = "ARRAY(SELECT json_array_elements_text(%s::json))"
#: load_ranges_sync: ranges per query (3 parameters each, under SQLite's old limit of 999).
RANGES_PER_QUERY = 300


def _prepare(events: Sequence[NewEvent]) -> list[tuple[EventType, dict[str, Any], str | None]]:
    """Validate a batch before touching the database; payloads normalised through JSON.

    Normalising means what the append returns (and publishes) is exactly what `load`
    will read back, and that a bad payload fails here on both backends alike.
    """
    prepared = []
    for event in events:
        event_type = event.type if type(event.type) is EventType else EventType(event.type)
        payload = event.payload
        if not isinstance(payload, dict):
            raise TypeError(f"{event_type.value} payload must be a dict, not {type(payload).__name__}")
        if strings_only(payload):
            # Strings only (a delta's): JSON gives back the same dict, so a copy will do.
            payload = dict(payload)
        else:
            payload = json.loads(json.dumps(payload, allow_nan=False))  # TypeError/ValueError: not JSON
        invocation_id = event.invocation_id
        if invocation_id is not None and (not isinstance(invocation_id, str) or len(invocation_id) > INVOCATION_ID_MAX):
            raise ValueError(f"invocation_id must be a string of at most {INVOCATION_ID_MAX} characters")
        prepared.append((event_type, payload, invocation_id))
    return prepared


def _qn(connection: BaseDatabaseWrapper, name: str) -> str:
    return connection.ops.quote_name(name)


_T = TypeVar("_T")

#: Statement texts built once per database vendor (and shape), by `_statement`.
_STATEMENTS: dict[tuple[Any, ...], Any] = {}


def _statement(connection: BaseDatabaseWrapper, key: tuple[Any, ...], build: Callable[[], _T]) -> _T:
    """`build()` (a statement's text, made of quoted names) once per vendor and `key`: the
    appends of a run's start and end built theirs anew each time, about sixty quote_name
    calls and their joins an append (cProfile, bench/run_lifecycle.py --profile)."""
    full = (connection.vendor, *key)
    found = _STATEMENTS.get(full)
    if found is None:
        found = _STATEMENTS[full] = build()
    return cast(_T, found)


def _row_lock(connection: BaseDatabaseWrapper) -> str:
    """The clause that locks a selected row as select_for_update(no_key=True) would,
    where the database has row locks ("" on SQLite, whose transaction is the lock)."""
    if not connection.features.has_select_for_update:
        return ""
    return " FOR NO KEY UPDATE" if connection.features.has_select_for_no_key_update else " FOR UPDATE"


def _sqlite_batches(connection: BaseDatabaseWrapper) -> bool:
    """Whether a group's deltas go together on this SQLite (UPDATE ... FROM: 3.33;
    RETURNING: 3.35)."""
    return connection.vendor == "sqlite" and bool(connection.features.can_return_columns_from_insert)


@functools.cache
def _row_fields() -> tuple[Any, ...]:
    """The Session fields DatabaseJournal._session_row reads: the projection, and the
    owner and team an append's review rows need."""
    names = {"id", "owner_id", "team_id", "state", "last_seq", "updated_at", "appended_at"}
    # In the model's order: Model.from_db matches the values to the fields in that order.
    return tuple(field for field in models.Session._meta.concrete_fields if field.attname in names)


def _envelope_row(connection: BaseDatabaseWrapper, envelope: Envelope, created_at: Any) -> tuple[Any, ...]:
    """One envelope's INSERT values, in the column order of DatabaseJournal._insert_statement
    (the payload through its field's adapter: jsonb on PostgreSQL, text on SQLite);
    `created_at` is adapted already, once for the envelopes of one insert."""
    payload = models.Envelope._meta.get_field("payload").get_db_prep_save(envelope.payload, connection)
    return (envelope.session_id, envelope.seq, envelope.invocation_id, envelope.type.value, payload, created_at)


#: The Run columns a fence check reads (DatabaseJournal._refuse_stale_fence).
_FENCE_COLUMNS = ("session_id", "lease_token", "status", "finished_at", "pending_steer")
#: The Run columns `_lock_session_row` and `_lock_run_for_fence` read besides the fence's:
#: the run's invocation and API token, which the usage rollup of its MESSAGE_END needs
#: (ReviewProjection).
_FENCE_EXTRA_COLUMNS = ("invocation_id", "api_token_key")


class _Unread:
    """A fence's Run row not read yet (`_lock_session_row`)."""


_UNREAD = _Unread()

#: The statuses a fence refuses, as an SQL list of literals (the model's constants).
_FINISHED_STATUSES_SQL = ", ".join(f"'{status}'" for status in sorted(models.Run.FINISHED_STATUSES))
assert all(status.isidentifier() for status in models.Run.FINISHED_STATUSES)  # noqa: S101 - safe as literals


#: The events that end an invocation (and so its run).
_TERMINAL_TYPES = frozenset(
    {
        EventType.INVOCATION_COMPLETED,
        EventType.INVOCATION_SUSPENDED,
        EventType.INVOCATION_FAILED,
        EventType.INVOCATION_CANCELLED,
    }
)


def _terminal_event(
    prepared: list[tuple[EventType, dict[str, Any], str | None]],
) -> tuple[EventType, dict[str, Any], str | None] | None:
    """An append's (last) terminal event, as `_prepare` made it, or None."""
    for event in reversed(prepared):
        if event[0] in _TERMINAL_TYPES:
            return event
    return None


def _all_deltas(items: Sequence[_PendingAppend]) -> bool:
    """Whether every append of a group is text deltas only (the streaming fast path)."""
    for item in items:
        if not _only_deltas(item.events):
            return False
    return True


#: How far Session.updated_at may lag behind a stream's last delta. A batch of deltas
#: moves it only when it is this much behind: on PostgreSQL an UPDATE that leaves every
#: indexed column as it was is a HOT update, while one that moves updated_at (six of the
#: Session indexes name it) writes a new entry into every index of the table, for
#: every stream at every tick (a sixth of PostgreSQL's CPU under 100 streams, perf).
UPDATED_AT_STEP = timedelta(seconds=1)


def _touch_updated_at(connection: BaseDatabaseWrapper, now: datetime) -> tuple[str, list[Any]]:
    """The SET clause (and its parameters) with which a batch of deltas moves the Session
    row's updated_at to `now`, unless it is less than UPDATED_AT_STEP behind, and its
    appended_at (not indexed: the exact time `Session.projection` reads) to `now`."""
    column = _qn(connection, "updated_at")
    adapt = connection.ops.adapt_datetimefield_value
    return (
        f"{column} = CASE WHEN {column} < %s THEN %s ELSE {column} END, {_qn(connection, 'appended_at')} = %s",
        [adapt(now - UPDATED_AT_STEP), adapt(now), adapt(now)],
    )


def _sqlite_bump(connection: BaseDatabaseWrapper, now: datetime) -> tuple[str, str, list[Any]]:
    """SQLite: the SET clause (and its parameters, first) with which an append bumping
    last_seq moves appended_at, and the RETURNING column (its parameter last) that tells
    whether the row's updated_at is UPDATED_AT_STEP behind `now`, for `_sqlite_touch`.

    Not `_touch_updated_at`'s CASE: SQLite rewrites every index that names a column an
    UPDATE assigns, its value changed or not, so the CASE wrote the six Session indexes
    that name updated_at into the WAL on every append: 6 of the 11 pages a streamed
    delta's commit wrote (WAL frames per commit 10.9 -> 4.9, and 232 -> 168 us of CPU
    per single-delta group: `_append_group` in a loop on a scratch SQLite file). The
    comparison is SQLite's, as the CASE's was."""
    adapt = connection.ops.adapt_datetimefield_value
    column = _qn(connection, "updated_at")
    return (
        f"{_qn(connection, 'appended_at')} = %s",
        f"{column} < %s",
        [adapt(now), adapt(now - UPDATED_AT_STEP)],
    )


def _sqlite_touch(cursor: Any, connection: BaseDatabaseWrapper, behind: list[str], now: datetime) -> None:
    """SQLite: move updated_at to `now` on the sessions `behind` (those `_sqlite_bump`'s
    RETURNING column found a step behind), in the same transaction; nothing when none
    is (most appends)."""
    if not behind:
        return
    table = _qn(connection, models.Session._meta.db_table)
    pk = _qn(connection, "id")
    cursor.execute(
        f"UPDATE {table} SET {_qn(connection, 'updated_at')} = %s"  # noqa: S608 - quoted names
        f" WHERE {pk} IN (SELECT value FROM json_each(%s))",
        [connection.ops.adapt_datetimefield_value(now), json.dumps(behind)],
    )


_DELTAS_STATEMENTS: dict[tuple[str, str], str] = {}


def _deltas_statement(connection: BaseDatabaseWrapper, touch: str) -> str:
    """The SQL of `DatabaseJournal._bump_and_insert_deltas` (`touch`: its SET clause of
    `_touch_updated_at`), made once per database and clause: its quoted names were
    sixteen quote_name calls per streamed group."""
    key = (connection.alias, touch)
    statement = _DELTAS_STATEMENTS.get(key)
    if statement is not None:
        return statement
    session_table = _qn(connection, models.Session._meta.db_table)
    envelope_table = _qn(connection, models.Envelope._meta.db_table)
    run_table = _qn(connection, models.Run._meta.db_table)
    columns = ", ".join(
        _qn(connection, name) for name in ("session_id", "seq", "invocation_id", "type", "payload", "created_at")
    )
    pk = _qn(connection, "id")
    session_of, token, status, finished_at = (
        _qn(connection, name) for name in ("session_id", "lease_token", "status", "finished_at")
    )
    statement = _DELTAS_STATEMENTS[key] = (
        f"WITH locked AS MATERIALIZED (SELECT {pk} FROM {session_table}"  # noqa: S608 - quoted names
        f" WHERE {pk} = ANY(ARRAY(SELECT json_object_keys(%s::json))) ORDER BY {pk} FOR NO KEY UPDATE),"
        f" fenced AS MATERIALIZED (SELECT r.{pk} FROM {run_table} AS r,"
        " json_to_recordset(%s::json) AS f(r text, s text, t text)"
        f" WHERE r.{pk} = ANY(ARRAY(SELECT json_array_elements_text(%s::json)))"
        f" AND r.{pk} = f.r AND r.{session_of} = f.s AND r.{token} = f.t AND r.{finished_at} IS NULL"
        f" AND r.{status} NOT IN ({_FINISHED_STATUSES_SQL}) AND (SELECT count(*) FROM locked) >= 0"
        f" ORDER BY r.{pk} FOR NO KEY UPDATE OF r),"
        f" bumped AS (UPDATE {session_table} AS s SET last_seq = s.last_seq + v.value::int, {touch}"
        f" FROM json_each_text(%s::json) AS v, locked WHERE s.{pk} = v.key AND locked.{pk} = s.{pk}"
        " AND (SELECT count(*) FROM locked) = %s AND (SELECT count(*) FROM fenced) = %s"
        f" RETURNING s.{pk} AS id, s.last_seq, v.value::int AS n),"
        f" inserted AS (INSERT INTO {envelope_table} ({columns})"
        " SELECT r.s, b.last_seq - b.n + r.o, r.i, r.t, r.p, %s"
        " FROM json_to_recordset(%s::json) AS r(s text, o int, i text, t text, p jsonb)"
        " JOIN bumped AS b ON b.id = r.s)"
        " SELECT id, last_seq FROM bumped"
    )
    return statement


def _split_fence(fence: Any) -> tuple[str, Any]:
    """(run_id, lease_token) of a fence; LeaseLost when it is not a pair."""
    try:
        run_id, lease_token = fence
    except (TypeError, ValueError):
        raise LeaseLost(f"malformed fence {fence!r}") from None
    return str(run_id), lease_token


class DatabaseJournal:
    """The journal on the database (see the module docstring for the rules).

    `publish=False` skips the channel layer (bulk imports, benchmarks of the bare write).
    """

    def __init__(self, *, publish: bool = True, using: str = DEFAULT_DB_ALIAS) -> None:
        self.publish = publish
        self.using = using
        self._group: PerLoop[_GroupCommit] = PerLoop(lambda: _GroupCommit(self))
        if type(self).append is not DatabaseJournal.append:
            # A subclass that watches or changes `append` sees every append: no `submit`
            # (InvocationWriter then appends through `append`).
            self.submit = None  # type: ignore[method-assign,assignment]

    # ---- the protocol (async) ----

    async def append(self, session_id: str, events: Sequence[NewEvent], *, fence: Any = None) -> list[Envelope]:
        """Append through this event loop's group commit (see _GroupCommit): appends that
        arrive while a transaction is in flight share the next one."""
        # A group's failed appends come back as the driver's errors (_append_group): as
        # database_lost_as_unavailable, without a context manager per streamed chunk.
        try:
            return await self._group.get().append(session_id, list(events), fence)
        except LOST_DATABASE_ERRORS as exc:
            raise database_unavailable(exc) from exc

    def submit(
        self, session_id: str, events: Sequence[NewEvent], *, fence: Any = None
    ) -> asyncio.Future[list[Envelope]]:
        """`append` without a coroutine to await (InvocationWriter's streamed deltas): the
        append is queued in this event loop's group commit at once, and the future holds
        what `append` would return or raise (a lost database: JournalUnavailable)."""
        return self._group.get().submit(session_id, list(events), fence)

    async def load(self, session_id: str, after_seq: int = 0) -> list[Envelope]:
        return await run_in_db_thread(self.load_sync, session_id, after_seq)

    async def load_since_compaction(self, session_id: str) -> list[Envelope]:
        return await run_in_db_thread(self.load_since_compaction_sync, session_id)

    async def state(self, session_id: str) -> SessionState:
        return await run_in_db_thread(self.state_sync, session_id)

    # ---- sync twins ----

    def append_sync(
        self, session_id: str, events: Sequence[NewEvent], *, fence: Any = None, locked: models.Session | None = None
    ) -> list[Envelope]:
        """Append inside the caller's transaction, if any; publish when it commits.

        `locked`: the session's row as the caller locked it in this same transaction
        (actions' `_locked`): the append uses it instead of locking and reading the row
        again, and leaves it updated (last_seq, state and the other cached columns), so
        a second append with the same object is right too. It takes no savepoint then
        (two statements of every run's POST): the caller's transaction is the unit, and a
        failed append fails it, as nothing between the lock and the append catches one."""
        if locked is not None and (
            locked.pk != session_id or not transaction.get_connection(self.using).in_atomic_block
        ):
            raise ValueError("`locked` must be the session's row, locked in the current transaction")
        with transaction.atomic(using=self.using, savepoint=locked is None):
            envelopes = self._append_locked(session_id, list(events), fence, locked=locked)
            if envelopes:
                counted = functools.partial(count_appended_numbers, *appended_numbers(envelopes))
                transaction.on_commit(counted, using=self.using)
            if self.publish and envelopes:
                publish_on_commit(envelopes, using=self.using)
        return envelopes

    def load_sync(self, session_id: str, after_seq: int = 0) -> list[Envelope]:
        rows = self._envelope_rows(session_id, after=after_seq)
        if not rows and not models.Session.objects.using(self.using).filter(pk=session_id).exists():
            raise NotFound(f"no session {session_id}")
        return rows

    def load_since_compaction_sync(self, session_id: str) -> list[Envelope]:
        # Session.compaction_seq is the newest TRANSCRIPT_COMPACTED: the read starts there
        # on the (session, seq) index and never visits older rows. A compaction committed
        # between the two reads only makes the result start earlier, which folds the same.
        connection = connections[self.using]
        table = _qn(connection, models.Session._meta.db_table)
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT {_qn(connection, 'compaction_seq')} FROM {table} WHERE {_qn(connection, 'id')} = %s",  # noqa: S608 - quoted names
                [session_id],
            )
            row = cursor.fetchone()
        if row is None:
            raise NotFound(f"no session {session_id}")
        return self._envelope_rows(session_id, after=max(int(row[0]), 1) - 1)

    def load_ranges_sync(self, ranges: Sequence[tuple[str, int, int]]) -> dict[str, list[Envelope]]:
        """The envelopes of several sessions at once: for each (session id, from seq,
        before seq), seqs from <= seq < before, in seq order, by session. One query per
        RANGES_PER_QUERY ranges (an OR of (session, seq) index ranges), for pages that
        show a little of many sessions (the approval queue)."""
        found: dict[str, list[Envelope]] = {session_id: [] for session_id, _lo, _hi in ranges}
        wanted = [(session_id, lo, hi) for session_id, lo, hi in ranges if lo < hi]
        for start in range(0, len(wanted), RANGES_PER_QUERY):
            condition = Q()
            for session_id, lo, hi in wanted[start : start + RANGES_PER_QUERY]:
                condition |= Q(session_id=session_id, seq__gte=lo, seq__lt=hi)
            rows = (
                models.Envelope.objects.using(self.using)
                .filter(condition)
                .order_by("session_id", "seq")
                .values_list("session_id", "seq", "invocation_id", "type", "payload", "created_at")
            )
            for session_id, seq, invocation_id, event_type, payload, created_at in rows:
                found[session_id].append(
                    Envelope(session_id, seq, invocation_id, EventType(event_type), payload, created_at)
                )
        return found

    def start_sync(
        self,
        session_id: str,
        known: tuple[SessionState, int | None] | None = None,
        transcript: list[Envelope] | None = None,
    ) -> tuple[list[Envelope], SessionState, int | None]:
        """What an invocation starts from: the transcript since the newest compaction, the
        session's state and its team's id, in two statements (the state says where the
        newest compaction is). NotFound when the session is gone.

        `known`: the session's state and team id as read a moment ago (a run's claim,
        under the session's lock). When the transcript read from its compaction still
        ends at its last_seq, nothing was journaled since (seqs are gapless, and the
        state's columns change only with an append), so it is the state now: one
        statement, not two. Otherwise the row is read again.

        `transcript`: with `known`, the transcript read with it (the claim's batch):
        no statement at all."""
        if known is not None:
            state, team_id = known
            if transcript is None:
                transcript = self._envelope_rows(session_id, after=max(state.compaction_seq, 1) - 1)
            if transcript_is_current(transcript, state):
                return transcript, state, team_id
        session = self._session_row(connections[self.using], session_id, lock=False)
        state = session.projection()
        return self._envelope_rows(session_id, after=max(state.compaction_seq, 1) - 1), state, session.team_id

    def transcripts_sync(self, after: dict[str, int]) -> dict[str, list[Envelope]]:
        """PostgreSQL: the envelopes of several sessions, each with seq > its `after`, in
        seq order, in one statement (a batch of claimed runs' transcripts)."""
        connection = connections[self.using]
        table = _qn(connection, models.Envelope._meta.db_table)
        columns = ", ".join(f"e.{_qn(connection, name)}" for name in ("session_id", *_ENVELOPE_COLUMNS))
        seq, session = _qn(connection, "seq"), _qn(connection, "session_id")
        with hot_cursor(connection) as cursor:
            cursor.execute(
                f"SELECT {columns} FROM unnest(%s::text[], %s::int[]) AS b(s, a)"  # noqa: S608 - quoted names
                f" JOIN {table} e ON e.{session} = b.s AND e.{seq} > b.a ORDER BY e.{session}, e.{seq}",
                [list(after), list(after.values())],
            )
            rows = cursor.fetchall()
        by_session: dict[str, list[tuple[Any, ...]]] = {session_id: [] for session_id in after}
        for session_id, *row in rows:
            by_session[session_id].append(row)
        return {session_id: _envelopes(connection, session_id, found) for session_id, found in by_session.items()}

    def state_sync(self, session_id: str) -> SessionState:
        return self._session_row(connections[self.using], session_id, lock=False).projection()

    def rebuild_projection_sync(self, session_id: str) -> SessionState:
        """Recompute the Session row's cached projection from the journal alone."""
        session = models.Session.objects.using(self.using).filter(pk=session_id).first()
        if session is None:
            raise NotFound(f"no session {session_id}")
        return session.rebuild_projection()

    # ---- the write ----

    def _append_in_own_transaction(self, session_id: str, events: list[NewEvent], fence: Any) -> list[Envelope]:
        with transaction.atomic(using=self.using):
            return self._append_locked(session_id, events, fence)

    def _append_group(self, items: list[_PendingAppend]) -> list[list[Envelope] | Exception]:
        """Several appends (of any sessions) in one transaction, in their order per session.

        Seqs stay gapless: each append bumps its session's last_seq in turn, within the
        same transaction. When any of them is refused (a lost fence, a deleted session, a
        bad payload), the whole transaction rolls back and each is retried on its own, so
        one append's refusal is never another's.

        On PostgreSQL a group made only of deltas (the streaming lane's, even a group of
        one) is one statement in autocommit, its fence checks included
        (`_bump_and_insert_deltas`): no BEGIN, no COMMIT, no separate fence SELECT. A
        statement is atomic on its own, so a refusal still writes nothing.
        """
        connection = connections[self.using]
        write: Any = None
        if connection.vendor == "postgresql" and not connection.in_atomic_block and _all_deltas(items):
            write = self._append_deltas_together  # one statement: its own transaction
        elif len(items) > 1:
            write = self._append_together_atomically
        if write is not None:
            try:
                return list(write(items))
            except (OperationalError, InterfaceError) as exc:
                if self._connection_broken():
                    # The connection broke (PostgreSQL restarted), perhaps during the
                    # COMMIT: the group may have landed, and a retry could write it twice.
                    # Every append of it fails instead (JournalUnavailable: its run is
                    # recovered from what the journal holds, whichever way it went).
                    self._reset_connections()
                    return [exc for _ in items]
                # The server refused it (a deadlock, say): rolled back; each is retried alone.
            except Exception:  # noqa: S110 - each is retried alone below, and raises there
                pass
        results: list[list[Envelope] | Exception] = []
        for item in items:
            try:
                results.append(self._append_in_own_transaction(item.session_id, item.events, item.fence))
            except (OperationalError, InterfaceError) as exc:
                results.append(exc)
                if self._connection_broken():
                    self._reset_connections()  # the next append gets a live connection
            except Exception as exc:
                results.append(exc)
        return results

    def _append_together_atomically(self, items: list[_PendingAppend]) -> list[list[Envelope] | Exception]:
        with transaction.atomic(using=self.using):
            return self._append_together(items)

    def _append_together(self, items: list[_PendingAppend]) -> list[list[Envelope] | Exception]:
        """A group's appends inside its transaction. On PostgreSQL the sessions whose
        appends in this group are all deltas take the streaming fast path together
        (`_append_deltas_together`), the others go append by append; every session of the
        group is locked first, in id order, so the group still takes its locks in one order.
        (One MESSAGE_START among fifty streams' deltas sent the whole group append by
        append: three statements each, while runs started or ended.)"""
        connection = connections[self.using]
        postgres = connection.vendor == "postgresql"
        if not (postgres or _sqlite_batches(connection)):
            return [self._append_locked(item.session_id, item.events, item.fence) for item in items]
        streaming: dict[str, bool] = {}
        for item in items:
            deltas = _only_deltas(item.events)
            streaming[item.session_id] = streaming.get(item.session_id, True) and deltas
        fast = [index for index, item in enumerate(items) if streaming[item.session_id]]
        if len(fast) == len(items):
            return list(self._append_deltas_together(items))
        results: list[list[Envelope] | Exception] = [[] for _ in items]
        if fast:
            if postgres:
                self._lock_sessions(sorted(streaming))
            together = self._append_deltas_together([items[i] for i in fast])
            for index, envelopes in zip(fast, together, strict=True):
                results[index] = envelopes
        for index, item in enumerate(items):
            if not streaming[item.session_id]:
                results[index] = self._append_locked(item.session_id, item.events, item.fence)
        return results

    def _lock_sessions(self, session_ids: list[str]) -> None:
        """Lock the Session rows (in the given order: id order); NotFound when one is gone."""
        connection = connections[self.using]
        table = _qn(connection, models.Session._meta.db_table)
        pk = _qn(connection, "id")
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT {pk} FROM {table} WHERE {pk} = ANY({JSON_TEXTS}) ORDER BY {pk} FOR NO KEY UPDATE",  # noqa: S608 - quoted names
                [json.dumps(session_ids)],
            )
            if len(cursor.fetchall()) != len(session_ids):
                raise NotFound("a session of the group does not exist")

    def _append_deltas_together(self, items: list[_PendingAppend]) -> list[list[Envelope]]:
        """A group made only of deltas (many streams at once), on PostgreSQL and SQLite, in
        a fixed number of statements instead of two or three per append: lock the sessions' rows
        (in id order, like every group), bump each last_seq by its appends' count and
        insert every envelope (one statement on PostgreSQL, `_bump_and_insert_deltas`),
        lock and check every fence in one SELECT of their Run rows (after the sessions).

        The same result as `_append_locked` item by item (seqs gapless, in order per
        session; a refusal raises, and the caller retries each alone). Under 100 streams
        the two round trips per append inside the group's transaction, not the COMMIT,
        were the cost (bench/journal.py). On SQLite, whose transaction already holds the
        write lock, the statements' CPU (Django's cursor and its placeholder rewriting,
        three times per append) was most of the embedded server's journal thread.
        """
        connection = connections[self.using]
        now = timezone.now()
        prepared = [_prepare(item.events) for item in items]
        postgres = connection.vendor == "postgresql"
        counts: dict[str, int] = {}
        for item, events in zip(items, prepared, strict=True):
            counts[item.session_id] = counts.get(item.session_id, 0) + len(events)
        if postgres:
            last_seq = self._bump_and_insert_deltas(items, prepared, counts, now)
        else:
            last_seq = self._bump_deltas_sqlite(counts, now)
        if len(last_seq) != len(counts):
            raise NotFound("a session of the group does not exist")
        next_seq = {session_id: last_seq[session_id] - count for session_id, count in counts.items()}
        if not postgres:  # PostgreSQL's statement checked them (after the sessions, too)
            self._check_fences_together(items)
        results: list[list[Envelope]] = []
        for item, events in zip(items, prepared, strict=True):
            first = next_seq[item.session_id]
            results.append(
                [
                    Envelope(item.session_id, first + i, invocation_id, event_type, payload, now)
                    for i, (event_type, payload, invocation_id) in enumerate(events, start=1)
                ]
            )
            next_seq[item.session_id] = first + len(events)
        if not postgres:
            self._insert(connection, [envelope for envelopes in results for envelope in envelopes])
        return results

    def _bump_and_insert_deltas(
        self,
        items: list[_PendingAppend],
        prepared: list[list[tuple[EventType, dict[str, Any], str | None]]],
        counts: dict[str, int],
        now: datetime,
    ) -> dict[str, int]:
        """PostgreSQL: lock the group's sessions in id order, then its fences' Run rows in
        id order, check the fences, bump the sessions' last_seq and insert the envelopes,
        in one statement; {session id: its new last_seq}. LeaseLost, with nothing
        written, when a fence refuses or a session is gone (the caller retries each
        append alone, which names the one refused).

        Each row names its place among its session's deltas of the group (o, from 1): its
        seq is the new last_seq - the session's count + o, as `_append_deltas_together`
        numbers them. The locking CTE takes every Session lock (in id order: the UPDATE
        joins only rows it has emitted, so it never locks one first); the Run rows' CTE
        waits for it (its one-time filter reads it), so the locks follow the module's
        order, and it keeps the runs whose fence holds, rechecked on each row as it is
        once locked (a lease taken over or a run finished while this waited drops out,
        as `_check_fence` would refuse it). The UPDATE and so the INSERT write only when
        every session was found and every fence held (the two counts). Separate
        statements were a round trip and a Django cursor each per group, and their
        BEGIN and COMMIT two more (bench/pg_statements.py).
        """
        connection = connections[self.using]
        fences: set[tuple[str, str, str]] = set()  # (run, session, token): each once
        for item in items:
            if item.fence is not None:
                run_id, lease_token = _split_fence(item.fence)
                if not isinstance(lease_token, str):
                    raise LeaseLost(f"run {run_id}: the lease was taken over")
                fences.add((run_id, item.session_id, lease_token))
        placed = dict.fromkeys(counts, 0)
        records = []
        for item, events in zip(items, prepared, strict=True):
            for event_type, payload, invocation_id in events:
                placed[item.session_id] += 1
                records.append(
                    {
                        "s": item.session_id,
                        "o": placed[item.session_id],
                        "i": invocation_id,
                        "t": event_type.value,
                        "p": payload,
                    }
                )
        touch, touch_params = _touch_updated_at(connection, now)
        with _prepared_cursor(connection) as cursor:
            cursor.execute(
                _deltas_statement(connection, touch),
                [
                    json.dumps(counts),
                    json.dumps([{"r": r, "s": s, "t": t} for r, s, t in fences]),
                    json.dumps([r for r, _s, _t in fences]),
                    *touch_params,
                    json.dumps(counts),
                    len(counts),
                    len(fences),
                    connection.ops.adapt_datetimefield_value(now),
                    json.dumps(records, allow_nan=False),
                ],
            )
            rows = cursor.fetchall()
        if len(rows) != len(counts):  # nothing written
            raise LeaseLost("a fence of the group was refused, or one of its sessions is gone")
        return {session_id: int(seq) for session_id, seq in rows}

    def _bump_deltas_sqlite(self, counts: dict[str, int], now: datetime) -> dict[str, int]:
        """SQLite: bump the sessions' last_seq in one UPDATE (its transaction holds the
        database's write lock); {session id: its new last_seq}."""
        connection = connections[self.using]
        table = _qn(connection, models.Session._meta.db_table)
        pk = _qn(connection, "id")
        touch, behind, (appended_at, step) = _sqlite_bump(connection, now)
        with connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {table} SET last_seq = last_seq + v.value, {touch}"  # noqa: S608 - quoted names
                f" FROM json_each(%s) AS v WHERE {table}.{pk} = v.key RETURNING {pk}, last_seq, {behind}",
                [appended_at, json.dumps(counts), step],
            )
            rows = cursor.fetchall()
            _sqlite_touch(cursor, connection, [session_id for session_id, _seq, late in rows if late], now)
        return {session_id: int(seq) for session_id, seq, _late in rows}

    def _connection_broken(self) -> bool:
        """After a database error: whether the connection itself is gone (not merely the
        statement refused by the server, which rolls the transaction back for sure)."""
        connection = connections[self.using]
        if connection.connection is None:
            return True
        try:
            return not connection.is_usable()
        except Exception:
            return True

    def _reset_connections(self) -> None:
        reset_connection(self.using)

    def _append_locked(
        self, session_id: str, events: list[NewEvent], fence: Any, *, locked: models.Session | None = None
    ) -> list[Envelope]:
        """The append proper; the caller holds a transaction open around it."""
        prepared = _prepare(events)
        connection = connections[self.using]
        now = timezone.now()
        terminal = _terminal_event(prepared) if isinstance(fence, RunFence) else None
        if terminal is not None:
            fence.ended = None  # a try of this append rolled back may have set it
        session: models.Session | None = None
        run: tuple[Any, ...] | None | _Unread = _UNREAD
        run_invocation_id: str | None = None
        run_token_key: int | None = None
        if locked is not None:
            session, last_seq = locked, locked.last_seq
        elif prepared and all(event_type is EventType.MESSAGE_DELTA for event_type, _, _ in prepared):
            last_seq = self._bump_last_seq(connection, session_id, len(prepared), now) - len(prepared)
        else:
            session, run = self._lock_session_row(connection, session_id, fence)
            last_seq = session.last_seq
            if isinstance(run, tuple):
                run, (run_invocation_id, run_token_key) = run[: len(_FENCE_COLUMNS)], run[len(_FENCE_COLUMNS) :]
        if fence is not None:
            completing = any(event_type is EventType.INVOCATION_COMPLETED for event_type, _, _ in prepared)
            if isinstance(run, _Unread):
                run_invocation_id, run_token_key = self._check_fence(session_id, fence, completing=completing)
            else:  # read (and locked) with the session's row
                run_id, lease_token = _split_fence(fence)
                self._refuse_stale_fence(session_id, run_id, lease_token, run, completing=completing)
        if not prepared:
            return []
        envelopes = [
            Envelope(session_id, last_seq + i, invocation_id, event_type, payload, now)
            for i, (event_type, payload, invocation_id) in enumerate(prepared, start=1)
        ]
        if session is None:
            self._insert(connection, envelopes)
            return envelopes
        state = session.projection()
        pending_before = state.pending_ask.get("ask_id") if state.pending_ask else None
        review = ReviewProjection(session, self.using)
        for event in events:
            if event.text is not None and EventType(event.type) is EventType.MESSAGE_END:
                review.known_texts[str(event.payload.get("message_id"))] = event.text
        if run_invocation_id is not None:
            # Invocation ids are unique among runs: the fenced run, read with the lock, is
            # the row the rollup would look its API token up in.
            review.know_token_key(run_invocation_id, run_token_key)
        for envelope in envelopes:
            review.observe(state, envelope)
            apply_envelope(state, envelope)
        columns = models.Session.cached_columns(state)
        columns["updated_at"] = now
        finish = None
        if terminal is not None and run_invocation_id is not None and terminal[2] == run_invocation_id:
            # The run's end on its row, with its terminal event (RunFence says why).
            run_id, lease_token = fence
            finish = fence.finish(connection, run_id, lease_token, terminal[0], terminal[1], now)
        # Before the review's rows: a reply's search entry reads the deltas just inserted
        # (unless they go in the same statement: `ReviewProjection.statements`).
        ended = self._insert_and_update_session_row(connection, envelopes, columns, finish, review.statements())
        if ended is not None:
            fence.ended = ended
        review.write()
        if any(ask_changes(e, pending_before) for e in envelopes):
            update_ask_index(session_id, envelopes, pending_before, state, using=self.using)
            observe_decisions_on_commit(state, envelopes, using=self.using)
        for name, value in columns.items():  # the caller's locked row stays the row
            setattr(session, name, value)
        # The audit (and notification outbox) of asks and decisions, in this transaction.
        record_moderation(session, envelopes, state, using=self.using)
        return envelopes

    def _lock_session_row(
        self, connection: BaseDatabaseWrapper, session_id: str, fence: Any
    ) -> tuple[models.Session, tuple[Any, ...] | None | _Unread]:
        """The Session row, locked, and on PostgreSQL the fence's Run row (locked after it,
        as `_lock_run_for_fence` reads it; None when there is no such run) in the same
        statement: one round trip, parse and plan fewer for every fenced append other
        than deltas (a run's start and end, a tool call). Elsewhere, or without a (well
        formed) fence, the run is _UNREAD. The run's tuple is its `_FENCE_COLUMNS`, then its
        `_FENCE_EXTRA_COLUMNS`."""
        run_id = None
        if fence is not None and connection.vendor == "postgresql":
            try:
                run_id, _token = _split_fence(fence)
            except LeaseLost:
                run_id = None  # refused after the session's lock, as before
        if run_id is None:
            return self._session_row(connection, session_id, lock=True), _UNREAD
        fields = _row_fields()

        def build() -> str:
            table = _qn(connection, models.Session._meta.db_table)
            run_table = _qn(connection, models.Run._meta.db_table)
            pk = _qn(connection, "id")
            columns = ", ".join(_qn(connection, field.column) for field in fields)
            session_columns = ", ".join(f"s.{_qn(connection, field.column)}" for field in fields)
            run_columns = ", ".join(_qn(connection, name) for name in (*_FENCE_COLUMNS, *_FENCE_EXTRA_COLUMNS))
            fenced = ", ".join(f"r.{_qn(connection, name)}" for name in (*_FENCE_COLUMNS, *_FENCE_EXTRA_COLUMNS))
            return (
                f"WITH s AS MATERIALIZED (SELECT {columns} FROM {table} WHERE {pk} = %s FOR NO KEY UPDATE),"  # noqa: S608 - quoted names
                f" r AS MATERIALIZED (SELECT {pk}, {run_columns} FROM {run_table}"
                f" WHERE {pk} = %s AND (SELECT count(*) FROM s) > 0 FOR NO KEY UPDATE)"
                f" SELECT {session_columns}, r.{pk} IS NOT NULL, {fenced} FROM s LEFT JOIN r ON true"
            )

        with _prepared_cursor(connection) as cursor:
            cursor.execute(_statement(connection, ("lock_session_and_run",), build), [session_id, run_id])
            row = cursor.fetchone()
        if row is None:
            raise NotFound(f"no session {session_id}")
        session = self._session_from_row(connection, fields, row[: len(fields)])
        found, *run = row[len(fields) :]
        return session, (tuple(run) if found else None)

    def _session_row(self, connection: BaseDatabaseWrapper, session_id: str, *, lock: bool) -> models.Session:
        """The Session row (`lock`: locked like select_for_update(no_key=True)) with only
        the columns an append or a projection reads (`_row_fields`; the others are
        deferred): NotFound when it is gone.

        Plain SQL: every append of an event other than a delta (a message's start and
        end, a tool call, a run's end) and every run start runs it, and the queryset's
        compilation and full model instance were most of their CPU (a burst of starts).
        """
        fields = _row_fields()

        def build() -> str:
            table = _qn(connection, models.Session._meta.db_table)
            columns = ", ".join(_qn(connection, field.column) for field in fields)
            sql = f"SELECT {columns} FROM {table} WHERE {_qn(connection, 'id')} = %s"  # noqa: S608 - quoted names
            return sql + _row_lock(connection) if lock else sql

        sql = _statement(connection, ("session_row", lock), build)
        with hot_cursor(connection) as cursor:
            cursor.execute(sql, [session_id])
            row = cursor.fetchone()
        if row is None:
            raise NotFound(f"no session {session_id}")
        return self._session_from_row(connection, fields, row)

    def _session_from_row(
        self, connection: BaseDatabaseWrapper, fields: tuple[Any, ...], row: Sequence[Any]
    ) -> models.Session:
        converters = kept_converters(connection, models.Session, tuple(field.name for field in fields))
        values = [convert(value) for convert, value in zip(converters, row, strict=True)]
        return models.Session.from_db(self.using, [field.attname for field in fields], values)

    def _update_session_row(self, connection: BaseDatabaseWrapper, session_id: str, columns: dict[str, Any]) -> None:
        """UPDATE the Session row's `columns` (field names: values), through each field's
        own adapter, in plain SQL for the reason `_session_row` gives."""
        sql, params = self._update_session_statement(connection, session_id, columns)
        with connection.cursor() as cursor:
            cursor.execute(sql, params)

    def _update_session_statement(
        self, connection: BaseDatabaseWrapper, session_id: str, columns: dict[str, Any]
    ) -> tuple[str, list[Any]]:
        meta = models.Session._meta

        def build() -> tuple[str, list[Field]]:
            fields = [cast(Field, meta.get_field(name)) for name in columns]  # concrete columns of the model
            names = [f"{_qn(connection, field.column)} = %s" for field in fields]
            table = _qn(connection, meta.db_table)
            sql = f"UPDATE {table} SET {', '.join(names)} WHERE {_qn(connection, 'id')} = %s"  # noqa: S608 - quoted names
            return sql, fields

        sql, fields = _statement(connection, ("update_session", *columns), build)
        params = [
            field.get_db_prep_save(value, connection) for field, value in zip(fields, columns.values(), strict=True)
        ]
        return sql, [*params, session_id]

    def _insert_and_update_session_row(
        self,
        connection: BaseDatabaseWrapper,
        envelopes: list[Envelope],
        columns: dict[str, Any],
        finish: tuple[str, list[Any], bool] | None = None,
        also: list[tuple[str, list[Any]]] | None = None,
    ) -> bool | None:
        """`_insert` the envelopes (of one session) and `_update_session_row` its row: on
        PostgreSQL in one statement (the INSERT a data-modifying CTE of the UPDATE).

        `finish`: `sessions_app.runs.finish_statement` of the fenced run, which ends its
        row too (on PostgreSQL another data-modifying CTE of the same statement); then
        whether the session has a pending run (True where the database cannot tell),
        None when the row was not ended (or without `finish`).

        `also`: more plain INSERTs (PostgreSQL only) to run as data-modifying CTEs of the
        same statement (`ReviewProjection.statements`)."""
        session_id = envelopes[0].session_id
        if connection.vendor != "postgresql":
            self._insert(connection, envelopes)
            self._update_session_row(connection, session_id, columns)
            if finish is None:
                return None
            sql, params, returning = finish
            with hot_cursor(connection) as cursor:
                cursor.execute(sql, params)
                if not returning:
                    return True if cursor.rowcount == 1 else None
                row = cursor.fetchone()
            return None if row is None else bool(row[0])
        insert, insert_params = self._insert_statement(connection, envelopes)
        ctes = f"inserted AS ({insert})"
        for i, (sql, params) in enumerate(also or ()):
            ctes += f", also{i} AS ({sql})"
            insert_params = [*insert_params, *params]
        update, update_params = self._update_session_statement(connection, session_id, columns)
        if finish is None:
            with _prepared_cursor(connection) as cursor:
                cursor.execute(f"WITH {ctes} {update}", [*insert_params, *update_params])
            return None
        # PostgreSQL's finish statement always returns (RETURNING): its one row comes back
        # through the session's UPDATE, which returns one row (the session is locked).
        sql, params, _returning = finish
        with _prepared_cursor(connection) as cursor:
            cursor.execute(
                f"WITH {ctes}, finished AS ({sql} AS pending) {update}"  # noqa: S608 - quoted names
                " RETURNING (SELECT count(*) FROM finished), (SELECT bool_or(pending) FROM finished)",
                [*insert_params, *params, *update_params],
            )
            row = cursor.fetchone()
        return bool(row[1]) if row is not None and row[0] == 1 else None

    def _bump_last_seq(self, connection: BaseDatabaseWrapper, session_id: str, count: int, now: datetime) -> int:
        """Add `count` to the session's last_seq (locking its row); the new last_seq."""
        table = _qn(connection, models.Session._meta.db_table)
        if connection.vendor == "sqlite" and connection.features.can_return_columns_from_insert:
            # The group's bump, for one session: updated_at left out unless it is behind.
            bumped = self._bump_deltas_sqlite({session_id: count}, now)
            if session_id not in bumped:
                raise NotFound(f"no session {session_id}")
            return bumped[session_id]
        touch, touch_params = _touch_updated_at(connection, now)
        with connection.cursor() as cursor:
            if connection.features.can_return_columns_from_insert:  # RETURNING: PostgreSQL, SQLite >= 3.35
                cursor.execute(
                    f"UPDATE {table} SET last_seq = last_seq + %s, {touch} WHERE id = %s RETURNING last_seq",  # noqa: S608 - quoted names
                    [count, *touch_params, session_id],
                )
                row = cursor.fetchone()
                if row is None:
                    raise NotFound(f"no session {session_id}")
                return int(row[0])
        last_seq = (
            models.Session.objects.using(self.using)
            .select_for_update(no_key=True)
            .filter(pk=session_id)
            .values_list("last_seq", flat=True)
            .first()
        )
        if last_seq is None:
            raise NotFound(f"no session {session_id}")
        models.Session.objects.using(self.using).filter(pk=session_id).update(
            last_seq=last_seq + count, updated_at=now, appended_at=now
        )
        return last_seq + count

    def _check_fences_together(self, items: list[_PendingAppend]) -> None:
        """`_check_fence` for every fenced append of a group, with one locking SELECT of
        their Run rows (in id order) instead of one a append: under 100 streams a group
        carries tens of appends, and their fence checks were most of its statements."""
        fenced = [(item.session_id, _split_fence(item.fence)) for item in items if item.fence is not None]
        if not fenced:
            return
        connection = connections[self.using]
        table = _qn(connection, models.Run._meta.db_table)
        pk = _qn(connection, "id")
        columns = ", ".join(_qn(connection, name) for name in _FENCE_COLUMNS)
        run_ids = sorted({run_id for _session, (run_id, _token) in fenced})
        with connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                cursor.execute(
                    f"SELECT {pk}, {columns} FROM {table} WHERE {pk} = ANY({JSON_TEXTS})"  # noqa: S608 - quoted names
                    f" ORDER BY {pk} FOR NO KEY UPDATE",
                    [json.dumps(run_ids)],
                )
            else:  # SQLite: the transaction is the lock
                cursor.execute(
                    f"SELECT {pk}, {columns} FROM {table} WHERE {pk} IN (SELECT value FROM json_each(%s))",  # noqa: S608 - quoted names
                    [json.dumps(run_ids)],
                )
            rows = {row[0]: tuple(row[1:]) for row in cursor.fetchall()}
        for session_id, (run_id, lease_token) in fenced:
            self._refuse_stale_fence(session_id, run_id, lease_token, rows.get(run_id))

    def _check_fence(self, session_id: str, fence: Any, *, completing: bool = False) -> tuple[Any, ...]:
        """Refuse a stale fence (`_refuse_stale_fence`); else its run's `_FENCE_EXTRA_COLUMNS`."""
        run_id, lease_token = _split_fence(fence)
        run = self._lock_run_for_fence(run_id)
        fenced = None if run is None else run[: len(_FENCE_COLUMNS)]
        self._refuse_stale_fence(session_id, run_id, lease_token, fenced, completing=completing)
        return run[len(_FENCE_COLUMNS) :] if run is not None else (None, None)

    @staticmethod
    def _refuse_stale_fence(
        session_id: str, run_id: str, lease_token: Any, run: tuple[Any, ...] | None, *, completing: bool = False
    ) -> None:
        """LeaseLost (or SteerArrived) unless `run`, the fence's Run row, still lets it write."""
        if run is None:
            raise LeaseLost(f"run {run_id} does not exist")
        run_session, token, status, finished_at, pending_steer = run
        if run_session != session_id:
            raise LeaseLost(f"run {run_id} does not belong to session {session_id}")
        if token is None or token != lease_token:
            raise LeaseLost(f"run {run_id}: the lease was taken over")
        if status in models.Run.FINISHED_STATUSES or finished_at is not None:
            raise LeaseLost(f"run {run_id} is {status}")
        if completing and pending_steer:
            # do_steer parks under the same Session-then-Run locks: a steer accepted for
            # this run is either seen here (and answered) or refused as stale after.
            raise SteerArrived(f"run {run_id}: a steer arrived while it was ending")

    def _lock_run_for_fence(self, run_id: str) -> tuple[Any, ...] | None:
        """(session_id, lease_token, status, finished_at, pending_steer) of the Run row,
        then its `_FENCE_EXTRA_COLUMNS`, locked like select_for_update(no_key=True) where
        the database has row locks.

        Plain SQL: every fenced append (each streamed delta) runs it, and compiling the
        equivalent queryset cost more CPU than the rest of the append (bench/live.py).
        finished_at is only tested for None (SQLite returns it as text here).
        """
        connection = connections[self.using]
        table = _qn(connection, models.Run._meta.db_table)
        columns = ", ".join(_qn(connection, name) for name in (*_FENCE_COLUMNS, *_FENCE_EXTRA_COLUMNS))
        sql = f"SELECT {columns} FROM {table} WHERE {_qn(connection, 'id')} = %s"  # noqa: S608 - quoted names
        sql += _row_lock(connection)
        with connection.cursor() as cursor:
            cursor.execute(sql, [run_id])
            row = cursor.fetchone()
        return tuple(row) if row is not None else None

    def _insert(self, connection: BaseDatabaseWrapper, envelopes: list[Envelope]) -> None:
        # Plain SQL through the fields' own adapters (jsonb on PostgreSQL, text on
        # SQLite): the ORM's bulk_create costs more than the write on SQLite.
        if connection.vendor == "postgresql" or len(envelopes) == 1:
            sql, params = self._insert_statement(connection, envelopes)
            with connection.cursor() as cursor:
                cursor.execute(sql, params)
            return
        created_at = connection.ops.adapt_datetimefield_value(envelopes[0].created_at)
        rows = [_envelope_row(connection, envelope, created_at) for envelope in envelopes]
        with connection.cursor() as cursor:
            # SQLite: one statement bound once per row (executemany reuses it in C).
            # A VALUES list of 6 x N placeholders was rewritten to SQLite's "?" style
            # by a regex over its whole text for every group (py-spy, embedded server).
            cursor.executemany(self._insert_statement(connection, envelopes[:1])[0], rows)

    def _insert_statement(self, connection: BaseDatabaseWrapper, envelopes: list[Envelope]) -> tuple[str, list[Any]]:
        """The INSERT of `envelopes` (and its parameters): one row's VALUES, or on
        PostgreSQL any number of rows as one JSON parameter."""
        table = _qn(connection, models.Envelope._meta.db_table)
        columns = ", ".join(
            _qn(connection, name) for name in ("session_id", "seq", "invocation_id", "type", "payload", "created_at")
        )
        created_at = connection.ops.adapt_datetimefield_value(envelopes[0].created_at)
        if connection.vendor == "postgresql" and len(envelopes) > 1:
            # The rows as one JSON parameter, read by json_to_recordset: the same SQL text
            # for any number of rows, so psycopg converts it once (a VALUES list of 6 x N
            # placeholders was converted anew for every group), and one json.dumps in C
            # where psycopg's client-side binding quoted an array per column element by
            # element in Python (a sixth of a worker's journal thread under 100 streams,
            # bench/chunk_hops.py). The payloads are JSON values in it, stored as jsonb.
            records = [
                {"s": e.session_id, "q": e.seq, "i": e.invocation_id, "t": e.type.value, "p": e.payload}
                for e in envelopes
            ]
            return (
                f"INSERT INTO {table} ({columns}) SELECT r.s, r.q, r.i, r.t, r.p, %s"  # noqa: S608 - quoted names
                " FROM json_to_recordset(%s::json) AS r(s text, q int, i text, t text, p jsonb)",
                [created_at, json.dumps(records, allow_nan=False)],
            )
        return (
            f"INSERT INTO {table} ({columns}) VALUES (%s, %s, %s, %s, %s, %s)",  # noqa: S608 - quoted names
            list(_envelope_row(connection, envelopes[0], created_at)),
        )

    # ---- reads ----

    def _envelope_rows(self, session_id: str, *, after: int) -> list[Envelope]:
        """The session's envelopes with seq > `after`, in seq order.

        Plain SQL, the values converted by the fields' own converters: every run start
        and every socket that catches up reads here, and the queryset's compilation cost
        more than reading a short journal.
        """
        connection = connections[self.using]
        table = _qn(connection, models.Envelope._meta.db_table)
        columns = ", ".join(_qn(connection, name) for name in _ENVELOPE_COLUMNS)
        seq, session = _qn(connection, "seq"), _qn(connection, "session_id")
        with hot_cursor(connection) as cursor:
            cursor.execute(
                f"SELECT {columns} FROM {table} WHERE {session} = %s AND {seq} > %s ORDER BY {seq}",  # noqa: S608 - quoted names
                [session_id, after],
            )
            return _envelopes(connection, session_id, cursor.fetchall())


#: The columns of a session's envelope read (`_envelopes` makes them Envelopes).
_ENVELOPE_COLUMNS = ("seq", "invocation_id", "type", "payload", "created_at")


def _envelopes(connection: BaseDatabaseWrapper, session_id: str, rows: Sequence[Sequence[Any]]) -> list[Envelope]:
    """One session's envelopes from rows of `_ENVELOPE_COLUMNS`, each value converted by its
    field's own converter."""
    payload_of, created_at_of = kept_converters(connection, models.Envelope, ("payload", "created_at"))
    return [
        Envelope(session_id, seq, invocation_id, EventType(event_type), payload_of(payload), created_at_of(created))
        for seq, invocation_id, event_type, payload, created in rows
    ]


def transcript_is_current(transcript: list[Envelope], state: SessionState) -> bool:
    """Whether a transcript read from the newest compaction is all there is: it ends at
    the state's last_seq (seqs are gapless, and the state's columns change only with an
    append, so nothing was journaled since)."""
    return bool(transcript) and transcript[-1].seq == state.last_seq


@functools.cache
def get_journal() -> DatabaseJournal:
    """The process's one DatabaseJournal (the runtime's too): every caller shares it."""
    return DatabaseJournal()


#: Lanes of a group commit for the appends other than deltas (PostgreSQL; see
#: _GroupCommit): a burst of runs starting writes its first chunks in several
#: transactions at once instead of one long one.
OTHER_LANES = 4


@dataclass
class _PendingAppend:
    session_id: str
    events: list[NewEvent]
    fence: Any
    future: asyncio.Future[list[Envelope]]


def _only_deltas(events: list[NewEvent]) -> bool:
    """Whether an append is text deltas only (what the streaming lane carries). By value
    (EventType is a str: the member and its name compare equal), not through EventType():
    the Enum call per event, twice per streamed chunk, was 3% of a worker's CPU (py-spy).
    A plain loop: all() over a generator took 1.8 times its instructions (callgrind)."""
    if not events:
        return False
    for event in events:
        if event.type != EventType.MESSAGE_DELTA:
            return False
    return True


def _wake(lingering: asyncio.Future[None]) -> None:
    if not lingering.done():
        lingering.set_result(None)


class _Lane:
    """One queue of a group commit: its appends waiting for the next transaction, and the
    task that writes them, one transaction after another."""

    def __init__(self) -> None:
        self.pending: list[_PendingAppend] = []
        self.drainer: asyncio.Task[None] | None = None
        #: appends in `pending` that are not deltas only (they end a linger at once)
        self.others = 0
        #: when (the loop's clock) this lane's last group of deltas only started
        self.deltas_started = -math.inf
        #: that group held more than one append (the lane is busy enough to linger)
        self.crowded = False
        #: the drainer's linger, while it waits for more deltas (see _GroupCommit._linger)
        self.lingering: asyncio.Future[None] | None = None

    @property
    def busy(self) -> bool:
        """A transaction of this lane is in flight (or about to be)."""
        return self.drainer is not None and not self.drainer.done()


class _GroupCommit:
    """Group commit of one event loop's appends (a worker's runs, or a server's).

    The first append after a quiet moment is written at once; appends that arrive while
    its transaction is in flight wait and go out together in the next one (one BEGIN, one
    COMMIT, one fsync for all of them): under load the transaction count drops by itself,
    while an idle append is never delayed. Each append is published only after the
    commit that holds it, and its caller returns after that publication, as before.

    On PostgreSQL there are several lanes, each its own transaction after transaction:
    the streaming lane for sessions whose appends are text deltas (the fast path of a
    few statements for the whole group), and OTHER_LANES for everything else (a run
    starting or ending: statements per append), a session with nothing in flight going
    to the idlest. A burst of runs starting made groups of their appends that took
    150-400 ms on a busy machine; every streaming run's next chunk waited behind them,
    and each starting run's first chunk behind all the others' (bench/peers.py at
    N=100: the first second's chunks 0.5-1 s late). A session's appends stay in the
    lane that has one of them queued or in flight, so each session's are still written
    in order; lanes' transactions lock disjoint sessions (and their runs), so they
    cannot deadlock each other. SQLite has one writer: one lane.

    Linger (SECTR_JOURNAL_LINGER_MS, 20 ms; `linger` in seconds here): when the lane's
    previous group of deltas held more than one append (chunks come faster than a write
    takes), a group made only of deltas starts no sooner than `linger` after that one
    started, so under load a lane writes its deltas every few milliseconds in groups of
    many streams instead of one or two chunks a group, each its statement and thread
    hop (bench/linger.py, 500 chunks a second: 0.51 ms of the process's CPU and 0.58 of
    PostgreSQL's per chunk without it, 0.30 and 0.29 with 10 ms, 0.22 and 0.20 with 20). A light load (groups
    of one) never waits, nor does an isolated delta (the previous delta group started
    longer ago than that), and neither does
    a group with anything else in it: an append that is not deltas only (a steer, a
    cancellation, a run's end, a run starting) ends its lane's linger the moment it is
    queued (on PostgreSQL such appends have lanes of their own, but a session's follow
    its deltas into the streaming lane while one is queued there). 0 turns it off; on
    SQLite it is off (its one lane would linger only while it holds deltas alone).
    """

    STREAMING = 0

    def __init__(self, journal: DatabaseJournal) -> None:
        self.journal = journal
        # From the settings, not `connections[...]`: on the event loop that made a new
        # DatabaseWrapper in each task's context, 0.1 ms per append (bench/chunk_hops.py).
        self.sqlite = "sqlite" in connections.settings[journal.using]["ENGINE"]
        #: the streaming lane, then OTHER_LANES lanes for the other appends
        self.lanes = [_Lane() for _ in range(1 + OTHER_LANES)]
        #: session id -> [its lane, its appends queued or in flight there]
        self._held: dict[str, list[int]] = {}
        self.groups = 0  # transactions, for tests and benchmarks
        self.appends = 0
        # Not on SQLite: its one writer thread groups a busy process's appends already,
        # and the embedded server's CPU per chunk did not move with a linger while each
        # chunk's lag grew by its p50 (bench/peers.py embedded, 100 streams).
        self.linger = 0.0 if self.sqlite else settings.SECTR_JOURNAL_LINGER_MS / 1000

    def _lane_for(self, session_id: str, deltas: bool) -> _Lane:
        held = self._held.get(session_id)
        if held is None:
            held = self._held[session_id] = [self._new_lane(deltas), 0]
        held[1] += 1
        return self.lanes[held[0]]

    def _new_lane(self, deltas: bool) -> int:
        """The lane of a session with nothing queued or in flight: its deltas stream, its
        other appends go where the fewest wait (an idle lane first). SQLite: one lane."""
        if self.sqlite:
            return 1
        if deltas:
            return self.STREAMING
        return min(range(1, len(self.lanes)), key=lambda i: (self.lanes[i].busy, len(self.lanes[i].pending)))

    def _release(self, session_id: str) -> None:
        held = self._held[session_id]
        held[1] -= 1
        if not held[1]:
            del self._held[session_id]

    async def append(self, session_id: str, events: list[NewEvent], fence: Any) -> list[Envelope]:
        # A cancelled caller cancels only its future: the append stays in its group (the
        # lane's pending list, not the futures, is what is written), and a done future
        # is passed over when the group's results are handed out. No shield: its second
        # future and callback per append were for nothing.
        return await self.submit(session_id, events, fence)

    def submit(self, session_id: str, events: list[NewEvent], fence: Any) -> asyncio.Future[list[Envelope]]:
        """Queue an append; the future of its envelopes (or of its error)."""
        future: asyncio.Future[list[Envelope]] = asyncio.get_running_loop().create_future()
        deltas = _only_deltas(events)
        lane = self._lane_for(session_id, deltas)
        lane.pending.append(_PendingAppend(session_id, events, fence, future))
        if self.linger and not deltas:
            lane.others += 1
            if lane.lingering is not None:
                _wake(lane.lingering)  # not a delta: it goes now, with the deltas waiting
        if not lane.busy:
            lane.drainer = asyncio.ensure_future(self._drain(lane))
        return future

    async def _drain(self, lane: _Lane) -> None:
        while lane.pending:
            if self.linger and lane.crowded and not lane.others:
                try:
                    await self._linger(lane)
                except BaseException as exc:  # the task was cancelled: its callers learn it
                    group, lane.pending, lane.others = lane.pending, [], 0
                    for item in group:
                        self._release(item.session_id)
                        if not item.future.done():
                            item.future.set_exception(exc)
                    raise
            group, lane.pending = lane.pending, []
            if self.linger and not lane.others:
                lane.deltas_started = asyncio.get_running_loop().time()
                lane.crowded = len(group) > 1
            lane.others = 0
            try:
                await self._commit(group)
            finally:
                for item in group:
                    self._release(item.session_id)

    async def _linger(self, lane: _Lane) -> None:
        """Wait until `linger` after the lane's previous group of deltas started (not at
        all if it is that old), or until an append other than deltas is queued."""
        loop = asyncio.get_running_loop()
        wait = lane.deltas_started + self.linger - loop.time()
        if wait <= 0:
            return
        # A future and a timer: cheaper than a task for wait_for, at every group.
        lane.lingering = lingering = loop.create_future()
        timer = loop.call_later(wait, _wake, lingering)
        try:
            await lingering
        finally:
            timer.cancel()
            lane.lingering = None

    async def _commit(self, group: list[_PendingAppend]) -> None:
        """Write one group in one transaction, publish it, and answer its callers."""
        # Stable sort: appends of one session keep their order; sessions are locked in
        # one order by every group, so two processes' groups cannot deadlock on them.
        group.sort(key=lambda item: item.session_id)
        journal = self.journal
        try:
            # Plainly (no SyncToAsync): a group's write never calls back into the loop.
            results = await run_plain_in_db_thread(journal._append_group, group, sqlite_writer=self.sqlite)
        except BaseException as exc:  # the thread itself failed: every caller learns it
            for item in group:
                if not item.future.done():
                    item.future.set_exception(exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
            return
        self.groups += 1
        self.appends += len(group)
        # Committed: counted once for the group (each count takes the metric's lock).
        envelopes = deltas = 0
        for result in results:
            if not isinstance(result, Exception):
                counted = appended_numbers(result)
                envelopes += counted[0]
                deltas += counted[1]
        count_appended_numbers(envelopes, deltas)
        if journal.publish:
            self._publish(results)
        for item, result in zip(group, results, strict=True):
            if item.future.done():
                continue
            if isinstance(result, LOST_DATABASE_ERRORS):
                # As DatabaseJournal.append raises it, for a `submit` future too.
                unavailable = database_unavailable(result)
                unavailable.__cause__ = result
                item.future.set_exception(unavailable)
            elif isinstance(result, Exception):
                item.future.set_exception(result)
            else:
                item.future.set_result(result)

    @staticmethod
    def _publish(results: list[list[Envelope] | Exception]) -> None:
        """Queue the committed appends for publication, in the group's order (each
        session's in seq order), one message for a session's appends that follow each
        other in the group with no seq between them (a lingered group may hold several
        of one session's): consumers take a message of several envelopes as it comes,
        one publication and one delivery. Appends with a gap between them (another
        process wrote in between) stay separate messages, so a consumer that tracks its
        last seq sees each in order. Queuing never waits (publish.queue_publications, the
        group's messages queued at once): no task per session here (a gather of them was
        a third of the event loop's time under 100 streams, bench/journal.py)."""
        # Each batch a list of its own, extended in place: an append's result is its caller's.
        batches: list[list[Envelope]] = []
        batch: list[Envelope] = []
        for result in results:
            if isinstance(result, Exception) or not result:
                continue
            if batch and (result[0].session_id != batch[-1].session_id or result[0].seq != batch[-1].seq + 1):
                batches.append(batch)
                batch = []
            batch += result
        if batch:
            batches.append(batch)
        queue_publications(batches)
