"""Request bodies are capped before they are buffered (SECTR_MAX_REQUEST_BYTES, 32 MiB).

Two places, because each buffers on its own:

* Daphne (Twisted) reads a request's whole body into memory or a temporary file before
  it hands the request to the application at all. `cap_daphne_request_bodies` installs a
  WebRequest subclass that answers 413 and closes the connection as soon as the headers
  declare a larger Content-Length, or as soon as a streamed (chunked) body passes the
  cap; nothing past the cap is stored, and Twisted stops reading from the socket.
* Django's ASGI handler spools the whole body before the view runs. `RequestBodyLimit`
  (ASGI middleware, for any server) refuses a larger Content-Length without calling the
  application, and counts the bytes of a streamed body: past the cap the application
  sees a disconnect and the client gets 413.

The API's own per-operation limits (256 KiB, 32 MiB for a prompt with media) still
apply inside; this cap is the one an unauthenticated client meets first.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from django.conf import settings

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[..., Awaitable[None]]  # Django's and Channels' handlers type their arguments apart

DEFAULT_MAX_REQUEST_BYTES = 32 * 1024 * 1024


def max_request_bytes() -> int:
    """The cap: the SECTR_MAX_REQUEST_BYTES setting (from the environment)."""
    raw = str(getattr(settings, "SECTR_MAX_REQUEST_BYTES", "") or "").strip()
    if raw.isascii() and raw.isdigit() and int(raw) > 0:
        return int(raw)
    return DEFAULT_MAX_REQUEST_BYTES


def refusal_body(limit: int) -> bytes:
    message = f"the request body is larger than {limit} bytes"
    return json.dumps({"error": {"code": "too_large", "message": message}}).encode()


class RequestBodyLimit:
    """ASGI middleware: 413 for an HTTP request whose body is over `limit` bytes."""

    def __init__(self, app: ASGIApp, limit: int | None = None) -> None:
        self.app = app
        self.limit = limit if limit is not None else max_request_bytes()

    async def refuse(self, send: Send, status: int = 413) -> None:
        body = refusal_body(self.limit)
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", []):
            if name.lower() == b"content-length":
                # ASCII digits only: int() would take "٣" or " 12 ".
                if not (value.isdigit() and value.isascii()):
                    await self.refuse(send, 400)
                    return
                if int(value) > self.limit:
                    await self.refuse(send)
                    return
        received = 0
        exceeded = False
        response_started = False

        async def counting_receive() -> Message:
            nonlocal received, exceeded
            if exceeded:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    # The application stops reading (Django raises RequestAborted and
                    # answers nothing); the 413 goes out below.
                    exceeded = True
                    return {"type": "http.disconnect"}
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal response_started
            if message["type"] == "http.response.start":
                response_started = True
            await send(message)

        await self.app(scope, counting_receive, tracking_send)
        if exceeded and not response_started:
            await self.refuse(send)


def cap_daphne_request_bodies(limit: int | None = None) -> bool:
    """Make Daphne refuse bodies over `limit` before buffering them; False without Daphne.

    Daphne builds each connection's requests from `daphne.http_protocol.WebRequest`
    (looked up when a connection is made), so replacing it with a subclass here, when
    the ASGI module is imported and before the server listens, covers every request.
    """
    try:
        from daphne import http_protocol
    except ImportError:
        return False
    cap = limit if limit is not None else max_request_bytes()
    base: Any = getattr(http_protocol.WebRequest, "sectr_uncapped", http_protocol.WebRequest)

    class CappedWebRequest(base):
        sectr_uncapped = base
        max_body_bytes = cap

        def gotLength(self, length: int | None) -> None:  # noqa: N802 - Twisted's name
            self.sectr_body_bytes = 0
            self.sectr_refused = False
            super().gotLength(length)
            if length is not None and length > self.max_body_bytes:
                self.sectr_refuse()

        def handleContentChunk(self, data: bytes) -> None:  # noqa: N802 - Twisted's name
            if self.sectr_refused:
                return
            self.sectr_body_bytes += len(data)
            if self.sectr_body_bytes > self.max_body_bytes:
                self.sectr_refuse()
                return
            super().handleContentChunk(data)

        def process(self) -> Any:
            if getattr(self, "sectr_refused", False):
                return None  # answered already; the application never sees it
            return super().process()

        def sectr_refuse(self) -> None:
            self.sectr_refused = True
            body = refusal_body(self.max_body_bytes)
            head = (
                b"HTTP/1.1 413 Payload Too Large\r\n"
                b"Content-Type: application/json\r\n"
                b"Content-Length: " + str(len(body)).encode() + b"\r\n"
                b"Connection: close\r\n\r\n"
            )
            transport = self.channel.transport
            transport.write(head + body)
            # loseConnection stops reading (no more of the body enters this process) and
            # closes once the answer is written.
            transport.loseConnection()

    http_protocol.WebRequest = CappedWebRequest
    return True
