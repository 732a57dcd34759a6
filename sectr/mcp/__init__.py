"""MCP (Model Context Protocol) tool servers as Sectr tools, without Django (docs/mcp.md).

A `McpServer` keeps one connection to one server (a stdio command it runs, or a
Streamable HTTP endpoint), speaks whichever protocol revision the server does (the
stateless 2026-07-28 one or the session-based 2025-11-25 one: the `mcp` package's client
probes `server/discover` and falls back to `initialize`), and turns the server's tools
into `SchemaTool`s named ``<server>__<tool>``::

    async with McpServer(ServerConfig(name="git", command="mcp-server-git", args=("--repository", path))) as git:
        tools = await git.discover()
        rt = LocalRuntime(tools=tools, agent=AgentSpec(tools=("git__*",)))

Gates come from the tool's annotations (`readOnlyHint: true` runs without asking; every
other tool asks; `destructiveHint: false` is not mutating; only `idempotentHint: true` is
idempotent, so every other call is journaled as started before it runs). A call carries
its idempotency key in `_meta` (``sectr/idempotency_key``). Whatever goes wrong in a call
(`isError`, a protocol error, a timeout, a server that is unreachable or died) raises
`McpToolError`, which the runtime turns into an error result for the model: never a failed
run. A server that died is started again on the next call, after a backoff when it keeps
dying.

Images and audio in a result are not text: each one is decoded and handed to the
server's `store_media` hook (``async (session_id, McpMedia) -> reference``), and the
call returns a `ToolOutput`: the text, naming each one (``[image image/png, 2.5 KB]``),
with the references the TOOL_RESULT journals as its ``media``. The Sectr server stores
them as a session's media; `MemoryMediaStore` keeps them in this process (for
`LocalRuntime`); without a hook they are named and not kept. The bytes never reach the
journal or the model.

A server's tool list may change while it runs. A session-based server says so with
`notifications/tools/list_changed` on the connection; a stateless one that declares the
`tools` capability's `listChanged` says so on a `subscriptions/listen` stream, which a
connection with an `on_tools_changed` listener keeps open (either way, the listener hears
it); a stateless one may also give `tools/list` a cache hint (`ttlMs`), kept as
`tools_ttl_s`. `McpPool` honours all of them: its discovered tools are forgotten on a
change and when the hint runs out.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import fnmatch
import hashlib
import json
import logging
import os
import re
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sectr.payloads import MEDIA_SCHEME, RESULT_MEDIA_MAX
from sectr.tools import SchemaTool, ToolContext, ToolOutput

if TYPE_CHECKING:
    from mcp import Client

__all__ = [
    "DEFAULT_MAX_MEDIA_BYTES",
    "DEFAULT_MAX_RESULT_BYTES",
    "McpMedia",
    "MediaStore",
    "MemoryMediaStore",
    "IDEMPOTENCY_META_KEY",
    "McpPool",
    "McpServer",
    "McpToolError",
    "CallObserver",
    "cap",
    "result_output",
    "result_text",
    "size_words",
    "server_configs_from_json",
    "ServerConfig",
    "discover_tools",
    "gates_from_annotations",
    "tool_name",
]

logger = logging.getLogger("sectr.mcp")

DEFAULT_MAX_RESULT_BYTES = 262144
#: The largest image or audio of a result that is kept (a prompt's upload limit).
DEFAULT_MAX_MEDIA_BYTES = 10 * 1024 * 1024
DEFAULT_TIMEOUT_S = 60.0
#: The `_meta` key a call's idempotency key travels under.
IDEMPOTENCY_META_KEY = "sectr/idempotency_key"
_NAME_OK = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_SERVER_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,31}$")
#: The longest cache hint honoured (the `mcp` client's own cap: a day).
MAX_TOOLS_TTL_S = 24 * 60 * 60.0
#: How long a new connection to a stateless server waits for its tool-list subscription
#: to be acknowledged before its first call goes ahead anyway.
LISTEN_ACK_S = 5.0
#: A tool-list subscription that lasted less than this is reopened after a growing backoff.
LISTEN_STEADY_S = 30.0
#: Seconds before the n-th restart in a row of a server that keeps dying (then the last).
_BACKOFF = (0.0, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
_CLIENT_NAME = "sectr"


class McpToolError(RuntimeError):
    """An MCP call that did not give a result: the message says why, for the model."""


#: Told of every call a server made: (server name, tool, seconds, error or None). A
#: worker counts calls, errors and latency per server with it; it must not raise or block.
CallObserver = Callable[[str, str, float, "McpToolError | None"], None]


@dataclass(frozen=True)
class McpMedia:
    """An image or audio block of a tool result, decoded: what a `MediaStore` keeps."""

    kind: str  # "image" or "audio"
    mime_type: str
    data: bytes = field(repr=False)


#: Keeps one image or audio of a call's result for a session (its id; None for a call
#: made outside a session) and returns its reference, ``sectr-media://<sha256>``.
#: ValueError (its message says why) refuses it: the result names it as not kept.
MediaStore = Callable[["str | None", McpMedia], "Awaitable[str]"]


class MemoryMediaStore:
    """Media kept in this process's memory by sha256, for `LocalRuntime` (a script or a
    test): ``McpServer(config, store_media=store)``, then ``store.get(ref)``. Nothing is
    ever removed; the Sectr server stores media as a session's instead."""

    def __init__(self) -> None:
        self.items: dict[str, McpMedia] = {}

    async def __call__(self, session_id: str | None, media: McpMedia) -> str:
        digest = hashlib.sha256(media.data).hexdigest()
        self.items[digest] = media
        return MEDIA_SCHEME + digest

    def get(self, ref: str) -> McpMedia | None:
        return self.items.get(ref.removeprefix(MEDIA_SCHEME))


