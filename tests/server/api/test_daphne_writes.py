"""sectr_web.daphne_writes on a real Twisted TCP transport over a real socket pair: a
chunk goes out in the write itself when nothing waits before it, and after what waits
when something does (no reactor runs here, Twisted's test reactor only records what waits to be written,
so only an immediate send arrives)."""

from __future__ import annotations

import contextvars
import socket
from collections.abc import Iterator
from typing import Any

import pytest
from twisted.internet import protocol, tcp
from twisted.internet.testing import MemoryReactor

from sectr_web.daphne_writes import send_chunks_at_once, send_now


@pytest.fixture
def pair() -> Iterator[tuple[tcp.Server, socket.socket]]:
    ours, peer = socket.socketpair()
    ours.setblocking(False)
    peer.settimeout(5)
    transport = tcp.Server(ours, protocol.Protocol(), ("127.0.0.1", 1), None, 1, MemoryReactor())
    try:
        yield transport, peer
    finally:
        ours.close()
        peer.close()


def test_a_chunk_on_an_idle_connection_is_sent_in_the_write(pair: tuple[tcp.Server, socket.socket]) -> None:
    transport, peer = pair
    send_now(transport, b"5\r\nhello\r\n")
    assert peer.recv(100) == b"5\r\nhello\r\n"
    assert transport._tempDataBuffer == [] and transport not in transport.reactor.getWriters()


def test_a_chunk_behind_waiting_data_waits_behind_it(pair: tuple[tcp.Server, socket.socket]) -> None:
    transport, peer = pair
    transport.write(b"HTTP/1.1 200 OK\r\n\r\n")  # Twisted's write: sent on the loop's next pass
    send_now(transport, b"5\r\nhello\r\n")
    peer.setblocking(False)
    with pytest.raises(BlockingIOError):
        peer.recv(100)  # nothing overtook the headers
    assert transport._tempDataBuffer == [b"HTTP/1.1 200 OK\r\n\r\n", b"5\r\nhello\r\n"]
    assert transport in transport.reactor.getWriters()
    transport.doWrite()  # what the reactor does once the socket is writable
    peer.setblocking(True)
    assert peer.recv(100) == b"HTTP/1.1 200 OK\r\n\r\n5\r\nhello\r\n"


def test_what_the_socket_does_not_take_is_buffered_in_order(pair: tuple[tcp.Server, socket.socket]) -> None:
    transport, peer = pair
    data = bytes(range(256)) * 40_000  # far more than a socket pair's buffers hold
    send_now(transport, data)
    assert 0 < transport._tempDataLen < len(data)
    send_now(transport, b"after")  # waits behind the rest
    received = bytearray()
    while len(received) < len(data) + 5:
        transport.doWrite()
        received += peer.recv(1 << 20)
    assert bytes(received) == data + b"after"


def test_daphne_requests_send_at_once_under_the_body_cap() -> None:
    from daphne import http_protocol

    import sectr_web.asgi  # noqa: F401 - installs both on import

    assert send_chunks_at_once()
    assert getattr(http_protocol.WebRequest, "sectr_sends_at_once", False)
    assert http_protocol.WebRequest.max_body_bytes > 0  # the cap is the outermost class


