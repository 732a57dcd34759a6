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
  the rest, nothing twice; and again: streams opened once it is back, on the same Daphnes
  and workers, are live within 3 s;
- SIGTERM of the worker streaming a run: it finishes the run (attempt 1) and exits 0;
- PostgreSQL restarted under 20 streams, and Redis restarted under 20 streams: every run
  completes (none failed for good) and every SSE client, reconnecting on a ``retry:`` or
  a 503 with its Last-Event-ID, gets every tick exactly once.

The PostgreSQL restart is the machine's own (`pg_ctlcluster ... restart`), which other
test runs share; `SECTR_FAULTS_POSTGRES=terminate` ends every backend of the cluster's
scratch database instead (`pg_terminate_backend`: what a restart does to each
connection, "terminating connection due to administrator command"), for a machine where
others are using that PostgreSQL.

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
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from tests.cluster import Cluster
from tests.server.runs.test_worker_processes import LiveDriver, reply_ticks, streamed_ticks, wait_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.serial,  # kills processes, restarts PostgreSQL and Redis: alone (scripts/test.sh)
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
#: Streams at once in the restart tests (each worker can run them all).
STREAMS = 20
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
        self.workers[name] = self.cluster.start_worker(
            "--lease", str(LEASE), "--poll", "0.2", "--worker-id", name, "--concurrency", str(STREAMS)
        )  # fmt: skip
        if wait:  # Django's start takes seconds on a busy machine; a test must not count it
            wait_for(lambda: log.exists() and f"worker {name} running" in log.read_text(), 120, f"worker {name}", 0.2)
        return name

    def api(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.cluster.base_url + "/api/v1", headers={"Authorization": f"Bearer {self.token}"}, timeout=30
        )

    def post_run(self, text: str) -> tuple[str, str]:
        with self.api() as http:
            session = answered(lambda: http.post("/sessions", json={"title": "fault"}))
            assert session.status_code == 201, session.text
            run = answered(lambda: http.post(f"/sessions/{session.json()['id']}/runs", json={"content": text}))
            assert run.status_code == 202, run.text
            return str(session.json()["id"]), str(run.json()["run_id"])


def answered(call: Callable[[], httpx.Response], tries: int = 5) -> httpx.Response:
    """`call`'s answer, asked again after Retry-After while it is 503 (the database was
    away a moment ago: a Daphne's first request on a pooled connection the fault killed)."""
    for _ in range(tries - 1):
        response = call()
        if response.status_code != 503:
            return response
        time.sleep(float(response.headers.get("Retry-After", "1")))
    return call()


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
    env = {
        "SECTR_DEMO_SLOW_MS": str(TICK_MS),
        "SECTR_LEASE_SECONDS": str(LEASE),
        # Many streams at once from one user and token: no budget in the way.
        "SECTR_SESSION_CREATE_LIMIT": "1000/60",
        "SECTR_API_RATE_LIMIT": "0/60",
    }
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


