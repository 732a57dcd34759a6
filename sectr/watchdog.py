"""Watchdog: asyncio.timeout's bound for a block that runs again and again, without a
timer per run.

`asyncio.timeout(seconds)` puts a timer on the event loop's heap as the block starts and
takes it off as it ends: for the publisher's batches (one or more per streamed chunk)
that was a few percent of a worker's CPU (py-spy under bench/peers.py). A Watchdog keeps
at most one timer however many blocks it guards: a block only notes when it started.
The timer fires at the deadline of the block that armed it; if a later block is running
by then, it moves on to that block's deadline, and if none is, it stops until the next
block arms it again. So a block that hangs is cancelled at its own deadline (deadlines
only move forward: every block of one watchdog has the same length), and the cancel
becomes TimeoutError at the end of the block, exactly as with asyncio.timeout (nested
timeouts and outside cancels keep their own meaning: the same `cancelling` count rule).

One block at a time per watchdog (a shard's connection, a publisher's task): another
one that starts while a block runs raises RuntimeError.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from types import TracebackType
from typing import Any

_NOTHING = contextlib.nullcontext()


class Watchdog:
    __slots__ = ("_cancelling", "_deadline", "_expired", "_seconds", "_task", "_timer")

    def __init__(self) -> None:
        self._task: asyncio.Task[object] | None = None
        self._deadline = math.inf
        self._seconds = 0.0
        self._cancelling = 0
        self._expired = False
        self._timer: asyncio.TimerHandle | None = None

    def guard(self, seconds: float | None) -> Any:
        """`with watchdog.guard(seconds):` cancels the block (TimeoutError) once it ran
        `seconds`; None guards nothing (as asyncio.timeout(None))."""
        if seconds is None:
            return _NOTHING
        self._seconds = seconds
        return self

    def __enter__(self) -> Watchdog:
        seconds, self._seconds = self._seconds, 0.0
        if self._task is not None:
            raise RuntimeError("a Watchdog guards one block at a time")
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("a Watchdog guards a block of a task")
        loop = task.get_loop()
        self._task = task
        self._cancelling = task.cancelling()
        self._deadline = deadline = loop.time() + seconds
        timer = self._timer
        if timer is None or timer.when() > deadline:  # (a shorter block than the last)
            if timer is not None:
                timer.cancel()
            self._timer = loop.call_at(deadline, self._check)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        task, self._task = self._task, None
        if task is None or not self._expired:
            return
        self._expired = False
        if task.uncancel() <= self._cancelling and kind is asyncio.CancelledError:
            raise TimeoutError from error

    def _check(self) -> None:
        self._timer = None
        task = self._task
        if task is None:
            return  # idle: the next block arms the timer again
        loop = task.get_loop()
        if loop.time() >= self._deadline:
            self._expired = True
            task.cancel()
        else:
            self._timer = loop.call_at(self._deadline, self._check)
