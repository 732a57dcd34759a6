"""``GET /api/v1/audit``: the moderation audit the caller may read, as JSON pages or CSV.

The same rows, filters and visibility as /approvals/audit/ (sessions_app.moderation.audit):
the caller's own sessions, their teams' where they are a reviewer or moderator, every
session for staff. ``?format=csv`` streams the whole filtered audit as CSV.
"""

from __future__ import annotations

from typing import Any

from asgiref.sync import sync_to_async
from django.http import HttpResponse, HttpResponseBase

from sectr.errors import ValidationFailed
from sessions_app.api.views import ApiCall, json_response, query_int
from sessions_app.moderation import audit

AUDIT_LIMIT_MAX = 500
AUDIT_QUERY = ("limit", "offset", "format", "team", "tool", "actor", "verdict", "kind", "session", "from", "to")


async def list_audit(call: ApiCall) -> HttpResponseBase:
    output = call.request.GET.get("format", "json")
    if output not in ("json", "csv"):
        raise ValidationFailed("format must be json or csv", code="invalid_format")
    filters = audit.AuditFilters.from_query(call.request.GET)
    # Checked for CSV too, which streams everything: a bad value is a mistake either way.
    limit = query_int(call.request, "limit", 50, 1, AUDIT_LIMIT_MAX)
    offset = query_int(call.request, "offset", 0, 0, 10**9)
    if output == "csv":
        entries = await sync_to_async(lambda: audit.audit_entries(call.user, filters))()
        return audit.csv_response(entries)

    def page() -> dict[str, Any]:
        entries = audit.audit_entries(call.user, filters)
        total = entries.count()
        return {
            "entries": [audit.entry_dict(entry) for entry in entries[offset : offset + limit]],
            "count": total,
            "limit": limit,
            "offset": offset,
            "next_offset": offset + limit if offset + limit < total else None,
        }

    response: HttpResponse = json_response(await sync_to_async(page)())
    return response
