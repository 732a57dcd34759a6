"""Faults of the production topology, with real processes through the load balancer.

One Cluster (tests/cluster.py: HAProxy, 2 Daphne, 2 workers, a private redis-server, a
scratch PostgreSQL database) serves every test here; each test breaks one process
mid-stream and checks what a client of the balancer got:

- kill -9 of the Daphne serving a page's websocket: the client reconnects through the
  balancer (to the other Daphne) with its last seq and gets every envelope, so every
  delta, exactly once;
- kill -9 of the worker streaming a run: another recovers it and the SSE stream of the
  run carries every tick once;
- Redis killed and started again mid-stream: the SSE stream misses nothing, and a
  client that dropped its stream during the outage resumes with Last-Event-ID and gets
  the rest, nothing twice;
- SIGTERM of the worker streaming a run: it finishes the run (attempt 1) and exits 0.

PostgreSQL only: several workers claiming runs at once is the production topology
(SKIP LOCKED, advisory locks); scripts/test.sh runs them in its PostgreSQL pass.
"""

from __future__ import annotations

import base64
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from tests.cluster import Cluster
from tests.server.test_worker_processes import LiveDriver, reply_ticks, streamed_ticks, wait_for

pytestmark = [
    pytest.mark.slow,
    # The cluster starts once for the module: 2 Daphne, a migrated database. On a machine
    # shared with other jobs that alone may take a minute or two.
    pytest.mark.timeout(600),
    pytest.mark.skipif(
        not os.environ.get("DATABASE_URL", "").startswith(("postgres://", "postgresql://")),
        reason="fault tests of the production topology run in the PostgreSQL pass (scripts/test.sh)",
    ),
]

LEASE = 3.0
TICK_MS = 100
PASSWORD = "faults-Password-1"
TICK_RE = re.compile(r"tick (\d+)")


# ---- the cluster, shared by the module's tests ----


@dataclass
class Topology:
    cluster: Cluster
    driver: LiveDriver
    token: str
    cookies: dict[str, str]
    workers: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    started: int = 0

    def start_worker(self, *, wait: bool = True) -> str:
        name = f"w{self.started}"
        self.started += 1
        log = self.cluster.tmp / f"worker-{len(self.cluster.workers)}.log"
        self.workers[name] = self.cluster.start_worker("--lease", str(LEASE), "--poll", "0.2", "--worker-id", name)
        if wait:  # Django's start takes seconds on a busy machine; a test must not count it
            wait_for(lambda: log.exists() and f"worker {name} running" in log.read_text(), 120, f"worker {name}", 0.2)
        return name

    def api(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.cluster.base_url + "/api/v1", headers={"Authorization": f"Bearer {self.token}"}, timeout=30
        )

    def post_run(self, text: str) -> tuple[str, str]:
        with self.api() as http:
            session = http.post("/sessions", json={"title": "fault"})
            assert session.status_code == 201, session.text
            run = http.post(f"/sessions/{session.json()['id']}/runs", json={"content": text})
            assert run.status_code == 202, run.text
            return str(session.json()["id"]), str(run.json()["run_id"])


def log_in(base_url: str, username: str) -> dict[str, str]:
    with httpx.Client(base_url=base_url, timeout=30) as http:
        http.get("/accounts/login/")
        csrf = http.cookies["csrftoken"]
        response = http.post(
            "/accounts/login/",
            data={"username": username, "password": PASSWORD, "csrfmiddlewaretoken": csrf},
            headers={"Referer": base_url + "/accounts/login/"},
        )
        assert response.status_code == 302, response.text
        return {"sessionid": http.cookies["sessionid"], "csrftoken": http.cookies["csrftoken"]}


@pytest.fixture(scope="module")
def topology() -> Iterator[Topology]:
    env = {"SECTR_DEMO_SLOW_MS": str(TICK_MS), "SECTR_LEASE_SECONDS": str(LEASE)}
    with Cluster(daphnes=2, workers=0, env=env, private_redis=True, name_backends=True) as cluster:
        # One `manage.py shell` for the user and the token (each start of Django takes seconds).
        out = cluster.manage(
            "shell", "-c",
            "from django.contrib.auth import get_user_model; from sessions_app.actions.tokens import do_issue_token; "
            f"u = get_user_model().objects.create_user('alice', password={PASSWORD!r}); "
            "print('TOKEN', do_issue_token(u)[1])",
        )  # fmt: skip
        token = out.split("TOKEN ", 1)[1].split()[0]
        found = Topology(cluster, LiveDriver(cluster), token, log_in(cluster.base_url, "alice"))
        found.start_worker()
        found.start_worker()
        yield found
        found.driver.close()


