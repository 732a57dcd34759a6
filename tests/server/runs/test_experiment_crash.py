"""`kill -9` of the worker replaying an experiment's session: another worker recovers the
replay from the journal, finishes the turn from where it stopped, and goes on with the
next turns; every turn answered once (docs/experiments.md). Real worker processes beside
a real Daphne, on SQLite or PostgreSQL (whichever DATABASE_URL names)."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from typing import Any

import pytest

from tests.liveserver import LiveSectr
from tests.server.runs.test_worker_processes import (
    LEASE,
    RECOVERY_MARGIN,
    TICK,
    LiveDriver,
    reply_ticks,
    streamed_ticks,
    wait_for,
    worker_args,
)

# Kills a worker mid-replay: alone. What it checks is the replay's recovery from the
# journal; the database-specific part, claiming an expired lease, is test_worker_processes.py's
# on both databases: one pass (pyproject.toml, scripts/test.sh).
pytestmark = [pytest.mark.slow, pytest.mark.serial, pytest.mark.one_pass]

#: The recorded turn's ticks (TICK apart, both when recorded and when replayed): the replay
#: is killed after 8 of them, so the rest leave seconds for the kill to land mid-turn.
TICKS = 60


@pytest.fixture
def live() -> Iterator[LiveSectr]:
    with LiveSectr(embedded_worker=False, env={"SECTR_DEMO_SLOW_MS": str(int(TICK * 1000))}) as server:
        yield server


@pytest.mark.timeout(300)
def test_a_killed_worker_mid_replay_is_recovered_and_the_experiment_ends(live: LiveSectr) -> None:
    driver = LiveDriver(live)
    try:
        driver.create_user("alice")
        driver.create_user("mod")
        workers = {name: live.start_worker(*worker_args(name)) for name in ("w0", "w1")}
        source = driver.act(
            f"""
            actions.do_create_team("crew")
            actions.do_set_membership("crew", "alice", "member")
            actions.do_set_membership("crew", "mod", "moderator")
            alice = User.objects.get(username="alice")
            session = actions.do_create_session(alice, team="crew")
            actions.do_post_message(alice, session.pk, "!slow {TICKS}")
            actions.do_post_message(alice, session.pk, "calculate 6*7", queue=True)
            result = session.pk
            """
        )
        wait_for(
            lambda: (
                driver.session_state(source)["status"] == "completed"
                and len([e for e in driver.envelopes(source) if e["type"] == "INVOCATION_COMPLETED"]) == 2
            ),
            60,
            "the recording",
        )
        experiment = driver.act(
            f"""
            from sessions_app.experiments.actions import do_create_experiment
            mod = User.objects.get(username="mod")
            e = do_create_experiment(
                mod, "crew", name="crash", candidates=[{{"agent": "default"}}], sessions=[{source!r}]
            )
            result = [e.pk, e.replays.get().session_id]
            """
        )
        replay = experiment[1]
        wait_for(lambda: len(streamed_ticks(driver.envelopes(replay))) >= 8, 30, "the replay streaming")
        leases = driver._rows(
            "SELECT lease_owner, status FROM sessions_app_run WHERE session_id = %s AND lease_token IS NOT NULL",
            (replay,),
        )
        assert len(leases) == 1, leases
        holder = leases[0][0]
        victim = workers.pop(holder)
        victim.send_signal(signal.SIGKILL)
        victim.wait(5)

        def ended() -> list[dict[str, Any]] | None:
            done = [e for e in driver.envelopes(replay) if e["type"] == "INVOCATION_COMPLETED"]
            return done if len(done) == 2 else None

        completed = wait_for(ended, LEASE + RECOVERY_MARGIN + 90, "both replayed turns")
        journal = driver.envelopes(replay)
        kinds = [e["payload"]["reason"]["kind"] for e in journal if e["type"] == "INVOCATION_STARTED"]
        assert kinds == ["user_message", "recover", "user_message"]
        assert [e["payload"]["stop_reason"] for e in completed] == ["end_turn", "end_turn"]
        # Turn 1's reply was finished from where it stopped: every tick once, in order.
        assert reply_ticks(journal) == list(range(1, TICKS + 1))
        # Turn 2's calculator call got the recorded result (the replay ran nothing new).
        results = [e["payload"]["content"] for e in journal if e["type"] == "TOOL_RESULT"]
        recorded = [e["payload"]["content"] for e in driver.envelopes(source) if e["type"] == "TOOL_RESULT"]
        assert results == recorded == ["42"]
        state = driver.session_state(replay)
        assert state["replay"]["turns"] == 2 and state["replay"]["diverged"] is None
    finally:
        driver.close()
