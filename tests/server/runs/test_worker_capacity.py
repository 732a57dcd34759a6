"""One worker at its default concurrency starts 256 runs at once: none waits for another.

Runs spend nearly all their time waiting on the model and hold neither a thread nor a
database connection meanwhile, so a worker's default (SECTR_WORKER_CONCURRENCY, 256)
admits them all. The old default (16) started 256 runs in 16 waves, each waiting for
the previous wave to end.

On SQLite (the zero-setup default) it is the worker embedded in Daphne; in the
PostgreSQL pass a `manage.py sectr_worker` started without --concurrency. 256 sessions
each get a `!slow 15` message (one tick a second: each run lasts 15 s), queued before the
worker starts, so that the time it takes to post them is not part of the window; every
run's first chunk must be journaled before any run has completed.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator

import pytest

from tests.liveserver import PYTHON, ROOT, LiveSectr

pytestmark = [pytest.mark.slow, pytest.mark.serial, pytest.mark.timeout(400)]  # measures capacity: alone

RUNS = 256
TICKS = 15

QUEUE = f"""
from django.contrib.auth import get_user_model
from sessions_app import actions
user = get_user_model().objects.create_user("alice")
sessions = [actions.do_create_session(user, title=f"run {{i}}").pk for i in range({RUNS})]
for session_id in sessions:
    actions.do_post_message(user, session_id, "!slow {TICKS}")
"""

SCRIPT = """
import json, time
from sessions_app.models import Envelope, Run
deadline = time.monotonic() + 300
while Run.objects.exclude(status="completed").exists() and time.monotonic() < deadline:
    time.sleep(1)
first = {}
for session_id, at in Envelope.objects.filter(type="MESSAGE_DELTA").order_by("seq").values_list(
    "session_id", "created_at"
):
    first.setdefault(session_id, at.timestamp())
ended = [at.timestamp() for at in Envelope.objects.filter(type="INVOCATION_COMPLETED").values_list(
    "created_at", flat=True
)]
print("RESULT " + json.dumps({
    "statuses": sorted(set(Run.objects.values_list("status", flat=True))),
    "runs": Run.objects.count(), "first": first, "ended": ended,
}))
"""


@pytest.fixture
def live() -> Iterator[LiveSectr]:
    postgres = os.environ.get("DATABASE_URL", "").startswith(("postgres://", "postgresql://"))
    env = {"SECTR_DEMO_SLOW_MS": "1000", "SECTR_SESSION_CREATE_LIMIT": "100000/60"}
    server = LiveSectr(embedded_worker=not postgres, env=env)
    server.env.pop("SECTR_WORKER_CONCURRENCY", None)  # the default is what is tested
    try:
        server.create_database()
        server.manage("shell", "-c", QUEUE)  # every run queued, no worker yet
        server.start()
        if postgres:
            server.start_worker()
        yield server
    finally:
        server.close()


def test_a_worker_starts_256_runs_without_waiting_for_any(live: LiveSectr) -> None:
    # Not live.manage: waiting for the runs takes longer than its timeout.
    command = [PYTHON, "manage.py", "shell", "-c", SCRIPT]
    done = subprocess.run(command, cwd=ROOT, env=live.env, capture_output=True, text=True, timeout=360)  # noqa: S603
    assert done.returncode == 0, done.stderr
    line = next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))
    result = json.loads(line.removeprefix("RESULT "))
    assert result["runs"] == RUNS
    assert result["statuses"] == ["completed"]
    assert len(result["first"]) == RUNS and len(result["ended"]) == RUNS
    first_end = min(result["ended"])
    waited = [at for at in result["first"].values() if at >= first_end]
    assert not waited, f"{len(waited)} runs started only after another had completed"
