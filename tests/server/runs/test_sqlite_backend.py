"""The SQLite backend's writer turn (sectr_web/sqlite_backend): first come, first served."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, transaction

from sectr_web.sqlite_backend.base import FairTurn, writer_turn


def test_the_turn_is_granted_in_the_order_it_was_asked_for() -> None:
    turn = FairTurn()
    assert turn.acquire(1)
    order: list[str] = []

    def wait_for_turn(name: str) -> None:
        assert turn.acquire(5)
        order.append(name)
        turn.release()

    threads = []
    for name in ("b", "c", "d", "e"):
        thread = threading.Thread(target=wait_for_turn, args=(name,))
        thread.start()
        threads.append(thread)
        time.sleep(0.05)  # each is queued before the next asks
    turn.release()
    for thread in threads:
        thread.join(5)
    assert order == ["b", "c", "d", "e"]


def test_a_releasing_thread_does_not_jump_the_queue() -> None:
    turn = FairTurn()
    assert turn.acquire(1)
    got: list[str] = []
    waiter = threading.Thread(target=lambda: (turn.acquire(5), got.append("waiter"), turn.release()))
    waiter.start()
    time.sleep(0.05)
    turn.release()
    assert turn.acquire(5)  # the waiter asked first: it had its turn before this one
    got.append("releaser")
    turn.release()
    waiter.join(5)
    assert got == ["waiter", "releaser"]


def test_the_turn_is_reentrant_and_times_out_for_others() -> None:
    turn = FairTurn()
    assert turn.acquire(1) and turn.acquire(1)
    result: list[bool] = []
    other = threading.Thread(target=lambda: result.append(turn.acquire(0.1)))
    other.start()
    other.join(5)
    assert result == [False]  # it gave up and would BEGIN under SQLite's busy handler
    turn.release()
    turn.release()
    with pytest.raises(RuntimeError):
        turn.release()
    late = threading.Thread(target=lambda: result.append(turn.acquire(1)) or turn.release())
    late.start()
    late.join(5)
    assert result == [False, True]


@pytest.mark.django_db(transaction=True)
def test_transactions_take_and_give_back_the_turn() -> None:
    if connection.vendor != "sqlite":
        pytest.skip("the writer turn is SQLite's (PostgreSQL has row locks)")
    assert connection.settings_dict["ENGINE"] == "sectr_web.sqlite_backend"
    turn = writer_turn(str(connection.settings_dict["NAME"]))
    with transaction.atomic():
        assert turn._owner == threading.get_ident()
    assert turn._owner is None
    with pytest.raises(ZeroDivisionError), transaction.atomic():
        assert turn._owner == threading.get_ident()
        1 / 0  # noqa: B018 - the rollback must give the turn back too
    assert turn._owner is None
