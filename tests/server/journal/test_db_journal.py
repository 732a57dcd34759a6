"""The database journal: gapless concurrent appends, fencing, all-or-nothing batches,
the cached projection, compaction reads, live publication, and API tokens.

Run on SQLite (in-memory channel layer) and on PostgreSQL (Redis channel layer).
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from datetime import timedelta
from typing import Any
from unittest.mock import patch

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.db import OperationalError, connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from sectr.errors import LeaseLost, NotFound
from sectr.events import (
    Envelope,
    EventType,
    approval_decision_reason,
    usage_dict,
    user_message_reason,
)
from sectr.journal import MemoryJournal, NewEvent
from sectr.payloads import InvalidEvent
from sectr.state import project
from sectr.writer import InvocationWriter
from sessions_app.journal import DatabaseJournal, publish
from sessions_app.journal.database import UPDATED_AT_STEP, _PendingAppend
from sessions_app.models import ApiToken, MediaBlob, Run, SearchEntry, Session, SessionMedia, UsageDaily
from sessions_app.models import Envelope as EnvelopeRow
from tests.server.conftest import run_threads

E = EventType


def delta(text: str, message_id: str = "msg_1", invocation_id: str | None = "inv_1") -> NewEvent:
    return NewEvent(E.MESSAGE_DELTA, {"message_id": message_id, "text": text}, invocation_id)


def seqs(session_id: str) -> list[int]:
    return list(EnvelopeRow.objects.filter(session_id=session_id).order_by("seq").values_list("seq", flat=True))


def close_connection() -> None:
    # Resolved in the calling thread: `connection` is a per-thread proxy.
    connection.close()


def mixed_events(inv: str = "inv_1") -> list[list[NewEvent]]:
    """Batches covering every kind of projection change, deltas in between."""
    ask = {"ask_id": "ask_1", "tool_call_id": "call_2", "name": "shell", "arguments": {"cmd": "ls"}}
    return [
        [NewEvent(E.SESSION_UPDATED, {"title": "Renamed", "mode": "plan"})],
        [NewEvent(E.INVOCATION_STARTED, {"reason": user_message_reason("hello")}, inv)],
        [NewEvent(E.MESSAGE_START, {"message_id": "msg_1", "role": "assistant", "model": "demo"}, inv)],
        [delta("Hel"), delta("lo")],
        [delta("!")],
        [
            NewEvent(E.MESSAGE_END, {"message_id": "msg_1", "usage": usage_dict(10, 5)}, inv),
            NewEvent(
                E.TOOL_CALL,
                {
                    "message_id": "msg_1",
                    "tool_call_id": "call_1",
                    "name": "write_note",
                    "arguments": '{"title": "a", "body": "b"}',
                },
                inv,
            ),
            NewEvent(E.TOOL_RESULT, {"tool_call_id": "call_1", "name": "write_note", "content": "ok"}, inv),
        ],
        [NewEvent(E.APPROVAL_REQUESTED, ask, inv), NewEvent(E.INVOCATION_SUSPENDED, {"ask_id": "ask_1"}, inv)],
        [
            NewEvent(
                E.INVOCATION_STARTED,
                {"reason": approval_decision_reason("ask_1", True, approver="owner", verdict="allow_always")},
                "inv_2",
            )
        ],
        [
            NewEvent(
                E.TRANSCRIPT_COMPACTED, {"messages": [{"role": "user", "content": "hello"}], "through_seq": 5}, "inv_2"
            )
        ],
        [NewEvent(E.MESSAGE_START, {"message_id": "msg_2", "role": "assistant"}, "inv_2")],
        [delta("bye", "msg_2", "inv_2")],
        [
            NewEvent(E.MESSAGE_END, {"message_id": "msg_2", "usage": usage_dict(7, 3, reasoning_tokens=1)}, "inv_2"),
            NewEvent(E.INVOCATION_COMPLETED, {"stop_reason": "end_turn", "usage": usage_dict(17, 8)}, "inv_2"),
        ],
        [delta("late", "msg_3", "inv_2")],
    ]


# ---- concurrency ----


@pytest.mark.django_db(transaction=True)
def test_it_gives_50_concurrent_appends_to_one_session_gapless_seqs(make_session: Any) -> None:
    session = make_session()
    journal = DatabaseJournal(publish=False)
    got: list[int] = []
    lock = threading.Lock()

    def append(i: int) -> None:
        # Half deltas (the fast path), half projection changes (the full path).
        event = (
            delta(f"d{i}") if i % 2 else NewEvent(E.TOOL_RESULT, {"tool_call_id": f"c{i}", "name": "x", "content": ""})
        )
        envelopes = journal.append_sync(session.id, [event])
        with lock:
            got.extend(e.seq for e in envelopes)

    _, errors = run_threads(50, append)
    assert errors == []
    assert sorted(got) == list(range(2, 52))  # seq 1 is SESSION_CREATED
    assert seqs(session.id) == list(range(1, 52))
    session.refresh_from_db()
    assert session.last_seq == 51
    assert session.projection().to_dict() == project(journal.load_sync(session.id)).to_dict()


@pytest.mark.django_db(transaction=True)
def test_it_keeps_each_session_gapless_under_concurrent_appends_to_many(make_session: Any) -> None:
    sessions = [make_session() for _ in range(4)]
    journal = DatabaseJournal(publish=False)

    def append(i: int) -> None:
        target = sessions[i % len(sessions)]
        for n in range(3):
            journal.append_sync(target.id, [delta(f"{i}.{n}"), delta("x")] if n % 2 else [delta(f"{i}.{n}")])

    _, errors = run_threads(24, append)
    assert errors == []
    for target in sessions:
        # 6 threads a session, each 1 + 2 + 1 envelopes, after SESSION_CREATED.
        assert seqs(target.id) == list(range(1, 1 + 6 * 4 + 1))
        target.refresh_from_db()
        assert target.last_seq == 25


@pytest.mark.django_db(transaction=True)
async def test_it_appends_concurrently_from_many_tasks(make_session: Any) -> None:
    session = await sync_to_async(make_session)()
    journal = DatabaseJournal(publish=False)
    batches = await asyncio.gather(*(journal.append(session.id, [delta(str(i))]) for i in range(30)))
    assert sorted(e.seq for batch in batches for e in batch) == list(range(2, 32))
    loaded = await journal.load(session.id)
    assert [e.seq for e in loaded] == list(range(1, 32))
    state = await journal.state(session.id)
    assert state.last_seq == 31


@pytest.mark.django_db(transaction=True)
async def test_it_reuses_the_journal_threads_sqlite_connections(session: Session, journal: DatabaseJournal) -> None:
    from django.db.backends.signals import connection_created

    opened: list[str] = []

    def count(sender: Any, connection: Any, **kwargs: Any) -> None:
        opened.append(connection.vendor)

    connection_created.connect(count)
    try:
        for i in range(20):
            await journal.append(session.id, [delta(str(i))])
    finally:
        connection_created.disconnect(count)
    if connection.vendor == "sqlite":
        assert len(opened) < 20  # kept between calls, not reopened for each append
    assert (await journal.state(session.id)).last_seq == 21


# ---- fencing and all-or-nothing ----


def leased_run(session: Session, token: str = "tok-current", **fields: Any) -> Run:
    return Run.objects.create(
        session=session, invocation_id="inv_1", status=Run.RUNNING, lease_owner="worker-a", lease_token=token, **fields
    )


@pytest.mark.django_db
def test_it_accepts_a_write_fenced_by_the_current_lease(session: Session, journal: DatabaseJournal) -> None:
    run = leased_run(session)
    envelopes = journal.append_sync(session.id, [delta("hi")], fence=(run.id, "tok-current"))
    assert [e.seq for e in envelopes] == [2]


@pytest.mark.django_db
@pytest.mark.parametrize("batch", [[delta("late")], [NewEvent(E.SESSION_ERROR, {"error": "x", "retryable": True})]])
def test_it_refuses_a_write_with_a_stale_lease_token(
    session: Session, journal: DatabaseJournal, batch: list[NewEvent]
) -> None:
    run = leased_run(session, token="tok-new")  # another worker took the run over
    with pytest.raises(LeaseLost):
        journal.append_sync(session.id, batch, fence=(run.id, "tok-old"))
    assert seqs(session.id) == [1]
    session.refresh_from_db()
    assert session.last_seq == 1


@pytest.mark.django_db
@pytest.mark.parametrize(
    "fields", [{"status": Run.COMPLETED}, {"status": Run.SUSPENDED}, {"finished_at": timezone.now()}]
)
@pytest.mark.parametrize("batch", [[delta("late")], [NewEvent(E.SESSION_ERROR, {"error": "x", "retryable": True})]])
def test_it_refuses_a_write_fenced_by_a_finished_run(
    session: Session, journal: DatabaseJournal, fields: dict[str, Any], batch: list[NewEvent]
) -> None:
    run = leased_run(session)
    Run.objects.filter(pk=run.pk).update(**fields)
    with pytest.raises(LeaseLost):
        journal.append_sync(session.id, batch, fence=(run.id, "tok-current"))
    assert seqs(session.id) == [1]


@pytest.mark.django_db
@pytest.mark.parametrize("batch", [[delta("late")], [NewEvent(E.SESSION_ERROR, {"error": "x", "retryable": True})]])
def test_it_refuses_a_fence_of_another_sessions_run(
    make_session: Any, journal: DatabaseJournal, batch: list[NewEvent]
) -> None:
    mine, other = make_session(), make_session()
    run = leased_run(other)
    with pytest.raises(LeaseLost):
        journal.append_sync(mine.id, batch, fence=(run.id, "tok-current"))
    with pytest.raises(LeaseLost):
        journal.append_sync(mine.id, batch, fence=("run_missing", "tok-current"))
    with pytest.raises(LeaseLost):
        journal.append_sync(mine.id, batch, fence="malformed")
    assert seqs(mine.id) == [1]


@pytest.mark.django_db
def test_a_fenced_append_of_other_events_takes_two_statements_on_postgresql(
    session: Session, journal: DatabaseJournal
) -> None:
    """The Session and Run rows locked in one statement, the envelopes inserted and the
    Session row updated in another (SQLite: each its own)."""
    run = leased_run(session)
    start = NewEvent(E.MESSAGE_START, {"message_id": "msg_1", "role": "assistant"}, "inv_1")
    with CaptureQueriesContext(connection) as queries:
        journal.append_sync(session.id, [start, delta("a")], fence=(run.id, "tok-current"))
    writes = [q["sql"][:60] for q in queries if not q["sql"].startswith(("SAVEPOINT", "RELEASE"))]
    assert len(writes) == (2 if connection.vendor == "postgresql" else 4), writes
    assert [e.type for e in journal.load_sync(session.id, 1)] == [E.MESSAGE_START, E.MESSAGE_DELTA]
    assert Session.objects.get(pk=session.pk).last_seq == 3


@pytest.mark.django_db
def test_a_fenced_reply_end_takes_its_runs_api_token_from_the_fence_row(
    session: Session, journal: DatabaseJournal
) -> None:
    """The fence's read of the run (on PostgreSQL the lock statement) takes its invocation
    and API token too, so the usage rollup of its reply needs no lookup; a reply of another
    invocation (or an append without a fence) still looks its token up."""
    run = leased_run(session, api_token_key=42)
    Run.objects.create(session=session, invocation_id="inv_0", status=Run.COMPLETED, api_token_key=7)
    usage = {"input_tokens": 3, "output_tokens": 1}
    start = NewEvent(E.MESSAGE_START, {"message_id": "msg_1", "role": "assistant", "model": "m1"}, "inv_1")
    journal.append_sync(session.id, [start, delta("a")], fence=(run.id, "tok-current"))
    end = NewEvent(E.MESSAGE_END, {"message_id": "msg_1", "usage": usage, "model": "m1"}, "inv_1")
    with CaptureQueriesContext(connection) as queries:
        journal.append_sync(session.id, [end], fence=(run.id, "tok-current"))
    lookups = [q["sql"] for q in queries if "api_token_key FROM" in q["sql"]]
    assert lookups == []
    other = NewEvent(E.MESSAGE_START, {"message_id": "msg_0", "role": "assistant", "model": "m0"}, "inv_0")
    other_end = NewEvent(E.MESSAGE_END, {"message_id": "msg_0", "usage": usage, "model": "m0"}, "inv_0")
    with CaptureQueriesContext(connection) as queries:
        journal.append_sync(session.id, [other, other_end], fence=(run.id, "tok-current"))
    assert len([q for q in queries if "api_token_key FROM" in q["sql"]]) == 1
    rows = UsageDaily.objects.values_list("api_token_key", "model", "input_tokens", "output_tokens", "messages")
    assert sorted(rows) == [(7, "m0", 3, 1, 1), (42, "m1", 3, 1, 1)]


@pytest.mark.django_db(transaction=True)
async def test_a_reply_its_writer_journaled_is_indexed_as_its_deltas_read_back(make_session: Any) -> None:
    """The same events, once through an InvocationWriter (its MESSAGE_ENDs carry their
    text) and once as plain appends (the journal reads the deltas back): the same search
    entries, interleaved messages and highlight markers included."""
    written, plain = await sync_to_async(make_session)(), await sync_to_async(make_session)()
    journal = DatabaseJournal(publish=False)
    writer = InvocationWriter(journal, written.id, "inv_1")

    def start(message_id: str) -> NewEvent:
        return NewEvent(E.MESSAGE_START, {"message_id": message_id, "role": "assistant"}, "inv_1")

    def end(message_id: str) -> NewEvent:
        return NewEvent(E.MESSAGE_END, {"message_id": message_id}, "inv_1")

    steps: list[NewEvent | tuple[str, str]] = [
        start("m1"), ("m1", "alpha "), ("m1", "be\x02ta"), end("m1"),
        start("m2"), ("m2", "gamma "), start("m3"), ("m2", "delta"), ("m3", "epsilon"), end("m2"), end("m3"),
    ]  # fmt: skip
    for step in steps:
        if isinstance(step, NewEvent):
            await writer.append(step)
            await journal.append(plain.id, [step])
        else:
            await writer.delta(step[0], text=step[1])
            await writer.flush()
            await journal.append(plain.id, [delta(step[1], step[0])])

    def entries(session_id: str) -> list[tuple[int, str, str]]:
        return list(
            SearchEntry.objects.filter(session_id=session_id).order_by("seq").values_list("seq", "kind", "text")
        )

    indexed = await sync_to_async(entries)(written.id)
    assert indexed == await sync_to_async(entries)(plain.id)
    assert [text for _seq, _kind, text in indexed] == ["alpha be ta", "delta", "epsilon"]


@pytest.mark.django_db(transaction=True)
async def test_a_writer_queues_each_idle_delta_in_the_group_commit_before_delta_returns(make_session: Any) -> None:
    """On the database journal a writer's delta goes to the group commit at once (its
    `submit`), with no task of the writer's: queued before delta() returns, the deltas
    that come while it is in flight follow in one envelope, the transcript follows each
    write, and a write's error (a bad delta, a lost fence) is the producer's next call's."""
    session = await sync_to_async(make_session)()
    journal = DatabaseJournal(publish=False)
    seen: list[Envelope] = []
    writer = InvocationWriter(journal, session.id, "inv_1", on_append=seen.extend)
    group = journal._group.get()
    await writer.append(NewEvent(E.MESSAGE_START, {"message_id": "m1", "role": "assistant"}, "inv_1"))
    tasks = len(asyncio.all_tasks())
    await writer.delta("m1", text="a")
    assert {sid: held[1] for sid, held in group._held.items()} == {session.id: 1}  # queued or in flight
    assert [e.type for e in seen] == [E.MESSAGE_START]
    await writer.delta("m1", text="b")  # while "a" is in flight: buffered
    await writer.delta("m1", text="c")
    assert len(asyncio.all_tasks()) <= tasks + 1  # the lane's drainer, no task per delta
    await writer.flush()
    deltas = [e for e in seen if e.type is E.MESSAGE_DELTA]
    assert [e.payload["text"] for e in deltas] == ["a", "bc"]
    assert [e.seq for e in seen] == list(range(seen[0].seq, seen[0].seq + 3))
    assert writer.appends == 3

    await writer.delta("m1", text="\x00")  # refused before it reaches the journal
    with pytest.raises(InvalidEvent):
        await writer.delta("m1", text="d")

    fenced = InvocationWriter(journal, session.id, "inv_1", fence=("run_gone", "tok"))
    await fenced.delta("m1", text="e")
    with pytest.raises(LeaseLost):
        await fenced.flush()
    stored = await sync_to_async(lambda: list(EnvelopeRow.objects.filter(session_id=session.id).order_by("seq")))()
    assert [row.payload.get("text") for row in stored if row.type == "MESSAGE_DELTA"] == ["a", "bc"]


