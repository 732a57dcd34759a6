"""Template helpers of the moderation pages: the `Approvals` badge, verdict words and what
the viewer may do with an approval card."""

from __future__ import annotations

import re
from typing import Any

from django import template

from sessions_app.display.approvals import ApprovalView, ViewerPart
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


_MCP_NAME = re.compile(r"^([a-z0-9][a-z0-9-]{0,31})__(.+)$")


@register.filter
def mcp_parts(tool: str) -> dict[str, str] | None:
    """`{"server", "tool"}` of an MCP tool's name (``git__git_commit``), else None: the
    audit names the server and the server's own tool."""
    match = _MCP_NAME.match(tool or "")
    return {"server": match.group(1), "tool": match.group(2)} if match else None


@register.simple_tag
def approval_part(item: ApprovalView, viewer: Any, owner: Any, can_approve: Any) -> ViewerPart:
    """`ApprovalView.for_viewer` for a template: {% approval_part item viewer owner can_approve as part %}."""
    return item.for_viewer(str(viewer) if viewer else None, str(owner) if owner else None, bool(can_approve))