@dataclass(frozen=True)
class ServerConfig:
    """One MCP server: a stdio `command` (with `args`, `env`, `cwd`) or a Streamable HTTP
    `url` (with `headers`, secrets: never in `repr`). `tools` are globs of the server's
    tool names to offer (None: all). `mode` is the
    protocol choice of the `mcp` client (``auto``: whatever the server speaks)."""

    name: str
    command: str | None = None
    args: Sequence[str] = ()
    env: Mapping[str, str] | None = None
    cwd: str | None = None
    url: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    timeout_s: float = DEFAULT_TIMEOUT_S
    #: How long starting the server and agreeing on a protocol may take.
    connect_timeout_s: float = 30.0
    tools: Sequence[str] | None = None
    max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES
    #: An image or audio of a result larger than this is named, not kept.
    max_media_bytes: int = DEFAULT_MAX_MEDIA_BYTES
    mode: str = "auto"
    #: For an HTTP server: resolves the URL's host once and returns the addresses a
    #: connection may use, each checked, or raises to refuse it (sectr.mcp.http). Every
    #: connection then goes to one of them, so DNS cannot answer the guard one address
    #: and the connection another. None: the HTTP client resolves and connects as usual.
    connect_guard: Callable[[str, int], Sequence[str]] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not _SERVER_NAME.match(self.name):
            raise ValueError(f"invalid MCP server name {self.name!r}: use 1-32 lowercase letters, digits or '-'")
        if (self.command is None) == (self.url is None):
            raise ValueError(f"MCP server {self.name}: give either a command (stdio) or a url (HTTP)")
        if self.timeout_s <= 0 or self.max_result_bytes <= 0 or self.max_media_bytes <= 0:
            raise ValueError(
                f"MCP server {self.name}: timeout_s, max_result_bytes and max_media_bytes must be positive"
            )
        object.__setattr__(self, "args", tuple(self.args))
        if self.tools is not None:
            object.__setattr__(self, "tools", tuple(self.tools))

    @property
    def transport(self) -> str:
        return "stdio" if self.command is not None else "http"

    def offers(self, tool: str) -> bool:
        return self.tools is None or any(fnmatch.fnmatchcase(tool, pattern) for pattern in self.tools)


def tool_name(server: str, tool: str) -> str:
    """The name the model sees: ``<server>__<tool>``, valid as an OpenAI function name.
    A name that is too long or has other characters is shortened (or cleaned) and ends in
    a hash of the original, so two tools never share a name and the name never changes."""
    full = f"{server}__{tool}"
    if _NAME_OK.match(full):
        return full
    digest = hashlib.sha256(full.encode()).hexdigest()[:10]
    clean = re.sub(r"[^A-Za-z0-9_-]", "_", full)
    return f"{clean[: 64 - len(digest) - 1]}_{digest}"


def gates_from_annotations(annotations: Any) -> dict[str, bool]:
    """`Tool` flags from an MCP tool's annotations (hints: missing means the cautious side)."""
    read_only = bool(getattr(annotations, "read_only_hint", None))
    destructive = getattr(annotations, "destructive_hint", None)
    return {
        "gated": not read_only,
        "mutating": not read_only and destructive is not False,
        "idempotent": getattr(annotations, "idempotent_hint", None) is True,
    }


