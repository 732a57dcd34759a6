"""Server-Sent Events for one run: replay from the journal, then follow it live.

`GET /api/v1/runs/{run_id}/events` streams the run's SDK events (sessions_app.api.events):
``id:`` is the envelope's seq, ``event:`` the kind, ``data:`` the event as JSON. A
reconnecting client sends ``Last-Event-ID`` (or ``?after=``) and gets exactly the events
after that seq: nothing lost, nothing twice. The stream ends after the run's ``result``.

How nothing falls between replay and live: the stream joins the session's channel-layer
group *before* it reads the journal, then handles every envelope in seq order, keeping
a cursor (the last seq it examined). A live envelope at or below the cursor is a
duplicate and skipped; one beyond ``cursor + 1`` means the layer dropped something (it
delivers at most once), so the journal is read again from the cursor. When the layer is
quiet the journal is polled every few seconds anyway (a dropped *last* message would
otherwise leave the stream waiting), and a ``: ping`` comment goes out every 15 seconds
so proxies keep an idle stream open. When the database goes away mid-stream (a restart),
the stream ends with a ``retry:`` field and the client reconnects with its Last-Event-ID;
before the stream starts, the API answers 503 with Retry-After. The same when the channel
layer cannot join the stream to its groups (Redis away for longer than its connections
retry): an error escaping a stream whose 200 went out already would leave the client
waiting on an open response that never ends.

The stream a `POST /sessions/{id}/runs` answers with joins the group before the post
itself (RunStream.joined_before_run): the run's envelopes all come after the join, so it
takes them from the layer and reads the journal only on a gap or a quiet spell.

Every journal read starts at the run's first envelope, whatever the client asked for:
the run's ``result`` (its text and usage) is computed from all its envelopes, and events
at or below the client's cursor are simply not sent.

Access is re-checked while the stream is open, as for websockets (sessions_app.socket_access:
the same signals, the same safety net): the stream also listens on its user's access
group, and when the bearer token is revoked, the user deactivated or deleted, or they can
no longer read the session (a team role lost, the session deleted), it sends nothing more
and ends. A client that reconnects then gets the 401 or 404 that explains why.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import operator
import threading
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from channels.layers import get_channel_layer
from django.conf import settings

from sectr.errors import JournalUnavailable
from sectr.events import Envelope, EventType
from sessions_app.access import can_read
from sessions_app.api.errors import DATABASE_RETRY_SECONDS, LAYER_RETRY_SECONDS, ChannelLayerUnavailable
from sessions_app.api.events import RunEvents, format_sse, result_payload, sdk_event
from sessions_app.dbthread import run_in_db_thread
from sessions_app.journal.publish import ENVELOPES_MESSAGE_TYPE, session_group
from sessions_app.models import ApiToken, Run, Session
from sessions_app.models import Envelope as EnvelopeRow
from sessions_app.socket_access import AccessWatch, is_access_changed, user_access_group
from sessions_app.telemetry.metrics import SSE_CLIENTS

POLL_SECONDS = 3.0
#: Messages a stream holds unread at most (see RunStream._read_layer).
INBOX_MAX = 1000
READ_PAGE = 1000
#: The stream's last frame when the database went away: reconnect (with Last-Event-ID) soon.
DATABASE_LOST_FRAME = b": the database is unavailable\nretry: %d\n\n" % (DATABASE_RETRY_SECONDS * 1000)
#: The same when the channel layer failed the stream (see the module docstring).
LAYER_LOST_FRAME = b": live updates are unavailable\nretry: %d\n\n" % (LAYER_RETRY_SECONDS * 1000)

log = logging.getLogger("sectr.api")
envelope_seq = operator.attrgetter("seq")


def read_envelopes(session_id: str, after_seq: int, limit: int = READ_PAGE) -> list[Envelope]:
    """Up to `limit` of the session's envelopes after `after_seq`, in seq order (sync)."""
    rows = (
        EnvelopeRow.objects.filter(session_id=session_id, seq__gt=after_seq)
        .order_by("seq")
        .values_list("seq", "invocation_id", "type", "payload", "created_at")[:limit]
    )
    return [Envelope(session_id, seq, inv, EventType(kind), payload, at) for seq, inv, kind, payload, at in rows]