@pytest.fixture
def topo(topology: Topology) -> Iterator[Topology]:
    """The shared cluster, whole again before each test: 2 Daphne, 2 workers, Redis up."""
    cluster = topology.cluster
    for index, proc in enumerate(cluster.daphnes):
        if proc is None or proc.poll() is not None:
            cluster.start_daphne(index)
    for name, proc in list(topology.workers.items()):
        if proc.poll() is not None:
            del topology.workers[name]
    while len(topology.workers) < 2:
        topology.start_worker()
    assert cluster.redis is not None
    if cluster.redis.proc is None:
        cluster.redis.start()
    yield topology
    if os.environ.get("SECTR_FAULTS_LOG"):
        print(cluster.log())


# ---- clients: a page's websocket and an SSE reader, both through the balancer ----


class PageSocket:
    """The chat page's websocket (/ws/sessions/<id>/?after=N), a minimal RFC 6455 client."""

    def __init__(self, port: int, session_id: str, after: int, cookies: dict[str, str]) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        key = base64.b64encode(secrets.token_bytes(16)).decode()
        cookie = "; ".join(f"{k}={v}" for k, v in cookies.items())
        request = (
            f"GET /ws/sessions/{session_id}/?after={after} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
            f"Sec-WebSocket-Version: 13\r\nOrigin: http://127.0.0.1:{port}\r\nCookie: {cookie}\r\n\r\n"
        )
        self.sock.sendall(request.encode())
        self.buffer = b""
        while b"\r\n\r\n" not in self.buffer:
            chunk = self.sock.recv(4096)
            assert chunk, "the balancer closed the websocket handshake"
            self.buffer += chunk
        head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        assert lines[0].split()[1] == "101", lines[0]
        headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
        self.backend = headers.get("x-sectr-backend", "")

    def _read(self, count: int) -> bytes:
        while len(self.buffer) < count:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("websocket closed")
            self.buffer += chunk
        data, self.buffer = self.buffer[:count], self.buffer[count:]
        return data

    def frame(self) -> dict[str, Any] | None:
        """The next JSON text frame; None on a close frame. ConnectionError when the peer is gone."""
        while True:
            first, second = self._read(2)
            opcode, length = first & 0x0F, second & 0x7F
            if length == 126:
                length = int.from_bytes(self._read(2), "big")
            elif length == 127:
                length = int.from_bytes(self._read(8), "big")
            payload = self._read(length)
            if opcode == 0x8:
                return None
            if opcode == 0x1:
                return dict(json.loads(payload))
            # pings and pongs: nothing to do within a test's seconds

    def close(self) -> None:
        self.sock.close()


@dataclass
class SseEvent:
    id: int | None
    kind: str
    data: dict[str, Any]


def sse_events(response: httpx.Response) -> Iterator[SseEvent]:
    event_id: int | None = None
    kind = ""
    data: list[str] = []
    for line in response.iter_lines():
        if line == "":
            if data:
                yield SseEvent(event_id, kind, json.loads("\n".join(data)))
            event_id, kind, data = None, "", []
        elif line.startswith("id:"):
            event_id = int(line[3:].strip())
        elif line.startswith("event:"):
            kind = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].strip())


def event_ticks(events: list[SseEvent]) -> list[int]:
    text = "".join(e.data.get("text") or "" for e in events if e.kind == "message.delta")
    return [int(n) for n in TICK_RE.findall(text)]


def assert_once_in_order(events: list[SseEvent]) -> None:
    """Seq ids never go back; an id repeats only for the two events of one envelope."""
    ids = [e.id for e in events if e.id is not None]
    assert ids == sorted(ids), ids
    pairs = [(e.id, e.kind) for e in events if e.id is not None]
    assert len(pairs) == len(set(pairs)), "an event arrived twice"


# ---- the faults ----


