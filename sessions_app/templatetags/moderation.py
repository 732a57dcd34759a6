"""Template helpers of the moderation pages: the `Approvals` badge and verdict words."""

from __future__ import annotations

from typing import Any

from django import template

from sessions_app.moderation.queue import pending_count

register = template.Library()

VERDICT_LABELS = {"allow_once": "Approved once", "allow_always": "Always allowed", "deny": "Denied"}


@register.simple_tag(takes_context=True)
def approvals_pending(context: template.Context) -> int:
    """How many asks wait for the user's decision (the count badge on `Approvals`)."""
    request = context.get("request")
    user = getattr(request, "user", None) or context.get("user")
    return pending_count(user) if user is not None else 0


@register.filter
def verdict_label(verdict: Any) -> str:
    return VERDICT_LABELS.get(str(verdict), str(verdict))
