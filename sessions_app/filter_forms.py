"""Form fields for the filter forms of the lists (the approval queue, the audit, the
review search): Django forms, with the leniency a list's filters want.

A filter is read from a query string someone may have bookmarked or typed, so a value
too long is cut, not refused (`CutText`), a value that is not one of the choices means
"no filter" (`ChoiceOrNothing`), and a checkbox is on for "1", "on" or "true" (`Flag`).
A value that cannot mean anything (an unknown verdict, a date that is none) is a form
error; each form says what it makes of its errors (the audit refuses the request, the
search ignores the field and says so).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django import forms


class CutText(forms.Field):
    """Free text, cut to `limit` characters (stripped first unless `strip=False`)."""

    def __init__(self, limit: int, *, strip: bool = True, **options: Any) -> None:
        super().__init__(required=False, **options)
        self.limit = limit
        self.strip = strip

    def to_python(self, value: Any) -> str:
        text = str(value or "")
        return (text.strip() if self.strip else text)[: self.limit]


class ChoiceOrNothing(forms.Field):
    """One of `choices`, or "" for anything else (no such filter: everything)."""

    def __init__(self, choices: Iterable[str], *, strip: bool = True, **options: Any) -> None:
        super().__init__(required=False, **options)
        self.allowed = frozenset(choices)
        self.strip = strip

    def to_python(self, value: Any) -> str:
        text = str(value or "")
        text = text.strip() if self.strip else text
        return text if text in self.allowed else ""


class PickOne(ChoiceOrNothing):
    """One of `options` (value, label), shown as a select whose first option, "any",
    means no filter; anything else typed into the URL also means no filter. For the
    names a viewer may pick from (their teams, the people whose sessions they see)."""

    def __init__(self, options: Iterable[tuple[str, str]], *, blank: str = "any", **extra: Any) -> None:
        listed = list(options)
        super().__init__([value for value, _ in listed], widget=forms.Select(choices=[("", blank), *listed]), **extra)


class FlagBox(forms.CheckboxInput):
    """A checkbox that hands the submitted text to `Flag` as it came ("0" stays off)."""

    def value_from_datadict(self, data: Any, files: Any, name: str) -> Any:
        return data.get(name)


class Flag(forms.Field):
    """A checkbox: on for "1", "on" or "true", off for anything else."""

    widget = FlagBox(check_test=lambda value: value in ("1", "on", "true", True))

    def __init__(self, **options: Any) -> None:
        super().__init__(required=False, **options)

    def to_python(self, value: Any) -> bool:
        return value in ("1", "on", "true")


def first_error(form: forms.Form) -> str | None:
    """The first error message of a bound form, in the order its fields are declared."""
    for name in form.fields:
        errors = form.errors.get(name)
        if errors:
            return str(errors[0])
    return None
