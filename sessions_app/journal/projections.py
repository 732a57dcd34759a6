"""The review projections the journal keeps: the search index, the daily usage rollup
and fork links (sessions_app.models SearchEntry, UsageDaily, ForkLink).

Written by DatabaseJournal in the same transaction as the envelopes they reflect, not by
the worker: a projection that commits with its envelopes can never lag behind or get
ahead of the journal (no second source of truth, nothing to repair after a crash), and
every writer of envelopes (worker, actions, `sectr_import`) keeps it current without
knowing about it. The cost stays off the streaming hot path: an all-MESSAGE_DELTA batch
takes the journal's fast path and never reaches here; a message is indexed once, at its
MESSAGE_END (its text read back from its deltas, one indexed query), a user message at
its INVOCATION_STARTED, a tool at its TOOL_CALL, a steer at STEER_RECEIVED. A run's
reply comes with its text (NewEvent.text: its writer journaled every delta of it), so
only an append of another writer (a recovery's, an import's) reads the deltas back.
`rebuild_review_projections` recomputes all three from the journal (`sectr_reindex`).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import date
from typing import Any

from django.db import connections

from sectr.events import Envelope, EventType
from sectr.state import SessionState, apply_envelope, prompt_text
from sessions_app import models
from sessions_app.plain_sql import hot_cursor, kept_converters

#: Characters the search snippets use as highlight markers; removed from indexed text.
MARK_START = "\x02"
MARK_END = "\x03"

_INDEXED = frozenset(
    {
        EventType.SESSION_CREATED,
        EventType.INVOCATION_STARTED,
        EventType.MESSAGE_END,
        EventType.TOOL_CALL,
        EventType.STEER_RECEIVED,
    }
)


#: Search entries per INSERT (4 parameters each, under SQLite's old limit of 999).
ENTRIES_PER_INSERT = 200
#: Usage rows (11 parameters each) an append's one-statement write (`write`) takes at most.
USAGE_ROWS_FOLDED = 16


def searchable(text: str) -> str:
    return text.replace(MARK_START, " ").replace(MARK_END, " ").replace("\x00", " ").strip()


class ReviewProjection:
    """Collects what one append adds to the projections, then writes it in one go.

    `observe` is called for each envelope *before* it is applied to the session's state
    (a MESSAGE_END's model is the open message's model), `write` after the insert.
    """

    def __init__(
        self, session: models.Session, using: str, api_token_key: int | None = None,
        texts: dict[str, str] | None = None, token_keys: dict[str, int] | None = None,
    ) -> None:  # fmt: skip
        self.session = session
        self.texts = texts  # message id: text, when the whole journal is at hand (a rebuild)
        self.using = using
        self.entries: list[models.SearchEntry] = []
        self.ended: list[tuple[Envelope, int | None]] = []  # (MESSAGE_END, its MESSAGE_START seq if in batch)
        self.usage: dict[tuple[date, int, str, str], list[int]] = {}
        self.forks: list[models.ForkLink] = []
        self.api_token_key = api_token_key
        self._starts: dict[str, int] = {}
        self._invocation_tokens: dict[str | None, int] = {}
        self.token_keys = token_keys  # invocation id: API token id, preloaded (a rebuild)
        #: message id: text, of the MESSAGE_ENDs whose writer knew its deltas' text (NewEvent.text)
        self.known_texts: dict[str, str] = {}

    def observe(self, state: SessionState, envelope: Envelope) -> None:
        kind = envelope.type
        if kind is EventType.MESSAGE_START:
            self._starts[str(envelope.payload.get("message_id"))] = envelope.seq
        if kind not in _INDEXED:
            return
        p = envelope.payload
        if kind is EventType.INVOCATION_STARTED:
            reason = p.get("reason") or {}
            if reason.get("kind") == "user_message":
                self._entry(envelope, "user", prompt_text((reason.get("input") or {}).get("content")))
        elif kind is EventType.TOOL_CALL:
            self._entry(envelope, "tool", str(p.get("name") or ""))
        elif kind is EventType.STEER_RECEIVED:
            self._entry(envelope, "steer", str(p.get("text") or ""))
        elif kind is EventType.MESSAGE_END:
            self.ended.append((envelope, self._starts.get(str(p.get("message_id")))))
            usage = p.get("usage")
            if isinstance(usage, dict):
                model = p.get("model") or state.open_message_model or state.model
                token_key = self._token_key(envelope.invocation_id)
                key = (envelope.created_at.date(), token_key, str(model), agent_key(state))
                row = self.usage.setdefault(key, [0, 0, 0, 0, 0])
                for i, name in enumerate(("input_tokens", "output_tokens", "reasoning_tokens", "cached_input_tokens")):
                    value = usage.get(name) or 0
                    row[i] += int(value) if isinstance(value, int) else 0
                row[4] += 1
        elif kind is EventType.SESSION_CREATED:
            origin = p.get("forked_from")
            if isinstance(origin, dict) and isinstance(origin.get("session_id"), str):
                source_id = origin["session_id"]
                if models.Session.objects.using(self.using).filter(pk=source_id).exists():
                    seq = origin.get("seq")
                    self.forks.append(
                        models.ForkLink(
                            child_id=self.session.pk, source_id=source_id, seq=seq if isinstance(seq, int) else 0
                        )
                    )

    def _entry(self, envelope: Envelope, kind: str, text: str) -> None:
        text = searchable(text)
        if text:
            self.entries.append(models.SearchEntry(session_id=self.session.pk, seq=envelope.seq, kind=kind, text=text))

    def know_token_key(self, invocation_id: str, api_token_key: int | None) -> None:
        """The API token of the run whose invocation is `invocation_id`, as its row holds
        it: the appender read the row already (a fenced append), so `_token_key` need not."""
        self._invocation_tokens[invocation_id] = int(api_token_key or 0)

    def _token_key(self, invocation_id: str | None) -> int:
        if self.api_token_key is not None:
            return self.api_token_key
        if self.token_keys is not None:
            return self.token_keys.get(str(invocation_id), 0)
        if invocation_id not in self._invocation_tokens:
            # Plain SQL, as the journal's own reads: once a run (its MESSAGE_END), and the
            # queryset's compilation cost more than the indexed lookup.
            connection = connections[self.using]
            table, column = (connection.ops.quote_name(n) for n in (models.Run._meta.db_table, "invocation_id"))
            with connection.cursor() as cursor:
                cursor.execute(f"SELECT api_token_key FROM {table} WHERE {column} = %s LIMIT 1", [invocation_id])  # noqa: S608
                row = cursor.fetchone()
            self._invocation_tokens[invocation_id] = int(row[0] or 0) if row else 0
        return self._invocation_tokens[invocation_id]

    def statements(self) -> list[tuple[str, list[Any]]] | None:
        """On PostgreSQL, the writes `write` would make, as plain INSERT statements (SQL,
        parameters) the append runs as data-modifying CTEs of its own statement, when
        they need no read (every reply's text known, `known_texts`) and nothing else
        (no fork link); `write` then writes nothing more. None where they cannot be.

        A run's end carries its reply's entry and usage: one statement fewer per run,
        in the same transaction (bench/run_lifecycle.py). All the CTEs of a statement
        see the same snapshot, so a text read back from the deltas inserted beside them
        would miss them: such an append writes through `write`, after its insert."""
        connection = connections[self.using]
        if connection.vendor != "postgresql" or self.forks or self.texts is not None:
            return None
        texts = []
        for end, start_seq in self.ended:
            message_id = end.payload.get("message_id")
            if start_seq is not None or not isinstance(message_id, str) or message_id not in self.known_texts:
                return None
            texts.append((end, self.known_texts[message_id]))
        if len(self.entries) + len(texts) > ENTRIES_PER_INSERT or len(self.usage) > USAGE_ROWS_FOLDED:
            return None
        for end, text in texts:
            self._entry(end, "assistant", text)
        self.ended = []
        statements = []
        if self.entries:
            statements.append(self._entries_insert(self.entries))
            self.entries = []
        if self.usage:
            statements.append(self._usage_upsert(self.usage))
            self.usage = {}
        return statements

    def write(self, usage: bool = True) -> None:
        for end, start_seq in self.ended:
            self._entry(end, "assistant", self._message_text(end, start_seq))
        usage = usage and bool(self.usage)
        connection = connections[self.using]
        if (
            usage
            and self.entries
            and len(self.entries) <= ENTRIES_PER_INSERT
            and len(self.usage) <= USAGE_ROWS_FOLDED
            and connection.vendor == "postgresql"
        ):
            # A run's end has both (its reply's entry, its usage): one statement, the
            # entries' INSERT a data-modifying CTE of the usage's upsert, instead of two
            # round trips inside the append's transaction. Same rows, same transaction.
            entries_sql, entries_params = self._entries_insert(self.entries)
            usage_sql, usage_params = self._usage_upsert(self.usage)
            with hot_cursor(connection) as cursor:
                cursor.execute(f"WITH entries AS ({entries_sql}) {usage_sql}", [*entries_params, *usage_params])
            usage = False
        elif self.entries:
            self._insert_entries()
        if usage:
            self._upsert_usage()
        if self.forks:
            models.ForkLink.objects.using(self.using).bulk_create(self.forks, ignore_conflicts=True)

    def _insert_entries(self) -> None:
        """The entries in one plain INSERT: a run's reply is indexed at its MESSAGE_END and
        a message at its start, and the ORM's bulk_create compiled more than it wrote."""
        connection = connections[self.using]
        with hot_cursor(connection) as cursor:
            for start in range(0, len(self.entries), ENTRIES_PER_INSERT):  # a rebuild has many
                cursor.execute(*self._entries_insert(self.entries[start : start + ENTRIES_PER_INSERT]))

    def _entries_insert(self, batch: list[models.SearchEntry]) -> tuple[str, list[Any]]:
        """The INSERT of a batch of entries: (SQL, parameters)."""
        table = connections[self.using].ops.quote_name(models.SearchEntry._meta.db_table)
        return (
            f"INSERT INTO {table} (session_id, seq, kind, text) VALUES "  # noqa: S608 - quoted name
            + ", ".join("(%s, %s, %s, %s)" for _ in batch),
            [v for e in batch for v in (e.session_id, e.seq, e.kind, e.text)],
        )

    def _message_text(self, end: Envelope, start_seq: int | None) -> str:
        """The text of the message `end` closes, from its deltas (already inserted)."""
        message_id = end.payload.get("message_id")
        if self.texts is not None:
            return self.texts.get(str(message_id), "")
        if start_seq is None and isinstance(message_id, str) and message_id in self.known_texts:
            # What the read below would find: the deltas since the newest MESSAGE_START,
            # as the writer that journaled them (and that start) appended them.
            return self.known_texts[message_id]
        # Plain SQL, as the journal's own reads: every run's MESSAGE_END reads its deltas
        # back here, inside the append's transaction, and the querysets' compilation (and
        # a model field per row) cost more than the read. The MESSAGE_START is found on the
        # (session, type, seq) index, which holds no deltas (its predicate spelled out as
        # a literal: `type = %s` implies it only while the type is bound into the text); the deltas
        # between the two on the (session, seq) index, which holds every row.
        connection = connections[self.using]
        qn = connection.ops.quote_name
        table, session, seq, kind = (qn(n) for n in (models.Envelope._meta.db_table, "session_id", "seq", "type"))
        with hot_cursor(connection) as cursor:
            if start_seq is None:
                cursor.execute(
                    f"SELECT {seq} FROM {table} WHERE {session} = %s AND {kind} = %s AND {seq} < %s"  # noqa: S608 - quoted names
                    f" AND NOT ({kind} = '{EventType.MESSAGE_DELTA.value}') ORDER BY {seq} DESC LIMIT 1",
                    [self.session.pk, EventType.MESSAGE_START.value, end.seq],
                )
                row = cursor.fetchone()
                start_seq = int(row[0]) if row else 0
            cursor.execute(
                f"SELECT payload FROM {table} WHERE {session} = %s AND {kind} = %s AND {seq} > %s AND {seq} < %s"  # noqa: S608 - quoted names
                f" ORDER BY {seq}",
                [self.session.pk, EventType.MESSAGE_DELTA.value, start_seq, end.seq],
            )
            rows = cursor.fetchall()
        (payload_of,) = kept_converters(connection, models.Envelope, ("payload",))
        deltas = (payload_of(payload) for (payload,) in rows)
        return "".join(
            str(p.get("text") or "") for p in deltas if isinstance(p, dict) and p.get("message_id") == message_id
        )

    def _upsert_usage(self) -> None:
        with hot_cursor(connections[self.using]) as cursor:
            for key, row in self.usage.items():  # a rebuild's may be many: one statement each
                cursor.execute(*self._usage_upsert({key: row}))

    def _usage_upsert(self, rows: dict[tuple[date, int, str, str], list[int]]) -> tuple[str, list[Any]]:
        """The upsert of usage rows into the rollup, one statement for all of them (their
        keys are distinct: no row is touched twice): (SQL, parameters)."""
        connection = connections[self.using]
        table = connection.ops.quote_name(models.UsageDaily._meta.db_table)
        counters = ("input_tokens", "output_tokens", "reasoning_tokens", "cached_input_tokens", "messages")
        updates = ", ".join(f"{name} = {table}.{name} + excluded.{name}" for name in counters)
        params: list[Any] = []
        for (day, token_key, model, agent), row in rows.items():
            params += [
                connection.ops.adapt_datefield_value(day),
                self.session.owner_id,
                self.session.team_id or 0,
                token_key,
                model,
                agent,
                *row,
            ]
        values = ", ".join(["(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"] * len(rows))
        sql = (
            f"INSERT INTO {table} (day, user_id, team_key, api_token_key, model, agent_key, {', '.join(counters)}) "  # noqa: S608
            f"VALUES {values} "
            f"ON CONFLICT (day, user_id, team_key, api_token_key, model, agent_key) DO UPDATE SET {updates}"
        )
        return sql, params


#: The usage rollup's agent key of an experiment's replay starts with this.
REPLAY_USAGE_PREFIX = "replay:"


def agent_key(state: SessionState) -> str:
    """The usage rollup's key of the agent version a session runs with ("" for the
    built-in agent)."""
    pin = state.agent or {}
    key = f"{pin['id']}:{pin.get('version') or 1}" if pin.get("id") else ""
    # A replay's tokens count against the team's budget like any, but are shown apart.
    return REPLAY_USAGE_PREFIX + key if state.replay is not None else key


def rebuild_review_projections(
    session: models.Session, using: str = "default", usage: bool = True, token_keys: dict[str, int] | None = None
) -> ReviewProjection:
    """Recompute a session's search entries and fork link from its journal, and (with
    `usage`) add its usage into the rollup again. The rollup sums every session of a
    (day, owner, team, token, model), so one session's share cannot be replaced on its
    own: clear UsageDaily before rebuilding every session with `usage` (sectr_reindex
    does). Returns the projection (its `usage` is this session's share)."""
    models.SearchEntry.objects.using(using).filter(session=session).delete()
    models.ForkLink.objects.using(using).filter(child=session).delete()
    envelopes = [row.to_envelope() for row in session.envelopes.using(using).order_by("seq")]
    projection = ReviewProjection(session, using, texts=message_texts(envelopes), token_keys=token_keys)
    observe_all(projection, envelopes, SessionState(session_id=session.pk))
    projection.write(usage=usage)
    return projection


def message_texts(envelopes: Iterable[Envelope]) -> dict[str, str]:
    """Each message's text, joined from its deltas (what `_message_text` reads back)."""
    texts: dict[str, list[str]] = {}
    for envelope in envelopes:
        if envelope.type is EventType.MESSAGE_DELTA and isinstance(envelope.payload, dict):
            texts.setdefault(str(envelope.payload.get("message_id")), []).append(
                str(envelope.payload.get("text") or "")
            )
    return {message_id: "".join(parts) for message_id, parts in texts.items()}


def observe_all(projection: ReviewProjection, envelopes: Iterable[Envelope], state: SessionState) -> Any:
    for envelope in envelopes:
        projection.observe(state, envelope)
        apply_envelope(state, envelope)
    return state
