"""MemoryJournal: atomic batches and a projection that callers cannot corrupt."""

import pytest

from sectr.events import EventType
from sectr.journal import MemoryJournal, NewEvent


async def test_it_writes_nothing_when_a_batch_fails_half_way() -> None:
    journal = MemoryJournal()
    sid = journal.create()
    await journal.append(sid, [NewEvent(EventType.SESSION_CREATED, {"mode": "default", "model": "demo"})])
    before = await journal.state(sid)
    bad = [
        NewEvent(EventType.SESSION_UPDATED, {"title": "changed"}),
        NewEvent(EventType.APPROVAL_REQUESTED, {"name": "x"}),  # no ask_id: the projection fails
    ]
    with pytest.raises(KeyError):
        await journal.append(sid, bad)
    after = await journal.state(sid)
    assert journal.read(sid)[-1].seq == 1
    assert after.title == before.title is None
    assert after.last_seq == 1


async def test_it_hands_out_copies_of_the_projection() -> None:
    journal = MemoryJournal()
    sid = journal.create()
    await journal.append(sid, [NewEvent(EventType.SESSION_CREATED, {"mode": "default", "model": "demo"})])
    state = await journal.state(sid)
    state.title = "scribbled"
    state.grants.append("write_note")
    fresh = await journal.state(sid)
    assert fresh.title is None
    assert fresh.grants == []
