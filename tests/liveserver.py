"""Real Sectr processes for tests: Daphne and workers on a scratch database.

    with LiveSectr() as live:              # SQLite file, or a scratch PostgreSQL db when
        live.manage("shell", "-c", "...")   # DATABASE_URL points at PostgreSQL
        token = live.token_for("alice")
        httpx.get(live.url("/healthz"))
        live.restart()                     # kill and start Daphne again
        worker = live.start_worker()       # a separate `manage.py sectr_worker`

The database is created fresh per LiveSectr and dropped after: a copy of a template that
`manage.py migrate` built once per test process (migrating every server's database took
seconds of CPU each). REDIS_URL is passed through with a per-instance channel prefix, so
parallel servers never cross-talk.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import closing
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
DAPHNE = str(Path(sys.executable).with_name("daphne"))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _postgres_admin_url(url: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/postgres"))


def _postgres_admin(url: str, sql: str) -> None:
    import psycopg

    with psycopg.connect(_postgres_admin_url(url), autocommit=True) as conn:
        conn.execute(sql)


#: This process's migrated template databases, by database server (its admin URL, "" for
#: SQLite), settings module and checkout (bench/peers.py serves other checkouts, whose
#: migrations differ): a SQLite file, or a PostgreSQL database name. Dropped when the
#: process exits.
_TEMPLATES: dict[tuple[str, str, str], str] = {}


def _migrated_template(server_url: str, env: dict[str, str]) -> str:
    """The template of `server_url` ("" for SQLite), migrated with `env` the first time."""
    key = (server_url, env["DJANGO_SETTINGS_MODULE"], str(ROOT))
    if key in _TEMPLATES:
        return _TEMPLATES[key]
    directory = tempfile.mkdtemp(prefix="sectr-live-template-")
    atexit.register(shutil.rmtree, directory, True)
    if server_url:
        template = f"sectr_live_template_{os.getpid()}_{uuid.uuid4().hex[:6]}"
        url = urlunsplit(urlsplit(server_url)._replace(path=f"/{template}"))
        _postgres_admin(url, f'CREATE DATABASE "{template}"')
        atexit.register(_postgres_admin, url, f'DROP DATABASE IF EXISTS "{template}" WITH (FORCE)')
    else:
        template = os.path.join(directory, "template.sqlite3")
        url = f"sqlite:///{template}"
    done = subprocess.run(  # noqa: S603 - our own manage.py
        [PYTHON, "manage.py", "migrate", "--noinput"],
        cwd=ROOT,
        env={**env, "DATABASE_URL": url, "SECTR_VAR_DIR": directory},
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode != 0:
        raise RuntimeError(f"manage.py migrate (the template) failed:\n{done.stdout}\n{done.stderr}")
    _TEMPLATES[key] = template
    return template


class LiveSectr:
    def __init__(
        self,
        *,
        embedded_worker: bool | None = None,
        env: dict[str, str] | None = None,
        port: int | None = None,
    ) -> None:
        self.port = port or free_port()
        self.tmp = Path(tempfile.mkdtemp(prefix="sectr-live-"))
        base = os.environ.get("DATABASE_URL", "")
        self.postgres = base.startswith(("postgres://", "postgresql://"))
        if self.postgres:
            self.db_name = f"sectr_live_{uuid.uuid4().hex[:10]}"
            self.database_url = urlunsplit(urlsplit(base)._replace(path=f"/{self.db_name}"))
        else:
            self.database_url = f"sqlite:///{self.tmp / 'live.sqlite3'}"
        self.env = {
            **os.environ,
            "DATABASE_URL": self.database_url,
            "SECTR_VAR_DIR": str(self.tmp),
            "DJANGO_SETTINGS_MODULE": "sectr_web.settings",
            "SECTR_CHANNEL_PREFIX": f"t{uuid.uuid4().hex[:8]}",
            "SECTR_DEMO_DELAY_MS": os.environ.get("SECTR_DEMO_DELAY_MS", "2"),
            "PYTHONPATH": str(ROOT),
            "PYTHONUNBUFFERED": "1",
            **(env or {}),
        }
        if embedded_worker is not None:
            self.env["SECTR_EMBEDDED_WORKER"] = "1" if embedded_worker else "0"
        self.server: subprocess.Popen[bytes] | None = None
        self.workers: list[subprocess.Popen[bytes]] = []
        self.base_url = f"http://127.0.0.1:{self.port}"

    # ---- lifecycle ----

    def __enter__(self) -> LiveSectr:
        self.create_database()
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def create_database(self) -> None:
        """A migrated database: a copy of this process's template."""
        if self.postgres:
            template = _migrated_template(_postgres_admin_url(self.database_url), self.env)
            _postgres_admin(self.database_url, f'CREATE DATABASE "{self.db_name}" TEMPLATE "{template}"')
        else:
            template = _migrated_template("", self.env)
            # SQLite's backup: a consistent copy whatever its journal (WAL) holds.
            with (
                closing(sqlite3.connect(template)) as source,
                closing(sqlite3.connect(self.tmp / "live.sqlite3")) as copy,
            ):
                source.backup(copy)

    def drop_database(self) -> None:
        if self.postgres:
            _postgres_admin(self.database_url, f'DROP DATABASE IF EXISTS "{self.db_name}" WITH (FORCE)')

    def start(self) -> None:
        log = open(self.tmp / "daphne.log", "ab")  # noqa: SIM115 - closed with the process
        self.server = subprocess.Popen(
            [DAPHNE, "-b", "127.0.0.1", "-p", str(self.port), "sectr_web.asgi:application"],
            cwd=ROOT,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self.wait_ready()

    def wait_ready(self, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.server is not None and self.server.poll() is not None:
                raise RuntimeError(f"daphne exited early:\n{self.log()}")
            try:
                if httpx.get(self.url("/healthz"), timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"daphne did not answer in {timeout}s:\n{self.log()}")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.server is not None and self.server.poll() is None:
            self.server.send_signal(sig)
            try:
                self.server.wait(10)
            except subprocess.TimeoutExpired:
                self.server.kill()
                self.server.wait(5)
        self.server = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def start_worker(self, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        log = open(self.tmp / f"worker-{len(self.workers)}.log", "ab")  # noqa: SIM115
        proc = subprocess.Popen(
            [PYTHON, "manage.py", "sectr_worker", *args],
            cwd=ROOT,
            env={**self.env, **(env or {})},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self.workers.append(proc)
        return proc

    def close(self) -> None:
        for proc in self.workers:
            if proc.poll() is None:
                proc.kill()
                proc.wait(5)
        self.stop()
        self.drop_database()

    # ---- helpers ----

    def url(self, path: str) -> str:
        return self.base_url + path

    def log(self) -> str:
        path = self.tmp / "daphne.log"
        return path.read_text(errors="replace")[-5000:] if path.exists() else ""

    def manage(self, *args: str, check: bool = True) -> str:
        result = subprocess.run(  # noqa: S603 - our own manage.py
            [PYTHON, "manage.py", *args], cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=120
        )
        if check and result.returncode != 0:
            raise RuntimeError(f"manage.py {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
        return result.stdout

    def create_user(self, username: str, password: str = "pw-Secret-123", **flags: Any) -> None:
        code = (
            "from django.contrib.auth import get_user_model; U = get_user_model(); "
            f"u = U.objects.create_user({username!r}, password={password!r}); "
            + "".join(f"u.{k} = {v!r}; " for k, v in flags.items())
            + "u.save()"
        )
        self.manage("shell", "-c", code)

    def token_for(self, username: str) -> str:
        """A new API token for `username` (the last line `sectr_token` prints)."""
        return self.manage("sectr_token", username).strip().splitlines()[-1]
