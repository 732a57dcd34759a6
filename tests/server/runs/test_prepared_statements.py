"""The statements every run issues outside the journal (its POST's token check, session
lock, pending check and Run INSERT; the team's rules read at its start; its claim) are
prepared on PostgreSQL, each with one text however many runs a claim takes: planning
them anew per run was most of PostgreSQL's planning CPU in a burst of streamed runs.

Run on SQLite and on PostgreSQL; the prepared-statement checks on PostgreSQL only.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db import connection

from sessions_app import actions
from sessions_app import runs as runs_module
from sessions_app.models import ApiToken, ApprovalRule, Run

postgres_only = pytest.mark.skipif("connection.vendor != 'postgresql'")


def prepared_statements() -> list[str]:
    """The statements prepared on this connection."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        return [statement for (statement,) in cursor.fetchall()]


def prepared(fragment: str) -> list[str]:
    return [statement for statement in prepared_statements() if fragment in statement]


@pytest.mark.django_db(transaction=True)
def test_claims_of_batches_of_any_size_take_every_queued_run_once() -> None:
    """One text for any batch (array parameters, not IN lists or a CASE per run): the same
    runs claimed, each once, whatever was seen before, each row as its claim set it."""
    owner = get_user_model().objects.create_user("owner", email="owner@example.org")
    posted = [actions.do_post_message(owner, actions.do_create_session(owner, team=None).pk, "hello") for _ in range(5)]
    first = runs_module.claim_next_runs("w1", 60.0, 1, tidy_stranded=False)
    rest = runs_module.claim_next_runs("w1", 60.0, 8, tidy_stranded=False, executing=[first[0].run_id])
    claimed = [claim.run_id for claim in [*first, *rest]]
    assert sorted(claimed) == sorted(run.pk for run in posted)
    assert not any(claim.recovered for claim in [*first, *rest])
    rows = {run.pk: run for run in Run.objects.all()}
    for claim in [*first, *rest]:
        row = rows[claim.run_id]
        assert (row.lease_token, row.lease_owner, row.status, row.attempts) == (claim.token, "w1", Run.RUNNING, 1)
        assert row.started_at == row.heartbeat_at is not None and row.lease_expires_at > row.heartbeat_at
    assert Run.objects.filter(status=Run.RUNNING).count() == 5


@postgres_only
@pytest.mark.django_db(transaction=True)
def test_a_runs_statements_are_prepared_with_one_text_per_claim() -> None:
    owner = get_user_model().objects.create_user("owner", email="owner@example.org")
    _token, raw = ApiToken.issue(owner, "bench")
    assert ApiToken.authenticate(raw) is not None
    actions.do_create_team("crew")
    actions.do_set_membership("crew", "owner", "member")
    team_session = actions.do_create_session(owner, team="crew")
    ApprovalRule.policy_and_team_for_session(team_session.pk)
    sessions = [actions.do_create_session(owner, team=None) for _ in range(4)]
    for session in sessions:
        actions.do_post_message(owner, session.pk, "hello")
    assert runs_module.has_pending_run(sessions[0]) is False
    assert runs_module.promote_pending_run(sessions[0].pk) is None
    (first,) = runs_module.claim_next_runs("w1", 60.0, 1, tidy_stranded=False)
    assert len(runs_module.claim_next_runs("w1", 60.0, 8, tidy_stranded=False, executing=[first.run_id])) == 3

    assert len(prepared('INNER JOIN "auth_user"')) == 1  # the API token's check
    assert prepared("LEFT JOIN") and prepared('INSERT INTO "sessions_app_run"')  # rules, run creation
    assert len(prepared('FROM "sessions_app_session" WHERE "id" = $1 FOR UPDATE')) == 1  # the POST's lock
    assert len(prepared("status = $2 LIMIT 1")) + len(prepared('"status" = $2 LIMIT 1')) == 2  # pending checks
    # The claim's two reads, one text each for batches of 1 and of 3 runs.
    # (the poll's probe, `_any_runnable`, shares the condition but not the ORDER BY)
    assert len(prepared('NOT ("id" = ANY($7)) ORDER BY')) == 1, prepared_statements()
    assert len(prepared('WHERE "id" = ANY($1) FOR UPDATE SKIP LOCKED')) == 1, prepared_statements()
    assert len(prepared('UPDATE "sessions_app_run" SET "claimed_seq" = v.')) == 1, prepared_statements()


@postgres_only
@pytest.mark.django_db(transaction=True)
def test_a_claims_generic_plan_finds_runnable_runs_on_the_status_index() -> None:
    """A prepared claim may run on a plan made without its parameters' values: it still
    reads the runnable rows through (status, lease_expires_at), not the whole table."""
    owner = get_user_model().objects.create_user("owner", email="owner@example.org")
    actions.do_post_message(owner, actions.do_create_session(owner, team=None).pk, "hello")
    runs_module.claim_next_runs("w1", 60.0, 1, tidy_stranded=False)
    (statement,) = prepared('NOT ("id" = ANY($7)) ORDER BY')
    name = _statement_name(statement)
    with connection.cursor() as cursor:
        cursor.execute("SET plan_cache_mode = force_generic_plan")
        try:
            cursor.execute("SELECT parameter_types FROM pg_prepared_statements WHERE name = %s", [name])
            params = _placeholders(cursor.fetchone()[0])
            cursor.execute("SET enable_seqscan = off")  # a table of a few rows: no scan is cheaper than the index
            cursor.execute(f"EXPLAIN EXECUTE {name}({params})")
            plan = "\n".join(row[0] for row in cursor.fetchall())
        finally:
            cursor.execute("RESET plan_cache_mode")
            cursor.execute("RESET enable_seqscan")
    assert "run_status_lease" in plan, plan


def _statement_name(statement: str) -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT name FROM pg_prepared_statements WHERE statement = %s", [statement])
        return str(cursor.fetchone()[0])


def _placeholders(types: Any) -> str:
    """NULLs of each parameter's type: a generic plan does not look at them."""
    if isinstance(types, str):
        types = types.strip("{}").split(",")
    return ", ".join(f"NULL::{kind}" for kind in types)
