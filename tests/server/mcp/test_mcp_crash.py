"""`kill -9` of a worker process during a non-idempotent MCP call (real processes: Daphne,
two `manage.py sectr_worker`s, a stdio MCP server from the operator's SECTR_MCP_SERVERS
file): the recovered run does not call it again; being gated, it asks a person whether
to, and a denial ends it with the side effect done once."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.liveserver import LiveSectr
from tests.server.runs.test_worker_processes import LEASE, RECOVERY_MARGIN, LiveDriver, wait_for, worker_args

pytestmark = pytest.mark.slow

SLOW_SERVER = Path(__file__).with_name("slow_mcp_server.py")


@pytest.mark.timeout(300)  # its own server, migrations and two workers: slow on a loaded machine
def test_a_killed_workers_mcp_call_is_not_run_again(tmp_path: Path) -> None:
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
    with LiveSectr(embedded_worker=False, env={"SECTR_MCP_SERVERS": str(servers)}) as live:
        driver = LiveDriver(live)
        try:
            session_id, run_id = driver.act(
                """
                from sessions_app.actions import mcp_servers
                alice = User.objects.create_user("alice")
                actions.do_create_team("crew")
                actions.do_set_membership("crew", "alice", "moderator")
                server = mcp_servers.do_add_server(alice, "crew", {"name": "slow"})
                assert server.health == "ok", server.last_error
                actions.do_create_rule(alice, "crew", {"tool": "slow__*", "action": "allow"})
                actions.do_create_agent(alice, "crew", "scribe", {"name": "Scribe", "tools": ["slow__*"]})
                session = actions.do_create_session(alice, team="crew", agent="crew/scribe")
                run = actions.do_post_message(alice, session.pk, '!tool slow__append_line {"text": "once"}')
                result = [session.pk, run.pk]
                """
            )
            workers = {name: live.start_worker(*worker_args(name)) for name in ("w0", "w1")}
            # Generous: two workers start, import the app and the `mcp` package, and claim.
            wait_for(lambda: side_effects.exists() and side_effects.read_text(), 60, "the side effect")
            holder = driver.run(run_id)["lease_owner"]
            victim = workers.pop(holder)
            victim.send_signal(signal.SIGKILL)
            victim.wait(5)

            def suspended() -> dict[str, Any] | None:
                run = driver.run(run_id)
                return run if run["status"] in ("suspended", "completed", "failed", "cancelled") else None

            # A gated MCP call a crash cut off is never re-run on the first approval (nor
            # on an `allow` rule): the recovered run asks a person again.
            paused = wait_for(suspended, LEASE + RECOVERY_MARGIN + 20, "the recovered run to ask again")
            assert paused["status"] == "suspended" and paused["lease_owner"] != holder
            journal = driver.envelopes(session_id)
            (call,) = [e for e in journal if e["type"] == "TOOL_CALL"]
            call_id = call["payload"]["tool_call_id"]
            kinds = [e["type"] for e in journal]
            assert kinds.count("TOOL_STARTED") == 1 and kinds.index("TOOL_STARTED") < kinds.index("SESSION_ERROR")
            asks = [e["payload"] for e in journal if e["type"] == "APPROVAL_REQUESTED"]
            assert [a["tool_call_id"] for a in asks] == [call_id, call_id] and "decision" not in asks[-1]

            resumed = driver.decide("alice", asks[-1]["ask_id"], "deny")
            wait_for(lambda: driver.run(resumed)["status"] == "completed", 30, "the denied run to end")
            # One line: the call ran once, with its idempotency key in `_meta`.
            assert side_effects.read_text().splitlines() == [f"{session_id}:{call_id} once"]
            (result,) = [e for e in driver.envelopes(session_id) if e["type"] == "TOOL_RESULT"]
            assert result["payload"]["tool_call_id"] == call_id and result["payload"]["is_error"] is True
        finally:
            driver.close()
