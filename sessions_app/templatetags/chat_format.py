"""Template filters for how the pages say when something happened.

`ago` is the short relative time a chat shows ("just now", "5 min ago", "3 h ago",
"2 days ago", then the date); the absolute time goes in the <time> element's title.
static/sectr.js recomputes the relative words every half minute from `datetime`, so a
page left open does not keep saying "just now".
"""

from __future__ import annotations

from datetime import datetime

from django import template
from django.utils import timezone

register = template.Library()


@register.filter
def ago(moment: datetime | None) -> str:
    if moment is None:
        return ""
    seconds = (timezone.now() - moment).total_seconds()
    if seconds < 60:
        return "just now"
    if seconds < 3600:
        return f"{int(seconds // 60)} min ago"
    if seconds < 86400:
        return f"{int(seconds // 3600)} h ago"
    if seconds < 7 * 86400:
        days = int(seconds // 86400)
        return f"{days} day{'s' if days > 1 else ''} ago"
    return timezone.localtime(moment).strftime("%Y-%m-%d")


@register.filter
def absolute(moment: datetime | None) -> str:
    """The full time, for a tooltip: 2025-12-01 10:27:05 UTC."""
    if moment is None:
        return ""
    return timezone.localtime(moment).strftime("%Y-%m-%d %H:%M:%S %Z")


@register.filter
def thumbs_of(votes: dict[str, int] | None, message_id: str) -> int | None:
    """The user's own earlier thumbs on a message (+1, -1), None when they gave none."""
    return (votes or {}).get(message_id)
