"""The API's own middleware chain (sectr_web/middleware.py), through the real ASGI
application: the same headers and input checks as every response, no cookies, and no
middleware that would put the request behind a thread hop."""

from __future__ import annotations

from typing import Any

import pytest
from asgiref.testing import ApplicationCommunicator
from channels.db import database_sync_to_async
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from sectr_web import middleware
from sessions_app.models import ApiToken
from tests.server.conftest import http_scope

pytestmark = [pytest.mark.django_db(transaction=True)]


async def call(path: str, *, query: bytes = b"", headers: list[tuple[bytes, bytes]] | None = None) -> dict[str, Any]:
    """One GET through sectr_web.asgi.application: status, headers (lower-case), body."""
    from sectr_web.asgi import application

    communicator = ApplicationCommunicator(application, http_scope("GET", path, headers=headers, query_string=query))
    await communicator.send_input({"type": "http.request", "body": b"", "more_body": False})
    start = await communicator.receive_output(timeout=10)
    body = b""
    while True:
        message = await communicator.receive_output(timeout=10)
        body += message.get("body", b"")
        if not message.get("more_body", False):
            break
    await communicator.wait(timeout=5)
    names = [(name.decode().lower(), value.decode()) for name, value in start["headers"]]
    return {"status": start["status"], "headers": dict(names), "names": [n for n, _ in names], "body": body}


@pytest.fixture
async def bearer(owner: Any) -> list[tuple[bytes, bytes]]:
    _token, raw = await database_sync_to_async(ApiToken.issue)(owner, "middleware")
    return [(b"authorization", f"Bearer {raw}".encode())]


async def test_api_responses_carry_the_sites_headers_and_no_cookie(bearer: list[tuple[bytes, bytes]]) -> None:
    answer = await call("/api/v1/sessions", headers=[*bearer, (b"cookie", b"sessionid=x; csrftoken=y")])
    assert answer["status"] == 200, answer["body"][:300]
    headers = answer["headers"]
    assert headers["content-security-policy"].startswith("default-src 'self'")
    assert headers["x-frame-options"] == "DENY"
    assert headers["x-content-type-options"] == "nosniff"
    assert headers["content-length"] == str(len(answer["body"]))
    assert "set-cookie" not in answer["names"], "the API sets no session or CSRF cookie"
    assert "cookie" not in headers.get("vary", "").lower()


async def test_the_pages_chain_still_sets_its_cookies() -> None:
    answer = await call("/accounts/login/")
    assert answer["status"] == 200
    assert "set-cookie" in answer["names"], "the login page sets its CSRF cookie"
    assert answer["headers"]["content-security-policy"].startswith("default-src 'self'")
    assert answer["headers"]["x-frame-options"] == "DENY"


async def test_unstorable_text_in_an_api_query_is_refused_before_the_view(bearer: list[tuple[bytes, bytes]]) -> None:
    answer = await call("/api/v1/sessions", query=b"q=a%00b", headers=bearer)
    assert answer["status"] == 400
    assert b"invalid_unicode" in answer["body"]


async def test_api_requests_need_a_token_whatever_cookies_they_carry() -> None:
    answer = await call("/api/v1/sessions", headers=[(b"cookie", b"sessionid=anything")])
    assert answer["status"] == 401


async def test_the_balancers_probe_takes_the_api_chain_and_no_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """HAProxy asks every Daphne for /healthz once a second: through the pages' chain that
    was most of an idle Daphne's CPU. It goes through the API's chain, its view on the
    event loop: the site's headers, no cookie, no thread lent, and the request signals."""
    import threading

    from django.core.signals import request_finished, request_started

    from sectr_web.asgi import api_app

    assert middleware.is_api_request({"type": "http", "path": "/healthz"})
    assert middleware.is_api_request({"type": "http", "path": "/readyz"})
    assert not middleware.is_api_request({"type": "http", "path": "/healthz/"})
    assert not middleware.is_api_request({"type": "websocket", "path": "/healthz"})
    lent: list[object] = []
    lend = api_app.threads.lend
    monkeypatch.setattr(api_app.threads, "lend", lambda: lent.append(1) or lend())
    signalled: list[threading.Thread] = []

    def record(**kwargs: Any) -> None:
        signalled.append(threading.current_thread())

    request_finished.connect(record)
    try:
        answer = await call("/healthz", headers=[(b"cookie", b"sessionid=x; csrftoken=y")])
    finally:
        request_finished.disconnect(record)
    assert answer["status"] == 200 and b'"ok": true' in answer["body"]
    assert answer["headers"]["x-frame-options"] == "DENY"
    assert answer["headers"]["x-content-type-options"] == "nosniff"
    assert answer["headers"]["content-security-policy"].startswith("default-src 'self'")
    assert "no-cache" in answer["headers"]["cache-control"]
    assert "set-cookie" not in answer["names"]
    assert lent == [], "the probe took a request thread"
    assert signalled == [threading.current_thread()], "request_finished is sent, on the event loop"
    assert request_started.receivers  # sanity: the signals are wired


@pytest.mark.parametrize("chain", ["MIDDLEWARE", "API_MIDDLEWARE"])
def test_every_middleware_can_run_on_the_event_loop(chain: str) -> None:
    """A sync-only middleware sends the rest of its chain through async_to_sync: a thread
    hop and back on every request."""
    paths = settings.MIDDLEWARE if chain == "MIDDLEWARE" else middleware.API_MIDDLEWARE
    sync_only = [path for path in paths if not getattr(import_string(path), "async_capable", False)]
    assert sync_only == []


