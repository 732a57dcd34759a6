"""Plain SQL helpers for the hot paths (the journal, a run's claim and creation, a
token's check): what the ORM would do with a value or a row, without compiling a
queryset."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import psycopg
from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper


def column_converter(connection: BaseDatabaseWrapper, model: type[Any], name: str) -> Callable[[Any], Any]:
    """What turns a value of `model.name` as a plain cursor returns it into what the ORM
    would return (a JSON field's text into its value, SQLite's naive datetimes into aware
    ones...): the backend's and the field's converters, in the ORM's order."""
    column = model._meta.get_field(name).get_col(model._meta.db_table)
    converters = connection.ops.get_db_converters(column) + column.get_db_converters(connection)

    def convert(value: Any) -> Any:
        for converter in converters:
            value = converter(value, column, connection)
        return value

    return convert


def kept_converters(
    connection: BaseDatabaseWrapper, model: type[Any], names: tuple[str, ...]
) -> list[Callable[[Any], Any]]:
    """`column_converter` of each of `model`'s fields `names`, kept on the connection (a
    thread's own, long-lived): working them out (each field's column, both lists of
    converters) cost more than converting a row."""
    connection = connections[connection.alias]  # the thread's own, not django.db.connection's proxy
    cache: dict[tuple[type[Any], tuple[str, ...]], list[Callable[[Any], Any]]]
    cache = connection.__dict__.setdefault("_sectr_converters", {})
    key = (model, names)
    converters = cache.get(key)
    if converters is None:
        converters = cache[key] = [column_converter(connection, model, name) for name in names]
    return converters


def model_columns(connection: BaseDatabaseWrapper, model: type[Any], alias: str) -> str:
    """Every concrete column of `model`, qualified by the table's `alias`, in the model's
    order: the select list whose rows `model_instances` turns into instances."""
    qn = connection.ops.quote_name
    return ", ".join(f"{alias}.{qn(field.column)}" for field in model._meta.concrete_fields)


def model_instances(
    connection: BaseDatabaseWrapper, model: type[Any], rows: Sequence[Sequence[Any]], start: int = 0
) -> list[Any]:
    """Instances of `model` from plain rows holding `model_columns` from position `start`
    (other values before and after them are ignored), converted as the ORM would,
    without compiling a queryset."""
    if not rows:
        return []
    fields = model._meta.concrete_fields
    converters = kept_converters(connection, model, tuple(field.name for field in fields))
    names = [field.attname for field in fields]
    end = start + len(names)
    return [
        model.from_db(
            connection.alias, names, [convert(value) for convert, value in zip(converters, row[start:end], strict=True)]
        )
        for row in rows
    ]


def insert_instance(connection: BaseDatabaseWrapper, instance: Any) -> None:
    """`instance.save()` of a new row whose primary key is already set (a default made
    it), in one plain INSERT of every concrete column, each value through its field's
    own adapter: what the ORM would write, without compiling the INSERT (which cost more
    than running it). No signals are sent: only for models that have no receivers."""
    meta = type(instance)._meta
    if instance.pk is None:
        raise ValueError(f"{meta.label}: insert_instance needs the primary key set")
    qn = connection.ops.quote_name
    fields = meta.concrete_fields
    values = [field.get_db_prep_save(field.pre_save(instance, True), connection) for field in fields]
    columns = ", ".join(qn(field.column) for field in fields)
    placeholders = ", ".join(["%s"] * len(fields))
    with hot_cursor(connection) as cursor:
        cursor.execute(f"INSERT INTO {qn(meta.db_table)} ({columns}) VALUES ({placeholders})", values)  # noqa: S608 - quoted names
    instance._state.adding = False
    instance._state.db = connection.alias


#: psycopg's prepare_threshold for a connection that had none (Django turns automatic
#: preparing off): so high that only the statements `_prepared_cursor` runs are prepared.
PREPARE_ON_REQUEST_ONLY = 1 << 62


class _PreparingCursor(psycopg.Cursor[Any]):
    """A psycopg cursor that binds its parameters on the server and prepares every
    statement it runs (once per connection; later runs execute the prepared one)."""

    def execute(
        self, query: Any, params: Any = None, *, prepare: bool | None = None, binary: bool | None = None
    ) -> Any:
        return super().execute(query, params, prepare=True, binary=binary)

    def _convert_query(self, query: Any, params: Any = None) -> Any:
        # Kept where ClientCursor keeps it: Django's query log (CaptureQueriesContext,
        # DEBUG) reads the statement's text from `_query` (last_executed_query).
        converted = super()._convert_query(query, params)
        self._query = converted
        return converted


def prepared_cursor(connection: BaseDatabaseWrapper) -> Any:
    """A cursor like `connection.cursor()` (Django's wrapper: its execute wrappers, query
    log, error translation and broken-transaction check), whose statements are prepared
    on the server (PostgreSQL only).

    Django's psycopg backend binds parameters on the client (ClientCursor): each
    statement reaches PostgreSQL as new text, parsed and planned every time. For the
    journal's statement per streamed chunk (`_bump_and_insert_deltas`, one plan of five
    CTEs) the planning cost more than the execution; prepared, PostgreSQL plans it once,
    generically, and keeps the plan for the connection (pooled connections live on, and
    their prepared statements with them; settings.POSTGRES_SESSION_OPTIONS skips the
    five plans for the parameters' values PostgreSQL would make first): its backend CPU per chunk
    dropped from 0.78 to 0.31 ms (a loop of one-delta appends, /proc). The two
    statements of every other fenced append (a message's start and end, a tool call,
    a run's end) are prepared too: 0.67-0.83 -> 0.51 ms per append. So are a run's
    POST statements (token check, team rules, session lock, pending checks, Run INSERT)
    and its claim's two reads (one array parameter, not an IN list whose text changed
    with the batch): 2.4-3.1 -> 1.9-2.0 ms of backend CPU for one of each, on one
    connection (/proc). Only the statements asked for are prepared: the connection's
    threshold for preparing on its own stays out of reach, as Django's default None
    had it.

    A statement run this way must not rely on its parameters' values in the plan (a
    partial index whose predicate a parameter would imply, say): a generic plan is
    made without them.
    """
    # Django's own steps of `connection.cursor()` (`_cursor`), with this cursor in place
    # of `create_cursor()`'s: `_prepare_cursor` checks the thread and wraps it.
    connection.close_if_health_check_failed()
    connection.ensure_connection()
    raw = connection.connection
    if raw.prepare_threshold is None:
        raw.prepare_threshold = PREPARE_ON_REQUEST_ONLY
    with connection.wrap_database_errors:
        return connection._prepare_cursor(_PreparingCursor(raw))  # type: ignore[attr-defined]


def hot_cursor(connection: BaseDatabaseWrapper) -> Any:
    """`prepared_cursor` on PostgreSQL, `connection.cursor()` elsewhere: for a statement
    every run (or every append) runs with the same text, whose planning costs PostgreSQL
    more than running it."""
    return prepared_cursor(connection) if connection.vendor == "postgresql" else connection.cursor()
