"""GET /api/v1/sessions/{id}/media/{sha256}: a session's stored image or audio (a
prompt's part, a tool result's), for an API client with its token (docs/api.md, "Media").

The same rule as the chat page's media view: whoever may read the session (a fork's
inherited media through its chain), 404 for anyone else and for media that are not the
session's. The bytes are served with their stored type, never sniffed or run.
"""

from __future__ import annotations

from asgiref.sync import sync_to_async
from django.http import HttpResponse

from sectr.errors import NotFound
from sessions_app.access import get_session_for_user
from sessions_app.api.views import ApiCall, check_id
from sessions_app.media import readable_blob


def _read(user: object, session_id: str, sha256: str) -> tuple[str, bytes]:
    session = get_session_for_user(user, check_id(session_id, "session"), "read")
    blob = readable_blob(user, session, sha256)
    if blob is None:
        raise NotFound("no such media")
    with blob.file.open("rb") as handle:
        return blob.mime_type, handle.read()


async def get_session_media(call: ApiCall, session_id: str, sha256: str) -> HttpResponse:
    mime_type, data = await sync_to_async(_read)(call.user, session_id, sha256)
    response = HttpResponse(data, content_type=mime_type)
    response["X-Content-Type-Options"] = "nosniff"
    response["Content-Security-Policy"] = "default-src 'none'; sandbox"
    response["Cache-Control"] = "private, max-age=86400"
    return response
