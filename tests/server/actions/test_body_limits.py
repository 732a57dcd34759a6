"""Request bodies are capped before they are buffered: Daphne (a live server, its memory
measured) and the ASGI middleware (in process)."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.core.asgi import get_asgi_application

from sectr_web.body_limits import DEFAULT_MAX_REQUEST_BYTES, RequestBodyLimit
from tests.liveserver import LiveSectr
from tests.server.conftest import http_scope

MIB = 1024 * 1024
BIG = 400 * MIB


def peak_rss_bytes(pid: int) -> int:
    """The process's high-water resident set size (VmHWM), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


@pytest.fixture(scope="module")
def live() -> Iterator[LiveSectr]:
    with LiveSectr() as server:
        yield server


def open_request(live: LiveSectr, headers: str) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", live.port), timeout=10)
    sock.sendall(f"POST /api/v1/sessions HTTP/1.1\r\nHost: 127.0.0.1\r\n{headers}\r\n".encode())
    return sock


def read_response(sock: socket.socket, into: list[bytes]) -> None:
    try:
        while chunk := sock.recv(65536):
            into.append(chunk)
    except OSError:
        pass


def stream_body(sock: socket.socket, total: int, *, chunked: bool) -> int:
    """Send up to `total` body bytes; how many the server took before it stopped reading."""
    piece = b"x" * MIB
    sent = 0
    sock.settimeout(3)  # a server that stopped reading fills the buffers: send blocks
    try:
        while sent < total:
            sock.sendall(b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece)
            sent += len(piece)
        if chunked:
            sock.sendall(b"0\r\n\r\n")
    except OSError:  # timed out, reset or closed
        pass
    return sent


def test_a_declared_400_mb_body_is_refused_before_it_is_sent(live: LiveSectr) -> None:
    assert live.server is not None
    peak_before = peak_rss_bytes(live.server.pid)
    sock = open_request(live, f"Content-Type: application/json\r\nContent-Length: {BIG}\r\n")
    response: list[bytes] = []
    sock.settimeout(5)
    try:
        response.append(sock.recv(65536))  # before a single body byte: the 413 is there
    except TimeoutError:
        pass
    assert response and response[0].startswith(b"HTTP/1.1 413"), response
    assert b"too_large" in b"".join(response)
    sent = stream_body(sock, BIG, chunked=False)
    sock.close()
    assert sent < 64 * MIB, f"the server kept reading: {sent // MIB} MiB"
    assert peak_rss_bytes(live.server.pid) - peak_before < 32 * MIB
    assert httpx.get(live.url("/healthz")).status_code == 200


def test_a_streamed_400_mb_body_is_cut_off_at_the_cap(live: LiveSectr) -> None:
    assert live.server is not None
    peak_before = peak_rss_bytes(live.server.pid)
    sock = open_request(live, "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n")
    response: list[bytes] = []
    reader = threading.Thread(target=read_response, args=(sock, response))
    reader.start()
    started = time.monotonic()
    sent = stream_body(sock, BIG, chunked=True)
    reader.join(timeout=10)
    sock.close()
    assert b"".join(response).startswith(b"HTTP/1.1 413"), response[:1]
    # The cap plus what the socket buffers held when the server stopped reading.
    assert sent < DEFAULT_MAX_REQUEST_BYTES + 32 * MIB, f"the server kept reading: {sent // MIB} MiB"
    assert time.monotonic() - started < 30
    assert peak_rss_bytes(live.server.pid) - peak_before < 32 * MIB
    assert httpx.get(live.url("/healthz")).status_code == 200


def test_a_body_under_the_cap_still_reaches_the_api(live: LiveSectr) -> None:
    response = httpx.post(live.url("/api/v1/sessions"), content=b"{}", headers={"Content-Type": "application/json"})
    assert response.status_code == 401  # the API answered: no token


# ---- the ASGI middleware, in process ----


async def call(app: Any, headers: list[tuple[bytes, bytes]], chunks: list[bytes]) -> tuple[int, int]:
    """(response status, how many body chunks the app pulled)."""
    scope = http_scope("POST", "/accounts/login/", headers=headers)
    pulled = 0
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        nonlocal pulled
        if pulled < len(chunks):
            pulled += 1
            return {"type": "http.request", "body": chunks[pulled - 1], "more_body": pulled < len(chunks)}
        await asyncio.Event().wait()  # the client stays connected (Django listens for a disconnect)
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    return next(m["status"] for m in sent if m["type"] == "http.response.start"), pulled


@pytest.mark.django_db(transaction=True)
async def test_the_middleware_counts_streamed_bytes_and_refuses_past_the_cap() -> None:
    app = RequestBodyLimit(get_asgi_application(), limit=10_000)
    status, pulled = await call(app, [], [b"a" * 4000] * 100)
    assert status == 413 and pulled == 3, "it stops reading at the chunk that crosses the cap"
    status, pulled = await call(app, [(b"content-length", b"400000")], [b"a" * 4000] * 100)
    assert status == 413 and pulled == 0
    status, _ = await call(app, [(b"content-length", b"\xd9\xa3")], [b"a"])
    assert status == 400
    status, _ = await call(app, [(b"content-type", b"application/x-www-form-urlencoded")], [b"username=a"] * 2)
    assert status == 403  # under the cap: Django answered (CSRF)
