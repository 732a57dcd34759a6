"""The SDKs against a real server whose live updates or database are away on demand:
its channel layer refuses event streams' joins (tests/server/layer_faults.py, as a lost
Redis does), and its event streams' GETs are answered `503 unavailable` with
`Retry-After: 2` (tests/server/stream_fault_urls.py, as while PostgreSQL restarts).

A streamed POST answered 503 posted nothing: `session.run(..., stream=True)` sends it
again after that wait, a few times at most, then raises the 503. A stream's GET answered
503 (its first, or a reconnect after a cut) is a cut too: the SDK reconnects after that
wait, from the last event it got, and raises the 503 only after `max_reconnects`
attempts in a row, or when the wait would outlast the call's deadline."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sectr.client import AsyncClient, Cancellation, Client, RequestCancelled, RunEvent, SectrError
from sectr.client.protocol import STREAM_POST_RETRIES
from tests.server.api.cutting_proxy import CuttingProxy
from tests.server.api.test_api_support import LiveApi, live_api, row_counts

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def refused(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The file whose number is how many event streams' joins the server refuses next."""
    return tmp_path_factory.mktemp("layer") / "refused-joins"


@pytest.fixture(scope="module")
def refused_streams(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The file whose number is how many event streams' GETs the server answers 503 next."""
    return tmp_path_factory.mktemp("streams") / "refused-streams"


@pytest.fixture(scope="module")
def api(refused: Path, refused_streams: Path) -> Iterator[LiveApi]:
    env = {
        "DJANGO_SETTINGS_MODULE": "tests.server.layer_fault_settings",
        "SECTR_TEST_REFUSED_JOINS": str(refused),
        "SECTR_TEST_REFUSED_STREAMS": str(refused_streams),
    }
    with live_api(env=env) as live:
        yield live


def ticks(count: int) -> str:
    return "".join(f"tick {i} " for i in range(1, count + 1))


def signature(events: list[RunEvent]) -> list[tuple[str, str, int | None, str | None]]:
    return [(e.kind, e.run_id, e.seq, e.text) for e in events]


def test_a_streamed_run_is_posted_again_after_retry_after(api: LiveApi, refused: Path) -> None:
    refused.write_text("2")
    with Client(api.base_url, token=api.tokens["alice"]) as client:
        session = client.sessions.create(title="layer back")
        runs_before = row_counts(api.live)["runs"]
        started = time.monotonic()
        run = session.run("!slow 3", stream=True)
        waited = time.monotonic() - started
        result = run.result()
    assert refused.read_text() == "0"  # both refusals were met: the POST was sent three times
    assert waited >= 2 * 2 - 0.1  # Retry-After: 2, twice
    assert result.stop_reason == "end_turn" and result.text == "tick 1 tick 2 tick 3 "
    assert row_counts(api.live)["runs"] == runs_before + 1  # the refused POSTs posted nothing


def test_the_async_client_posts_again_too(api: LiveApi, refused: Path) -> None:
    async def scenario() -> str:
        async with AsyncClient(api.base_url, token=api.tokens["alice"]) as client:
            session = await client.sessions.create(title="layer back, async")
            run = await session.run("!slow 2", stream=True)
            return (await run.result()).text

    refused.write_text("1")
    assert asyncio.run(scenario()) == "tick 1 tick 2 "
    assert refused.read_text() == "0"


def test_a_layer_that_stays_away_is_a_503_after_a_few_attempts(api: LiveApi, refused: Path) -> None:
    refused.write_text("100")
    with Client(api.base_url, token=api.tokens["alice"]) as client:
        session = client.sessions.create(title="layer away")
        runs_before = row_counts(api.live)["runs"]
        with pytest.raises(SectrError) as raised:
            session.run("hello", stream=True)
        assert (raised.value.status, raised.value.code) == (503, "unavailable")
        assert int(refused.read_text()) == 100 - (1 + STREAM_POST_RETRIES)
        # A deadline shorter than Retry-After: the 503 at once, not a wait past it.
        refused.write_text("100")
        with pytest.raises(SectrError) as raised:
            session.run("hello", stream=True, deadline=1.5)
        assert raised.value.status == 503
        assert refused.read_text() == "99"
        # Cancelling stops the wait.
        cancel = Cancellation()
        threading.Timer(0.3, cancel.cancel).start()
        started = time.monotonic()
        with pytest.raises(RequestCancelled):
            session.run("hello", stream=True, cancel=cancel)
        assert time.monotonic() - started < 1.5
    refused.write_text("0")
    assert row_counts(api.live)["runs"] == runs_before


def test_a_run_stream_answered_503_reconnects_after_retry_after_from_its_last_event(
    api: LiveApi, refused_streams: Path
) -> None:
    refused_streams.write_text("1")  # the first GET of the run's stream
    with CuttingProxy(api.live.port) as proxy, Client(proxy.url, token=api.tokens["alice"]) as client:
        session = client.sessions.create(title="database away")
        # A cut after tick 4, whose reconnect is answered 503 twice while the run goes on.
        proxy.cut_after(["tick 4 "], on_cut=lambda: refused_streams.write_text("2"))
        started = time.monotonic()
        run = session.run("!slow 40")
        events = list(run)
        waited = time.monotonic() - started
        assert proxy.cuts == 1
    assert refused_streams.read_text() == "0"  # three 503s, each followed by a reconnect
    assert waited >= 3 * 2 - 0.1  # Retry-After: 2, three times
    seqs = [e.seq for e in events]
    assert seqs == sorted(set(seqs)), "no event twice"
    assert "".join(e.text or "" for e in events if e.kind == "message.delta") == ticks(40), "no event lost"
    assert events[-1].kind == "result" and events[-1].payload["stop"] == "end_turn"
    with Client(api.base_url, token=api.tokens["alice"]) as client:
        assert signature(events) == signature(list(client.runs.attach(run.id)))


def test_a_session_stream_answered_503_reconnects_after_retry_after_from_its_last_event(
    api: LiveApi, refused_streams: Path
) -> None:
    with CuttingProxy(api.live.port) as proxy, Client(proxy.url, token=api.tokens["alice"]) as client:
        session = client.sessions.create(title="database away, session")
        run = session.run("!slow 12")
        refused_streams.write_text("1")  # the first GET of the session's stream
        proxy.cut_after(["tick 5 "], on_cut=lambda: refused_streams.write_text("1"))
        found = []
        for event in session.events():
            found.append(event)
            if event.kind == "result":
                break
        assert proxy.cuts == 1
    assert refused_streams.read_text() == "0"
    with Client(api.base_url, token=api.tokens["alice"]) as client:
        assert signature(found) == signature(list(client.runs.attach(run.id))), "every event once, in order"


def test_a_stream_answered_503_for_longer_raises_the_503(api: LiveApi, refused_streams: Path) -> None:
    with Client(api.base_url, token=api.tokens["alice"], max_reconnects=2) as client:
        session = client.sessions.create(title="database away for longer")
        run_id = session.run("hello").id
        refused_streams.write_text("100")
        with pytest.raises(SectrError) as raised:
            client.runs.attach(run_id).result()
        assert (raised.value.status, raised.value.code) == (503, "unavailable")
        assert refused_streams.read_text() == "97"  # the first GET and max_reconnects more
        with pytest.raises(SectrError) as raised:
            next(iter(session.events()))
        assert raised.value.status == 503
        assert refused_streams.read_text() == "94"
        # A deadline shorter than Retry-After: the 503 at once, not a wait past it.
        with pytest.raises(SectrError) as raised:
            client.runs.attach(run_id, deadline=1.5).result()
        assert raised.value.status == 503
        assert refused_streams.read_text() == "93"
        # Cancelling stops the wait.
        cancel = Cancellation()
        threading.Timer(0.3, cancel.cancel).start()
        started = time.monotonic()
        with pytest.raises(RequestCancelled):
            client.runs.attach(run_id, cancel=cancel).result()
        assert time.monotonic() - started < 1.5
        refused_streams.write_text("0")
        assert client.runs.attach(run_id).result().stop_reason == "end_turn"


def test_the_async_client_reconnects_after_a_503_too(api: LiveApi, refused_streams: Path) -> None:
    async def scenario() -> tuple[str, list[RunEvent]]:
        async with AsyncClient(api.base_url, token=api.tokens["alice"], max_reconnects=2) as client:
            session = await client.sessions.create(title="database away, async")
            run = await session.run("!slow 3")
            refused_streams.write_text("1")
            text = (await run.result()).text
            refused_streams.write_text("1")
            found = []
            async for event in session.events():
                found.append(event)
                if event.kind == "result":
                    break
            refused_streams.write_text("100")
            with pytest.raises(SectrError) as raised:
                await client.runs.attach(run.id).result()
            assert raised.value.status == 503 and refused_streams.read_text() == "97"
            cancel = Cancellation()
            asyncio.get_running_loop().call_later(0.3, cancel.cancel)
            with pytest.raises(RequestCancelled):
                await client.runs.attach(run.id, cancel=cancel).result()
            refused_streams.write_text("0")
            return text, found

    text, found = asyncio.run(scenario())
    assert text == "tick 1 tick 2 tick 3 "
    assert [e.kind for e in found][-1] == "result" and found[-1].payload["text"] == text