@pytest.mark.django_db
def test_a_reply_end_with_its_text_is_indexed_without_reading_its_deltas(
    session: Session, journal: DatabaseJournal
) -> None:
    run = leased_run(session)
    start = NewEvent(E.MESSAGE_START, {"message_id": "msg_1", "role": "assistant"}, "inv_1")
    journal.append_sync(session.id, [start, delta("hello")], fence=(run.id, "tok-current"))
    end = NewEvent(E.MESSAGE_END, {"message_id": "msg_1"}, "inv_1", text="hello")
    with CaptureQueriesContext(connection) as queries:
        (envelope,) = journal.append_sync(session.id, [end], fence=(run.id, "tok-current"))
    reads = [q["sql"] for q in queries if q["sql"].startswith("SELECT") and "sessions_app_envelope" in q["sql"]]
    assert reads == []
    assert list(SearchEntry.objects.filter(session=session).values_list("seq", "kind", "text")) == [
        (envelope.seq, "assistant", "hello")
    ]


@pytest.mark.django_db
def test_it_rolls_back_only_the_refused_append_inside_an_outer_block(
    session: Session, journal: DatabaseJournal
) -> None:
    run = leased_run(session, token="tok-new")
    with transaction.atomic():
        journal.append_sync(session.id, [NewEvent(E.STEER_RECEIVED, {"text": "first"})])
        with pytest.raises(LeaseLost):
            journal.append_sync(session.id, [delta("late")], fence=(run.id, "tok-old"))
        journal.append_sync(session.id, [NewEvent(E.STEER_RECEIVED, {"text": "second"})])
    assert seqs(session.id) == [1, 2, 3]


