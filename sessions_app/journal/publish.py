"""Live publication of journal appends to the channel layer.

The journal is the truth; the channel layer only pushes and wakes. It delivers at most
once and drops messages under load or on a Redis reconnect, so every reader tracks the
seq it has rendered and, on a gap (or after a reconnect), reads the missing envelopes
from the journal (`DatabaseJournal.load(session_id, after_seq=...)`). Publication
failures are retried (a burst, a Redis restart: up to PUBLISH_BUDGET), then logged,
counted (`publish_drops()`, and ops' `sectr_publish_drops`) and swallowed: an append
that committed has happened. The async path (`queue_publication`, the worker's appends)
queues its messages on the event loop's ordered publisher and returns at once, so a slow
layer never holds a journal writer.

Messages are plain JSON (they cross Redis), sent only after the append's transaction
commits:

* group ``session_group(session_id)`` (``"sectr.session.<id>"``), once per append::

      {"type": "journal.envelopes",
       "session_id": "ses_...",
       "envelopes": [Envelope.to_dict(), ...]}   # one append's batch, seq ascending

  Each envelope dict is ``{"session_id", "seq", "invocation_id", "type", "payload",
  "created_at"}`` (sectr.events.Envelope.to_dict; created_at is ISO 8601 UTC;
  rebuild one with ``Envelope.from_dict``). A consumer handles it in a method named
  ``journal_envelopes``.

* group ``MODERATION_GROUP`` (``"sectr.moderation"``): the same message shape, with
  only the envelopes moderators care about: APPROVAL_REQUESTED (an ask is now
  pending), APPROVAL_VOTED (a vote towards a quorum), INVOCATION_STARTED whose reason
  is ``approval_decision`` (an ask was decided) and INVOCATION_CANCELLED naming an
  ``ask_id`` (a paused run was cancelled: its ask is withdrawn). Other envelopes of
  that append are left out; a batch with none of them sends nothing.

* group ``WORKERS_GROUP`` (``"sectr.workers"``): ``{"type": "runs.wake"}`` from
  `wake_workers` / `awake_workers` / `wake_workers_on_commit`, sent when a run was
  queued. It carries no data: a woken worker claims from the Run table.

Entry points: `queue_publication(envelopes)` (on an event loop, after the transaction
committed: the async journal path calls it for every append of a group commit; its
awaitable twin is `apublish`) and `publish_on_commit(envelopes)`
(sync, inside or outside `transaction.atomic()`: sends when the outermost block commits,
never if it rolls back). The sync path reaches the channel layer through `async_to_sync`;
from a thread started by `sync_to_async` (Django's sync views under ASGI, consumers'
`database_sync_to_async`) that runs on the server's event loop.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import hashlib
import logging
import re
from collections.abc import Iterable, Iterator, Sequence
from contextvars import ContextVar
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

from sectr.asks import ask_changes
from sectr.events import Envelope, EventType
from sectr.loops import PerLoop
from sectr.watchdog import Watchdog
from sessions_app.telemetry.metrics import PUBLISH_DROPS, group_kind

logger = logging.getLogger("sectr.publish")

SESSION_GROUP_PREFIX = "sectr.session."
MODERATION_GROUP = "sectr.moderation"
WORKERS_GROUP = "sectr.workers"
ENVELOPES_MESSAGE_TYPE = "journal.envelopes"
WAKE_MESSAGE_TYPE = "runs.wake"
#: How long one attempt to publish a message may take before it is tried again.
PUBLISH_TIMEOUT = 2.0
#: How long a message is retried (a burst, a Redis restart) before it is given up and
#: counted in `publish_drops()`; readers then find it in the journal.
PUBLISH_BUDGET = 30.0
#: Messages one process may hold back while the layer is slow or away; beyond it the
#: oldest are dropped (and counted): memory must stay bounded through a long outage.
PUBLISH_BACKLOG_MAX = 50_000

_drops = 0  # messages this process gave up on (every path); see publish_drops()


def publish_drops() -> int:
    """How many messages this process could not hand to the channel layer (since start)."""
    return _drops


def _count_drops(group: str, count: int = 1) -> None:
    global _drops
    _drops += count
    PUBLISH_DROPS.labels(group_kind(group)).inc(count)


# Channels accepts group names of ASCII letters, digits, "-", "_" and "." under 100 chars.
_GROUP_SAFE = re.compile(r"^[a-zA-Z0-9\-_.]+$")
_GROUP_MAX = 99


@functools.lru_cache(maxsize=4096)
def session_group(session_id: str) -> str:
    """The channel-layer group of one session's live journal tail (remembered for the
    sessions seen last: every streamed chunk's message names its session's)."""
    name = SESSION_GROUP_PREFIX + session_id
    if _GROUP_SAFE.match(session_id) and len(name) <= _GROUP_MAX:
        return name
    # An id channels would reject: use a digest (stable, distinct per id).
    return SESSION_GROUP_PREFIX + "h" + hashlib.sha256(session_id.encode()).hexdigest()[:40]


def is_moderation_envelope(envelope: Envelope) -> bool:
    return bool(ask_changes(envelope))


def envelope_messages(envelopes: Sequence[Envelope]) -> list[tuple[str, dict[str, Any]]]:
    """The (group, message) pairs one append publishes (see the module docstring)."""
    if not envelopes:
        return []
    by_session: dict[str, list[Envelope]] = {}
    for envelope in envelopes:
        by_session.setdefault(envelope.session_id, []).append(envelope)
    messages: list[tuple[str, dict[str, Any]]] = []
    for session_id, batch in by_session.items():
        if len(batch) > 1:
            batch.sort(key=lambda e: e.seq)
        messages.append(
            (
                session_group(session_id),
                {"type": ENVELOPES_MESSAGE_TYPE, "session_id": session_id, "envelopes": [e.to_dict() for e in batch]},
            )
        )
        # A delta (most envelopes: one per streamed chunk) concerns no ask.
        moderated = [e.to_dict() for e in batch if e.type is not EventType.MESSAGE_DELTA and is_moderation_envelope(e)]
        if moderated:
            messages.append(
                (MODERATION_GROUP, {"type": ENVELOPES_MESSAGE_TYPE, "session_id": session_id, "envelopes": moderated})
            )
    return messages


async def _send_one(layer: Any, group: str, message: dict[str, Any], deadline: float) -> bool:
    """Send one message, retrying (with a growing pause) until `deadline` (monotonic)."""
    pause = 0.05
    while True:
        try:
            async with asyncio.timeout(PUBLISH_TIMEOUT):  # no task per send, unlike wait_for
                await layer.group_send(group, message)
            return True
        except asyncio.CancelledError:
            raise
        except Exception:
            if asyncio.get_running_loop().time() + pause > deadline:
                logger.warning("could not publish %s to %s", message.get("type"), group, exc_info=True)
                return False
            await asyncio.sleep(pause)
            pause = min(pause * 2, 1.0)


async def _send(messages: list[tuple[str, dict[str, Any]]], budget: float = PUBLISH_BUDGET) -> None:
    """Send `messages` in order, each retried for up to `budget` seconds. Never raises."""
    layer = get_channel_layer()
    if layer is None:
        return
    deadline = asyncio.get_running_loop().time() + budget
    for group, message in messages:
        if not await _send_one(layer, group, message, deadline):
            _count_drops(group)  # the journal has it; readers catch up from there


#: The event loop of this process's server (Daphne's, or a `sectr_worker`'s), once an
#: async entry point adopted it: sync code in other threads hands it its messages.
_server_loop: asyncio.AbstractEventLoop | None = None


def adopt_server_loop() -> None:
    """Make the running loop the one sync publishers queue on (see `_send_sync`). Called
    by the ASGI application and the worker's loop; the first running loop wins."""
    global _server_loop
    loop = asyncio.get_running_loop()
    if _server_loop is None or _server_loop.is_closed() or not _server_loop.is_running():
        _server_loop = loop


