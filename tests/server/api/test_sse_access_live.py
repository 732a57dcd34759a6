"""Against a real server (Daphne, and on PostgreSQL a separate worker and Redis): a
teammate streaming a run's events stops receiving them soon after being removed from the
team, or after their token is revoked, while the run itself goes on to its end.

The change is made by `manage.py` in another process, as an operator would. On PostgreSQL
its signal reaches Daphne through Redis, so the safety net is set to ten minutes and only
the signal can end the stream in time; the in-memory layer of the SQLite set-up does not
cross processes, so there the safety net (1 s here) does it."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.server.api.test_api import new_session, start_run, wait_for_state
from tests.server.api.test_api_support import LiveApi, live_api, sse_events

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]  # a server to start on a busy machine

ENDS_WITHIN = 5.0

ADD_RITA = """
from django.contrib.auth import get_user_model
from sessions_app.actions.teams import do_set_membership
from sessions_app.actions.tokens import do_issue_token
user = get_user_model().objects.create_user("rita")
do_set_membership("crew", "rita", "reviewer")
print(do_issue_token(user, "tests")[1])
"""


@pytest.fixture(scope="module")
def api() -> Iterator[LiveApi]:
    postgres = os.environ.get("DATABASE_URL", "").startswith(("postgres://", "postgresql://"))
    env = {"SECTR_DEMO_SLOW_MS": "60", "SECTR_WS_ACCESS_SECONDS": "600" if postgres else "1"}
    with live_api(env=env) as live:
        out = live.live.manage("shell", "-c", ADD_RITA)
        live.tokens["rita"] = out.strip().splitlines()[-1]
        yield live


def stream_until_cut(api: LiveApi, user: str, run_id: str, cut: Any) -> tuple[list[dict[str, Any]], float]:
    """Read `user`'s stream of the run; after the third delta call `cut()`. Returns the
    events read and how long after `cut()` returned the stream ended."""
    frames: list[dict[str, Any]] = []
    cut_at: float | None = None
    timeout = httpx.Timeout(30, read=ENDS_WITHIN * 3)
    with api.http(user).stream("GET", f"/runs/{run_id}/events", timeout=timeout) as response:
        assert response.status_code == 200
        for frame in sse_events(response):
            if "event" in frame:
                frames.append(frame)
            if cut_at is None and sum(1 for f in frames if f["event"] == "message.delta") == 3:
                cut()
                cut_at = time.monotonic()
    assert cut_at is not None, "the run ended before the cut"
    return frames, time.monotonic() - cut_at


def assert_cut_short(api: LiveApi, session_id: str, run_id: str, frames: list[dict[str, Any]], took: float) -> None:
    assert took < ENDS_WITHIN, f"the stream went on for {took:.1f} s after the change"
    assert all(f["event"] != "result" for f in frames), "the stream ended with the run, not with the access"
    # The run itself was not touched: it goes on for its owner (who then stops it).
    assert api.http().get(f"/sessions/{session_id}").json()["state"] == "running"
    assert api.http().post(f"/runs/{run_id}/cancel").status_code == 202
    wait_for_state(api, session_id, ("cancelled",))


def test_removal_from_the_team_ends_a_teammates_stream(api: LiveApi) -> None:
    session_id = new_session(api, title="long")
    run = start_run(api, session_id, "!slow 1000")  # a minute: longer than manage.py takes on a busy machine
    frames, took = stream_until_cut(
        api, "mod", run["run_id"], lambda: api.live.manage("sectr_team", "remove", "crew", "mod")
    )
    assert_cut_short(api, session_id, run["run_id"], frames, took)
    assert api.http("mod").get(f"/runs/{run['run_id']}/events").status_code == 404


def test_a_revoked_token_ends_its_stream(api: LiveApi) -> None:
    session_id = new_session(api, title="longer")
    run = start_run(api, session_id, "!slow 1000")  # a minute: longer than manage.py takes on a busy machine
    prefix = api.tokens["rita"][:12]
    frames, took = stream_until_cut(
        api, "rita", run["run_id"], lambda: api.live.manage("sectr_token", "rita", "--revoke", prefix)
    )
    assert_cut_short(api, session_id, run["run_id"], frames, took)
    assert api.http("rita").get(f"/runs/{run['run_id']}/events").status_code == 401
