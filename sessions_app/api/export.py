"""GET /api/v1/sessions/{id}/export?format=json|markdown[&media=1] (docs/review.md)."""

from __future__ import annotations

from asgiref.sync import sync_to_async
from django.http import HttpResponse

from sessions_app import access
from sessions_app.api.errors import ApiError
from sessions_app.api.views import ApiCall, check_id
from sessions_app.review import export


def _export(user: object, session_id: str, fmt: str, media: bool) -> HttpResponse:
    session = access.get_session_for_user(user, check_id(session_id, "session"), "review")
    if fmt == "markdown":
        return HttpResponse(export.export_markdown(session), content_type="text/markdown; charset=utf-8")
    return HttpResponse(export.export_json(session, user if media else None), content_type="application/json")


async def export_session(call: ApiCall, session_id: str) -> HttpResponse:
    fmt = call.request.GET.get("format", "json")
    if fmt not in ("json", "markdown"):
        raise ApiError("format must be json or markdown", code="invalid_format", status=400)
    media = call.request.GET.get("media", "0")
    if media not in ("0", "1"):
        raise ApiError("media must be 0 or 1", code="invalid_media", status=400)
    return await sync_to_async(_export)(call.user, session_id, fmt, media == "1")
