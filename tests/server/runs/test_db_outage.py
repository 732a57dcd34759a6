"""A PostgreSQL restart seen from one process: every idle connection of its pool dies.

The first query on a dead connection fails (JournalUnavailable for the journal, which
the runtime does not take for the invocation's failure); that failure has the pool test
its idle connections, so the next ones work at once instead of each failing in turn.
PostgreSQL only (SQLite has no server to lose; tests/server/runs/test_faults.py restarts the
real one through the cluster).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection

from sectr.errors import JournalUnavailable
from sectr.events import EventType
from sectr.journal import NewEvent
from sessions_app.dbthread import check_connection_pools, run_in_db_thread
from sessions_app.journal import DatabaseJournal
from sessions_app.models import Envelope

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def postgres_only() -> Iterator[None]:
    if connection.vendor != "postgresql":
        pytest.skip("a pool of connections to a server that restarts is PostgreSQL's")
    yield
    # The test's own connection died too (its pool cannot tell until it is used): give it
    # back and have the pool test its idle ones, so later tests get live connections.
    connection.close()
    check_connection_pools()


def terminate_other_backends() -> int:
    """What a restart does to this database's connections (but this test's own)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid, 5000)) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return int(cursor.fetchone()[0])


def delta(text: str) -> list[NewEvent]:
    return [NewEvent(EventType.MESSAGE_DELTA, {"message_id": "m1", "text": text})]


async def test_after_its_connections_died_one_append_fails_and_the_next_ones_work(make_session: Any) -> None:
    session = await run_in_db_thread(make_session)
    journal = DatabaseJournal(publish=False)
    # Several pooled connections, as a busy process has.
    await asyncio.gather(*(run_in_db_thread(lambda: Envelope.objects.count()) for _ in range(6)))
    await journal.append(session.pk, delta("a"))
    assert await run_in_db_thread(terminate_other_backends) >= 2
    outcomes = []
    for text in "bcde":
        try:
            await journal.append(session.pk, delta(text))
            outcomes.append("ok")
        except JournalUnavailable:
            outcomes.append("unavailable")
    assert outcomes in (["unavailable", "ok", "ok", "ok"], ["ok", "ok", "ok", "ok"]), outcomes
    rows = await run_in_db_thread(
        lambda: list(Envelope.objects.filter(session_id=session.pk).order_by("seq").values_list("seq", "payload"))
    )
    assert [seq for seq, _ in rows] == list(range(1, len(rows) + 1))
    written = "".join(payload.get("text", "") for _, payload in rows)
    assert written == ("a" + "cde" if outcomes[0] == "unavailable" else "abcde")
