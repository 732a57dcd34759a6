"""InvocationWriter: delta coalescing under a slow journal, no delay when idle, order,
errors from background flushes, and the closed writer after the terminal event."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Sequence
from typing import Any

import pytest

from sectr import LocalRuntime
from sectr.errors import LeaseLost
from sectr.events import Envelope, EventType
from sectr.fold import fold_messages
from sectr.journal import MemoryJournal, NewEvent
from sectr.payloads import InvalidEvent
from sectr.providers.demo import DemoProvider
from sectr.writer import InvocationWriter

from .conftest import of_type, types_of


class SlowJournal(MemoryJournal):
    """A MemoryJournal whose appends take `latency` seconds (a remote database), recording
    when each append began and what it carried."""

    def __init__(self, latency: float = 0.01) -> None:
        super().__init__()
        self.latency = latency
        self.calls: list[list[NewEvent]] = []

    async def append(self, session_id: str, events: Sequence[NewEvent], *, fence: Any = None) -> list[Envelope]:
        self.calls.append(list(events))
        await asyncio.sleep(self.latency)
        return self.append_now(session_id, events, fence=fence)


class FailingJournal(MemoryJournal):
    """Fails the appends whose 1-based numbers are in `fail_on`."""

    def __init__(self, fail_on: set[int], error: BaseException) -> None:
        super().__init__()
        self.fail_on = fail_on
        self.error = error
        self.count = 0

    async def append(self, session_id: str, events: Sequence[NewEvent], *, fence: Any = None) -> list[Envelope]:
        self.count += 1
        await asyncio.sleep(0.001)
        if self.count in self.fail_on:
            raise self.error
        return self.append_now(session_id, events, fence=fence)


def new_writer(journal: MemoryJournal) -> tuple[InvocationWriter, str, list[Envelope]]:
    sid = journal.create()
    seen: list[Envelope] = []
    writer = InvocationWriter(journal, sid, "inv_1", on_append=seen.extend)
    return writer, sid, seen


def delta_text(envelopes: Sequence[Envelope], key: str = "text") -> str:
    return "".join(e.payload.get(key, "") for e in envelopes if e.type is EventType.MESSAGE_DELTA)


@pytest.mark.serial  # counts deltas per 10 ms round trip against 0.5 ms sleeps: alone (scripts/test.sh)
async def test_a_slow_journal_gets_fewer_bigger_delta_envelopes() -> None:
    journal = SlowJournal(latency=0.01)
    writer, sid, _ = new_writer(journal)
    words = [f"w{i} " for i in range(200)]
    for word in words:
        await writer.delta("m1", text=word)
        await asyncio.sleep(0.0005)  # a fast model: many deltas per journal round trip
    await writer.flush()
    deltas = of_type(journal.read(sid), EventType.MESSAGE_DELTA)
    assert delta_text(deltas) == "".join(words)
    assert 1 < len(deltas) < len(words) / 4
    assert writer.appends == len(deltas)
    assert all(e.payload["message_id"] == "m1" for e in deltas)


async def test_an_idle_journal_writes_the_first_delta_at_once() -> None:
    journal = SlowJournal(latency=0.05)
    writer, sid, _ = new_writer(journal)
    await writer.delta("m1", text="hello")
    # the write began before delta() returned: no batching window, no timer
    assert [[e.payload for e in call] for call in journal.calls] == [[{"message_id": "m1", "text": "hello"}]]
    await writer.flush()
    assert delta_text(journal.read(sid)) == "hello"


async def test_with_a_fast_journal_every_delta_is_its_own_envelope() -> None:
    journal = MemoryJournal()
    writer, sid, seen = new_writer(journal)
    for i in range(10):
        await writer.delta("m1", text=f"{i} ")
        # written before the producer goes on: the transcript is current at every step
        assert delta_text(seen) == "".join(f"{j} " for j in range(i + 1))
    assert len(of_type(journal.read(sid), EventType.MESSAGE_DELTA)) == 10


async def test_an_idle_stream_through_the_runtime_is_not_batched() -> None:
    rt = LocalRuntime(provider=DemoProvider(delay=0))
    sid = await rt.create_session()
    await rt.send(sid, "!long 20")
    deltas = of_type(rt.journal.read(sid), EventType.MESSAGE_DELTA)
    assert len(deltas) == 20


async def test_a_message_starts_in_the_same_append_as_its_first_delta() -> None:
    journal = SlowJournal(latency=0)
    rt = LocalRuntime(provider=DemoProvider(delay=0), journal=journal)
    sid = await rt.create_session()
    await rt.send(sid, "!long 3")
    (first,) = [call for call in journal.calls if any(e.type is EventType.MESSAGE_START for e in call)]
    assert [e.type for e in first] == [EventType.MESSAGE_START, EventType.MESSAGE_DELTA]
    assert first[0].payload["message_id"] == first[1].payload["message_id"]
    assert len(of_type(journal.read(sid), EventType.MESSAGE_DELTA)) == 3  # the others as before


async def test_a_reply_ends_in_the_same_append_as_its_invocation() -> None:
    """The reply's MESSAGE_END (held by `end()`) and the terminal event: one append, the
    end first, with its text; the stored journal is what two appends made."""
    journal = SlowJournal(latency=0)
    rt = LocalRuntime(provider=DemoProvider(delay=0), journal=journal)
    sid = await rt.create_session()
    await rt.send(sid, "!long 3")
    last = journal.calls[-1]
    assert [e.type for e in last] == [EventType.MESSAGE_END, EventType.INVOCATION_COMPLETED]
    assert last[0].text == delta_text(of_type(journal.read(sid), EventType.MESSAGE_DELTA))
    assert not any(e.type is EventType.MESSAGE_END for call in journal.calls[:-1] for e in call)
    types = types_of(journal.read(sid))
    assert types[-2:] == [EventType.MESSAGE_END, EventType.INVOCATION_COMPLETED]
    assert fold_messages(journal.read(sid))[-1]["role"] == "assistant"


async def test_a_held_event_goes_out_alone_when_nothing_follows(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sectr.writer.HOLD_SECONDS", 0.01)
    journal = SlowJournal(latency=0.005)
    writer, sid, seen = new_writer(journal)
    await writer.append(_start("m1"))
    await writer.delta("m1", text="hello")  # in flight when the end is held
    writer.hold(writer.event(EventType.MESSAGE_END, {"message_id": "m1"}))
    assert EventType.MESSAGE_END not in [e.type for e in seen]
    await asyncio.sleep(0.1)  # no flush, no append: the timer writes it
    assert types_of(journal.read(sid)) == [EventType.MESSAGE_START, EventType.MESSAGE_DELTA, EventType.MESSAGE_END]
    assert [e.type for e in journal.calls[-1]] == [EventType.MESSAGE_END]
    assert journal.calls[-1][0].text == "hello"


async def test_a_held_event_keeps_its_place_in_emission_order() -> None:
    """Whatever is emitted after a held event goes after it: a delta or a queued event
    sends it to the buffer first, `flush` writes it, `append` writes it with its own."""
    journal = SlowJournal(latency=0.002)
    writer, sid, _ = new_writer(journal)
    await writer.append(_start("m1"))
    writer.hold(writer.event(EventType.MESSAGE_END, {"message_id": "m1"}))
    writer.append_soon(_start("m2"))
    await writer.delta("m2", text="second")
    writer.hold(writer.event(EventType.MESSAGE_END, {"message_id": "m2"}))
    await writer.flush()
    writer.hold(writer.event(EventType.SESSION_ERROR, {"error": "x", "retryable": True}))
    (envelope,) = await writer.append(_start("m3"))
    assert envelope.type is EventType.MESSAGE_START and envelope.payload["message_id"] == "m3"
    assert [e.type for e in journal.calls[-1]] == [EventType.SESSION_ERROR, EventType.MESSAGE_START]
    assert [(e.type, e.payload.get("message_id")) for e in journal.read(sid)] == [
        (EventType.MESSAGE_START, "m1"),
        (EventType.MESSAGE_END, "m1"),
        (EventType.MESSAGE_START, "m2"),
        (EventType.MESSAGE_DELTA, "m2"),
        (EventType.MESSAGE_END, "m2"),
        (EventType.SESSION_ERROR, None),
        (EventType.MESSAGE_START, "m3"),
    ]


async def test_a_discarded_writer_forgets_what_it_held() -> None:
    """A fenced run (its lease lost) writes nothing more, a held reply end included: the
    message stays open for the recovery to stitch, as a crash before `end()` leaves it."""
    journal = SlowJournal(latency=0)
    writer, sid, _ = new_writer(journal)
    await writer.append(_start("m1"))
    writer.hold(writer.event(EventType.MESSAGE_END, {"message_id": "m1"}))
    writer.discard()
    await writer.flush()
    await asyncio.sleep(0.3)
    assert types_of(journal.read(sid)) == [EventType.MESSAGE_START]


async def test_a_failed_start_with_its_first_delta_surfaces_on_the_next_call() -> None:
    """MESSAGE_START is no longer awaited on its own: its write's error (a lost lease, a
    refused payload) is the next writer call's, as a delta's is."""

    class Refusing(MemoryJournal):
        async def append(self, session_id: str, events: Sequence[NewEvent], *, fence: Any = None) -> list[Envelope]:
            if any(e.type is EventType.MESSAGE_START for e in events):
                raise LeaseLost("taken over")
            return await super().append(session_id, events, fence=fence)

    rt = LocalRuntime(provider=DemoProvider(delay=0), journal=Refusing())
    sid = await rt.create_session()
    with pytest.raises(LeaseLost):
        await rt.send(sid, "!long 3")
    assert not of_type(rt.journal.read(sid), EventType.MESSAGE_DELTA)


async def test_a_slow_journal_through_the_runtime_coalesces_and_keeps_the_text() -> None:
    journal = SlowJournal(latency=0.005)
    rt = LocalRuntime(provider=DemoProvider(delay=0.0005), journal=journal)
    sid = await rt.create_session()
    await rt.send(sid, "!long 150")
    deltas = of_type(journal.read(sid), EventType.MESSAGE_DELTA)
    assert len(deltas) < 150 / 2
    reference = LocalRuntime(provider=DemoProvider(delay=0))
    ref_sid = await reference.create_session()
    await reference.send(ref_sid, "!long 150")
    assert fold_messages(journal.read(sid)) == fold_messages(reference.journal.read(ref_sid))


async def test_order_with_other_events_is_emission_order() -> None:
    journal = SlowJournal(latency=0.005)
    writer, sid, seen = new_writer(journal)
    await writer.emit(EventType.MESSAGE_START, {"message_id": "m1", "role": "assistant"})
    for piece in ("a", "b", "c"):
        await writer.delta("m1", reasoning=piece)
    for piece in ("d", "e"):
        await writer.delta("m1", text=piece)
    await writer.emit(EventType.TOOL_CALL, {"message_id": "m1", "tool_call_id": "c1", "name": "x", "arguments": "{}"})
    await writer.delta("m1", text="f")
    await writer.delta("m1", text="g")
    await writer.emit(EventType.MESSAGE_END, {"message_id": "m1"})
    journal_envelopes = journal.read(sid)
    assert seen == journal_envelopes
    kinds = types_of(journal_envelopes)
    assert kinds[0] == "MESSAGE_START" and kinds[-1] == "MESSAGE_END"
    call_index = kinds.index("TOOL_CALL")
    before, after = journal_envelopes[:call_index], journal_envelopes[call_index:]
    assert delta_text(before, "reasoning") == "abc" and delta_text(before) == "de"
    assert delta_text(after) == "fg"
    assert [e.seq for e in journal_envelopes] == list(range(1, len(journal_envelopes) + 1))
    message = fold_messages(journal_envelopes)[0]
    assert message["content"] == "defg" and message["reasoning_content"] == "abc"


async def test_deltas_of_two_messages_stay_apart() -> None:
    journal = SlowJournal(latency=0.01)
    writer, sid, _ = new_writer(journal)
    await writer.delta("m1", text="first")  # in flight
    await writer.delta("m1", text=" one")
    await writer.delta("m2", text="second")
    await writer.delta("m2", reasoning="why")
    await writer.flush()
    deltas = of_type(journal.read(sid), EventType.MESSAGE_DELTA)
    assert [e.payload for e in deltas] == [
        {"message_id": "m1", "text": "first"},
        {"message_id": "m1", "text": " one"},
        {"message_id": "m2", "text": "second", "reasoning": "why"},
    ]


async def test_an_error_in_a_background_flush_surfaces_on_the_next_delta() -> None:
    journal = FailingJournal({1}, RuntimeError("disk full"))
    writer, sid, _ = new_writer(journal)
    await writer.delta("m1", text="lost")
    await asyncio.sleep(0.01)  # the background write fails meanwhile
    with pytest.raises(RuntimeError, match="disk full"):
        await writer.delta("m1", text="next")
    # raised once; the writer goes on
    await writer.delta("m1", text="after")
    await writer.flush()
    assert delta_text(journal.read(sid)) == "after"


async def test_an_error_in_a_background_flush_surfaces_on_the_next_append() -> None:
    journal = FailingJournal({1}, LeaseLost("fenced"))
    writer, sid, _ = new_writer(journal)
    await writer.delta("m1", text="x")
    with pytest.raises(LeaseLost):
        await writer.emit(EventType.MESSAGE_END, {"message_id": "m1"})
    assert journal.read(sid) == []


async def test_an_error_in_a_background_flush_surfaces_on_flush() -> None:
    journal = FailingJournal({2}, RuntimeError("timeout"))
    writer, sid, _ = new_writer(journal)
    await writer.delta("m1", text="a")  # append 1: in flight
    await writer.delta("m1", text="b")  # buffered: append 2 will fail
    with pytest.raises(RuntimeError, match="timeout"):
        await writer.flush()
    assert delta_text(journal.read(sid)) == "a"


async def test_the_writer_is_closed_after_the_terminal_event() -> None:
    journal = MemoryJournal()
    writer, sid, _ = new_writer(journal)
    await writer.emit(EventType.INVOCATION_COMPLETED, {"stop_reason": "end_turn", "usage": {}})
    assert writer.closed
    with pytest.raises(RuntimeError, match="has ended"):
        await writer.emit(EventType.MESSAGE_START, {"message_id": "m9", "role": "assistant"})
    with pytest.raises(RuntimeError, match="has ended"):
        await writer.delta("m9", text="late")
    assert len(journal.read(sid)) == 1


async def test_a_cancelled_producer_does_not_cut_an_in_flight_write() -> None:
    journal = SlowJournal(latency=0.02)
    writer, sid, _ = new_writer(journal)

    async def produce() -> None:
        await writer.delta("m1", text="a")
        await writer.delta("m1", text="b")
        await writer.flush()

    task = asyncio.create_task(produce())
    await asyncio.sleep(0.005)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await writer.flush()  # what the runtime does before its terminal event
    assert delta_text(journal.read(sid)) == "ab"


class ThreadedJournal(MemoryJournal):
    """Appends like a database journal does: in a worker thread that commits whatever
    happens to the coroutine awaiting it (a cancelled caller does not stop the write)."""

    def __init__(self, latency: float, slow_types: set[EventType]) -> None:
        super().__init__()
        self.latency = latency
        self.slow_types = slow_types
        self.begun: list[EventType] = []

    async def append(self, session_id: str, events: Sequence[NewEvent], *, fence: Any = None) -> list[Envelope]:
        slow = any(e.type in self.slow_types for e in events)
        self.begun.extend(e.type for e in events)
        if not slow:
            return self.append_now(session_id, events, fence=fence)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[list[Envelope]] = loop.create_future()

        def commit() -> None:
            if not future.cancelled():
                future.set_result(self.append_now(session_id, events, fence=fence))

        def work() -> None:
            time.sleep(self.latency)
            loop.call_soon_threadsafe(commit)  # the commit lands even if nobody awaits it

        threading.Thread(target=work, daemon=True).start()
        return await asyncio.shield(future)


async def test_a_write_in_flight_when_the_run_is_cancelled_is_still_seen_by_the_run() -> None:
    """Cancel while the model's TOOL_CALL is being committed: the call lands in the journal
    anyway, so the cancelled run must answer it (an orphan result), not lose track of it."""
    journal = ThreadedJournal(latency=0.1, slow_types={EventType.TOOL_CALL})
    rt = LocalRuntime(provider=DemoProvider(delay=0), journal=journal)
    sid = await rt.create_session()
    task = asyncio.create_task(rt.send(sid, "time"))
    for _ in range(500):
        if EventType.TOOL_CALL in journal.begun:
            break
        await asyncio.sleep(0.002)
    await rt.cancel(sid)
    outcome = await task
    assert outcome.type is EventType.INVOCATION_CANCELLED
    envelopes = journal.read(sid)
    (call_env,) = of_type(envelopes, EventType.TOOL_CALL)
    (result,) = of_type(envelopes, EventType.TOOL_RESULT)
    assert result.payload["tool_call_id"] == call_env.payload["tool_call_id"]
    assert call_env.seq < result.seq < outcome.seq
    assert envelopes[-1] == outcome


@pytest.mark.parametrize(
    ("type", "payload", "reason"),
    [
        (EventType.MESSAGE_DELTA, {"message_id": "m1", "text": 5}, "payload.text must be a string"),
        (EventType.MESSAGE_DELTA, {"message_id": "m1", "txt": "hi"}, "unknown key"),
        (EventType.TOOL_RESULT, {"tool_call_id": "c1", "name": "t", "content": "a\x00b"}, "NUL"),
        (EventType.STEER_RECEIVED, {"text": "\ud800"}, "lone surrogate"),
        (EventType.MESSAGE_END, {"message_id": "m1", "usage": {"input_tokens": 10**30}}, "out of bounds"),
        (EventType.MESSAGE_END, {"message_id": "m1", "usage": {"output_tokens": -1}}, "output_tokens must be"),
        (EventType.TOOL_CALL, {"message_id": "m1", "tool_call_id": "c1", "name": "t", "arguments": {}}, "arguments"),
    ],
)
async def test_the_writer_refuses_a_payload_that_breaks_the_journals_rules(
    type: EventType, payload: dict[str, Any], reason: str
) -> None:
    journal = MemoryJournal()
    writer, sid, _ = new_writer(journal)
    with pytest.raises(InvalidEvent, match=reason):
        await writer.append(writer.event(type, payload))
    assert journal.read(sid) == []
    # The writer goes on: a good event after a refused one is written.
    await writer.emit(EventType.MESSAGE_START, {"message_id": "m1", "role": "assistant"})
    assert types_of(journal.read(sid)) == ["MESSAGE_START"]


#: One event of each type only the platform journals, as a handler might forge it.
PEOPLE_ONLY_EVENTS = [
    NewEvent(EventType.APPROVAL_VOTED, {"ask_id": "ask_1", "approver": "mallory", "verdict": "allow_once"}),
    NewEvent(EventType.INVOCATION_STARTED, {"reason": {"kind": "approval_decision", "ask_id": "ask_1"}}, "inv_2"),
    NewEvent(EventType.SESSION_CREATED, {"title": "forged"}),
]


async def queue_soon_behind_deltas(writer: InvocationWriter, event: NewEvent) -> None:
    await writer.delta("m1", text="a")  # in flight
    await writer.delta("m1", text="b")  # buffered
    writer.append_soon(writer.event(EventType.MESSAGE_END, {"message_id": "m1", "finish_reason": "stop"}), event)


@pytest.mark.parametrize("event", PEOPLE_ONLY_EVENTS, ids=lambda e: e.type.value)
@pytest.mark.parametrize("way", ["append", "append_batch", "emit", "append_soon", "append_soon_behind_deltas", "hold"])
async def test_every_way_into_the_journal_refuses_what_only_people_journal(way: str, event: NewEvent) -> None:
    journal = SlowJournal(latency=0.005)
    writer, sid, _ = new_writer(journal)
    start = writer.event(EventType.MESSAGE_START, {"message_id": "m0", "role": "assistant"})
    with pytest.raises(PermissionError, match=f"cannot journal {event.type.value}"):
        if way == "append":
            await writer.append(event)
        elif way == "append_batch":  # a refused event takes its whole batch with it
            await writer.append(start, event)
        elif way == "emit":
            await writer.emit(event.type, event.payload)
        elif way == "append_soon":
            writer.append_soon(event)
        elif way == "hold":
            writer.hold(event)
        else:
            await queue_soon_behind_deltas(writer, event)
    await writer.flush()  # nothing refused is waiting to surface later either
    assert event.type not in [e.type for e in journal.read(sid)]
    assert [e.type for e in journal.read(sid)] == ([EventType.MESSAGE_DELTA] * 2 if "deltas" in way else [])


@pytest.mark.parametrize("event", PEOPLE_ONLY_EVENTS, ids=lambda e: e.type.value)
async def test_the_write_door_refuses_what_reached_the_buffer_another_way(event: NewEvent) -> None:
    journal = MemoryJournal()
    writer, sid, _ = new_writer(journal)
    writer._buffer.append(event)  # past the public methods' checks
    with pytest.raises(PermissionError, match=f"cannot journal {event.type.value}"):
        await writer.flush()
    assert journal.read(sid) == []


async def test_a_handler_cannot_vote_through_append_soon(demo: DemoProvider) -> None:
    refused: list[Exception] = []

    async def handler(ctx: Any) -> None:
        try:
            ctx.writer.append_soon(PEOPLE_ONLY_EVENTS[0])
        except PermissionError as exc:
            refused.append(exc)
        async with ctx.message() as message:
            await message.text("still here")

    rt = LocalRuntime(handler=handler, provider=demo)
    sid = await rt.create_session()
    ended = await rt.send(sid, "hi")
    assert ended.type is EventType.INVOCATION_COMPLETED
    assert [str(e) for e in refused] == ["an invocation cannot journal APPROVAL_VOTED"]
    assert "APPROVAL_VOTED" not in types_of(rt.journal.read(sid))


def _ends(calls: list[list[NewEvent]]) -> list[tuple[str, str | None]]:
    return [(e.payload["message_id"], e.text) for call in calls for e in call if e.type is EventType.MESSAGE_END]


class RecordingFailingJournal(FailingJournal):
    def __init__(self, fail_on: set[int], error: BaseException) -> None:
        super().__init__(fail_on, error)
        self.calls: list[list[NewEvent]] = []

    async def append(self, session_id: str, events: Sequence[NewEvent], *, fence: Any = None) -> list[Envelope]:
        self.calls.append(list(events))
        return await super().append(session_id, events, fence=fence)


def _start(message_id: str) -> NewEvent:
    return NewEvent(EventType.MESSAGE_START, {"message_id": message_id, "role": "assistant"}, "inv_1")


async def test_a_reply_end_carries_the_text_its_writer_journaled_since_the_newest_start() -> None:
    """NewEvent.text of a MESSAGE_END: its message's delta text since the newest
    MESSAGE_START this writer journaled (what a journal reads back); None before any."""
    journal = SlowJournal(latency=0.001)
    writer, sid, _ = new_writer(journal)
    await writer.delta("m0", text="before any start ")
    await writer.emit(EventType.MESSAGE_END, {"message_id": "m0"})
    await writer.append(_start("m1"))
    for word in ("one ", "two ", "three"):
        await writer.delta("m1", text=word)
    await writer.delta("m1", reasoning="not searched")
    await writer.emit(EventType.MESSAGE_END, {"message_id": "m1"})
    await writer.append(_start("m2"))
    await writer.delta("m1", text="late for m1 ")
    await writer.append(_start("m3"))  # a newer start: only what follows it counts
    await writer.delta("m2", text="after m3's start")
    await writer.emit(EventType.MESSAGE_END, {"message_id": "m2"})
    await writer.emit(EventType.MESSAGE_END, {"message_id": "m3"})
    assert _ends(journal.calls) == [
        ("m0", None),
        ("m1", "one two three"),
        ("m2", "after m3's start"),
        ("m3", ""),
    ]
    assert delta_text(of_type(journal.read(sid), EventType.MESSAGE_DELTA)).startswith("before any start one two three")


async def test_a_writer_whose_write_failed_gives_no_reply_text() -> None:
    """A failed write may have landed all the same: the writer knows no text any more."""
    journal = RecordingFailingJournal({3}, RuntimeError("the database went away"))
    writer, _sid, _ = new_writer(journal)
    await writer.append(_start("m1"))
    await writer.delta("m1", text="kept ")
    with contextlib.suppress(RuntimeError):
        await writer.delta("m1", text="lost? ")
        await writer.flush()
    await writer.append(_start("m2"))
    await writer.delta("m2", text="fine")
    await writer.emit(EventType.MESSAGE_END, {"message_id": "m2"})
    assert _ends(journal.calls) == [("m2", None)]


def test_a_lone_delta_is_journaled_as_the_merge_of_several_would_be() -> None:
    """One buffered delta (an idle stream's chunk) takes a shortcut through the merge: its
    event is the one the merge of a batch makes, for text and for reasoning alike."""
    writer = InvocationWriter(MemoryJournal(), "ses_1", "inv_1")
    (text,) = writer._merge([("msg_1", "text", "hi")])
    (reasoning,) = writer._merge([("msg_1", "reasoning", "hmm")])
    assert text == NewEvent(EventType.MESSAGE_DELTA, {"message_id": "msg_1", "text": "hi"}, "inv_1")
    assert reasoning == NewEvent(EventType.MESSAGE_DELTA, {"message_id": "msg_1", "reasoning": "hmm"}, "inv_1")
    # The same as the loop's: a batch of two messages' deltas, each one event.
    first, second = writer._merge([("msg_1", "text", "hi"), ("msg_2", "reasoning", "hmm")])
    assert (first, second) == (
        text,
        NewEvent(EventType.MESSAGE_DELTA, {"message_id": "msg_2", "reasoning": "hmm"}, "inv_1"),
    )
    start = NewEvent(EventType.MESSAGE_START, {"message_id": "msg_1", "role": "assistant"}, "inv_1")
    assert writer._merge([start]) == [start]  # a queued event is no delta
