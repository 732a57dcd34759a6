"""The embedded default's channel layer: Channels' in-memory layer, swept less often.

Channels' InMemoryChannelLayer walks every channel and every group membership to expire
old messages on *each* send and receive. With a socket per channel that is O(sockets)
work per message, and a message per streamed chunk per socket: at 100 streams it was a
fifth of the embedded server's CPU (py-spy under bench/live.py). Here the sweep runs at
most once every SWEEP_SECONDS; a message past its expiry (60 s by default) may wait up
to that much longer before it is dropped, which nothing relies on. Everything else is
Channels' own. Production uses channels_redis (sectr_web.settings), which is unaffected.
"""

from __future__ import annotations

import time
from typing import Any

from channels.layers import InMemoryChannelLayer as ChannelsInMemoryChannelLayer

SWEEP_SECONDS = 1.0


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