def test_a_page_socket_survives_kill_9_of_its_daphne_and_gets_every_delta_once(topo: Topology) -> None:
    cluster, driver = topo.cluster, topo.driver
    ticks = 60
    session_id, run_id = topo.post_run(f"!slow {ticks}")
    socket_ = PageSocket(cluster.port, session_id, 0, topo.cookies)
    frames: list[tuple[int, int]] = []
    while len(streamed_ticks(driver.envelopes(session_id))) < 10:
        frame = socket_.frame()
        assert frame is not None
        if "first" in frame:
            frames.append((frame["first"], frame["seq"]))
    assert socket_.backend.startswith("daphne"), "HAProxy names the Daphne that took the socket"
    assert driver.run(run_id)["status"] == "running", "the kill must land mid-stream"
    victim = int(socket_.backend.removeprefix("daphne"))
    cluster.kill_daphne(victim, signal.SIGKILL)
    try:  # what was in flight before the kill, then the end of the stream
        while (frame := socket_.frame()) is not None:
            if "first" in frame:
                frames.append((frame["first"], frame["seq"]))
    except OSError:  # the balancer closed the tunnel (ConnectionError is an OSError)
        pass
    socket_.close()
    last_seq = frames[-1][1]

    # The page reconnects through the balancer with its cursor.
    again = PageSocket(cluster.port, session_id, last_seq, topo.cookies)
    assert again.backend and again.backend != socket_.backend
    again.sock.settimeout(2)

    def ended() -> bool:
        return driver.run(run_id)["status"] == "completed"

    newest = 0
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            frame = again.frame()
        except TimeoutError:
            frame = {}
        assert frame is not None, "the second Daphne closed the socket"
        if frame.get("ready"):  # caught up: its cursor is the last frame's
            assert frame["seq"] == (frames[-1][1] if frames else last_seq)
        elif "first" in frame:
            frames.append((frame["first"], frame["seq"]))
        journal = driver.envelopes(session_id)
        newest = journal[-1]["seq"]
        if ended() and frames[-1][1] == newest:
            break
    again.close()

    # Every envelope exactly once across the two sockets: the frames tile 1..newest.
    covered = [seq for first, last in frames for seq in range(first, last + 1)]
    assert covered == list(range(1, newest + 1))
    journal = driver.envelopes(session_id)
    assert streamed_ticks(journal) == list(range(1, ticks + 1))
    assert driver.run(run_id)["attempts"] == 1  # the worker never noticed


def test_kill_9_of_the_streaming_worker_is_recovered_with_every_tick_once(topo: Topology) -> None:
    driver = topo.driver
    ticks = 40
    session_id, run_id = topo.post_run(f"!slow {ticks}")
    events: list[SseEvent] = []
    killed_at = recovered_at = 0.0
    holder = ""
    with (
        topo.api() as http,
        http.stream("GET", f"/runs/{run_id}/events", timeout=httpx.Timeout(30, read=LEASE + 15)) as response,
    ):
        assert response.status_code == 200
        for event in sse_events(response):
            events.append(event)
            if not killed_at and len(event_ticks(events)) >= 8:
                holder = driver.run(run_id)["lease_owner"]
                topo.workers[holder].send_signal(signal.SIGKILL)
                topo.workers[holder].wait(10)
                killed_at = time.monotonic()
            if event.kind == "recover_notice":
                recovered_at = time.monotonic()
            if event.kind == "result":
                break
    assert killed_at and recovered_at, [e.kind for e in events]
    assert recovered_at - killed_at < LEASE + 5
    assert events[-1].data["payload"]["stop"] == "end_turn"
    assert event_ticks(events) == list(range(1, ticks + 1))
    assert_once_in_order(events)
    # The run's row ends just after its last envelope is published.
    run = wait_for(lambda: (found := driver.run(run_id))["status"] != "running" and found, 10, "the run's end")
    assert (run["status"], run["attempts"]) == ("completed", 2) and run["lease_owner"] != holder
    assert reply_ticks(driver.envelopes(session_id)) == list(range(1, ticks + 1))


