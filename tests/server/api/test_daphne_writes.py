"""sectr_web.daphne_writes on a real Twisted TCP transport over a real socket pair: a
chunk goes out in the write itself when nothing waits before it, and after what waits
when something does (no reactor runs here, Twisted's test reactor only records what waits to be written,
so only an immediate send arrives)."""

from __future__ import annotations

import socket
from collections.abc import Iterator

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
