"""Benchmark of the fold (docs/journal.md). Run: .venv/bin/python bench/fold.py

(a) Throughput: envelopes folded per second over a generated 100,000-envelope journal
    with a realistic mix (user invocations, assistant messages of ~20 deltas, some with
    reasoning, tool calls and results), best of 5 runs. Target: >= 500,000 envelopes/s.
(b) Start cost of an invocation: load_since_compaction + state + fold_messages on a
    100-envelope session and on a 100,000-envelope session whose newest
    TRANSCRIPT_COMPACTED sits at the turn boundary nearest to 50 envelopes before the end
    and holds a summary plus the last three user turns (median of many repetitions).
    Target: the big session costs at most 2x the small one.
"""

from __future__ import annotations

import asyncio
import gc
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sectr.events import Envelope, EventType, usage_dict, user_message_reason  # noqa: E402
from sectr.fold import fold_messages  # noqa: E402
from sectr.journal import MemoryJournal, NewEvent  # noqa: E402

THROUGHPUT_TARGET = 500_000
RATIO_TARGET = 2.0
WORDS = "the quick brown fox jumps over a lazy dog while reading the journal of events".split()


def invocation_events(rng: random.Random, n: int) -> list[NewEvent]:
    """One user-message invocation: 1-3 model steps, ~20 deltas each, tool calls between steps."""
    inv = f"inv_{n}"
    events = [
        NewEvent(EventType.INVOCATION_STARTED, {"reason": user_message_reason(f"question {n}")}, inv),
    ]
    steps = rng.choice((1, 2, 2, 3))
    for step in range(steps):
        mid = f"msg_{n}_{step}"
        events.append(NewEvent(EventType.MESSAGE_START, {"message_id": mid, "role": "assistant", "model": "demo"}, inv))
        if rng.random() < 0.3:
            for _ in range(rng.randint(2, 5)):
                events.append(NewEvent(EventType.MESSAGE_DELTA, {"message_id": mid, "reasoning": "thinking "}, inv))
        for _ in range(rng.randint(15, 25)):
            events.append(NewEvent(EventType.MESSAGE_DELTA, {"message_id": mid, "text": rng.choice(WORDS) + " "}, inv))
        last = step == steps - 1
        calls = [] if last else [f"call_{n}_{step}_{k}" for k in range(rng.choice((1, 1, 2)))]
        for call_id in calls:
            payload = {
                "message_id": mid,
                "tool_call_id": call_id,
                "name": "calculator",
                "arguments": '{"expression": "2+2"}',
            }
            events.append(NewEvent(EventType.TOOL_CALL, payload, inv))
        events.append(NewEvent(EventType.MESSAGE_END, {"message_id": mid, "usage": usage_dict(100, 20)}, inv))
        for call_id in calls:
            payload = {"tool_call_id": call_id, "name": "calculator", "content": "4"}
            events.append(NewEvent(EventType.TOOL_RESULT, payload, inv))
    events.append(
        NewEvent(EventType.INVOCATION_COMPLETED, {"stop_reason": "end_turn", "usage": usage_dict(100, 20)}, inv)
    )
    return events


def generate_events(count: int, seed: int = 7) -> list[NewEvent]:
    """About `count` events (whole invocations), after a SESSION_CREATED; trimmed to `count`."""
    rng = random.Random(seed)
    events = [NewEvent(EventType.SESSION_CREATED, {"mode": "default", "model": "demo"})]
    n = 0
    while len(events) < count:
        events.extend(invocation_events(rng, n))
        n += 1
    return events[:count]


def as_envelopes(events: list[NewEvent], session_id: str = "ses_bench") -> list[Envelope]:
    return [Envelope(session_id, seq, e.invocation_id, e.type, e.payload) for seq, e in enumerate(events, start=1)]


def bench_throughput(total: int = 100_000, runs: int = 5) -> float:
    envelopes = as_envelopes(generate_events(total))
    best = float("inf")
    for _ in range(runs):
        gc.collect()
        start = time.perf_counter()
        fold_messages(envelopes)
        best = min(best, time.perf_counter() - start)
    return total / best


def compaction_messages(prefix: list[NewEvent]) -> list[dict[str, Any]]:
    """What a compaction keeps: a summary turn plus the last few messages, from a user turn on."""
    folded = fold_messages(as_envelopes(prefix))
    starts = [i for i, m in enumerate(folded) if m["role"] == "user"]
    keep_from = starts[-3] if len(starts) >= 3 else 0
    summary = {"role": "user", "content": "Summary of the conversation so far: " + " ".join(WORDS * 4)}
    return [summary, *folded[keep_from:]]


def build_session(journal: MemoryJournal, total: int, compact_before_end: int | None) -> str:
    sid = journal.create()
    events = generate_events(total)
    if compact_before_end is not None:
        # Compaction happens at a turn boundary: cut after the invocation end nearest to
        # `compact_before_end` envelopes before the end.
        boundaries = [i + 1 for i, e in enumerate(events) if e.type is EventType.INVOCATION_COMPLETED]
        cut = min(boundaries, key=lambda b: abs(total - compact_before_end - b))
        payload = {"messages": compaction_messages(events[:cut]), "summary": "summary", "through_seq": cut}
        events = [*events[:cut], NewEvent(EventType.TRANSCRIPT_COMPACTED, payload), *events[cut:]]
        events = events[:total]
    for start in range(0, len(events), 1000):
        journal.append_now(sid, events[start : start + 1000])
    return sid


async def start_cost(journal: MemoryJournal, sid: str, repetitions: int) -> float:
    """Median seconds of what an invocation pays to start: load, state, fold."""
    timings = []
    for _ in range(repetitions):
        start = time.perf_counter()
        transcript = await journal.load_since_compaction(sid)
        await journal.state(sid)
        fold_messages(transcript)
        timings.append(time.perf_counter() - start)
    return statistics.median(timings)


async def bench_start_cost(repetitions: int = 5000) -> tuple[float, float, int, int]:
    journal = MemoryJournal()
    small = build_session(journal, 100, None)
    big = build_session(journal, 100_000, 50)
    small_loaded = len(await journal.load_since_compaction(small))
    big_loaded = len(await journal.load_since_compaction(big))
    await start_cost(journal, small, 200)  # warm up
    await start_cost(journal, big, 200)
    gc.collect()
    small_time = await start_cost(journal, small, repetitions)
    big_time = await start_cost(journal, big, repetitions)
    return small_time, big_time, small_loaded, big_loaded


def verdict(ok: bool) -> str:
    return "OK" if ok else "MISSED"


def main() -> None:
    rate = bench_throughput()
    print(
        f"fold throughput: {rate:,.0f} envelopes/s (best of 5, 100,000 envelopes)"
        f"   target >= {THROUGHPUT_TARGET:,}   {verdict(rate >= THROUGHPUT_TARGET)}"
    )
    small_time, big_time, small_loaded, big_loaded = asyncio.run(bench_start_cost())
    ratio = big_time / small_time
    print(
        f"invocation start, 100-envelope session: {small_time * 1e6:,.1f} us (median; folds {small_loaded} envelopes)"
    )
    print(
        f"invocation start, 100,000-envelope session, compaction at the turn boundary nearest 50 before the end:"
        f" {big_time * 1e6:,.1f} us (median; folds {big_loaded} envelopes, compaction included)"
    )
    print(
        f"start cost ratio (100,000 / 100): {ratio:.2f}   target <= {RATIO_TARGET}   {verdict(ratio <= RATIO_TARGET)}"
    )


if __name__ == "__main__":
    main()
