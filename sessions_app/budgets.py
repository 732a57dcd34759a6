"""Fixed-window counters for budgets: API requests per token, login attempts per account
and per address, sessions created per user.

`spend(scope, key, window)` adds one to the counter of `key` in the current window and
returns the new count, atomically: with Redis (REDIS_URL) one Lua script does INCR and
sets the window's expiry on the first hit, so every server process shares the count and
no two requests read the same value; without Redis (the embedded default, one process)
a lock-protected dictionary in this process does the same. Django's cache is not used:
its async incr() is a get followed by a set, so concurrent requests lost counts.

A deployment with several server processes and no Redis counts per process.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings

from sectr.errors import SectrError

# INCR, and on the window's first hit its expiry: one atomic step on the Redis server.
SPEND_SCRIPT = """
local count = redis.call('INCR', KEYS[1])
if count == 1 then
    redis.call('EXPIRE', KEYS[1], ARGV[1])
end
return count
"""


class BudgetExceeded(SectrError):
    """429: this budget is spent for the window; Retry-After says when the next one starts."""

    code = "rate_limited"
    status = 429

    def __init__(self, message: str, *, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after
        self.headers = {"Retry-After": str(retry_after)}


@dataclass(frozen=True)
class Spent:
    count: int  # requests counted in this window, this one included
    retry_after: int  # whole seconds until the window ends (at least 1)


def setting_budget(name: str, default: str) -> tuple[int, int]:
    """A budget from a Django setting ("30/60"); `default` when unset or malformed."""
    raw = getattr(settings, name, "") or default
    return parse_budget(raw, parse_budget(default, (0, 60)))


def parse_budget(raw: Any, default: tuple[int, int]) -> tuple[int, int]:
    """ "600/60" -> (600, 60): so many per so many seconds; 0 = no limit; `default` if malformed."""
    count, _, window = str(raw or "").partition("/")
    if not count.isascii() or not count.isdigit() or (window and not (window.isascii() and window.isdigit())):
        return default
    return int(count), max(int(window or 60), 1)


@lru_cache(maxsize=4)
def _redis_client(url: str) -> Any:
    import redis  # only when REDIS_URL is set

    client = redis.Redis.from_url(url)
    return client, client.register_script(SPEND_SCRIPT)


class _LocalCounters:
    """The embedded default's counters: {key: (window index, count)} under one lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, tuple[int, int]] = {}

    def spend(self, key: str, window_index: int) -> int:
        with self._lock:
            index, count = self._counts.get(key, (window_index, 0))
            count = count + 1 if index == window_index else 1
            self._counts[key] = (window_index, count)
            if len(self._counts) > 100_000:  # drop counters of windows that are over
                self._counts = {k: v for k, v in self._counts.items() if v[0] >= window_index}
            return count


_local = _LocalCounters()


def spend(scope: str, key: str, window: int) -> Spent:
    """Count one hit of `key` in `scope`'s current `window`-second window."""
    now = time.time()
    window_index = int(now // window)
    retry_after = max(int((window_index + 1) * window - now) + 1, 1)
    prefix = getattr(settings, "SECTR_COUNTER_PREFIX", "sectr")
    name = f"{prefix}:budget:{scope}:{window}:{window_index}:{key}"
    url = getattr(settings, "REDIS_URL", "")
    if url:
        _client, script = _redis_client(url)
        count = int(script(keys=[name], args=[window + 1]))
    else:
        count = _local.spend(name, window_index)
    return Spent(count=count, retry_after=retry_after)


async def aspend(scope: str, key: str, window: int) -> Spent:
    if not getattr(settings, "REDIS_URL", ""):
        # The in-memory counters: a lock held for microseconds, cheaper than a thread hop.
        return spend(scope, key, window)
    # Off the event loop: a Redis round trip must not stall other requests.
    return await sync_to_async(spend, thread_sensitive=False)(scope, key, window)