def size_words(size: int) -> str:
    """A byte count as people read it: "512 bytes", "2.5 KB", "12 KB", "3.1 MB"."""
    if size < 1024:
        return f"{size} bytes"
    for unit, scale in (("KB", 1024), ("MB", 1024**2), ("GB", 1024**3)):
        value = size / scale
        if value < 1024 or unit == "GB":
            return f"{value:.1f} {unit}" if value < 10 else f"{value:.0f} {unit}"
    raise AssertionError("unreachable")


def _base64_size(data: str) -> int:
    """The decoded size of base64 text, without decoding it."""
    return len(data) * 3 // 4 - data[-2:].count("=") if data else 0


def _describe_block(block: Any) -> str:
    kind = getattr(block, "type", None)
    if kind == "text":
        return str(block.text)
    if kind in ("image", "audio"):
        return f"[{kind} {block.mime_type}, {size_words(_base64_size(block.data or ''))}]"
    if kind == "resource_link":
        title = getattr(block, "title", None) or block.name
        return f"[resource: {title} <{block.uri}>]"
    if kind == "resource":
        resource = block.resource
        text = getattr(resource, "text", None)
        if text is not None:
            return str(text)
        blob = getattr(resource, "blob", None) or ""
        mime = getattr(resource, "mime_type", None) or "binary"
        return f"[resource: <{resource.uri}> ({mime}, {size_words(_base64_size(blob))}; not kept)]"
    return f"[{kind or 'unknown'} content]"


def result_text(result: Any) -> str:
    """The text of a `CallToolResult`: its text blocks joined, other blocks named."""
    parts = [_describe_block(block) for block in result.content or ()]
    if not parts and getattr(result, "structured_content", None) is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False, default=str))
    return "\n".join(parts)


async def result_output(
    result: Any, config: ServerConfig, store: MediaStore | None, session_id: str | None
) -> ToolOutput:
    """A `CallToolResult` as a `ToolOutput`: its text (capped at the config's
    `max_result_bytes`), each image and audio stored through `store` and named, with
    their references. An item over `max_media_bytes`, past RESULT_MEDIA_MAX, with bad
    base64, refused by the store, or without a store, is named and not kept."""
    parts: list[str] = []
    media: list[dict[str, Any]] = []
    for block in result.content or ():
        kind = getattr(block, "type", None)
        if kind not in ("image", "audio"):
            parts.append(_describe_block(block))
            continue
        mime_type = str(block.mime_type or "application/octet-stream")[:100]
        encoded = block.data or ""
        size = _base64_size(encoded)
        name = f"{kind} {mime_type}, {size_words(size)}"
        why = None
        if store is None:
            why = "no media store"
        elif size > config.max_media_bytes:
            why = f"over the {size_words(config.max_media_bytes)} limit"
        elif len(media) >= RESULT_MEDIA_MAX:
            why = f"a result keeps at most {RESULT_MEDIA_MAX}"
        else:
            try:
                data = base64.b64decode(encoded, validate=True)
                if not data:
                    raise ValueError("it is empty")
                ref = await store(session_id, McpMedia(kind, mime_type, data))
            except binascii.Error:
                why = "not valid base64"
            except ValueError as exc:
                why = str(exc) or "refused"
            else:
                name = f"{kind} {mime_type}, {size_words(len(data))}"
                media.append({"ref": ref, "kind": kind, "mime_type": mime_type, "bytes": len(data)})
        parts.append(f"[{name}]" if why is None else f"[{name}: not kept, {why}]")
    if not parts and getattr(result, "structured_content", None) is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False, default=str))
    return ToolOutput(cap("\n".join(parts), config.max_result_bytes), media)


def cap(text: str, max_bytes: int) -> str:
    """`text` cut to `max_bytes` of UTF-8, with a note saying so."""
    data = text.encode()
    if len(data) <= max_bytes:
        return text
    kept = data[:max_bytes].decode(errors="ignore")
    return f"{kept}\n[cut: the result was {len(data)} bytes; only the first {max_bytes} are kept]"


class _StderrLog:
    """A pipe a stdio server writes its stderr to; each line goes to the log with the
    server's name (never to the worker's own stderr, where it would lose its origin)."""

    def __init__(self, server: str) -> None:
        read_fd, write_fd = os.pipe()
        self.writer = os.fdopen(write_fd, "w")
        self._reader = os.fdopen(read_fd, "rb")
        self._server = server
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._pump())

    async def _pump(self) -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), self._reader)
        try:
            while line := await reader.readline():
                logger.info("mcp server %s: %s", self._server, line.decode(errors="replace").rstrip())
        finally:
            transport.close()

    async def close(self) -> None:
        with contextlib.suppress(OSError):
            self.writer.close()
        if self._task is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(self._task), 1.0)
            self._task.cancel()


