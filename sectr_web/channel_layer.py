"""Sectr's channel layers: Channels' in-memory layer made cheaper per message (the
embedded default), and channels_redis' pub/sub layer with a batched group send
(production; `RedisPubSubChannelLayer` below).

Channels' InMemoryChannelLayer walks every channel and every group membership to expire
old messages on *each* send and receive. With a socket per channel that is O(sockets)
work per message, and a message per streamed chunk per socket: at 100 streams it was a
fifth of the embedded server's CPU (py-spy under bench/live.py). Here the sweep runs at
most once every SWEEP_SECONDS; a message past its expiry (60 s by default) may wait up
to that much longer before it is dropped, which nothing relies on.

Its group_send also made an asyncio task per member and waited for them with
as_completed, and its send deep-copied each message with copy.deepcopy: with a group per
session and a message per appended batch, those were another tenth of the embedded
server's CPU at 100 streams (py-spy). Here a group_send sends to each member in turn
(a send never waits: a full channel is skipped, as Channels does) and then yields to
the loop once, and a message is copied container by container (`copy_message`), still
one private copy per receiver.

A stream may also take its messages as they are sent (`new_listening_channel`, as the
Redis layer's): group_send hands a listening member its copy at once, where a queued
one cost, per message per stream, a reader task's switch, a queue made again for each
receive (Channels drops a channel's queue once it is empty) and its future: 22 -> 10 us
of CPU per chunk for publish plus delivery (bench/chunk_hops.py --hops layer, 100 streams).
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any, cast

from channels.exceptions import ChannelFull
from channels.layers import InMemoryChannelLayer as ChannelsInMemoryChannelLayer
from channels_redis.pubsub import RedisPubSubChannelLayer as ChannelsRedisPubSubChannelLayer
from channels_redis.pubsub import RedisPubSubLoopLayer, RedisSingleShardConnection
from channels_redis.utils import _wrap_close, decode_hosts
from redis._parsers.hiredis import NOT_ENOUGH_DATA, _AsyncHiredisParser
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from sectr.watchdog import Watchdog

SWEEP_SECONDS = 1.0
#: How the Redis layer's connections retry a command that met a dead connection (a
#: restarted Redis): reconnect and send it again, up to 3 times, at most 0.1, 0.2 and
#: 0.4 s apart (redis-py's jittered backoff). One retry is what a dead socket needs;
#: while Redis stays away a command fails within about 0.7 s (0.5 s measured at most),
#: so a stream opened then, or /readyz, is not held for long.
REDIS_RETRY = Retry(ExponentialWithJitterBackoff(cap=0.5, base=0.05), retries=3)
#: The Redis protocol of the layer's connections unless a host says otherwise: RESP2,
#: channels_redis' own. redis-py 8 speaks RESP3 by default, where each pub/sub message
#: is a push reply that redis-py formats into a debug log line (str() of the whole
#: message, logged or not) before handing it over.
RESP_VERSION = 2
_IMMUTABLE = (str, bytes, int, float, bool, type(None))

log = logging.getLogger("sectr.channel_layer")


def copy_message(value: Any) -> Any:
    """A deep copy of a channel message: dicts, lists and tuples rebuilt, immutable
    leaves shared, anything else through copy.deepcopy."""
    if isinstance(value, dict):
        return {key: copy_message(item) for key, item in value.items()}
    if isinstance(value, list):
        return [copy_message(item) for item in value]
    if isinstance(value, tuple):
        return tuple(copy_message(item) for item in value)
    if isinstance(value, _IMMUTABLE):
        return value
    return copy.deepcopy(value)


class InMemoryChannelLayer(ChannelsInMemoryChannelLayer):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._swept_at = float("-inf")
        #: listening channel -> its callback (`new_listening_channel`)
        self._listeners: dict[str, Callable[[dict[str, Any]], None]] = {}

    async def new_listening_channel(self, prefix: str, deliver: Callable[[dict[str, Any]], None]) -> str:
        """A channel whose messages are handed to `deliver(message)` (its own copy) the
        moment they are sent, instead of queued for a `receive`: the Redis layer's
        `new_listening_channel`, in-process. `deliver` must not block; an error it raises
        is logged and the message is lost to it alone (a reader of the journal sees the
        gap). Leave the groups and `close_listening_channel` it when done; never
        `receive` from it."""
        channel = await self.new_channel(prefix)
        self._listeners[channel] = deliver
        return channel

    def close_listening_channel(self, channel: str) -> None:
        """Nothing more is delivered to `channel`."""
        self._listeners.pop(channel, None)

    def _deliver(self, deliver: Callable[[dict[str, Any]], None], message: dict[str, Any]) -> None:
        try:
            deliver(copy_message(message))
        except Exception:
            # One listener's failure is no reason to stop sending to everyone else.
            log.exception("a listening channel failed to take a message")

    async def flush(self) -> None:
        await super().flush()
        self._listeners = {}

    def _clean_expired(self) -> None:
        now = time.monotonic()
        if now - self._swept_at < SWEEP_SECONDS:
            return
        self._swept_at = now
        super()._clean_expired()

    def _queue(self, channel: str) -> asyncio.Queue[Any]:
        """The channel's queue, made on first use (Channels' setdefault built a new,
        unused Queue on every send and receive: 4% of the embedded server's CPU at 100
        streams, py-spy)."""
        queue = self.channels.get(channel)
        if queue is None:
            queue = self.channels[channel] = asyncio.Queue(maxsize=self.get_capacity(channel))
        return queue

    def _put(self, channel: str, message: dict[str, Any]) -> None:
        try:
            self._queue(channel).put_nowait((time.time() + self.expiry, copy_message(message)))
        except asyncio.QueueFull:
            raise ChannelFull(channel) from None

    async def send(self, channel: str, message: dict[str, Any]) -> None:
        """Channels' send, copying the message with copy_message."""
        assert isinstance(message, dict), "message is not a dict"  # noqa: S101 - Channels' own check
        self.require_valid_channel_name(channel)
        assert "__asgi_channel__" not in message  # noqa: S101 - Channels' own check
        deliver = self._listeners.get(channel)
        if deliver is not None:
            self._deliver(deliver, message)
            return
        self._put(channel, message)

    async def receive(self, channel: str) -> dict[str, Any]:
        """Channels' receive, without a new Queue per call (see `_queue`)."""
        self.require_valid_channel_name(channel)
        self._clean_expired()
        queue = self._queue(channel)
        try:
            _expires, message = await queue.get()
        finally:
            if queue.empty():
                self.channels.pop(channel, None)
        return cast(dict[str, Any], message)

    async def group_send(self, group: str, message: dict[str, Any]) -> None:
        """Channels' group_send, sending to each member in turn."""
        await self.group_send_many([(group, message)])

    async def group_send_many(self, messages: list[tuple[str, dict[str, Any]]]) -> None:
        """group_send each (group, message), in order, with one pass over the loop at the
        end (the publisher's batch: a message per session per group commit), instead of a
        task, a timeout and a yield per message. A member's queue past half full first
        lets the receivers run, as a yield per message did: a burst that never yielded
        filled the receivers' queues (capacity 100) and dropped the rest."""
        self._clean_expired()
        listeners = self._listeners
        for group, message in messages:
            assert isinstance(message, dict), "Message is not a dict"  # noqa: S101 - Channels' own check
            self.require_valid_group_name(group)
            for channel in list(self.groups.get(group, ())):
                deliver = listeners.get(channel)
                if deliver is not None:
                    self._deliver(deliver, message)
                    continue
                queue = self.channels.get(channel)
                if queue is not None and queue.qsize() * 2 >= queue.maxsize > 0:
                    await asyncio.sleep(0)
                try:
                    self._put(channel, message)
                except ChannelFull:
                    pass  # as Channels does: a full channel misses the message
        # Let the receivers run, as Channels' tasks did.
        await asyncio.sleep(0)


