"""Sectr's channel layers (sectr_web.channel_layer): the embedded default, Channels'
in-memory layer whose expiry sweep runs at most once a second instead of on every
message; and channels_redis' pub/sub layer with a batched group send and a cheaper
receive loop, against a real Redis, with the upstream code it leans on pinned."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
import unittest.mock
from typing import Any

import pytest
from channels.layers import InMemoryChannelLayer as ChannelsLayer
from django.conf import settings

from sectr.watchdog import Watchdog
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


def test_an_in_memory_listening_channel_gets_each_message_at_once_as_its_own_copy(caplog: Any) -> None:
    """The in-memory layer's new_listening_channel: group_send, group_send_many and send
    hand the callback its own copy as they send, in order, beside a channel that
    receives the same messages; a callback that raises costs only itself the message;
    after close_listening_channel nothing more is delivered, and flush forgets it."""

    async def exchange() -> dict[str, Any]:
        layer = InMemoryChannelLayer()
        heard: list[Any] = []
        listening = await layer.new_listening_channel("sectr.sse.", heard.append)
        failing = await layer.new_listening_channel("sectr.sse.", lambda _message: 1 / 0)
        receiving = await layer.new_channel("sectr.sse.")
        for channel in (listening, failing, receiving):
            await layer.group_add("g", channel)
        message = {"type": "m", "n": 0, "envelopes": [{"payload": {"text": "a"}}]}
        await layer.group_send("g", message)
        at_once = list(heard)  # before any other task ran
        await layer.group_send_many([("g", {"type": "m", "n": n}) for n in range(1, 30)])
        await layer.send(listening, {"type": "m", "n": "direct"})
        heard[0]["envelopes"][0]["payload"]["text"] = "changed"
        received = [await layer.receive(receiving) for _ in range(30)]
        layer.close_listening_channel(listening)
        await layer.group_send("g", {"type": "m", "n": "after"})
        late = await layer.receive(receiving)
        await layer.flush()
        return {"heard": heard, "at_once": at_once, "received": received, "late": late, "sent": message,
                "left": layer._listeners}  # fmt: skip

    got = asyncio.run(exchange())
    assert [m["n"] for m in got["at_once"]] == [0]
    assert [m["n"] for m in got["heard"]] == [*range(30), "direct"]  # nothing after the close
    assert [m["n"] for m in got["received"]] == list(range(30))
    assert got["received"][0]["envelopes"][0]["payload"]["text"] == "a"  # copies: not the listener's
    assert got["sent"]["envelopes"][0]["payload"]["text"] == "a"  # nor the sender's
    assert got["late"]["n"] == "after"
    assert got["left"] == {}
    assert caplog.text.count("a listening channel failed to take a message") == 31


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


def test_the_receive_loop_reads_replies_itself_and_redis_py_recovers_a_restart_under_it(
    tmp_path: Any, monkeypatch: Any
) -> None:
    """While subscribed, the receive loop reads the connection's replies itself: no
    redis-py get_message once it is up. Redis restarted under a subscribed loop, its read
    fails; redis-py's get_message then reconnects and subscribes again to what the
    connection had, and the loop reads itself again."""
    from redis.asyncio.client import PubSub

    calls: list[int] = []
    original = PubSub.get_message

    async def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return await original(self, *args, **kwargs)

    monkeypatch.setattr(PubSub, "get_message", counted)
    redis = PrivateRedis(tmp_path)
    redis.start()
    try:

        async def restart_under() -> tuple[list[Any], int, list[Any], int]:
            subscriber = RedisPubSubChannelLayer(hosts=[redis.url], prefix="direct")
            publisher = RedisPubSubChannelLayer(hosts=[redis.url], prefix="direct")
            heard: list[Any] = []
            channel = await subscriber.new_listening_channel("sectr.sse.", heard.append)
            await subscriber.group_add_many(["g"], channel)

            async def send_twenty() -> list[Any]:
                """Publish 20 messages and wait (up to 5 s) until all were heard."""
                for n in range(20):
                    await publisher.group_send_many([("g", {"type": "m", "n": n})])
                for _ in range(250):
                    if len(heard) == 20:
                        break
                    await asyncio.sleep(0.02)
                return list(heard)

            before = await send_twenty()
            slow_before = len(calls)
            heard.clear()
            redis.stop(signal.SIGKILL)
            redis.start()
            for _ in range(250):  # until the subscription is back: a publish reaches it
                await publisher.group_send_many([("g", {"type": "m", "n": "again"})])
                await asyncio.sleep(0.02)
                if heard:
                    break
            await asyncio.sleep(0.2)  # the last of them read
            slow_after = len(calls)
            heard.clear()
            after = await send_twenty()
            grew = len(calls) - slow_after
            await subscriber.flush()
            await publisher.flush()
            return before, slow_before, after, grew

        before, slow_before, after, grew = asyncio.run(restart_under())
    finally:
        redis.stop()
    assert [m["n"] for m in before] == list(range(20))
    assert slow_before == 0  # read by the loop itself
    assert [m["n"] for m in after] == list(range(20))
    assert grew == 0  # back to reading itself after redis-py's recovery


def test_a_batch_cut_short_leaves_no_reply_for_the_next_and_a_flush_closes_its_connection(tmp_path: Any) -> None:
    """group_send_many publishes on a connection the shard keeps: a batch cancelled while
    it was written or read (a publish timeout) must not leave its replies for the next
    batch to read as its own, and after a flush (which closes the layer's pool) the next
    batch publishes on a new connection."""
    redis = PrivateRedis(tmp_path)
    redis.start()
    try:

        async def exchange() -> tuple[list[Any], bool, bool, bool]:
            layer = RedisPubSubChannelLayer(hosts=[redis.url], prefix="cut")
            name = await layer.new_channel()
            await layer.group_add("g", name)
            await layer.group_send_many([("g", {"type": "m", "n": "first"})])
            shard = layer._get_layer()._shards[0]
            first = shard._publishing[1]
            big = [("g", {"type": "m", "n": n, "blob": b"x" * 20_000}) for n in range(200)]
            task = asyncio.ensure_future(layer.group_send_many(big))
            await asyncio.sleep(0.001)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await layer.group_send_many([("g", {"type": "m", "n": "next"})])
            await asyncio.sleep(0.2)  # any reply left unread has arrived by now
            in_step = not await first.can_read()
            got = []
            while not got or got[-1] != "next":
                got.append((await asyncio.wait_for(layer.receive(name), 5))["n"])
            await layer.flush()
            closed = not first.is_connected
            name = await layer.new_channel()
            await layer.group_add("g", name)
            await layer.group_send_many([("g", {"type": "m", "n": "after"})])
            got.append((await asyncio.wait_for(layer.receive(name), 5))["n"])
            shard = layer._get_layer()._shards[0]
            renewed = shard._publishing[1] is not first and shard._publishing[0] is shard._redis.connection_pool
            await layer.flush()
            return got, in_step, closed, renewed

        got, in_step, closed, renewed = asyncio.run(exchange())
    finally:
        redis.stop()
    assert got[0] == "first" and got[-2:] == ["next", "after"]
    assert got[1:-2] == list(range(len(got) - 3))  # what the cut batch delivered: a prefix, in order
    assert in_step
    assert closed and renewed


def test_a_hung_redis_fails_a_batch_within_its_socket_timeout_and_the_publisher_within_its_own() -> None:
    """A Redis that takes the batch and never answers (a stuck server, a dead network
    path): each write and read of the batch gives up after the host's socket_timeout
    (the shard's watchdog), disconnecting its connection so no reply is left for the
    next batch, and the publisher gives the whole batch up after PUBLISH_TIMEOUT (its
    own watchdog) and sends it message by message."""
    from sessions_app.journal import publish

    async def exchange() -> tuple[float, bool, float, bool]:
        async def answer_until_publish(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while data := await reader.read(65536):
                if b"PUBLISH" in data:
                    await asyncio.Event().wait()  # hung: the batch is read and never answered
                commands = data.count(b"\r\n*") + data.startswith(b"*")
                writer.write(b"+OK\r\n" * commands)  # the connection's handshake
                await writer.drain()

        server = await asyncio.start_server(answer_until_publish, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        layer = RedisPubSubChannelLayer(
            hosts=[{"address": f"redis://127.0.0.1:{port}", "socket_timeout": 0.2, "retry": None}], prefix="hung"
        )
        shard = layer._get_layer()._shards[0]
        shard._ensure_redis()
        connection = await shard._redis.connection_pool.get_connection()
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            await channel_layer._send_and_read(
                connection, [b"*1\r\n$7\r\nPUBLISH\r\n"], 1, shard._watchdog or Watchdog()
            )
        shard_took = time.monotonic() - started
        cut = not connection.is_connected

        publisher = publish._OrderedPublisher()
        started = time.monotonic()
        with unittest.mock.patch.object(publish, "PUBLISH_TIMEOUT", 0.5):
            slow = RedisPubSubChannelLayer(
                hosts=[{"address": f"redis://127.0.0.1:{port}", "socket_timeout": 30}], prefix="hung"
            )
            sent = await publisher._send_together(slow, [(0.0, "g", {"type": "m"})])
        publisher_took = time.monotonic() - started
        server.close()
        return shard_took, cut, publisher_took, sent

    shard_took, cut, publisher_took, sent = asyncio.run(exchange())
    assert 0.19 <= shard_took < 1.0
    assert cut
    assert 0.49 <= publisher_took < 1.5
    assert not sent


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


def test_group_add_many_and_discard_many_take_one_command_each(tmp_path: Any) -> None:
    """group_add_many subscribes to every group new to the process in one SUBSCRIBE (a
    group another channel holds already needs none); group_discard_many unsubscribes,
    in one UNSUBSCRIBE, only the groups the channel was the process's last member of:
    the others still deliver to their members."""
    import redis as redis_client

    redis = PrivateRedis(tmp_path)
    redis.start()
    try:

        async def exchange() -> tuple[list[Any], list[Any], dict[str, int], list[bytes]]:
            layer = RedisPubSubChannelLayer(hosts=[redis.url], prefix="many")
            heard_a: list[Any] = []
            heard_b: list[Any] = []
            a = await layer.new_listening_channel("sectr.sse.", heard_a.append)
            b = await layer.new_listening_channel("sectr.sse.", heard_b.append)
            with redis_client.Redis.from_url(redis.url) as plain:

                def calls() -> dict[str, int]:
                    stats = plain.info("commandstats")
                    names = ("subscribe", "unsubscribe")
                    return {name: stats.get(f"cmdstat_{name}", {}).get("calls", 0) for name in names}

                await layer.group_add("shared", b)
                before = calls()
                await layer.group_add_many(["own", "shared", "own"], a)
                await layer.group_send_many([("own", {"type": "m", "n": 1}), ("shared", {"type": "m", "n": 2})])
                for _ in range(100):
                    if len(heard_a) == 2 and len(heard_b) == 1:
                        break
                    await asyncio.sleep(0.02)
                await layer.group_discard_many(["own", "shared", "never"], a)
                await layer.group_send_many([("own", {"type": "m", "n": 3}), ("shared", {"type": "m", "n": 4})])
                for _ in range(100):
                    if len(heard_b) == 2:
                        break
                    await asyncio.sleep(0.02)
                await asyncio.sleep(0.1)  # a message to `own` would have come by now
                after = calls()
                counts = {name: after[name] - before[name] for name in after}
                channels = sorted(plain.pubsub_channels())
            layer.close_listening_channel(a)
            layer.close_listening_channel(b)
            await layer.flush()
            return heard_a, heard_b, counts, channels

        heard_a, heard_b, counts, channels = asyncio.run(exchange())
    finally:
        redis.stop()
    assert [m["n"] for m in heard_a] == [1, 2]
    assert [m["n"] for m in heard_b] == [2, 4]  # still a member after a's discard
    assert counts == {"subscribe": 1, "unsubscribe": 1}
    assert channels == [b"many__group__shared"]


def test_streams_leaving_together_share_one_unsubscribe(tmp_path: Any) -> None:
    """Channels leaving their groups in the same pass of the loop send one UNSUBSCRIBE
    between them; a group joined again before it goes stays subscribed and delivers."""
    import redis as redis_client

    redis = PrivateRedis(tmp_path)
    redis.start()
    try:

        async def exchange() -> tuple[list[Any], dict[str, int], list[bytes]]:
            layer = RedisPubSubChannelLayer(hosts=[redis.url], prefix="together")
            heard_c: list[Any] = []
            a = await layer.new_listening_channel("sectr.sse.", lambda _m: None)
            b = await layer.new_listening_channel("sectr.sse.", lambda _m: None)
            c = await layer.new_listening_channel("sectr.sse.", heard_c.append)
            await layer.group_add_many(["one"], a)
            await layer.group_add_many(["two", "again"], b)
            with redis_client.Redis.from_url(redis.url) as plain:

                def unsubscribes() -> int:
                    return int(plain.info("commandstats").get("cmdstat_unsubscribe", {}).get("calls", 0))

                before = unsubscribes()

                async def rejoin() -> None:
                    await asyncio.sleep(0)  # after b left "again", before the command goes
                    await layer.group_add_many(["again"], c)

                await asyncio.gather(
                    layer.group_discard_many(["one"], a), layer.group_discard_many(["two", "again"], b), rejoin()
                )
                # Counted once Redis confirmed it (the receive loop read the replies): the
                # command is sent without waiting for them, and INFO on another connection
                # could be answered first.
                pubsub = layer._get_layer()._shards[0]._pubsub
                for _ in range(200):
                    if not pubsub.pending_unsubscribe_channels:
                        break
                    await asyncio.sleep(0.01)
                count = unsubscribes() - before
                await layer.group_send_many([("again", {"type": "m", "n": 1})])
                for _ in range(100):
                    if heard_c:
                        break
                    await asyncio.sleep(0.02)
                channels = sorted(plain.pubsub_channels())
            for channel in (a, b, c):
                layer.close_listening_channel(channel)
            await layer.flush()
            return heard_c, {"unsubscribe": count}, channels

        heard_c, counts, channels = asyncio.run(exchange())
    finally:
        redis.stop()
    assert counts == {"unsubscribe": 1}
    assert channels == [b"together__group__again"]
    assert [m["n"] for m in heard_c] == [1]


def test_with_nothing_subscribed_the_receive_loop_waits_for_a_subscription(tmp_path: Any) -> None:
    """A process whose last stream left its groups (an idle Daphne) makes no wake-ups for
    its receive loop until it subscribes again (channels_redis looked ten times a
    second), and a subscription after that delivers at once."""
    redis = PrivateRedis(tmp_path)
    redis.start()
    try:

        async def exchange() -> tuple[int, list[Any], float]:
            layer = RedisPubSubChannelLayer(hosts=[redis.url], prefix="idle")
            heard: list[Any] = []
            channel = await layer.new_listening_channel("sectr.sse.", heard.append)
            await layer.group_add_many(["g"], channel)
            await layer.group_discard_many(["g"], channel)
            shard = layer._get_layer()._shards[0]
            pubsub = shard._pubsub
            for _ in range(100):  # the UNSUBSCRIBE's reply read: nothing subscribed
                if not pubsub.subscribed:
                    break
                await asyncio.sleep(0.02)
            looks = 0
            plain = type(pubsub)

            class Counted(plain):  # type: ignore[misc, valid-type]
                @property
                def subscribed(self) -> bool:
                    nonlocal looks
                    looks += 1
                    return bool(plain.subscribed.fget(self))  # type: ignore[attr-defined]

            pubsub.__class__ = Counted
            await asyncio.sleep(0.2)  # the loop settles into its wait
            looks = 0
            await asyncio.sleep(0.6)
            idle_looks = looks
            await layer.group_add_many(["g"], channel)
            sent = time.monotonic()
            await layer.group_send_many([("g", {"type": "m", "n": 1})])
            for _ in range(250):
                if heard:
                    break
                await asyncio.sleep(0.004)
            delay = time.monotonic() - sent
            pubsub.__class__ = plain
            layer.close_listening_channel(channel)
            await layer.flush()
            return idle_looks, heard, delay

        idle_looks, heard, delay = asyncio.run(exchange())
    finally:
        redis.stop()
    assert idle_looks == 0
    assert [m["n"] for m in heard] == [1]
    assert delay < 0.5


def test_the_redis_layer_speaks_resp2_unless_told() -> None:
    """RESP2: pub/sub messages as plain replies (RESP3's push replies cost a debug log
    line each in redis-py); a host may still ask for RESP3."""
    assert RedisPubSubChannelLayer(hosts=["redis://127.0.0.1:1/0"])._kwargs["hosts"][0]["protocol"] == 2
    told = RedisPubSubChannelLayer(hosts=[{"address": "redis://127.0.0.1:1/0", "protocol": 3}])
    assert told._kwargs["hosts"][0]["protocol"] == 3


# What RedisPubSubChannelLayer (sectr_web/channel_layer.py) copies, overrides or reaches
# into, by the source it was written against (channels-redis 4.3.0 and redis 8.1.0,
# pinned in requirements.txt). These are private parts: an upgrade may change them
# without a word, so one that does fails here, and the one upgrading compares the new
# code with the layer (what each entry says) before renewing its hash.
LEANED_ON = {
    "channels_redis.pubsub._async_proxy": (
        "59c3bda263235b5facf7033e7ac725d0d5e9726397a6ae88d4dfba814232b7c8",
        "the layer's proxied calls (send, receive, group_add...) still go through _get_layer, so they reach _LoopLayer",
    ),
    "channels_redis.pubsub.RedisPubSubChannelLayer.__init__": (
        "b0e717765373b2f6c8012a0f9cf63b39f6ff28ace624cae0875a63fd99404e29",
        "_get_layer still finds the layer's arguments in _args and _kwargs, its loops' layers in _layers, "
        "and __init__'s hosts (retry, protocol) still reach the connections",
    ),
    "channels_redis.pubsub.RedisPubSubChannelLayer._get_layer": (
        "1862b87a25ac72b2512da2fa30e56f87ca4b37f6874f1385d2ceb5e8b442079c",
        "RedisPubSubChannelLayer._get_layer is a copy of it making a _LoopLayer: bring over what changed",
    ),
    "channels_redis.pubsub.RedisPubSubLoopLayer.__init__": (
        "fd9d37e275298a5823df02a3cd2157aaa237b803059aa55f3ccce2053c1ecf7f",
        "_LoopLayer.__init__ replaces its _shards with _ReceivingShard connections made the same way",
    ),
    "channels_redis.pubsub.RedisPubSubLoopLayer.new_channel": (
        "bf1469b4d6819726c3c3ba641de8f49d141e61063b96fe18ea3fd5426895523d",
        "new_group_channel and new_listening_channel name a channel as it does and keep it in `channels`",
    ),
    "channels_redis.pubsub.RedisPubSubLoopLayer.receive": (
        "2d3fa7938ba6e0a67de22b47d7af2b6e492bbbdacce4725868239d854b845de4",
        "a group channel (no subscription of its own) is still received from and cancelled as any channel",
    ),
    "channels_redis.pubsub.RedisPubSubLoopLayer.group_add": (
        "09e5aeb8954a88f27cc5145d070c227484ef200bb416bdfd67941131954af50f",
        "a channel in `channels` (a group or listening channel) can still join groups",
    ),
    "channels_redis.pubsub.RedisPubSubLoopLayer.group_discard": (
        "420c784f63b0fa9d6a79748def166e32f26cc6565ebc578573b23526c29030df",
        "group_add_many and group_discard_many keep `groups` as group_add and group_discard do",
    ),
    "channels_redis.pubsub.RedisPubSubLoopLayer.group_send": (
        "5d5f908ce40f335b7c401ff9cd35a2baf020e835f32a6d39964eecdb54f8f699",
        "group_send_many publishes what it would: the same group channel name, shard and serialisation",
    ),
    "channels_redis.pubsub.RedisSingleShardConnection.__init__": (
        "9c8f408acb4c2d7be515e280121eecbc51322b451f0a0c0992871518436bf3e7",
        "_ReceivingShard and group_send_many use its _lock, _redis and _pubsub",
    ),
    "channels_redis.pubsub.RedisSingleShardConnection.publish": (
        "5a18093dbcb440f569f9c0315b94f34bc473319f653b54953c43128c69148d76",
        "group_send_many takes the shard's lock and publish_many its connection's pool as it does",
    ),
    "channels_redis.pubsub.RedisSingleShardConnection.subscribe": (
        "173a8f40b17e4e28a716afd0e3489b5059772957749b3b6ded5b3e6801fc13e0",
        "_ReceivingShard.subscribe_many does what it does for several channels in one SUBSCRIBE, and "
        "_ReceivingShard.subscribe wakes the receive loop after it",
    ),
    "channels_redis.pubsub.RedisSingleShardConnection.unsubscribe": (
        "e2b9f0f1ff880674267d34fe08891a039472e0eadf02a6bfcd94ed635ebb7d9f",
        "_ReceivingShard.unsubscribe_many does what it does for several channels in one UNSUBSCRIBE",
    ),
    "channels_redis.pubsub.RedisSingleShardConnection._do_receiving": (
        "a822736dcb875e43bfe3b5461dfe0028401fb768fa5c9708cd1cde61bed321a7",
        "_ReceivingShard._do_receiving is a copy of it without the timeout, reading hiredis' replies itself: "
        "bring over what changed",
    ),
    "channels_redis.pubsub.RedisSingleShardConnection._receive_message": (
        "2f5f46af28e8ed76a78c8dabe8831ee21e2b061f32d15e90e5a0ddd94c63c54f",
        "_read_directly hands it {'channel', 'data'} dicts, and a _Listener takes its put_nowait",
    ),
    "channels_redis.pubsub.RedisSingleShardConnection._ensure_redis": (
        "ba228d3cee7116dcb07e59698f384ca9c24a1a4d3b9b542ad84a15168e3816b2",
        "group_send_many calls it before using _redis",
    ),
    "channels_redis.utils._wrap_close": (
        "3d610af1683772a9e4f1d174405d44693bfe6e9a3e2902d776d4aef8c787761b",
        "RedisPubSubChannelLayer._get_layer calls it as channels_redis' own _get_layer does",
    ),
    "channels_redis.utils.decode_hosts": (
        "012afe3ce1b8e8a5289f81830e47b14e22ebe09000b3ea886edf8ea1bc9c64d9",
        "RedisPubSubChannelLayer.__init__ adds retry and protocol to the dicts it returns",
    ),
    "channels_redis.utils.create_pool": (
        "c706feb32b8340783a3fd3005a9f429aa9eb459554ad819f9f63e4025e469e8c",
        "a host's retry and protocol still reach redis-py's connection pool",
    ),
    "redis.asyncio.client.PubSub.get_message": (
        "bf92023c2c452e857f682063e81a065eeeaa50382357402532d3c7d0de45a9d9",
        "_do_receiving's get_message(timeout=None) still blocks on the next reply, reconnecting as before "
        "(what _read_directly falls back on)",
    ),
    "redis.asyncio.client.PubSub.parse_response": (
        "9dc6547c1d1ed3e76ad16f04571442cc3b427000a8e3aa5eb6deea91ef5bd509",
        "_read_directly skips it (health check, reconnection) while the connection is up, and leaves "
        "health checks to it",
    ),
    "redis.asyncio.client.PubSub.handle_message": (
        "310d88dea8e59a04889511f5f379dec647721910ce690ce8809b0a3124c56614",
        "_read_directly skips it for a published message: nothing it does then may matter to us",
    ),
    "redis.asyncio.connection.AbstractConnection.send_packed_command": (
        "baaeabd916209157db40455f034a0bac6fb3e2db902271313e0702bcbc678321",
        "_send_and_read writes to the connection's _writer as it does (connect first, disconnect on a cut)",
    ),
    "redis.asyncio.connection.AbstractConnection.read_response": (
        "c1b374bc1a30d0b4f987af86e3ce475a1a1288382dc140b39f436d25beebe5d4",
        "_send_and_read reads each reply from the connection's _parser as it does (error replies returned, "
        "a cut read disconnects)",
    ),
    "redis._parsers.hiredis._AsyncHiredisParser.on_connect": (
        "5c7b848496314124f40e3684eca6edab6a0435a46cae9e62980eb497516db013",
        "_read_directly reads its _reader, made with notEnoughData=NOT_ENOUGH_DATA, anew on each connect",
    ),
    "redis._parsers.hiredis._AsyncHiredisParser.on_disconnect": (
        "18d19682b3830e3dbb627aaea2005ac540b9158f6bba05b9f59063dbfea2504d",
        "_read_directly stops reading once _connected is False, as its read_response refuses to read then",
    ),
    "redis._parsers.hiredis._AsyncHiredisParser.read_from_socket": (
        "6cad7e2b45b7ba1dd08db3a092435d647fe664bba18a0972d96983f25629f27d",
        "_read_directly feeds the _reader with it, a closed connection raising ConnectionError",
    ),
    "redis._parsers.hiredis._AsyncHiredisParser.read_response": (
        "6cba18b62d2aad4dfe9e4be4e3bbb834ba4728640cbba421587e31bc096b2315",
        "_read_directly takes replies from its _reader as it does (errors, push replies)",
    ),
}


@pytest.mark.parametrize("name", sorted(LEANED_ON))
def test_the_channels_redis_code_the_redis_layer_leans_on_is_what_it_was_written_against(name: str) -> None:
    import hashlib
    import inspect
    import pkgutil

    digest, what = LEANED_ON[name]
    source = inspect.getsource(pkgutil.resolve_name(name))
    assert hashlib.sha256(source.encode()).hexdigest() == digest, (
        f"{name} changed; re-check sectr_web/channel_layer.py: {what}. Then renew its hash here"
    )


def test_publishes_are_packed_as_redis_py_packs_them() -> None:
    """The layer's own packing of PUBLISH commands is byte for byte redis-py's."""
    from redis.asyncio.connection import Connection

    pairs = [("sectr.session.ses_1", b"\x00\xff\r\n$3\r\n"), ("caf\u00e9", b""), ("g" * 99, b"x" * 100_000)]
    expected = b"".join(Connection().pack_commands([("PUBLISH", channel, data) for channel, data in pairs]))
    assert channel_layer._pack_publishes(pairs) == expected
