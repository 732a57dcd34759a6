"""The embedded default's channel layer: Channels' in-memory layer, made cheaper per message.

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
Production uses channels_redis (sectr_web.settings), which is unaffected.
"""

from __future__ import annotations

import asyncio
import copy
import time
from typing import Any

from channels.exceptions import ChannelFull
from channels.layers import InMemoryChannelLayer as ChannelsInMemoryChannelLayer

SWEEP_SECONDS = 1.0
_IMMUTABLE = (str, bytes, int, float, bool, type(None))


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

    def _clean_expired(self) -> None:
        now = time.monotonic()
        if now - self._swept_at < SWEEP_SECONDS:
            return
        self._swept_at = now
        super()._clean_expired()

    async def send(self, channel: str, message: dict[str, Any]) -> None:
        """Channels' send, copying the message with copy_message."""
        assert isinstance(message, dict), "message is not a dict"  # noqa: S101 - Channels' own check
        self.require_valid_channel_name(channel)
        assert "__asgi_channel__" not in message  # noqa: S101 - Channels' own check
        queue = self.channels.setdefault(channel, asyncio.Queue(maxsize=self.get_capacity(channel)))
        try:
            queue.put_nowait((time.time() + self.expiry, copy_message(message)))
        except asyncio.QueueFull:
            raise ChannelFull(channel) from None

    async def group_send(self, group: str, message: dict[str, Any]) -> None:
        """Channels' group_send, sending to each member in turn."""
        assert isinstance(message, dict), "Message is not a dict"  # noqa: S101 - Channels' own check
        self.require_valid_group_name(group)
        self._clean_expired()
        for channel in list(self.groups.get(group, ())):
            try:
                await self.send(channel, message)
            except ChannelFull:
                pass  # as Channels does: a full channel misses the message
        # Let the receivers run, as Channels' tasks did: a burst of sends that never
        # yielded filled the receivers' queues (capacity 100) and dropped the rest.
        await asyncio.sleep(0)