class _Listener:
    """What a listening channel holds where channels_redis keeps a channel's queue
    (`RedisPubSubLoopLayer.channels`): the receive loop's `put_nowait(data)` hands each
    message, decoded, to the channel's callback at once."""

    __slots__ = ("deliver", "deserialize")

    def __init__(self, deliver: Callable[[dict[str, Any]], None], deserialize: Callable[[bytes], Any]) -> None:
        self.deliver = deliver
        self.deserialize = deserialize

    def put_nowait(self, data: bytes) -> None:
        try:
            self.deliver(self.deserialize(data))
        except Exception:
            # One listener's failure is no reason to stop reading everyone's messages.
            log.exception("a listening channel failed to take a message")


class _ReceivingShard(RedisSingleShardConnection):
    """channels_redis' connection to one Redis, with a cheaper receive loop.

    channels_redis reads each pub/sub message through redis-py's whole stack (the
    retry wrapper, a 0.1 s timeout armed and disarmed, the message turned into a dict,
    observability hooks): about a fifth of a Daphne's CPU while streaming (py-spy under
    bench/peers.py). Here the loop reads the connection's socket itself and takes each
    reply straight from hiredis' buffer (`_read_directly`), with no timeout, as
    get_message(timeout=None) would: a worker publishes a group commit's messages in
    one write, so they arrive together. A reply that is not a published message (a
    subscription's confirmation) still goes through redis-py, which keeps its own
    account of subscriptions with them. Whenever the direct read cannot go on (the
    connection broke or was never made, health checks are on, no hiredis), one
    redis-py get_message(timeout=None) reads instead: its reconnection and
    resubscription are what recovers the connection, as before.

    It also publishes batches (`publish_many`) on a connection of its own.
    """

    _publishing: Any = None  # (the pool it came from, the connection): see publish_many
    _watchdog: Watchdog | None = None  # the publications' socket_timeout (_send_and_read)

    async def publish_many(self, pairs: list[tuple[str, bytes]]) -> None:
        """PUBLISH each (channel, data), in order, in one write and one read of the replies;
        the caller holds the shard's lock.

        A redis-py pipeline did the same with a connection checked out of the pool and
        back (its health probe and lock), a retry wrapper and observability hooks around
        each batch: most of its cost (py-spy under bench/peers.py). Here one connection
        stays checked out for the shard's publications (the pool still owns it: closing
        the layer closes it), and redis-py's retry (REDIS_RETRY: reconnect, send again)
        is entered only when a batch met a broken connection, as a Redis restart leaves
        it. A batch sent again may deliver some messages twice, as the pipeline's retry
        did (readers drop a seq they have). A read or write cut short (an error, a
        cancel) disconnects the connection (redis-py does), so no reply is left unread.
        """
        self._ensure_redis()
        pool = self._redis.connection_pool
        if self._publishing is None or self._publishing[0] is not pool:
            self._publishing = (pool, await pool.get_connection())
        connection = self._publishing[1]
        watchdog = self._watchdog
        if watchdog is None:
            watchdog = self._watchdog = Watchdog()
        packed = [_pack_publishes(pairs)]
        try:
            await _send_and_read(connection, packed, len(pairs), watchdog)
        except (RedisConnectionError, RedisTimeoutError, OSError):
            await connection.disconnect()
            await connection.retry.call_with_retry(
                lambda: _send_and_read(connection, packed, len(pairs), watchdog),
                lambda _error: connection.disconnect(),
            )

    async def _do_receiving(self) -> None:
        while True:
            try:
                pubsub = self._pubsub
                if pubsub is not None and pubsub.subscribed:
                    await self._read_directly(pubsub)
                    if pubsub.subscribed:
                        # A SUBSCRIBE that met the same dead connection reconnects it under
                        # the shard's lock, and reading its handshake's reply beside this
                        # loop's own reconnection is two readers of one socket (asyncio
                        # refuses the second): this one waits for it, and reconnects
                        # (resubscribing) under the lock itself.
                        async with self._lock:
                            connection = pubsub.connection
                            if connection is not None and not connection.is_connected:
                                await pubsub.connect()
                        # redis-py's read: it reconnects and resubscribes a broken connection.
                        message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=None)
                        self._receive_message(message)
                else:
                    # Nothing subscribed (a Daphne between streams): wait for the next
                    # subscription. channels_redis looked again every 0.1 s, ten wake-ups
                    # a second all day: 1.8 ms of CPU a second of an idle Daphne that
                    # had once streamed (bench/idle.py), most of its idle cost.
                    subscribed = self._subscribed_event()
                    subscribed.clear()
                    await subscribed.wait()
            except (TimeoutError, asyncio.CancelledError, GeneratorExit):
                raise
            except BaseException:
                log.exception("Unexpected exception in receive task")
                await asyncio.sleep(1)

    _subscribed: asyncio.Event | None = None  # see _subscribed_event

    def _subscribed_event(self) -> asyncio.Event:
        """Set once a SUBSCRIBE of this shard was answered (or failed): the receive loop,
        with nothing subscribed, waits for it. Set after the command, when redis-py's
        `subscribed` says so: a loop woken before would find nothing and wait again."""
        if self._subscribed is None:
            self._subscribed = asyncio.Event()
        return self._subscribed

    async def subscribe(self, channel: str) -> None:
        try:
            await super().subscribe(channel)
        finally:
            self._subscribed_event().set()

    async def subscribe_many(self, channels: list[str]) -> None:
        """`subscribe` each of `channels` not subscribed yet, in one SUBSCRIBE command."""
        try:
            async with self._lock:
                new = [channel for channel in dict.fromkeys(channels) if channel not in self._subscribed_to]
                if new:
                    self._ensure_redis()
                    self._ensure_receiver()
                    await self._pubsub.subscribe(*new)
                    self._subscribed_to.update(new)
        finally:
            self._subscribed_event().set()

    async def unsubscribe_many(self, channels: list[str]) -> None:
        """`unsubscribe` each of `channels` still subscribed and still without a member in
        this process, in one UNSUBSCRIBE command shared with every other call made in the
        same pass of the event loop.

        Streams that end together (a burst of runs finishing on the same tick, each
        stream leaving its session's group) each sent an UNSUBSCRIBE through redis-py,
        waiting in turn for the shard's lock: 3.4% of a Daphne's CPU under
        bench/admission.py (py-spy), for 100 commands that one could carry. A name is
        left subscribed if a channel joined its group again before the command went (the
        SUBSCRIBE it skipped, finding the name still subscribed, is not undone)."""
        pending = self._unsubscribing
        if pending is None:
            pending = self._unsubscribing = {}
        pending.update(dict.fromkeys(channels))
        task = self._unsubscriber
        if task is None or task.done():
            task = self._unsubscriber = asyncio.ensure_future(self._unsubscribe_pending())
        await asyncio.shield(task)

    _unsubscribing: dict[str, None] | None = None  # names for the next UNSUBSCRIBE
    _unsubscriber: asyncio.Future[None] | None = None  # the task that will send it

    async def _unsubscribe_pending(self) -> None:
        await asyncio.sleep(0)  # the other streams ending in this pass join the command
        async with self._lock:
            # Calls from now on start the next command.
            names, self._unsubscribing, self._unsubscriber = self._unsubscribing or {}, None, None
            groups = self.channel_layer.groups
            gone = [name for name in names if name in self._subscribed_to and not groups.get(name)]
            if gone:
                self._ensure_redis()
                self._ensure_receiver()
                await self._pubsub.unsubscribe(*gone)
                self._subscribed_to.difference_update(gone)

    async def _read_directly(self, pubsub: Any) -> None:
        """Read the pub/sub connection's replies, in order, straight from its hiredis
        parser, while the process is subscribed; return when the connection is down, a
        read failed (redis-py's read then meets the same and reconnects) or cannot be
        done this way (no hiredis, or health checks, which redis-py's read sends)."""
        connection = pubsub.connection
        parser = getattr(connection, "_parser", None)
        if connection is None or not isinstance(parser, _AsyncHiredisParser) or connection.health_check_interval:
            return
        while pubsub.subscribed and pubsub.connection is connection and connection.is_connected and parser._connected:
            response = cast(Any, parser._reader).gets()  # a new _reader on each connect
            if response is NOT_ENOUGH_DATA:
                try:
                    await parser.read_from_socket()
                except (RedisConnectionError, OSError):
                    await connection.disconnect()  # as redis-py's read: reconnect, resubscribe
                    return
                continue
            if type(response) is list and len(response) == 3 and response[0] == b"message":
                self._receive_message({"channel": response[1], "data": response[2]})
            elif isinstance(response, RedisConnectionError) or (
                isinstance(response, list) and response and isinstance(response[0], RedisConnectionError)
            ):
                await connection.disconnect()  # as redis-py's read: reconnect, resubscribe
                return
            elif isinstance(response, ResponseError):
                raise response
            else:
                self._receive_message(await pubsub.handle_message(response, ignore_subscribe_messages=True))


