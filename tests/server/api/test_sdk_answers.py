"""The SDK against a real local HTTP server that does not answer as the API does: a
redirect (http -> https, a moved base URL) raises RedirectError naming where it
points, and a 2xx that is not JSON (or not an event stream) raises ProtocolError.
No SDK call returns None for such an answer."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from sectr.client import AsyncClient, Client, ProtocolError, RedirectError


class OddServer(BaseHTTPRequestHandler):
    """/api/v1/sessions/moved...: 301 to https; /api/v1/sessions/relative...: 307 to a
    relative path; /api/v1/runs/...: 302 without a Location; /api/v1/sessions/html...:
    200 text/html; /api/v1/sessions/empty...: 200 with no body."""

    def _answer(self) -> None:
        path = self.path
        if path.startswith("/api/v1/sessions/moved"):
            self._send(301, {"Location": f"https://sectr.example{path}"})
        elif path.startswith("/api/v1/sessions/relative"):
            self._send(307, {"Location": "/elsewhere/api/v1/"})
        elif path.startswith("/api/v1/runs/"):
            self._send(302, {})
        elif path.startswith("/api/v1/sessions/html"):
            self._send(200, {"Content-Type": "text/html"}, b"<html>login</html>")
        elif path.startswith("/api/v1/sessions/jsonish"):
            self._send(200, {"Content-Type": "text/plain"}, b"{}")
        else:
            self._send(200, {"Content-Type": "application/json"}, b"")

    do_GET = _answer  # noqa: N815 - http.server's naming
    do_POST = _answer  # noqa: N815

    def _send(self, status: int, headers: dict[str, str], body: bytes = b"") -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's signature
        pass


@pytest.fixture(scope="module")
def odd_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), OddServer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_redirect_to_https_raises_redirect_error_naming_where_it_points(odd_url: str) -> None:
    with Client(odd_url, token="t") as client, pytest.raises(RedirectError) as caught:
        client.sessions.get("moved1")
    error = caught.value
    assert error.status == 301 and error.code == "redirect"
    assert error.location == "https://sectr.example/api/v1/sessions/moved1"
    assert "https://sectr.example/api/v1/sessions/moved1" in str(error) and "https:// base_url" in str(error)
    assert isinstance(error, ProtocolError)


def test_a_relative_redirect_is_resolved_against_the_request(odd_url: str) -> None:
    with Client(odd_url, token="t") as client, pytest.raises(RedirectError) as caught:
        client.session("relative1").snapshot()
    assert caught.value.status == 307 and caught.value.location == f"{odd_url}/elsewhere/api/v1/"


def test_a_redirect_of_the_event_stream_raises_too(odd_url: str) -> None:
    with Client(odd_url, token="t") as client, pytest.raises(RedirectError) as caught:
        list(client.runs.attach("run_1"))
    assert caught.value.status == 302 and caught.value.location is None
    assert "without saying where" in str(caught.value)


@pytest.mark.parametrize(
    ("session_id", "says"), [("html1", "text/html"), ("jsonish1", "text/plain"), ("empty1", "empty")]
)
def test_a_2xx_that_is_not_json_raises_protocol_error_never_none(odd_url: str, session_id: str, says: str) -> None:
    with Client(odd_url, token="t") as client, pytest.raises(ProtocolError) as caught:
        client.session(session_id).transcript()
    assert caught.value.status == 200 and not isinstance(caught.value, RedirectError)
    if says != "empty":
        assert says in str(caught.value)


def test_the_async_client_raises_the_same_errors(odd_url: str) -> None:
    async def calls() -> list[BaseException]:
        found: list[BaseException] = []
        async with AsyncClient(odd_url, token="t") as client:
            for call in (
                client.sessions.get("moved2"),
                client.session("html2").snapshot(),
            ):
                try:
                    await call
                except Exception as exc:  # noqa: BLE001 - collected for the assertions
                    found.append(exc)
            try:
                async for _ in client.runs.attach("run_2"):
                    pass
            except Exception as exc:  # noqa: BLE001
                found.append(exc)
        return found

    moved, html, stream = asyncio.run(calls())
    assert isinstance(moved, RedirectError) and moved.location == "https://sectr.example/api/v1/sessions/moved2"
    assert isinstance(html, ProtocolError) and not isinstance(html, RedirectError) and "text/html" in str(html)
    assert isinstance(stream, RedirectError) and stream.status == 302
