"""HTTP connections to an MCP server that go only where an address guard said they may.

Checking a URL's host and then letting the HTTP client connect leaves a gap: the client
resolves the name again, and a name under someone else's control can answer a public
address to the check and ``127.0.0.1`` to the connection (DNS rebinding). Here the one
lookup is the guard's: `GuardedBackend.connect_tcp` hands the host to the guard (which
resolves it once, judges every address and returns them, or raises), then connects to
one of the addresses it returned, never to the name. TLS still names the host (httpcore
passes the origin's host as SNI to `start_tls`), and the Host header is the URL's, so a
virtual host on a shared address answers as it would to a plain client.

Only the public APIs of `httpx2`/`httpcore2` (what the `mcp` package's client speaks)
are used: a connection pool given a network backend of its own, behind a small
`httpx2.AsyncBaseTransport`.
"""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import AsyncIterator, Callable, Generator, Iterable, Mapping, Sequence
from typing import Any

import anyio.to_thread
import httpcore2
import httpx2

__all__ = ["AddressGuard", "GuardedBackend", "GuardedTransport", "guarded_http_client"]

#: Resolves a host once and returns the addresses a connection may use (every one of
#: them checked); raises (any Exception, whose message says why) to refuse the host. It
#: may block (a DNS lookup): it runs in a worker thread.
AddressGuard = Callable[[str, int], Sequence[str]]

# httpcore2's errors as httpx2's, the most specific first: the `mcp` client catches httpx2's.
_ERRORS: tuple[tuple[type[Exception], type[httpx2.HTTPError]], ...] = (
    (httpcore2.ConnectTimeout, httpx2.ConnectTimeout),
    (httpcore2.ReadTimeout, httpx2.ReadTimeout),
    (httpcore2.WriteTimeout, httpx2.WriteTimeout),
    (httpcore2.PoolTimeout, httpx2.PoolTimeout),
    (httpcore2.TimeoutException, httpx2.TimeoutException),
    (httpcore2.ConnectError, httpx2.ConnectError),
    (httpcore2.ReadError, httpx2.ReadError),
    (httpcore2.WriteError, httpx2.WriteError),
    (httpcore2.NetworkError, httpx2.NetworkError),
    (httpcore2.UnsupportedProtocol, httpx2.UnsupportedProtocol),
    (httpcore2.LocalProtocolError, httpx2.LocalProtocolError),
    (httpcore2.RemoteProtocolError, httpx2.RemoteProtocolError),
    (httpcore2.ProtocolError, httpx2.ProtocolError),
)


@contextlib.contextmanager
def _as_httpx_errors() -> Generator[None]:
    try:
        yield
    except Exception as exc:
        for core, mapped in _ERRORS:
            if isinstance(exc, core):
                raise mapped(str(exc)) from exc
        raise


class GuardedBackend(httpcore2.AsyncNetworkBackend):
    """A network backend whose TCP connections go to the addresses `guard` returned for
    the host: resolved once, every address checked, the name never looked up again."""

    def __init__(self, guard: AddressGuard, inner: httpcore2.AsyncNetworkBackend | None = None) -> None:
        self._guard = guard
        self._inner = inner if inner is not None else httpcore2.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 - httpcore2's interface
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        try:
            addresses = list(await anyio.to_thread.run_sync(self._guard, host, port))
        except Exception as exc:
            raise httpcore2.ConnectError(f"connection to {host} refused: {exc}") from None
        if not addresses:
            raise httpcore2.ConnectError(f"connection to {host} refused: it resolves to no address")
        failure: Exception | None = None
        for address in addresses:  # the first one that answers, as a resolving client would
            try:
                return await self._inner.connect_tcp(
                    address, port, timeout=timeout, local_address=local_address, socket_options=socket_options
                )
            except (httpcore2.ConnectError, httpcore2.ConnectTimeout) as exc:
                failure = exc
        assert failure is not None
        raise failure

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109 - httpcore2's interface
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        raise httpcore2.ConnectError("unix sockets are not guarded addresses")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


class _ResponseStream(httpx2.AsyncByteStream):
    def __init__(self, stream: Any) -> None:
        self._stream = stream

    async def __aiter__(self) -> AsyncIterator[bytes]:
        with _as_httpx_errors():
            async for part in self._stream:
                yield part

    async def aclose(self) -> None:
        if hasattr(self._stream, "aclose"):
            with _as_httpx_errors():
                await self._stream.aclose()


class GuardedTransport(httpx2.AsyncBaseTransport):
    """httpx2's default transport, on a `GuardedBackend` (no proxies: a proxy would resolve
    the name itself). `ssl_context`: httpx2's default (the system's trust store)."""

    def __init__(self, guard: AddressGuard, ssl_context: ssl.SSLContext | None = None) -> None:
        self._pool = httpcore2.AsyncConnectionPool(
            ssl_context=ssl_context if ssl_context is not None else httpx2.create_ssl_context(),
            max_connections=100,
            max_keepalive_connections=20,
            keepalive_expiry=5.0,
            network_backend=GuardedBackend(guard),
        )

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        core_request = httpcore2.Request(
            method=request.method,
            url=httpcore2.URL(
                scheme=request.url.raw_scheme,
                host=request.url.raw_host,
                port=request.url.port,
                target=request.url.raw_path,
            ),
            headers=request.headers.raw,
            content=request.stream,
            extensions=request.extensions,
        )
        with _as_httpx_errors():
            response = await self._pool.handle_async_request(core_request)
        return httpx2.Response(
            status_code=response.status,
            headers=response.headers,
            stream=_ResponseStream(response.stream),
            extensions=response.extensions,
        )

    async def aclose(self) -> None:
        await self._pool.aclose()


def guarded_http_client(headers: Mapping[str, str], guard: AddressGuard) -> httpx2.AsyncClient:
    """An httpx2 client as the `mcp` package's own (`create_mcp_http_client`: its timeouts,
    no redirects followed by the client), connecting only through `guard`."""
    from mcp.shared._httpx_utils import MCP_DEFAULT_SSE_READ_TIMEOUT, MCP_DEFAULT_TIMEOUT

    return httpx2.AsyncClient(
        headers=dict(headers),
        timeout=httpx2.Timeout(MCP_DEFAULT_TIMEOUT, read=MCP_DEFAULT_SSE_READ_TIMEOUT),
        transport=GuardedTransport(guard),
    )
