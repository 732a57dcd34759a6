"""The site's URLs, with event streams refused on demand as while the database is away
(loaded by layer_fault_settings.py as ROOT_URLCONF, for a live server's tests).

The file named by SECTR_TEST_REFUSED_STREAMS holds a number: while it is above zero, each
`GET /runs/{id}/events` and `GET /sessions/{id}/events` takes one off it and is answered
what the API answers when the database is away before a stream starts (a PostgreSQL
restart): `503 unavailable` with Retry-After, from the API's own exception_response. The
worker is untouched, so the run goes on meanwhile. Without the variable nothing is refused.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from django.http import HttpRequest, HttpResponseBase
from django.urls import URLPattern, include, path

from sectr.errors import JournalUnavailable
from sectr_web.urls import urlpatterns as site_urlpatterns
from sessions_app.api import urls as api_urls
from sessions_app.api.errors import exception_response

REFUSED = ("run-events", "session-events")


def take_a_refusal() -> bool:
    """Whether the counter file holds a number above zero (then one less)."""
    name = os.environ.get("SECTR_TEST_REFUSED_STREAMS")
    if not name:
        return False
    counter = Path(name)
    left = int(counter.read_text() or 0) if counter.exists() else 0
    if left <= 0:
        return False
    counter.write_text(str(left - 1))
    return True


def refusing(view: Any) -> Any:
    async def refused_while_counted(request: HttpRequest, **kwargs: Any) -> HttpResponseBase:
        if request.method == "GET" and take_a_refusal():
            return exception_response(JournalUnavailable("the database is away (a test's fault)"))
        return await view(request, **kwargs)

    return refused_while_counted


def with_refusals(pattern: URLPattern) -> URLPattern:
    if pattern.name not in REFUSED:
        return pattern
    return URLPattern(pattern.pattern, refusing(pattern.callback), pattern.default_args, pattern.name)


urlpatterns = [
    path("api/v1/", include(([with_refusals(p) for p in api_urls.urlpatterns], api_urls.app_name))),
    *site_urlpatterns,
]
