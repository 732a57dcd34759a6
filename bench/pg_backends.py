"""Where PostgreSQL's CPU goes in a bench/peers.py cluster row: per backend, per statement.

bench/peers.py --pg-backends prints this after each cluster row (and keeps it in the row's
JSON as `pg`); the figures, per chunk delivered:

- backends: every backend of the scratch database the block saw, by owner: the Daphne or
  worker whose socket it serves (its client port, matched in /proc/net/tcp), a worker's
  liveness connection (its application_name), autovacuum/autoanalyze workers, anything
  else. `new` counts the backends that started inside the block (the connection pools
  growing under the burst): each pays a fork, authentication and cold catalog caches,
  and prepares every statement again (prepared statements are per connection).
- statements (with `PGOPTIONS="-c pg_stat_statements.track=top -c
  pg_stat_statements.track_planning=on"` in the bench's environment, which every server
  process inherits, and the pg_stat_statements extension in DATABASE_URL's database): calls
  and execution/planning time per statement shape inside the block. Backend CPU minus
  execution and planning is the rest: parse/bind, transaction start and commit (WAL
  insert and flush), the protocol and the network, connection starts.
- the database's transactions (pg_stat_database: commits per chunk) and its tables'
  updates (pg_stat_user_tables: how many were HOT, which leave the indexes alone).

Nothing here changes the server's settings: the statements are only counted when the
bench's own processes ask for it (PGOPTIONS), and only the scratch database's are read.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from live import cpu_seconds_exact

#: pg_stat_statements columns read (milliseconds, counts, bytes), summed per shape
STATEMENT_COLUMNS = ("calls", "total_exec_time", "total_plan_time", "plans", "rows", "wal_bytes", "wal_records")


def port_owners(pids: dict[str, int], server_port: int) -> dict[int, str]:
    """Local TCP port -> the role (of `pids`) whose process holds that socket, for the
    sockets connected to `server_port` (a local port number alone is ambiguous: the same
    one may serve another destination, HAProxy's to a Daphne, say)."""
    inodes: dict[str, str] = {}
    for role, pid in pids.items():
        try:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                try:
                    target = fd.readlink().as_posix()
                except OSError:
                    continue
                if target.startswith("socket:["):
                    inodes[target[8:-1]] = role
        except OSError:
            continue
    owners: dict[int, str] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            owner = inodes.get(fields[9])
            if owner is not None and int(fields[2].rsplit(":", 1)[1], 16) == server_port:
                owners[int(fields[1].rsplit(":", 1)[1], 16)] = owner
    return owners


class PostgresBackends:
    """CPU of the PostgreSQL backends connected to one database (this machine's server),
    sampled in a thread: a backend's CPU is kept as last seen, so one that disconnects
    during the run still counts up to its last sample. With `pids` (role -> process id
    of the clients), each backend is also attributed to its owner (see `accounting`)."""

    SAMPLE_SECONDS = 0.5

    def __init__(self, admin_url: str, database: str, pids: dict[str, int] | None = None) -> None:
        import psycopg

        self.connection = psycopg.connect(admin_url, autocommit=True)
        self.server_port = int(self.connection.info.port)
        self.database = database
        self.pids = pids or {}
        self.start: dict[int, float] = {}
        self.seen: dict[int, float] = {}
        self.info: dict[int, dict[str, Any]] = {}
        self.began = 0.0
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _sample(self) -> dict[int, float]:
        rows = self.connection.execute(
            "SELECT pid, backend_type, application_name, client_port, extract(epoch FROM backend_start)"
            " FROM pg_stat_activity WHERE datname = %s",
            [self.database],
        ).fetchall()
        owners: dict[int, str] | None = None
        for pid, kind, application, port, started in rows:
            if pid in self.info:
                continue
            owner = "other"
            if kind != "client backend":
                owner = kind  # autovacuum worker, ...
            elif "liveness" in (application or ""):
                owner = "liveness"
            elif self.pids and port:
                owners = port_owners(self.pids, self.server_port) if owners is None else owners
                owner = owners.get(port, "other")
            self.info[pid] = {"owner": owner, "type": kind, "app": application, "started": float(started)}
        return {pid: cpu_seconds_exact(pid) for pid, *_ in rows}

    def _loop(self) -> None:
        while not self.stopping.wait(self.SAMPLE_SECONDS):
            for pid, used in self._sample().items():
                self.seen[pid] = max(used, self.seen.get(pid, 0.0))

    def __enter__(self) -> PostgresBackends:
        self.began = time.time()
        self.start = self._sample()
        self.seen = dict(self.start)
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.thread.join()
        for pid, used in self._sample().items():
            self.seen[pid] = max(used, self.seen.get(pid, 0.0))
        self.connection.close()

    def used(self) -> float:
        return sum(used - self.start.get(pid, 0.0) for pid, used in self.seen.items())

    def accounting(self) -> dict[str, dict[str, float]]:
        """Per owner: backends seen, how many started inside the block, CPU seconds."""
        found: dict[str, dict[str, float]] = {}
        for pid, used in self.seen.items():
            info = self.info.get(pid, {"owner": "other", "started": 0.0})
            row = found.setdefault(info["owner"], {"backends": 0, "new": 0, "cpu": 0.0, "cpu_new": 0.0})
            spent = used - self.start.get(pid, 0.0)
            row["backends"] += 1
            row["cpu"] += spent
            if info["started"] >= self.began:
                row["new"] += 1
                row["cpu_new"] += spent
        return found


class StatementLedger:
    """pg_stat_statements, pg_stat_database and pg_stat_user_tables of one database,
    before and after a block (read through `url`'s database, which has the extension)."""

    FLUSH_SECONDS = 11.0

    def __init__(self, url: str, database: str, database_url: str) -> None:
        import psycopg

        self.connection = psycopg.connect(url, autocommit=True)
        self.database = database
        self.database_url = database_url
        self.statements = True
        try:
            self.connection.execute("SELECT 1 FROM pg_stat_statements LIMIT 1")
        except psycopg.Error:
            self.statements = False  # no extension in url's database: counts only
        self.before: dict[str, Any] = {}
        self.after: dict[str, Any] = {}

    def _counts(self) -> dict[str, Any]:
        row = self.connection.execute(
            "SELECT xact_commit, xact_rollback, blks_hit, blks_read, tup_inserted, tup_updated, tup_deleted"
            " FROM pg_stat_database WHERE datname = %s",
            [self.database],
        ).fetchone()
        return dict(
            zip(("commits", "rollbacks", "hits", "reads", "inserted", "updated", "deleted"), row or (), strict=False)
        )

    def _statements(self) -> dict[str, dict[str, float]]:
        shapes: dict[str, dict[str, float]] = {}
        if self.statements:
            columns = ", ".join(f"sum({c})" for c in STATEMENT_COLUMNS)
            for query, *values in self.connection.execute(
                f"SELECT query, {columns} FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid"
                " WHERE d.datname = %s GROUP BY query",
                [self.database],
            ).fetchall():
                shapes[query] = {c: float(v or 0) for c, v in zip(STATEMENT_COLUMNS, values, strict=True)}
        return shapes

    def __enter__(self) -> StatementLedger:
        self.before = {"database": self._counts(), "statements": self._statements()}
        return self

    def __exit__(self, *exc: object) -> None:
        self.after = {"statements": self._statements()}  # counted as each statement ends
        # A backend flushes its table and transaction counters when idle, but no sooner
        # than a second after its last flush and, when busy, up to 10 s later: so these
        # are read FLUSH_SECONDS later, and include that many seconds of idle polling.
        time.sleep(self.FLUSH_SECONDS)
        self.after["database"] = self._counts()
        self.connection.close()
        self.after["tables"] = self._tables()

    def _tables(self) -> dict[str, dict[str, float]]:
        import psycopg

        with psycopg.connect(self.database_url, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del, n_dead_tup, autovacuum_count,"
                " autoanalyze_count FROM pg_stat_user_tables WHERE n_tup_upd + n_tup_ins + n_tup_del > 0"
            ).fetchall()
        names = ("ins", "upd", "hot", "del", "dead", "autovacuum", "autoanalyze")
        return {row[0]: dict(zip(names, row[1:], strict=True)) for row in rows}

    def difference(self) -> dict[str, Any]:
        database = {k: v - self.before["database"].get(k, 0) for k, v in self.after["database"].items()}
        shapes: dict[str, dict[str, float]] = {}
        for query, values in self.after["statements"].items():
            old = self.before["statements"].get(query, {})
            delta = {c: values[c] - old.get(c, 0.0) for c in STATEMENT_COLUMNS}
            if delta["calls"] > 0:
                shapes[query] = delta
        return {"database": database, "statements": shapes, "tables": self.after.get("tables", {})}


def report(pg: dict[str, Any], chunks: int, runs: int, top: int = 25) -> str:
    """The accounting as text: per chunk delivered (ms), and per run where it reads better."""
    lines: list[str] = []
    per = 1000 / max(chunks, 1)
    backends = pg["backends"]
    total = sum(row["cpu"] for row in backends.values())
    lines.append(
        f"  PostgreSQL backends: {total * per:.3f} ms/chunk ({total * 1000 / max(runs, 1):.2f} ms/run), "
        f"{sum(int(r['backends']) for r in backends.values())} backends, "
        f"{sum(int(r['new']) for r in backends.values())} started in the block"
    )
    for owner in sorted(backends, key=lambda o: -backends[o]["cpu"]):
        row = backends[owner]
        lines.append(
            f"    {owner:<20} {int(row['backends']):>3} backends ({int(row['new']):>3} new) "
            f"{row['cpu'] * per:.3f} ms/chunk (new ones {row['cpu_new'] * per:.3f})"
        )
    ledger = pg.get("ledger")
    if not ledger:
        return "\n".join(lines)
    database = ledger["database"]
    commits = database.get("commits", 0)
    lines.append(
        f"  transactions (+{StatementLedger.FLUSH_SECONDS:.0f} s idle): {commits / max(chunks, 1):.2f} commits/chunk "
        f"({commits / max(runs, 1):.1f}/run), {database.get('rollbacks', 0)} rollbacks; "
        f"rows inserted {database.get('inserted', 0)}, updated {database.get('updated', 0)}, "
        f"deleted {database.get('deleted', 0)}"
    )
    shapes = ledger["statements"]
    if shapes:
        calls = sum(s["calls"] for s in shapes.values())
        executing = sum(s["total_exec_time"] for s in shapes.values())
        planning = sum(s["total_plan_time"] for s in shapes.values())
        wal = sum(s["wal_bytes"] for s in shapes.values())
        rest = total * 1000 - executing - planning
        lines.append(
            f"  statements: {calls / max(chunks, 1):.2f} calls/chunk ({calls / max(runs, 1):.1f}/run); "
            f"execution {executing / max(chunks, 1):.3f} ms/chunk, planning {planning / max(chunks, 1):.3f}, "
            f"the rest of the backends' CPU {rest / max(chunks, 1):.3f}; WAL {wal / max(chunks, 1):.0f} B/chunk"
        )
        lines.append(f"    {'calls/run':>9} {'exec ms/chunk':>13} {'plan':>6} {'plans':>6}  statement")
        for query in sorted(shapes, key=lambda q: -(shapes[q]["total_exec_time"] + shapes[q]["total_plan_time"]))[:top]:
            s = shapes[query]
            text = " ".join(query.split())
            lines.append(
                f"    {s['calls'] / max(runs, 1):>9.2f} {s['total_exec_time'] / max(chunks, 1):>13.4f} "
                f"{s['total_plan_time'] / max(chunks, 1):>6.4f} {int(s['plans']):>6}  {text[:140]}"
            )
    tables = ledger["tables"]
    if tables:
        lines.append("  tables (the database's whole life): inserts, updates (HOT), deletes, dead, autovacuum/analyze")
        for name in sorted(tables, key=lambda t: -(tables[t]["upd"] + tables[t]["ins"])):
            t = tables[name]
            lines.append(
                f"    {name:<32} {t['ins']:>6} {t['upd']:>6} ({t['hot']:>6}) {t['del']:>6} {t['dead']:>6} "
                f"{t['autovacuum']}/{t['autoanalyze']}"
            )
    return "\n".join(lines)
