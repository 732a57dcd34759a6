"""Daphne's streamed response chunks, sent as they are written.

Twisted's TCP transport never sends in `write`: it appends the bytes to its buffer and
registers the socket with the reactor for writing; on the loop's next pass the socket
is reported writable, the buffer sent, and the socket unregistered again. Each chunk of a
stream that was idle in between (an SSE frame) cost two epoll_ctl calls, a callback
through Twisted's logging context and a loop pass of its own, and Daphne's write of it
went through the deprecation proxy of `twisted.web.http` and the chunked encoding's four
separate pieces: about a third of a Daphne's streaming CPU (py-spy under bench/peers.py,
production topology).

Here a chunk of a streamed response whose connection has nothing buffered is sent at
once, as asyncio's own transports do: the same bytes (the HTTP/1.1 chunk), in the same
order; what the socket does not take at once is buffered and sent by Twisted as before.
Anything else (the headers, the first chunk, the last one, TLS connections, a
connection with data still waiting) goes through Daphne and Twisted unchanged.

The same request class drops two things Twisted does for every request that Daphne
never uses: parsing a POST's form body into `request.args` (Daphne hands the raw body
to the application; Twisted's parse of the Content-Type alone goes through
email.message, 1.3% of a Daphne's CPU under bench/admission.py --mode post, py-spy, and
a multipart body was parsed whole), and asking zope.interface whether a plain TCP
connection is TLS for the request's scheme (0.9%).
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

#: The Daphne request whose application task is being started (see `chunk_writer`).
_serving: ContextVar[Any] = ContextVar("sectr_daphne_request", default=None)


def chunk_writer() -> Callable[[bytes], bool] | None:
    """In an ASGI call Daphne serves over HTTP: the `write_chunk` of its request, which
    sends a chunk of a streamed response already started straight to the connection
    (False when it cannot: then send the body message as usual). None elsewhere.

    Taken out of the call's context: tasks the call starts after this (the embedded
    worker's, on the first request) do not keep the request.

    An SSE frame sent through the ASGI `send` went through two more coroutines
    (RequestBodyLimit's, Daphne's Server.handle_reply with its connection lookup by the
    request's Python __hash__) and a message dict to build and check, before the same
    write: per streamed chunk per client."""
    request = _serving.get()
    if request is None:
        return None
    _serving.set(None)
    return getattr(request, "write_chunk", None)


def send_now(transport: Any, data: bytes) -> None:
    """Write `data` on a Twisted TCP transport, trying the socket at once when nothing
    is waiting to be sent before it (Twisted's own write would wait for the next pass)."""
    if (
        transport.connected
        and not transport.disconnecting
        and not transport._writeDisconnected
        and transport.offset == len(transport.dataBuffer)
        and not transport._tempDataBuffer
    ):
        sent = transport.writeSomeData(data)
        if isinstance(sent, int):  # else the connection is lost: Twisted's write finds out
            if sent == len(data):
                return
            data = data[sent:]
    transport.write(data)


def send_chunks_at_once() -> bool:
    """Make Daphne send its streamed response chunks at once (see the module docstring);
    False without Daphne. Install it before `cap_daphne_request_bodies`, which subclasses
    the request class this installs."""
    try:
        from daphne import http_protocol
        from twisted.internet import tcp
    except ImportError:
        return False
    base: Any = http_protocol.WebRequest
    if getattr(base, "sectr_sends_at_once", False):
        return True

    class SendingWebRequest(base):
        sectr_sends_at_once = True

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._parsePOSTFormSubmission = False  # request.args: Daphne never reads them

        def isSecure(self) -> bool:  # noqa: N802 - Twisted's name
            channel = self.channel
            if not self._forceSSL and channel is not None and type(channel.transport) is tcp.Server:
                # A plain TCP connection is TLS only once startTLS made it so.
                return bool(channel.transport.TLS)
            return bool(super().isSecure())

        def process(self) -> Any:
            # Daphne starts the application's task in here: the task's context holds
            # the request (`chunk_writer`).
            token = _serving.set(self)
            try:
                return super().process()
            finally:
                _serving.reset(token)

        def write_chunk(self, data: bytes) -> bool:
            """Send `data` as the next chunk of the chunked response already started,
            as Daphne's handle_reply of a body message with more_body would (it would
            only write it: http.Request.write, chunked), and True; False when that is not
            what it would do (the caller sends the message through Daphne)."""
            if not (self.chunked and self.startedWriting and not self.finished and not self._disconnected):
                return False
            channel = self.channel
            if channel is None:
                return False
            transport = channel.transport
            if not isinstance(transport, tcp.Connection) or transport.TLS:
                return False
            if data:
                self.sentLength += len(data)
                send_now(transport, b"%x\r\n%s\r\n" % (len(data), data))
            return True

        def handle_reply(self, message: dict[str, Any]) -> None:
            if (
                message.get("more_body", False)
                and message["type"] == "http.response.body"
                and self.write_chunk(message.get("body", b""))
            ):
                return
            super().handle_reply(message)

    http_protocol.WebRequest = SendingWebRequest
    return True