def _pack_publishes(pairs: list[tuple[str, bytes]]) -> bytes:
    """PUBLISH channel data, for each pair, in the Redis protocol (what redis-py's
    pack_command makes of them, without its per-argument type checks and encoding)."""
    parts = []
    for channel, data in pairs:
        name = channel.encode()
        parts.append(b"*3\r\n$7\r\nPUBLISH\r\n$%d\r\n%b\r\n$%d\r\n%b\r\n" % (len(name), name, len(data), data))
    return b"".join(parts)


async def _send_and_read(connection: Any, packed: list[bytes], replies: int, watchdog: Watchdog) -> None:
    """Send packed commands on a redis-py connection and read their `replies` replies (all
    of them, even after an error reply, which is raised then), within one socket_timeout
    (kept by `watchdog`, the shard's: asyncio.timeout's timer per batch was a few percent
    of a worker's CPU; with no socket_timeout, the default, nothing is armed at all).

    redis-py's own `send_packed_command` and `read_response` arm a timeout each (the
    write's through wait_for, a task of its own) and run their bookkeeping per reply: for
    a batch of ten publications, a third of the publisher's CPU (py-spy under
    bench/peers.py). The replies come from the connection's parser, as redis-py reads
    them; anything that cuts the exchange short disconnects the connection, as redis-py
    does, so the next batch never reads this one's replies."""
    if not connection.is_connected:
        await connection.connect()
    error: ResponseError | None = None
    try:
        with watchdog.guard(connection.socket_timeout):
            connection._writer.writelines(packed)
            await connection._writer.drain()
            parser = connection._parser
            for _ in range(replies):
                reply = await parser.read_response()
                if isinstance(reply, ResponseError):
                    error = error or reply
    except BaseException:
        await connection.disconnect(nowait=True)
        raise
    if error is not None:
        raise error


