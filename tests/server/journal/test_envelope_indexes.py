"""What the journal's hot path costs PostgreSQL: the indexes a text delta is written into,
the reads that still find their rows through them, and the prepared statement of a
group of deltas.

Run on SQLite and on PostgreSQL; the plan and prepared-statement checks on PostgreSQL only.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client

from sectr.events import EventType, usage_dict
from sectr.journal import NewEvent
from sessions_app.journal import DatabaseJournal
from sessions_app.journal.database import _PendingAppend
from sessions_app.models import Run, SearchEntry, Session

E = EventType
postgres_only = pytest.mark.skipif("connection.vendor != 'postgresql'")


def delta(text: str, invocation_id: str = "inv_1") -> NewEvent:
    return NewEvent(E.MESSAGE_DELTA, {"message_id": "msg_1", "text": text}, invocation_id)


def envelope_indexes() -> dict[str, str]:
    """{index name: its definition} of the envelope table."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'sessions_app_envelope'")
        else:
            cursor.execute(
                "SELECT name, sql FROM sqlite_master WHERE type = 'index' AND tbl_name = 'sessions_app_envelope'"
            )
        # SQLite: the unique (session, seq) is the table's own constraint (sqlite_autoindex_...).
        return {name: sql for name, sql in cursor.fetchall() if not name.startswith("sqlite_autoindex_")}


@pytest.mark.django_db
def test_text_deltas_are_written_only_into_the_session_seq_index() -> None:
    indexes = envelope_indexes()
    expected = {"envelope_session_type_seq", "envelope_invocation", "envelope_failed_session"}
    if connection.vendor == "postgresql":
        expected |= {"sessions_app_envelope_pkey", "envelope_session_seq_uniq"}
        assert "WHERE" not in indexes["envelope_session_seq_uniq"]
    assert set(indexes) == expected, indexes
    for name in ("envelope_session_type_seq", "envelope_invocation"):
        bare = re.sub(r'[()"]|::text', "", indexes[name])  # as PostgreSQL and SQLite spell it
        assert bare.endswith("WHERE NOT type = 'MESSAGE_DELTA'"), indexes[name]


@pytest.mark.django_db
def test_an_envelope_is_written_without_a_foreign_key_check_and_deleted_with_its_session(session: Session) -> None:
    """No foreign key constraint on the envelope's session (no check per streamed chunk at
    COMMIT); a deleted session still takes its journal with it."""
    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(cursor, "sessions_app_envelope")
    assert not [name for name, constraint in constraints.items() if constraint["foreign_key"]], constraints
    journal = DatabaseJournal(publish=False)
    journal.append_sync(session.id, [delta("one"), delta("two")])
    session_id = session.id
    session.delete()
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM sessions_app_envelope WHERE session_id = %s", [session_id])
        assert cursor.fetchone()[0] == 0