@pytest.mark.django_db(transaction=True)
async def test_it_group_commits_concurrent_appends_of_many_sessions(make_session: Any) -> None:
    sessions = [await sync_to_async(make_session)() for _ in range(5)]
    journal = DatabaseJournal(publish=False)
    batches = await asyncio.gather(*(journal.append(s.id, [delta(f"{s.id}:{i}")]) for i in range(8) for s in sessions))
    (group,) = journal._group.values()
    assert group.appends == 40
    assert group.groups < 40  # appends that waited shared a transaction
    for s in sessions:
        assert await sync_to_async(seqs)(s.id) == list(range(1, 10))  # gapless, once each
        mine = [e for batch in batches for e in batch if e.session_id == s.id]
        assert [e.payload["text"] for e in sorted(mine, key=lambda e: e.seq)] == [f"{s.id}:{i}" for i in range(8)]


def hold_session_row(session_id: str, held: threading.Event, release: threading.Event) -> None:
    """Lock a Session row from another connection until `release` (a writer in the way)."""
    try:
        with transaction.atomic():
            Session.objects.select_for_update().get(pk=session_id)
            held.set()
            release.wait(10)
    finally:
        connection.close()


@pytest.mark.django_db(transaction=True)
async def test_streaming_deltas_do_not_wait_behind_another_sessions_slow_append(make_session: Any) -> None:
    """PostgreSQL: a session's deltas go in the streaming lane, and another session's
    other appends in another lane, beside a transaction of other appends (a run
    starting) that is slow; a session keeps its lane while it has an append in flight,
    so its own appends stay in order."""
    if connection.vendor != "postgresql":
        pytest.skip("SQLite has one writer: one lane")
    streaming, starting, other = [await sync_to_async(make_session)() for _ in range(3)]
    journal = DatabaseJournal(publish=False)
    held, release = threading.Event(), threading.Event()
    holder = threading.Thread(target=hold_session_row, args=(starting.id, held, release))
    holder.start()
    try:
        assert await asyncio.to_thread(held.wait, 5)
        slow = asyncio.ensure_future(journal.append(starting.id, [NewEvent(E.STEER_RECEIVED, {"text": "go"})]))
        await asyncio.sleep(0.05)
        # behind it in its lane: the session's delta waits for its earlier append
        behind = asyncio.ensure_future(journal.append(starting.id, [delta("after")]))
        for i in range(3):
            await asyncio.wait_for(journal.append(streaming.id, [delta(str(i))]), 5)
        await asyncio.wait_for(journal.append(other.id, [NewEvent(E.STEER_RECEIVED, {"text": "start"})]), 5)
        assert not slow.done() and not behind.done()
    finally:
        release.set()
        await asyncio.to_thread(holder.join, 10)
    (steer,), (after,) = await asyncio.wait_for(asyncio.gather(slow, behind), 5)
    assert (steer.seq, after.seq) == (2, 3)  # in the order they were appended
    assert await sync_to_async(seqs)(streaming.id) == [1, 2, 3, 4]
    assert await sync_to_async(seqs)(other.id) == [1, 2]
    (group,) = journal._group.values()
    assert group.appends == 6 and not group._held  # every lane let go of its sessions


@pytest.mark.django_db(transaction=True)
async def test_deltas_stream_in_a_lane_of_their_own_on_postgresql_only(make_session: Any) -> None:
    sessions = [await sync_to_async(make_session)() for _ in range(3)]
    journal = DatabaseJournal(publish=False)
    await asyncio.gather(
        *(
            journal.append(s.id, [delta("x")] if i else [NewEvent(E.STEER_RECEIVED, {"text": "go"})])
            for i, s in enumerate(sessions)
        )
    )
    (group,) = journal._group.values()
    used = [index for index, lane in enumerate(group.lanes) if lane.drainer is not None]
    assert used == ([0, 1] if connection.vendor == "postgresql" else [1])
    for s in sessions:
        assert await sync_to_async(seqs)(s.id) == [1, 2]


def lingering(journal: DatabaseJournal, seconds: float) -> Any:
    """This event loop's group commit of `journal`, its linger set to `seconds`."""
    group = journal._group.get()
    group.linger = seconds
    return group


async def stream_ticks(journal: DatabaseJournal, session_ids: list[str], ticks: int, pause: float) -> list[Envelope]:
    """Each session appends `ticks` deltas, one after another (as a run's writer does),
    the sessions a little apart: a steady load of many streams."""

    async def stream(index: int, session_id: str) -> list[Envelope]:
        await asyncio.sleep(index * pause / len(session_ids))
        written: list[Envelope] = []
        for tick in range(ticks):
            written += await journal.append(session_id, [delta(f"{session_id}:{tick}")])
            await asyncio.sleep(pause)
        return written

    batches = await asyncio.gather(*(stream(i, s) for i, s in enumerate(session_ids)))
    return [envelope for batch in batches for envelope in batch]


@pytest.mark.django_db
async def test_the_linger_is_the_setting_on_postgresql_and_off_on_sqlite(settings: Any) -> None:
    settings.SECTR_JOURNAL_LINGER_MS = 7
    group = DatabaseJournal(publish=False)._group.get()
    assert group.linger == (0.007 if connection.vendor == "postgresql" else 0.0)


@pytest.mark.django_db(transaction=True)
async def test_under_load_the_linger_writes_deltas_in_fewer_larger_groups(make_session: Any) -> None:
    """Many streams at once: with the linger a lane's delta groups start at least
    `linger` apart, so each holds several streams' chunks; without it nearly every chunk
    is a group of its own. Every delta lands once, in order, gapless."""
    primer, *sessions = [await sync_to_async(make_session)() for _ in range(11)]
    counts = {}
    for linger in (0.0, 0.2):
        journal = DatabaseJournal(publish=False)
        group = lingering(journal, linger)
        # two appends at once: a group of two, the sign of a lane busy enough to linger
        await asyncio.gather(*(journal.append(primer.id, [delta(str(i))]) for i in range(2)))
        # a chunk every 10 ms in all: without the linger, most go alone (or a few
        # together while a write is slow); with it, a group every 0.2 s takes them all
        await stream_ticks(journal, [s.id for s in sessions], ticks=5, pause=0.1)
        counts[linger] = (group.groups, group.appends)
        assert not group._held
    (off_groups, off_appends), (on_groups, on_appends) = counts[0.0], counts[0.2]
    assert off_appends == on_appends == 52
    assert on_groups <= 8, counts
    assert on_groups * 2 <= off_groups, counts  # at least twice as many appends per group
    for s in sessions:
        texts = await sync_to_async(lambda sid=s.id: [e.payload["text"] for e in DatabaseJournal().load_sync(sid, 1)])()
        assert texts == [f"{s.id}:{t}" for _ in range(2) for t in range(5)]
        assert await sync_to_async(seqs)(s.id) == list(range(1, 12))


@pytest.mark.django_db(transaction=True)
async def test_an_isolated_delta_and_any_other_append_do_not_wait_for_the_linger(make_session: Any) -> None:
    """A delta after a quiet moment goes at once, and so does one after a group of one
    (a light load); one that follows a group of several closely lingers, until an
    append that is not deltas only (a steer, a run's end) joins its lane and takes it
    along at once (on PostgreSQL a session's other appends follow its deltas into the
    streaming lane while one is queued; SQLite has one lane)."""
    first, second = [await sync_to_async(make_session)() for _ in range(2)]
    journal = DatabaseJournal(publish=False)
    group = lingering(journal, 3.0)
    started = time.monotonic()
    await asyncio.wait_for(journal.append(first.id, [delta("quiet")]), 2)
    await asyncio.wait_for(journal.append(first.id, [delta("after a group of one")]), 2)
    await asyncio.wait_for(asyncio.gather(*(journal.append(first.id, [delta(t)]) for t in "ab")), 2)
    assert time.monotonic() - started < 1.0
    waiting = asyncio.ensure_future(journal.append(second.id, [delta("soon after")]))
    await asyncio.sleep(0.1)
    assert not waiting.done()  # lingering: the lane's last delta group started 0.1 s ago
    steer = NewEvent(E.STEER_RECEIVED, {"text": "now"})
    (steered,) = await asyncio.wait_for(journal.append(second.id, [steer]), 1.0)
    (delta_envelope,) = await asyncio.wait_for(waiting, 0.5)
    assert (delta_envelope.seq, steered.seq) == (2, 3)  # in the order they were appended
    assert time.monotonic() - started < 2.0  # well before the 3 s linger ran out
    assert group.appends == 6 and not group._held


@pytest.mark.django_db(transaction=True)
async def test_a_caller_cancelled_while_its_delta_lingers_still_has_it_written(make_session: Any) -> None:
    first, second = [await sync_to_async(make_session)() for _ in range(2)]
    journal = DatabaseJournal(publish=False)
    group = lingering(journal, 0.2)
    await asyncio.gather(journal.append(first.id, [delta("a")]), journal.append(second.id, [delta("a")]))
    cancelled = asyncio.ensure_future(journal.append(second.id, [delta("b")]))
    kept = asyncio.ensure_future(journal.append(first.id, [delta("c")]))
    await asyncio.sleep(0.05)
    assert not kept.done()  # lingering
    cancelled.cancel()
    (c,) = await asyncio.wait_for(kept, 2)
    assert c.seq == 3
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    assert await sync_to_async(seqs)(second.id) == [1, 2, 3]  # written all the same, once
    assert group.groups == 2 and group.appends == 4  # "b" and "c" went in one group


