"""One object per running event loop.

What holds asyncio objects (a queue, a task, an HTTP connection pool) must not cross
the loop it was made in: tests run a loop each, a server or a worker one for all. A
PerLoop makes its object on first use in each running loop and forgets it with the
loop (weakly keyed).
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class PerLoop(Generic[T]):
    def __init__(self, make: Callable[[], T]) -> None:
        self._make = make
        self._by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, T] = weakref.WeakKeyDictionary()

    def get(self) -> T:
        """The running loop's object (made now if it has none)."""
        loop = asyncio.get_running_loop()
        found = self._by_loop.get(loop)
        if found is None:
            found = self._by_loop[loop] = self._make()
        return found

    def values(self) -> list[T]:
        """Every live loop's object."""
        return list(self._by_loop.values())

    def pop(self) -> T | None:
        """Forget the running loop's object and return it (None if it had none)."""
        return self._by_loop.pop(asyncio.get_running_loop(), None)