def test_sigterm_of_the_streaming_worker_drains_its_run(topo: Topology) -> None:
    cluster, driver = topo.cluster, topo.driver
    ticks = 20
    session_id, run_id = topo.post_run(f"!slow {ticks}")
    events: list[SseEvent] = []
    draining: subprocess.Popen[bytes] | None = None
    with (
        topo.api() as http,
        http.stream("GET", f"/runs/{run_id}/events", timeout=httpx.Timeout(30, read=20)) as response,
    ):
        for event in sse_events(response):
            events.append(event)
            if draining is None and len(event_ticks(events)) >= 3:
                holder = driver.run(run_id)["lease_owner"]
                draining = topo.workers.pop(holder)
                draining.send_signal(signal.SIGTERM)
            if event.kind == "result":
                break
    assert draining is not None
    try:
        assert draining.wait(20) == 0
    except subprocess.TimeoutExpired:
        draining.kill()
        raise
    assert events[-1].data["payload"]["stop"] == "end_turn"
    assert event_ticks(events) == list(range(1, ticks + 1))
    assert "recover_notice" not in [e.kind for e in events]
    run = driver.run(run_id)
    assert (run["status"], run["stop_reason"], run["attempts"]) == ("completed", "end_turn", 1)
    assert "SESSION_ERROR" not in [e["type"] for e in driver.envelopes(session_id)]
    logs = "".join(path.read_text(errors="replace") for path in cluster.tmp.glob("worker-*.log"))
    assert "draining 1 runs" in logs


def postgres_cluster() -> tuple[str, str]:
    """(version, name) of the machine's PostgreSQL cluster on DATABASE_URL's port."""
    port = str(urlsplit(os.environ["DATABASE_URL"]).port or 5432)
    listed = subprocess.run(["pg_lsclusters", "-h"], capture_output=True, text=True, check=True).stdout
    for line in listed.splitlines():
        version, name, cluster_port, *_ = line.split()
        if cluster_port == port:
            return version, name
    raise AssertionError(f"no PostgreSQL cluster of this machine listens on port {port}:\n{listed}")


def postgres_online(version: str, name: str) -> bool:
    found = subprocess.run(["pg_ctlcluster", version, name, "status"], capture_output=True, text=True)
    return found.returncode == 0


def liveness_locks_held(driver: LiveDriver, worker_ids: list[str]) -> bool:
    rows = driver._rows(
        "SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database"
        " WHERE l.locktype = 'advisory' AND l.granted AND d.datname = current_database()"
        " AND l.classid = %s AND l.objsubid = 2 AND l.objid = ANY(SELECT hashtext(w)::oid FROM unnest(%s::text[]) w)",
        (0x5EC7, worker_ids),
    )
    return bool(rows[0][0] == len(worker_ids))


