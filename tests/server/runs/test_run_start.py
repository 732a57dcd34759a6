"""A run's start and claim as the process's runtime makes them (sessions_app.runtime's
`session_start`, sessions_app.runs' claim): one hop reads the transcript since the newest
compaction, the state and the team's rules, which are read afresh at every start (a
moderator's change applies to the next run); a claim that found the steer slot empty
spares the first step boundary its read, and a steer parked since is still answered;
a run's start reads no more than its transcript after a claim, and its end's statements.

Run on SQLite and on PostgreSQL (its JSON columns come back differently).
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from sectr.errors import LeaseLost, SteerArrived
from sectr.events import EventType
from sectr.journal import NewEvent
from sessions_app import actions
from sessions_app import runs as runs_module
from sessions_app.dbthread import run_in_db_thread
from sessions_app.journal import get_journal
from sessions_app.journal.projections import ENTRIES_PER_INSERT, ReviewProjection, rebuild_review_projections
from sessions_app.models import Run, SearchEntry, Session, UsageDaily
from sessions_app.runtime import claimed_session, read_start, session_start
from sessions_app.team_budgets import _SESSION_TEAMS
from sessions_app.telemetry.metrics import LEASES_LOST
from sessions_app.worker import DatabaseRunControl, Worker


async def db(func: Any, *args: Any, **kwargs: Any) -> Any:
    return await run_in_db_thread(func, *args, **kwargs)


@pytest.fixture
def crew(db: None) -> dict[str, Any]:
    """A team `crew` with a member (owner) and a moderator."""
    User = get_user_model()  # noqa: N806
    people = {name: User.objects.create_user(name, email=f"{name}@example.org") for name in ("owner", "mod")}
    actions.do_create_team("crew")
    actions.do_set_membership("crew", "owner", "member")
    actions.do_set_membership("crew", "mod", "moderator")
    return people


@pytest.mark.django_db(transaction=True)
def test_a_start_reads_the_transcript_state_and_current_rules_in_order(crew: dict[str, Any]) -> None:
    mod, owner = crew["mod"], crew["owner"]
    milk = {"tool": "write_note", "arguments": {"body": "*milk*"}, "action": "deny"}
    deny = actions.do_create_rule(mod, "crew", milk)
    ask = actions.do_create_rule(
        mod, "crew", {"tool": "deploy", "action": "ask", "approvals_required": 2, "expires_after_s": 60, "position": 0}
    )
    session = actions.do_create_session(owner, team="crew")
    run = actions.do_post_message(owner, session.pk, "hello")
    journal = get_journal()

    transcript, state, policy, team_id = read_start(session.pk)
    assert team_id == Session.objects.get(pk=session.pk).team_id
    assert transcript == journal.load_since_compaction_sync(session.pk)
    assert state == journal.state_sync(session.pk) and state.current_invocation_id == run.invocation_id
    assert [(r.id, r.tool, r.action, r.arguments) for r in policy.rules] == [
        (str(ask.pk), "deploy", "ask", ()),
        (str(deny.pk), "write_note", "deny", (("body", "*milk*"),)),
    ]
    assert (policy.rules[0].approvals_required, policy.rules[0].expires_after_s) == (2, 60)
    assert policy.first_match("write_note", {"body": "buy milk"}) == policy.rules[1]

    # A moderator's change applies to the next start: nothing is kept between starts.
    actions.do_delete_rule(mod, "crew", ask.pk)
    assert [r.id for r in read_start(session.pk)[2].rules] == [str(deny.pk)]
    actions.do_delete_rule(mod, "crew", deny.pk)
    assert read_start(session.pk)[2].rules == ()


@pytest.mark.django_db(transaction=True)
def test_a_start_reads_from_the_newest_compaction_and_a_personal_session_has_no_rules(
    crew: dict[str, Any],
) -> None:
    owner = crew["owner"]
    session = actions.do_create_session(owner, team=None)
    compacted = NewEvent(
        EventType.TRANSCRIPT_COMPACTED, {"messages": [{"role": "user", "content": "earlier"}], "through_seq": 1}
    )
    (envelope,) = get_journal().append_sync(session.pk, [compacted])
    actions.do_post_message(owner, session.pk, "after the compaction")

    transcript, state, policy, team_id = asyncio.run(_start_and_team(session.pk))
    assert (team_id, policy.rules, policy.default_expires_after_s) == (None, (), None)
    assert state.compaction_seq == envelope.seq
    assert transcript[0].seq == envelope.seq and transcript[0].type is EventType.TRANSCRIPT_COMPACTED
    assert transcript == get_journal().load_since_compaction_sync(session.pk)


async def _start_and_team(session_id: str) -> tuple[Any, ...]:
    _SESSION_TEAMS.pop(session_id, None)
    transcript, state, policy = await session_start(session_id)
    # The budget check that follows knows the session's team without a query.
    return transcript, state, policy, _SESSION_TEAMS[session_id]


@pytest.mark.django_db(transaction=True)
def test_a_claim_spares_the_first_boundary_its_read_and_a_later_steer_is_still_taken(
    crew: dict[str, Any],
) -> None:
    owner = crew["owner"]
    session = actions.do_create_session(owner, team="crew")
    run = actions.do_post_message(owner, session.pk, "hello")
    (claim,) = runs_module.claim_next_runs("start-worker", 60.0, 1)
    assert claim.run_id == run.pk and claim.steer_slot_empty
    actions.do_steer(owner, run.pk, "turn left")  # parked after the claim's read

    async def boundaries() -> list[Any]:
        control = DatabaseRunControl(claim)
        return [await control.take_steer(), await control.take_steer(), await control.take_steer()]

    # The first boundary takes what the claim saw (nothing); the next one reads the slot.
    assert asyncio.run(boundaries()) == [None, ("turn left", "owner"), None]


@pytest.mark.django_db(transaction=True)
def test_a_claim_of_a_run_with_a_parked_steer_reads_it_at_the_first_boundary(crew: dict[str, Any]) -> None:
    owner = crew["owner"]
    session = actions.do_create_session(owner, team="crew")
    run = actions.do_post_message(owner, session.pk, "hello")
    actions.do_steer(owner, run.pk, "be brief")  # parked while the run is queued
    (claim,) = runs_module.claim_next_runs("start-worker", 60.0, 1)
    assert not claim.steer_slot_empty
    assert asyncio.run(DatabaseRunControl(claim).take_steer()) == ("be brief", "owner")


@pytest.mark.django_db(transaction=True)
def test_search_entries_of_a_long_rebuild_go_in_several_inserts(crew: dict[str, Any]) -> None:
    session = actions.do_create_session(crew["owner"], team=None)
    row = Session.objects.get(pk=session.pk)
    projection = ReviewProjection(row, "default")
    count = ENTRIES_PER_INSERT * 2 + 7
    for seq in range(1, count + 1):
        projection.entries.append(SearchEntry(session_id=session.pk, seq=seq, kind="user", text=f"note {seq}"))
    projection.write()
    stored = list(SearchEntry.objects.filter(session_id=session.pk).order_by("seq").values_list("seq", "text"))
    assert stored == [(seq, f"note {seq}") for seq in range(1, count + 1)]


@pytest.mark.django_db(transaction=True)
def test_a_claimed_start_reads_only_the_transcript_unless_something_was_journaled_since(
    crew: dict[str, Any],
) -> None:
    """A claim hands its run's start the session's state and team as it read them: the
    start reads the transcript alone and takes them when the transcript still ends at
    that state's last_seq; after anything journaled since, it reads the row again."""
    owner = crew["owner"]
    session = actions.do_create_session(owner, team="crew")
    run = actions.do_post_message(owner, session.pk, "hello")
    (claim,) = runs_module.claim_next_runs("start-worker", 60.0, 1)
    assert claim.run_id == run.pk and claim.session is not None
    journal = get_journal()
    fresh = read_start(session.pk)
    with CaptureQueriesContext(connection) as queries:
        claimed = read_start(session.pk, claim.session)
    assert claimed[0] == fresh[0] and claimed[1] == fresh[1] and claimed[3] == fresh[3]
    session_reads = [q["sql"] for q in queries if 'FROM "sessions_app_session"' in q["sql"]]
    assert session_reads == [], session_reads

    # Journaled after the claim (a rename): the claim's state is stale, the row is read.
    actions.do_rename(owner, session.pk, "renamed")
    with CaptureQueriesContext(connection) as queries:
        transcript, state, _policy, team_id = read_start(session.pk, claim.session)
    assert [q for q in queries if 'FROM "sessions_app_session"' in q["sql"]]
    assert state == journal.state_sync(session.pk) and state.title == "renamed"
    assert transcript == journal.load_since_compaction_sync(session.pk)
    assert team_id == Session.objects.get(pk=session.pk).team_id


