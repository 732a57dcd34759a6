"""The SDK's typed errors. Every one is a `SectrError` with `code` and `status`.

Errors the server sends (``{"error": {"code", "message"}}``) map by status and code:

======================  =========================================================
401                     AuthenticationError
403                     PermissionDeniedError
404                     NotFoundError
409 session_busy,       SessionBusyError
awaiting_approval
409 ask_not_pending     AskAlreadyResolvedError
409, 412 (other)        InvalidStateError (stale_run_control,
                        failed_step_retry_ineligible, not_at_turn_boundary)
400, 413 media/prompt   PromptValidationError (capability, mime_type, size, url,
                        prompt, too_large)
400 (other)             InvalidRequestError
429                     RateLimitError (`retry_after` seconds)
======================  =========================================================

Client-side failures: TransportError (the connection failed, timed out, or
reconnecting gave up; `RequestCancelled` when a Cancellation stopped it,
`DeadlineExceededError` when the call's `deadline` passed),
ProtocolError (the server's answer was not what the API promises: a 2xx that is not
JSON, or `RedirectError` for a 3xx, with `location` naming where it points),
InvalidStateError (a run consumed twice). The status of a client-side error is 0,
except for a ProtocolError about an answer, which keeps the answer's status.
"""

from __future__ import annotations

import json
from typing import Any

from sectr.errors import SectrError as _CoreSectrError

PROMPT_CODES = frozenset({"capability", "mime_type", "size", "url", "prompt", "too_large"})
BUSY_CODES = frozenset({"session_busy", "awaiting_approval"})


class SectrError(_CoreSectrError):
    """Base of every SDK error: `code` (machine-readable), `status` (HTTP, 0 client-side)."""

    code = "error"
    status = 0

    def __init__(
        self, message: str, *, code: str | None = None, status: int | None = None, extra: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message, code=code, status=status, extra=extra)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code!r}, status={self.status}, message={self.message!r})"


class AuthenticationError(SectrError):
    code = "unauthenticated"
    status = 401


class PermissionDeniedError(SectrError):
    code = "forbidden"
    status = 403


class NotFoundError(SectrError):
    code = "not_found"
    status = 404


class InvalidStateError(SectrError):
    code = "invalid_state"


class SessionBusyError(InvalidStateError):
    code = "session_busy"
    status = 409


class AskAlreadyResolvedError(InvalidStateError):
    """The ask was decided (or withdrawn) already; `decided_by` and `verdict` say how."""

    code = "ask_not_pending"
    status = 409

    @property
    def decided_by(self) -> str | None:
        value = self.extra.get("decided_by")
        return str(value) if value is not None else None

    @property
    def verdict(self) -> str | None:
        value = self.extra.get("verdict")
        return str(value) if value is not None else None


class InvalidRequestError(SectrError):
    code = "invalid"
    status = 400


class PromptValidationError(InvalidRequestError):
    code = "prompt"


class RateLimitError(SectrError):
    code = "rate_limited"
    status = 429

    def __init__(self, message: str, *, code: str | None = None, status: int | None = None, retry_after: float = 1.0):
        super().__init__(message, code=code, status=status)
        self.retry_after = retry_after


class TransportError(SectrError):
    code = "transport"


class RequestCancelled(TransportError):
    code = "cancelled"


class DeadlineExceededError(TransportError):
    """A call's (or a run's consumption's) `deadline` passed before it finished. Only the
    client stopped waiting: the run goes on on the server (`run.cancel()` stops it)."""

    code = "deadline_exceeded"


class ProtocolError(SectrError):
    code = "protocol"


class RedirectError(ProtocolError):
    """The server answered with a redirect (3xx), which the API never does: `base_url`
    points at the wrong place (often http:// where the server wants https://).
    `location` is where the redirect points (absolute), or None when it did not say."""

    code = "redirect"

    def __init__(self, message: str, *, location: str | None, status: int) -> None:
        super().__init__(message, status=status)
        self.location = location


def error_from_response(status: int, body: bytes, headers: Any = None) -> SectrError:
    """The typed error for an HTTP error answer."""
    code, message = f"http_{status}", f"HTTP {status}"
    extra: dict[str, Any] = {}
    try:
        error = json.loads(body)["error"]
        code, message = str(error["code"]), str(error["message"])
        extra = {k: v for k, v in error.items() if k not in ("code", "message")}
    except (ValueError, KeyError, TypeError):
        if status < 500:
            return ProtocolError(f"HTTP {status} without an error body", status=status)
    if status == 401:
        return AuthenticationError(message, code=code, status=status)
    if status == 403:
        return PermissionDeniedError(message, code=code, status=status)
    if status == 404:
        return NotFoundError(message, code=code, status=status)
    if status == 409 and code in BUSY_CODES:
        return SessionBusyError(message, code=code, status=status)
    if status == 409 and code == "ask_not_pending":
        return AskAlreadyResolvedError(message, code=code, status=status, extra=extra)
    if status in (409, 412):
        return InvalidStateError(message, code=code, status=status)
    if status in (400, 413) and code in PROMPT_CODES:
        return PromptValidationError(message, code=code, status=status)
    if status in (400, 413):
        return InvalidRequestError(message, code=code, status=status)
    if status == 429:
        retry_after = 1.0
        try:
            retry_after = float((headers or {}).get("retry-after", 1))
        except (TypeError, ValueError):
            pass
        return RateLimitError(message, code=code, status=status, retry_after=retry_after)
    return SectrError(message, code=code, status=status)
