"""Benchmark: streaming deltas through DatabaseJournal against the raw database driver.

    .venv/bin/python bench/journal.py [--postgres URL | --no-postgres] [-n 2000] [--streams 8] [--rounds 3]

For SQLite (a scratch file with the settings' pragmas and IMMEDIATE transactions) and
PostgreSQL (a scratch database, default "sectr_bench" on the local server, created and
dropped here; skipped when unreachable) it prints MESSAGE_DELTA envelopes appended per
second:

* raw: the driver alone (sqlite3 / psycopg), one transaction per row, the same seq bump
  as the journal: UPDATE the session row ... RETURNING last_seq (the row lock), INSERT the
  envelope, COMMIT;
* append: `await DatabaseJournal.append(...)` one delta at a time, like a stream (the
  hop to the journal's thread pool and back, close_old_connections around each call -
  a pool checkout on PostgreSQL, a kept connection on SQLite - validation, and
  publication to the in-memory channel layer);
* append_sync: the sync twin in one thread, without publication (the write alone);
* N streams: `append` from N concurrent tasks, one session each (aggregate rate).

Django is configured here (settings.configure), with both databases as aliases and the
production connection settings from sectr_web.settings.database_config; the project's
own settings are sectr_web.settings' (so the environment's SECTR_* apply, as to a server).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import django  # noqa: E402
from django.conf import settings  # noqa: E402

PG_DEFAULT = "postgres://postgres@127.0.0.1:5432/sectr_bench"


def configure(sqlite_path: Path, pg_url: str | None) -> None:
    """Django's defaults and the project's own settings (what sectr_web.settings defines
    beyond Django's: SECTR_JOURNAL_LINGER_MS, the tracing endpoint the app reads when it
    starts...) from the environment, with the bench's databases and in-memory layer."""
    os.environ.setdefault("SECTR_VAR_DIR", str(sqlite_path.parent))
    from django.conf import global_settings

    from sectr_web import settings as project
    from sectr_web.settings import database_config

    databases = {"default": database_config(f"sqlite:///{sqlite_path}")}
    if pg_url:
        databases["pg"] = database_config(pg_url)
    own = {
        name: value for name, value in vars(project).items() if name.isupper() and not hasattr(global_settings, name)
    }
    bench = dict(
        DEBUG=False,
        USE_TZ=True,
        TIME_ZONE="UTC",
        SECRET_KEY="bench",  # noqa: S106
        DATABASES=databases,
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "channels", "sessions_app"],
        CHANNEL_LAYERS={"default": {"BACKEND": "sectr_web.channel_layer.InMemoryChannelLayer"}},
        MEDIA_ROOT=str(sqlite_path.parent / "media"),
    )
    settings.configure(**{**own, **bench})
    django.setup()


def make_session(alias: str) -> str:
    from django.contrib.auth import get_user_model

    from sectr.events import EventType
    from sectr.journal import NewEvent
    from sessions_app.journal import DatabaseJournal
    from sessions_app.models import Session

    user, _ = get_user_model().objects.using(alias).get_or_create(username="bench")
    session = Session.objects.using(alias).create(owner=user)
    DatabaseJournal(using=alias, publish=False).append_sync(
        session.id, [NewEvent(EventType.SESSION_CREATED, {"mode": "default", "model": "demo"})]
    )
    return session.id


def delta_payload(i: int) -> dict[str, Any]:
    return {"message_id": "msg_bench", "text": f"token {i} "}


def rate(count: int, seconds: float) -> float:
    return count / seconds if seconds > 0 else float("inf")


# ---- raw drivers ----

BUMP = "UPDATE sessions_app_session SET last_seq = last_seq + 1, updated_at = {p} WHERE id = {p} RETURNING last_seq"
INSERT = (
    "INSERT INTO sessions_app_envelope (session_id, seq, invocation_id, type, payload, created_at) "
    "VALUES ({p}, {p}, {p}, 'MESSAGE_DELTA', {json}, {p})"
)


def raw_sqlite(path: Path, session_id: str, n: int) -> float:
    db = sqlite3.connect(path, isolation_level=None, timeout=20)
    db.executescript("PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;")
    bump, insert = BUMP.format(p="?"), INSERT.format(p="?", json="?")
    started = time.perf_counter()
    for i in range(n):
        now = datetime.now(UTC).isoformat()
        db.execute("BEGIN IMMEDIATE")
        (seq,) = db.execute(bump, (now, session_id)).fetchone()
        db.execute(insert, (session_id, seq, "inv_bench", json.dumps(delta_payload(i)), now))
        db.execute("COMMIT")
    elapsed = time.perf_counter() - started
    db.close()
    return rate(n, elapsed)