def test_the_api_chain_refuses_a_sync_only_middleware(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        middleware, "API_MIDDLEWARE", [*middleware.API_MIDDLEWARE, "tests.server.api.test_api_middleware.SyncOnly"]
    )
    with pytest.raises(ImproperlyConfigured, match="SyncOnly"):
        middleware.ApiASGIHandler()


class SyncOnly:
    sync_capable = True
    async_capable = False

    def __init__(self, get_response: Any) -> None:
        self.get_response = get_response

    def __call__(self, request: Any) -> Any:
        return self.get_response(request)


async def test_each_request_has_a_thread_of_its_own_reused_after_it(
    bearer: list[tuple[bytes, bytes]], session: Any
) -> None:
    """Django's signals of a request run on its thread-sensitive thread: one per request
    at a time, lent again to a later request rather than started anew. A streamed
    response gives its thread back once its view has returned: an open stream holds none,
    and its request_finished borrows one when it ends."""
    import threading

    from django.core.signals import request_finished, request_started

    from sectr_web.asgi import application

    threads: list[threading.Thread] = []
    finished: list[threading.Thread] = []

    def record(**kwargs: Any) -> None:
        threads.append(threading.current_thread())

    def record_finished(**kwargs: Any) -> None:
        finished.append(threading.current_thread())

    request_started.connect(record)
    request_finished.connect(record_finished)
    try:
        for _ in range(3):
            assert (await call("/api/v1/sessions", headers=bearer))["status"] == 200
        assert threads[0] is threads[1] is threads[2] and threads[0] is not threading.current_thread()
        # A request still open (a session's stream) has given its thread back: another
        # request meanwhile gets the same one.
        path = f"/api/v1/sessions/{session.pk}/events"
        streaming = ApplicationCommunicator(application, http_scope("GET", path, headers=bearer))
        await streaming.send_input({"type": "http.request", "body": b"", "more_body": False})
        assert (await streaming.receive_output(timeout=10))["status"] == 200
        assert (await call("/api/v1/sessions", headers=bearer))["status"] == 200
        assert len(threads) == 5 and threads[3] is threads[4] is threads[0], threads
        await streaming.send_input({"type": "http.disconnect"})
        await streaming.wait(timeout=5)
        assert len(finished) == 5 and finished[-1] is threads[0], finished
    finally:
        request_started.disconnect(record)
        request_finished.disconnect(record_finished)


def test_requests_in_progress_never_share_a_thread() -> None:
    """Two requests' executors, both holding their thread, run on different threads; one
    given back is lent to the next request."""
    import threading

    threads = middleware.RequestThreads()
    first, second = middleware.RequestExecutor(threads), middleware.RequestExecutor(threads)
    one = first.submit(threading.current_thread).result(timeout=5)
    two = second.submit(threading.current_thread).result(timeout=5)
    assert one is not two
    first.release()
    third = middleware.RequestExecutor(threads)
    assert third.submit(threading.current_thread).result(timeout=5) is one
    assert second.submit(threading.current_thread).result(timeout=5) is two  # still its own
    for executor in (second, third):
        executor.release()


# What ApiASGIHandler leans on, by the source it was written against: an upgrade that
# changes either fails here, so the one upgrading compares before the hashes are renewed.
LEANED_ON = {
    # ApiASGIHandler.handle re-implements it, with the request signals moved.
    "django.core.handlers.asgi.ASGIHandler.handle": "98faeb5bef800331e6a8002fbc96b30e4122a23438ae45a047190a531ea11323",
    # ApiASGIHandler.send_response re-implements it for async streaming responses.
    "django.core.handlers.asgi.ASGIHandler.send_response": (
        "77eda2b08689b44ee277c936092bde02e50f84727f7398480a127e7e9e1dad06"
    ),
    # ...taking each part as streaming_content's wrapper does (make_bytes), from _iterator.
    "django.http.response.StreamingHttpResponse.streaming_content": (
        "cdb912493f797f72674ada8bdfe0a0536ffbe2c928b246d6210ab78943a78a7f"
    ),
    "django.http.response.StreamingHttpResponse.__aiter__": (
        "7b36f5b3e5de1837b1dbc568e93c5d121b7f80989027bcc773cab2b4dfe2b72e"
    ),
    # RequestExecutor is lent through its context_to_thread_executor lookup.
    "asgiref.sync.SyncToAsync.__call__": "6376e33c6d3d94c58df80c3f2386c38401d19a543d08626a34721abe309845f6",
}


@pytest.mark.parametrize("name", sorted(LEANED_ON))
def test_the_framework_code_the_api_handler_leans_on_is_what_it_was_written_against(name: str) -> None:
    import hashlib
    import inspect

    owner, attribute = name.rsplit(".", 1)
    code = getattr(import_string(owner), attribute)
    source = inspect.getsource(code.fget if isinstance(code, property) else code)
    assert hashlib.sha256(source.encode()).hexdigest() == LEANED_ON[name], (
        f"{name} changed: compare it with sectr_web/middleware.py (ApiASGIHandler, RequestExecutor), "
        "then renew its hash here"
    )
