"""The channel-layer publisher of the async journal path (sessions_app.journal.publish).

A burst of appends goes out whole and in order (nothing is dropped by Sectr's own
publisher), a layer that fails for a moment is retried, and what is given up after the
budget is counted in publish_drops(). The real channel layer of the settings (in-memory
on the SQLite pass, Redis on the PostgreSQL pass).
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from channels.layers import get_channel_layer

from sectr.events import Envelope, EventType
from sessions_app.journal import publish


def envelope(session_id: str, seq: int) -> Envelope:
    return Envelope(session_id, seq, "inv_1", EventType.MESSAGE_DELTA, {"text": f"tick {seq} "}, datetime.now(UTC))


class FlakyLayer:
    """The real layer, whose first `failures` group_sends raise (a Redis restart)."""

    def __init__(self, layer: Any, failures: int) -> None:
        self.layer, self.failures = layer, failures

    async def group_send(self, group: str, message: dict[str, Any]) -> None:
        if self.failures > 0:
            self.failures -= 1
            raise ConnectionError("the channel layer is away")
        await self.layer.group_send(group, message)


async def receive_seqs(layer: Any, channel: str, session_id: str, count: int, timeout: float = 30) -> list[int]:
    seqs: list[int] = []
    async with asyncio.timeout(timeout):
        while len(seqs) < count:
            message = await layer.receive(channel)
            if message.get("session_id") == session_id:
                seqs.extend(e["seq"] for e in message["envelopes"])
    return seqs


async def test_a_burst_is_published_whole_and_in_order() -> None:
    layer = get_channel_layer()
    session_id = f"ses_{uuid.uuid4().hex}"
    channel = await layer.new_channel()
    await layer.group_add(publish.session_group(session_id), channel)
    drops = publish.publish_drops()
    count = 1500
    receiver = asyncio.ensure_future(receive_seqs(layer, channel, session_id, count))
    await asyncio.sleep(0)
    for seq in range(1, count + 1):  # as fast as a group commit hands them over
        await publish.apublish([envelope(session_id, seq)])
    await publish.aflush_publications()
    assert await receiver == list(range(1, count + 1))
    assert publish.publish_drops() == drops
    await layer.group_discard(publish.session_group(session_id), channel)


async def test_a_layer_that_fails_for_a_moment_is_retried_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    layer = get_channel_layer()
    flaky = FlakyLayer(layer, failures=3)
    monkeypatch.setattr(publish, "get_channel_layer", lambda: flaky)
    session_id = f"ses_{uuid.uuid4().hex}"
    channel = await layer.new_channel()
    await layer.group_add(publish.session_group(session_id), channel)
    drops = publish.publish_drops()
    receiver = asyncio.ensure_future(receive_seqs(layer, channel, session_id, 20))
    for seq in range(1, 21):
        await publish.apublish([envelope(session_id, seq)])
    await publish.aflush_publications()
    assert flaky.failures == 0
    assert await receiver == list(range(1, 21))
    assert publish.publish_drops() == drops


async def test_what_is_given_up_after_the_budget_is_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    flaky = FlakyLayer(get_channel_layer(), failures=10**9)
    monkeypatch.setattr(publish, "get_channel_layer", lambda: flaky)
    monkeypatch.setattr(publish, "PUBLISH_BUDGET", 0.3)
    session_id = f"ses_{uuid.uuid4().hex}"
    drops = publish.publish_drops()
    started = asyncio.get_running_loop().time()
    for seq in range(1, 6):
        await publish.apublish([envelope(session_id, seq)])
    assert asyncio.get_running_loop().time() - started < 0.1  # the journal writer never waits
    await publish.aflush_publications()
    assert publish.publish_drops() == drops + 5


def test_sync_publishers_queue_on_the_server_loop_without_waiting(monkeypatch: pytest.MonkeyPatch) -> None:
    """A view's on_commit (a sync thread) hands its messages to the adopted server loop's
    ordered publisher and returns at once; they arrive in order."""
    loop = asyncio.new_event_loop()
    started = threading.Event()
    thread = threading.Thread(target=lambda: (asyncio.set_event_loop(loop), started.set(), loop.run_forever()))
    thread.start()
    started.wait(5)
    monkeypatch.setattr(publish, "_server_loop", None)
    try:

        async def adopt() -> None:
            publish.adopt_server_loop()

        asyncio.run_coroutine_threadsafe(adopt(), loop).result(5)
        assert publish._server_loop is loop
        session_id = f"ses_{uuid.uuid4().hex}"

        async def subscribe() -> tuple[Any, str]:
            layer = get_channel_layer()
            channel = await layer.new_channel()
            await layer.group_add(publish.session_group(session_id), channel)
            return layer, channel

        layer, channel = asyncio.run_coroutine_threadsafe(subscribe(), loop).result(10)
        calls: list[Any] = []
        monkeypatch.setattr(publish, "async_to_sync", lambda *a, **k: calls.append(a) or (lambda *a2: None))
        for seq in range(1, 6):
            publish._send_sync(publish.envelope_messages([envelope(session_id, seq)]))
        assert calls == []  # never the blocking path
        got = asyncio.run_coroutine_threadsafe(receive_seqs(layer, channel, session_id, 5), loop).result(30)
        assert got == [1, 2, 3, 4, 5]
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()


class BatchLayer(FlakyLayer):
    """The real layer with a group_send_many (as the Redis layer has), whose first
    `batch_failures` calls send half their batch and then raise."""

    def __init__(self, layer: Any, batch_failures: int) -> None:
        super().__init__(layer, failures=0)
        self.batch_failures = batch_failures
        self.batches: list[int] = []

    async def group_send_many(self, messages: list[tuple[str, dict[str, Any]]]) -> None:
        self.batches.append(len(messages))
        if self.batch_failures > 0:
            self.batch_failures -= 1
            for group, message in messages[: len(messages) // 2]:
                await self.layer.group_send(group, message)
            raise ConnectionError("the pipeline broke halfway")
        for group, message in messages:
            await self.layer.group_send(group, message)


@pytest.mark.parametrize("batch_failures", [0, 1])
async def test_a_batch_goes_out_together_and_one_by_one_when_that_fails(
    monkeypatch: pytest.MonkeyPatch, batch_failures: int
) -> None:
    layer = get_channel_layer()
    batching = BatchLayer(layer, batch_failures)
    monkeypatch.setattr(publish, "get_channel_layer", lambda: batching)
    session_id = f"ses_{uuid.uuid4().hex}"
    channel = await layer.new_channel()
    await layer.group_add(publish.session_group(session_id), channel)
    drops = publish.publish_drops()
    sent = 40 if batch_failures == 0 else 40 + 20  # a broken batch's first half is sent twice
    receiver = asyncio.ensure_future(receive_seqs(layer, channel, session_id, sent))
    for seq in range(1, 41):  # forty appends queued before the publisher runs: one batch
        publish.queue_publication([envelope(session_id, seq)])
    await publish.aflush_publications()
    seqs = await receiver
    assert batching.batches == [40]  # tried together once
    assert sorted(set(seqs)) == list(range(1, 41)) and seqs[-40:] == list(range(1, 41))
    assert publish.publish_drops() == drops
    await layer.group_discard(publish.session_group(session_id), channel)