def raw_postgres(url: str, session_id: str, n: int) -> float:
    import psycopg

    bump, insert = BUMP.format(p="%s"), INSERT.format(p="%s", json="%s::jsonb")
    with psycopg.connect(url.replace("postgres://", "postgresql://", 1)) as db:
        started = time.perf_counter()
        for i in range(n):
            now = datetime.now(UTC)
            with db.cursor() as cursor:
                cursor.execute(bump, (now, session_id))
                row = cursor.fetchone()
                assert row is not None
                cursor.execute(insert, (session_id, row[0], "inv_bench", json.dumps(delta_payload(i)), now))
            db.commit()
        return rate(n, time.perf_counter() - started)


# ---- through the journal ----


def journal_async(alias: str, session_id: str, n: int) -> float:
    from sectr.events import EventType
    from sectr.journal import NewEvent
    from sessions_app.journal import DatabaseJournal

    journal = DatabaseJournal(using=alias)

    async def stream() -> float:
        started = time.perf_counter()
        for i in range(n):
            await journal.append(session_id, [NewEvent(EventType.MESSAGE_DELTA, delta_payload(i), "inv_bench")])
        return rate(n, time.perf_counter() - started)

    return asyncio.run(stream())


#: Envelopes the last journal_writer run wrote (its deltas were coalesced into these).
WRITER_ENVELOPES: list[int] = []


def journal_writer(alias: str, session_id: str, n: int) -> float:
    """Deltas per second streamed the way invocations stream them: through the
    InvocationWriter, which coalesces deltas while a write is in flight."""
    from sectr.writer import InvocationWriter
    from sessions_app.journal import DatabaseJournal

    writer = InvocationWriter(DatabaseJournal(using=alias), session_id, "inv_bench")

    async def stream() -> float:
        started = time.perf_counter()
        for i in range(n):
            await writer.delta("msg_bench", text=delta_payload(i)["text"])
        await writer.flush()
        return rate(n, time.perf_counter() - started)

    figure = asyncio.run(stream())
    WRITER_ENVELOPES.append(writer.appends)
    return figure


def journal_sync(alias: str, session_id: str, n: int) -> float:
    from django.db import connections

    from sectr.events import EventType
    from sectr.journal import NewEvent
    from sessions_app.journal import DatabaseJournal

    # No publication: from a plain thread (no event loop to hop to) each on-commit
    # publication would start an event loop of its own, which is not what this measures.
    journal = DatabaseJournal(using=alias, publish=False)
    started = time.perf_counter()
    for i in range(n):
        journal.append_sync(session_id, [NewEvent(EventType.MESSAGE_DELTA, delta_payload(i), "inv_bench")])
    result = rate(n, time.perf_counter() - started)
    connections[alias].close()
    return result


def journal_streams(alias: str, session_ids: list[str], n: int) -> float:
    from sectr.events import EventType
    from sectr.journal import NewEvent
    from sessions_app.journal import DatabaseJournal

    journal = DatabaseJournal(using=alias)

    async def stream(session_id: str) -> None:
        for i in range(n):
            await journal.append(session_id, [NewEvent(EventType.MESSAGE_DELTA, delta_payload(i), "inv_bench")])

    async def all_streams() -> float:
        started = time.perf_counter()
        await asyncio.gather(*(stream(s) for s in session_ids))
        return rate(n * len(session_ids), time.perf_counter() - started)

    return asyncio.run(all_streams())


def check_gapless(alias: str, session_ids: list[str]) -> None:
    from sessions_app.journal import DatabaseJournal

    journal = DatabaseJournal(using=alias, publish=False)
    for session_id in session_ids:
        seqs = [e.seq for e in journal.load_sync(session_id)]
        assert seqs == list(range(1, len(seqs) + 1)), f"gap in {session_id}"
        assert journal.state_sync(session_id).last_seq == len(seqs)


# ---- the run ----


def report(label: str, figures: dict[str, list[float]]) -> None:
    print(f"\n{label}")
    raw = statistics.median(figures["raw"])
    for name, values in figures.items():
        value = statistics.median(values)
        spread = f"({min(values):.0f}..{max(values):.0f})"
        ratio = "" if name == "raw" else f"   ratio to raw {value / raw:.2f}"
        print(f"  {LABELS[name]:<40} {value:>7.0f} /s {spread:>15}{ratio}")


LABELS = {
    "raw": "raw driver, 1 txn/row",
    "append": "DatabaseJournal.append (async)",
    "append_sync": "DatabaseJournal.append_sync, no publish",
    "streams": "append, concurrent streams (total)",
    "writer": "deltas via InvocationWriter (coalesced)",
}


