"""Plain SQL helpers for the journal's hot paths (sessions_app.journal.database and
.projections): what the ORM would do with a value, without compiling a queryset."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

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


def model_columns(connection: BaseDatabaseWrapper, model: type[Any], alias: str) -> str:
    """Every concrete column of `model`, qualified by the table's `alias`, in the model's
    order: the select list whose rows `model_instances` turns into instances."""
    qn = connection.ops.quote_name
    return ", ".join(f"{alias}.{qn(field.column)}" for field in model._meta.concrete_fields)


def model_instances(connection: BaseDatabaseWrapper, model: type[Any], rows: list[tuple[Any, ...]]) -> list[Any]:
    """Instances of `model` from plain rows of `model_columns` (extra trailing values are
    ignored), converted as the ORM would, without compiling a queryset."""
    if not rows:
        return []
    fields = model._meta.concrete_fields
    converters = [column_converter(connection, model, field.name) for field in fields]
    names = [field.attname for field in fields]
    return [
        model.from_db(
            connection.alias, names, [convert(value) for convert, value in zip(converters, row, strict=False)]
        )
        for row in rows
    ]
