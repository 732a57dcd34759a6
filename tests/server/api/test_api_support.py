"""Shared helpers for the API and SDK tests against a real server (this module has no tests).

`live_api()` starts Sectr (tests/liveserver.py: Daphne on a free port, a scratch SQLite
file or PostgreSQL database per DATABASE_URL) with users and API tokens, and
`row_counts()` reads the server's own database to prove that a refused request wrote
nothing. With SQLite the worker runs inside Daphne (the embedded default, sharing the
in-memory channel layer); with PostgreSQL a separate `manage.py sectr_worker` process
runs the queue and reaches Daphne through the Redis channel layer.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.liveserver import LiveSectr

USERS = ("alice", "bob", "mod")

_SETUP = """
import json
from django.contrib.auth import get_user_model
from sessions_app.actions.teams import do_create_team, do_set_membership
from sessions_app.actions.tokens import do_issue_token
User = get_user_model()
tokens = {}
# alice's sessions are in team crew (her only team), which mod moderates; bob is outside.
do_create_team("crew")
for name in NAMES:
    user = User.objects.create_user(name, password="pw-Secret-123")
    if name in ("alice", "mod"):
        do_set_membership("crew", name, "moderator" if name == "mod" else "member")
    tokens[name] = do_issue_token(user, "tests")[1]
print(json.dumps(tokens))
"""


@dataclass
class LiveApi:
    live: LiveSectr
    tokens: dict[str, str]
    clients: dict[str, httpx.Client] = field(default_factory=dict)

    @property
    def base_url(self) -> str:
        return self.live.base_url

    def http(self, user: str = "alice") -> httpx.Client:
        """An httpx client with `user`'s bearer token, for raw API calls."""
        if user not in self.clients:
            self.clients[user] = httpx.Client(
                base_url=self.live.base_url + "/api/v1",
                headers={"Authorization": f"Bearer {self.tokens[user]}"},
                timeout=30,
            )
        return self.clients[user]

    def close(self) -> None:
        for client in self.clients.values():
            client.close()


@contextmanager
def live_api(env: dict[str, str] | None = None) -> Iterator[LiveApi]:
    embedded = not os.environ.get("DATABASE_URL", "").startswith(("postgres://", "postgresql://"))
    with LiveSectr(embedded_worker=embedded, env=env) as live:
        if not embedded:
            live.start_worker()
        code = _SETUP.replace("NAMES", repr(USERS))
        tokens = json.loads(live.manage("shell", "-c", code).strip().splitlines()[-1])
        api = LiveApi(live, tokens)
        try:
            yield api
        finally:
            api.close()


TABLES = {
    "envelopes": "sessions_app_envelope",
    "sessions": "sessions_app_session",
    "runs": "sessions_app_run",
    "blobs": "sessions_app_mediablob",
    "media_links": "sessions_app_sessionmedia",
    "tokens": "sessions_app_apitoken",
}


def row_counts(live: LiveSectr) -> dict[str, int]:
    """How many rows the server's database holds per table, and its media files."""
    counts: dict[str, int] = {}
    if live.postgres:
        import psycopg

        with psycopg.connect(live.database_url) as conn:
            for key, table in TABLES.items():
                row = conn.execute(f"SELECT count(*) FROM {table}").fetchone()  # noqa: S608 - fixed names
                counts[key] = int(row[0]) if row else 0
    else:
        conn = sqlite3.connect(str(live.tmp / "live.sqlite3"), timeout=20)
        try:
            for key, table in TABLES.items():
                counts[key] = int(conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0])  # noqa: S608
        finally:
            conn.close()
    media_root = Path(live.tmp) / "media"
    counts["files"] = sum(1 for p in media_root.rglob("*") if p.is_file()) if media_root.exists() else 0
    return counts


def sse_events(response: httpx.Response) -> Iterator[dict[str, Any]]:
    """Parse an SSE response into {"id", "event", "data"} dicts (comments as {"comment"})."""
    frame: dict[str, Any] = {}
    for line in response.iter_lines():
        if line == "":
            if frame:
                yield frame
            frame = {}
        elif line.startswith(":"):
            yield {"comment": line[1:].strip()}
        else:
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            frame[name] = json.loads(value) if name == "data" else value
