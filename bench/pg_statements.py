"""The statements a Sectr database ran, counted and timed from PostgreSQL's own log.

pg_stat_statements needs shared_preload_libraries (a server restart); this reads the
server's log instead, written with `log_min_duration_statement=0` for our connections
only: PGOPTIONS reaches every process the benchmark starts (they inherit it), so no one
else's statements are logged. A before/after of statements per run and per chunk:

    wc -c < /var/log/postgresql/postgresql-15-main.log > /tmp/offset
    PGOPTIONS="-c log_min_duration_statement=0" DATABASE_URL=postgres://postgres@127.0.0.1:5432/x \
        .venv/bin/python bench/peers.py --sizes 100 --rounds 1 --targets cluster --json /tmp/peers.jsonl
    .venv/bin/python bench/pg_statements.py /var/log/postgresql/postgresql-15-main.log \
        --offset $(cat /tmp/offset) --json /tmp/peers.jsonl

Only the measured block counts: the lines of the scratch database (`sectr_live_*`) logged
between the row's `clock` (wall-clock start and end, which bench/peers.py records). Each
statement's literals become `?`, so one shape is one row; `--runs` and `--chunks`
(defaults: the row's N and its chunks) turn counts into per-run and per-chunk figures.
The logging costs the backends CPU: take CPU figures from a run without it.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import defaultdict
from datetime import UTC, datetime

LINE = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+) UTC \[(\d+)\] \S+@(sectr_live_\w+) LOG:  duration: ([\d.]+) ms  "
    r"(?:statement|execute [^:]*): (.*)$"
)
LITERAL = re.compile(r"'(?:[^']|'')*'|\b\d+(?:\.\d+)?\b")
SPACE = re.compile(r"\s+")


def shape(statement: str) -> str:
    """The statement with its literals as `?` and its whitespace collapsed."""
    return SPACE.sub(" ", LITERAL.sub("?", statement)).strip()


def read_statements(path: str, offset: int) -> list[tuple[float, str, str, float]]:
    """(time, database, statement, duration ms) of every logged statement after `offset`
    (a statement's continuation lines start with a tab)."""
    with open(path, "rb") as log:
        log.seek(offset)
        text = log.read().decode("utf-8", "replace")
    found: list[tuple[float, str, str, float]] = []
    current: list[str] | None = None
    head: tuple[float, str, float] | None = None
    for line in text.splitlines():
        if line.startswith("\t") and current is not None:
            current.append(line)
            continue
        if current is not None and head is not None:
            found.append((head[0], head[1], " ".join(current), head[2]))
        current = head = None
        if match := LINE.match(line):
            at = datetime.strptime(match[1], "%Y-%m-%d %H:%M:%S.%f").replace(tzinfo=UTC).timestamp()
            head = (at, match[3], float(match[4]))
            current = [match[5]]
    if current is not None and head is not None:
        found.append((head[0], head[1], " ".join(current), head[2]))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("log", help="PostgreSQL's log file")
    parser.add_argument("--offset", type=int, default=0, help="where in the log the benchmark started (bytes)")
    parser.add_argument("--json", required=True, help="bench/peers.py --json output: each row's clock is a window")
    parser.add_argument("--top", type=int, default=40, help="statement shapes listed, most frequent first")
    args = parser.parse_args()
    statements = read_statements(args.log, args.offset)
    with open(args.json) as rows:
        for line in rows:
            row = json.loads(line)
            if "clock" not in row:
                continue
            start, end = row["clock"]
            runs = row["n"]
            chunks = max(row["chunks"] - row["repeated"], 1)
            counts: dict[str, int] = defaultdict(int)
            times: dict[str, float] = defaultdict(float)
            for at, _database, statement, duration in statements:
                if start <= at <= end:
                    key = shape(statement)
                    counts[key] += 1
                    times[key] += duration
            total, total_ms = sum(counts.values()), sum(times.values())
            print(
                f"{row['target']} N={runs}: {total} statements, {total / runs:.1f} per run, {total / chunks:.2f} "
                f"per chunk; {total_ms:.0f} ms inside them ({total_ms / runs:.2f} ms per run)"
            )
            print(f"{'count':>6} {'/run':>6} {'ms':>8}  statement")
            for key in sorted(counts, key=lambda k: -counts[k])[: args.top]:
                print(f"{counts[key]:>6} {counts[key] / runs:>6.2f} {times[key]:>8.1f}  {key[:150]}")


if __name__ == "__main__":
    main()
