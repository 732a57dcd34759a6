"""`kill -9` of a worker process during a non-idempotent MCP call (real processes: Daphne,
two `manage.py sectr_worker`s, a stdio MCP server from the operator's SECTR_MCP_SERVERS
file): the recovered run never calls it again. What happens instead follows what let the
first attempt run, as the journal shows it: an `allow` rule's decision → the call's result
says it was interrupted and may have run, nobody is asked; a person's approval → a person
is asked again, the ask saying `may_have_run`, and a denial ends it with the side effect
done once."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.liveserver import LiveSectr
from tests.server.runs.test_worker_processes import LEASE, RECOVERY_MARGIN, LiveDriver, wait_for, worker_args

# Kills a worker mid-call: alone. What it checks is the runtime's (the journal's record of
# the interrupted call); the database-specific part, claiming an expired lease, is
# test_worker_processes.py's on both databases: one pass (pyproject.toml, scripts/test.sh).
pytestmark = [pytest.mark.slow, pytest.mark.serial, pytest.mark.one_pass]

SLOW_SERVER = Path(__file__).with_name("slow_mcp_server.py")


def slow_servers(tmp_path: Path) -> tuple[Path, Path]:
    """The operator's file naming the slow server, and the file its tool appends to."""
    side_effects = tmp_path / "side-effects.txt"
    servers = tmp_path / "mcp-servers.json"
    servers.write_text(
        json.dumps(
            {
                "slow": {
                    "command": sys.executable,
                    "args": [str(SLOW_SERVER)],
                    "env": {"MCP_SIDE_EFFECT_FILE": str(side_effects), "MCP_SIDE_EFFECT_SLEEP": "60"},
                }
            }
        )
    )
    return servers, side_effects


SETUP = """
from sessions_app.actions import mcp_servers
alice = User.objects.create_user("alice")
actions.do_create_team("crew")
actions.do_set_membership("crew", "alice", "moderator")
server = mcp_servers.do_add_server(alice, "crew", {"name": "slow"})
assert server.health == "ok", server.last_error
if RULE:
    actions.do_create_rule(alice, "crew", {"tool": "slow__*", "action": "allow"})
actions.do_create_agent(alice, "crew", "scribe", {"name": "Scribe", "tools": ["slow__*"]})
session = actions.do_create_session(alice, team="crew", agent="crew/scribe")
run = actions.do_post_message(alice, session.pk, '!tool slow__append_line {"text": "once"}')
result = [session.pk, run.pk]
"""


def kill_the_worker_running(driver: LiveDriver, workers: dict[str, Any], run_id: str, side_effects: Path) -> str:
    """Wait for the side effect, then `kill -9` the worker holding `run_id`: its name."""
    # Generous: two workers start, import the app and the `mcp` package, and claim.
    wait_for(lambda: side_effects.exists() and side_effects.read_text(), 60, "the side effect")
    holder = str(driver.run(run_id)["lease_owner"])
    victim = workers.pop(holder)
    victim.send_signal(signal.SIGKILL)
    victim.wait(5)
    return holder


def settled(driver: LiveDriver, run_id: str) -> Any:
    def check() -> dict[str, Any] | None:
        run = driver.run(run_id)
        return run if run["status"] in ("suspended", "completed", "failed", "cancelled") else None

    return check


