"""The SDK's event streams under trouble: connections cut mid-run (through a local proxy
that drops every connection on demand) and a worker killed mid-run (the run's `recover`
invocation continues it, and the stream shows a `recover_notice`)."""

from __future__ import annotations

import signal
import socket
import threading
from collections.abc import Iterator
from types import TracebackType

import pytest

from sectr.client import Client, RunEvent
from tests.server.api.test_api_support import LiveApi, live_api

pytestmark = pytest.mark.slow

TICKS = 24


def ticks(count: int) -> str:
    return "".join(f"tick {i} " for i in range(1, count + 1))


class CuttingProxy:
    """A TCP proxy on 127.0.0.1 whose `cut()` drops every open connection at once."""

    def __init__(self, target_port: int) -> None:
        self.target = ("127.0.0.1", target_port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.accepted = 0
        self.cuts = 0
        self._open: list[socket.socket] = []
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
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

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


@pytest.fixture(scope="module")
def api() -> Iterator[LiveApi]:
    # A 2 s lease so that a killed worker's run is recovered quickly.
    with live_api(env={"SECTR_DEMO_SLOW_MS": "40", "SECTR_LEASE_SECONDS": "2"}) as live:
        yield live


def signature(events: list[RunEvent]) -> list[tuple[str, int | None, str | None]]:
    return [(e.kind, e.seq, e.text) for e in events]


def test_a_cut_stream_reconnects_from_the_last_event_without_gap_or_duplicate(api: LiveApi) -> None:
    with CuttingProxy(api.live.port) as proxy, Client(proxy.url, token=api.tokens["alice"]) as client:
        session = client.sessions.create(title="cuts")
        run = session.run(f"!slow {TICKS}")
        events = []
        for event in run:
            events.append(event)
            if event.kind == "message.delta" and event.text in ("tick 3 ", "tick 9 ", "tick 15 "):
                proxy.cut()  # mid-run: the next read fails and the SDK reconnects
        assert proxy.cuts == 3 and proxy.accepted >= 4, "it reconnected after each cut"
        seqs = [e.seq for e in events]
        assert seqs == sorted(set(seqs)), "no event twice"
        text = "".join(e.text or "" for e in events if e.kind == "message.delta")
        assert text == ticks(TICKS), "no event lost"
        assert events[-1].kind == "result" and events[-1].payload["text"] == ticks(TICKS)
        replay = list(client.runs.attach(run.id))
        assert signature(events) == signature(replay)


def test_a_run_survives_its_worker_being_killed(api: LiveApi) -> None:
    live = api.live
    with Client(api.base_url, token=api.tokens["alice"]) as client:
        session = client.sessions.create(title="crash")
        run = session.run(f"!slow {TICKS}")
        events = []
        for event in run:
            events.append(event)
            if event.kind == "message.delta" and event.text == "tick 4 ":
                if live.postgres:  # the worker is its own process: kill it, start another
                    live.workers[0].kill()
                    live.workers[0].wait(10)
                    live.start_worker()
                else:  # the worker runs inside Daphne: kill the server and start it again
                    live.stop(signal.SIGKILL)
                    live.start()
        assert "recover_notice" in [e.kind for e in events]
        seqs = [e.seq for e in events]
        assert seqs == sorted(set(seqs))
        assert events[-1].kind == "result" and events[-1].payload["stop"] == "end_turn"
        assert "".join(e.text or "" for e in events if e.kind == "message.delta") == ticks(TICKS)
        assert events[-1].payload["text"] == ticks(TICKS), "the recovered message continues the cut one"
        assert len(client.runs.get(run.id).raw["invocation_ids"]) == 2
        assert session.snapshot().state == "completed"