@pytest.mark.django_db(transaction=True)
def test_a_batch_of_claims_writes_its_queued_runs_rows_in_one_update(crew: dict[str, Any]) -> None:
    """A claim of several queued runs (and a recovery beside them) writes the queued
    runs' rows in one UPDATE, each row as a claim of its own would: its own token and
    claimed seq, the batch's owner, lease and start."""
    owner = crew["owner"]
    sessions = [actions.do_create_session(owner, team=None) for _ in range(3)]
    for session in sessions[1:]:  # claimed seqs that differ (a first message titles the session)
        actions.do_rename(owner, session.pk, "a longer journal")
        actions.do_rename(owner, session.pk, "a longer journal still")
    posted = [actions.do_post_message(owner, session.pk, "hello") for session in sessions]
    lost = actions.do_post_message(owner, actions.do_create_session(owner, team=None).pk, "lost")
    runs_module.claim_next_runs("dead-worker", 60.0, 1, executing=[run.pk for run in posted])
    Run.objects.filter(pk=lost.pk).update(lease_expires_at=timezone.now() - timedelta(minutes=5))
    with CaptureQueriesContext(connection) as queries:
        claims = runs_module.claim_next_runs("batch-worker", 60.0, 8, tidy_stranded=False)
    assert sorted(claim.run_id for claim in claims) == sorted([lost.pk, *(run.pk for run in posted)])
    updates = [q["sql"] for q in queries if q["sql"].startswith('UPDATE "sessions_app_run"')]
    assert len(updates) == 2, updates  # the recovery's own, and the queued runs' one
    by_run = {claim.run_id: claim for claim in claims}
    rows = {run.pk: run for run in Run.objects.filter(pk__in=by_run)}
    for run in posted:
        row, claim = rows[run.pk], by_run[run.pk]
        session = Session.objects.get(pk=run.session_id)
        assert not claim.recovered and (row.lease_token, row.status, row.attempts) == (claim.token, Run.RUNNING, 1)
        assert (row.lease_owner, row.invocation_id, row.invocation_ids) == (
            "batch-worker",
            run.invocation_id,
            [run.invocation_id],
        )
        assert row.claimed_seq == session.last_seq and row.started_at == row.heartbeat_at is not None
        assert row.lease_expires_at == rows[posted[0].pk].lease_expires_at > timezone.now() + timedelta(seconds=50)
    assert len({rows[run.pk].claimed_seq for run in posted}) == 2
    assert len({claim.token for claim in claims}) == len(claims)
    assert by_run[lost.pk].recovered and rows[lost.pk].lease_token == by_run[lost.pk].token