class McpServer:
    """One connection to one MCP server, reused across calls and runs.

    The connection lives in a task of its own (the `mcp` client's task group must be
    entered and left by one task); calls from any task of the same loop use it. When the
    server dies, the next call starts it again, waiting out a backoff when it died just
    before; a call that would wait longer than its timeout fails at once instead.
    """

    def __init__(
        self,
        config: ServerConfig,
        *,
        on_call: CallObserver | None = None,
        on_tools_changed: Callable[[], None] | None = None,
        store_media: MediaStore | None = None,
    ) -> None:
        self.config = config
        self._on_call = on_call
        #: Called (on the loop, must not block or raise) when the server says its tools
        #: changed (`notifications/tools/list_changed` on a session-based connection; on
        #: a stateless one, an event of the `subscriptions/listen` stream this opens when
        #: the hook is set before connecting and the server declares `listChanged`).
        self.on_tools_changed = on_tools_changed
        #: Where the images and audio of results go (module docstring); None: not kept.
        self.store_media = store_media
        self._client: Client | None = None
        self._runner: asyncio.Task[None] | None = None
        self._closing: asyncio.Event | None = None
        self._lock: asyncio.Lock | None = None
        self._failures = 0
        self._failed_at = 0.0
        #: The last error, for a health display (None: the last connect worked).
        self.last_error: str | None = None
        #: The protocol revision the server speaks, once connected.
        self.protocol_version: str | None = None
        #: How long the last `tools/list` may be taken as fresh, by the server's cache hint
        #: (the stateless revision's `ttlMs`); None: the server gave none (or 0).
        self.tools_ttl_s: float | None = None
        #: The names the last `tools/list` on this connection gave (None: never listed),
        #: so an error from a tool no longer among them can say so.
        self._listed: frozenset[str] | None = None
        #: Whether a tool-list subscription of this server was ever acknowledged.
        self._listened = False

    async def __aenter__(self) -> McpServer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- the connection ------------------------------------------------------------------

    async def _connected(self) -> Client:
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self.alive and self._client is not None:
                return self._client
            if self._client is not None:  # it was up, and went away since
                self._note_failure(ConnectionError("the connection closed (did the server exit?)"))
                logger.warning("MCP server %s: connection lost; starting it again", self.config.name)
            await self._stop()
            if self._failures:
                wait = _BACKOFF[min(self._failures, len(_BACKOFF) - 1)] - (time.monotonic() - self._failed_at)
                if wait > self.config.connect_timeout_s:
                    down = f"MCP server {self.config.name} is down (last error: {self.last_error})"
                    raise McpToolError(f"{down}; retrying in {wait:.0f}s")
                if wait > 0:
                    await asyncio.sleep(wait)
            try:
                async with asyncio.timeout(self.config.connect_timeout_s):
                    return await self._start()
            except Exception as exc:
                self._note_failure(exc)
                await self._stop()
                raise McpToolError(f"MCP server {self.config.name} is unreachable: {_reason(exc)}") from None

    def _note_failure(self, exc: BaseException) -> None:
        self._failures += 1
        self._failed_at = time.monotonic()
        self.last_error = _reason(exc)

    async def _start(self) -> Client:
        from mcp import Client, Implementation

        loop = asyncio.get_running_loop()
        ready: asyncio.Future[Client] = loop.create_future()
        closing = asyncio.Event()
        stderr = _StderrLog(self.config.name) if self.config.command is not None else None

        async def run() -> None:
            try:
                transport = self._transport(stderr)
                async with Client(
                    transport,
                    mode=self.config.mode,
                    client_info=Implementation(name=_CLIENT_NAME, version="1"),
                    cache=None,  # discovery is explicit (`discover`), never a stale cached list
                    message_handler=self._on_message,
                ) as client:
                    follower = None
                    if self.on_tools_changed is not None and _listens_for_tools(client):
                        subscribed = asyncio.Event()
                        follower = loop.create_task(
                            self._follow_tools(client, subscribed), name=f"mcp-listen:{self.config.name}"
                        )
                        # The first call waits for the subscription (briefly): a change
                        # that call makes must not come before anyone listens.
                        with contextlib.suppress(TimeoutError):
                            async with asyncio.timeout(LISTEN_ACK_S):
                                await subscribed.wait()
                    if not ready.done():
                        ready.set_result(client)
                    try:
                        await closing.wait()
                    finally:
                        if follower is not None:
                            follower.cancel()
                            with contextlib.suppress(BaseException):
                                await follower
            except BaseException as exc:  # noqa: BLE001 - reported to whoever waits, or the next call
                if not ready.done():
                    ready.set_exception(exc if isinstance(exc, Exception) else RuntimeError(repr(exc)))
                elif not closing.is_set():
                    self._note_failure(exc)
                    logger.warning("MCP server %s: connection lost: %s", self.config.name, _reason(exc))
                if isinstance(exc, asyncio.CancelledError):
                    raise
            finally:
                if stderr is not None:
                    await stderr.close()

        if stderr is not None:
            stderr.start()
        self._closing = closing
        self._runner = loop.create_task(run(), name=f"mcp:{self.config.name}")
        client = await ready
        self._client = client
        self.protocol_version = client.protocol_version
        return client

    def _transport(self, stderr: _StderrLog | None) -> Any:
        from mcp import StdioServerParameters, stdio_client
        from mcp.client.streamable_http import streamable_http_client
        from mcp.shared._httpx_utils import create_mcp_http_client

        config = self.config
        if config.command is not None:
            env = None if config.env is None else {**_inherited_env(), **config.env}
            params = StdioServerParameters(command=config.command, args=list(config.args), env=env, cwd=config.cwd)
            assert stderr is not None
            return stdio_client(params, errlog=stderr.writer)
        assert config.url is not None
        if config.connect_guard is not None:
            from sectr.mcp.http import guarded_http_client

            http = guarded_http_client(config.headers, config.connect_guard)
        else:
            http = create_mcp_http_client(headers=dict(config.headers))
        return streamable_http_client(config.url, http_client=http)

    async def _on_message(self, message: Any) -> None:
        """The server's notifications (and transport faults, which the call paths see too)."""
        from mcp_types import ToolListChangedNotification
        from mcp_types.version import MODERN_PROTOCOL_VERSIONS

        # On a stateless connection it comes from a listen stream, whose reader
        # (`_follow_tools`) hears it too: once is enough.
        if isinstance(message, ToolListChangedNotification) and self.protocol_version not in MODERN_PROTOCOL_VERSIONS:
            self._tools_changed()

    async def _follow_tools(self, client: Client, subscribed: asyncio.Event) -> None:
        """The stateless revision's change notifications: a `subscriptions/listen` stream
        for the tool list, open while the connection is (a session-based server sends
        them on the connection itself, `_on_message`). A stream that ends or drops is
        opened again after a backoff, and the tools count as changed then, since nothing
        replays what was said meanwhile (so does a new connection's first stream, when
        an earlier connection had one: the server may have changed while none was
        open). A stream that did not last `LISTEN_STEADY_S`
        counts as a failure, so a server that keeps closing them at once is asked ever
        less often (and its tools listed again as seldom). `subscribed` is set once the
        first stream is acknowledged (or could not be opened). Ends when the connection
        does."""
        failures = 0
        try:
            while not _client_closed(client):
                started = time.monotonic()
                try:
                    async with client.listen(tools_list_changed=True) as subscription:
                        subscribed.set()
                        if not subscription.honored.tools_list_changed:
                            return  # it declared the capability, then refused it: nothing to follow
                        if self._listened:
                            self._tools_changed()
                        self._listened = True
                        async for _event in subscription:
                            self._tools_changed()
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # noqa: BLE001 - following changes is best effort; calls still work
                    if not _client_closed(client):
                        logger.warning("MCP server %s: tool-list subscription lost: %s", self.config.name, _reason(exc))
                failures = failures + 1 if time.monotonic() - started < LISTEN_STEADY_S else 0
                subscribed.set()
                await asyncio.sleep(_BACKOFF[min(failures + 1, len(_BACKOFF) - 1)])
        finally:
            subscribed.set()

    def _tools_changed(self) -> None:
        logger.info("MCP server %s: its tool list changed", self.config.name)
        hook = self.on_tools_changed
        if hook is not None:
            try:
                hook()
            except Exception:  # noqa: BLE001 - a listener's fault must not end the connection
                logger.warning("MCP server %s: the tool-list listener failed", self.config.name, exc_info=True)

    async def _stop(self) -> None:
        runner, self._runner, self._client = self._runner, None, None
        if self._closing is not None:
            self._closing.set()
        if runner is not None and not runner.done():
            try:
                await asyncio.wait_for(asyncio.shield(runner), 5.0)
            except Exception:
                runner.cancel()
                with contextlib.suppress(BaseException):
                    await runner

    async def close(self) -> None:
        """Close the connection (stop a stdio server). A later call opens a new one."""
        await self._stop()

    @property
    def alive(self) -> bool:
        """Whether the connection is up (a stdio server that exited is noticed here, so the
        next call starts it again instead of failing on the dead pipe)."""
        client, runner = self._client, self._runner
        if client is None or runner is None or runner.done():
            return False
        return not _client_closed(client)

    # --- tools -----------------------------------------------------------------------------

    async def list_tools(self) -> list[Any]:
        """The server's tools (every page of `tools/list`), as the `mcp` package's objects."""
        from mcp_types.version import MODERN_PROTOCOL_VERSIONS

        client = await self._connected()
        tools: list[Any] = []
        cursor: str | None = None
        ttls: list[int] = []
        try:
            async with asyncio.timeout(self.config.timeout_s):
                for _ in range(100):  # a server whose pages never end cannot hang discovery
                    page = await client.list_tools(cursor=cursor)
                    tools.extend(page.tools)
                    # A hint counts only when the server set it, on the stateless revision
                    # (a session-based peer's stray `ttlMs` is not one; the SDK agrees).
                    if "ttl_ms" in page.model_fields_set:
                        ttls.append(int(page.ttl_ms))
                    cursor = page.next_cursor
                    if not cursor:
                        break
        except Exception as exc:
            await self._after_error(exc)
            raise McpToolError(f"MCP server {self.config.name}: tools/list failed: {_reason(exc)}") from None
        self._failures = 0
        self.last_error = None
        self._listed = frozenset(str(t.name) for t in tools)
        # The whole list is as fresh as its stalest page; 0 (or none) is no promise at all.
        ttl_ms = min(ttls) if ttls and client.protocol_version in MODERN_PROTOCOL_VERSIONS else 0
        self.tools_ttl_s = min(ttl_ms / 1000, MAX_TOOLS_TTL_S) if ttl_ms > 0 else None
        return tools

    async def discover(self) -> list[SchemaTool]:
        """The server's tools its config offers, as Sectr tools bound to this connection."""
        return [self.make_tool(t) for t in await self.list_tools() if self.config.offers(t.name)]

    def make_tool(self, mcp_tool: Any) -> SchemaTool:
        """A Sectr tool for one of the server's tools (an `mcp` Tool, or its JSON as a dict)."""
        if isinstance(mcp_tool, Mapping):
            from mcp import Tool as McpTool

            mcp_tool = McpTool.model_validate(dict(mcp_tool))
        remote = str(mcp_tool.name)
        server = self

        async def call(arguments: dict[str, Any], context: ToolContext | None = None) -> str:
            key = None
            if context is not None and context.tool_call_id is not None:
                key = f"{context.session_id}:{context.tool_call_id}"
            session_id = context.session_id if context is not None else None
            return await server.call(remote, arguments, idempotency_key=key, session_id=session_id)

        description = mcp_tool.description or getattr(mcp_tool, "title", None) or remote
        tool = SchemaTool(
            call,
            name=tool_name(self.config.name, remote),
            description=str(description),
            parameters=dict(mcp_tool.input_schema or {}),
            **gates_from_annotations(mcp_tool.annotations),
        )
        tool.mcp_server = self.config.name
        return tool

    async def call(
        self,
        tool: str,
        arguments: Mapping[str, Any],
        *,
        idempotency_key: str | None = None,
        session_id: str | None = None,
    ) -> ToolOutput:
        """Call one of the server's tools: its text, capped, with its stored media
        (`result_output`; `session_id` is whose media they become). McpToolError for
        anything else."""
        if self._on_call is None:
            return await self._call(tool, arguments, idempotency_key, session_id)
        started = time.monotonic()
        try:
            text = await self._call(tool, arguments, idempotency_key, session_id)
        except McpToolError as exc:
            self._on_call(self.config.name, tool, time.monotonic() - started, exc)
            raise
        self._on_call(self.config.name, tool, time.monotonic() - started, None)
        return text

    async def _call(
        self, tool: str, arguments: Mapping[str, Any], idempotency_key: str | None, session_id: str | None
    ) -> ToolOutput:
        name = self.config.name
        client = await self._connected()
        meta: dict[str, Any] = {IDEMPOTENCY_META_KEY: idempotency_key} if idempotency_key else {}
        try:
            async with asyncio.timeout(self.config.timeout_s):
                result = await client.call_tool(tool, dict(arguments), meta=meta or None)  # type: ignore[arg-type]
        except TimeoutError:
            # A server that does not answer in time may be stuck: the next call gets a new one.
            self._note_failure(TimeoutError(f"{tool} timed out"))
            await self._stop()
            raise McpToolError(f"MCP server {name}: {tool} timed out after {self.config.timeout_s:g}s") from None
        except Exception as exc:
            await self._after_error(exc)
            raise McpToolError(f"MCP server {name}: {tool} failed: {_reason(exc)}{self._gone(tool)}") from None
        if result.is_error:
            text = cap(result_text(result), self.config.max_result_bytes)
            raise McpToolError(
                f"MCP server {name}: {tool} reported an error: {text or '(no message)'}{self._gone(tool)}"
            )
        return await result_output(result, self.config, self.store_media, session_id)

    def _gone(self, tool: str) -> str:
        """A note for an error from a tool the server's latest list no longer has: its
        tools changed after this run's were chosen."""
        listed = self._listed
        if listed is None or tool in listed:
            return ""
        return " (the server no longer lists this tool: its tools changed since they were discovered)"

    async def _after_error(self, exc: BaseException) -> None:
        """Keep the connection after an error the server answered; drop it otherwise."""
        from mcp import MCPError
        from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT

        if isinstance(exc, MCPError) and exc.code not in (CONNECTION_CLOSED, REQUEST_TIMEOUT) and self.alive:
            return
        self._note_failure(exc)
        await self._stop()


