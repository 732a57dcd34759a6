"""The worker: the asyncio loop that claims runs, executes their invocations and
heartbeats their leases. Every change of a Run row it makes goes through
sessions_app.runs (the Run state machine: claim, recover, heartbeat, finish, ...).

Any number of workers, in any number of processes on any number of machines, share the
Run table. A worker claims a run under a lease (PostgreSQL: `SELECT ... FOR UPDATE SKIP
LOCKED`; SQLite: its IMMEDIATE transactions serialise claimers) and renews it with
heartbeats. Its journal writes carry the fence (run id, lease token): once the lease is
taken over, they are refused. A run whose lease expired (its worker died) is claimed by
another worker, which journals SESSION_ERROR and a `recover` invocation that continues
the partial message (crash stitching); after `max_attempts` it fails instead.

Workers wake on commit (channel layer group "sectr.workers", or in-process pokes) and
poll as a fallback. Every second each also sweeps for approval asks past their deadline
and denies them (sessions_app.moderation.expiry: exactly once, however many sweep), and
once an interval (SECTR_RETENTION_INTERVAL_S) one of them deletes the sessions past their
retention (sessions_app.ops.retention.sweep_if_due).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from channels.layers import get_channel_layer
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connection

from sectr.control import RunControl
from sectr.errors import JournalUnavailable, LeaseLost
from sectr.runtime import Runtime
from sectr.telemetry import set_log_context
from sessions_app import runs
from sessions_app.dbthread import run_in_db_thread
from sessions_app.journal.publish import (
    RUN_CONTROL_MESSAGE_TYPE,
    WORKERS_GROUP,
    adopt_server_loop,
    aflush_publications,
    worker_control_group,
)
from sessions_app.mcp_servers import close_worker_pool
from sessions_app.moderation.expiry import expire_due_asks
from sessions_app.moderation.notifications import NotificationSender, anything_due
from sessions_app.ops import retention
from sessions_app.runtime import claimed_session, get_runtime
from sessions_app.telemetry.metrics import LEASES_LOST

log = logging.getLogger("sectr.worker")

#: Runs claimed in one round trip (one transaction) at most (Worker._fill). A burst of a
#: hundred queued runs took 25 claims of 4, each a transaction queued behind the appends
#: of the runs already streaming (SQLite: seconds before the last one started).
CLAIM_BATCH = 16
#: Runs of one worker between their claim and their first step (context loaded, handler
#: called) at most: beyond it the worker claims no more until one gets there. Fifty runs
#: claimed at once all loading at once starved the event loop of the runs already
#: streaming (bench/live.py at N=100: the model's production ran 0.6 s late, p99).
START_WINDOW = 16
#: A run that has not reached a step boundary this long after its claim stops counting
#: as starting (a handler that never calls one).
START_SECONDS = 1.0
#: How often a worker tries again to release a run it stopped while the database was away.
RELEASE_RETRY_SECONDS = 0.25


class DatabaseRunControl(RunControl):
    """The steer slot lives on the Run row: taking it empties the row's slot.

    The slot is read at a step boundary, except at the first one when the claim found it
    empty, and at an ending one (the model answered: `take_steer(ending=True)`) unless
    the run was poked since the last read. Parking a steer pokes the run's worker after
    its commit; a steer whose poke has not arrived (or was lost) is still answered: the
    completing append's fence check refuses the run's end while the slot holds one
    (SteerArrived), and the runtime runs the handler again, whose first boundary takes
    it. The ending read was one statement and a thread hop of every run (nearly always
    finding the slot empty)."""

    def __init__(self, claim: runs.Claim, on_first_step: Callable[[], None] | None = None) -> None:
        super().__init__()
        self.claim = claim
        self._on_first_step = on_first_step
        #: the claim read the steer slot just now and found it empty (one read less a run)
        self._slot_read = claim.steer_slot_empty
        #: a steer or a cancel was asked for since the slot was last read (`poked`)
        self._poked = False

    def poked(self) -> None:
        """The run's worker was poked: a steer may be parked (the next boundary reads)."""
        self._poked = True

    async def take_steer(self, *, ending: bool = False) -> tuple[str, str | None] | None:
        if self._on_first_step is not None:  # the run reached its first step: it has started
            started, self._on_first_step = self._on_first_step, None
            started()
        local = await super().take_steer(ending=ending)
        if self._slot_read or (ending and not self._poked):
            self._slot_read, durable = False, None
        else:
            self._poked = False  # before the read: a poke during it makes the next one read
            durable = await run_in_db_thread(runs.take_parked_steer, self.claim)
        if local and durable:
            return f"{local[0]}\n\n{durable[0]}", local[1]
        return local or durable


