"""The API's error bodies: always ``{"error": {"code", "message"}}`` with a fitting status."""

from __future__ import annotations

import logging
from typing import Any

from django.http import JsonResponse

from sectr.errors import JournalUnavailable, SectrError
from sessions_app.dbthread import LOST_DATABASE_ERRORS, check_connection_pools_soon

log = logging.getLogger("sectr.api")

#: Seconds a client waits before it asks again while the database is away (a PostgreSQL
#: restart takes a few).
DATABASE_RETRY_SECONDS = 2
#: The same while the channel layer is away (a Redis restart).
LAYER_RETRY_SECONDS = 2


class ChannelLayerUnavailable(Exception):  # noqa: N818
    """The channel layer failed a stream's join or receive (Redis away for longer than its
    connections retry): the stream cannot go live. Not for ever, so a retryable answer."""


class ApiError(SectrError):
    """A refusal of the HTTP layer itself (authentication, rate limit, body, routing)."""

    def __init__(self, message: str, *, code: str, status: int, headers: dict[str, str] | None = None) -> None:
        super().__init__(message, code=code, status=status)
        self.headers = headers or {}


def error_response(
    status: int,
    code: str,
    message: str,
    headers: dict[str, str] | None = None,
    extra: dict[str, Any] | None = None,
) -> JsonResponse:
    response = JsonResponse({"error": {**(extra or {}), "code": code, "message": message}}, status=status)
    for name, value in (headers or {}).items():
        response[name] = value
    return response


def exception_response(exc: Exception) -> JsonResponse:
    """The response for an exception a view let escape (SectrError or anything else)."""
    if isinstance(exc, SectrError):
        return error_response(exc.status, exc.code, exc.message, getattr(exc, "headers", None), exc.extra)
    if isinstance(exc, (JournalUnavailable, *LOST_DATABASE_ERRORS)):
        # Not the request's fault and not for ever: a retryable answer, never a 500.
        log.warning("API view: the database is unavailable: %s", exc)
        # A restart killed every idle connection of the pool: each would fail one request
        # in turn (a request thread's checkout is not tested, unlike a run's just after).
        check_connection_pools_soon()
        return error_response(
            503,
            "unavailable",
            "the database is unavailable for a moment; try again",
            {"Retry-After": str(DATABASE_RETRY_SECONDS)},
        )
    if isinstance(exc, ChannelLayerUnavailable):
        log.warning("API view: the channel layer is unavailable: %s", exc.__cause__ or exc)
        return error_response(
            503,
            "unavailable",
            "live updates are unavailable for a moment; try again",
            {"Retry-After": str(LAYER_RETRY_SECONDS)},
        )
    log.exception("API view failed", exc_info=exc)
    return error_response(500, "internal_error", "the server failed to handle this request")