def _put_on_loop(messages: list[tuple[str, dict[str, Any]]]) -> None:
    _publisher().put(messages)


def _send_sync(messages: list[tuple[str, dict[str, Any]]]) -> None:
    """Publish from sync code (a view's on_commit, a journal thread).

    In a server process the messages go on the server loop's ordered publisher and this
    returns at once: the request thread never waits for the layer. That thread is the
    one Django runs every sync view on under ASGI, so waiting here serialised the
    process's POSTs behind the event loop (bench/live.py: 100 POSTs at once were
    answered after 1.8 s p50, 3.8 s p99). Elsewhere (management commands, a sync
    test) it sends now and waits, with a shorter budget than the queue's.
    """
    loop = _server_loop
    if loop is not None and loop.is_running():
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            _put_on_loop(messages)
            return
        try:
            loop.call_soon_threadsafe(_put_on_loop, messages)
            return
        except RuntimeError:  # closed meanwhile: send it ourselves
            pass
    try:
        async_to_sync(_send)(messages, 5.0)
    except Exception:
        for group, _message in messages:
            _count_drops(group)
        logger.warning("could not publish %d message(s)", len(messages), exc_info=True)


class _OrderedPublisher:
    """One event loop's queue of messages to publish, sent in order by one task.

    The async journal path (the worker's appends) hands its messages here and goes on:
    a burst or a Redis restart neither holds a journal writer nor drops frames. Messages
    of one group (a session) are sent strictly in the order they were queued; different
    groups' go out side by side."""

    def __init__(self) -> None:
        self.queue: collections.deque[tuple[float, str, dict[str, Any]]] = collections.deque()
        self.ready = asyncio.Event()  # something was queued
        self.idle = asyncio.Event()  # the queue is empty and nothing is being sent
        self.idle.set()
        self.task: asyncio.Task[None] | None = None
        #: PUBLISH_TIMEOUT of each batch (`_send_together`), one timer for all of them
        self.watchdog = Watchdog()

    def put(self, messages: list[tuple[str, dict[str, Any]]]) -> None:
        now = asyncio.get_running_loop().time()
        self.queue.extend((now, group, message) for group, message in messages)
        overflow = len(self.queue) - PUBLISH_BACKLOG_MAX
        if overflow > 0:
            for _ in range(overflow):
                _queued, group, _message = self.queue.popleft()
                _count_drops(group)
            logger.warning("publish backlog full: dropped the %d oldest message(s)", overflow)
        self.idle.clear()
        self.ready.set()
        if self.task is None or self.task.done():
            self.task = asyncio.ensure_future(self._drain())

    async def _drain(self) -> None:
        while True:
            if not self.queue:
                self.ready.clear()
                self.idle.set()
                await self.ready.wait()
                continue
            layer = get_channel_layer()
            batch = list(self.queue)
            self.queue.clear()
            if layer is None:
                continue
            if await self._send_together(layer, batch):
                continue
            by_group: dict[str, list[tuple[float, dict[str, Any]]]] = {}
            for queued, group, message in batch:
                by_group.setdefault(group, []).append((queued, message))

            await asyncio.gather(*(self._send_group(layer, group, items) for group, items in by_group.items()))

    async def _send_together(self, layer: Any, batch: list[tuple[float, str, dict[str, Any]]]) -> bool:
        """Send the whole batch in one go where the layer can (group_send_many: the Redis
        layer's is one write per Redis, the in-memory layer's one pass; in queue order, so each
        group's order holds), even a batch of one message; False
        when it cannot or failed, and the batch goes group by group with retries (what
        the failed batch sent already is then sent again: readers drop a seq they
        have)."""
        send_many = getattr(layer, "group_send_many", None)
        if send_many is None:
            return False
        try:
            with self.watchdog.guard(PUBLISH_TIMEOUT):
                await send_many([(group, message) for _queued, group, message in batch])
            return True
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.info("a batched publish failed; sending its %d message(s) one by one", len(batch), exc_info=True)
            return False

    @staticmethod
    async def _send_group(layer: Any, group: str, items: list[tuple[float, dict[str, Any]]]) -> None:
        for queued, message in items:
            if not await _send_one(layer, group, message, queued + PUBLISH_BUDGET):
                _count_drops(group)

    async def flush(self) -> None:
        """Wait until everything queued so far was sent (or given up)."""
        if self.task is not None and not self.task.done():
            await self.idle.wait()