# Beside the Redis restart, before it: it restarts the machine's PostgreSQL (which other
# test runs share), once, for as short a time as a restart takes.
@pytest.mark.skipif(shutil.which("pg_ctlcluster") is None, reason="needs the machine's own PostgreSQL (pg_ctlcluster)")
def test_a_postgres_restart_mid_stream_is_survived_with_a_gapless_journal(topo: Topology) -> None:
    cluster, driver = topo.cluster, topo.driver
    version, name = postgres_cluster()
    ticks = 40
    session_id, run_id = topo.post_run(f"!slow {ticks}")
    wait_for(lambda: len(streamed_ticks(driver.envelopes(session_id))) >= 8, 60, "ticks before the restart", 0.1)
    assert driver.run(run_id)["status"] == "running", "the restart must land mid-stream"
    driver.close()  # its connection dies with the server
    try:
        subprocess.run(
            ["pg_ctlcluster", "--skip-systemctl-redirect", version, name, "restart", "-m", "fast"],
            check=True, capture_output=True, timeout=60,
        )  # fmt: skip
    finally:  # whatever happened, the machine's PostgreSQL is up again
        if not postgres_online(version, name):
            subprocess.run(["pg_ctlcluster", "--skip-systemctl-redirect", version, name, "start"], timeout=60)
    assert postgres_online(version, name)

    # The run continues (recovered from what the journal holds) or fails retryably; then
    # a Retry works.
    run = wait_for(
        lambda: (found := driver.run(run_id))["status"] not in ("queued", "running") and found, 60, "the run's end"
    )
    print("after the PostgreSQL restart:", run)  # which way it went (pytest -s)
    if run["status"] == "failed":
        last_error = driver.session_state(session_id).get("last_error") or {}
        assert last_error.get("retryable"), last_error
        with topo.api() as http:
            retried = http.post(f"/sessions/{session_id}/retry")
        assert retried.status_code == 202, retried.text
        retry_id = retried.json()["run_id"]
        again = wait_for(lambda: (f := driver.run(retry_id))["status"] not in ("queued", "running") and f, 60, "retry")
        assert again["status"] == "completed", again
    else:
        assert run["status"] == "completed", run
        assert reply_ticks(driver.envelopes(session_id)) == list(range(1, ticks + 1))
    journal = driver.envelopes(session_id)
    seqs = [e["seq"] for e in journal]
    assert seqs == list(range(1, len(journal) + 1)), "gapless, no seq twice"
    assert journal[-1]["type"] == "INVOCATION_COMPLETED"

    # Every process reconnected: each Daphne is ready again, the workers hold their
    # liveness locks again (taken anew: the restart ended their connections), and a new
    # run streams through the balancer in one attempt.
    for port in cluster.daphne_ports:
        wait_for(lambda p=port: httpx.get(f"http://127.0.0.1:{p}/readyz", timeout=10).status_code == 200, 30, "readyz")
    assert all(proc.poll() is None for proc in topo.workers.values()), "a worker died with the database"
    wait_for(lambda: liveness_locks_held(driver, list(topo.workers)), 15, "the workers' liveness locks again", 0.2)
    logs = "".join(path.read_text(errors="replace") for path in cluster.tmp.glob("worker-*.log"))
    assert "liveness lock taken again" in logs
    session_id, run_id = topo.post_run("!slow 5")
    with (
        topo.api() as http,
        http.stream("GET", f"/runs/{run_id}/events", timeout=httpx.Timeout(30, read=20)) as response,
    ):
        events = []
        for event in sse_events(response):
            events.append(event)
            if event.kind == "result":
                break
    assert event_ticks(events) == [1, 2, 3, 4, 5]
    assert_once_in_order(events)
    after = wait_for(lambda: (found := driver.run(run_id))["status"] != "running" and found, 10, "the new run's end")
    assert (after["status"], after["attempts"]) == ("completed", 1)


# Last: the other tests share this cluster, and a restarted Redis leaves its Daphnes'
# subscriptions slow to recover for a while.
def test_a_redis_restart_mid_stream_loses_nothing_in_sse(topo: Topology) -> None:
    cluster, driver = topo.cluster, topo.driver
    assert cluster.redis is not None
    ticks = 50
    session_id, run_id = topo.post_run(f"!slow {ticks}")
    events: list[SseEvent] = []
    dropped: list[SseEvent] = []  # a second reader that loses its stream in the outage
    with (
        topo.api() as http,
        http.stream("GET", f"/runs/{run_id}/events", timeout=httpx.Timeout(30, read=20)) as response,
    ):
        with http.stream("GET", f"/runs/{run_id}/events") as early:
            for event in sse_events(early):
                dropped.append(event)
                if len(event_ticks(dropped)) >= 5:
                    break
        for event in sse_events(response):
            events.append(event)
            if cluster.redis.proc is not None and len(event_ticks(events)) >= 10:
                cluster.redis.stop(signal.SIGKILL)
                time.sleep(1.0)  # the run streams on with no channel layer at all
                cluster.redis.start()
            if event.kind == "result":
                break
        last_id = max(e.id for e in dropped if e.id is not None)
        with http.stream("GET", f"/runs/{run_id}/events", headers={"Last-Event-ID": str(last_id)}) as resumed:
            rest = list(sse_events(resumed))
    assert cluster.redis.proc is not None, "Redis was restarted"
    assert events[-1].kind == "result" and events[-1].data["payload"]["stop"] == "end_turn"
    assert event_ticks(events) == list(range(1, ticks + 1))
    assert_once_in_order(events)
    # The resumed reader: what it had, then the rest after its Last-Event-ID, is the whole stream.
    assert all(e.id is None or e.id > last_id for e in rest)
    assert [(e.id, e.kind) for e in dropped + rest] == [(e.id, e.kind) for e in events]
    assert event_ticks(dropped + rest) == list(range(1, ticks + 1))
    journal = driver.envelopes(session_id)
    assert [e["seq"] for e in journal] == list(range(1, len(journal) + 1))
    run = wait_for(lambda: (found := driver.run(run_id))["status"] != "running" and found, 10, "the run's end")
    assert (run["status"], run["attempts"]) == ("completed", 1)