@pytest.mark.django_db(transaction=True)
async def test_a_lingered_group_publishes_each_envelope_once_in_order(make_session: Any) -> None:
    """Many streams through the linger, published: each session's subscriber gets every
    envelope exactly once, in seq order; a session's appends that share a group (here
    appended at once) go out as one message."""
    primer, *sessions = [await sync_to_async(make_session)() for _ in range(7)]
    subscribed = [await subscribe(publish.session_group(s.id)) for s in sessions]
    journal = DatabaseJournal()
    group = lingering(journal, 0.02)
    await stream_ticks(journal, [s.id for s in sessions[1:]], ticks=4, pause=0.005)
    group.linger = 0.3
    await journal.append(primer.id, [delta("a delta group starts")])
    together = await asyncio.gather(*(journal.append(sessions[0].id, [delta(str(i))]) for i in range(3)))
    await publish.aflush_publications()
    for s, (layer, channel) in zip(sessions, subscribed, strict=True):
        messages = []
        try:
            while sum(len(m["envelopes"]) for m in messages) < (3 if s is sessions[0] else 4):
                messages.append(await receive_for(layer, channel, s.id, timeout=5))
        finally:
            await layer.group_discard(publish.session_group(s.id), channel)
        received = [e["seq"] for m in messages for e in m["envelopes"]]
        assert received == list(range(2, 2 + len(received))), received
        if s is sessions[0]:
            assert len(messages) == 1  # three appends of one group: one message
            assert messages[0]["envelopes"] == [e.to_dict() for batch in together for e in batch]


@pytest.mark.django_db(transaction=True)
async def test_a_refused_append_in_a_group_does_not_undo_the_others(make_session: Any) -> None:
    good, fenced = [await sync_to_async(make_session)() for _ in range(2)]
    run = await Run.objects.acreate(session=fenced, status=Run.RUNNING, lease_token="tok-new")
    journal = DatabaseJournal(publish=False)
    results = await asyncio.gather(
        journal.append(good.id, [delta("a")]),
        journal.append(fenced.id, [delta("late")], fence=(run.id, "tok-old")),
        journal.append(good.id, [delta("b")]),
        journal.append(good.id, [delta("c")]),
        return_exceptions=True,
    )
    assert isinstance(results[1], LeaseLost)
    assert await sync_to_async(seqs)(good.id) == [1, 2, 3, 4]
    assert await sync_to_async(seqs)(fenced.id) == [1]


def _group_items(*appends: tuple[str, str]) -> list[_PendingAppend]:
    return [_PendingAppend(session_id, [delta(text)], None, None) for session_id, text in appends]  # type: ignore[arg-type]


@pytest.fixture
def counting_journal(monkeypatch: pytest.MonkeyPatch) -> tuple[DatabaseJournal, list[str]]:
    """A journal (publishing nothing) and the sessions of the appends it made alone, each
    in its own transaction (a group that could not commit whole goes append by append)."""
    journal = DatabaseJournal(publish=False)
    alone: list[str] = []
    one_by_one = journal._append_in_own_transaction

    def counted(session_id: str, events: Any, fence: Any) -> Any:
        alone.append(session_id)
        return one_by_one(session_id, events, fence)

    monkeypatch.setattr(journal, "_append_in_own_transaction", counted)
    return journal, alone


def _refusing(journal: DatabaseJournal, refused: str, times: int) -> None:
    """The first `times` writes of envelopes of session `refused` fail as the database
    refusing them (whether the group goes append by append or all together)."""
    real, left = journal._insert, [times]

    def insert(connection: Any, envelopes: list[Envelope]) -> None:
        if left[0] and any(envelope.session_id == refused for envelope in envelopes):
            left[0] -= 1
            raise OperationalError("deadlock detected")
        real(connection, envelopes)

    real_together = journal._bump_and_insert_deltas  # PostgreSQL's group: the INSERT is in it

    def together(items: Any, prepared: Any, counts: dict[str, int], now: Any) -> dict[str, int]:
        if left[0] and refused in counts:
            left[0] -= 1
            raise OperationalError("deadlock detected")
        return real_together(items, prepared, counts, now)

    journal._insert = insert  # type: ignore[method-assign]
    journal._bump_and_insert_deltas = together  # type: ignore[method-assign]


@pytest.mark.django_db(transaction=True)
def test_a_group_the_server_refused_is_retried_append_by_append(make_session: Any) -> None:
    first, second = make_session(), make_session()
    journal = DatabaseJournal(publish=False)
    _refusing(journal, second.id, times=1)  # a deadlock: rolled back for sure, the connection lives
    results = journal._append_group(_group_items((first.id, "a"), (second.id, "b"), (first.id, "c")))
    assert all(isinstance(result, list) for result in results), results
    assert seqs(first.id) == [1, 2, 3] and seqs(second.id) == [1, 2]


@pytest.mark.django_db(transaction=True)
def test_a_group_of_deltas_is_written_in_a_few_statements_gapless_per_session(make_session: Any) -> None:
    sessions = [make_session() for _ in range(4)]
    run = Run.objects.create(session=sessions[0], status=Run.RUNNING, lease_token="tok")
    journal = DatabaseJournal(publish=False)
    items = _group_items(*((s.id, f"{s.id}:{i}") for i in range(3) for s in sessions))
    items[0].fence = (run.id, "tok")
    items.sort(key=lambda item: item.session_id)  # as the group commit does
    with CaptureQueriesContext(connection) as queries:
        results = journal._append_group(items)
    for s in sessions:
        assert seqs(s.id) == [1, 2, 3, 4]
        mine = [e for result in results for e in result if e.session_id == s.id]  # type: ignore[union-attr]
        assert [(e.seq, e.payload["text"]) for e in mine] == [(2 + i, f"{s.id}:{i}") for i in range(3)]
    # PostgreSQL: locks, fence check, bump and insert in one statement in autocommit (no
    # BEGIN or COMMIT); SQLite, whose transaction is the lock: bump, one fence, insert.
    assert len(queries) <= (1 if connection.vendor == "postgresql" else 5), [q["sql"][:60] for q in queries]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("refusal", ["stale token", "finished run", "another session's run", "no such run"])
def test_a_group_of_deltas_with_a_refused_fence_writes_nothing_then_goes_append_by_append(
    make_session: Any, counting_journal: tuple[DatabaseJournal, list[str]], refusal: str
) -> None:
    """The single statement (PostgreSQL) or the group's transaction (SQLite) refuses as a
    whole; each append is then tried alone, and only the refused one fails."""
    good, fenced, other = make_session(), make_session(), make_session()
    good_run = Run.objects.create(session=good, status=Run.RUNNING, lease_token="tok")
    run = Run.objects.create(session=fenced, status=Run.RUNNING, lease_token="tok")
    fence: tuple[str, str] = (run.id, "tok")
    if refusal == "stale token":
        fence = (run.id, "tok-old")
    elif refusal == "finished run":
        Run.objects.filter(pk=run.pk).update(status=Run.COMPLETED)
    elif refusal == "another session's run":
        fence = (Run.objects.create(session=other, status=Run.RUNNING, lease_token="tok").id, "tok")
    else:
        fence = ("run_gone", "tok")
    journal, alone = counting_journal
    items = _group_items((good.id, "a"), (fenced.id, "late"), (good.id, "b"))
    items[0].fence = items[2].fence = (good_run.id, "tok")
    items[1].fence = fence
    results = journal._append_group(items)
    assert isinstance(results[1], LeaseLost)
    assert [type(result) for result in (results[0], results[2])] == [list, list]
    assert alone == [good.id, fenced.id, good.id]  # the group wrote nothing, then each alone
    assert seqs(good.id) == [1, 2, 3] and seqs(fenced.id) == [1]


@pytest.mark.django_db(transaction=True)
def test_a_mixed_group_checks_its_deltas_fences_in_its_transaction(make_session: Any) -> None:
    """A group with another event (its own transaction): a stale fence among the
    deltas rolls it back, and each append goes alone; only the stale one fails."""
    starting, streaming, fenced = make_session(), make_session(), make_session()
    run = Run.objects.create(session=fenced, status=Run.RUNNING, lease_token="tok-new")
    start = NewEvent(E.MESSAGE_START, {"message_id": "msg_2", "role": "assistant"}, "inv_1")
    items = _group_items((streaming.id, "a"), (fenced.id, "late"))
    items[1].fence = (run.id, "tok-old")
    items.append(_PendingAppend(starting.id, [start], None, None))  # type: ignore[arg-type]
    items.sort(key=lambda item: item.session_id)
    results = DatabaseJournal(publish=False)._append_group(items)
    by_session = {item.session_id: result for item, result in zip(items, results, strict=True)}
    assert isinstance(by_session[fenced.id], LeaseLost)
    assert seqs(starting.id) == [1, 2] and seqs(streaming.id) == [1, 2] and seqs(fenced.id) == [1]