class _LoopLayer(RedisPubSubLoopLayer):
    def __init__(self, *args: Any, hosts: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, hosts=hosts, **kwargs)
        self._shards = [_ReceivingShard(host, self) for host in decode_hosts(hosts)]


class RedisPubSubChannelLayer(ChannelsRedisPubSubChannelLayer):
    """channels_redis' pub/sub layer, plus `group_send_many`.

    Each group_send is one PUBLISH and one round trip, under the shard's lock, so a
    worker's publications went out one at a time: about 150 us of CPU each, a message
    per appended batch per session (a third of a worker's CPU at 100 streams: py-spy,
    and a microbenchmark against the machine's Redis). group_send_many sends a batch in
    one write per shard (`_ReceivingShard.publish_many`): the same PUBLISH commands, in
    order.

    It uses channels_redis' own naming, sharding, serialisation and connection (private
    parts of channels-redis 4.3, pinned in requirements.txt), so what it publishes is
    exactly what group_send would; tests/server/journal/test_channel_layer.py checks that
    against the real Redis with the layer's own receivers, and pins the source of every
    private part of channels_redis and redis-py this module copies or reaches into (its
    LEANED_ON), so an upgrade that changes one fails there until it is compared.

    Its connections speak RESP2 (RESP_VERSION) and retry (REDIS_RETRY) unless a host
    says otherwise. channels_redis makes their pool itself, and a bare redis-py pool's
    connections retry nothing: after a Redis restart, the first command on each
    connection failed on its dead socket. A stream that subscribed then (its SUBSCRIBE
    the second write on the dead socket) failed to start; with the retry, redis-py
    reconnects, subscribes again to what the connection had (its own on-connect
    resubscription) and sends the command again.
    """

    def __init__(self, *args: Any, hosts: Any = None, **kwargs: Any) -> None:
        hosts = [{"retry": REDIS_RETRY, "protocol": RESP_VERSION, **host} for host in decode_hosts(hosts)]
        super().__init__(*args, hosts=hosts, **kwargs)

    async def new_group_channel(self, prefix: str = "specific.") -> str:
        """A new channel that receives only what is sent to its groups (group_add it):
        new_channel's, without a subscription to the channel's own name, which nothing
        sends to. An SSE stream's channel is one: new_channel's SUBSCRIBE, and the
        UNSUBSCRIBE when its receive is cancelled, were two of a streamed POST's four
        round trips to Redis. Receiving from it and cancelling the receive work as for
        any channel (the cancel's unsubscribe finds nothing to unsubscribe)."""
        return self._add_channel(prefix, asyncio.Queue())

    def _add_channel(self, prefix: str, holder: Any) -> str:
        """A new channel named as channels_redis' new_channel names them, `holder` (a
        queue, or a _Listener) kept for it where that keeps a channel's queue, with no
        subscription of its own."""
        layer = self._get_layer()
        channel = f"{layer.prefix}{prefix}{uuid.uuid4().hex}"
        layer.channels[channel] = holder
        return channel

    def _get_layer(self) -> Any:
        """channels_redis' per-loop layer, with `_ReceivingShard` connections."""
        loop = asyncio.get_running_loop()
        layer = self._layers.get(loop)
        if layer is None:
            layer = self._layers[loop] = _LoopLayer(*self._args, **self._kwargs, channel_layer=self)
            _wrap_close(self, loop)
        return layer

    async def new_listening_channel(self, prefix: str, deliver: Callable[[dict[str, Any]], None]) -> str:
        """A group channel (as `new_group_channel`) whose messages are handed to
        `deliver(message)` by the receive loop as it reads them, instead of queued for a
        `receive`: an SSE stream's reader task and the queue's future were a task switch
        per message per stream. `deliver` must not block; a message that cannot be
        decoded is logged and dropped (a reader of the journal sees the gap). Leave the
        groups and `close_listening_channel` it when done; never `receive` from it."""
        return self._add_channel(prefix, _Listener(deliver, self.deserialize))

    def close_listening_channel(self, channel: str) -> None:
        """Nothing more is delivered to `channel` (it holds no subscription of its own)."""
        self._get_layer().channels.pop(channel, None)

    async def group_add_many(self, groups: list[str], channel: str) -> None:
        """group_add `channel` to each of `groups`, with one SUBSCRIBE per shard for the
        groups this process was not subscribed to yet: an SSE stream joins its session's
        group and its user's access group, and each SUBSCRIBE through redis-py (its retry
        wrapper, a task for the write's timeout, the connection's events) was a few
        percent of a streamed POST's CPU (py-spy, the POST in-process)."""
        layer = self._get_layer()
        if channel not in layer.channels:
            raise RuntimeError("group_add_many() takes a channel that exists in this process")
        by_shard: dict[Any, list[str]] = {}
        for group in groups:
            group_channel = layer._get_group_channel_name(group)
            layer.groups.setdefault(group_channel, set()).add(channel)
            by_shard.setdefault(layer._get_shard(group_channel), []).append(group_channel)
        for shard, names in by_shard.items():
            await shard.subscribe_many(names)

    async def group_discard_many(self, groups: list[str], channel: str) -> None:
        """group_discard `channel` from each of `groups`, with one UNSUBSCRIBE per shard
        for the groups it was the process's last member of."""
        layer = self._get_layer()
        by_shard: dict[Any, list[str]] = {}
        for group in groups:
            group_channel = layer._get_group_channel_name(group)
            members = layer.groups.get(group_channel)
            if members is None or channel not in members:
                continue
            members.remove(channel)
            if not members:
                del layer.groups[group_channel]
                by_shard.setdefault(layer._get_shard(group_channel), []).append(group_channel)
        for shard, names in by_shard.items():
            await shard.unsubscribe_many(names)

    async def group_send_many(self, messages: list[tuple[str, dict[str, Any]]]) -> None:
        """group_send each (group, message), in order, in one round trip per shard.
        On an error some may have been sent: a caller that retries may send those twice."""
        layer = self._get_layer()
        by_shard: dict[Any, list[tuple[str, bytes]]] = {}
        for group, message in messages:
            channel = layer._get_group_channel_name(group)
            by_shard.setdefault(layer._get_shard(channel), []).append((channel, self.serialize(message)))
        for shard, pairs in by_shard.items():
            async with shard._lock:  # as its publish: one user of the connection at a time
                await shard.publish_many(pairs)