def _inherited_env() -> dict[str, str]:
    # What a stdio server needs to start at all (PATH, HOME, the locale); the `mcp`
    # package's own default list, so a configured `env` adds to it rather than replacing it.
    from mcp.client.stdio import get_default_environment

    return get_default_environment()


def _client_closed(client: Client) -> bool:
    """Whether the transport under an `mcp` client closed. The client shows no public
    sign of it; its dispatcher's flag is the one place that knows, read defensively."""
    dispatcher = getattr(client.session, "_dispatcher", None)
    return bool(getattr(dispatcher, "_closed", False))


def _listens_for_tools(client: Client) -> bool:
    """Whether the server tells a listening client that its tools changed: the stateless
    revision, and the `tools` capability's `listChanged` (which that revision's servers
    declare when they serve `subscriptions/listen`)."""
    from mcp_types.version import MODERN_PROTOCOL_VERSIONS

    if client.protocol_version not in MODERN_PROTOCOL_VERSIONS:
        return False
    tools = client.server_capabilities.tools
    return bool(tools is not None and tools.list_changed)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup):
        inner = exc.exceptions[0] if exc.exceptions else exc
        return _reason(inner)
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class McpPool:
    """The MCP connections of one process (a worker): one `McpServer` per key (a team's
    server, an installation's stdio server), reused across runs, its tools discovered once
    and kept until `refresh`, all closed by `close` (when the worker drains).

    `on_call` hears every call of every server, with the server's key as its name;
    `store_media` keeps the images and audio of every server's results.
    `on_tools_changed` hears the key of a server that said its tools changed (after the
    pool forgot them). Tools discovered with a cache hint are discovered again once it
    has run out.

    A server that cannot be reached while its tools were never discovered offers no tools
    (its `last_error` says why); once discovered, its tools stay, and a call to a server
    that died meanwhile is an error result while the connection is started again.
    """

    def __init__(
        self,
        *,
        on_call: CallObserver | None = None,
        on_tools_changed: Callable[[str], None] | None = None,
        store_media: MediaStore | None = None,
    ) -> None:
        self._on_call = on_call
        self._on_tools_changed = on_tools_changed
        self._store_media = store_media
        self._servers: dict[str, McpServer] = {}
        self._tools: dict[str, list[SchemaTool]] = {}
        #: When (monotonic) a key's discovered tools stop being fresh, by the server's hint.
        self._fresh_until: dict[str, float] = {}
        self._discovering: dict[str, asyncio.Task[list[SchemaTool]]] = {}

    def server(self, key: str, config: ServerConfig) -> McpServer:
        """The connection for `key`; a changed config replaces it (the old one is closed)."""
        current = self._servers.get(key)
        if current is not None and current.config == config:
            return current
        if current is not None:
            self.refresh(key)
            asyncio.get_running_loop().create_task(current.close())
        observer = self._on_call
        if observer is not None:  # the pool's observer hears the key (two teams may both have a "docs")

            def on_call(_name: str, tool: str, seconds: float, error: McpToolError | None) -> None:
                observer(key, tool, seconds, error)

        server = McpServer(config, on_call=on_call if observer is not None else None, store_media=self._store_media)

        def changed() -> None:
            if self._servers.get(key) is not server:
                return  # a replaced connection's news is stale
            self.refresh(key)
            if self._on_tools_changed is not None:
                self._on_tools_changed(key)

        server.on_tools_changed = changed
        self._servers[key] = server
        return server

    def current(self, key: str) -> McpServer | None:
        """The connection kept for `key`, if any (a worker re-lists its tools on it)."""
        return self._servers.get(key)

    async def tools(self, key: str, config: ServerConfig) -> list[SchemaTool]:
        """The server's tools (discovered on first use; concurrent callers share one
        discovery). [] when it cannot be reached and has never been."""
        server = self.server(key, config)
        if key in self._tools and time.monotonic() >= self._fresh_until.get(key, float("inf")):
            self.refresh(key)  # the server's cache hint ran out
        if key in self._tools and self._servers.get(key) is server:
            return self._tools[key]
        task = self._discovering.get(key)
        if task is None:
            task = asyncio.get_running_loop().create_task(server.discover())
            self._discovering[key] = task
        try:
            tools = await asyncio.shield(task)
        except McpToolError as exc:
            logger.warning("%s", exc)
            return []
        finally:
            if task.done() and self._discovering.get(key) is task:
                del self._discovering[key]
        if self._servers.get(key) is server:
            self._tools[key] = tools
            if server.tools_ttl_s is not None:
                self._fresh_until[key] = time.monotonic() + server.tools_ttl_s
        return tools

    def refresh(self, key: str) -> None:
        """Forget the tools of `key`: the next `tools` call discovers them again."""
        self._tools.pop(key, None)
        self._fresh_until.pop(key, None)

    def status(self, key: str) -> dict[str, Any]:
        """What a health display shows of `key`: up or not, its protocol and last error."""
        server = self._servers.get(key)
        if server is None:
            return {"connected": False, "protocol_version": None, "last_error": None}
        return {"connected": server.alive, "protocol_version": server.protocol_version, "last_error": server.last_error}

    async def close(self) -> None:
        servers, self._servers, self._tools = list(self._servers.values()), {}, {}
        await asyncio.gather(*(s.close() for s in servers), return_exceptions=True)


