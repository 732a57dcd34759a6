"""InvocationWriter: one invocation's door to the journal, with delta coalescing.

Every append of an invocation goes through its writer, bound to the session, the
invocation and the worker's fence. Text and reasoning deltas are coalesced: the first
delta after a quiet moment is written at once (an idle stream is never delayed), and
while that write is in flight, further deltas gather in a buffer and go out as one
envelope when it returns. Under load the envelope count therefore drops by itself.
Any other event waits for buffered deltas first, so journal order is emission order.
An event `hold` keeps back (a message's MESSAGE_END) goes out in the same write as the
invocation's next event instead of a write of its own, or alone after `HOLD_SECONDS`.
Writes are serialised (one journal round trip at a time), and once the invocation's
terminal event is written the writer is closed: a late write (a `def` handler's thread
that outlived a cancel, say) raises instead of landing after the end.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from sectr.events import TERMINAL_TYPES, Envelope, EventType
from sectr.journal import Journal, NewEvent
from sectr.payloads import check_event

#: What only the platform journals on a person's (or the expiry policy's) behalf.
PEOPLE_ONLY_TYPES = frozenset({EventType.INVOCATION_STARTED, EventType.APPROVAL_VOTED, EventType.SESSION_CREATED})

#: How long `hold` keeps an event back, waiting for the invocation's next event to share
#: its write, before it goes out alone. A reply's MESSAGE_END is followed at once by the
#: terminal event (or a tool call's TOOL_STARTED): held, it shares that append, one
#: journal transaction (two statements, a publication) fewer per run. The bound keeps
#: a handler that does something slow after `end()` from keeping the end back long.
HOLD_SECONDS = 0.25


def refuse_people_only(events: Iterable[NewEvent]) -> None:
    """PermissionError when `events` hold a type only the platform journals.

    Decisions and votes come from people (and the expiry policy) through the platform's
    actions, never from inside a run: a handler, a tool or the model cannot approve its
    own call, start an invocation or create a session.
    """
    for event in events:
        # The member as it is (the Enum call per event was a cost of every streamed chunk).
        kind = event.type if type(event.type) is EventType else EventType(event.type)
        if kind in PEOPLE_ONLY_TYPES:
            raise PermissionError(f"an invocation cannot journal {kind.value}")


class InvocationWriter:
    def __init__(
        self,
        journal: Journal,
        session_id: str,
        invocation_id: str,
        *,
        fence: Any = None,
        on_append: Callable[[list[Envelope]], None] | None = None,
    ) -> None:
        self.journal = journal
        self.session_id = session_id
        self.invocation_id = invocation_id
        self.fence = fence
        self._on_append = on_append
        # (message_id, kind, text) for a delta, or a whole event queued by `append_soon`
        self._buffer: list[tuple[str, str, str] | NewEvent] = []
        #: the write under way: a drain task, or the future of `_write_soon`'s write
        self._flusher: asyncio.Future[None] | None = None
        self._error: BaseException | None = None
        self._write_lock = asyncio.Lock()
        self._inflight: set[asyncio.Task[list[Envelope]]] = set()
        self.closed = False  # the terminal event is written: nothing more may be
        #: Events `hold` keeps back for the next write (always the newest emitted: a
        #: delta or queued event after them sends them to the buffer first), and the
        #: timer that sends them out alone.
        self._held: list[NewEvent] = []
        self._hold_timer: asyncio.TimerHandle | None = None
        #: The text deltas this writer journaled since its newest MESSAGE_START, by message
        #: id (`_reply_texts`); None before its first MESSAGE_START, and for good after a
        #: write that failed (it may have landed all the same).
        self._since_start: dict[str, list[str]] | None = None
        self._texts_known = True
        self.appends = 0  # journal round trips, for tests and benchmarks
        #: The journal's `submit(session_id, events, fence=...)`, where it has one: an
        #: append queued at once, its future returned (see `_write_soon`).
        self._submit: Callable[..., asyncio.Future[list[Envelope]]] | None = getattr(journal, "submit", None)

    async def append(self, *events: NewEvent) -> list[Envelope]:
        """Append events atomically after any buffered deltas (and in one write with the
        events `hold` kept back, which go first); their envelopes."""
        refuse_people_only(events)  # before the flush: a refused batch waits for nothing
        held = self._take_held()  # out of the timer's reach while the flush waits
        await self.flush()
        if not held:
            return await self._write(events)
        return (await self._write([*held, *events]))[len(held) :]

    def hold(self, *events: NewEvent) -> None:
        """Queue events to go out with the invocation's next write: `append`'s (in the
        same journal append, first), the deltas' or `flush`'s, or on their own after
        `HOLD_SECONDS`. Checked now, as `append_soon`'s; like a delta's, their write's
        error is raised by the writer's next call."""
        refuse_people_only(events)
        self._raise_pending_error()
        self._check_open()
        for event in events:
            check_event(event.type, event.payload, event.invocation_id)
        self._held.extend(events)
        if self._hold_timer is None:
            self._hold_timer = asyncio.get_running_loop().call_later(HOLD_SECONDS, self._hold_expired)

    def _take_held(self) -> list[NewEvent]:
        held, self._held = self._held, []
        if self._hold_timer is not None:
            self._hold_timer.cancel()
            self._hold_timer = None
        return held

    def _release_held(self) -> None:
        """The held events to the buffer (behind what it holds), before anything newer."""
        if self._held:
            self._buffer.extend(self._take_held())

    def _hold_expired(self) -> None:
        self._hold_timer = None
        if not self._held or self.closed:
            return
        if (self._flusher is not None and not self._flusher.done()) or self._inflight or self._write_lock.locked():
            # A write under way: the held events may yet share the next one.
            self._hold_timer = asyncio.get_running_loop().call_later(HOLD_SECONDS, self._hold_expired)
            return
        self._release_held()
        if not self._write_soon():
            self._flusher = asyncio.ensure_future(self._drain())

    async def emit(self, type: EventType, payload: dict[str, Any]) -> Envelope:
        (envelope,) = await self.append(NewEvent(type, payload, self.invocation_id))
        return envelope

    def append_soon(self, *events: NewEvent) -> None:
        """Queue events behind the buffered deltas without waiting for the journal.

        For code on the event loop's thread that cannot await (a sync `ctx.execute` in an
        async handler): the events are written, in order, by the same task that writes
        the deltas, and the next `flush` (every `append` starts with one) waits for them
        and raises the error of a failed write.
        """
        refuse_people_only(events)  # at the call, not later in the background write
        self._raise_pending_error()
        self._check_open()
        self._release_held()
        self._buffer.extend(events)
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._drain())

    def event(self, type: EventType, payload: dict[str, Any]) -> NewEvent:
        return NewEvent(type, payload, self.invocation_id)

    async def delta(self, message_id: str, *, text: str = "", reasoning: str = "") -> None:
        """Buffer a delta; it reaches the journal at once unless a write is in flight."""
        self._raise_pending_error()
        self._check_open()
        if self._held:
            self._release_held()
        if reasoning:
            self._buffer.append((message_id, "reasoning", reasoning))
        if text:
            self._buffer.append((message_id, "text", text))
        if (self._flusher is None or self._flusher.done()) and not self._write_soon():
            self._flusher = asyncio.create_task(self._drain())
        # Yield once so an idle stream's delta is written before the producer goes on
        # (queued already when `_write_soon` took it), and so that a producer whose
        # chunks never wait (a buffered HTTP stream) still lets the loop run between two.
        await asyncio.sleep(0)

    async def flush(self, *, keep_held: bool = False) -> None:
        """Wait until every buffered delta (and held event, unless `keep_held`: they go
        with the next `append`) is written (or raise the error that stopped it)."""
        if not keep_held:
            self._release_held()
        while True:
            if self._flusher is not None and not self._flusher.done():
                # Shielded: a cancelled producer must not cut a journal write in half.
                await asyncio.shield(self._flusher)
            elif self._buffer:
                # One drainer at a time: a delta arriving while we drain joins this task.
                self._flusher = asyncio.create_task(self._drain())
            elif self._inflight:
                # Writes whose producer was cancelled mid-append (see _write) finish first,
                # so whoever flushes sees everything the journal holds.
                done, _ = await asyncio.wait(set(self._inflight))
                for task in done:
                    if not task.cancelled() and task.exception() is not None and self._error is None:
                        self._error = task.exception()
            else:
                break
        self._raise_pending_error()

    def discard(self) -> None:
        """Forget buffered deltas (a fenced writer must not write again)."""
        self._take_held()
        self._buffer.clear()
        if self._flusher is not None:
            self._flusher.cancel()

    async def _drain(self) -> None:
        try:
            while self._buffer:
                batch, self._buffer = self._buffer, []
                # Directly, not through _write: this task is not the producer (a cancelled
                # producer does not cancel it), and one task hop less keeps an idle
                # stream's delta in the journal before delta() returns.
                await self._write_now(self._merge(batch))
        except BaseException as exc:  # kept for the producer: it raises on its next call
            self._error = exc
            self._buffer.clear()

    def _write_soon(self) -> bool:
        """Write the buffer as `_drain` would, without a task: where the journal can queue
        an append at once (`submit`: the database journal's group commit) and no other
        write is under way, the batch is checked and queued now and the rest follows
        from its future (`_written`); False (nothing done) otherwise.

        A task per streamed chunk (and its coroutines down to the group commit's queue)
        was a tenth of a worker's CPU per chunk (py-spy, bench/run_lifecycle.py
        --ticks 30). Everything else is as the
        task's write: one write at a time (`flush` waits for this one's future, a write
        under the lock or in flight sends the batch to the task), the same checks, the
        same bookkeeping when it lands, an error kept for the producer's next call.
        """
        submit = self._submit
        if submit is None or self._write_lock.locked() or self._inflight or not self._buffer:
            return False
        batch, self._buffer = self._buffer, []
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._flusher = done
        try:
            merged = self._merge(batch)
            self._check_open()
            refuse_people_only(merged)  # as in _write_now
            for event in merged:
                check_event(event.type, event.payload, event.invocation_id)
            written = submit(self.session_id, self._reply_texts(merged), fence=self.fence)
        except BaseException as exc:  # kept for the producer: it raises on its next call
            self._error = exc
            self._buffer.clear()
            done.set_result(None)
            return True
        written.add_done_callback(functools.partial(self._written, done))
        return True

    def _written(self, done: asyncio.Future[None], written: asyncio.Future[list[Envelope]]) -> None:
        """`_write_soon`'s write landed (or failed): what `_write_now` does after the
        journal's append, then the deltas buffered meanwhile go out, and then `done`."""
        try:
            envelopes = written.result()
            if done.cancelled():  # discarded meanwhile, as a cancelled drain task
                raise asyncio.CancelledError
        except BaseException as exc:
            self._texts_known, self._since_start = False, None
            self._error = exc
            self._buffer.clear()
        else:
            try:
                self._landed(envelopes)
            except BaseException as exc:
                self._error = exc
                self._buffer.clear()
        if self._buffer and self._error is None and not self._write_soon():
            self._flusher = asyncio.ensure_future(self._drain())
        if not done.done():
            done.set_result(None)

    def _merge(self, batch: list[tuple[str, str, str] | NewEvent]) -> list[NewEvent]:
        if len(batch) == 1 and type(batch[0]) is tuple:
            # One delta (an idle stream's chunk, the most frequent write): its event as
            # the loop below makes it, without the loop's dict of lists (a quarter fewer
            # instructions, callgrind).
            message_id, kind, text = batch[0]
            payload = {"message_id": message_id, kind: text}
            return [NewEvent(EventType.MESSAGE_DELTA, payload, self.invocation_id)]
        merged: list[NewEvent] = []
        current_id: str | None = None
        parts: dict[str, list[str]] = {}
        for item in batch:
            if isinstance(item, NewEvent):  # a queued event: the deltas before it go first
                if current_id is not None:
                    merged.append(self._delta_event(current_id, parts))
                current_id, parts = None, {}
                merged.append(item)
                continue
            message_id, kind, text = item
            if message_id != current_id:
                if current_id is not None:
                    merged.append(self._delta_event(current_id, parts))
                current_id, parts = message_id, {}
            parts.setdefault(kind, []).append(text)
        if current_id is not None:
            merged.append(self._delta_event(current_id, parts))
        return merged

    def _delta_event(self, message_id: str, parts: dict[str, list[str]]) -> NewEvent:
        payload: dict[str, Any] = {"message_id": message_id}
        if "text" in parts:
            payload["text"] = "".join(parts["text"])
        if "reasoning" in parts:
            payload["reasoning"] = "".join(parts["reasoning"])
        return NewEvent(EventType.MESSAGE_DELTA, payload, self.invocation_id)

    async def _write(self, events: Sequence[NewEvent]) -> list[Envelope]:
        # A write, once begun, is seen through even if the caller is cancelled: a database
        # append running in a thread commits regardless, and the invocation must still
        # learn what it wrote (its transcript: which tool calls are open, which message).
        task = asyncio.ensure_future(self._write_now(events))
        self._inflight.add(task)
        task.add_done_callback(self._inflight.discard)
        return await asyncio.shield(task)

    async def _write_now(self, events: Sequence[NewEvent]) -> list[Envelope]:
        async with self._write_lock:
            self._check_open()
            # The door every write of the writer passes (append, emit, append_soon, the
            # deltas' drain): what the public methods refused at the call, refused here
            # too, whatever way an event reached the buffer.
            refuse_people_only(events)
            for event in events:
                # What a handler, a tool or the model produced follows the journal's rules
                # (the import checks a file with the same rules): a malformed payload is
                # refused here with its reason, never stored for the fold to trip on.
                check_event(event.type, event.payload, event.invocation_id)
            events = self._reply_texts(events)
            try:
                envelopes = await self.journal.append(self.session_id, events, fence=self.fence)
            except BaseException:
                self._texts_known, self._since_start = False, None
                raise
            self._landed(envelopes)
            return envelopes

    def _landed(self, envelopes: list[Envelope]) -> None:
        """The bookkeeping after a write landed, whichever path wrote it (`_write_now`,
        `_written`): counted, its texts followed, closed by a terminal event, reported."""
        self.appends += 1
        self._follow_texts(envelopes)
        for envelope in envelopes:  # a loop, not any() over a generator: once per chunk
            if envelope.type in TERMINAL_TYPES:
                self.closed = True
                break
        if self._on_append is not None:
            self._on_append(envelopes)

    def _follow_texts(self, envelopes: list[Envelope]) -> None:
        if not self._texts_known:
            return
        for envelope in envelopes:
            if envelope.type is EventType.MESSAGE_START:
                self._since_start = {}
            elif envelope.type is EventType.MESSAGE_DELTA and self._since_start is not None:
                message_id, text = envelope.payload.get("message_id"), envelope.payload.get("text")
                if isinstance(message_id, str) and text:
                    self._since_start.setdefault(message_id, []).append(str(text))

    def _reply_texts(self, events: Sequence[NewEvent]) -> Sequence[NewEvent]:
        """`events` with each MESSAGE_END's `text`, where this writer knows it: the text
        of the deltas of its message journaled since the newest MESSAGE_START, which this
        writer journaled (a session has one writer at a time: its run's lease), every
        write since having succeeded. That is what a journal reading the message's text
        back from its deltas finds (sessions_app's search index reads the deltas after
        the newest MESSAGE_START). Not in a batch that also starts a message or holds
        deltas."""
        if self._since_start is None:
            return events
        for event in events:  # a loop, not any() over a generator: once per chunk
            if event.type is EventType.MESSAGE_END:
                break
        else:
            return events
        if any(e.type in (EventType.MESSAGE_START, EventType.MESSAGE_DELTA) for e in events):
            return events
        since = self._since_start
        return [
            NewEvent(e.type, e.payload, e.invocation_id, "".join(since.get(e.payload["message_id"], ())))
            if e.type is EventType.MESSAGE_END and isinstance(e.payload.get("message_id"), str)
            else e
            for e in events
        ]

    def _check_open(self) -> None:
        if self.closed:
            raise RuntimeError(f"invocation {self.invocation_id} has ended: nothing more can be journaled for it")

    def _raise_pending_error(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise error
