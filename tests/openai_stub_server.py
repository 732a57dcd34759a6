"""A local, scripted OpenAI-compatible chat completions server for tests.

Real HTTP and real Server-Sent Events on 127.0.0.1 (a thread of its own), so the
`openai` package is exercised as it is in production, without mocks::

    with OpenAIStubServer() as srv:
        srv.script([text_stream("Hello", " world"), error_reply(429)])
        provider = OpenAIProvider(base_url=srv.base_url, default_model="stub-model")
        ...
        assert srv.requests[0]["model"] == "stub-model"

Each POST /v1/chat/completions takes the next scripted reply (or the `fallback`
when the script is used up; without one the server answers 500 "no scripted
reply left"). A reply is an :class:`SSEStream`, an :class:`ErrorReply`, or a function
of the request body returning one (see :func:`echo_reply`). GET /v1/models lists
one model, ``stub-model``.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

STUB_MODEL = "stub-model"


@dataclass
class SSEStream:
    """A 200 text/event-stream answer (chunked transfer encoding).

    `chunks` are chat.completion.chunk dicts (sent as ``data: {json}``) or raw
    strings written verbatim (e.g. ``": keep-alive\\n\\n"``).
    """

    chunks: list[dict[str, Any] | str]
    #: end with ``data: [DONE]``
    done: bool = True
    #: after this many chunks, close the socket abruptly (no [DONE], no final HTTP chunk)
    drop_after: int | None = None
    #: seconds to wait before each chunk
    chunk_delay: float = 0.0


@dataclass
class ErrorReply:
    """A JSON error answer shaped like OpenAI's: ``{"error": {"message", "type", "code"}}``."""

    status: int
    message: str = ""
    body: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)


StubReply = SSEStream | ErrorReply | Callable[[dict[str, Any]], "SSEStream | ErrorReply"]

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    422: "invalid_request_error",
    429: "rate_limit_exceeded",
}


# ---- building replies ----


def chunk(
    delta: dict[str, Any] | None = None,
    *,
    finish_reason: str | None = None,
    usage: dict[str, Any] | None = None,
    no_choices: bool = False,
    model: str = STUB_MODEL,
) -> dict[str, Any]:
    """One chat.completion.chunk. `no_choices` gives the usage-only final chunk's shape."""
    body: dict[str, Any] = {
        "id": "chatcmpl-stub",
        "object": "chat.completion.chunk",
        "created": 1_700_000_000,
        "model": model,
        "choices": []
        if no_choices
        else [{"index": 0, "delta": delta or {}, "finish_reason": finish_reason, "logprobs": None}],
    }
    if usage is not None:
        body["usage"] = usage
    return body


def usage_chunk(
    prompt_tokens: int, completion_tokens: int, *, reasoning_tokens: int | None = None, cached_tokens: int | None = None
) -> dict[str, Any]:
    """The final chunk of a stream with include_usage: empty choices, usage set."""
    usage: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    if reasoning_tokens is not None:
        usage["completion_tokens_details"] = {"reasoning_tokens": reasoning_tokens}
    if cached_tokens is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    return chunk(no_choices=True, usage=usage)


def text_stream(
    *texts: str,
    reasoning: Iterable[str] = (),
    finish_reason: str = "stop",
    usage: tuple[int, int] | None = (10, 5),
    chunk_delay: float = 0.0,
) -> SSEStream:
    """A plain answer: a role chunk, reasoning_content chunks, text chunks, the finish
    chunk and (unless `usage` is None) a usage chunk with empty choices."""
    chunks: list[dict[str, Any] | str] = [chunk({"role": "assistant", "content": ""})]
    chunks += [chunk({"reasoning_content": piece}) for piece in reasoning]
    chunks += [chunk({"content": text}) for text in texts]
    chunks.append(chunk(finish_reason=finish_reason))
    if usage is not None:
        chunks.append(usage_chunk(*usage))
    return SSEStream(chunks, chunk_delay=chunk_delay)


def split_text(text: str, pieces: int) -> list[str]:
    """`text` cut into `pieces` consecutive parts (some may be empty when it is short)."""
    size = -(-len(text) // pieces) if text else 0
    return [text[i * size : (i + 1) * size] for i in range(pieces)]


def tool_call_stream(
    calls: list[tuple[str, str, str]],
    *,
    pieces: int = 5,
    interleave: bool = False,
    usage: tuple[int, int] | None = (10, 5),
) -> SSEStream:
    """Tool calls `(id, name, arguments)` as real servers send them: id and name in a
    first fragment, the arguments split over `pieces` more, one index per call;
    `interleave` alternates the calls' fragments."""
    per_call: list[list[dict[str, Any]]] = []
    for index, (call_id, name, arguments) in enumerate(calls):
        fragments = [{"index": index, "id": call_id, "type": "function", "function": {"name": name, "arguments": ""}}]
        fragments += [{"index": index, "function": {"arguments": part}} for part in split_text(arguments, pieces)]
        per_call.append(fragments)
    ordered: list[dict[str, Any]] = []
    if interleave:
        for step in range(max(len(f) for f in per_call)):
            ordered += [fragments[step] for fragments in per_call if step < len(fragments)]
    else:
        ordered = [fragment for fragments in per_call for fragment in fragments]
    chunks: list[dict[str, Any] | str] = [chunk({"role": "assistant", "content": None})]
    chunks += [chunk({"tool_calls": [fragment]}) for fragment in ordered]
    chunks.append(chunk(finish_reason="tool_calls"))
    if usage is not None:
        chunks.append(usage_chunk(*usage))
    return SSEStream(chunks)


def error_reply(status: int, message: str | None = None) -> ErrorReply:
    return ErrorReply(status=status, message=message or f"stub error {status}")


def last_user_text(body: dict[str, Any]) -> str:
    for message in reversed(body.get("messages") or []):
        if message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, list):
                return " ".join(str(p.get("text", "")) for p in content if p.get("type") == "text")
            return str(content or "")
    return ""