class RunFollower(threading.Thread):
    """An SSE client of one run through the balancer, as a program would follow it: when
    the stream ends before the run's result (a ``retry:`` field, a cut connection) or is
    refused with 503 (Retry-After), it reconnects with its Last-Event-ID. Records every
    event with its arrival time, and every answer's status."""

    def __init__(self, topo: Topology, run_id: str, deadline: float) -> None:
        super().__init__(daemon=True)
        self.url = f"{topo.cluster.base_url}/api/v1/runs/{run_id}/events"
        self.token = topo.token
        self.deadline = deadline
        self.events: list[SseEvent] = []
        self.arrivals: list[float] = []
        self.statuses: list[int] = []
        self.cuts = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._follow()
        except BaseException as exc:  # reported by the test
            self.error = exc

    def _follow(self) -> None:
        while time.monotonic() < self.deadline:
            headers = {"Authorization": f"Bearer {self.token}"}
            ids = [e.id for e in self.events if e.id is not None]
            if ids:
                headers["Last-Event-ID"] = str(max(ids))
            wait = 0.2
            try:
                with httpx.stream("GET", self.url, headers=headers, timeout=httpx.Timeout(30, read=20)) as response:
                    self.statuses.append(response.status_code)
                    if response.status_code == 503:
                        wait = float(response.headers.get("Retry-After", "1"))
                        response.read()
                    else:
                        assert response.status_code == 200, response.read()
                        for line in sse_lines(response, self):
                            if line.startswith("retry:"):
                                wait = int(line[6:].strip()) / 1000
                        if self.events and self.events[-1].kind == "result":
                            return
                        self.cuts += 1
            except httpx.HTTPError:
                self.cuts += 1
            time.sleep(wait)
        raise AssertionError(f"no result before the deadline ({len(self.events)} events)")

    def received(self, event: SseEvent) -> None:
        self.events.append(event)
        self.arrivals.append(time.monotonic())

    def longest_silence(self) -> float:
        """The longest wait between two message deltas (the stall a restart caused)."""
        times = [t for t, e in zip(self.arrivals, self.events, strict=True) if e.kind == "message.delta"]
        return max((b - a for a, b in zip(times, times[1:], strict=False)), default=0.0)


def sse_lines(response: httpx.Response, follower: RunFollower) -> Iterator[str]:
    """Feed `follower` the stream's events; yield its other lines (``retry:``, comments)."""
    event_id: int | None = None
    kind = ""
    data: list[str] = []
    for line in response.iter_lines():
        if line == "":
            if data:
                follower.received(SseEvent(event_id, kind, json.loads("\n".join(data))))
                if kind == "result":
                    return
            event_id, kind, data = None, "", []
        elif line.startswith("id:"):
            event_id = int(line[3:].strip())
        elif line.startswith("event:"):
            kind = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].strip())
        else:
            yield line


def follow_runs_through(topo: Topology, ticks: int, fault: Callable[[], None]) -> list[tuple[str, str, RunFollower]]:
    """STREAMS runs of `!slow ticks` followed over SSE; `fault()` once each has streamed a
    few ticks; then every follower to its result. (session id, run id, follower) each."""
    started = time.monotonic()
    with ThreadPoolExecutor(STREAMS) as pool:  # at once: one by one, the first ended before the last began
        posted = list(pool.map(lambda _: topo.post_run(f"!slow {ticks}"), range(STREAMS)))
    deadline = time.monotonic() + 180
    followers = [RunFollower(topo, run_id, deadline) for _session, run_id in posted]
    for follower in followers:
        follower.start()
    wait_for(lambda: all(len(event_ticks(f.events)) >= 5 for f in followers), 60, "ticks before the fault", 0.1)
    streamed = [len(event_ticks(f.events)) for f in followers]
    print(f"posted in {time.monotonic() - started:.1f} s; ticks at the fault: {streamed}")
    assert all(n < ticks for n in streamed), f"the fault must land mid-stream: {streamed}"
    fault()
    for follower in followers:
        follower.join(max(deadline - time.monotonic(), 0) + 5)
    return [(session_id, run_id, f) for (session_id, run_id), f in zip(posted, followers, strict=True)]


def assert_every_run_completed_with_every_tick_once(
    topo: Topology, ticks: int, followed: list[tuple[str, str, RunFollower]]
) -> None:
    driver = topo.driver
    for session_id, run_id, follower in followed:
        assert follower.error is None, f"{run_id}: {follower.error!r}"
        assert set(follower.statuses) <= {200, 503}, follower.statuses  # never a 500
        events = follower.events
        assert events[-1].kind == "result" and events[-1].data["payload"]["stop"] == "end_turn", events[-1]
        assert event_ticks(events) == list(range(1, ticks + 1)), run_id  # every chunk, once, in order
        assert_once_in_order(events)
        run = wait_for(lambda r=run_id: (f := driver.run(r))["status"] != "running" and f, 20, "the run's end")
        assert run["status"] == "completed", run
        journal = driver.envelopes(session_id)
        assert [e["seq"] for e in journal] == list(range(1, len(journal) + 1)), "gapless, no seq twice"
        assert "INVOCATION_FAILED" not in [e["type"] for e in journal]  # none failed, not even retryably
        assert reply_ticks(journal) == list(range(1, ticks + 1))


