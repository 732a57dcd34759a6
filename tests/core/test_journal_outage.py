"""The journal going away mid-run (a database restart) is not the invocation's failure:
the runtime stops writing and raises JournalUnavailable, journaling no INVOCATION_FAILED
(which would end for good a run that recovery can continue); the session stays running
for the worker's recovery (tests/server/runs/test_faults.py restarts PostgreSQL for real)."""

from __future__ import annotations

from typing import Any

import pytest

import sectr
from sectr import LocalRuntime, SessionContext
from sectr.errors import JournalUnavailable
from sectr.events import EventType
from sectr.providers.demo import DemoProvider


class OutageJournal(sectr.MemoryJournal):
    """A journal that refuses the next `failures` appends (its store went away, and is
    back for the write after: a restart, or one stale connection of a pool)."""

    failures = 0

    async def append(self, session_id: str, events: Any, *, fence: Any = None) -> list[sectr.Envelope]:
        if self.failures:
            self.failures -= 1
            raise JournalUnavailable("the journal's database is unavailable: connection refused")
        return await super().append(session_id, events, fence=fence)


@pytest.mark.parametrize("where", ["delta", "event"])
async def test_a_journal_outage_stops_the_run_without_failing_it(demo: DemoProvider, where: str) -> None:
    journal = OutageJournal()
    went_on: list[str] = []

    async def handler(ctx: SessionContext) -> None:
        async with ctx.message() as m:
            await m.text("before ")
            await ctx.writer.flush()
            journal.failures = 1
            if where == "delta":
                await m.text("during")
                await ctx.writer.flush()
            else:
                await ctx.writer.emit(EventType.SESSION_ERROR, {"error": "a note"})
            went_on.append("the handler went on")

    rt = LocalRuntime(handler=handler, provider=demo, journal=journal)
    sid = await rt.create_session()
    with pytest.raises(JournalUnavailable):
        await rt.send(sid, "go")
    assert went_on == []
    kinds = [e.type for e in await journal.load(sid)]
    # Not failed for good (nor completed): the journal was back, yet nothing more was written.
    assert EventType.INVOCATION_FAILED not in kinds and EventType.INVOCATION_COMPLETED not in kinds
    assert kinds[-1] is EventType.MESSAGE_DELTA
    assert (await journal.state(sid)).is_active, "left running: the worker's recovery continues it"


async def test_a_tool_that_lost_the_database_stops_the_run_for_recovery(demo: DemoProvider) -> None:
    @sectr.tool(idempotent=True)
    def read_the_books() -> str:
        """Reads the platform's database."""
        raise JournalUnavailable("the database is unavailable: server closed the connection unexpectedly")

    journal = sectr.MemoryJournal()
    rt = LocalRuntime(provider=demo, journal=journal, tools=[read_the_books])
    sid = await rt.create_session()
    with pytest.raises(JournalUnavailable):
        await rt.send(sid, "!tool read_the_books {}")
    envelopes = await journal.load(sid)
    kinds = [e.type for e in envelopes]
    # No error result for the model, no failed run: recovery runs the (idempotent) call again.
    assert EventType.TOOL_RESULT not in kinds and EventType.INVOCATION_FAILED not in kinds
    assert kinds[-1] is EventType.MESSAGE_END and envelopes[-2].type is EventType.TOOL_CALL
    assert (await journal.state(sid)).is_active