@pytest.mark.timeout(300)  # its own server, migrations and two workers: slow on a loaded machine
def test_a_killed_workers_rule_allowed_mcp_call_is_reported_interrupted_not_run_again(tmp_path: Path) -> None:
    servers, side_effects = slow_servers(tmp_path)
    with LiveSectr(embedded_worker=False, env={"SECTR_MCP_SERVERS": str(servers)}) as live:
        driver = LiveDriver(live)
        try:
            session_id, run_id = driver.act("RULE = True\n" + SETUP)
            workers = {name: live.start_worker(*worker_args(name)) for name in ("w0", "w1")}
            holder = kill_the_worker_running(driver, workers, run_id, side_effects)

            done = wait_for(settled(driver, run_id), LEASE + RECOVERY_MARGIN + 20, "the recovered run to end")
            assert done["status"] == "completed" and done["lease_owner"] != holder
            journal = driver.envelopes(session_id)
            (call,) = [e for e in journal if e["type"] == "TOOL_CALL"]
            call_id = call["payload"]["tool_call_id"]
            kinds = [e["type"] for e in journal]
            assert kinds.count("TOOL_STARTED") == 1 and kinds.index("TOOL_STARTED") < kinds.index("SESSION_ERROR")
            # The rule's decision is the only ask: nobody was asked about a second run.
            (ask,) = [e["payload"] for e in journal if e["type"] == "APPROVAL_REQUESTED"]
            assert ask["tool_call_id"] == call_id and ask["decision"]["approver"].startswith("rule:")
            (result,) = [e["payload"] for e in journal if e["type"] == "TOOL_RESULT"]
            assert result["tool_call_id"] == call_id and result["is_error"] is True
            assert "interrupted by a crash; it may or may not have taken effect" in result["content"]
            # One line: the call ran once, with its idempotency key in `_meta`.
            assert side_effects.read_text().splitlines() == [f"{session_id}:{call_id} once"]
        finally:
            driver.close()


@pytest.mark.timeout(300)
def test_a_killed_workers_person_approved_mcp_call_asks_again_saying_it_may_have_run(tmp_path: Path) -> None:
    servers, side_effects = slow_servers(tmp_path)
    with LiveSectr(embedded_worker=False, env={"SECTR_MCP_SERVERS": str(servers)}) as live:
        driver = LiveDriver(live)
        try:
            session_id, run_id = driver.act("RULE = False\n" + SETUP)
            workers = {name: live.start_worker(*worker_args(name)) for name in ("w0", "w1")}
            wait_for(lambda: driver.run(run_id)["status"] == "suspended", 60, "the first ask")
            (first,) = [e["payload"] for e in driver.envelopes(session_id) if e["type"] == "APPROVAL_REQUESTED"]
            assert "may_have_run" not in first
            resumed = driver.decide("alice", first["ask_id"], "allow_once")
            holder = kill_the_worker_running(driver, workers, resumed, side_effects)

            paused = wait_for(settled(driver, resumed), LEASE + RECOVERY_MARGIN + 20, "the recovered run to ask again")
            assert paused["status"] == "suspended" and paused["lease_owner"] != holder
            journal = driver.envelopes(session_id)
            kinds = [e["type"] for e in journal]
            assert kinds.count("TOOL_STARTED") == 1 and kinds.index("TOOL_STARTED") < kinds.index("SESSION_ERROR")
            asks = [e["payload"] for e in journal if e["type"] == "APPROVAL_REQUESTED"]
            assert [a["tool_call_id"] for a in asks] == [first["tool_call_id"]] * 2
            again = asks[-1]
            assert again["may_have_run"] is True and "decision" not in again
            # The API's ask objects say so too.
            token = live.token_for("alice")
            http = httpx.Client(base_url=live.url("/api/v1"), headers={"Authorization": f"Bearer {token}"}, timeout=10)
            listed = http.get("/asks", params={"session": session_id}).json()["asks"]
            assert {a["ask_id"]: a["may_have_run"] for a in listed} == {first["ask_id"]: False, again["ask_id"]: True}
            assert http.get(f"/sessions/{session_id}").json()["pending_ask"]["may_have_run"] is True

            resumed = driver.decide("alice", again["ask_id"], "deny")
            wait_for(lambda: driver.run(resumed)["status"] == "completed", 30, "the denied run to end")
            assert side_effects.read_text().splitlines() == [f"{session_id}:{first['tool_call_id']} once"]
            (result,) = [e for e in driver.envelopes(session_id) if e["type"] == "TOOL_RESULT"]
            assert result["payload"]["is_error"] is True
        finally:
            driver.close()