@postgres_only
@pytest.mark.django_db
def test_a_message_start_is_found_on_the_partial_index_even_by_a_generic_plan(session: Session) -> None:
    """ReviewProjection._message_text finds a message's start on the (session, type, seq)
    index, which holds no deltas: its query names the index's predicate itself, so even a
    plan made without the parameters' values (a prepared statement's) can use it."""
    journal = DatabaseJournal(publish=False)
    journal.append_sync(session.id, [NewEvent(E.MESSAGE_START, {"message_id": "msg_1", "role": "assistant"}, "inv_1")])
    with connection.cursor() as cursor:  # a long message: 20,000 deltas
        cursor.execute(
            "INSERT INTO sessions_app_envelope (session_id, seq, invocation_id, type, payload, created_at)"
            " SELECT %s, 2 + n, 'inv_1', 'MESSAGE_DELTA',"
            " jsonb_build_object('message_id', 'msg_1', 'text', 'word '), now()"
            " FROM generate_series(1, 20000) AS n",
            [session.id],
        )
        cursor.execute("UPDATE sessions_app_session SET last_seq = 20002 WHERE id = %s", [session.id])
        cursor.execute("ANALYZE sessions_app_envelope")
    statements: list[tuple[str, Any]] = []

    def keep(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        statements.append((sql, params))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(keep):
        journal.append_sync(session.id, [NewEvent(E.MESSAGE_END, {"message_id": "msg_1", "usage": usage_dict(1, 1)})])
    (start_sql, params), *_ = [(sql, p) for sql, p in statements if "MESSAGE_DELTA" in sql and "DESC LIMIT 1" in sql]
    numbered = iter(range(1, 10))
    generic = re.sub("%s", lambda _m: f"${next(numbered)}", start_sql)
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        cursor.execute(f"PREPARE message_start (text, text, int) AS {generic}")
        try:
            cursor.execute("EXPLAIN EXECUTE message_start (%s, %s, %s)", params)
            plan = "\n".join(row[0] for row in cursor.fetchall())
        finally:
            cursor.execute("DEALLOCATE message_start")
    # On a partial index (envelope_session_type_seq; in a table this small the planner
    # may take envelope_invocation's few rows instead): not through the 20,000 deltas.
    assert re.search(r"Index (Only )?Scan( Backward)? using envelope_(session_type_seq|invocation) ", plan), plan
    assert "Seq Scan" not in plan and "envelope_session_seq_uniq" not in plan, plan
    # And the reply's text is the deltas', read between its start and its end.
    entry = SearchEntry.objects.get(session=session, seq=20003)
    assert entry.text.startswith("word word word")


@pytest.mark.django_db
def test_the_admin_finds_an_invocations_envelopes_deltas_included(make_session: Any) -> None:
    first, second = make_session(), make_session()
    journal = DatabaseJournal(publish=False)
    started = {"reason": {"kind": "user_message", "input": {"content": "hi"}}}
    for session, inv in ((first, "inv_a"), (second, "inv_b")):
        journal.append_sync(session.id, [NewEvent(E.INVOCATION_STARTED, started, inv)])
        journal.append_sync(session.id, [delta("one", inv), delta("two", inv)])
    journal.append_sync(first.id, [NewEvent(E.INVOCATION_STARTED, started, "inv_c"), delta("three", "inv_c")])
    admin_user = get_user_model().objects.create_superuser(username="root", email="root@example.org", password=None)
    client = Client()
    client.force_login(admin_user)

    def found(term: str) -> list[tuple[str, int]]:
        response = client.get("/admin/sessions_app/envelope/", {"q": term})
        assert response.status_code == 200
        changelist = response.context["cl"]
        return sorted((row.session_id, row.seq) for row in changelist.queryset)

    assert found("inv_a") == [(first.id, 2), (first.id, 3), (first.id, 4)]
    assert found("inv_c") == [(first.id, 5), (first.id, 6)]
    assert found(second.id) == [(second.id, seq) for seq in (1, 2, 3, 4)]
    assert found("inv_nobody") == []


def prepared_statements() -> dict[str, tuple[int, int]]:
    """{statement: (generic plans, custom plans)} prepared on this connection."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements")
        return {statement: (generic, custom) for statement, generic, custom in cursor.fetchall()}


@postgres_only
@pytest.mark.django_db
def test_a_group_of_deltas_is_one_prepared_statement_planned_a_few_times(make_session: Any) -> None:
    """`_bump_and_insert_deltas` runs prepared: PostgreSQL keeps a generic plan after a
    few custom ones. The connection prepares only the statements asked for (the
    journal's), none of Django's own."""
    sessions = [make_session(), make_session()]
    runs = [
        Run.objects.create(session=s, invocation_id=f"inv_{i}", status=Run.RUNNING, lease_owner="w", lease_token="tok")
        for i, s in enumerate(sessions)
    ]
    journal = DatabaseJournal(publish=False)

    def group(i: int, token: str = "tok") -> list[Any]:
        items = [
            _PendingAppend(s.id, [delta(f"{i} ", r.invocation_id or "")], (r.id, token), None)  # type: ignore[arg-type]
            for s, r in zip(sessions, runs, strict=True)
        ]
        return journal._append_group(items)

    before = prepared_statements()
    for i in range(8):
        results = group(i)
        assert [[e.seq for e in result] for result in results] == [[2 + i], [2 + i]]
    journal.append_sync(sessions[0].id, [NewEvent(E.SESSION_UPDATED, {"title": "t"})])
    after = prepared_statements()
    (statement,) = [text for text in after if "json_object_keys" in text]
    assert 'INSERT INTO "sessions_app_envelope"' in statement
    # The journal's own plain statements (and the session row's read), none of Django's
    # (the sessions' and runs' INSERTs above).
    assert all(text.startswith(("WITH ", 'SELECT "id", "owner_id"')) for text in after), after
    generic, custom = after[statement]
    earlier_generic, earlier_custom = before.get(statement, (0, 0))
    assert generic + custom - earlier_generic - earlier_custom == 8
    assert custom <= 5
    # A refused fence still writes nothing, through the prepared statement too.
    assert all(isinstance(result, Exception) for result in group(8, token="stale"))
    assert [Session.objects.get(pk=s.pk).last_seq for s in sessions] == [10, 9]


@postgres_only
@pytest.mark.django_db
def test_a_group_of_deltas_finds_its_fences_runs_by_primary_key(make_session: Any) -> None:
    """The group's statement reads its fences' Run rows through the primary key, even in
    a plan made without the parameters' values (not by a scan of every unfinished run,
    which grew with the table's dead rows)."""
    sessions = [make_session(), make_session()]
    runs = [
        Run.objects.create(session=s, invocation_id=f"inv_{i}", status=Run.RUNNING, lease_token="tok")
        for i, s in enumerate(sessions)
    ]
    other = make_session()
    Run.objects.bulk_create(
        [Run(session=other, invocation_id=f"inv_o{i}", status=Run.COMPLETED, lease_token="x") for i in range(2000)]
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE sessions_app_run")
    statements: list[tuple[str, Any]] = []

    def keep(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        statements.append((sql, params))
        return execute(sql, params, many, context)

    journal = DatabaseJournal(publish=False)
    with connection.execute_wrapper(keep):
        items = [_PendingAppend(s.id, [delta("a ")], (r.id, "tok"), None) for s, r in zip(sessions, runs, strict=True)]
        assert all(isinstance(result, list) for result in journal._append_group(items))  # type: ignore[arg-type]
    ((sql, params),) = [(sql, params) for sql, params in statements if "json_object_keys" in sql]
    numbered = re.sub(r"%s", lambda _m, n=iter(range(1, 100)): f"${next(n)}", sql)
    with connection.cursor() as cursor:
        cursor.execute("SET plan_cache_mode = force_generic_plan")
        cursor.execute(f"PREPARE fenced_plan AS {numbered}")
        literals = ", ".join(connection.ops.compose_sql("%s", [value]) for value in params)
        cursor.execute(f"EXPLAIN EXECUTE fenced_plan({literals})")
        plan = "\n".join(row[0] for row in cursor.fetchall())
        cursor.execute("DEALLOCATE fenced_plan")
        cursor.execute("RESET plan_cache_mode")
    fenced = plan.split("CTE fenced")[1].split("CTE bumped")[0]
    assert "sessions_app_run_pkey" in fenced, plan
    assert "Seq Scan" not in fenced, plan