def report(topo: Topology, what: str, followed: list[tuple[str, str, RunFollower]], took: float) -> None:
    """What the fault cost (pytest -s): how long the streams went silent, how many runs
    were recovered (stopped by the fault, continued by a worker), how often the clients
    reconnected."""
    followers = [f for _s, _r, f in followed]
    silences = sorted(f.longest_silence() for f in followers)
    attempts = [topo.driver.run(run_id)["attempts"] for _s, run_id, _f in followed]
    print(
        f"{what}: {len(followers)} runs completed in {took:.1f} s after the fault,"
        f" {sum(a > 1 for a in attempts)} of them recovered (attempts {sorted(attempts)});"
        f" longest silence per stream: median {silences[len(silences) // 2]:.1f} s, max {silences[-1]:.1f} s;"
        f" reconnects {sum(f.cuts for f in followers)}, 503s {sum(f.statuses.count(503) for f in followers)}"
    )


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


def restart_postgres(topo: Topology) -> None:
    """Restart the machine's PostgreSQL, quickly, and wait until it answers again; with
    SECTR_FAULTS_POSTGRES=terminate, end every backend of the scratch database instead."""
    driver = topo.driver
    if os.environ.get("SECTR_FAULTS_POSTGRES") == "terminate":
        ((ended,),) = driver._rows(
            "SELECT count(pg_terminate_backend(pid, 5000)) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()",
            (),
        )
        assert ended >= 4, ended  # 2 Daphne, 2 workers and their liveness locks at least
        return
    version, name = postgres_cluster()
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


# Beside the Redis restarts, before them: by default it restarts the machine's PostgreSQL
# (which other test runs share), once, for as short a time as a restart takes.
def test_a_postgres_restart_under_20_streams_completes_every_run_with_every_tick_once(topo: Topology) -> None:
    if os.environ.get("SECTR_FAULTS_POSTGRES") != "terminate" and shutil.which("pg_ctlcluster") is None:
        pytest.skip("needs the machine's own PostgreSQL (pg_ctlcluster), or SECTR_FAULTS_POSTGRES=terminate")
    cluster, driver = topo.cluster, topo.driver
    ticks = 150  # 15 s a run: all twenty are mid-stream when the fault lands
    faulted = 0.0

    def fault() -> None:
        nonlocal faulted
        faulted = time.monotonic()
        restart_postgres(topo)

    followed = follow_runs_through(topo, ticks, fault)
    took = time.monotonic() - faulted
    report(topo, "PostgreSQL restart", followed, took)
    # No run failed for good (nor retryably): each continued from its journal, and each
    # SSE client got every tick once across its reconnections.
    assert_every_run_completed_with_every_tick_once(topo, ticks, followed)

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


# Last, the Redis restarts, one after another on the same processes: each must find them
# streaming live again.
def test_a_redis_restart_mid_stream_loses_nothing_in_sse(topo: Topology) -> None:
    cluster, driver = topo.cluster, topo.driver
    assert cluster.redis is not None
    ticks = 50
    session_id, run_id = topo.post_run(f"!slow {ticks}")
    events: list[SseEvent] = []
    dropped: list[SseEvent] = []  # a second reader that loses its stream in the outage
    restarted = False
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
            if not restarted and len(event_ticks(events)) >= 10:  # once (it is up again after)
                cluster.redis.stop(signal.SIGKILL)
                time.sleep(1.0)  # the run streams on with no channel layer at all
                cluster.redis.start()
                restarted = True
            if event.kind == "result":
                break
        last_id = max(e.id for e in dropped if e.id is not None)
        with http.stream("GET", f"/runs/{run_id}/events", headers={"Last-Event-ID": str(last_id)}) as resumed:
            rest = list(sse_events(resumed))
    assert restarted and cluster.redis.proc is not None, "Redis was restarted"
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


