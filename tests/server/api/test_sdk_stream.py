"""The SDK's event streams under trouble: connections cut mid-run (through a local proxy
that drops every connection just after the server sent a given event) and a worker
killed mid-run (the run's `recover` invocation continues it, and the stream shows a
`recover_notice`)."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest

from sectr.client import Client, RunEvent
from tests.server.api.cutting_proxy import CuttingProxy
from tests.server.api.test_api_support import LiveApi, live_api

pytestmark = pytest.mark.slow

TICKS = 24


def ticks(count: int) -> str:
    return "".join(f"tick {i} " for i in range(1, count + 1))


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
        # Cut just after the server sent each of these events, whether or not the client
        # has read it yet: each cut forces a reconnect (mostly mid-run), even when the
        # client lags behind the run (see CuttingProxy).
        proxy.cut_after(["tick 3 ", "tick 9 ", "tick 15 "])
        run = session.run(f"!slow {TICKS}")
        events = list(run)
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
