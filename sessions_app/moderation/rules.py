"""The rules page's logic: a rule from its form, and "test this rule" (which of the
team's past asks a rule would have matched).

The preview reads the audit's ask rows (AuditEntry, written with the journal), so it
sees exactly the tool and arguments each ask carried, and matches them with the core's
own matcher (sectr.rules.Rule.matches): a rule that would never have matched shows an
empty list before anyone relies on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.http import QueryDict

from sectr.errors import ValidationFailed
from sectr.rules import Rule
from sessions_app.models import AuditEntry, Team

#: How many past asks the preview looks at (newest first), and how many it lists.
PREVIEW_SCAN = 2000
PREVIEW_LIST = 50


def _whole_or_none(raw: str, name: str) -> int | None:
    raw = raw.strip()
    if not raw:
        return None
    if not (raw.isascii() and raw.isdigit()):
        raise ValidationFailed(f"{name} must be a whole number", code="invalid_rule")
    return int(raw)


def rule_data_from_form(form: QueryDict) -> dict[str, Any]:
    """The rule a form describes, as the rule actions take it (they validate it again).

    Arguments are one `name=glob` a line."""
    arguments: dict[str, str] = {}
    for line in form.get("arguments", "").splitlines():
        if not line.strip():
            continue
        name, sep, glob = line.partition("=")
        if not sep or not name.strip():
            raise ValidationFailed("write each argument as name=glob, one a line", code="invalid_rule")
        arguments[name.strip()] = glob.strip()
    data: dict[str, Any] = {
        "tool": form.get("tool", "").strip(),
        "action": form.get("action", "ask"),
        "arguments": arguments,
        "approvals_required": _whole_or_none(form.get("approvals_required", ""), "approvals required") or 1,
        "expires_after_s": _whole_or_none(form.get("expires_after_s", ""), "expires after"),
    }
    position = _whole_or_none(form.get("position", ""), "position")
    if position is not None:
        data["position"] = position
    return data


@dataclass(frozen=True)
class PreviewMatch:
    session_id: str
    session_title: str
    ask_id: str
    tool: str
    arguments: dict[str, Any]
    asked_at: Any
    requester: str


@dataclass(frozen=True)
class Preview:
    matches: list[PreviewMatch]
    scanned: int
    matched: int


def preview_rule(team: Team, data: dict[str, Any]) -> Preview:
    """Which of the team's past asks (newest first) `data` would have matched."""
    rule = Rule.from_dict({**data, "id": "preview"})  # ValidationFailed for a bad rule
    asks = (
        AuditEntry.objects.filter(kind=AuditEntry.ASK, session__team=team)
        .select_related("session")
        .order_by("-at", "-pk")[:PREVIEW_SCAN]
    )
    matches: list[PreviewMatch] = []
    scanned = matched = 0
    for entry in asks:
        scanned += 1
        if not rule.matches(entry.tool, entry.arguments or {}):
            continue
        matched += 1
        if len(matches) < PREVIEW_LIST:
            matches.append(
                PreviewMatch(
                    entry.session_id,
                    entry.session.title,
                    entry.ask_id,
                    entry.tool,
                    dict(entry.arguments or {}),
                    entry.asked_at or entry.at,
                    entry.requester,
                )
            )
    return Preview(matches, scanned, matched)
