"""Channel layers that refuse an event stream's joins on demand, as a Redis client does
while Redis is away (loaded by layer_fault_settings.py, for a live server's tests).

The file named by SECTR_TEST_REFUSED_JOINS holds a number: while it is above zero, each
event stream's first join of a group fails with Redis' "connection refused" and takes one
off it. The worker's own joins are never refused (an embedded worker shares the layer).
"""

from __future__ import annotations

import os
from pathlib import Path

from redis.exceptions import ConnectionError as RedisConnectionError

from sectr_web.channel_layer import InMemoryChannelLayer, RedisPubSubChannelLayer

#: The prefix of an event stream's channel (sessions_app.api.sse).
STREAM_CHANNEL = "sectr.sse."


def refuse_stream_join(channel: str) -> None:
    """Raise as a lost Redis does while the counter file holds a number above zero."""
    if STREAM_CHANNEL not in channel:
        return
    path = Path(os.environ["SECTR_TEST_REFUSED_JOINS"])
    left = int(path.read_text() or 0) if path.exists() else 0
    if left > 0:
        path.write_text(str(left - 1))
        raise RedisConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")


class RefusingInMemoryChannelLayer(InMemoryChannelLayer):
    async def group_add(self, group: str, channel: str) -> None:
        refuse_stream_join(channel)
        await super().group_add(group, channel)


class RefusingRedisPubSubChannelLayer(RedisPubSubChannelLayer):
    async def group_add(self, group: str, channel: str) -> None:
        refuse_stream_join(channel)
        # channels_redis' layer hands its calls to a layer of the running loop.
        await self._get_layer().group_add(group, channel)

    async def group_add_many(self, groups: list[str], channel: str) -> None:
        refuse_stream_join(channel)
        await super().group_add_many(groups, channel)