_publishers: PerLoop[_OrderedPublisher] = PerLoop(_OrderedPublisher)
_publisher = _publishers.get


def queue_publication(envelopes: Sequence[Envelope]) -> None:
    """Queue committed envelopes on the running loop's ordered publisher (in order,
    retried; see _OrderedPublisher). Never waits, never raises."""
    queue_publications([envelopes])


def queue_publications(appends: Iterable[Sequence[Envelope]]) -> None:
    """`queue_publication` of several appends in order (a group commit's), queued at once."""
    messages: list[tuple[str, dict[str, Any]]] = []
    for envelopes in appends:
        messages += envelope_messages(envelopes)
    if messages:
        _publisher().put(messages)


async def apublish(envelopes: Sequence[Envelope]) -> None:
    """`queue_publication` for async callers: returns at once."""
    queue_publication(envelopes)


async def aflush_publications() -> None:
    """Wait until this event loop's queued publications went out (tests, shutdown)."""
    await _publisher().flush()


def publish_on_commit_messages(messages: list[tuple[str, dict[str, Any]]], *, using: str | None = None) -> None:
    """Send (group, message) pairs once the current transaction commits (now, outside one)."""
    if messages:
        transaction.on_commit(lambda: _send_sync(messages), using=using)


#: Where `publish_on_commit` also hands the envelopes it publishes, in this context (see
#: `collecting_commits`).
_committed_here: ContextVar[list[Envelope] | None] = ContextVar("sectr_committed_here", default=None)


