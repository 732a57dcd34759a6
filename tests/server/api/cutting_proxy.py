"""A TCP proxy in front of a live server that drops every open connection on demand: at
once (`cut()`), or just after the server's answer carried a given event (`cut_after`)."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable
from types import TracebackType


def delta_marker(text: str) -> bytes:
    """The bytes of a `message.delta` frame's text as the server's SSE encodes it."""
    return b'"text":' + json.dumps(text, ensure_ascii=False, separators=(",", ":")).encode()


def partial_marker_at(data: bytes, marker: bytes) -> int:
    """Where the end of `data` that may be `marker`'s beginning starts (split across two
    reads, so held until the next), or len(data)."""
    for size in range(min(len(marker) - 1, len(data)), 0, -1):
        if marker.startswith(data[-size:]):
            return len(data) - size
    return len(data)


class CuttingProxy:
    """A TCP proxy on 127.0.0.1 whose `cut()` drops every open connection at once.

    `cut_after(texts)` cuts when the server's bytes carry the SSE frame of the delta with
    the first text left, forwarded up to that frame's end and not one byte more: the
    client has that event and must reconnect for the next, however far ahead of the
    client the server is. A cut by the client as it reads an event instead (`cut()`)
    finds the rest of the run already in its buffers when the client lags (under load),
    and then forces no reconnect."""

    def __init__(self, target_port: int) -> None:
        self.target = ("127.0.0.1", target_port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.accepted = 0
        self.cuts = 0
        self._open: list[socket.socket] = []
        self._markers: list[bytes] = []
        self._on_cut: Callable[[], None] | None = None
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def __enter__(self) -> CuttingProxy:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._closed = True
        self.listener.close()
        self.cut()

    def cut_after(self, texts: list[str], on_cut: Callable[[], None] | None = None) -> None:
        """Cut after each delta of `texts` in turn (see the class), calling `on_cut`
        first (before the connections drop, so before any reconnect)."""
        with self._lock:
            self._markers = [delta_marker(text) for text in texts]
            self._on_cut = on_cut

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            with self._lock:
                self.accepted += 1
                self._open += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, True), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, from_server: bool) -> None:
        held = b""
        try:
            while data := source.recv(65536):
                cut = False
                if from_server:
                    data, held, cut = self._split(held + data)
                if data:
                    sink.sendall(data)
                if cut:
                    self.cut()
                    return
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def _split(self, data: bytes) -> tuple[bytes, bytes, bool]:
        """What to forward of the server's `data` now, what to hold until more comes, and
        whether to cut after forwarding."""
        with self._lock:
            if not self._markers:
                return data, b"", False
            marker = self._markers[0]
            at = data.find(marker)
            if at < 0:
                # Hold an end that may be the marker's beginning, split across two reads.
                keep = next(
                    (n for n in range(min(len(marker) - 1, len(data)), 0, -1) if marker.startswith(data[-n:])), 0
                )
                return data[: len(data) - keep], data[len(data) - keep :], False
            end = data.find(b"\n\n", at)
            if end < 0:
                return data[:at], data[at:], False  # the frame's end is still to come
            self._markers.pop(0)
            on_cut = self._on_cut
        if on_cut is not None:
            on_cut()
        return data[: end + 2], b"", True

    def cut(self) -> None:
        with self._lock:
            doomed, self._open = self._open, []
            self.cuts += 1
        for sock in doomed:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
