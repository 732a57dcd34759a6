"""The embedded default's channel layer (sectr_web.channel_layer): Channels' in-memory
layer whose expiry sweep runs at most once a second instead of on every message."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from typing import Any

from channels.layers import InMemoryChannelLayer as ChannelsLayer
from django.conf import settings

from sectr_web import channel_layer
from sectr_web.channel_layer import InMemoryChannelLayer, RedisPubSubChannelLayer
from tests.cluster import PrivateRedis


def test_it_is_the_layer_without_redis() -> None:
    with_redis = bool(os.environ.get("REDIS_URL"))
    expected = (
        "sectr_web.channel_layer.RedisPubSubChannelLayer"
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


def test_each_member_gets_its_own_copy_and_a_full_one_is_skipped() -> None:
    async def send() -> tuple[list[Any], dict[str, Any]]:
        layer = InMemoryChannelLayer(capacity=1)
        full, first, second = [await layer.new_channel() for _ in range(3)]
        for name in (full, first, second):
            await layer.group_add("g", name)
        await layer.send(full, {"type": "filler"})
        message = {"type": "m", "envelopes": [{"seq": 1, "payload": {"text": "a"}}], "raw": b"x", "pair": (1, [2])}
        await layer.group_send("g", message)  # `full` has no room: skipped, the others still get it
        got = [await layer.receive(name) for name in (first, second)]
        got[0]["envelopes"][0]["payload"]["text"] = "changed"
        got[0]["pair"][1].append(3)
        return [await layer.receive(full), *got], message

    (filler, first, second), sent = asyncio.run(send())
    assert filler == {"type": "filler"}
    assert second == {"type": "m", "envelopes": [{"seq": 1, "payload": {"text": "a"}}], "raw": b"x", "pair": (1, [2])}
    assert sent["envelopes"][0]["payload"]["text"] == "a" and sent["pair"] == (1, [2])  # the sender's is untouched
    assert first["pair"] == (1, [2, 3])


def test_copy_message_deep_copies_what_it_does_not_know() -> None:
    marker = {1, 2}
    copied = channel_layer.copy_message({"set": marker})
    assert copied == {"set": {1, 2}} and copied["set"] is not marker


def test_group_send_many_is_what_group_send_would_send_in_order(tmp_path: Any) -> None:
    """Against a real Redis (a private redis-server), received by the layer's own
    subscribers: every message, each group's in order, none to a group not named, and
    what a plain group_send sends beside it arrives as well."""
    redis = PrivateRedis(tmp_path)
    redis.start()
    try:

        async def exchange() -> dict[str, list[Any]]:
            layer = RedisPubSubChannelLayer(hosts=[redis.url], prefix="many")
            names = {group: await layer.new_channel() for group in ("a", "b", "quiet")}
            for group, name in names.items():
                await layer.group_add(group, name)
            batch = [(group, {"type": "m", "n": n, "blob": b"\x00\xff"}) for n in range(30) for group in ("a", "b")]
            await layer.group_send_many(batch)
            await layer.group_send("a", {"type": "m", "n": "plain"})
            got = {group: [await asyncio.wait_for(layer.receive(names[group]), 5) for _ in range(count)]
                   for group, count in (("a", 31), ("b", 30))}  # fmt: skip
            with contextlib.suppress(TimeoutError):
                got["quiet"] = [await asyncio.wait_for(layer.receive(names["quiet"]), 0.3)]
            await layer.flush()
            return got

        got = asyncio.run(exchange())
    finally:
        redis.stop()
    assert [m["n"] for m in got["a"]] == [*range(30), "plain"]
    assert [m["n"] for m in got["b"]] == list(range(30))
    assert all(m["blob"] == b"\x00\xff" for m in got["a"][:30])
    assert "quiet" not in got


def test_after_a_redis_restart_its_idle_connections_subscribe_and_publish_again(tmp_path: Any) -> None:
    """A restarted Redis leaves the layer's connections dead. One that was idle (nothing
    subscribed, so its receive loop was not reading) finds out on its next command only:
    without a retry the next stream's SUBSCRIBE and the next PUBLISH failed on the dead
    socket. They reconnect and send again (REDIS_RETRY)."""
    redis = PrivateRedis(tmp_path)
    redis.start()
    try:

        async def restart_between() -> tuple[dict[str, Any], float]:
            subscriber = RedisPubSubChannelLayer(hosts=[redis.url], prefix="restart")
            publisher = RedisPubSubChannelLayer(hosts=[redis.url], prefix="restart")
            name = await subscriber.new_channel()
            await subscriber.group_add("before", name)
            await publisher.group_send_many([("before", {"type": "m"})])
            await asyncio.wait_for(subscriber.receive(name), 5)
            await subscriber.group_discard("before", name)
            with contextlib.suppress(TimeoutError):  # a cancelled receive unsubscribes its channel
                await asyncio.wait_for(subscriber.receive(name), 0.01)
            shard = subscriber._get_layer()._shards[0]
            while shard._pubsub.subscribed:  # until Redis confirmed both: nothing is read then
                await asyncio.sleep(0.01)
            redis.stop(signal.SIGKILL)
            redis.start()
            back = time.monotonic()
            name = await subscriber.new_channel()
            await subscriber.group_add("after", name)
            await publisher.group_send_many([("after", {"type": "m", "n": 1})])
            got = await asyncio.wait_for(subscriber.receive(name), 5)
            took = time.monotonic() - back
            await subscriber.flush()
            await publisher.flush()
            return got, took

        got, took = asyncio.run(restart_between())
    finally:
        redis.stop()
    assert got == {"type": "m", "n": 1}
    assert took < 2.0


def test_a_group_channel_has_no_subscription_of_its_own(tmp_path: Any) -> None:
    """new_group_channel: the channel gets its groups' messages, and Redis sees only the
    groups' subscriptions (none for the channel's own name, before or after its receive
    is cancelled, as an SSE stream's is)."""
    import redis as redis_client

    redis = PrivateRedis(tmp_path)
    redis.start()
    try:

        async def exchange() -> tuple[dict[str, Any], list[bytes], list[bytes]]:
            layer = RedisPubSubChannelLayer(hosts=[redis.url], prefix="only")
            channel = await layer.new_group_channel("sectr.sse.")
            await layer.group_add("g", channel)
            await layer.group_send("g", {"type": "m", "n": 1})
            got = await asyncio.wait_for(layer.receive(channel), 5)
            with redis_client.Redis.from_url(redis.url) as plain:
                while_open = sorted(plain.pubsub_channels())
                reader = asyncio.ensure_future(layer.receive(channel))
                await asyncio.sleep(0)
                reader.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await reader
                await layer.group_discard("g", channel)
                # The UNSUBSCRIBE goes out on the layer's own connection; Redis may answer
                # this other connection's PUBSUB CHANNELS before it has read it.
                after = sorted(plain.pubsub_channels())
                for _ in range(100):
                    if not after:
                        break
                    await asyncio.sleep(0.02)
                    after = sorted(plain.pubsub_channels())
            await layer.flush()
            return got, while_open, after

        got, while_open, after = asyncio.run(exchange())
    finally:
        redis.stop()
    assert got == {"type": "m", "n": 1}
    assert while_open == [b"only__group__g"]
    assert after == []


