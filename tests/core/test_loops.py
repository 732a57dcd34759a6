"""PerLoop: one object per running event loop, forgotten with its loop."""

from __future__ import annotations

import asyncio
import gc

from sectr.loops import PerLoop


class Thing:
    pass


def test_one_object_per_loop_and_the_same_one_each_time() -> None:
    per_loop: PerLoop[Thing] = PerLoop(Thing)

    async def twice() -> tuple[Thing, Thing]:
        return per_loop.get(), per_loop.get()

    first, again = asyncio.run(twice())
    assert first is again
    other, _ = asyncio.run(twice())
    assert other is not first  # a new loop (maybe at the old one's address) gets its own


def test_the_objects_of_two_live_loops_stay_apart() -> None:
    per_loop: PerLoop[Thing] = PerLoop(Thing)
    one, two = asyncio.new_event_loop(), asyncio.new_event_loop()
    try:

        async def get() -> Thing:
            return per_loop.get()

        a = one.run_until_complete(get())
        b = two.run_until_complete(get())
        assert a is not b
        assert one.run_until_complete(get()) is a
        assert two.run_until_complete(get()) is b
    finally:
        one.close()
        two.close()


def test_an_object_goes_with_its_loop() -> None:
    per_loop: PerLoop[Thing] = PerLoop(Thing)

    async def get() -> None:
        per_loop.get()

    asyncio.run(get())
    gc.collect()
    assert per_loop.values() == []
    assert per_loop._last is None  # the fast path's reference went too


def test_pop_forgets_the_object() -> None:
    per_loop: PerLoop[Thing] = PerLoop(Thing)

    async def pop_then_get() -> tuple[Thing, Thing | None, Thing]:
        first = per_loop.get()
        popped = per_loop.pop()
        return first, popped, per_loop.get()

    first, popped, after = asyncio.run(pop_then_get())
    assert popped is first
    assert after is not first