def _expire_and_look(notifications_due: bool) -> bool:
    """The expiry sweep, then (if asked) whether a notification is due: one thread hop
    for both. A sweep that failed is logged, and the notifications are still looked at."""
    try:
        expire_due_asks()
    except Exception:
        log.warning("the expiry sweep failed", exc_info=True)
    return notifications_due and anything_due()


# ---- the worker ----


class Worker:
    def __init__(
        self,
        *,
        concurrency: int = 8,
        lease: float | None = None,
        poll_interval: float = 1.0,
        worker_id: str | None = None,
        runtime: Runtime | None = None,
        listen: bool | None = None,
        notify: bool = True,
        expiry_interval: float = 1.0,
        retention_interval: float | None = None,
    ) -> None:
        self.concurrency = concurrency
        #: How often the fleet sweeps for sessions past their retention (0: never); one
        #: worker per interval does it (sessions_app.ops.retention.sweep_if_due).
        self.retention_interval = retention.retention_interval() if retention_interval is None else retention_interval
        #: How often this worker sweeps for expired asks (0: never).
        self.expiry_interval = expiry_interval
        self.lease = lease if lease is not None else runs.lease_seconds()
        self.poll_interval = poll_interval
        self.worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.runtime = runtime or get_runtime()
        self.listen = bool(getattr(settings, "REDIS_URL", "")) if listen is None else listen
        #: send the moderation notifications (webhooks, email) of the outbox, too
        self.notify = notify
        #: The expiry sweep's thread hop also looks whether a notification is due, and
        #: tells the sender (NotificationSender's `told`), when it runs at least as often.
        self.notifications = NotificationSender(told=notify and 0 < expiry_interval <= 1.0)
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.controls: dict[str, DatabaseRunControl] = {}
        self.claims: dict[str, runs.Claim] = {}
        self.starting: set[str] = set()  # claimed, not at their first step yet (START_WINDOW)
        #: runs whose invocation is executing: the heartbeat renews their leases
        self.beating: dict[str, runs.Claim] = {}
        self._wake = asyncio.Event()
        #: Wake-ups that say a run may have been queued (a commit's, a poll's), counted; and
        #: that count when a claim last found fewer runs than it asked for. Equal: the queue
        #: is empty as far as this worker knows, and a slot or a start-window place freeing
        #: up is no reason to look (a burst of a hundred runs ending made a hundred empty
        #: claims, each two queries).
        self._queued_signals = 0
        self._drained_at = -1
        #: a wake-up (a commit's, a poke's) came since the last claim: not the poll alone
        self._woken = True
        #: when the next poll is due (Worker.run)
        self._poll_due = 0.0
        #: when the worker last looked for queued messages whose promotion was lost
        self._tidied_at = 0.0
        self._stopping = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._rejoining: asyncio.Task[None] | None = None
        #: this worker's liveness on PostgreSQL (runs.LivenessLock): held while it claims
        self.liveness = runs.LivenessLock(self.worker_id)
        #: The liveness checks' own thread: in asyncio's default pool they queued behind
        #: whatever filled it (sync tools), and the worker claimed nothing meanwhile.
        #: Shut down when run() ends, as the lock is closed: a Worker runs once.
        self._liveness_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sectr-liveness")

    # thread-safe entry points
    def wake_threadsafe(self) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._run_queued)

    def _run_queued(self) -> None:
        """A run may have been queued: the next fill looks, whatever it found last time."""
        self._queued_signals += 1
        self._woken = True
        self._wake.set()

    def poke_threadsafe(self, run_id: str) -> None:
        if self._loop is not None and not self._loop.is_closed() and run_id in self.controls:
            self._loop.call_soon_threadsafe(lambda: asyncio.ensure_future(self._check_cancel(run_id)))

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()

    async def _check_cancel(self, run_id: str) -> None:
        claim = self.claims.get(run_id)
        control = self.controls.get(run_id)
        if claim is None or control is None:
            return
        control.poked()  # a steer may be parked: the run's ending boundary reads the slot
        beats = await run_in_db_thread(runs.heartbeat_runs, [claim], self.lease, renew=True)
        held, cancel_by = beats[claim.run_id]
        if cancel_by is not None or not held:
            control.cancel(cancel_by or None)

    async def run(self, *, drain_timeout: float = 30.0) -> None:
        """Claim and execute runs until stop(); then drain the runs in progress."""
        self._loop = asyncio.get_running_loop()
        adopt_server_loop()  # sync code in its threads publishes through this loop
        set_log_context(worker=self.worker_id)  # this task's and every run task's log lines
        # Before the first claim: without it, a claimer would take this worker's runs
        # for a dead worker's (PostgreSQL; nothing on SQLite). Refused (PostgreSQL full or
        # away), the worker lives on and claims nothing until a later check takes it.
        postgres = connection.vendor == "postgresql"
        if postgres:
            await self._ensure_liveness()
        runs.local_listeners.add(self)
        if self.listen:
            # The channel and its control group exist before the first claim: a Stop of
            # a run claimed while the listener was still starting would otherwise wait
            # for the heartbeat's once-a-second look at the flag.
            await self._open_channel()
        listener = asyncio.ensure_future(self._listen()) if self.listen else None
        heartbeat = asyncio.ensure_future(self._heartbeat())
        watcher = asyncio.ensure_future(self._watch_liveness()) if postgres else None
        notifier = asyncio.ensure_future(self.notifications.run()) if self.notify else None
        expiry = asyncio.ensure_future(self._expire_asks()) if self.expiry_interval > 0 else None
        sweeper = asyncio.ensure_future(self._sweep_retention()) if self.retention_interval > 0 else None
        log.info("worker %s started (concurrency %s, lease %ss)", self.worker_id, self.concurrency, self.lease)
        try:
            while not self._stopping.is_set():
                # Cleared before looking, not after: a wake-up that arrives while we
                # claim (a run committed just after our query) must not be lost for a
                # whole poll interval.
                self._wake.clear()
                if time.monotonic() >= self._poll_due:
                    # The poll, however often other wake-ups came meanwhile: a lease may
                    # have expired, a wake-up been lost. Look, even if the queue was empty.
                    self._poll_due = time.monotonic() + self.poll_interval
                    self._queued_signals += 1
                claimed = await self._fill()
                if claimed:
                    continue
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), max(0.0, self._poll_due - time.monotonic()))
        finally:
            runs.local_listeners.discard(self)
            if listener is not None:
                listener.cancel()
            if expiry is not None:
                expiry.cancel()
                self.notifications.look_yourself()  # its sweep told it what was due
            if sweeper is not None:
                sweeper.cancel()
            try:
                await self._drain(drain_seconds=drain_timeout)
                # The drained runs made their last MCP calls: stop the stdio servers.
                with contextlib.suppress(Exception, asyncio.TimeoutError):
                    await asyncio.wait_for(close_worker_pool(), 10.0)
                # The drained runs' last envelopes are queued for the layer: send them.
                with contextlib.suppress(Exception, asyncio.TimeoutError):
                    await asyncio.wait_for(aflush_publications(), 5.0)
            finally:
                heartbeat.cancel()
                if watcher is not None:
                    watcher.cancel()
                if notifier is not None:
                    notifier.cancel()
                # In the liveness thread, after any check under way there, which could
                # otherwise take the lock again once this worker stopped.
                try:
                    await asyncio.get_running_loop().run_in_executor(self._liveness_thread, self.liveness.close)
                finally:
                    self._liveness_thread.shutdown(wait=False)

    async def _fill(self) -> bool:
        """Claim runs while there are free slots; True if any was claimed."""
        claimed = False
        if len(self.tasks) >= self.concurrency or self._stopping.is_set():
            return claimed
        # Nothing to claim (no run queued since the last claim came back short, or the
        # start window full): no liveness check either. Every run's first step and end
        # wake this loop, and each wake-up's check was a thread hop and a round trip.
        if self._drained_at == self._queued_signals or len(self.starting) >= START_WINDOW:
            return claimed
        # A run claimed without the liveness lock would look abandoned to every other
        # worker at once: claim only while the lock is held (taken again if it was lost).
        if connection.vendor == "postgresql" and not await self._ensure_liveness():  # SQLite: no thread hop
            return claimed
        while len(self.tasks) < self.concurrency and len(self.starting) < START_WINDOW and not self._stopping.is_set():
            if self._drained_at == self._queued_signals:
                return claimed  # nothing queued since the last claim came back short
            # A few at a time: one thread hop and one candidate query for several runs,
            # while the first of a burst still starts without waiting for many claims.
            free = min(self.concurrency - len(self.tasks), CLAIM_BATCH, START_WINDOW - len(self.starting))
            signals = self._queued_signals  # before the claim: a wake-up during it counts
            tidy = time.monotonic() - self._tidied_at >= self.poll_interval
            # The poll alone (no wake-up since the last claim) nearly always finds an
            # empty queue: a look that locks nothing first (one statement, not three).
            probe, self._woken = not self._woken and not claimed, False
            try:
                executing = tuple(self.tasks)  # never claimed again by this worker, whatever they look like
                claims = await run_in_db_thread(
                    runs.claim_next_runs, self.worker_id, self.lease, free, executing, tidy_stranded=tidy, probe=probe
                )
            except JournalUnavailable as exc:  # a restart: the next look will do
                log.warning("claiming failed: %s", exc)
                return claimed
            except Exception:
                log.exception("claiming failed")
                return claimed
            if tidy:
                self._tidied_at = time.monotonic()
            if len(claims) < free:
                self._drained_at = signals  # the queue is empty until the next signal
            if not claims:
                return claimed
            claimed = True
            loop = asyncio.get_running_loop()
            for claim in claims:
                self.claims[claim.run_id] = claim
                started = functools.partial(self._started, claim.run_id)
                self.starting.add(claim.run_id)
                loop.call_later(START_SECONDS, started)
                self.controls[claim.run_id] = DatabaseRunControl(claim, on_first_step=started)
                task = asyncio.ensure_future(self._execute(claim))
                self.tasks[claim.run_id] = task
                task.add_done_callback(functools.partial(self._forget, claim.run_id))
        return claimed

    def _started(self, run_id: str) -> None:
        if run_id in self.starting:
            self.starting.discard(run_id)
            self._wake.set()  # room in the start window

    def _forget(self, run_id: str, _task: object = None) -> None:
        self.starting.discard(run_id)
        self.tasks.pop(run_id, None)
        self.controls.pop(run_id, None)
        self.claims.pop(run_id, None)
        self._wake.set()  # a slot is free

    async def _execute(self, claim: runs.Claim) -> None:
        control = self.controls[claim.run_id]
        set_log_context(run_id=claim.run_id, session_id=claim.session_id)  # this run's task only
        self.beating[claim.run_id] = claim
        if claim.session is not None:  # the run's start need not read the session's row again
            claimed_session.set((claim.session_id, claim.session, claim.transcript))
        try:
            terminal = await self.runtime.run_invocation(
                claim.session_id, claim.invocation_id, control=control, fence=claim.fence
            )
        except LeaseLost:
            LEASES_LOST.inc()
            log.warning("run %s: lease lost; another worker owns it now", claim.run_id)
            return
        except JournalUnavailable as exc:
            # The database went away mid-run (a restart): nothing more is written. Let the
            # run be recovered as soon as the database is back; recovery continues the
            # reply from what the journal holds.
            log.warning("run %s: stopped, the journal is unavailable (%s); it will be recovered", claim.run_id, exc)
            self.beating.pop(claim.run_id, None)  # no lease renewed for a stopped run meanwhile
            await self._release_when_back(claim)
            return
        except asyncio.CancelledError:
            raise
        except Exception:
            # The terminal event could not be journaled (e.g. the database went away):
            # the lease will expire and another worker recovers the run.
            log.exception("run %s: invocation crashed", claim.run_id)
            return
        finally:
            self.beating.pop(claim.run_id, None)
        if not runs.end_needs_database(claim):
            return  # the terminal event's append ended the row, and no message waits
        try:
            await run_in_db_thread(runs.end_run, claim, terminal)
        except Exception:
            log.exception("run %s: could not record its end", claim.run_id)

    async def _release_when_back(self, claim: runs.Claim) -> None:
        """Release a run this worker stopped, retrying while the database is still away.

        A restart takes seconds; a run its living worker has not released waits out the
        lease and then, on PostgreSQL, the living owner's grace (LIVE_OWNER_GRACE_LEASES)
        before another claim may take it. Past that long, trying is pointless.
        """
        deadline = time.monotonic() + self.lease * (runs.LIVE_OWNER_GRACE_LEASES + 1)
        while True:
            try:
                await run_in_db_thread(runs.release_lease, claim)
                return
            except Exception as exc:
                if time.monotonic() >= deadline:
                    log.warning(
                        "run %s: could not release it (%s); it is recovered when its lease lapses", claim.run_id, exc
                    )
                    return
            await asyncio.sleep(RELEASE_RETRY_SECONDS)

    async def _heartbeat(self) -> None:
        """Renew the leases of the executing runs every lease/3 and look at their cancel
        flags every second at most: one batch of queries for all of them (heartbeat_runs)."""
        interval = max(self.lease / 3, 0.2)
        cancel_poll = min(interval, 1.0)
        elapsed = 0.0
        while True:
            await asyncio.sleep(cancel_poll)
            elapsed += cancel_poll
            renew = elapsed >= interval
            if renew:
                elapsed = 0.0
                # Beside the beat, never in its way: a slow Redis must not cost a lease.
                if self._rejoining is None or self._rejoining.done():
                    self._rejoining = asyncio.ensure_future(self._rejoin_groups())
            claims = list(self.beating.values())
            if not claims:
                continue
            try:
                beats = await run_in_db_thread(runs.heartbeat_runs, claims, self.lease, renew=renew)
            except Exception:
                log.warning("heartbeat of %d run(s) failed", len(claims), exc_info=True)
                continue
            for claim in claims:
                if self.beating.get(claim.run_id) is not claim:
                    continue  # it ended (or is recording its end) meanwhile
                held, cancel_by = beats.get(claim.run_id, (True, None))
                if not held and claim.fence.ended is not None:
                    continue  # its terminal event's append ended the row: it is ending
                if not held:
                    LEASES_LOST.inc()
                    log.warning("run %s: lease lost; stopping it", claim.run_id)
                    task = self.tasks.get(claim.run_id)
                    if task is not None:
                        task.cancel()
                    continue
                control = self.controls.get(claim.run_id)
                if cancel_by is not None and control is not None:
                    control.cancel(cancel_by or None)

    async def _watch_liveness(self) -> None:
        """Take the liveness lock again soon after its connection died (a PostgreSQL
        restart), even while this worker claims nothing: until then other workers see its
        runs as abandoned and take them over."""
        interval = min(max(self.lease / 3, 0.2), 1.0)
        while True:
            await asyncio.sleep(interval)
            await self._ensure_liveness()

    async def _ensure_liveness(self) -> bool:
        """Whether this worker holds its liveness lock, taking it (again) if it can."""
        if self.liveness.looks_held():  # the usual answer, without a hop to its thread
            return True
        check = functools.partial(contextvars.copy_context().run, self.liveness.ensure)  # its log context
        try:
            return await asyncio.get_running_loop().run_in_executor(self._liveness_thread, check)
        except Exception:
            log.exception("the liveness check failed")
            return False

    async def _expire_asks(self) -> None:
        """Deny overdue asks (sessions_app.moderation.expiry): each denial queues the
        resumed run, which this worker or another claims like any other. In the same
        thread hop, look whether a notification is due (the sender's look, `told`)."""
        look = self.notify and self.notifications.told
        while True:
            await asyncio.sleep(self.expiry_interval)
            try:
                if await run_in_db_thread(_expire_and_look, look):
                    self.notifications.due()
            except Exception:
                log.warning("the expiry sweep or the notifications' look failed", exc_info=True)

    async def _sweep_retention(self) -> None:
        """Delete the sessions past their retention once an interval, whichever worker
        of the fleet wins the interval; the others find it done. Looks at least once a
        minute whether the interval is due (a cheap conditional UPDATE)."""
        check = min(self.retention_interval, 60.0)
        while True:
            try:
                await run_in_db_thread(retention.sweep_if_due, self.worker_id, self.retention_interval)
            except Exception:
                log.warning("the retention sweep failed", exc_info=True)
            await asyncio.sleep(check)

    async def _drain(self, *, drain_seconds: float) -> None:
        if not self.tasks:
            return
        log.info("worker %s draining %s runs", self.worker_id, len(self.tasks))
        claims = {run_id: self.claims[run_id] for run_id in self.tasks if run_id in self.claims}
        tasks = {task: run_id for run_id, task in self.tasks.items()}
        _done, pending = await asyncio.wait(tasks, timeout=drain_seconds)
        if not pending:
            return
        # Out of time: stop the runs first (so they write nothing more), then let
        # another worker recover them at once instead of after the lease.
        for task in pending:
            task.cancel()
        await asyncio.wait(pending, timeout=5)
        for task in pending:
            claim = claims.get(tasks[task])
            if claim is not None:
                await run_in_db_thread(runs.release_lease, claim)

    # ---- channel layer (multi-process wake-ups) ----

    async def _open_channel(self) -> None:
        layer = get_channel_layer()
        if layer is None:
            return
        try:
            self._channel = await asyncio.wait_for(layer.new_channel("sectr.worker."), 5.0)
            await asyncio.wait_for(layer.group_add(WORKERS_GROUP, self._channel), 5.0)
            # The pokes of every run this worker will hold (sessions_app.runs.poke_run):
            # addressed to the worker its row names, so no run subscribes on its own.
            await asyncio.wait_for(layer.group_add(worker_control_group(self.worker_id), self._channel), 5.0)
        except Exception:  # Redis down at start: polling still works; _rejoin_groups retries
            log.warning("worker %s: channel layer unavailable; polling only for now", self.worker_id, exc_info=True)

    async def _rejoin_groups(self) -> None:
        """Join the workers' group and this worker's control group again: a restarted
        Redis forgot every subscription (cheap when nothing changed)."""
        if not self.listen:
            return
        if not hasattr(self, "_channel"):
            with contextlib.suppress(Exception):
                await self._open_channel()
            return
        await self._group_add(WORKERS_GROUP)
        await self._group_add(worker_control_group(self.worker_id))

    async def _listen(self) -> None:
        layer = get_channel_layer()
        if layer is None:
            return
        while True:
            if not hasattr(self, "_channel"):  # Redis was down at start: _rejoin_groups opens it
                await asyncio.sleep(1)
                continue
            try:
                message = await layer.receive(self._channel)
            except asyncio.CancelledError:
                raise
            except Exception:
                await asyncio.sleep(1)
                continue
            if message.get("type") == "runs.wake":
                self._run_queued()
            elif message.get("type") == RUN_CONTROL_MESSAGE_TYPE and message.get("run_id") in self.controls:
                log.debug("run %s: control poke", message["run_id"])
                asyncio.ensure_future(self._check_cancel(message["run_id"]))

    async def _group_add(self, group: str) -> None:
        if not self.listen or not hasattr(self, "_channel"):
            return
        layer = get_channel_layer()
        with contextlib.suppress(Exception):  # a slow channel layer must not hold the run up
            async with asyncio.timeout(2.0):  # not wait_for: no task of its own per run
                await layer.group_add(group, self._channel)