def run_tracker(run: Run) -> RunEvents:
    return RunEvents(
        run.pk, set(run.invocation_ids or ([run.invocation_id] if run.invocation_id else [])), run.start_seq or 1
    )


def first_cursor(run: Run) -> int:
    """The cursor before a run's first envelope (its prompt's title update may precede it)."""
    return max((run.start_seq or 1) - 2, 0)


def replay_run(run: Run) -> RunEvents:
    """Feed a run's envelopes, as far as the journal has them, through a tracker (sync)."""
    tracker = run_tracker(run)
    cursor = first_cursor(run)
    while not tracker.finished:
        envelopes = read_envelopes(run.session_id, cursor)
        if not envelopes:
            break
        tracker.feed_all(envelopes)
        cursor = envelopes[-1].seq
    return tracker


#: Why a stream's access ended (the websockets' close codes, for the log).
TOKEN_GONE = 4401
SESSION_GONE = 4404


def stream_access_now(token_id: int | None, session_id: str) -> int | None:
    """None while the holder of token `token_id` may still read the session (sync); else
    why not: the token is revoked or gone, or its user inactive (TOKEN_GONE), or the
    user can no longer read the session, or it was deleted (SESSION_GONE)."""
    token = ApiToken.objects.select_related("user").filter(pk=token_id).first() if token_id is not None else None
    if token is None or token.revoked_at is not None or not token.user.is_active:
        return TOKEN_GONE
    session = Session.objects.filter(pk=session_id).first()
    if session is None or not can_read(token.user, session):
        return SESSION_GONE
    return None