@pytest.fixture
def tcp_pair() -> Iterator[tuple[tcp.Server, socket.socket]]:
    """`pair` over TCP on the loopback (a request asks its transport for addresses)."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        peer = socket.create_connection(listener.getsockname(), timeout=5)
        ours, address = listener.accept()
    ours.setblocking(False)
    transport = tcp.Server(ours, protocol.Protocol(), address, None, 1, MemoryReactor())
    try:
        yield transport, peer
    finally:
        ours.close()
        peer.close()


class _Server:
    """What a Daphne request asks of its server when it is made and processed."""

    proxy_forwarded_address_header = None
    root_path = ""
    request_buffer_size = 8192
    server_name = "daphne"

    def __init__(self) -> None:
        self.writers: list[Any] = []

    def protocol_connected(self, request: object) -> None:
        pass

    def protocol_disconnected(self, request: object) -> None:
        pass

    def log_action(self, *args: object) -> None:
        pass

    def create_application(self, request: object, scope: dict[str, Any]) -> Any:
        import asyncio

        from sectr_web.daphne_writes import chunk_writer

        # What Daphne does here: the application's task copies this context.
        self.writers.append(contextvars.copy_context().run(chunk_writer))
        return asyncio.Queue()


def daphne_request(transport: tcp.Server) -> object:
    from daphne import http_protocol
    from twisted.web import http

    import sectr_web.asgi  # noqa: F401 - installs the request class

    channel = http.HTTPChannel()
    channel.factory = type("Factory", (), {"server": _Server(), "log": lambda _self, _request: None})()
    channel.makeConnection(transport)
    request = http_protocol.WebRequest(channel)
    channel.requests.append(request)  # as the channel does with a request it parses
    return request


def test_a_daphne_request_leaves_a_form_body_to_the_application(tcp_pair: tuple[tcp.Server, socket.socket]) -> None:
    """Daphne hands the raw body on and never reads `request.args`: Twisted does not parse
    a form body into them (it did, through email.message, for each POST)."""
    request: Any = daphne_request(tcp_pair[0])
    processed: list[bytes] = []
    request.process = lambda: processed.append(request.content.read())
    body = b"a=1&b=2"
    request.requestHeaders.setRawHeaders(b"content-type", [b"application/x-www-form-urlencoded"])
    request.requestHeaders.setRawHeaders(b"content-length", [str(len(body)).encode()])
    request.gotLength(len(body))
    request.handleContentChunk(body)
    request.requestReceived(b"POST", b"/api/v1/x?q=1", b"HTTP/1.1")
    assert processed == [body]
    assert request.args == {b"q": [b"1"]}  # the query string's, not the body's


def test_a_daphne_request_is_secure_only_over_tls(tcp_pair: tuple[tcp.Server, socket.socket]) -> None:
    from twisted.internet.interfaces import ISSLTransport
    from zope.interface import directlyProvides

    transport = tcp_pair[0]
    request: Any = daphne_request(transport)
    assert request.isSecure() is False
    transport.TLS = True  # what startTLS does to a TCP connection
    directlyProvides(transport, ISSLTransport)
    assert request.isSecure() is True
    transport.TLS = False
    request._forceSSL = True  # setHost(..., ssl=True)
    assert request.isSecure() is True


def test_the_application_of_a_request_writes_its_chunks_directly(tcp_pair: tuple[tcp.Server, socket.socket]) -> None:
    """The application Daphne starts for a request finds the request's chunk writer in
    its context (once: then it is gone from the context); the writer declines until the
    response's first chunk has gone through Daphne (it writes the headers), then writes
    each chunk, framed as Daphne would, and declines again once the response is done."""
    from sectr_web.daphne_writes import chunk_writer

    transport, peer = tcp_pair
    request: Any = daphne_request(transport)
    server = request.server
    request.gotLength(0)
    request.requestReceived(b"GET", b"/api/v1/runs/run_1/events", b"HTTP/1.1")
    assert len(server.writers) == 1 and server.writers[0] is not None
    assert chunk_writer() is None  # not outside the application's context
    write = server.writers[0]
    assert write(b"early") is False  # nothing started yet
    request.handle_reply({"type": "http.response.start", "status": 200, "headers": []})
    request.handle_reply({"type": "http.response.body", "body": b"first", "more_body": True})
    transport.doWrite()  # Twisted's own write of the headers and first chunk
    assert write(b"second") is True
    received = b""
    while not received.endswith(b"6\r\nsecond\r\n"):
        received += peer.recv(1000)
    assert received.startswith(b"HTTP/1.1 200 OK\r\n")
    assert received.endswith(b"5\r\nfirst\r\n6\r\nsecond\r\n")
    request.handle_reply({"type": "http.response.body", "body": b""})
    assert write(b"late") is False