def bench_backend(label: str, alias: str, raw: Callable[[str, int], float], n: int, streams: int, rounds: int) -> None:
    from django.core.management import call_command
    from django.db import connections

    call_command("migrate", database=alias, verbosity=0)
    LABELS["streams"] = f"append, {streams} concurrent streams (total)"
    warm = make_session(alias)
    raw(warm, 100)
    journal_sync(alias, warm, 100)
    journal_async(alias, warm, 100)

    # Rounds interleave the methods, so a burst of load elsewhere on the machine (disk
    # flushes, other processes) hits them alike; the median of the rounds is reported.
    figures: dict[str, list[float]] = {name: [] for name in LABELS}
    checked = [warm]
    for _ in range(rounds):
        figures["raw"].append(raw(make_session(alias), n))
        async_id, sync_id = make_session(alias), make_session(alias)
        figures["append"].append(journal_async(alias, async_id, n))
        figures["append_sync"].append(journal_sync(alias, sync_id, n))
        stream_ids = [make_session(alias) for _ in range(streams)]
        figures["streams"].append(journal_streams(alias, stream_ids, max(n // streams, 50)))
        writer_id = make_session(alias)
        figures["writer"].append(journal_writer(alias, writer_id, n))
        checked += [async_id, sync_id, *stream_ids, writer_id]
    check_gapless(alias, checked)
    connections[alias].close()
    report(f"{label}: MESSAGE_DELTA envelopes appended per second, median of {rounds} rounds of {n}", figures)
    print(f"  (the writer's {n} deltas became {statistics.median(WRITER_ENVELOPES):.0f} envelopes, median)")
    WRITER_ENVELOPES.clear()


def postgres_admin_url(url: str) -> tuple[str, str]:
    """(url of the maintenance database, name of the scratch database)."""
    base, _, name = url.rpartition("/")
    return f"{base}/postgres".replace("postgres://", "postgresql://", 1), name.split("?")[0]


def create_scratch_postgres(url: str) -> bool:
    try:
        import psycopg

        admin_url, name = postgres_admin_url(url)
        with psycopg.connect(admin_url, autocommit=True, connect_timeout=3) as db:
            db.execute(f'DROP DATABASE IF EXISTS "{name}"')
            db.execute(f'CREATE DATABASE "{name}"')
        return True
    except Exception as error:  # unreachable: skip PostgreSQL
        print(f"PostgreSQL at {url} not usable ({error}); skipping it")
        return False


def drop_scratch_postgres(url: str, alias: str = "pg") -> None:
    """Close the pool of the connection `alias` (the scratch database's), then drop it."""
    import psycopg
    from django.db import connections

    connections[alias].close()
    connections[alias].close_pool()  # type: ignore[attr-defined]
    admin_url, name = postgres_admin_url(url)
    with psycopg.connect(admin_url, autocommit=True) as db:
        db.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--postgres", default=PG_DEFAULT, help=f"scratch PostgreSQL database URL ({PG_DEFAULT})")
    parser.add_argument("--no-postgres", action="store_true", help="SQLite only")
    parser.add_argument("-n", type=int, default=2000, help="appends per measurement (default 2000)")
    parser.add_argument("--streams", type=int, default=8, help="concurrent streams (default 8)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    args = parser.parse_args()

    scratch = Path(tempfile.mkdtemp(prefix="sectr-bench-"))
    sqlite_path = scratch / f"bench-{uuid.uuid4().hex[:8]}.sqlite3"
    pg_url = None if args.no_postgres else args.postgres
    if pg_url and not create_scratch_postgres(pg_url):
        pg_url = None
    configure(sqlite_path, pg_url)
    print(f"Python {sys.version.split()[0]}, Django {django.get_version()}, SQLite {sqlite3.sqlite_version}")
    try:
        bench_backend(
            "SQLite (WAL, synchronous=NORMAL, IMMEDIATE)",
            "default",
            lambda sid, n: raw_sqlite(sqlite_path, sid, n),
            args.n,
            args.streams,
            args.rounds,
        )
        if pg_url:
            url = pg_url
            bench_backend(
                "PostgreSQL (psycopg pool)",
                "pg",
                lambda sid, n: raw_postgres(url, sid, n),
                args.n,
                args.streams,
                args.rounds,
            )
    finally:
        if pg_url:
            drop_scratch_postgres(pg_url)
        for path in scratch.iterdir():
            path.unlink()
        scratch.rmdir()


if __name__ == "__main__":
    main()
