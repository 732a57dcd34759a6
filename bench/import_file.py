"""Benchmark of `manage.py sectr_import` on a large generated export: time and memory.

Run: .venv/bin/python bench/import_file.py [--envelopes 50000] [--tracemalloc] [--old REV]

Generates an export of about N envelopes (turns of a user message, an assistant message
of six deltas, its end and the invocation's end), imports it into a throwaway SQLite
database (or the one DATABASE_URL names) and prints the file's size, the time the import
took, the process's peak resident memory and, with --tracemalloc, the peak of Python
allocations during the import (tracemalloc slows the import down: time it without).
--old REV imports with `sessions_app/review/export.py` as it was at git revision REV
(json.load of the whole file, then the import), for a before/after comparison.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import tracemalloc
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def generate(path: Path, envelopes: int) -> int:
    def record(seq: int, type: str, payload: object, inv: str | None) -> str:
        created = "2026-01-02T03:04:05+00:00"
        data = {"seq": seq, "invocation_id": inv, "type": type, "payload": payload, "created_at": created}
        return json.dumps(data, ensure_ascii=False)

    seq = 1
    with path.open("w", encoding="utf-8") as handle:
        handle.write('{"format": "sectr.journal", "version": 1, "session": {}, "envelopes": [\n')
        handle.write(record(1, "SESSION_CREATED", {"mode": "default", "model": "demo"}, None))
        turn = 0
        while seq + 10 <= envelopes:
            inv, mid = f"inv_{turn}", f"msg_{turn}"
            reason = {"kind": "user_message", "input": {"content": f"question {turn} " + "words " * 20}}
            events: list[tuple[str, object]] = [("INVOCATION_STARTED", {"reason": reason})]
            events.append(("MESSAGE_START", {"message_id": mid, "role": "assistant", "model": "demo"}))
            events += [("MESSAGE_DELTA", {"message_id": mid, "text": f"piece {i} " * 8}) for i in range(6)]
            events.append(("MESSAGE_END", {"message_id": mid, "usage": {"input_tokens": 9, "output_tokens": 7}}))
            events.append(("INVOCATION_COMPLETED", {"stop_reason": "end_turn"}))
            for type, payload in events:
                seq += 1
                handle.write(",\n" + record(seq, type, payload, inv))
            turn += 1
        handle.write("\n]}\n")
    return seq


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--envelopes", type=int, default=50_000)
    parser.add_argument("--tracemalloc", action="store_true")
    parser.add_argument("--old", metavar="REV", help="import with export.py as it was at this git revision")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="sectr-import-bench-"))
    if not os.environ.get("DATABASE_URL"):
        os.environ["SECTR_VAR_DIR"] = str(workdir)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "sectr_web.settings")
    os.environ["DEBUG"] = "0"  # as in production: DEBUG keeps every query's SQL in memory
    os.environ["SECTR_IMPORT_MAX_BYTES"] = str(1 << 40)

    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    from sessions_app.review import export

    call_command("migrate", verbosity=0)
    owner, _ = get_user_model().objects.get_or_create(username="bench-import")
    path = workdir / "export.json"
    count = generate(path, args.envelopes)
    size = path.stat().st_size

    if args.old:
        source = subprocess.run(
            ["git", "show", f"{args.old}:sessions_app/review/export.py"], cwd=ROOT, check=True, capture_output=True
        ).stdout.decode()
        old = types.ModuleType("old_export")
        exec(compile(source, "old_export.py", "exec"), old.__dict__)

        def run() -> object:
            with open(path, encoding="utf-8") as handle:  # what the old command did
                return old.import_session(json.load(handle), owner)
    else:

        def run() -> object:
            return export.import_file(path, owner)

    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if args.tracemalloc:
        tracemalloc.start()
    started = time.perf_counter()
    session = run()
    elapsed = time.perf_counter() - started
    peak = tracemalloc.get_traced_memory()[1] if args.tracemalloc else None
    rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert getattr(session, "last_seq", None) == count, (getattr(session, "last_seq", None), count)
    print(
        f"{'old ' + args.old if args.old else 'new'}: {count} envelopes, {size / 1e6:.1f} MB file, "
        f"{elapsed:.1f} s ({count / elapsed:,.0f} envelopes/s), max RSS {rss_after / 1024:.0f} MiB "
        f"(before the import {rss_before / 1024:.0f} MiB)"
        + (f", tracemalloc peak {peak / 1e6:.1f} MB" if peak is not None else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
