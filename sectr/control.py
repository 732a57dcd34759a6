"""RunControl: the cancel flag and the steer slot of one active invocation.

The in-memory version serves LocalRuntime; the Django worker subclasses it so that
`take_steer` empties the durable slot on the Run row in the same transaction that
journals STEER_RECEIVED.
"""

from __future__ import annotations

import asyncio


class RunControl:
    def __init__(self) -> None:
        self._cancelled = asyncio.Event()
        self.cancelled_by: str | None = None
        self._steers: list[tuple[str, str | None]] = []

    # ---- cancel ----
    def cancel(self, by: str | None = None) -> None:
        if not self._cancelled.is_set():
            self.cancelled_by = by
            self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    async def wait_cancelled(self) -> None:
        await self._cancelled.wait()

    # ---- steer ----
    def steer(self, text: str, author: str | None = None) -> None:
        """Park a steer; a second one appends after a blank line (docs/sessions.md)."""
        self._steers.append((text, author))

    def has_steer(self) -> bool:
        return bool(self._steers)

    async def take_steer(self, *, ending: bool = False) -> tuple[str, str | None] | None:
        """Empty the slot: the parked text (joined by blank lines) and its first author.

        `ending`: the handler ends at this boundary unless a steer is taken. A control
        whose durable slot the invocation's end looks at again (the Django worker's: the
        completing append is refused while a steer is parked, and the handler runs again
        to answer it) may leave that slot unread here; the in-memory slot is always taken."""
        if not self._steers:
            return None
        steers, self._steers = self._steers, []
        return "\n\n".join(text for text, _ in steers), steers[0][1]
