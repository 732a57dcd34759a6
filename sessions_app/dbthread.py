"""Running sync database code from async code: the journal's thread pool.

`run_in_db_thread(func, *args)` is channels' database_sync_to_async for code that is not a
consumer: the journal's async methods, the worker, the SSE endpoint and media resolution
run their queries through it. It runs in a pool of its own (not the one
thread-sensitive thread: many invocations append at once), closes stale connections
around the work, keeps SQLite connections warm, and after a connection error has the
process's PostgreSQL pools test their idle connections (`check_connection_pools`). A
lost database is `JournalUnavailable` for every caller (never a run's failure: the run is
recovered; the API answers 503).
SQLite's single writer gets a dedicated thread (`run_in_sqlite_writer_thread`).

It sits below the journal (sessions_app.journal.database) and the media store
(sessions_app.media), which both use it.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, ParamSpec, TypeVar, cast

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, InterfaceError, OperationalError, close_old_connections, connections

from sectr.errors import JournalUnavailable

logger = logging.getLogger("sectr.journal")

_P = ParamSpec("_P")
_R = TypeVar("_R")

_executor: ThreadPoolExecutor | None = None


def journal_executor() -> ThreadPoolExecutor:
    """The threads the async methods run in (SECTR_JOURNAL_THREADS, default 16).

    Keep it at or below the PostgreSQL pool's size (SECTR_DB_POOL_MAX): each busy
    thread holds one connection.
    """
    global _executor
    if _executor is None:
        _executor = ThreadPoolExecutor(max_workers=settings.SECTR_JOURNAL_THREADS, thread_name_prefix="sectr-journal")
    return _executor


#: How long a journal thread keeps an idle SQLite connection open (seconds).
SQLITE_KEEPALIVE = 300.0


def _keep_sqlite_connections() -> None:
    """Let this journal thread's SQLite connections outlive CONN_MAX_AGE=0.

    Opening a Django SQLite connection costs ~0.35 ms (functions to register, pragmas),
    more than an append; with CONN_MAX_AGE=0 every async append would pay it. The
    journal's threads are few and long-lived, so keeping one connection each is bounded
    (the ASGI leak CONN_MAX_AGE=0 guards against comes from short-lived request threads).
    close_old_connections() still closes a connection that errored or became unusable.
    PostgreSQL connections go back to psycopg's pool as usual: holding them here would
    starve the request threads.
    """
    deadline = time.monotonic() + SQLITE_KEEPALIVE
    for connection in connections.all(initialized_only=True):
        if connection.vendor == "sqlite" and connection.connection is not None and connection.close_at is not None:
            connection.close_at = deadline


#: After a lost connection, how long (seconds) every database-thread call tests its
#: pooled connection before use (see _replace_dead_connection).
SUSPECT_SECONDS = 10.0
_suspect_until = 0.0


def check_connection_pools() -> None:
    """Test the idle connections of this process's PostgreSQL pools, replacing the dead.

    psycopg's pool hands out a connection without testing it (a test per checkout would
    cost a round trip on every query), so after PostgreSQL restarts every idle one is
    dead and each would fail its next user in turn. Called on the first connection error
    instead: one failure, then the pool is whole again. Nothing on SQLite.

    The connections checked out at that moment are not idle, so the check cannot see
    them, and they come back to the pool dead but unused; for SUSPECT_SECONDS every call
    in a database thread tests its connection first (`_replace_dead_connection`): a
    run's next read got one of them and the run was stopped again, restart after
    restart, until it was failed as lost too often.
    """
    global _suspect_until
    _suspect_until = time.monotonic() + SUSPECT_SECONDS
    # Every alias, not only this thread's initialized ones: the pools are the process's
    # (a wrapper per thread, one pool per alias), and a thread of its own has none yet.
    for connection in connections.all():
        pool = getattr(connection, "pool", None) if connection.vendor == "postgresql" else None
        if pool is None:
            continue
        try:
            pool.check()
        except Exception:  # still down: the next error checks again
            logger.warning("checking the %s connection pool failed", connection.alias, exc_info=True)


def check_connection_pools_soon() -> None:
    """`check_connection_pools` in a thread of its own, for code on an event loop (it
    costs a round trip per idle connection); not again while a check's window lasts."""
    if time.monotonic() >= _suspect_until:
        threading.Thread(target=check_connection_pools, name="sectr-pool-check", daemon=True).start()


def reset_connection(alias: str = DEFAULT_DB_ALIAS) -> None:
    """After a connection error: give the broken connection back (its pool drops it)
    and have the pools test their idle ones (a restart killed them all)."""
    with contextlib.suppress(Exception):
        connections[alias].close()
    check_connection_pools()


def _replace_dead_connection(alias: str = DEFAULT_DB_ALIAS) -> None:
    """Check out a PostgreSQL connection that answers, giving dead ones back to their pool
    (which drops them): one round trip each, only just after a lost connection."""
    connection = connections[alias]
    if connection.vendor != "postgresql":
        return
    for _ in range(DEAD_CONNECTION_TRIES):
        connection.ensure_connection()  # the database still down: OperationalError
        if connection.is_usable():  # SELECT 1
            return
        connection.close()


#: Dead pooled connections one call gives back at most before it goes ahead anyway.
DEAD_CONNECTION_TRIES = 25


