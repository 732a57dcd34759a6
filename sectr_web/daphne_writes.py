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

from typing import Any


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

        def handle_reply(self, message: dict[str, Any]) -> None:
            # A chunk in the middle of a chunked response already started: Daphne's
            # handle_reply would only write it (http.Request.write, chunked).
            if (
                message.get("more_body", False)
                and message["type"] == "http.response.body"
                and self.chunked
                and self.startedWriting
                and not self.finished
                and not self._disconnected
                and self.channel is not None
            ):
                transport = self.channel.transport
                if isinstance(transport, tcp.Connection) and not transport.TLS:
                    data = message.get("body", b"")
                    if data:
                        self.sentLength += len(data)
                        send_now(transport, b"%x\r\n%s\r\n" % (len(data), data))
                    return
            super().handle_reply(message)

    http_protocol.WebRequest = SendingWebRequest
    return True