def echo_reply(body: dict[str, Any]) -> SSEStream:
    """A reply function: ``You said: <last user text>`` (a handy `fallback`)."""
    words = f"You said: {last_user_text(body)}".split(" ")
    return text_stream(*[w + " " for w in words[:-1]], words[-1])


# ---- the server ----


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _StubHTTPServer

    def log_message(self, format: str, *args: Any) -> None:
        pass  # keep test output clean

    def do_GET(self) -> None:
        if self.path.rstrip("/") == "/v1/models":
            self._send_json(
                200, {"object": "list", "data": [{"id": STUB_MODEL, "object": "model", "owned_by": "stub"}]}
            )
        else:
            self._send_json(404, {"error": {"message": f"no route {self.path}", "type": "not_found_error"}})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if self.path.rstrip("/") != "/v1/chat/completions":
            self._send_json(404, {"error": {"message": f"no route {self.path}", "type": "not_found_error"}})
            return
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            self._send_json(400, {"error": {"message": "body is not JSON", "type": "invalid_request_error"}})
            return
        reply = self.server.stub.record_and_take(body, {key.lower(): value for key, value in self.headers.items()})
        if callable(reply):
            reply = reply(body)
        if isinstance(reply, ErrorReply):
            self._send_error_reply(reply)
        else:
            self._send_stream(reply, str(body.get("model") or STUB_MODEL))

    def _send_json(self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    def _send_error_reply(self, reply: ErrorReply) -> None:
        payload = reply.body or {
            "error": {
                "message": reply.message or f"stub error {reply.status}",
                "type": _ERROR_TYPES.get(reply.status, "server_error"),
                "code": None,
            }
        }
        self._send_json(reply.status, payload, reply.headers)

    def _write_http_chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _send_stream(self, stream: SSEStream, model: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            for sent, item in enumerate(stream.chunks):
                if stream.drop_after is not None and sent >= stream.drop_after:
                    self._drop_connection()
                    return
                if stream.chunk_delay:
                    time.sleep(stream.chunk_delay)
                if isinstance(item, dict):
                    if item.get("model") == STUB_MODEL:  # echo the model the request named
                        item = {**item, "model": model}
                    text = f"data: {json.dumps(item)}\n\n"
                else:
                    text = item
                self._write_http_chunk(text.encode())
            if stream.drop_after is not None:
                self._drop_connection()
                return
            if stream.done:
                self._write_http_chunk(b"data: [DONE]\n\n")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client went away (e.g. a cancelled run)

    def _drop_connection(self) -> None:
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


class _StubHTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, stub: OpenAIStubServer) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.stub = stub


class OpenAIStubServer:
    """See the module docstring. Usable as a context manager or with start()/stop()."""

    def __init__(self, fallback: StubReply | None = None) -> None:
        self.fallback = fallback
        #: JSON bodies of the chat completion requests received, in order
        self.requests: list[dict[str, Any]] = []
        #: their headers (lower-cased names), in the same order
        self.headers: list[dict[str, str]] = []
        self._queue: deque[StubReply] = deque()
        self._lock = threading.Lock()
        self._server: _StubHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("the stub server is not running")
        return int(self._server.server_address[1])

    @property
    def base_url(self) -> str:
        """What OPENAI_BASE_URL should be: ``http://127.0.0.1:PORT/v1``."""
        return f"http://127.0.0.1:{self.port}/v1"

    def script(self, replies: Iterable[StubReply]) -> None:
        """Queue replies; each chat completion request takes the next one."""
        with self._lock:
            self._queue.extend(replies)

    @property
    def pending(self) -> int:
        """How many scripted replies are still unused."""
        with self._lock:
            return len(self._queue)

    def record_and_take(self, body: dict[str, Any], headers: dict[str, str]) -> StubReply:
        with self._lock:
            self.requests.append(body)
            self.headers.append(headers)
            if self._queue:
                return self._queue.popleft()
        if self.fallback is not None:
            return self.fallback
        return ErrorReply(500, "OpenAIStubServer: no scripted reply left")

    def start(self) -> OpenAIStubServer:
        self._server = _StubHTTPServer(self)
        # A short poll interval keeps stop() (which waits for the loop to notice) fast.
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, name="openai-stub", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> OpenAIStubServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
