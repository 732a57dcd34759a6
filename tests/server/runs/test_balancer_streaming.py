"""Through the production topology's balancer, every streamed chunk arrives as it is made.

A Cluster (tests/cluster.py: HAProxy with scripts/haproxy.cfg.in, a Daphne, a worker,
PostgreSQL, Redis) streams a few demo runs whose ticks are produced 200 ms apart
(``!slow N`` with SECTR_DEMO_SLOW_MS=200); an SSE client of the balancer times each
tick's arrival. A balancer that holds small frames back to fill packets (HAProxy's
default, which `option http-no-delay` turns off) delivers them in bursts: a tick
then arrives ~200 ms after it was made, together with the next. Each tick must arrive
within 60 ms of the later of its production (the demo model's stamp file) and the
previous tick's arrival plus 200 ms.

PostgreSQL only, like the fault tests: the production topology runs in the PostgreSQL pass.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.cluster import HAPROXY, Cluster

pytestmark = [
    pytest.mark.slow,
    pytest.mark.serial,  # times each chunk's arrival to 60 ms: alone (scripts/test.sh)
    pytest.mark.timeout(300),
    pytest.mark.skipif(
        not os.environ.get("DATABASE_URL", "").startswith(("postgres://", "postgresql://")),
        reason="the production topology's tests run in the PostgreSQL pass (scripts/test.sh)",
    ),
    pytest.mark.skipif(not Path(HAPROXY).exists(), reason="needs Debian's haproxy (scripts/ensure_haproxy.sh)"),
]

TICK = 0.2
TICKS = 12
STREAMS = 3
#: How late a tick may arrive (seconds) after it was made or after the previous tick's
#: arrival plus TICK, whichever is later.
SLACK = 0.06


def stream_arrivals(base_url: str, token: str) -> tuple[str, dict[int, float]]:
    """Start a `!slow` run through the balancer and time each tick's arrival on its stream."""
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=base_url + "/api/v1", headers=headers, timeout=60) as http:
        session = http.post("/sessions", json={"title": "ticks"})
        assert session.status_code == 201, session.text
        session_id = session.json()["id"]
        run = http.post(f"/sessions/{session_id}/runs", json={"content": f"!slow {TICKS}"})
        assert run.status_code == 202, run.text
        arrivals: dict[int, float] = {}
        with http.stream("GET", f"/runs/{run.json()['run_id']}/events") as response:
            assert response.status_code == 200
            kind = ""
            for line in response.iter_lines():
                now = time.time()
                if line.startswith("event:"):
                    kind = line[6:].strip()
                elif line.startswith("data:") and kind == "message.delta":
                    text = line.split('"text":"', 1)[1].split('"', 1)[0]
                    arrivals[int(text.split()[1])] = now
                elif line.startswith("data:") and kind == "result":
                    break
        return session_id, arrivals


def test_every_tick_passes_the_balancer_at_once(tmp_path: Path) -> None:
    stamps = tmp_path / "stamps"
    env = {
        "SECTR_DEMO_SLOW_MS": str(int(TICK * 1000)),
        "SECTR_DEMO_STAMP_FILE": str(stamps),
        "SECTR_SESSION_CREATE_LIMIT": "1000/60",
        "SECTR_API_RATE_LIMIT": "0/60",
    }
    with Cluster(daphnes=1, workers=1, env=env, private_redis=True) as cluster:
        out = cluster.manage(
            "shell", "-c",
            "from django.contrib.auth import get_user_model; from sessions_app.actions.tokens import do_issue_token; "
            "u = get_user_model().objects.create_user('alice'); print('TOKEN', do_issue_token(u)[1])",
        )  # fmt: skip
        token = out.split("TOKEN ", 1)[1].split()[0]
        with ThreadPoolExecutor(STREAMS) as pool:
            results = list(pool.map(lambda _: stream_arrivals(cluster.base_url, token), range(STREAMS)))
    produced: dict[tuple[str, int], float] = {}
    for line in stamps.read_text().splitlines():
        session_id, tick, at = line.split()
        produced[(session_id, int(tick))] = float(at)
    late = []
    for session_id, arrivals in results:
        assert sorted(arrivals) == list(range(1, TICKS + 1))
        for tick in range(2, TICKS + 1):
            due = max(produced[(session_id, tick)], arrivals[tick - 1] + TICK)
            if arrivals[tick] - due > SLACK:
                late.append(f"tick {tick}: {(arrivals[tick] - due) * 1000:.0f} ms late")
    assert not late, "held back by the balancer: " + ", ".join(late)
