"""Django's SQLite backend, with this process's writers taking turns at BEGIN.

SQLite has one writer at a time. A writer that finds the database locked sleeps in
SQLite's busy handler (1, 2, 5, 10 ... 100 ms between tries), which is unfair: a
request's transaction could wait seconds while the journal's writer thread, which
commits in a tight loop, kept winning (bench/live.py at N=100 on the embedded default:
a POST's BEGIN IMMEDIATE waited 1.8 s p50). Here every outermost transaction of this
process first takes a per-database turn (`FairTurn`: first come, first served, so the
writer thread cannot win every race), so threads take turns within microseconds; other
processes still queue on SQLite's busy_timeout. A thread that waits
longer than TURN_TIMEOUT goes on to BEGIN without its turn (SQLite's own lock still
keeps it correct), so a transaction that waits on another thread can never deadlock.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Any

from django.db.backends.sqlite3 import base

#: Seconds a transaction waits for its turn before it falls back to SQLite's busy handler.
TURN_TIMEOUT = 20.0


class FairTurn:
    """A reentrant lock granted in the order it was asked for (a plain Lock lets the
    thread that just released it take it again at once, and a busy writer starves the
    rest)."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._waiting: collections.deque[object] = collections.deque()
        self._owner: int | None = None
        self._depth = 0

    def acquire(self, timeout: float) -> bool:
        me = threading.get_ident()
        with self._cond:
            if self._owner == me:
                self._depth += 1
                return True
            if self._owner is None and not self._waiting:
                self._owner, self._depth = me, 1
                return True
            ticket = object()
            self._waiting.append(ticket)
            deadline = time.monotonic() + timeout
            while self._owner is not None or self._waiting[0] is not ticket:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self._waiting.remove(ticket)
                    self._cond.notify_all()  # the next in line may be free to go now
                    return False
                self._cond.wait(remaining)
            self._waiting.popleft()
            self._owner, self._depth = me, 1
            return True

    def release(self) -> None:
        with self._cond:
            if self._owner != threading.get_ident():
                raise RuntimeError("release of a turn this thread does not hold")
            self._depth -= 1
            if self._depth == 0:
                self._owner = None
                self._cond.notify_all()


_turns: dict[str, FairTurn] = {}
_turns_guard = threading.Lock()


def writer_turn(name: str) -> FairTurn:
    """The turn of the SQLite file `name`, shared by every connection of this process."""
    with _turns_guard:
        return _turns.setdefault(name, FairTurn())


#: typed loosely: django-stubs leaves out the private methods overridden here
_SQLiteWrapper: Any = base.DatabaseWrapper


class DatabaseWrapper(_SQLiteWrapper):
    _turn: FairTurn | None = None

    def _start_transaction_under_autocommit(self) -> None:
        turn = writer_turn(str(self.settings_dict["NAME"]))
        held = turn.acquire(TURN_TIMEOUT)
        try:
            super()._start_transaction_under_autocommit()
        except BaseException:
            if held:
                turn.release()
            raise
        if held:
            self._turn = turn

    def _end_turn(self) -> None:
        turn, self._turn = self._turn, None
        if turn is not None:
            turn.release()

    def _commit(self) -> None:
        try:
            super()._commit()
        finally:
            self._end_turn()

    def _rollback(self) -> None:
        try:
            super()._rollback()
        finally:
            self._end_turn()

    def _close(self) -> None:
        try:
            super()._close()
        finally:
            self._end_turn()
