"""sectr.watchdog.Watchdog: asyncio.timeout's bound for a repeated block, with at most
one timer on the loop however many blocks it guards."""

from __future__ import annotations

import asyncio
import time

import pytest

from sectr.watchdog import Watchdog


def test_a_block_that_hangs_is_cut_short_at_its_deadline_as_timeout_error() -> None:
    async def hang() -> float:
        watchdog = Watchdog()
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            with watchdog.guard(0.2):
                await asyncio.Event().wait()
        took = time.monotonic() - started
        with watchdog.guard(0.2):  # the watchdog guards the next block as well
            await asyncio.sleep(0)
        return took

    took = asyncio.run(hang())
    assert 0.19 <= took < 0.5


def test_many_short_blocks_share_one_timer_and_a_later_one_still_gets_its_own_bound() -> None:
    async def blocks() -> tuple[int, float]:
        loop = asyncio.get_running_loop()
        watchdog = Watchdog()
        before = len(loop._scheduled)  # type: ignore[attr-defined]
        for _ in range(1000):
            with watchdog.guard(0.3):
                await asyncio.sleep(0)
        timers = len(loop._scheduled) - before  # type: ignore[attr-defined]
        await asyncio.sleep(0.2)  # the timer fires after the first block's deadline: 0.3 s
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            with watchdog.guard(0.3):
                await asyncio.Event().wait()
        return timers, time.monotonic() - started

    timers, took = asyncio.run(blocks())
    assert timers == 1
    assert 0.29 <= took < 0.6


def test_a_cancel_from_outside_stays_a_cancel_and_an_outer_timeout_stays_its_own() -> None:
    async def outside() -> None:
        watchdog = Watchdog()

        async def guarded() -> None:
            with watchdog.guard(5.0):
                await asyncio.Event().wait()

        task = asyncio.ensure_future(guarded())
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert task.cancelled()
        with pytest.raises(TimeoutError):  # asyncio.timeout's, around a longer watchdog
            async with asyncio.timeout(0.05):
                with watchdog.guard(5.0):
                    await asyncio.Event().wait()
        with pytest.raises(TimeoutError):  # the watchdog's, inside a longer asyncio.timeout
            async with asyncio.timeout(5.0):
                with watchdog.guard(0.05):
                    await asyncio.Event().wait()
        assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]

    asyncio.run(outside())


def test_none_guards_nothing_and_one_block_at_a_time() -> None:
    async def blocks() -> None:
        watchdog = Watchdog()
        with watchdog.guard(None):
            await asyncio.sleep(0.01)
        with watchdog.guard(1.0):
            with pytest.raises(RuntimeError):
                with watchdog.guard(1.0):
                    pass

    asyncio.run(blocks())