# ---- the embedded worker (SQLite default: inside the serving process) ----

_embedded: Worker | None = None
_embedded_task: asyncio.Task[None] | None = None  # held: the loop keeps only weak references

#: An embedded worker that died starts again no sooner than this many seconds after its
#: death, the wait doubling for each death in a row that came within
#: EMBEDDED_RESTART_MAX seconds of its start, up to EMBEDDED_RESTART_MAX: one that dies at
#: once every time (the database refusing it, a bug in its start) is logged and started
#: again once a minute, not on every connection.
EMBEDDED_RESTART_MIN = 2.0
EMBEDDED_RESTART_MAX = 60.0
_restart_wait = 0.0  # the wait after the last death (0: none since the process started)
_restart_at = 0.0  # time.monotonic() before which no embedded worker starts
_started_at = 0.0  # when the embedded worker of now (or the last one) started


def embedded_worker_enabled() -> bool:
    if settings.SECTR_EMBEDDED_WORKER is not None:
        return bool(settings.SECTR_EMBEDDED_WORKER)
    # From the settings, not `connection.vendor`: the ASGI application asks on every
    # connection, and touching `connection` on the event loop made a DatabaseWrapper
    # in that connection's context, kept as long as its socket (2.4 KiB each, 5,000
    # idle sockets: bench/sockets.py).
    return "sqlite" in settings.DATABASES[DEFAULT_DB_ALIAS]["ENGINE"]


