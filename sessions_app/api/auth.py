"""Bearer-token authentication and per-token rate limits for the API.

``Authorization: Bearer <token>``; tokens are stored hashed (sessions_app.models.ApiToken)
and created with ``manage.py sectr_token`` (sessions_app.actions.tokens). Every request
counts against its token's budget, ``SECTR_API_RATE_LIMIT`` requests per window
(setting or environment, ``"600/60"``: 600 requests a minute), counted atomically by
sessions_app.budgets (Redis when REDIS_URL is set, so all server processes share it).
Past the budget the API answers 429 with ``Retry-After``.
"""

from __future__ import annotations

from asgiref.sync import sync_to_async
from django.http import HttpRequest

from sessions_app.api.errors import ApiError
from sessions_app.budgets import Spent, aspend, setting_budget, spend
from sessions_app.models import ApiToken

DEFAULT_RATE_LIMIT = "600/60"
CHALLENGE = {"WWW-Authenticate": 'Bearer realm="sectr"'}


def bearer_token(request: HttpRequest) -> str | None:
    header = request.headers.get("Authorization", "")
    scheme, _, credentials = header.strip().partition(" ")
    if scheme.lower() != "bearer" or not credentials.strip():
        return None
    return credentials.strip()


def required_bearer_token(request: HttpRequest) -> str:
    """The request's bearer token, unchecked; 401 when there is none."""
    raw = bearer_token(request)
    if raw is None:
        raise ApiError(
            "an API token is required: Authorization: Bearer <token>",
            code="unauthenticated",
            status=401,
            headers=CHALLENGE,
        )
    return raw


def _live_token(raw: str) -> ApiToken:
    token = ApiToken.authenticate(raw)
    if token is None:
        raise ApiError("the API token is invalid or revoked", code="invalid_token", status=401, headers=CHALLENGE)
    return token


async def authenticate(request: HttpRequest) -> ApiToken:
    """The request's live token; 401 when it is missing, unknown, revoked or its user inactive."""
    raw = required_bearer_token(request)
    return await sync_to_async(_live_token)(raw)


def admit(raw: str) -> ApiToken:
    """Sync `authenticate` and `check_rate_limit` in one, for an operation that admits its
    request in the same database-thread hop as its own work (sessions_app.api.views,
    `Operation.admits_in_thread`): 401, then 429, as the asynchronous pair would."""
    token = _live_token(raw)
    limit, window = rate_limit()
    if limit:
        _refuse_past_limit(spend("api", token.prefix, window), limit, window)
    return token


def rate_limit() -> tuple[int, int]:
    """(requests, window seconds); 0 requests = no limit."""
    return setting_budget("SECTR_API_RATE_LIMIT", DEFAULT_RATE_LIMIT)


async def check_rate_limit(token: ApiToken) -> None:
    """Count one request of `token` in the current fixed window; 429 past its budget."""
    limit, window = rate_limit()
    if not limit:
        return
    # Keyed by the token's public prefix (random), not its row id, which a database
    # rebuilt from scratch hands out again.
    _refuse_past_limit(await aspend("api", token.prefix, window), limit, window)


def _refuse_past_limit(spent: Spent, limit: int, window: int) -> None:
    if spent.count > limit:
        raise ApiError(
            f"rate limit: {limit} requests per {window} s for this token",
            code="rate_limited",
            status=429,
            headers={"Retry-After": str(spent.retry_after)},
        )
