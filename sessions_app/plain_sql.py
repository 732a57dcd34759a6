"""Plain SQL helpers for the hot paths (the journal, a run's claim and creation, a
token's check): what the ORM would do with a value or a row, without compiling a
queryset."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

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
    with connection.cursor() as cursor:
        cursor.execute(f"INSERT INTO {qn(meta.db_table)} ({columns}) VALUES ({placeholders})", values)  # noqa: S608 - quoted names
    instance._state.adding = False
    instance._state.db = connection.alias
