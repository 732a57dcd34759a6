"""A lean HTTP/1.1 client for the benches: keep-alive connections, Content-Length and
chunked bodies, server-sent events. Nothing else (no TLS, no redirects, no cookies jar).

Why not httpx: the benches run their clients on the servers' own machine (2 cores), so
the client is part of the load it measures. httpx's AsyncClient spent about 10 ms of CPU
per POST (bench/live.py at N=100: 996 ms of client CPU for 100 POSTs, more than both
Daphnes together), which delayed the very requests whose admission is timed. This
client writes a prepared request and parses the status line and headers by hand: well
under a millisecond a request. Both systems of bench/peers.py use it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from urllib.parse import urlencode, urlsplit


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def status_code(self) -> int:  # httpx's name, so call sites read the same
        return self.status

    def json(self) -> object:
        return json.loads(self.body)


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.body_read = False  # the last response's body was read to its end

    async def head(self) -> tuple[int, dict[str, str]]:
        raw = await self.reader.readuntil(b"\r\n\r\n")
        lines = raw.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        headers: dict[str, str] = {}
        for line in lines[1:]:
            if line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        return status, headers

    async def chunks(self, headers: Mapping[str, str]) -> AsyncIterator[bytes]:
        """The body's pieces as they arrive (chunked) or at once (Content-Length)."""
        self.body_read = False
        if headers.get("transfer-encoding", "").lower() == "chunked":
            while True:
                size = int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16)
                if size == 0:
                    await self.reader.readuntil(b"\r\n")
                    self.body_read = True
                    return
                data = await self.reader.readexactly(size + 2)
                yield data[:-2]
        else:
            length = int(headers.get("content-length", "0"))
            if length:
                yield await self.reader.readexactly(length)
            self.body_read = True


class LeanClient:
    """Requests to one base URL over at most `connections` keep-alive connections."""

    def __init__(self, base_url: str, *, headers: Mapping[str, str] | None = None, connections: int = 100) -> None:
        parts = urlsplit(base_url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self.authority = parts.netloc
        self.headers = dict(headers or {})
        self.idle: list[_Connection] = []
        self.slots = asyncio.Semaphore(connections)

    async def _connection(self) -> _Connection:
        if self.idle:
            return self.idle.pop()
        reader, writer = await asyncio.open_connection(self.host, self.port)
        return _Connection(reader, writer)

    def _request_bytes(
        self, method: str, path: str, body: bytes, content_type: str | None, headers: Mapping[str, str] | None = None
    ) -> bytes:
        lines = [f"{method} {path} HTTP/1.1", f"Host: {self.authority}", f"Content-Length: {len(body)}"]
        if content_type:
            lines.append(f"Content-Type: {content_type}")
        lines += [f"{name}: {value}" for name, value in {**self.headers, **(headers or {})}.items()]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body

    @asynccontextmanager
    async def stream(
        self,
        method: str,
        path: str,
        *,
        data: Mapping[str, str] | None = None,
        json_body: object = None,
        headers: Mapping[str, str] | None = None,
    ) -> AsyncIterator[tuple[int, dict[str, str], AsyncIterator[bytes]]]:
        """One request; `headers` are added to (or override) the client's own."""
        body, content_type = b"", None
        if data is not None:
            body, content_type = urlencode(data).encode(), "application/x-www-form-urlencoded"
        elif json_body is not None:
            body, content_type = json.dumps(json_body).encode(), "application/json"
        async with self.slots:
            connection = await self._connection()
            reusable = False
            try:
                connection.writer.write(self._request_bytes(method, path, body, content_type, headers))
                status, headers = await connection.head()
                yield status, headers, connection.chunks(headers)
                reusable = connection.body_read and headers.get("connection", "").lower() != "close"
            finally:
                if reusable:
                    self.idle.append(connection)
                else:
                    connection.writer.close()

    async def request(self, method: str, path: str, **kwargs: object) -> Response:
        async with self.stream(method, path, **kwargs) as (status, headers, chunks):  # type: ignore[arg-type]
            body = b"".join([piece async for piece in chunks])
        return Response(status, headers, body)

    async def post(self, path: str, **kwargs: object) -> Response:
        return await self.request("POST", path, **kwargs)

    async def get(self, path: str) -> Response:
        return await self.request("GET", path)

    async def sse_lines(self, chunks: AsyncIterator[bytes]) -> AsyncIterator[str]:
        """A server-sent event stream's lines, as each arrives."""
        pending = b""
        async for piece in chunks:
            pending += piece
            *lines, pending = pending.split(b"\n")
            for line in lines:
                yield line.rstrip(b"\r").decode()

    async def aclose(self) -> None:
        for connection in self.idle:
            connection.writer.close()
        self.idle.clear()
