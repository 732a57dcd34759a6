"""The production topology for tests and benches: HAProxy, N Daphne, K workers.

    with Cluster(daphnes=2, workers=2) as cluster:    # a scratch database, migrated
        httpx.get(cluster.url("/healthz"))              # through the balancer
        cluster.kill_daphne(0)                          # kill -9; the balancer routes around it
        cluster.kill_worker(1)
        cluster.start_daphne(0)

The same layout as scripts/cluster.sh (one HAProxy configuration,
scripts/haproxy.cfg.in), on free loopback ports. The database is whatever
DATABASE_URL names (a scratch database of it, as LiveSectr), the channel layer REDIS_URL
(with a per-cluster prefix), or a private `redis-server` started here when
`private_redis=True` or REDIS_URL is empty (several processes need a shared layer).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import IO

import httpx

from tests.liveserver import DAPHNE, ROOT, LiveSectr, free_port

HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"
HAPROXY_TEMPLATE = ROOT / "scripts" / "haproxy.cfg.in"
#: In HAProxy's environment, makes it name the answering Daphne in X-Sectr-Backend.
BACKEND_HEADER_SWITCH = "SECTR_HAPROXY_NAME_BACKEND"


def render_haproxy_config(port: int, backends: list[int]) -> str:
    servers = "".join(f"    server daphne{i} 127.0.0.1:{p} check\n" for i, p in enumerate(backends))
    text = HAPROXY_TEMPLATE.read_text().replace("@PORT@", str(port))
    return text.replace("@SERVERS@\n", servers)


def start_haproxy(config: Path, log: IO[bytes], *, name_backends: bool = False) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if k != BACKEND_HEADER_SWITCH}
    if name_backends:
        env[BACKEND_HEADER_SWITCH] = "1"
    return subprocess.Popen([HAPROXY, "-db", "-f", str(config)], stdout=log, stderr=subprocess.STDOUT, env=env)


class PrivateRedis:
    """A redis-server of our own on a free port (restartable without touching anyone else's)."""

    def __init__(self, directory: Path) -> None:
        self.port = free_port()
        self.directory = directory
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        log = open(self.directory / "redis.log", "ab")  # noqa: SIM115 - closed with the process
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(self.directory)],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            out = subprocess.run(["redis-cli", "-p", str(self.port), "ping"], capture_output=True, text=True)
            if out.stdout.strip() == "PONG":
                return
            time.sleep(0.05)
        raise RuntimeError("private redis-server did not start")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(10)
        self.proc = None


class Cluster(LiveSectr):
    """HAProxy on `port` in front of `daphnes` Daphne processes and `workers` workers."""

    def __init__(
        self,
        *,
        daphnes: int = 2,
        workers: int = 2,
        worker_args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        private_redis: bool = False,
        name_backends: bool = False,
    ) -> None:
        super().__init__(embedded_worker=False, env=env)
        #: HAProxy names the Daphne that answered in X-Sectr-Backend (fault tests only:
        #: scripts/haproxy.cfg.in strips the header otherwise)
        self.name_backends = name_backends
        self.daphne_ports = [free_port() for _ in range(daphnes)]
        self.daphnes: list[subprocess.Popen[bytes] | None] = [None] * daphnes
        self.worker_count = workers
        self.worker_args = worker_args
        self.haproxy: subprocess.Popen[bytes] | None = None
        self.redis: PrivateRedis | None = None
        if private_redis or not self.env.get("REDIS_URL"):
            self.redis = PrivateRedis(self.tmp)
            self.env["REDIS_URL"] = self.redis.url

    # ---- lifecycle ----

    def __enter__(self) -> Cluster:
        super().__enter__()
        return self

    def start(self) -> None:
        if self.redis is not None and self.redis.proc is None:
            self.redis.start()
        for index in range(len(self.daphnes)):
            self.start_daphne(index, wait=False)
        for index in range(len(self.daphnes)):
            self.wait_backend(index)
        config = self.tmp / "haproxy.cfg"
        config.write_text(render_haproxy_config(self.port, self.daphne_ports))
        log = open(self.tmp / "haproxy.log", "ab")  # noqa: SIM115 - closed with the process
        self.haproxy = start_haproxy(config, log, name_backends=self.name_backends)
        for _ in range(self.worker_count):
            self.start_worker(*self.worker_args)
        self.wait_ready()

    def start_daphne(self, index: int, *, wait: bool = True) -> subprocess.Popen[bytes]:
        log = open(self.tmp / f"daphne-{index}.log", "ab")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(
            [DAPHNE, "-b", "127.0.0.1", "-p", str(self.daphne_ports[index]), "sectr_web.asgi:application"],
            cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        self.daphnes[index] = proc
        self.server = proc  # LiveSectr's wait_ready watches it
        if wait:
            self.wait_backend(index)
        return proc

    def wait_backend(self, index: int, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        url = f"http://127.0.0.1:{self.daphne_ports[index]}/healthz"
        while time.monotonic() < deadline:
            proc = self.daphnes[index]
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"daphne {index} exited early:\n{self.log()}")
            try:
                if httpx.get(url, timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"daphne {index} did not answer in {timeout}s")

    def kill_daphne(self, index: int, sig: int = signal.SIGKILL) -> None:
        proc = self.daphnes[index]
        if proc is not None and proc.poll() is None:
            proc.send_signal(sig)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:  # a Daphne closing many open streams slowly
                proc.kill()
                proc.wait(10)
        self.daphnes[index] = None

    def kill_worker(self, index: int, sig: int = signal.SIGKILL) -> None:
        proc = self.workers[index]
        if proc.poll() is None:
            proc.send_signal(sig)
            proc.wait(30)

    def pids(self) -> dict[str, int]:
        """Every live process of the topology, by role (for CPU accounting)."""
        found = {f"daphne{i}": p.pid for i, p in enumerate(self.daphnes) if p is not None and p.poll() is None}
        found.update({f"worker{i}": p.pid for i, p in enumerate(self.workers) if p.poll() is None})
        if self.haproxy is not None and self.haproxy.poll() is None:
            found["haproxy"] = self.haproxy.pid
        if self.redis is not None and self.redis.proc is not None and self.redis.proc.poll() is None:
            found["redis"] = self.redis.proc.pid
        return found

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.haproxy is not None and self.haproxy.poll() is None:
            self.haproxy.terminate()
            self.haproxy.wait(10)
        self.haproxy = None
        for index in range(len(self.daphnes)):
            self.kill_daphne(index, sig)
        self.server = None

    def close(self) -> None:
        super().close()
        if self.redis is not None:
            self.redis.stop()

    def log(self) -> str:
        parts = []
        for path in sorted(self.tmp.glob("*.log")):
            parts.append(f"--- {path.name}\n" + path.read_text(errors="replace")[-3000:])
        return "\n".join(parts)