@pytest.mark.django_db(transaction=True)
def test_a_batch_claim_reads_its_runs_transcripts_in_one_statement(crew: dict[str, Any], monkeypatch: Any) -> None:
    """PostgreSQL: a batch claim hands each fresh run its transcript since the newest
    compaction, all read in one statement; a personal session's start then reads
    nothing (no statement, no thread hop). Elsewhere the start reads it, as before."""
    owner = crew["owner"]
    sessions = [actions.do_create_session(owner, team=None) for _ in range(3)]
    actions.do_rename(owner, sessions[1].pk, "a longer journal")
    for session in sessions:
        actions.do_post_message(owner, session.pk, "hello")
    with CaptureQueriesContext(connection) as queries:
        claims = runs_module.claim_next_runs("batch-worker", 60.0, 8, tidy_stranded=False)
    assert len(claims) == 3
    journal = get_journal()
    if connection.vendor != "postgresql":
        assert all(claim.transcript is None for claim in claims)
        return
    reads = [q["sql"] for q in queries if '"sessions_app_envelope"' in q["sql"]]
    assert len(reads) == 1, reads
    for claim in claims:
        assert claim.transcript == journal.load_since_compaction_sync(claim.session_id)
        assert claim.transcript and claim.session and claim.transcript[-1].seq == claim.session[0].last_seq
    claim = claims[0]

    def no_hop(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the start went to the database")

    monkeypatch.setattr("sessions_app.runtime.run_in_db_thread", no_hop)

    async def start() -> Any:
        claimed_session.set((claim.session_id, claim.session, claim.transcript))
        return await session_start(claim.session_id)

    transcript, state, _policy = asyncio.run(start())
    assert transcript == claim.transcript and state == journal.state_sync(claim.session_id)


@pytest.mark.django_db(transaction=True)
def test_a_recovered_claim_hands_no_session_to_its_start(crew: dict[str, Any]) -> None:
    """A recovery journals in its claim: its start reads the session afresh."""
    owner = crew["owner"]
    session = actions.do_create_session(owner, team=None)
    run = actions.do_post_message(owner, session.pk, "hello")
    runs_module.claim_next_runs("dead-worker", 60.0, 1)
    Run.objects.filter(pk=run.pk).update(lease_expires_at=timezone.now() - timedelta(minutes=5))
    (claim,) = runs_module.claim_next_runs("live-worker", 60.0, 1, tidy_stranded=False)
    assert claim.recovered and claim.session is None and claim.transcript is None


@pytest.mark.django_db(transaction=True)
def test_a_run_end_is_two_statements_on_postgresql(crew: dict[str, Any]) -> None:
    """A run's reply end (its writer knew the text) and its row's end: the lock, then
    the insert with the session's update, the run row's end, the search entry and the
    usage upsert (one statement) on PostgreSQL; then `end_run` makes none. No read of
    the deltas, of the run's token or of its lease. The search entry and the usage are
    what a rebuild from the journal makes."""
    owner = crew["owner"]
    session = actions.do_create_session(owner, team=None)
    run = actions.do_post_message(owner, session.pk, "hello")
    (claim,) = runs_module.claim_next_runs("end-worker", 60.0, 1)
    journal = get_journal()
    inv = claim.invocation_id
    start = NewEvent(EventType.MESSAGE_START, {"message_id": "m1", "role": "assistant", "model": "demo"}, inv)
    deltas = [NewEvent(EventType.MESSAGE_DELTA, {"message_id": "m1", "text": t}, inv) for t in ("all ", "done")]
    journal.append_sync(session.pk, [start, *deltas], fence=claim.fence)
    usage = {"input_tokens": 5, "output_tokens": 2}
    end = NewEvent(EventType.MESSAGE_END, {"message_id": "m1", "usage": usage, "model": "demo"}, inv, text="all done")
    done = NewEvent(EventType.INVOCATION_COMPLETED, {"stop_reason": "end_turn", "usage": usage}, inv)
    with CaptureQueriesContext(connection) as queries:
        terminal = journal.append_sync(session.pk, [end, done], fence=claim.fence)[-1]
        assert runs_module.end_run(claim, terminal)
    statements = [q["sql"] for q in queries if not q["sql"].startswith(("SAVEPOINT", "RELEASE", "BEGIN", "COMMIT"))]
    if connection.vendor == "postgresql":
        assert len(statements) == 2, statements
    reads = [sql for sql in statements if sql.startswith("SELECT")]
    assert not [sql for sql in reads if "sessions_app_envelope" in sql or "api_token_key FROM" in sql], reads
    assert Run.objects.get(pk=run.pk).status == Run.COMPLETED

    live = sorted(SearchEntry.objects.filter(session_id=session.pk).values_list("seq", "kind", "text"))
    usage_rows = list(UsageDaily.objects.values_list("api_token_key", "model", "input_tokens", "output_tokens"))
    token_key = Run.objects.get(pk=run.pk).api_token_key  # the run's, as its row holds it
    assert (usage_rows, live[-1][1:]) == ([(token_key, "demo", 5, 2)], ("assistant", "all done"))
    UsageDaily.objects.all().delete()
    rebuild_review_projections(Session.objects.get(pk=session.pk))
    assert sorted(SearchEntry.objects.filter(session_id=session.pk).values_list("seq", "kind", "text")) == live
    assert list(UsageDaily.objects.values_list("api_token_key", "model", "input_tokens", "output_tokens")) == usage_rows


@pytest.mark.django_db(transaction=True)
def test_the_terminal_append_ends_the_run_row_in_its_transaction(crew: dict[str, Any]) -> None:
    """A claim's fence hears that the append of its run's terminal event ended the row
    (status, stop reason, usage, no lease), and whether a message waits: nothing is left
    for `end_run` but that message's promotion."""
    owner = crew["owner"]
    session = actions.do_create_session(owner, team=None)
    run = actions.do_post_message(owner, session.pk, "hello")
    (claim,) = runs_module.claim_next_runs("end-worker", 60.0, 1)
    inv = claim.invocation_id
    usage = {"input_tokens": 3, "output_tokens": 1}
    done = NewEvent(EventType.INVOCATION_COMPLETED, {"stop_reason": "end_turn", "usage": usage}, inv)
    assert claim.fence == (run.pk, claim.token) and claim.fence.ended is None
    with CaptureQueriesContext(connection) as queries:
        get_journal().append_sync(session.pk, [done], fence=claim.fence)
    row = Run.objects.get(pk=run.pk)
    assert (row.status, row.stop_reason, row.usage, row.lease_token) == (Run.COMPLETED, "end_turn", usage, None)
    assert row.finished_at is not None and row.lease_expires_at is None
    assert claim.fence.ended is False and not runs_module.end_needs_database(claim)
    if connection.vendor == "postgresql":  # the end rode on the append's statements
        assert len([q for q in queries if not q["sql"].startswith(("SAVEPOINT", "RELEASE", "BEGIN", "COMMIT"))]) == 2
    # The fence is spent: the row holds no lease any more.
    with pytest.raises(LeaseLost):
        get_journal().append_sync(session.pk, [done], fence=claim.fence)


@pytest.mark.django_db(transaction=True)
def test_a_terminal_append_tells_of_a_waiting_message_and_end_run_starts_it(crew: dict[str, Any]) -> None:
    owner = crew["owner"]
    session = actions.do_create_session(owner, team=None)
    run = actions.do_post_message(owner, session.pk, "hello")
    (claim,) = runs_module.claim_next_runs("end-worker", 60.0, 1)
    waiting = actions.do_post_message(owner, session.pk, "then this", queue=True)
    assert Run.objects.get(pk=waiting.pk).status == Run.PENDING
    failed = NewEvent(EventType.INVOCATION_FAILED, {"error": "boom", "retryable": False}, claim.invocation_id)
    terminal = get_journal().append_sync(session.pk, [failed], fence=claim.fence)[-1]
    row = Run.objects.get(pk=run.pk)
    assert (row.status, row.stop_reason, row.error) == (Run.FAILED, "error", "boom")
    assert claim.fence.ended is True and runs_module.end_needs_database(claim)
    assert runs_module.end_run(claim, terminal)
    assert Run.objects.get(pk=waiting.pk).status == Run.QUEUED


@pytest.mark.django_db(transaction=True)
def test_a_refused_terminal_append_leaves_the_run_to_its_worker(crew: dict[str, Any]) -> None:
    """A completing append refused for a parked steer writes nothing: the row runs on,
    and the fence has heard of no end."""
    owner = crew["owner"]
    session = actions.do_create_session(owner, team=None)
    run = actions.do_post_message(owner, session.pk, "hello")
    (claim,) = runs_module.claim_next_runs("end-worker", 60.0, 1)
    actions.do_steer(owner, run.pk, "wait")
    done = NewEvent(EventType.INVOCATION_COMPLETED, {"stop_reason": "end_turn"}, claim.invocation_id)
    with pytest.raises(SteerArrived):
        get_journal().append_sync(session.pk, [done], fence=claim.fence)
    row = Run.objects.get(pk=run.pk)
    assert (row.status, row.lease_token, row.finished_at) == (Run.RUNNING, claim.token, None)
    assert claim.fence.ended is None and runs_module.end_needs_database(claim)


@pytest.mark.django_db(transaction=True)
def test_an_ending_boundary_reads_the_steer_slot_only_after_a_poke(crew: dict[str, Any], monkeypatch: Any) -> None:
    """The model answered: the boundary leaves the slot unread (the completing append
    checks it) unless the run was poked since the last read, as parking a steer does."""
    owner = crew["owner"]
    session = actions.do_create_session(owner, team="crew")
    run = actions.do_post_message(owner, session.pk, "hello")
    (claim,) = runs_module.claim_next_runs("start-worker", 60.0, 1)
    actions.do_steer(owner, run.pk, "turn left")  # parked after the claim's read
    reads: list[str] = []
    take = runs_module.take_parked_steer
    monkeypatch.setattr(runs_module, "take_parked_steer", lambda c: reads.append(c.run_id) or take(c))

    async def boundaries() -> list[Any]:
        control = DatabaseRunControl(claim)
        taken = [await control.take_steer()]  # the first: what the claim saw
        taken.append(await control.take_steer(ending=True))
        taken.append(len(reads))
        control.poked()
        taken.append(await control.take_steer(ending=True))
        taken.append(await control.take_steer(ending=True))  # no poke since that read
        return taken

    assert asyncio.run(boundaries()) == [None, None, 0, ("turn left", "owner"), None]
    assert reads == [run.pk]


@pytest.mark.django_db(transaction=True)
async def test_a_heartbeat_does_not_take_a_run_its_terminal_append_ended_for_a_lost_one(
    crew: dict[str, Any],
) -> None:
    """Between the terminal append's commit and the run's task leaving the heartbeat's
    list, the row holds no lease: the heartbeat lets the run end instead of cancelling it."""
    owner = crew["owner"]
    session = await db(actions.do_create_session, owner, team=None)
    await db(actions.do_post_message, owner, session.pk, "hello")
    (claim,) = await db(runs_module.claim_next_runs, "beat-worker", 60.0, 1)
    done = NewEvent(EventType.INVOCATION_COMPLETED, {"stop_reason": "end_turn"}, claim.invocation_id)
    await get_journal().append(session.pk, [done], fence=claim.fence)
    worker = Worker(lease=0.6, listen=False, notify=False, expiry_interval=0, retention_interval=0)
    ending = asyncio.ensure_future(asyncio.sleep(5))
    worker.tasks[claim.run_id], worker.beating[claim.run_id] = ending, claim
    lost = LEASES_LOST._value.get()
    heartbeat = asyncio.ensure_future(worker._heartbeat())
    await asyncio.sleep(0.5)  # two beats, one of them a renewal
    heartbeat.cancel()
    assert not ending.cancelled() and LEASES_LOST._value.get() == lost
    ending.cancel()