def start_embedded_worker() -> Worker | None:
    """Start a worker on the running event loop (the server's), once per process, and
    again after it died, once its restart wait is over (None until then)."""
    global _embedded, _embedded_task, _started_at
    if _embedded is not None or not embedded_worker_enabled():
        return _embedded
    loop = asyncio.get_running_loop()  # first: outside a running loop, record nothing
    if time.monotonic() < _restart_at:
        return None  # the last one died moments ago: _embedded_ended's timer starts it
    # No channel-layer listener: this process's actions wake and poke it directly, and
    # a Redis receive loop on the server's own event loop delayed browser frames by
    # seconds (bench/live.py). Pokes from other processes reach it by polling.
    _embedded = Worker(concurrency=settings.SECTR_WORKER_CONCURRENCY, listen=False)
    _started_at = time.monotonic()
    _embedded_task = loop.create_task(_embedded.run())
    _embedded_task.add_done_callback(functools.partial(_embedded_ended, _embedded))
    return _embedded


def _embedded_ended(worker: Worker, task: asyncio.Task[None]) -> None:
    """Log an embedded worker's death (nothing else would: its task is held, never
    awaited), and start another in its place after the restart wait (the next
    connection after it does too)."""
    global _embedded, _embedded_task, _restart_wait, _restart_at
    if task.cancelled() or task.exception() is None:
        return  # stopped: the server is shutting down
    now = time.monotonic()
    if _restart_wait == 0.0 or now - _started_at >= EMBEDDED_RESTART_MAX:
        _restart_wait = EMBEDDED_RESTART_MIN  # the first death, or one after a good while
    else:
        _restart_wait = min(_restart_wait * 2, EMBEDDED_RESTART_MAX)
    _restart_at = now + _restart_wait
    log.error(
        "the embedded worker %s died; another starts in %g s",
        worker.worker_id,
        _restart_wait,
        exc_info=task.exception(),
    )
    if _embedded is worker:
        _embedded, _embedded_task = None, None
    task.get_loop().call_later(_restart_wait, _start_after_wait)


def _start_after_wait() -> None:
    try:
        start_embedded_worker()
    except Exception:  # a timer's callback: nobody else would see it
        log.exception("starting the embedded worker again failed")
