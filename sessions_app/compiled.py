"""Querysets that every worker runs once a second, compiled once.

A worker's periodic looks (stranded messages, asks past their deadline, notifications
due) run whether or not anything is there; building and compiling their querysets each
time cost more CPU than the queries themselves (about 0.6-1 ms a look on an idle worker,
py-spy). `Compiled` is for a queryset whose parameters are all constants; `AtNow` for one
whose only changing parameter is `now`: it puts the prepared `now` in its place.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.db import connection
from django.db.models import Field, QuerySet


def _fetch(sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


class Compiled:
    """`build()`'s rows (values_list tuples, no conversion: plain column values), compiled
    once per vendor: every parameter of the queryset is a constant."""

    def __init__(self, build: Callable[[], QuerySet[Any, Any]]) -> None:
        self.build = build
        self._compiled: dict[str, tuple[str, tuple[Any, ...]]] = {}

    def rows(self) -> list[tuple[Any, ...]]:
        compiled = self._compiled.get(connection.vendor)
        if compiled is None:
            compiled = self._compiled[connection.vendor] = self.build().query.sql_with_params()
        return _fetch(*compiled)

    def clear(self) -> None:
        self._compiled.clear()


class AtNow:
    """`build(now)`'s rows (values_list tuples, no conversion: plain column values),
    compiled once per vendor. `field` is the model field `now` is compared with. When the
    prepared `now` cannot be told apart among the parameters (another one equal to it),
    the queryset is built each time instead."""

    def __init__(self, build: Callable[[datetime], QuerySet[Any, Any]], field: Field[Any, Any]) -> None:
        self.build = build
        self.field = field
        self._compiled: dict[str, tuple[str, tuple[Any, ...], int]] = {}

    def rows(self, now: datetime) -> list[tuple[Any, ...]]:
        prepared = self.field.get_db_prep_value(now, connection)
        compiled = self._compiled.get(connection.vendor)
        if compiled is None:
            sql, params = self.build(now).query.sql_with_params()
            if params.count(prepared) != 1:
                return [row if isinstance(row, tuple) else (row,) for row in self.build(now)]
            compiled = self._compiled[connection.vendor] = (sql, params, params.index(prepared))
        sql, params, at = compiled
        return _fetch(sql, (*params[:at], prepared, *params[at + 1 :]))

    def clear(self) -> None:
        self._compiled.clear()
