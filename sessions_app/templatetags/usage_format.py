"""Numbers on the usage dashboard, in words a person reads at a glance."""

from __future__ import annotations

from typing import Any

from django import template

register = template.Library()


@register.filter
def grouped(value: Any) -> str:
    """12345 -> "12,345" (digits in threes, whatever the locale settings)."""
    try:
        return f"{int(value):,}"
    except (TypeError, ValueError):
        return ""


@register.filter
def waited(seconds: Any) -> str:
    """A wait in the largest units that read well: "40 s", "3.5 min", "2 h 5 min", "3 days"."""
    if seconds is None or seconds == "":
        return "—"
    value = float(seconds)
    if value < 60:
        return f"{value:.0f} s"
    if value < 3600:
        return f"{value / 60:.1f}".rstrip("0").rstrip(".") + " min"
    if value < 86400:
        hours, minutes = divmod(round(value / 60), 60)
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days = value / 86400
    return f"{days:.1f}".rstrip("0").rstrip(".") + (" day" if days == 1 else " days")
