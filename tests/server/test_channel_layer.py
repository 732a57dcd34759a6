"""The embedded default's channel layer (sectr_web.channel_layer): Channels' in-memory
layer whose expiry sweep runs at most once a second instead of on every message."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from channels.layers import InMemoryChannelLayer as ChannelsLayer
from django.conf import settings

from sectr_web import channel_layer
from sectr_web.channel_layer import InMemoryChannelLayer


def test_it_is_the_layer_without_redis() -> None:
    with_redis = bool(os.environ.get("REDIS_URL"))
    expected = (
        "channels_redis.pubsub.RedisPubSubChannelLayer"
        if with_redis
        else "sectr_web.channel_layer.InMemoryChannelLayer"
    )
    assert settings.CHANNEL_LAYERS["default"]["BACKEND"] == expected


def test_many_messages_sweep_once(monkeypatch: Any) -> None:
    sweeps = []
    monkeypatch.setattr(ChannelsLayer, "_clean_expired", lambda self: sweeps.append(1))

    async def traffic() -> list[Any]:
        layer = InMemoryChannelLayer()
        channels = [await layer.new_channel() for _ in range(50)]
        for name in channels:
            await layer.group_add("g", name)
        for _ in range(20):
            await layer.group_send("g", {"type": "x"})
        return [await layer.receive(name) for name in channels for _ in range(20)]

    received = asyncio.run(traffic())
    assert len(received) == 50 * 20  # every message delivered, in a burst of 1,020 sends and receives
    assert len(sweeps) == 1  # Channels' own layer swept 1,020 times


def test_an_expired_message_is_still_dropped(monkeypatch: Any) -> None:
    monkeypatch.setattr(channel_layer, "SWEEP_SECONDS", 0.05)

    async def expire() -> dict[str, Any]:
        layer = InMemoryChannelLayer(expiry=0.01)
        name = await layer.new_channel()
        await layer.group_add("g", name)
        await layer.send(name, {"type": "old"})
        await asyncio.sleep(0.1)  # past the message's expiry and the sweep interval
        layer._clean_expired()
        return {"channels": dict(layer.channels), "group": dict(layer.groups.get("g", {}))}

    left = asyncio.run(expire())
    assert left == {"channels": {}, "group": {}}  # dropped, and its channel left the group
