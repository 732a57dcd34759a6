"""Workers as real processes (`manage.py sectr_worker`) beside a real Daphne.

`kill -9` of a worker mid-stream: another worker recovers the run within the lease and
finishes the message from where it stopped. `kill -9` of a worker inside a slow side
effect: the recovered run does not run it again and tells the model so. An approval ask survives a restart of every
process. SIGTERM drains a worker: its run in progress finishes and it exits 0.

The test process drives the scratch database of a LiveSectr: actions run in
`manage.py shell` (the real code path, wake-ups included) and progress is read with
plain SQL from here. SQLite or PostgreSQL, whichever DATABASE_URL names.
"""

from __future__ import annotations

import json
import re
import signal
import sqlite3
import subprocess
import textwrap
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from tests.liveserver import LiveSectr

pytestmark = [pytest.mark.slow, pytest.mark.serial]  # kills workers against a short lease: alone

LEASE = 3.0  # seconds, for the workers started here
POLL = 0.2
TICK = 0.1  # SECTR_DEMO_SLOW_MS
RECOVERY_MARGIN = 2.0  # heartbeat spacing, poll interval and a slow machine


class LiveDriver:
    """Acts on a LiveSectr's database through `manage.py shell`; reads it with plain SQL."""

    def __init__(self, live: LiveSectr) -> None:
        self.live = live
        self._db: Any = None

    # ---- actions (in a Django process against the scratch database) ----

    def act(self, code: str) -> Any:
        """Run `code` in `manage.py shell`; it sets `result`, returned here (JSON)."""
        prelude = (
            "import json\n"
            "from django.contrib.auth import get_user_model\n"
            "from sessions_app import actions\n"
            "User = get_user_model()\n"
        )
        script = prelude + textwrap.dedent(code) + "\nprint('RESULT ' + json.dumps(result))\n"
        out = self.live.manage("shell", "-c", script)
        line = next(line for line in reversed(out.splitlines()) if line.startswith("RESULT "))
        return json.loads(line.removeprefix("RESULT "))

    def create_user(self, username: str) -> None:
        self.act(f"User.objects.create_user({username!r}); result = None")

    def post(self, username: str, text: str) -> tuple[str, str]:
        """A new session of `username` with `text` posted: (session_id, run_id)."""
        session_id, run_id = self.act(
            f"""
            user = User.objects.get(username={username!r})
            session = actions.do_create_session(user)
            run = actions.do_post_message(user, session.pk, {text!r})
            result = [session.pk, run.pk]
            """
        )
        return str(session_id), str(run_id)

    def decide(self, username: str, ask_id: str, verdict: str) -> str:
        return str(
            self.act(
                f"""
                user = User.objects.get(username={username!r})
                result = actions.do_decide(user, {ask_id!r}, {verdict!r}).pk
                """
            )
        )

    # ---- reads ----

    def _connection(self) -> Any:
        if self._db is None:
            if self.live.postgres:
                import psycopg

                self._db = psycopg.connect(self.live.database_url, autocommit=True)
            else:
                self._db = sqlite3.connect(urlsplit(self.live.database_url).path, isolation_level=None, timeout=20)
        return self._db

    def _rows(self, sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        if not self.live.postgres:
            sql = sql.replace("%s", "?")
        return list(self._connection().execute(sql, params).fetchall())

    def envelopes(self, session_id: str, after_seq: int = 0) -> list[dict[str, Any]]:
        rows = self._rows(
            "SELECT seq, type, invocation_id, payload, created_at FROM sessions_app_envelope"
            " WHERE session_id = %s AND seq > %s ORDER BY seq",
            (session_id, after_seq),
        )
        return [
            {
                "seq": seq,
                "type": kind,
                "invocation_id": invocation_id,
                "payload": json.loads(payload) if isinstance(payload, str) else payload,
                "created_at": _aware(created_at),
            }
            for seq, kind, invocation_id, payload, created_at in rows
        ]

    def run(self, run_id: str) -> dict[str, Any]:
        columns = ("status", "stop_reason", "lease_owner", "attempts", "invocation_ids")
        (row,) = self._rows(f"SELECT {', '.join(columns)} FROM sessions_app_run WHERE id = %s", (run_id,))
        run = dict(zip(columns, row, strict=True))
        if isinstance(run["invocation_ids"], str):
            run["invocation_ids"] = json.loads(run["invocation_ids"])
        return run

    def session_state(self, session_id: str) -> dict[str, Any]:
        (row,) = self._rows("SELECT state FROM sessions_app_session WHERE id = %s", (session_id,))
        return json.loads(row[0]) if isinstance(row[0], str) else dict(row[0])

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None


def _aware(value: Any) -> datetime:
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def streamed_ticks(envelopes: list[dict[str, Any]]) -> list[int]:
    text = "".join(e["payload"].get("text", "") for e in envelopes if e["type"] == "MESSAGE_DELTA")
    return [int(n) for n in re.findall(r"tick (\d+)", text)]


def reply_ticks(envelopes: list[dict[str, Any]]) -> list[int]:
    """The ticks of the run's reply as the fold shows it: every assistant message's text
    after the prompt, stitched across the crash (the "please continue" turns left out)."""
    from sectr.events import Envelope, EventType
    from sectr.fold import fold_messages

    folded = fold_messages(
        Envelope("s", e["seq"], e["invocation_id"], EventType(e["type"]), e["payload"], e["created_at"])
        for e in envelopes
    )
    text = "".join(m.get("content") or "" for m in folded if m["role"] == "assistant")
    return [int(n) for n in re.findall(r"tick (\d+)", text)]


def wait_for(check: Callable[[], Any], timeout: float, what: str, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def worker_args(worker_id: str) -> tuple[str, ...]:
    return ("--lease", str(LEASE), "--poll", str(POLL), "--worker-id", worker_id)


@pytest.fixture
def live() -> Iterator[LiveSectr]:
    with LiveSectr(embedded_worker=False, env={"SECTR_DEMO_SLOW_MS": str(int(TICK * 1000))}) as server:
        yield server


@pytest.fixture
def driver(live: LiveSectr) -> Iterator[LiveDriver]:
    probe = LiveDriver(live)
    probe.create_user("alice")
    yield probe
    probe.close()


def kill_holder_and_wait_for_recovery(
    live: LiveSectr, driver: LiveDriver, workers: dict[str, subprocess.Popen[bytes]], attempt: int
) -> None:
    """Post `!slow 40`, kill -9 the worker streaming it, check another one finishes it."""
    session_id, run_id = driver.post("alice", "!slow 40")
    wait_for(lambda: len(streamed_ticks(driver.envelopes(session_id))) >= 8, 20, f"ticks (attempt {attempt})")
    holder = driver.run(run_id)["lease_owner"]
    victim = workers.pop(holder)
    victim.send_signal(signal.SIGKILL)
    killed_at = time.monotonic()
    victim.wait(5)
    before = len(driver.envelopes(session_id))

    def recovered() -> dict[str, Any] | None:
        return next(
            (
                e
                for e in driver.envelopes(session_id, after_seq=before)
                if e["type"] == "INVOCATION_STARTED" and e["payload"]["reason"]["kind"] == "recover"
            ),
            None,
        )

    def ended() -> dict[str, Any] | None:
        run = driver.run(run_id)
        return run if run["status"] in ("completed", "failed", "cancelled") else None

    restart = wait_for(recovered, LEASE + RECOVERY_MARGIN + 5, "the recover invocation")
    took = time.monotonic() - killed_at
    assert took < LEASE + RECOVERY_MARGIN, f"attempt {attempt}: recovered {took:.1f}s after the kill"
    done = wait_for(ended, 40 * TICK + 10, "the recovered run to end")
    assert (done["status"], done["stop_reason"], done["attempts"]) == ("completed", "end_turn", 2)
    assert done["lease_owner"] != holder and done["invocation_ids"][-1] == restart["invocation_id"]

    journal = driver.envelopes(session_id)
    error = journal[restart["seq"] - 2]
    assert error["type"] == "SESSION_ERROR" and error["payload"]["message_id"]  # the open message closed
    assert [e["type"] for e in journal].count("INVOCATION_COMPLETED") == 1
    # The partial text is kept and the reply is finished: every tick once, in order.
    assert reply_ticks(journal) == list(range(1, 41)), f"attempt {attempt}"
    assert streamed_ticks(journal) == list(range(1, 41))


def test_it_recovers_a_run_from_a_killed_worker_every_time(live: LiveSectr, driver: LiveDriver) -> None:
    workers = {name: live.start_worker(*worker_args(name)) for name in ("w0", "w1")}
    for attempt in range(3):
        kill_holder_and_wait_for_recovery(live, driver, workers, attempt)
        name = f"w{2 + attempt}"  # back to two workers
        workers[name] = live.start_worker(*worker_args(name))


def test_it_keeps_an_ask_across_a_restart_of_every_process(live: LiveSectr, driver: LiveDriver) -> None:
    worker = live.start_worker(*worker_args("before"))
    session_id, run_id = driver.post("alice", "note: hello world")
    wait_for(lambda: driver.run(run_id)["status"] == "suspended", 20, "the ask")
    ask_id = driver.session_state(session_id)["pending_ask"]["ask_id"]

    worker.send_signal(signal.SIGKILL)
    worker.wait(5)
    live.stop(signal.SIGKILL)
    live.start()
    live.start_worker(*worker_args("after"))

    state = driver.session_state(session_id)
    assert state["status"] == "awaiting" and state["pending_ask"]["ask_id"] == ask_id
    resumed = driver.decide("alice", ask_id, "allow_once")
    wait_for(lambda: driver.run(resumed)["status"] == "completed", 20, "the resumed run")
    state = driver.session_state(session_id)
    assert state["status"] == "completed" and state["notes"] == {"hello world": "hello world"}
    journal = driver.envelopes(session_id)
    assert [e["payload"]["reason"]["kind"] for e in journal if e["type"] == "INVOCATION_STARTED"] == [
        "user_message",
        "approval_decision",
    ]
    assert journal[-1]["type"] == "INVOCATION_COMPLETED"
    assert driver.run(resumed)["lease_owner"] == "after"


def test_it_drains_a_worker_on_sigterm(live: LiveSectr, driver: LiveDriver) -> None:
    worker = live.start_worker(*worker_args("draining"))
    session_id, run_id = driver.post("alice", "!slow 15")
    wait_for(lambda: len(streamed_ticks(driver.envelopes(session_id))) >= 2, 20, "the run to stream")

    worker.send_signal(signal.SIGTERM)
    try:
        code = worker.wait(15)
    except subprocess.TimeoutExpired:
        worker.kill()
        raise
    assert code == 0
    run = driver.run(run_id)
    assert (run["status"], run["stop_reason"], run["attempts"]) == ("completed", "end_turn", 1)
    journal = driver.envelopes(session_id)
    assert streamed_ticks(journal) == list(range(1, 16))
    assert "SESSION_ERROR" not in [e["type"] for e in journal]
    log = (live.tmp / "worker-0.log").read_text()
    assert "draining 1 runs" in log and "sectr worker stopped" in log


# What it checks is the runtime's record of an interrupted tool call; the recovery's
# database-specific part (claiming the expired lease) is the tests above, on both databases.
@pytest.mark.one_pass
@pytest.mark.timeout(300)  # its own server and two workers: slow on a loaded machine
def test_a_side_effect_a_killed_worker_started_is_not_run_again(tmp_path: Any) -> None:
    side_effects = tmp_path / "side-effects.txt"
    env = {
        "SECTR_DEMO_SLOW_MS": str(int(TICK * 1000)),
        "DJANGO_SETTINGS_MODULE": "tests.server.crash_settings",
        "SECTR_TEST_SIDE_EFFECT_FILE": str(side_effects),
        "SECTR_TEST_SIDE_EFFECT_SLEEP": "60",
    }
    with LiveSectr(embedded_worker=False, env=env) as live:
        driver = LiveDriver(live)
        try:
            driver.create_user("alice")
            workers = {name: live.start_worker(*worker_args(name)) for name in ("w0", "w1")}
            session_id, run_id = driver.post("alice", '!tool append_line {"text": "once"}')
            wait_for(lambda: side_effects.exists() and side_effects.read_text(), 20, "the side effect")
            holder = driver.run(run_id)["lease_owner"]
            victim = workers.pop(holder)
            victim.send_signal(signal.SIGKILL)
            victim.wait(5)

            def ended() -> dict[str, Any] | None:
                run = driver.run(run_id)
                return run if run["status"] in ("completed", "failed", "cancelled") else None

            done = wait_for(ended, LEASE + RECOVERY_MARGIN + 20, "the recovered run to end")
            assert (done["status"], done["stop_reason"], done["attempts"]) == ("completed", "end_turn", 2)
            assert done["lease_owner"] != holder

            journal = driver.envelopes(session_id)
            (call,) = [e for e in journal if e["type"] == "TOOL_CALL"]
            call_id = call["payload"]["tool_call_id"]
            # Exactly one line, written with the call's idempotency key (its tool call id).
            assert side_effects.read_text().splitlines() == [f"{call_id} once"]
            kinds = [e["type"] for e in journal]
            assert kinds.count("TOOL_STARTED") == 1 and kinds.index("TOOL_STARTED") < kinds.index("SESSION_ERROR")
            (result,) = [e for e in journal if e["type"] == "TOOL_RESULT"]
            assert result["payload"]["tool_call_id"] == call_id and result["payload"]["is_error"] is True
            assert "interrupted by a crash; it may or may not have taken effect" in result["payload"]["content"]
            # The transcript says what happened, to the model and to people.
            token = live.token_for("alice")
            transcript = httpx.get(
                live.url(f"/api/v1/sessions/{session_id}/transcript"),
                headers={"Authorization": f"Bearer {token}"},
                timeout=10,
            ).json()
            texts = [m.get("text") or "" for m in transcript["messages"]]
            tool_results = [m["tool_result"] for m in transcript["messages"] if m.get("tool_result")]
            assert any("interrupted by a crash" in str(r) for r in tool_results), transcript
            assert texts[-1].startswith("append_line returned: tool call interrupted by a crash"), texts
        finally:
            driver.close()
