"""Adapted agents with real processes (Daphne and `manage.py sectr_worker`): a team agent
whose handler is one of the examples/ plugins pauses for a moderator's approval, every
process is killed and started again, and the decision resumes it; a worker killed
mid-stream is recovered by another with nothing lost or repeated. The model is the local
OpenAI-compatible server of this test process. SQLite or PostgreSQL (DATABASE_URL)."""

from __future__ import annotations

import re
import signal
from collections.abc import Iterator
from typing import Any

import pytest

from tests.liveserver import LiveSectr
from tests.openai_stub_server import STUB_MODEL, OpenAIStubServer, SSEStream, text_stream, tool_call_stream
from tests.server.runs.test_worker_processes import LEASE, RECOVERY_MARGIN, LiveDriver, wait_for, worker_args

# Their own server, migrations, a restart and workers: slow on a loaded machine.
# Kills workers: alone. What it checks is the adapters' handlers across a crash and a
# restart; the database-specific part, claiming an expired lease, is test_worker_processes.py's
# on both databases: one pass (pyproject.toml, scripts/test.sh).
pytestmark = [pytest.mark.slow, pytest.mark.serial, pytest.mark.one_pass, pytest.mark.timeout(300)]

HANDLERS = ("pydantic-ai-release", "openai-agents-release")
TICKS = 40


def ticks(text: str) -> list[int]:
    return [int(n) for n in re.findall(r"tick (\d+)", text)]


def scripted(body: dict[str, Any]) -> SSEStream:
    messages = body["messages"]
    last = messages[-1]
    if last["role"] == "tool":
        return text_stream("Done: ", str(last["content"]))
    prompt = str(last.get("content"))
    if prompt == "please continue":  # after a crash: go on from the last tick written
        done = max(ticks(" ".join(str(m.get("content") or "") for m in messages)), default=0)
        return text_stream(*[f"tick {n} " for n in range(done + 1, TICKS + 1)], chunk_delay=0.05)
    if prompt.startswith("count"):
        return text_stream(*[f"tick {n} " for n in range(1, TICKS + 1)], chunk_delay=0.05)
    return tool_call_stream([("call_publish", "publish_release", '{"version": "1.4.0"}')])


@pytest.fixture
def live() -> Iterator[LiveSectr]:
    with OpenAIStubServer(fallback=scripted) as stub:
        env = {
            "SECTR_PLUGINS": "examples.pydantic_ai_agent,examples.openai_agents_agent",
            "OPENAI_BASE_URL": stub.base_url,
            "OPENAI_API_KEY": "test-key",
            "SECTR_MODEL": STUB_MODEL,
        }
        with LiveSectr(embedded_worker=False, env=env) as server:
            yield server


def team_with_agent(driver: LiveDriver, handler: str) -> None:
    driver.act(
        f"""
        actions.do_create_team("crew")
        for name, role in (("alice", "member"), ("mod", "moderator")):
            User.objects.create_user(name)
            actions.do_set_membership("crew", name, role)
        mod = User.objects.get(username="mod")
        actions.do_create_agent(mod, "crew", "release", {{"name": "Release", "handler": {handler!r}}})
        result = None
        """
    )


@pytest.mark.parametrize("handler", HANDLERS)
def test_an_adapted_agents_ask_survives_a_restart_of_every_process(live: LiveSectr, handler: str) -> None:
    driver = LiveDriver(live)
    try:
        team_with_agent(driver, handler)
        worker = live.start_worker(*worker_args("before"))
        session_id, run_id = driver.post("alice", "publish 1.4.0")
        wait_for(lambda: driver.run(run_id)["status"] == "suspended", 30, "the ask")
        ask_id = driver.session_state(session_id)["pending_ask"]["ask_id"]

        worker.send_signal(signal.SIGKILL)
        worker.wait(5)
        live.stop(signal.SIGKILL)
        live.start()
        live.start_worker(*worker_args("after"))

        resumed = driver.decide("mod", ask_id, "allow_once")
        wait_for(lambda: driver.run(resumed)["status"] == "completed", 30, "the resumed run")
        journal = driver.envelopes(session_id)
        kinds = [e["type"] for e in journal]
        assert kinds.count("TOOL_STARTED") == 1 and kinds[-1] == "INVOCATION_COMPLETED"
        (result,) = [e for e in journal if e["type"] == "TOOL_RESULT"]
        assert result["payload"]["content"] == "published 1.4.0"
        assert driver.run(resumed)["lease_owner"] == "after"
        last_text = "".join(
            e["payload"].get("text", "") for e in journal[result["seq"] :] if e["type"] == "MESSAGE_DELTA"
        )
        assert last_text == "Done: published 1.4.0"
    finally:
        driver.close()


@pytest.mark.parametrize("handler", HANDLERS)
def test_a_worker_killed_mid_stream_is_recovered_with_nothing_lost_or_repeated(live: LiveSectr, handler: str) -> None:
    driver = LiveDriver(live)
    try:
        team_with_agent(driver, handler)
        workers = {name: live.start_worker(*worker_args(name)) for name in ("w0", "w1")}
        session_id, run_id = driver.post("alice", "count please")

        def streamed() -> list[int]:
            deltas = [e for e in driver.envelopes(session_id) if e["type"] == "MESSAGE_DELTA"]
            return ticks("".join(e["payload"].get("text", "") for e in deltas))

        wait_for(lambda: len(streamed()) >= 8, 30, "ticks")
        holder = driver.run(run_id)["lease_owner"]
        victim = workers.pop(holder)
        victim.send_signal(signal.SIGKILL)
        victim.wait(5)

        def ended() -> dict[str, Any] | None:
            run = driver.run(run_id)
            return run if run["status"] in ("completed", "failed", "cancelled") else None

        done = wait_for(ended, LEASE + RECOVERY_MARGIN + 30, "the recovered run to end")
        assert (done["status"], done["attempts"]) == ("completed", 2)
        assert done["lease_owner"] != holder
        assert streamed() == list(range(1, TICKS + 1))
        assert [e["type"] for e in driver.envelopes(session_id)].count("INVOCATION_COMPLETED") == 1
    finally:
        driver.close()
