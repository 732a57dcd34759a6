"""Template helpers of the moderation pages: the `Approvals` badge and verdict words."""

from __future__ import annotations

from typing import Any

from django import template

from sessions_app.moderation.queue import badge_context

register = template.Library()

VERDICT_LABELS = {
    "allow_once": "Approved once",
    "allow_always": "Always allowed",
    "deny": "Denied",
    "respond": "Answered",
}


@register.inclusion_tag("moderation/_badge.html", takes_context=True)
def approvals_badge(context: template.Context) -> dict[str, Any]:
    """The count badge on `Approvals`: how many asks wait for the user's decision (live
    for moderators: it polls /approvals/badge)."""
    request = context.get("request")
    user = getattr(request, "user", None) or context.get("user")
    return badge_context(user)


@register.filter
def verdict_label(verdict: Any) -> str:
    return VERDICT_LABELS.get(str(verdict), str(verdict))