class RunStream:
    """One client's stream of one run (see the module docstring), for the holder of API
    token `token` (None: no re-checks, for callers that are not a token's)."""

    def __init__(self, run: Run, after: int, token: ApiToken | None = None) -> None:
        self._setup(run.session_id, after, token)
        self._follow_run(run)

    @classmethod
    async def joined_before_run(cls, session_id: str, token: ApiToken | None = None) -> RunStream:
        """A stream that joins the session's group now, before the run it will stream is
        posted (`of_posted_run`): every envelope the post appends then reaches it through
        the layer, so it starts without reading the journal. With the (admitted) `token`
        it joins its user's access group in the same step, which `frames` would join
        otherwise. `close()` it if no run comes."""
        stream = cls.__new__(cls)
        stream._setup(session_id, 0, token)
        await stream._join(stream._groups())
        return stream

    @classmethod
    def to_join_before_run(cls, session_id: str) -> RunStream:
        """`joined_before_run`'s stream, joined later from the database thread that admits
        the request and posts the run (`join_from_thread`): one thread hop for the three
        steps, where admitting, joining and posting took two. `close()` it if no run comes."""
        stream = cls.__new__(cls)
        stream._setup(session_id, 0, None)
        return stream

    def join_from_thread(self, token: ApiToken, loop: asyncio.AbstractEventLoop) -> None:
        """(Sync, in a database thread, once `token` is admitted and before the post) Join
        the session's group and the token's user's access group on `loop`, and wait for
        it, as `joined_before_run` does. Nothing is joined after `close()`: a request cut
        short while its thread still worked leaves no group behind."""
        self._set_token(token)
        # A lock the loop releases once the join is done, not run_coroutine_threadsafe's
        # concurrent Future chained to the task: the same wait, and 39 -> 29 us of CPU
        # for the round trip (a loop of them from a thread, process time).
        joined = threading.Lock()
        joined.acquire()
        outcome: list[asyncio.Task[None]] = []

        def done(task: asyncio.Task[None]) -> None:
            outcome.append(task)
            joined.release()

        def join() -> None:
            try:
                task = loop.create_task(self._join_unless_closed())
            except BaseException:
                joined.release()  # outcome stays empty: the thread raises below
                raise
            task.add_done_callback(done)

        loop.call_soon_threadsafe(join)
        joined.acquire()
        if not outcome:
            raise ChannelLayerUnavailable("the event loop did not start the stream's join")
        outcome[0].result()  # its exception, if the join failed

    async def _join_unless_closed(self) -> None:
        if not self._closed:
            await self._join(self._groups())

    def of_posted_run(self, run: Run, token: ApiToken | None, posted: Sequence[Envelope] = ()) -> RunStream:
        """The stream of `run`, posted after `joined_before_run`, for the holder of `token`;
        `posted`: the envelopes the post committed (sessions_app.journal.publish's
        `collecting_commits`), if it has them, which the stream starts with."""
        self._set_token(token)
        self._follow_run(run)
        # The run's envelopes were appended after the join, so the layer carries them all
        # (a lost message shows as a gap and the journal is read). A run waiting behind
        # another one is read from the journal once it starts, as usual.
        self._live_from_start = run.start_seq is not None
        # The post's own batch, as committed: its message through the layer may come
        # after the worker's first one, a gap the journal would be read for; taken from
        # here, the layer's copy is a duplicate and skipped.
        self._posted: list[Envelope] = [envelope for envelope in posted if envelope.session_id == self.session_id]
        return self

    def _follow_run(self, run: Run) -> None:
        self.run = run
        self.tracker = run_tracker(run)
        self.cursor = first_cursor(run)

    def _setup(self, session_id: str, after: int, token: ApiToken | None) -> None:
        """What every stream of a session's journal holds (this class's and SessionStream's)."""
        self.session_id = session_id
        self.after = after
        self._set_token(token)
        self._live_from_start = False
        self._posted = []
        self._closed = False
        self._joined: list[str] = []
        self.revoked = False
        self.watch = AccessWatch(self._recheck, self._revoke, lambda: self.revoked)
        self.cursor = 0
        self.layer: Any = get_channel_layer()
        self.channel: str | None = None
        # One task receives from the layer for the stream's whole life and queues what it
        # gets in `_inbox`: cancelling a layer's receive on a timeout drops messages (the
        # pub/sub layer unsubscribes the channel when its receive is cancelled), and a
        # task plus an asyncio.wait per message was a good part of a stream's CPU per
        # chunk (bench/peers.py under py-spy). A layer that can hand each message over as
        # it reads it (the Redis layer's `new_listening_channel`) needs no task at all.
        self._reader: asyncio.Task[None] | None = None
        self._listening = False  # the layer delivers to `_deliver` (no reader task)
        self._inbox: collections.deque[dict[str, Any]] = collections.deque()
        # The stream's wait, when it waits: set by a message, a timeout or lost access.
        self._wakeup: asyncio.Future[None] | None = None
        # When the current wait times out, and the one timer that wakes it then (see
        # `_wait_until`).
        self._deadline = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self.group = session_group(session_id)

    def _set_token(self, token: ApiToken | None) -> None:
        self.token_id = token.pk if token is not None else None
        self.user_id = token.user_id if token is not None else None

    @property
    def finished(self) -> bool:
        """The stream has sent its last event (the run's result)."""
        return self.tracker.finished

    def _groups(self) -> list[str]:
        """The stream's groups: its session's, and its user's access group."""
        if self.user_id is None:
            return [self.group]
        return [self.group, user_access_group(self.user_id)]

    async def frames(self) -> AsyncIterator[bytes]:
        try:
            await self._join(self._groups())
            if self.token_id is not None:
                self.watch.start()
            with SSE_CLIENTS.track_inprogress():
                async for frame in self._frames():
                    if self.revoked:
                        break  # not one frame once access has gone
                    yield frame
        except JournalUnavailable:
            # The database went away mid-stream (a restart): the client reconnects after
            # `retry:` with its Last-Event-ID and misses nothing (the journal is the record).
            yield DATABASE_LOST_FRAME
        except ChannelLayerUnavailable as exc:
            log.warning("stream of session %s: the channel layer is unavailable: %s", self.session_id, exc.__cause__)
            yield LAYER_LOST_FRAME
        finally:
            await self.close()

    async def _join(self, groups: list[str]) -> None:
        """Join the groups not joined yet, on the stream's channel (made by the first join),
        and start reading the channel. ChannelLayerUnavailable when the layer failed."""
        if self.layer is None:
            return
        try:
            await self._join_layer(groups)
        except Exception as exc:
            raise ChannelLayerUnavailable("could not join the session's groups") from exc

    async def _join_layer(self, groups: list[str]) -> None:
        if self.channel is None:
            listen = getattr(self.layer, "new_listening_channel", None)
            if listen is not None:
                # The Redis layer hands each message to `_deliver` as it reads it: no
                # reader task, no queue (sectr_web.channel_layer).
                self.channel = await listen("sectr.sse.", self._deliver)
                self._listening = True
            else:
                # Only its groups send to a stream's channel: with the pub/sub layer, a
                # channel of groups only (no subscription of its own).
                new_channel = getattr(self.layer, "new_group_channel", self.layer.new_channel)
                self.channel = await new_channel("sectr.sse.")
                # Read from now on: cancelling the reader is also what unsubscribes the
                # channel from a pub/sub layer (see _read_layer), however the stream ends.
                self._reader = asyncio.get_running_loop().create_task(self._read_layer())
                self._reader.add_done_callback(lambda _task: self._wake())
        new = [group for group in groups if group not in self._joined]
        self._joined.extend(new)
        add_many = getattr(self.layer, "group_add_many", None)
        if add_many is not None:
            # One SUBSCRIBE for all of them (sectr_web.channel_layer).
            await add_many(new, self.channel)
            return
        for group in new:
            await self.layer.group_add(group, self.channel)

    async def close(self) -> None:
        """Stop the access watch, the channel's reader, and leave the groups."""
        self._closed = True
        await self.watch.stop()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._reader is not None:
            self._reader.cancel()
        if self._listening:
            self._listening = False
            self.layer.close_listening_channel(self.channel)
        joined, self._joined = self._joined, []
        discard_many = getattr(self.layer, "group_discard_many", None)
        if discard_many is not None:
            with contextlib.suppress(Exception):
                await discard_many(joined, self.channel)  # one UNSUBSCRIBE for all of them
            return
        for group in joined:
            with contextlib.suppress(Exception):
                await self.layer.group_discard(group, self.channel)

    async def _recheck(self) -> int | None:
        return await run_in_db_thread(stream_access_now, self.token_id, self.session_id)

    async def _revoke(self, code: int) -> None:
        self.revoked = True
        self._wake()  # out of its wait at once

    async def _frames(self) -> AsyncIterator[bytes]:
        yield b": stream of " + self.run.pk.encode() + b"\n\n"  # the headers go out at once
        if self.run.start_seq is None:  # queued behind another run: nothing journaled yet
            async for frame in self._wait_for_start():
                yield frame
            if self.run.start_seq is None:
                return
            self.tracker = run_tracker(self.run)
            self.cursor = first_cursor(self.run)
        async for frame in self._follow():
            yield frame

    async def _follow(self) -> AsyncIterator[bytes]:
        """The journal from the cursor, then live, until the stream is finished or revoked."""
        # Seconds of silence before a ``: ping`` comment.
        heartbeat = float(settings.SECTR_SSE_HEARTBEAT_SECONDS)
        last_write = time.monotonic()
        # Joined before the run's first append: the layer brings it all (no journal read),
        # after the post's own batch when the stream has it.
        if not self._live_from_start:
            frame = await self._catch_up()
        else:
            frame = await self._take_envelopes(self._posted) if self._posted else b""
        if frame:
            yield frame
            last_write = time.monotonic()
        while not self.finished and not self.revoked:
            message = await self._receive(min(POLL_SECONDS, max(heartbeat - (time.monotonic() - last_write), 0.1)))
            if self.revoked:
                return
            if message is None:
                frame = await self._catch_up()  # the layer may have dropped the newest appends
            else:
                frame = await self._handle_live(message)
                # Messages already received go out in the same write: no wait added.
                while self._inbox and not self.finished and not self.revoked:
                    if (message := self._take()) is not None:
                        frame += await self._handle_live(message)
            if frame:
                yield frame
                last_write = time.monotonic()
            elif time.monotonic() - last_write >= heartbeat:
                yield b": ping\n\n"
                last_write = time.monotonic()

    async def _receive(self, wait: float) -> dict[str, Any] | None:
        """The next message for the stream (None after `wait` seconds, or once access has
        gone); an `access.changed` one is handed to the access watch and reads as None."""
        if self.revoked:
            return None
        if not self._inbox:
            self._raise_if_layer_failed()
            await self._wait_until(asyncio.get_running_loop(), wait)
            if self.revoked:
                return None
            if not self._inbox:
                self._raise_if_layer_failed()
                return None
        return self._take()

    async def _wait_until(self, loop: asyncio.AbstractEventLoop, wait: float) -> None:
        """Wait for `_wake`, or `wait` seconds.

        A timer armed and cancelled for each wait was one per streamed chunk per stream
        (a handle made, pushed on the loop's heap and popped again: a few percent of a
        Daphne's CPU while streaming, py-spy under bench/peers.py). Here the stream's one
        timer stays armed across waits: a wait that ends sooner than the timer's moves it
        earlier; a timer that fires before the current wait's end re-arms itself for it."""
        self._deadline = deadline = loop.time() + wait
        if self._timer is None or self._timer.when() > deadline:
            if self._timer is not None:
                self._timer.cancel()
            self._timer = loop.call_at(deadline, self._on_timer, loop, deadline)
        self._wakeup = loop.create_future()
        try:
            await self._wakeup
        finally:
            self._wakeup = None

    def _on_timer(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        self._timer = None
        if self._wakeup is None:
            return  # no wait now: the next one arms the timer again
        if self._deadline <= when:
            self._wake()
        else:
            self._timer = loop.call_at(self._deadline, self._on_timer, loop, self._deadline)

    def _raise_if_layer_failed(self) -> None:
        """ChannelLayerUnavailable, once the layer's receive failed: the stream ends."""
        if self._reader is not None and self._reader.done():
            try:
                self._reader.result()
            except Exception as exc:
                raise ChannelLayerUnavailable("the channel layer's receive failed") from exc

    def _take(self) -> dict[str, Any] | None:
        """The oldest message received (the inbox is not empty); None for an access one."""
        message = self._inbox.popleft()
        if is_access_changed(message):
            self.watch.changed()
            return None
        return message

    def _wake(self) -> None:
        if self._wakeup is not None and not self._wakeup.done():
            self._wakeup.set_result(None)

    async def _read_layer(self) -> None:
        """The stream's one receive loop (see `_setup`), for a layer that cannot deliver."""
        assert self.channel is not None  # noqa: S101 - started only for a joined channel
        while True:
            self._deliver(await self.layer.receive(self.channel))

    def _deliver(self, message: dict[str, Any]) -> None:
        """Queue a message from the layer in `_inbox` and wake the stream. Beyond
        INBOX_MAX unread messages the oldest is dropped: the stream then sees a gap and
        reads the journal."""
        self._inbox.append(message)
        if len(self._inbox) > INBOX_MAX and is_access_changed(self._inbox.popleft()):
            self.watch.changed()  # never dropped: access is re-checked
        self._wake()

    async def _wait_for_start(self) -> AsyncIterator[bytes]:
        """Wait until a pending run is promoted (or cancelled before it started)."""
        heartbeat = float(settings.SECTR_SSE_HEARTBEAT_SECONDS)
        last_write = time.monotonic()
        while not self.revoked:
            run = await run_in_db_thread(Run.objects.get, pk=self.run.pk)
            self.run = run
            if run.start_seq is not None:
                return
            if run.status in Run.FINISHED_STATUSES:
                stop = run.stop_reason or ("cancelled" if run.status == Run.CANCELLED else "error")
                payload = result_payload(stop, "", {}, run.error or None)
                yield format_sse(sdk_event("result", run.pk, None, payload, ""))
                return
            await self._receive(1.0)
            if time.monotonic() - last_write >= heartbeat:
                yield b": ping\n\n"
                last_write = time.monotonic()

    def _process(self, envelopes: list[Envelope]) -> bytes:
        """Advance the cursor over contiguous envelopes; the frames of this run's events."""
        out: list[bytes] = []
        for envelope in envelopes:
            if envelope.seq != self.cursor + 1 or self.tracker.finished:
                break
            self.cursor = envelope.seq
            for event in self.tracker.feed(envelope):
                if envelope.seq > self.after:
                    out.append(format_sse(event))
        return b"".join(out)

    async def _catch_up(self) -> bytes:
        out: list[bytes] = []
        while not self.finished:
            envelopes = await run_in_db_thread(read_envelopes, self.session_id, self.cursor)
            before = self.cursor
            out.append(self._process(envelopes))
            if not envelopes or self.cursor == before:
                break
        return b"".join(out)

    async def _handle_live(self, message: dict[str, Any]) -> bytes:
        if message.get("type") != ENVELOPES_MESSAGE_TYPE:
            return b""
        try:
            envelopes = [Envelope.from_dict(e) for e in message.get("envelopes", [])]
        except (KeyError, TypeError, ValueError):
            return await self._catch_up()
        return await self._take_envelopes(envelopes)

    async def _take_envelopes(self, envelopes: list[Envelope]) -> bytes:
        """The frames of a batch of envelopes from the layer (or the post's own)."""
        if len(envelopes) > 1:  # a batch comes in seq order; sorted in case it does not
            envelopes.sort(key=envelope_seq)
        fresh = [e for e in envelopes if e.seq > self.cursor]
        if not fresh:
            return b""  # all seen already (replayed before this message was read)
        if fresh[0].seq != self.cursor + 1:
            if not self._opens_the_run(fresh):
                return await self._catch_up()  # a gap: the layer dropped a message
            self.cursor = fresh[0].seq - 1
        return self._process(fresh)

    def _opens_the_run(self, fresh: list[Envelope]) -> bool:
        """The first envelopes a stream joined before its run's post gets are the post's
        batch, with the run's start (and its prompt's title when it has one): the envelope
        before them, if any, is older than the run and none of its own."""
        return (
            self._live_from_start
            and self.cursor == first_cursor(self.run)
            and fresh[0].seq <= (self.run.start_seq or 0) <= fresh[-1].seq
        )


async def started(frames: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """`frames`, its first frame taken now: a stream that joined its groups before its
    response exists leaves them in its `finally`, which a generator never started would
    not run (a client gone before the first frame); a started one runs it when it ends,
    is cancelled, or is collected."""
    first = await anext(frames)

    async def then() -> AsyncIterator[bytes]:
        yield first
        async for frame in frames:
            yield frame

    return then()


def session_resume_point(session_id: str, after: int) -> tuple[Run | None, int]:
    """Where a session stream resuming after seq `after` starts (sync): the run that may
    be in progress at `after` (the newest one started by `after + 1`: a session's runs do
    not overlap), and the cursor to read the journal from: that run's first envelope, as
    a run stream does, so its ``result`` counts all its text (events at or below `after`
    are not sent)."""
    current = (
        Run.objects.filter(session_id=session_id, start_seq__isnull=False, start_seq__lte=after + 1)
        .order_by("-start_seq")
        .first()
    )
    return current, (min(first_cursor(current), after) if current is not None else after)


def runs_started_between(session_id: str, after_start: int, through: int) -> list[Run]:
    """The session's runs whose INVOCATION_STARTED is after seq `after_start` and at or
    before `through`, oldest first (sync)."""
    runs = Run.objects.filter(session_id=session_id, start_seq__gt=after_start, start_seq__lte=through)
    return list(runs.order_by("start_seq"))


def starts_a_run(envelope: Envelope) -> bool:
    """An envelope a run of its own may begin with (its prompt's title, its invocation)."""
    if envelope.type is EventType.INVOCATION_STARTED:
        return (envelope.payload.get("reason") or {}).get("kind") != "recover"
    return envelope.type is EventType.SESSION_UPDATED and "title" in envelope.payload


class SessionStream(RunStream):
    """One client's stream of every run of a session (`GET /sessions/{id}/events`): the
    run stream's events of each run in journal order, the same ``id:`` (the envelope's
    seq) and the same resumption (Last-Event-ID), with no end of its own.

    It follows the runs it knows (a RunEvents each). An envelope none of them takes that
    may begin a run (an INVOCATION_STARTED, a title) makes it read the session's newer
    Run rows first: a run's row is committed with its first envelopes, so once an
    envelope is read, its run can be. Envelopes of no run (a rename between runs, a vote)
    send nothing.
    """

    def __init__(self, session_id: str, after: int, token: ApiToken | None = None) -> None:
        self._setup(session_id, after, token)
        self.trackers: list[RunEvents] = []
        self.newest_start = 0  # the newest start_seq among the runs read so far
        self.runs_read_at = -1  # the cursor when the runs were last read
        self._need_runs = False

    @property
    def finished(self) -> bool:
        return False  # a session has no last run

    def _follow_runs(self, runs: list[Run]) -> None:
        for run in runs:
            self.trackers.append(run_tracker(run))
            self.newest_start = max(self.newest_start, run.start_seq or 0)

    async def _frames(self) -> AsyncIterator[bytes]:
        yield b": stream of " + self.session_id.encode() + b"\n\n"  # the headers go out at once
        current, self.cursor = await run_in_db_thread(session_resume_point, self.session_id, self.after)
        self._follow_runs([current] if current is not None else [])
        self.runs_read_at = self.cursor
        async for frame in self._follow():
            yield frame

    def _process(self, envelopes: list[Envelope]) -> bytes:
        """Like RunStream's, over every run; stops before an envelope that may begin a run
        not read yet (`_need_runs`: the caller reads the runs and goes on)."""
        out: list[bytes] = []
        for envelope in envelopes:
            if envelope.seq != self.cursor + 1:
                break
            owner = next((tracker for tracker in self.trackers if tracker.belongs(envelope)), None)
            if owner is None and starts_a_run(envelope) and self.runs_read_at < envelope.seq:
                self._need_runs = True
                break
            self.cursor = envelope.seq
            if owner is None:
                continue
            events = owner.feed(envelope)
            if envelope.seq > self.after:
                out.extend(format_sse(event) for event in events)
            if owner.finished:
                self.trackers.remove(owner)
        return b"".join(out)

    async def _read_runs(self) -> None:
        """Follow the runs begun by the envelope after the cursor (its title comes one
        seq before a run's INVOCATION_STARTED)."""
        self._need_runs = False
        self.runs_read_at = self.cursor + 1
        runs = await run_in_db_thread(runs_started_between, self.session_id, self.newest_start, self.cursor + 2)
        self._follow_runs(runs)

    async def _catch_up(self) -> bytes:
        out: list[bytes] = []
        while True:
            if self._need_runs:
                await self._read_runs()
            envelopes = await run_in_db_thread(read_envelopes, self.session_id, self.cursor)
            before = self.cursor
            out.append(self._process(envelopes))
            if not self._need_runs and (not envelopes or self.cursor == before):
                break
        return b"".join(out)

    async def _handle_live(self, message: dict[str, Any]) -> bytes:
        frame = await super()._handle_live(message)
        if self._need_runs:  # a new run began: read it, then the journal from there
            frame += await self._catch_up()
        return frame


def parse_after(last_event_id: str | None, after: str | None) -> int:
    """The seq to resume after: Last-Event-ID wins over ?after=; ValueError if malformed."""
    raw = last_event_id if last_event_id not in (None, "") else after
    if raw in (None, ""):
        return 0
    text = str(raw).strip()
    if not (text.isascii() and text.isdigit()) or len(text) > 12:
        raise ValueError("Last-Event-ID / after must be a whole number (an event's seq)")
    return int(text)
