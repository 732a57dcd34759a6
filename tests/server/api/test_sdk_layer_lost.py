"""The SDKs' streamed POST while live updates are unavailable, against a real server
whose channel layer refuses event streams' joins on demand (tests/server/layer_faults.py,
as a lost Redis does): the server answers `503 unavailable` with `Retry-After: 2` and
posts nothing, and `session.run(..., stream=True)` sends the POST again after that wait,
a few times at most, then raises the 503."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sectr.client import AsyncClient, Cancellation, Client, RequestCancelled, SectrError
from sectr.client.protocol import STREAM_POST_RETRIES
from tests.server.api.test_api_support import LiveApi, live_api, row_counts

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def refused(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The file whose number is how many event streams' joins the server refuses next."""
    return tmp_path_factory.mktemp("layer") / "refused-joins"


@pytest.fixture(scope="module")
def api(refused: Path) -> Iterator[LiveApi]:
    env = {"DJANGO_SETTINGS_MODULE": "tests.server.layer_fault_settings", "SECTR_TEST_REFUSED_JOINS": str(refused)}
    with live_api(env=env) as live:
        yield live


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