def stream_new_run(topo: Topology, ticks: int) -> tuple[str, float, float, list[SseEvent]]:
    """Post a run of `ticks` and follow its SSE stream through the balancer to its result:
    (the Daphne that served it, "" if it never answered; when the stream was asked for;
    when its first delta came, 0.0 if none did; its events). A stream silent for 10 s is
    given up."""
    _session_id, run_id = topo.post_run(f"!slow {ticks}")
    events: list[SseEvent] = []
    backend, first = "", 0.0
    with topo.api() as http:
        opened = time.monotonic()
        try:
            with http.stream("GET", f"/runs/{run_id}/events", timeout=httpx.Timeout(30, read=10)) as response:
                assert response.status_code == 200, response.read()
                backend = response.headers.get("x-sectr-backend", "")
                for event in sse_events(response):
                    events.append(event)
                    if not first and event.kind == "message.delta":
                        first = time.monotonic()
                    if event.kind == "result":
                        break
        except httpx.ReadTimeout:
            pass
    return backend, opened, first, events


def test_streams_opened_after_a_redis_restart_are_live_at_once(topo: Topology) -> None:
    """New streams on the same Daphnes and workers, once Redis is back, are live at once.
    A Daphne whose connection to Redis was open but idle (no stream subscribed) when Redis
    went away sent its next stream's SUBSCRIBEs down the dead socket: without a retry
    the second failed, the stream's 200 had gone out, and its client waited for nothing
    until it gave up (20 s in these tests) and read the run from the journal."""
    redis = topo.cluster.redis
    assert redis is not None
    ticks = 20
    # Each Daphne streams a run first: its Redis connections are then open, and idle.
    warmed: set[str] = set()
    for _ in range(6):
        backend, _opened, _first, events = stream_new_run(topo, 2)
        if events and events[-1].kind == "result":
            warmed.add(backend)
        if len(warmed) == 2:
            break
    assert len(warmed) == 2, warmed
    redis.stop(signal.SIGKILL)
    time.sleep(1.0)  # away for a moment, as in the tests above
    redis.start()
    back = time.monotonic()
    waits: dict[str, float] = {}
    for _ in range(6):  # until a stream on each Daphne
        backend, opened, first, events = stream_new_run(topo, ticks)
        since = max(opened, back)
        # No delta at all: the stream ended early (retry:) or was silent for 10 s.
        assert first, f"{backend or 'a Daphne'}: no live delta after Redis was back ({len(events)} events)"
        # Live: the run's first tick comes 0.1 s after it starts. Without the channel
        # layer the stream would read it from the journal, polled every 3 s.
        assert first - since < 3.0, f"{backend}: first delta {first - since:.1f} s after Redis was back"
        assert event_ticks(events) == list(range(1, ticks + 1))
        assert_once_in_order(events)
        waits[backend] = first - since
        if len(waits) == 2:
            break
    print("first delta after Redis was back, per Daphne:", {k: f"{v:.2f} s" for k, v in sorted(waits.items())})
    assert len(waits) == 2, waits


def test_a_redis_restart_under_20_streams_completes_every_run_with_every_tick_once(topo: Topology) -> None:
    redis = topo.cluster.redis
    assert redis is not None
    ticks = 150
    faulted = 0.0

    def fault() -> None:
        nonlocal faulted
        faulted = time.monotonic()
        redis.stop(signal.SIGKILL)
        time.sleep(1.0)  # the runs stream on with no channel layer at all
        redis.start()

    followed = follow_runs_through(topo, ticks, fault)
    report(topo, "Redis restart", followed, time.monotonic() - faulted)
    assert redis.proc is not None, "Redis was restarted"
    assert_every_run_completed_with_every_tick_once(topo, ticks, followed)
    for _session_id, run_id, _follower in followed:
        assert topo.driver.run(run_id)["attempts"] == 1  # the workers never noticed