@contextlib.contextmanager
def collecting_commits() -> Iterator[list[Envelope]]:
    """A list that collects, in commit order, the envelopes `publish_on_commit` publishes
    from this context while the block runs, each batch as its transaction commits (a
    rolled-back one's never): what this process has just journaled, as it publishes it.

    A run's POST that streams the run reads its own batch (the run's start) from here:
    through the layer it could come after the worker's first batch (the POST's
    publication waits its turn on the server loop; the worker claims the run meanwhile),
    which the stream took for a gap and read the journal for (13 of 100 streamed POSTs,
    bench/admission.py --topology cluster --mode post)."""
    collected: list[Envelope] = []
    token = _committed_here.set(collected)
    try:
        yield collected
    finally:
        _committed_here.reset(token)


def publish_on_commit(envelopes: Sequence[Envelope], *, using: str | None = None) -> None:
    """Publish `envelopes` once the current transaction commits (now, outside one)."""
    messages = envelope_messages(envelopes)
    collected = _committed_here.get()
    if collected is None or not envelopes:
        publish_on_commit_messages(messages, using=using)
        return

    def committed() -> None:
        collected.extend(envelopes)
        if messages:
            _send_sync(messages)

    transaction.on_commit(committed, using=using)


async def awake_workers() -> None:
    """Tell idle workers to look for queued runs. Never raises."""
    await _send([(WORKERS_GROUP, {"type": WAKE_MESSAGE_TYPE})])


def wake_workers() -> None:
    """Sync `awake_workers`, sent now (not tied to a transaction)."""
    _send_sync([(WORKERS_GROUP, {"type": WAKE_MESSAGE_TYPE})])


def wake_workers_on_commit(*, using: str | None = None) -> None:
    """Wake the workers once the current transaction (which queued a run) commits."""
    transaction.on_commit(wake_workers, using=using)


RUN_CONTROL_GROUP_PREFIX = "sectr.run."
RUN_CONTROL_MESSAGE_TYPE = "run.control"


def worker_control_group(worker_id: str) -> str:
    """The group a worker joins once, at its start, for the cancel and steer pokes of
    every run it holds. Addressed to the worker the run's row names (its lease owner),
    not to the run: a group per run cost each run a subscribe and an unsubscribe (two
    Redis round trips on the worker's event loop) for a poke few runs ever get. Hashed:
    a worker id may hold characters (and a length) a group name may not."""
    return RUN_CONTROL_GROUP_PREFIX + "worker." + hashlib.sha256(worker_id.encode()).hexdigest()[:40]


def poke_run_control(run_id: str, worker_id: str) -> None:
    """Tell the worker `worker_id` (in any process), which holds `run_id`, to re-read the
    run's cancel flag and steer slot. Never raises: the worker's poll still sees the flag."""
    _send_sync([(worker_control_group(worker_id), {"type": RUN_CONTROL_MESSAGE_TYPE, "run_id": run_id})])