def server_configs_from_json(
    data: Any, *, max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES, max_media_bytes: int = DEFAULT_MAX_MEDIA_BYTES
) -> dict[str, ServerConfig]:
    """Stdio servers from an operator's file: ``{name: {command, args?, env?, cwd?}}``.
    ValueError naming the first entry that is not one."""
    if not isinstance(data, dict):
        raise ValueError("MCP servers: expected a JSON object of name -> {command, args, env, cwd}")
    configs: dict[str, ServerConfig] = {}
    for name, entry in data.items():
        if not isinstance(entry, dict) or not isinstance(entry.get("command"), str) or not entry["command"]:
            raise ValueError(f"MCP server {name!r}: needs a command (a string)")
        unknown = set(entry) - {"command", "args", "env", "cwd", "timeout_s", "tools"}
        if unknown:
            raise ValueError(f"MCP server {name!r}: unknown keys {sorted(unknown)}")
        args, env, cwd = entry.get("args", []), entry.get("env"), entry.get("cwd")
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise ValueError(f"MCP server {name!r}: args must be a list of strings")
        if env is not None and not (isinstance(env, dict) and all(isinstance(v, str) for v in env.values())):
            raise ValueError(f"MCP server {name!r}: env must map names to strings")
        if cwd is not None and not isinstance(cwd, str):
            raise ValueError(f"MCP server {name!r}: cwd must be a string")
        tools = entry.get("tools")
        if tools is not None and not (isinstance(tools, list) and all(isinstance(t, str) for t in tools)):
            raise ValueError(f"MCP server {name!r}: tools must be a list of globs")
        timeout = entry.get("timeout_s", DEFAULT_TIMEOUT_S)
        if isinstance(timeout, bool) or not isinstance(timeout, int | float):
            raise ValueError(f"MCP server {name!r}: timeout_s must be a number")
        configs[name] = ServerConfig(
            name=str(name),
            command=entry["command"],
            args=args,
            env=env,
            cwd=cwd,
            timeout_s=float(timeout),
            tools=tools,
            max_result_bytes=max_result_bytes,
            max_media_bytes=max_media_bytes,
        )
    return configs


async def discover_tools(config: ServerConfig) -> list[SchemaTool]:
    """Connect to a server and return its tools. The connection stays open for their calls
    as long as the process runs; to close it, use `McpServer` (``async with``) instead."""
    return await McpServer(config).discover()