def test_a_listening_channel_gets_every_message_in_order_as_receive_would(tmp_path: Any) -> None:
    """new_listening_channel: the receive loop hands each message to the callback, the
    same dict a receive returns, in order, a pipelined burst (one socket read, taken
    from hiredis' buffer) as much as single ones, beside a channel that receives; after
    close_listening_channel nothing more is delivered."""
    redis = PrivateRedis(tmp_path)
    redis.start()
    try:

        async def exchange() -> tuple[list[Any], list[Any], list[Any]]:
            layer = RedisPubSubChannelLayer(hosts=[redis.url], prefix="listen")
            heard: list[Any] = []
            listening = await layer.new_listening_channel("sectr.sse.", heard.append)
            receiving = await layer.new_group_channel("sectr.sse.")
            for channel in (listening, receiving):
                await layer.group_add("g", channel)
            await layer.group_send_many([("g", {"type": "m", "n": n, "blob": b"\x00\xff"}) for n in range(50)])
            await layer.group_send("g", {"type": "m", "n": "plain"})
            received = [await asyncio.wait_for(layer.receive(receiving), 5) for _ in range(51)]
            for _ in range(100):
                if len(heard) == 51:
                    break
                await asyncio.sleep(0.02)
            layer.close_listening_channel(listening)
            await layer.group_discard("g", listening)
            await layer.group_send("g", {"type": "m", "n": "after"})
            late = [await asyncio.wait_for(layer.receive(receiving), 5)]
            await asyncio.sleep(0.1)
            await layer.flush()
            return heard, received, late

        heard, received, late = asyncio.run(exchange())
    finally:
        redis.stop()
    assert [m["n"] for m in heard] == [*range(50), "plain"]
    assert heard == received
    assert heard[0]["blob"] == b"\x00\xff"
    assert late == [{"type": "m", "n": "after"}]  # it went out, to the receiving channel only


def test_the_redis_layer_speaks_resp2_unless_told() -> None:
    """RESP2: pub/sub messages as plain replies (RESP3's push replies cost a debug log
    line each in redis-py); a host may still ask for RESP3."""
    assert RedisPubSubChannelLayer(hosts=["redis://127.0.0.1:1/0"])._kwargs["hosts"][0]["protocol"] == 2
    told = RedisPubSubChannelLayer(hosts=[{"address": "redis://127.0.0.1:1/0", "protocol": 3}])
    assert told._kwargs["hosts"][0]["protocol"] == 3