@pytest.mark.django_db(transaction=True)
def test_a_group_of_deltas_sees_a_lease_taken_over_while_it_waited_for_the_session(make_session: Any) -> None:
    """PostgreSQL: the group's statement starts (its snapshot taken) while a takeover
    holds the session's row; the takeover changes the run's lease and commits; the
    statement, once it has the locks, checks the fence against the run as it is now."""
    if connection.vendor != "postgresql":
        pytest.skip("row locks and statement snapshots are PostgreSQL's")
    session = make_session()
    run = Run.objects.create(session=session, status=Run.RUNNING, lease_token="tok")
    journal = DatabaseJournal(publish=False)
    holding, done = threading.Event(), threading.Event()
    results: list[Any] = []

    def take_over() -> None:
        try:
            with transaction.atomic():
                Session.objects.select_for_update(no_key=True).filter(pk=session.pk).get()
                holding.set()
                # Until the group's statement waits for this row lock.
                for _ in range(500):
                    with connection.cursor() as cursor:
                        cursor.execute(
                            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                            " AND query LIKE 'WITH locked AS MATERIALIZED%%'"
                        )
                        if cursor.fetchone()[0]:
                            break
                    done.wait(0.01)
                Run.objects.filter(pk=run.pk).update(lease_token="tok-new")
        finally:
            connection.close()

    def group() -> None:
        try:
            holding.wait(10)
            items = _group_items((session.id, "late"))
            items[0].fence = (run.id, "tok")
            results.extend(journal._append_group(items))
        finally:
            connection.close()

    threads = [threading.Thread(target=take_over), threading.Thread(target=group)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    done.set()
    assert [type(result) for result in results] == [LeaseLost]
    assert seqs(session.id) == [1]


@pytest.mark.django_db(transaction=True)
def test_a_stream_of_delta_groups_updates_the_session_rows_in_place(make_session: Any) -> None:
    """PostgreSQL: most of the delta groups' Session UPDATEs are HOT (no index entries):
    updated_at is left alone within its step and the table's pages keep room (fillfactor)."""
    if connection.vendor != "postgresql":
        pytest.skip("HOT updates and fillfactor are PostgreSQL's")
    sessions = sorted(make_session().id for _ in range(20))
    journal = DatabaseJournal(publish=False)

    def updates() -> tuple[int, int]:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_stat_force_next_flush()")
            cursor.execute(
                "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'sessions_app_session'"
            )
            return cursor.fetchone()  # type: ignore[return-value]

    def settled() -> tuple[int, int]:
        # The counters are the database's: another backend (an earlier test's pooled
        # connection) flushes its own counts when it goes idle, or, when it flushed less
        # than a second before, up to ten seconds later. Wait until they stop moving (the
        # assertions below allow for a late flush all the same).
        last = updates()
        for _ in range(10):
            time.sleep(1.1)
            now = updates()
            if now == last:
                break
            last = now
        return last

    # The journal's clock advances 50 ms a tick from the sessions' creation: ten ticks stay
    # within one step, however slowly this machine runs them, and each tick's `now` differs
    # (so an UPDATE that moved updated_at at every tick would write index entries each time).
    created = timezone.now()
    Session.objects.filter(pk__in=sessions).update(updated_at=created)
    updated, hot = settled()
    for tick in range(10):
        at = created + timedelta(milliseconds=50 * (tick + 1))
        with patch("sessions_app.journal.database.timezone.now", return_value=at):
            results = journal._append_group(_group_items(*((session_id, str(tick)) for session_id in sessions)))
        assert all(isinstance(result, list) for result in results), results
    updated, hot = (after - before for after, before in zip(updates(), (updated, hot), strict=True))
    # Another backend may still flush counts it held into the window (an idle backend
    # flushes up to ten seconds later: 9 extra updates once, after the wait above). They
    # are counted as if every one were HOT, so only this test's own can pass the bound.
    assert updated >= 200, (updated, hot)
    others = updated - 200
    # Where nothing holds an old snapshot, pruning frees each page as it fills and nearly
    # every UPDATE is HOT; where another connection does (a test run beside others), the
    # half of each page fillfactor keeps free still takes about half of them. An UPDATE
    # moving updated_at at every tick, or full pages, make none HOT.
    assert hot - others >= 90, (updated, hot)


@pytest.mark.django_db(transaction=True)
def test_a_group_with_one_other_event_keeps_the_others_deltas_together(make_session: Any) -> None:
    """A run that starts (its MESSAGE_START) among streaming ones: the streams' deltas
    still go in one INSERT, the starting session's append on its own."""
    starting, *streaming = [make_session() for _ in range(3)]
    start = NewEvent(E.MESSAGE_START, {"message_id": "msg_2", "role": "assistant"}, "inv_1")
    items = _group_items(*((s.id, f"{s.id}:{i}") for i in range(2) for s in streaming))
    items.append(_PendingAppend(starting.id, [start], None, None))  # type: ignore[arg-type]
    items.append(_PendingAppend(starting.id, [delta("first", "msg_2")], None, None))  # type: ignore[arg-type]
    items.sort(key=lambda item: item.session_id)
    with CaptureQueriesContext(connection) as queries:
        results = DatabaseJournal(publish=False)._append_group(items)
    assert all(isinstance(result, list) for result in results), results
    for s in streaming:
        assert seqs(s.id) == [1, 2, 3]
    assert seqs(starting.id) == [1, 2, 3]
    assert [e.type for e in DatabaseJournal().load_sync(starting.id, 1)] == [E.MESSAGE_START, E.MESSAGE_DELTA]
    # (SQLite's executemany is logged as "N times: INSERT ...")
    inserts = [q for q in queries if 'INSERT INTO "sessions_app_envelope"' in q["sql"]]
    # The streams' four deltas together, the other session's two (SQLite too).
    assert len(inserts) == 3, [q["sql"][:80] for q in inserts]


@pytest.mark.django_db(transaction=True)
def test_a_group_of_deltas_reads_back_the_text_it_wrote(make_session: Any) -> None:
    """The grouped INSERT (PostgreSQL: one array per column, the payloads as JSON text
    cast in SQL) stores exactly what `load` returns and what the append returned."""
    texts = ['quote " back\\slash', "é ✓ 🙂 \u2028 tab\t", "<b>&amp;</b>", "nul-free \x7f", '{"json": [1]}']
    sessions = [make_session() for _ in range(2)]
    items = _group_items(*((s.id, text) for text in texts for s in sessions))
    items.sort(key=lambda item: item.session_id)
    results = DatabaseJournal(publish=False)._append_group(items)
    for s in sessions:
        loaded = DatabaseJournal().load_sync(s.id, 1)
        assert [e.payload["text"] for e in loaded] == texts
        returned = [e for result in results for e in result if e.session_id == s.id]  # type: ignore[union-attr]
        assert [e.payload for e in returned] == [e.payload for e in loaded]
        assert [e.seq for e in loaded] == [2, 3, 4, 5, 6]


@pytest.mark.django_db(transaction=True)
def test_a_group_with_a_deleted_session_refuses_only_that_append(make_session: Any) -> None:
    live = make_session()
    journal = DatabaseJournal(publish=False)
    results = journal._append_group(_group_items((live.id, "a"), ("ses_gone", "b"), (live.id, "c")))
    assert isinstance(results[1], NotFound)
    assert seqs(live.id) == [1, 2, 3]


@pytest.mark.django_db(transaction=True)
def test_groups_over_the_same_sessions_in_any_order_stay_gapless_without_deadlocks(
    make_session: Any, counting_journal: tuple[DatabaseJournal, list[str]]
) -> None:
    """Eight group commits at once, each over up to four of six sessions in its own order.
    Each group takes its locks in id order, so none deadlocks with another: a deadlock
    would roll the group back and send it append by append, which is counted here."""
    sessions = [make_session().id for _ in range(6)]
    journal, alone = counting_journal

    def chosen(i: int, n: int) -> list[str]:
        return list(dict.fromkeys(sessions[(i + n + k * (1 + i % 5)) % 6] for k in range(4)))  # this thread's order

    def groups(i: int) -> None:
        for n in range(10):
            results = journal._append_group(_group_items(*((s, f"{i}.{n}") for s in chosen(i, n))))
            assert not [r for r in results if isinstance(r, Exception)]

    _, errors = run_threads(8, groups)
    assert errors == []
    assert alone == []  # every group committed whole
    for session_id in sessions:
        found = seqs(session_id)
        assert found == list(range(1, len(found) + 1))  # gapless, no seq twice
    assert sum(len(seqs(s)) - 1 for s in sessions) == sum(len(chosen(i, n)) for i in range(8) for n in range(10))


@pytest.mark.django_db(transaction=True)
def test_a_group_of_one_deleted_session_refuses_its_appends() -> None:
    # One session: the fast path takes no ordering lock first, the UPDATE finding no row says it.
    results = DatabaseJournal(publish=False)._append_group(_group_items(("ses_gone", "a"), ("ses_gone", "b")))
    assert [type(result) for result in results] == [NotFound, NotFound]
    assert not EnvelopeRow.objects.filter(session_id="ses_gone").exists()


@pytest.mark.django_db(transaction=True)
def test_a_group_whose_connection_broke_is_not_retried(make_session: Any, monkeypatch: Any) -> None:
    first, second = make_session(), make_session()
    journal = DatabaseJournal(publish=False)
    _refusing(journal, second.id, times=1)
    # The connection went away (maybe during the COMMIT: the group may have landed), so a
    # retry could write it twice: every append of it fails, for its run to be recovered.
    monkeypatch.setattr(journal, "_connection_broken", lambda: True)
    results = journal._append_group(_group_items((first.id, "a"), (second.id, "b")))
    assert [type(result) for result in results] == [OperationalError, OperationalError]
    assert seqs(first.id) == [1] and seqs(second.id) == [1]


@pytest.mark.django_db(transaction=True)
async def test_it_raises_lease_lost_from_the_async_append(session: Session, journal: DatabaseJournal) -> None:
    run = await Run.objects.acreate(session=session, status=Run.RUNNING, lease_token="tok-new")
    with pytest.raises(LeaseLost):
        await journal.append(session.id, [delta("x")], fence=(run.id, "tok-old"))
    assert (await journal.state(session.id)).last_seq == 1


@pytest.mark.django_db
@pytest.mark.parametrize(
    "bad_payload",
    [{"content": object()}, {"content": math.nan}, "not a dict"],
    ids=["object", "nan", "not-a-dict"],
)
def test_it_writes_nothing_for_a_batch_with_a_bad_payload(
    session: Session, journal: DatabaseJournal, bad_payload: Any
) -> None:
    good = NewEvent(E.TOOL_RESULT, {"tool_call_id": "c1", "name": "x", "content": "fine"})
    with pytest.raises((TypeError, ValueError)):
        journal.append_sync(session.id, [good, NewEvent(E.TOOL_RESULT, bad_payload)])
    assert seqs(session.id) == [1]
    session.refresh_from_db()
    assert session.last_seq == 1
    assert session.state["tool_calls"] == 0


@pytest.mark.django_db
def test_it_writes_nothing_for_an_unknown_event_type(session: Session, journal: DatabaseJournal) -> None:
    with pytest.raises(ValueError):
        journal.append_sync(session.id, [delta("ok"), NewEvent("NOT_A_TYPE", {})])  # type: ignore[arg-type]
    assert seqs(session.id) == [1]


@pytest.mark.django_db
@pytest.mark.parametrize("batch", [[delta("x")], [NewEvent(E.STEER_RECEIVED, {"text": "x"})]])
def test_it_rolls_back_the_seq_bump_when_the_insert_fails(
    session: Session, journal: DatabaseJournal, batch: list[NewEvent], monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken_insert(*args: Any) -> None:
        raise RuntimeError("disk full")

    # Every envelope INSERT is made there (PostgreSQL's with the Session UPDATE in it).
    monkeypatch.setattr(DatabaseJournal, "_insert_statement", broken_insert)
    with pytest.raises(RuntimeError):
        journal.append_sync(session.id, batch)
    session.refresh_from_db()
    assert session.last_seq == 1
    assert seqs(session.id) == [1]


@pytest.mark.django_db
@pytest.mark.parametrize("batch", [[delta("x")], [NewEvent(E.STEER_RECEIVED, {"text": "x"})], []])
def test_it_raises_not_found_for_an_unknown_session(journal: DatabaseJournal, batch: list[NewEvent]) -> None:
    with pytest.raises(NotFound):
        journal.append_sync("ses_missing", batch)
    with pytest.raises(NotFound):
        journal.load_sync("ses_missing")
    with pytest.raises(NotFound):
        journal.load_since_compaction_sync("ses_missing")
    with pytest.raises(NotFound):
        journal.state_sync("ses_missing")
    assert not EnvelopeRow.objects.exists()


# ---- the projection ----


@pytest.mark.django_db
def test_it_caches_a_projection_equal_to_the_fold_of_the_journal(session: Session, journal: DatabaseJournal) -> None:
    for batch in mixed_events():
        journal.append_sync(session.id, batch)
    envelopes = journal.load_sync(session.id)
    folded = project(envelopes)
    session.refresh_from_db()
    assert session.projection().to_dict() == folded.to_dict()
    assert journal.state_sync(session.id).to_dict() == folded.to_dict()
    assert (session.status, session.title, session.title_source, session.mode) == (
        "completed",
        "Renamed",
        "user",
        "plan",
    )
    assert session.token_total == 17 + 8
    assert session.compaction_seq == folded.compaction_seq > 0
    assert session.last_seq == envelopes[-1].seq
    # The last batch was a delta: appended_at is its time, updated_at at most a step behind.
    assert session.appended_at == envelopes[-1].created_at
    assert envelopes[-1].created_at - UPDATED_AT_STEP <= session.updated_at <= envelopes[-1].created_at
    assert folded.grants == ["shell"] and folded.notes == {"a": "b"}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("grouped", [False, True], ids=["alone", "grouped"])
def test_deltas_move_updated_at_only_a_step_behind_and_appended_at_always(make_session: Any, grouped: bool) -> None:
    """A delta batch leaves updated_at (six indexes name it) alone while it is less than
    UPDATED_AT_STEP behind: on PostgreSQL that UPDATE is a HOT one. The projection's
    updated_at stays exact through appended_at."""
    session, other = make_session(), make_session()
    journal = DatabaseJournal(publish=False)

    def append(text: str) -> Any:
        if grouped:  # the group commit's path: several sessions' deltas together
            results = journal._append_group(_group_items((session.id, text), (other.id, text)))
            return results[0][-1]  # type: ignore[index]
        return journal.append_sync(session.id, [delta(text)])[-1]

    first = append("a")
    session.refresh_from_db()
    before = session.updated_at
    assert before <= first.created_at
    second = append("b")
    session.refresh_from_db()
    if second.created_at - before < UPDATED_AT_STEP:
        assert session.updated_at == before
    assert session.appended_at == second.created_at
    assert session.projection().updated_at == second.created_at == journal.state_sync(session.id).updated_at
    # A step behind: the next batch moves it.
    Session.objects.filter(pk=session.pk).update(updated_at=second.created_at - 2 * UPDATED_AT_STEP)
    third = append("c")
    session.refresh_from_db()
    assert session.updated_at == third.created_at == session.appended_at
    assert project(journal.load_sync(session.id)).to_dict() == session.projection().to_dict()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("grouped", [False, True], ids=["alone", "grouped"])
def test_on_sqlite_a_delta_assigns_updated_at_only_when_it_is_a_step_behind(make_session: Any, grouped: bool) -> None:
    """SQLite rewrites the indexes of every column an UPDATE assigns, changed or not (six
    name updated_at): a delta's statements leave updated_at out until it is
    UPDATED_AT_STEP behind, and then one more UPDATE moves it, for that session only."""
    if connection.vendor != "sqlite":
        pytest.skip("SQLite's statements")
    session, other = make_session(), make_session()
    journal = DatabaseJournal(publish=False)

    def append(text: str) -> list[str]:
        with CaptureQueriesContext(connection) as queries:
            if grouped:
                journal._append_group(_group_items((session.id, text), (other.id, text)))
            else:
                journal.append_sync(session.id, [delta(text)])
        return [query["sql"] for query in queries.captured_queries if query["sql"].startswith("UPDATE")]

    append("a")
    assert not any("updated_at" in sql.split("RETURNING")[0] for sql in append("b"))
    late = timezone.now() - 2 * UPDATED_AT_STEP
    Session.objects.filter(pk=session.pk).update(updated_at=late)
    Session.objects.filter(pk=other.pk).update(updated_at=timezone.now() + UPDATED_AT_STEP)
    moved = [sql for sql in append("c") if "updated_at" in sql.split("RETURNING")[0]]
    assert len(moved) == 1
    session.refresh_from_db()
    other.refresh_from_db()
    last = journal.load_sync(session.id)[-1]
    assert session.updated_at == last.created_at == session.appended_at
    assert other.updated_at > last.created_at  # not behind: left as it was
    assert project(journal.load_sync(session.id)).to_dict() == session.projection().to_dict()


@pytest.mark.django_db
def test_it_matches_the_memory_journal_envelope_for_envelope(session: Session, journal: DatabaseJournal) -> None:
    memory = MemoryJournal()
    memory.create(session.id)
    memory.append_now(
        session.id, [NewEvent(E.SESSION_CREATED, {"mode": "default", "model": "demo", "title": "Test session"})]
    )
    for batch in mixed_events():
        assert [e.seq for e in journal.append_sync(session.id, batch)] == [
            e.seq for e in memory.append_now(session.id, batch)
        ]

    def shape(envelopes: list[Envelope]) -> list[tuple[Any, ...]]:
        return [(e.seq, e.type, e.invocation_id, e.payload) for e in envelopes]

    assert shape(journal.load_sync(session.id)) == shape(memory.read(session.id))
    assert shape(journal.load_sync(session.id, after_seq=7)) == shape(memory.read(session.id, 7))


@pytest.mark.django_db
def test_it_rebuilds_the_projection_from_the_journal_alone(session: Session, journal: DatabaseJournal) -> None:
    for batch in mixed_events():
        journal.append_sync(session.id, batch)
    expected = journal.state_sync(session.id).to_dict()
    Session.objects.filter(pk=session.pk).update(state={}, status="idle", title="", last_seq=0, token_total=0)
    rebuilt = journal.rebuild_projection_sync(session.id)
    assert rebuilt.to_dict() == expected
    session.refresh_from_db()
    assert session.projection().to_dict() == expected
    assert (session.status, session.title, session.token_total) == ("completed", "Renamed", 25)


@pytest.mark.django_db
def test_it_bumps_only_last_seq_for_a_delta_only_batch(session: Session, journal: DatabaseJournal) -> None:
    journal.append_sync(session.id, [NewEvent(E.MESSAGE_START, {"message_id": "msg_1", "role": "assistant"})])
    session.refresh_from_db()
    state_before = session.state
    with CaptureQueriesContext(connection) as queries:
        envelopes = journal.append_sync(session.id, [delta("a"), delta("b")])
    assert [e.seq for e in envelopes] == [3, 4]
    statements = [q["sql"] for q in queries.captured_queries if not q["sql"].startswith(("SAVEPOINT", "RELEASE"))]
    # One UPDATE ... RETURNING (the lock and the bump) and one INSERT; the state JSON is untouched.
    assert len(statements) == 2, statements
    assert not any("state" in sql.split("WHERE")[0] for sql in statements if sql.startswith("UPDATE"))
    session.refresh_from_db()
    assert session.state == state_before
    assert session.last_seq == 4
    projection = session.projection()
    assert projection.last_seq == 4
    assert projection.updated_at == envelopes[-1].created_at
    assert projection.to_dict() == project(journal.load_sync(session.id)).to_dict()
    # The next full append folds on top of the lagging state JSON correctly.
    journal.append_sync(session.id, [NewEvent(E.MESSAGE_END, {"message_id": "msg_1"})])
    session.refresh_from_db()
    assert session.state["last_seq"] == 5
    assert session.projection().to_dict() == project(journal.load_sync(session.id)).to_dict()


@pytest.mark.django_db
def test_it_gives_a_fresh_session_row_an_empty_projection(owner: Any, journal: DatabaseJournal) -> None:
    bare = Session.objects.create(owner=owner)
    assert journal.state_sync(bare.id).to_dict() == project([], session_id=bare.id).to_dict()
    assert journal.load_sync(bare.id) == []


# ---- reads ----


@pytest.mark.django_db
def test_it_loads_since_the_newest_compaction(session: Session, journal: DatabaseJournal) -> None:
    def compaction(n: int) -> NewEvent:
        return NewEvent(E.TRANSCRIPT_COMPACTED, {"messages": [{"role": "user", "content": f"c{n}"}], "through_seq": 1})

    journal.append_sync(session.id, [delta(str(i)) for i in range(20)])
    journal.append_sync(session.id, [compaction(1)])
    journal.append_sync(session.id, [delta(str(i)) for i in range(20)])
    (newest,) = journal.append_sync(session.id, [compaction(2)])
    tail = journal.append_sync(session.id, [delta("after"), NewEvent(E.STEER_RECEIVED, {"text": "s"})])

    statements: list[tuple[str, Any]] = []

    def record(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        statements.append((sql, params))  # the parameters too: a prepared statement's log shows $1
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        loaded = journal.load_since_compaction_sync(session.id)
    assert [e.seq for e in loaded] == [newest.seq] + [e.seq for e in tail]
    assert loaded[0].payload["messages"][0]["content"] == "c2"
    # The envelope read is bounded by the compaction's seq, so older rows are not read.
    envelope_reads = [(sql, params) for sql, params in statements if "sessions_app_envelope" in sql]
    assert len(envelope_reads) == 1
    sql, params = envelope_reads[0]
    assert '"seq" > %s' in sql and list(params) == [session.id, newest.seq - 1]
    if connection.vendor == "sqlite":
        with connection.cursor() as cursor:
            plan = " ".join(str(row) for row in cursor.execute(f"EXPLAIN QUERY PLAN {sql}", params).fetchall())
        assert "seq>?" in plan.replace(" ", "") or "seq>=?" in plan.replace(" ", "") or "INDEX" in plan, plan


@pytest.mark.django_db
def test_it_loads_the_whole_journal_when_nothing_was_compacted(session: Session, journal: DatabaseJournal) -> None:
    journal.append_sync(session.id, [delta("a"), delta("b")])
    assert [e.seq for e in journal.load_since_compaction_sync(session.id)] == [1, 2, 3]
    assert [e.seq for e in journal.load_sync(session.id, after_seq=1)] == [2, 3]
    assert journal.load_sync(session.id, after_seq=3) == []


@pytest.mark.django_db
def test_it_returns_what_it_loads_from_append(session: Session, journal: DatabaseJournal) -> None:
    appended = journal.append_sync(
        session.id,
        [
            NewEvent(
                E.TOOL_CALL,
                {"message_id": "m", "tool_call_id": "c", "name": "n", "arguments": '{"a": [1, 2]}', "extra": (1, 2)},
                "inv_9",
            )
        ],
    )
    assert appended == journal.load_sync(session.id, after_seq=1)
    assert appended[0].payload["extra"] == [1, 2]  # normalised through JSON, as stored
    assert appended[0].created_at.tzinfo is not None


# ---- publication ----


class RecordingLayer:
    """Wraps the real channel layer and records when group_send is called."""

    def __init__(self, layer: Any, log: list[str]) -> None:
        self.layer = layer
        self.log = log

    async def group_send(self, group: str, message: dict[str, Any]) -> None:
        self.log.append(group)
        await self.layer.group_send(group, message)


async def subscribe(group: str) -> tuple[Any, str]:
    layer = get_channel_layer()
    assert layer is not None
    channel = await layer.new_channel()
    await layer.group_add(group, channel)
    return layer, channel


async def receive_for(layer: Any, channel: str, session_id: str, timeout: float = 5) -> dict[str, Any]:
    """The next message about `session_id` (other test runs may share a Redis)."""
    async with asyncio.timeout(timeout):
        while True:
            message = await layer.receive(channel)
            if message.get("session_id") == session_id:
                return message


@pytest.mark.django_db(transaction=True)
async def test_it_publishes_an_async_append_to_the_session_group(session: Session, journal: DatabaseJournal) -> None:
    layer, channel = await subscribe(publish.session_group(session.id))
    appended = await journal.append(session.id, [delta("a"), delta("b")])
    message = await receive_for(layer, channel, session.id)
    assert message["type"] == "journal.envelopes"
    assert message["envelopes"] == [e.to_dict() for e in appended]
    assert [Envelope.from_dict(e) for e in message["envelopes"]] == appended
    await layer.group_discard(publish.session_group(session.id), channel)


@pytest.mark.django_db(transaction=True)
async def test_it_publishes_a_sync_append_only_after_the_outer_block_commits(
    session: Session, journal: DatabaseJournal, monkeypatch: pytest.MonkeyPatch
) -> None:
    group = publish.session_group(session.id)
    layer, channel = await subscribe(group)
    sent: list[str] = []
    monkeypatch.setattr(publish, "get_channel_layer", lambda: RecordingLayer(layer, sent))

    # Thread-sensitive sync_to_async calls share one thread (and its connection), so the
    # block can be entered in one call and left in a later one.
    block = transaction.atomic()
    await sync_to_async(block.__enter__)()
    try:
        appended = await sync_to_async(journal.append_sync)(session.id, [NewEvent(E.STEER_RECEIVED, {"text": "hi"})])
        await asyncio.sleep(0.2)
        assert sent == []  # nothing leaves before the commit
    finally:
        await sync_to_async(block.__exit__)(None, None, None)
        await sync_to_async(close_connection)()
    assert sent == [group]
    message = await receive_for(layer, channel, session.id)
    assert message["envelopes"] == [e.to_dict() for e in appended]
    await layer.group_discard(group, channel)


@pytest.mark.django_db(transaction=True)
def test_it_publishes_nothing_when_the_outer_block_rolls_back(
    session: Session, journal: DatabaseJournal, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent: list[str] = []
    monkeypatch.setattr(publish, "get_channel_layer", lambda: RecordingLayer(get_channel_layer(), sent))
    with pytest.raises(RuntimeError), transaction.atomic():
        journal.append_sync(session.id, [NewEvent(E.STEER_RECEIVED, {"text": "hi"})])
        raise RuntimeError("the action failed after the append")
    assert sent == []
    assert seqs(session.id) == [1]
    journal.append_sync(session.id, [NewEvent(E.STEER_RECEIVED, {"text": "again"})])
    assert sent == [publish.session_group(session.id)]


@pytest.mark.django_db(transaction=True)
async def test_it_sends_asks_and_decisions_to_the_moderation_group(session: Session, journal: DatabaseJournal) -> None:
    layer, channel = await subscribe(publish.MODERATION_GROUP)
    ask = {"ask_id": "ask_1", "tool_call_id": None, "name": "request_approval", "arguments": {}}
    await journal.append(session.id, [NewEvent(E.INVOCATION_STARTED, {"reason": user_message_reason("x")}, "inv_1")])
    await journal.append(session.id, [delta("thinking")])
    await journal.append(
        session.id,
        [NewEvent(E.APPROVAL_REQUESTED, ask, "inv_1"), NewEvent(E.INVOCATION_SUSPENDED, {"ask_id": "ask_1"}, "inv_1")],
    )
    decision = approval_decision_reason("ask_1", False, approver="teammate", verdict="deny")
    await journal.append(session.id, [NewEvent(E.INVOCATION_STARTED, {"reason": decision}, "inv_2")])

    first = await receive_for(layer, channel, session.id)
    assert [e["type"] for e in first["envelopes"]] == ["APPROVAL_REQUESTED"]
    assert first["envelopes"][0]["payload"]["ask_id"] == "ask_1"
    second = await receive_for(layer, channel, session.id)
    assert [(e["type"], e["payload"]["reason"]["kind"]) for e in second["envelopes"]] == [
        ("INVOCATION_STARTED", "approval_decision")
    ]
    await layer.group_discard(publish.MODERATION_GROUP, channel)


@pytest.mark.django_db(transaction=True)
async def test_it_logs_and_swallows_publication_failures(
    session: Session, journal: DatabaseJournal, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    class BrokenLayer:
        async def group_send(self, group: str, message: dict[str, Any]) -> None:
            raise ConnectionError("redis is down")

    monkeypatch.setattr(publish, "get_channel_layer", lambda: BrokenLayer())
    with caplog.at_level(logging.WARNING, logger="sectr.publish"):
        appended = await journal.append(session.id, [delta("a")])
        await sync_to_async(journal.append_sync)(session.id, [delta("b")])
        await sync_to_async(close_connection)()
    assert [e.seq for e in appended] == [2]
    assert (await journal.state(session.id)).last_seq == 3
    assert "could not publish" in caplog.text


@pytest.mark.django_db(transaction=True)
async def test_it_wakes_the_workers() -> None:
    layer, channel = await subscribe(publish.WORKERS_GROUP)
    await publish.awake_workers()
    async with asyncio.timeout(5):
        assert await layer.receive(channel) == {"type": "runs.wake"}
    await sync_to_async(publish.wake_workers)()
    async with asyncio.timeout(5):
        assert await layer.receive(channel) == {"type": "runs.wake"}
    await layer.group_discard(publish.WORKERS_GROUP, channel)


def test_it_names_session_groups_that_channels_accepts() -> None:
    assert publish.session_group("ses_abc") == "sectr.session.ses_abc"
    odd = publish.session_group("ses with spaces/é" * 10)
    assert odd.startswith("sectr.session.h") and len(odd) < 100
    assert odd.replace(".", "").replace("_", "").isalnum()
    assert publish.session_group("a b") != publish.session_group("a_b")


# ---- API tokens ----


@pytest.mark.django_db
def test_it_issues_a_token_and_stores_only_its_hash(owner: Any) -> None:
    token, raw = ApiToken.issue(owner, "laptop")
    assert raw.startswith("sectr_") and len(raw) > 40
    assert token.prefix == raw[:12]
    assert raw not in token.token_hash and len(token.token_hash) == 64
    found = ApiToken.authenticate(raw)
    assert found is not None and found.pk == token.pk and found.user == owner
    assert found.last_used_at is not None


@pytest.mark.django_db
def test_it_refuses_wrong_revoked_and_malformed_tokens(owner: Any) -> None:
    token, raw = ApiToken.issue(owner, "laptop")
    assert ApiToken.authenticate(raw[:-1] + ("A" if raw[-1] != "A" else "B")) is None  # right prefix, wrong secret
    assert ApiToken.authenticate("") is None
    assert ApiToken.authenticate(None) is None
    assert ApiToken.authenticate("Bearer " + raw) is None
    token.revoke()
    assert ApiToken.authenticate(raw) is None


@pytest.mark.django_db
def test_it_refuses_the_token_of_a_deactivated_user(owner: Any) -> None:
    _, raw = ApiToken.issue(owner, "laptop")
    owner.is_active = False
    owner.save()
    assert ApiToken.authenticate(raw) is None


@pytest.mark.django_db
def test_a_tokens_check_reads_it_with_its_user_and_writes_last_used_once_a_minute(owner: Any) -> None:
    """One statement finds the token and its user (its `user` then costs no query);
    last_used_at is written on first use and not again within LAST_USED_RESOLUTION, and
    what is written is what the row holds."""
    token, raw = ApiToken.issue(owner, "laptop")
    with CaptureQueriesContext(connection) as first:
        found = ApiToken.authenticate(raw)
        assert found is not None and found.pk == token.pk
        assert found.user.pk == owner.pk and found.user.get_username() == owner.get_username()
    assert len(first) == 2, [q["sql"] for q in first]  # the read (with the user) and the write
    stored = ApiToken.objects.get(pk=token.pk).last_used_at
    assert stored is not None and stored == found.last_used_at
    with CaptureQueriesContext(connection) as again:
        assert ApiToken.authenticate(raw) is not None
    assert len(again) == 1, [q["sql"] for q in again]  # within the minute: no write
    ApiToken.objects.filter(pk=token.pk).update(last_used_at=stored - timedelta(minutes=2))
    later = ApiToken.authenticate(raw)
    assert later is not None and later.last_used_at is not None and later.last_used_at > stored - timedelta(seconds=1)
    assert ApiToken.objects.get(pk=token.pk).last_used_at == later.last_used_at


# ---- media ----


@pytest.mark.django_db
def test_it_deletes_only_media_no_session_uses(
    make_session: Any, settings: Any, tmp_path: Any, django_capture_on_commit_callbacks: Any
) -> None:
    from django.core.files.base import ContentFile

    settings.MEDIA_ROOT = str(tmp_path)
    first, second = make_session(), make_session()
    shared = MediaBlob(sha256="a" * 64, mime_type="image/png", size=3, kind="image")
    shared.file.save("x.png", ContentFile(b"png"))
    own = MediaBlob(sha256="b" * 64, mime_type="image/png", size=3, kind="image")
    own.file.save("y.png", ContentFile(b"png"))
    SessionMedia.objects.create(session=first, blob=shared)
    SessionMedia.objects.create(session=second, blob=shared)
    SessionMedia.objects.create(session=first, blob=own)

    first.delete()
    with django_capture_on_commit_callbacks(execute=True):
        assert MediaBlob.delete_orphans() == 1
    assert list(MediaBlob.objects.values_list("sha256", flat=True)) == ["a" * 64]
    assert (tmp_path / shared.file.name).exists()
    assert not (tmp_path / own.file.name).exists()


# ---- admin ----


@pytest.mark.django_db
def test_it_renders_the_admin_without_showing_token_hashes(session: Session, owner: Any) -> None:
    from django.contrib.admin.utils import quote
    from django.contrib.auth import get_user_model
    from django.test import Client

    admin_user = get_user_model().objects.create_superuser(username="root", email="root@example.org", password=None)
    client = Client()
    client.force_login(admin_user)
    token, _ = ApiToken.issue(owner, "laptop")
    # An id whose "_23" the admin's unquote would read as "#": links must quote it.
    run = Run.objects.create(session=session, id="run_237490bd083a4ecfad5e0770db706f1d")
    envelope = EnvelopeRow.objects.get(session=session, seq=1)
    for url in [
        "/admin/sessions_app/session/",
        f"/admin/sessions_app/session/{quote(session.pk)}/change/",
        "/admin/sessions_app/envelope/",
        f"/admin/sessions_app/envelope/{quote(envelope.pk)}/change/",
        "/admin/sessions_app/run/",
        f"/admin/sessions_app/run/{quote(run.pk)}/change/",
        "/admin/sessions_app/apitoken/",
        f"/admin/sessions_app/apitoken/{quote(token.pk)}/change/",
        "/admin/sessions_app/reviewnote/",
    ]:
        response = client.get(url)
        assert response.status_code == 200, url
        assert token.token_hash not in response.content.decode()
    assert client.get("/admin/sessions_app/envelope/add/").status_code == 403


def _ask(ask_id: str) -> NewEvent:
    return NewEvent(E.APPROVAL_REQUESTED, {"ask_id": ask_id, "tool_call_id": None, "name": "deploy", "arguments": {}})


@pytest.mark.django_db
def test_it_indexes_an_ask_with_its_session_in_the_same_append(session: Session, journal: DatabaseJournal) -> None:
    from sessions_app.actions import find_ask_session
    from sessions_app.models import AskIndex

    journal.append_sync(session.id, [_ask("ask_indexed")])
    assert AskIndex.objects.get(pk="ask_indexed").session_id == session.id
    assert find_ask_session("ask_indexed").pk == session.id
    with pytest.raises(NotFound):
        find_ask_session("ask_unknown")


@pytest.mark.django_db
def test_it_indexes_no_ask_when_the_append_fails(session: Session, journal: DatabaseJournal) -> None:
    from sessions_app.models import AskIndex

    with pytest.raises((TypeError, ValueError)):
        journal.append_sync(session.id, [_ask("ask_lost"), NewEvent(E.TOOL_RESULT, {"content": math.nan})])
    assert not AskIndex.objects.filter(pk="ask_lost").exists()
    assert seqs(session.id) == [1]
