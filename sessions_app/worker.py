"""The worker: claims runs from the queue and executes their invocations on asyncio.

Any number of workers, in any number of processes on any number of machines, share the
Run table. A worker claims a run under a lease (PostgreSQL: `SELECT ... FOR UPDATE SKIP
LOCKED`; SQLite: its IMMEDIATE transactions serialise claimers) and renews it with
heartbeats. Its journal writes carry the fence (run id, lease token): once the lease is
taken over, they are refused. A run whose lease expired (its worker died) is claimed by
another worker, which journals SESSION_ERROR and a `recover` invocation that continues
the partial message (crash stitching); after `max_attempts` it fails instead.

Workers wake on commit (channel layer group "sectr.workers", or in-process pokes) and
poll as a fallback.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import operator
import os
import socket
import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from asgiref.sync import async_to_sync
from django.conf import settings
from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from sectr import operations
from sectr.context import CANCELLED_TOOL_CONTENT
from sectr.control import RunControl
from sectr.errors import LeaseLost
from sectr.events import Envelope, EventType
from sectr.fold import fold_messages, open_tool_calls
from sectr.journal import NewEvent
from sectr.runtime import Runtime
from sessions_app import actions
from sessions_app.journal import run_in_db_thread
from sessions_app.models import Run, Session
from sessions_app.publish import WORKERS_GROUP
from sessions_app.runtime_config import get_runtime

log = logging.getLogger("sectr.worker")

RUN_CONTROL_GROUP_PREFIX = "sectr.run."
TERMINAL_RUN_STATUS = {
    EventType.INVOCATION_COMPLETED: Run.COMPLETED,
    EventType.INVOCATION_SUSPENDED: Run.SUSPENDED,
    EventType.INVOCATION_FAILED: Run.FAILED,
    EventType.INVOCATION_CANCELLED: Run.CANCELLED,
}


def lease_seconds() -> float:
    return float(getattr(settings, "SECTR_LEASE_SECONDS", os.environ.get("SECTR_LEASE_SECONDS", "6")))


@dataclass(frozen=True)
class Claim:
    run_id: str
    session_id: str
    invocation_id: str
    token: str
    recovered: bool

    @property
    def fence(self) -> tuple[str, str]:
        return (self.run_id, self.token)


# ---- claiming (sync, in a database thread) ----


def claim_next_run(worker_id: str, lease: float) -> Claim | None:
    """Claim the oldest runnable run: queued, or running with an expired lease.

    A run whose lease expired is recovered here, under the session lock, in the same
    transaction as the claim. Locks are taken in the journal's order, Session row then
    Run row, like every action: the other order deadlocks against a cancel or a steer
    (which hold the session and wait for the run). On PostgreSQL the Run row is taken
    with SKIP LOCKED, so two workers that picked the same candidate never wait on each
    other for it: the loser moves on to the next one.
    """
    tidied: list[str] = _stranded_pending_sessions()
    try:
        for _ in range(3):
            now = timezone.now()
            candidates = list(
                Run.objects.filter(_runnable(now)).order_by("created_at", "id").values_list("pk", "session_id")[:20]
            )
            if not candidates:
                return None
            for run_id, session_id in candidates:
                claim = _claim_candidate(run_id, session_id, worker_id, lease, tidied)
                if claim is not None:
                    return claim
        return None
    finally:
        # Runs ended here (their journal had ended them already, or they were lost too
        # often, or cancelled while their worker was dead) may free a queued message.
        for session_id in dict.fromkeys(tidied):
            actions.promote_pending_run(session_id)


def _stranded_pending_sessions(limit: int = 20) -> list[str]:
    """Sessions with a queued message but no run going (its promotion was lost: a worker
    died between recording a run's end and starting the next message)."""
    return list(
        Run.objects.filter(status=Run.PENDING)
        .exclude(session__status__in=("running", "awaiting"))
        .values_list("session_id", flat=True)
        .distinct()[:limit]
    )


def _runnable(now: Any) -> Q:
    return Q(status=Run.QUEUED) | Q(status=Run.RUNNING, lease_expires_at__lt=now)


def _claim_candidate(run_id: str, session_id: str, worker_id: str, lease: float, tidied: list[str]) -> Claim | None:
    with transaction.atomic():
        session = Session.objects.select_for_update().filter(pk=session_id).first()
        if session is None:
            return None  # deleted meanwhile
        now = timezone.now()
        runnable = Run.objects.filter(_runnable(now), pk=run_id)
        if connection.vendor == "postgresql":
            runnable = runnable.select_for_update(skip_locked=True)
        run = runnable.first()
        if run is None:
            return None  # another worker claimed it (or it ended) since we looked
        state = session.projection()
        if state.current_invocation_id != run.invocation_id or not state.is_active:
            # Its invocation already ended in the journal (the worker died after the
            # terminal append, or it was cancelled before any worker took it).
            _finish_run_from_state(run, session)
            tidied.append(session_id)
            return None
        recovered = run.status == Run.RUNNING
        token = uuid.uuid4().hex
        if recovered:
            if run.cancel_requested:
                _cancel_lost_run(run, state)
                tidied.append(session_id)
                return None
            if run.attempts >= run.max_attempts:
                _fail_exhausted(run, state)
                tidied.append(session_id)
                return None
            invocation_id, events = operations.recover_events(
                state, run.invocation_id or "", error=f"worker {run.lease_owner} stopped answering"
            )
            actions.journal.append_sync(session.pk, events)
            run.invocation_id = invocation_id
            run.invocation_ids = [*run.invocation_ids, invocation_id]
        run.status = Run.RUNNING
        run.attempts += 1
        run.lease_owner = worker_id
        run.lease_token = token
        run.lease_expires_at = now + timedelta(seconds=lease)
        run.heartbeat_at = now
        run.started_at = run.started_at or now
        run.save()
        return Claim(run.pk, run.session_id, run.invocation_id or "", token, recovered)


def _finish_run_from_state(run: Run, session: Session) -> None:
    """Bring a Run row in line with its journal (its terminal event is there already)."""
    state = session.projection()
    status = {"awaiting": Run.SUSPENDED, "completed": Run.COMPLETED, "failed": Run.FAILED, "cancelled": Run.CANCELLED}
    run.status = status.get(state.status, Run.FAILED)
    run.stop_reason = state.last_stop_reason or ""
    run.lease_token = None
    run.lease_expires_at = None
    run.finished_at = run.finished_at or timezone.now()
    run.save()


def _fail_exhausted(run: Run, state: Any) -> None:
    error = f"the run was lost {run.attempts} times (its workers stopped answering)"
    events = []
    if state.open_message_id:
        events.append(
            NewEvent(
                EventType.SESSION_ERROR,
                {"error": error, "message_id": state.open_message_id, "retryable": True},
                run.invocation_id,
            )
        )
    events.append(NewEvent(EventType.INVOCATION_FAILED, {"error": error, "retryable": True}, run.invocation_id))
    actions.journal.append_sync(run.session_id, events)
    run.status, run.error, run.stop_reason = Run.FAILED, error, "error"
    run.lease_token, run.lease_expires_at, run.finished_at = None, None, timezone.now()
    run.save()


def _cancel_lost_run(run: Run, state: Any) -> None:
    """End a run that was cancelled while its worker was dead, as its worker would have."""
    invocation_id = run.invocation_id
    events = []
    if state.open_message_id:
        events.append(
            NewEvent(
                EventType.MESSAGE_END,
                {"message_id": state.open_message_id, "finish_reason": "cancelled"},
                invocation_id,
            )
        )
    messages = fold_messages(actions.journal.load_since_compaction_sync(run.session_id))
    for call in open_tool_calls(messages):
        result = {"tool_call_id": call["id"], "name": call["function"]["name"], "content": CANCELLED_TOOL_CONTENT}
        events.append(NewEvent(EventType.TOOL_RESULT, {**result, "is_error": True}, invocation_id))
    payload = {"by": run.cancel_requested_by} if run.cancel_requested_by else {}
    events.append(NewEvent(EventType.INVOCATION_CANCELLED, payload, invocation_id))
    actions.journal.append_sync(run.session_id, events)
    run.status, run.stop_reason = Run.CANCELLED, "cancelled"
    run.lease_token, run.lease_expires_at, run.finished_at = None, None, timezone.now()
    run.save()


def finish_run(claim: Claim, terminal: Envelope) -> bool:
    """Record a run's end on its row (only while this worker still holds the lease)."""
    status = TERMINAL_RUN_STATUS.get(terminal.type, Run.FAILED)
    payload = terminal.payload
    stop = payload.get("stop_reason") or {
        Run.SUSPENDED: "awaiting_approval",
        Run.FAILED: "error",
        Run.CANCELLED: "cancelled",
    }.get(status, "")
    updated = Run.objects.filter(pk=claim.run_id, lease_token=claim.token).update(
        status=status,
        stop_reason=stop,
        usage=payload.get("usage") or {},
        error=payload.get("error", ""),
        lease_token=None,
        lease_expires_at=None,
        finished_at=timezone.now(),
    )
    return updated == 1


def heartbeat_runs(claims: Sequence[Claim], lease: float, *, renew: bool) -> dict[str, tuple[bool, str | None]]:
    """Renew leases and read cancel flags: {run_id: (still held, who asked to cancel)}.

    "Who asked" is None when nobody did, else the username ("" when unknown).

    One UPDATE (when `renew`) and one SELECT for all of a worker's runs, instead of a
    query or two per run every second (a hundred runs made a hundred queries a second,
    each a thread hop and a pool checkout, on the worker that also journals their
    deltas). Without `renew` only the cancel flags are read and every lease counts as
    held (a poll between renewals).
    """
    if not claims:
        return {}
    if renew:
        now = timezone.now()
        owned = functools.reduce(operator.or_, (Q(pk=c.run_id, lease_token=c.token) for c in claims))
        Run.objects.filter(owned, status=Run.RUNNING).update(
            lease_expires_at=now + timedelta(seconds=lease), heartbeat_at=now
        )
    rows = {
        pk: (token, status, cancel_requested, cancel_by)
        for pk, token, status, cancel_requested, cancel_by in Run.objects.filter(
            pk__in=[c.run_id for c in claims]
        ).values_list("pk", "lease_token", "status", "cancel_requested", "cancel_requested_by")
    }
    beats: dict[str, tuple[bool, str | None]] = {}
    for claim in claims:
        row = rows.get(claim.run_id)
        if row is None:  # deleted with its session
            beats[claim.run_id] = (not renew, None)
            continue
        token, status, cancel_requested, cancel_by = row
        held = not renew or (token == claim.token and status == Run.RUNNING)
        beats[claim.run_id] = (held, cancel_by if cancel_requested else None)
    return beats


def release_lease(claim: Claim) -> None:
    """Let another worker recover the run at once (graceful shutdown past its drain time)."""
    Run.objects.filter(pk=claim.run_id, lease_token=claim.token).update(lease_expires_at=timezone.now())


class DatabaseRunControl(RunControl):
    """The steer slot lives on the Run row: taking it empties the row's slot."""

    def __init__(self, claim: Claim) -> None:
        super().__init__()
        self.claim = claim

    async def take_steer(self) -> tuple[str, str | None] | None:
        local = await super().take_steer()
        durable = await run_in_db_thread(self._take_durable)
        if local and durable:
            return f"{local[0]}\n\n{durable[0]}", local[1]
        return local or durable

    def _take_durable(self) -> tuple[str, str | None] | None:
        with transaction.atomic():
            run = Run.objects.select_for_update().filter(pk=self.claim.run_id, lease_token=self.claim.token).first()
            if run is None:
                raise LeaseLost(f"run {self.claim.run_id}: lease lost")
            if not run.pending_steer:
                return None
            text, author = run.pending_steer, run.steer_author or None
            run.pending_steer, run.steer_author = "", ""
            run.save(update_fields=["pending_steer", "steer_author"])
            return text, author


# ---- pokes: tell a worker to look at a run's cancel flag now ----

_local_workers: set[Worker] = set()
_local_lock = threading.Lock()


def poke_run_on_commit(run_id: str) -> None:
    transaction.on_commit(lambda: poke_run(run_id))


def poke_run(run_id: str) -> None:
    with _local_lock:
        workers = list(_local_workers)
    for worker in workers:
        worker.poke_threadsafe(run_id)
    if not getattr(settings, "REDIS_URL", ""):
        return  # the in-memory layer cannot reach other processes; local pokes did it
    from channels.layers import get_channel_layer

    layer = get_channel_layer()
    if layer is None:
        return
    try:
        async_to_sync(layer.group_send)(RUN_CONTROL_GROUP_PREFIX + run_id, {"type": "run.control", "run_id": run_id})
    except Exception:  # the poll fallback still sees the flag
        log.warning("could not poke run %s through the channel layer", run_id, exc_info=True)


def wake_local_workers() -> None:
    with _local_lock:
        workers = list(_local_workers)
    for worker in workers:
        worker.wake_threadsafe()


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
    ) -> None:
        self.concurrency = concurrency
        self.lease = lease if lease is not None else lease_seconds()
        self.poll_interval = poll_interval
        self.worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.runtime = runtime or get_runtime()
        self.listen = bool(getattr(settings, "REDIS_URL", "")) if listen is None else listen
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.controls: dict[str, DatabaseRunControl] = {}
        self.claims: dict[str, Claim] = {}
        #: runs whose invocation is executing: the heartbeat renews their leases
        self.beating: dict[str, Claim] = {}
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None

    # thread-safe entry points
    def wake_threadsafe(self) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._wake.set)

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
        beats = await run_in_db_thread(heartbeat_runs, [claim], self.lease, renew=True)
        held, cancel_by = beats[claim.run_id]
        if cancel_by is not None or not held:
            control.cancel(cancel_by or None)

    async def run(self, *, drain_timeout: float = 30.0) -> None:
        """Claim and execute runs until stop(); then drain the runs in progress."""
        self._loop = asyncio.get_running_loop()
        with _local_lock:
            _local_workers.add(self)
        listener = asyncio.ensure_future(self._listen()) if self.listen else None
        heartbeat = asyncio.ensure_future(self._heartbeat())
        log.info("worker %s started (concurrency %s, lease %ss)", self.worker_id, self.concurrency, self.lease)
        try:
            while not self._stopping.is_set():
                # Cleared before looking, not after: a wake-up that arrives while we
                # claim (a run committed just after our query) must not be lost for a
                # whole poll interval.
                self._wake.clear()
                claimed = await self._fill()
                if claimed:
                    continue
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self.poll_interval)
        finally:
            with _local_lock:
                _local_workers.discard(self)
            if listener is not None:
                listener.cancel()
            try:
                await self._drain(drain_seconds=drain_timeout)
            finally:
                heartbeat.cancel()

    async def _fill(self) -> bool:
        """Claim runs while there are free slots; True if any was claimed."""
        claimed = False
        while len(self.tasks) < self.concurrency and not self._stopping.is_set():
            try:
                claim = await run_in_db_thread(claim_next_run, self.worker_id, self.lease)
            except Exception:
                log.exception("claiming failed")
                return claimed
            if claim is None:
                return claimed
            claimed = True
            self.claims[claim.run_id] = claim
            self.controls[claim.run_id] = DatabaseRunControl(claim)
            task = asyncio.ensure_future(self._execute(claim))
            self.tasks[claim.run_id] = task
            task.add_done_callback(functools.partial(self._forget, claim.run_id))
        return claimed

    def _forget(self, run_id: str, _task: object = None) -> None:
        self.tasks.pop(run_id, None)
        self.controls.pop(run_id, None)
        self.claims.pop(run_id, None)
        self._wake.set()  # a slot is free

    async def _execute(self, claim: Claim) -> None:
        control = self.controls[claim.run_id]
        self.beating[claim.run_id] = claim
        channel_group = RUN_CONTROL_GROUP_PREFIX + claim.run_id
        await self._group_add(channel_group)
        try:
            terminal = await self.runtime.run_invocation(
                claim.session_id, claim.invocation_id, control=control, fence=claim.fence
            )
        except LeaseLost:
            log.warning("run %s: lease lost; another worker owns it now", claim.run_id)
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
            await self._group_discard(channel_group)
        try:
            await run_in_db_thread(finish_run, claim, terminal)
            await run_in_db_thread(actions.promote_pending_run, claim.session_id)
        except Exception:
            log.exception("run %s: could not record its end", claim.run_id)

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
            claims = list(self.beating.values())
            if not claims:
                continue
            try:
                beats = await run_in_db_thread(heartbeat_runs, claims, self.lease, renew=renew)
            except Exception:
                log.warning("heartbeat of %d run(s) failed", len(claims), exc_info=True)
                continue
            for claim in claims:
                if self.beating.get(claim.run_id) is not claim:
                    continue  # it ended (or is recording its end) meanwhile
                held, cancel_by = beats.get(claim.run_id, (True, None))
                if not held:
                    log.warning("run %s: lease lost; stopping it", claim.run_id)
                    task = self.tasks.get(claim.run_id)
                    if task is not None:
                        task.cancel()
                    continue
                control = self.controls.get(claim.run_id)
                if cancel_by is not None and control is not None:
                    control.cancel(cancel_by or None)

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
                await run_in_db_thread(release_lease, claim)

    # ---- channel layer (multi-process wake-ups) ----

    async def _listen(self) -> None:
        from channels.layers import get_channel_layer

        layer = get_channel_layer()
        if layer is None:
            return
        self._channel = await layer.new_channel("sectr.worker.")
        await layer.group_add(WORKERS_GROUP, self._channel)
        while True:
            try:
                message = await layer.receive(self._channel)
            except asyncio.CancelledError:
                raise
            except Exception:
                await asyncio.sleep(1)
                continue
            if message.get("type") == "runs.wake":
                self._wake.set()
            elif message.get("type") == "run.control" and message.get("run_id") in self.controls:
                asyncio.ensure_future(self._check_cancel(message["run_id"]))

    async def _group_add(self, group: str) -> None:
        if not self.listen or not hasattr(self, "_channel"):
            return
        from channels.layers import get_channel_layer

        layer = get_channel_layer()
        with contextlib.suppress(Exception):  # a slow channel layer must not hold the run up
            await asyncio.wait_for(layer.group_add(group, self._channel), 2.0)

    async def _group_discard(self, group: str) -> None:
        if not self.listen or not hasattr(self, "_channel"):
            return
        from channels.layers import get_channel_layer

        layer = get_channel_layer()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(layer.group_discard(group, self._channel), 2.0)


# ---- the embedded worker (SQLite default: inside the serving process) ----

_embedded: Worker | None = None
_embedded_task: asyncio.Task[None] | None = None  # held: the loop keeps only weak references


def embedded_worker_enabled() -> bool:
    default = connection.vendor == "sqlite"
    raw = os.environ.get("SECTR_EMBEDDED_WORKER")
    return default if raw in (None, "") else raw.lower() in {"1", "true", "yes", "on"}


def start_embedded_worker() -> Worker | None:
    """Start a worker on the running event loop (the server's), once per process."""
    global _embedded, _embedded_task
    if _embedded is not None or not embedded_worker_enabled():
        return _embedded
    loop = asyncio.get_running_loop()  # first: outside a running loop, record nothing
    # No channel-layer listener: this process's actions wake and poke it directly, and
    # a Redis receive loop on the server's own event loop delayed browser frames by
    # seconds (bench/live.py). Pokes from other processes reach it by polling.
    _embedded = Worker(concurrency=int(os.environ.get("SECTR_WORKER_CONCURRENCY", "16")), listen=False)
    _embedded_task = loop.create_task(_embedded.run())
    return _embedded