def _call_with_fresh_connections(func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    close_old_connections()
    broken = False
    if time.monotonic() < _suspect_until:
        try:
            _replace_dead_connection()
        except (OperationalError, InterfaceError):
            close_old_connections()
            raise
    try:
        return func(*args, **kwargs)
    except (OperationalError, InterfaceError):
        broken = True
        raise
    finally:
        _keep_sqlite_connections()
        close_old_connections()  # a connection that broke goes back to its pool, which drops it
        if broken:
            check_connection_pools()


def _lost_database_errors() -> tuple[type[BaseException], ...]:
    """What a lost database raises: Django's wrappers of the driver's OperationalError and
    InterfaceError (a terminated backend, "terminating connection due to administrator
    command", a refused connection, the pool's timeout), and psycopg's own for code that
    uses a raw connection (the pool's PoolTimeout is a psycopg OperationalError)."""
    errors: list[type[BaseException]] = [OperationalError, InterfaceError]
    with contextlib.suppress(ImportError):  # psycopg is there whenever PostgreSQL is
        import psycopg

        errors += [psycopg.OperationalError, psycopg.InterfaceError]
    return tuple(errors)


LOST_DATABASE_ERRORS = _lost_database_errors()


@contextmanager
def database_lost_as_unavailable() -> Iterator[None]:
    """The database went away (a restart, a lost connection): JournalUnavailable, which
    is not the invocation's failure (the runtime stops it and its run is recovered) and
    which the API answers with 503 and Retry-After."""
    try:
        yield
    except LOST_DATABASE_ERRORS as exc:
        raise database_unavailable(exc) from exc


def database_unavailable(exc: BaseException) -> JournalUnavailable:
    """What `database_lost_as_unavailable` raises for `exc` (a LOST_DATABASE_ERRORS), for
    code on a hot path that catches it itself rather than enter a context manager."""
    return JournalUnavailable(f"the database is unavailable: {exc}")


_db_thread_call: Callable[..., Awaitable[Any]] | None = None
_sqlite_writer_call: Callable[..., Awaitable[Any]] | None = None
_sqlite_writer_executor: ThreadPoolExecutor | None = None


async def run_in_sqlite_writer_thread(func: Callable[_P, _R], *args: _P.args, **kwargs: _P.kwargs) -> _R:
    """Like run_in_db_thread, on one dedicated thread: SQLite has a single writer anyway,
    and one thread keeps one warm connection (appends spread over the pool's threads
    each paid for a colder connection: 430 us an append against 290 us on one thread)."""
    global _sqlite_writer_call
    if _sqlite_writer_call is None:
        _sqlite_writer_call = sync_to_async(
            _call_with_fresh_connections, thread_sensitive=False, executor=_sqlite_writer()
        )
    with database_lost_as_unavailable():
        return cast(_R, await _sqlite_writer_call(func, args, kwargs))


def _sqlite_writer() -> ThreadPoolExecutor:
    global _sqlite_writer_executor
    if _sqlite_writer_executor is None:
        _sqlite_writer_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sectr-sqlite-writer")
    return _sqlite_writer_executor


async def run_plain_in_db_thread(func: Callable[..., _R], *args: Any, sqlite_writer: bool = False) -> _R:
    """`run_in_db_thread` (`run_in_sqlite_writer_thread` with `sqlite_writer`) without
    asgiref's SyncToAsync, for sync code that never calls back into async code
    (async_to_sync): the journal's group commit, once per group of streamed chunks.

    The same threads, the same connection handling (`_call_with_fresh_connections`),
    the caller's context variables copied into the call, and the same outcome of a
    cancel (the caller is cancelled at once; a call already running runs to its end, one
    not started yet never starts). What it leaves out is what only code calling back
    into the event loop needs (the thread's note of the loop, the context's changes
    copied back to the caller, each asgiref Local re-homed), and it cost more than the
    call: SyncToAsync was a twentieth of a worker's CPU per streamed chunk (py-spy,
    bench/run_lifecycle.py --ticks 30).
    """
    executor = _sqlite_writer() if sqlite_writer else journal_executor()
    call = contextvars.copy_context().run
    try:
        return cast(
            _R,
            await asyncio.get_running_loop().run_in_executor(
                executor, call, _call_with_fresh_connections, func, args, {}
            ),
        )
    except LOST_DATABASE_ERRORS as exc:
        raise database_unavailable(exc) from exc


async def run_in_db_thread(func: Callable[_P, _R], *args: _P.args, **kwargs: _P.kwargs) -> _R:
    """Run sync database code in the journal's thread pool, like database_sync_to_async.

    Stale connections are closed before and after the work (as database_sync_to_async
    does), except that SQLite connections are kept for reuse (see _keep_sqlite_connections).

    A lost database is JournalUnavailable here, for every caller at once: a run's reads
    outside the journal (its rules, its media) once failed the run for good on
    "terminating connection due to administrator command" instead of leaving it to
    recovery.
    """
    global _db_thread_call
    if _db_thread_call is None:
        # Built once: a SyncToAsync costs more to construct than to call.
        _db_thread_call = sync_to_async(
            _call_with_fresh_connections, thread_sensitive=False, executor=journal_executor()
        )
    with database_lost_as_unavailable():
        return cast(_R, await _db_thread_call(func, args, kwargs))
