"""Benchmark of team review at scale: p50/p99 of /review/ search, the admin's session
changelist and /review/usage/ on a seeded scratch database.

    DATABASE_URL=sqlite:////tmp/review-bench.sqlite3 .venv/bin/python bench/review.py --sessions 100000
    DATABASE_URL=postgres://postgres@127.0.0.1/sectr_bench .venv/bin/python bench/review.py --sessions 100000

Migrates the database, seeds it with `manage.py sectr_seed --sessions N --turns 6
--delta-words 1` (1-6 turns a session, one word a streamed delta: about 94 envelopes a
session, 9.4 million at 100,000 sessions) unless it already holds sessions (so a second
run measures the same data), then requests each page
--requests times in-process through Django's test client (the full middleware, template
rendering and database, no network), as staff (every session) and as a reviewer of one
team (the access filter of sessions_app.access). Aim: p99 under 300 ms for each.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "sectr_web.settings")
os.environ.setdefault("ALLOWED_HOSTS", "testserver,localhost")

import django  # noqa: E402

django.setup()

from django.contrib.auth import get_user_model  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from django.test import Client  # noqa: E402

from sessions_app.models import Membership, Session  # noqa: E402

TARGET_MS = 300.0


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def measure(client: Client, url: str, requests: int, budget: float) -> tuple[float, float, int]:
    """(p50, p99, samples): `requests` requests after a warm-up, fewer if they take more
    than `budget` seconds (a page of tens of seconds is reported from what it took)."""
    deadline = time.monotonic() + budget
    for _ in range(2):  # warm caches, connections, templates
        response = client.get(url)
        assert response.status_code == 200, (url, response.status_code)
    samples: list[float] = []
    for _ in range(requests):
        if samples and time.monotonic() > deadline:
            break
        started = time.perf_counter()
        response = client.get(url)
        samples.append((time.perf_counter() - started) * 1000)
        assert response.status_code == 200, (url, response.status_code)
    return statistics.median(samples), percentile(samples, 0.99), len(samples)


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _envelope_count() -> int:
    """The journal's size: PostgreSQL's estimate (a COUNT(*) of 10 million rows is slow)."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT reltuples::bigint FROM pg_class WHERE relname = 'sessions_app_envelope'")
        else:
            cursor.execute("SELECT MAX(id) FROM sessions_app_envelope")
        return int(cursor.fetchone()[0] or 0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=100_000)
    parser.add_argument("--requests", type=int, default=50)
    parser.add_argument("--budget", type=float, default=60.0, help="seconds at most per page (then fewer requests)")
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--delta-words", type=int, default=1)
    args = parser.parse_args()
    call_command("migrate", verbosity=0)
    if not Session.objects.exists():
        call_command("sectr_seed", sessions=args.sessions, turns=args.turns, delta_words=args.delta_words)
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")
    user_model = get_user_model()
    staff = user_model.objects.filter(username="bench-staff").first() or user_model.objects.create_superuser(
        "bench-staff", "bench@example.org", "x"
    )
    reviewer = Membership.objects.filter(role="reviewer").select_related("user").first()
    clients = {"staff": Client()}
    clients["staff"].force_login(staff)
    if reviewer is not None:
        clients["reviewer"] = Client()
        clients["reviewer"].force_login(reviewer.user)
    pages = [
        ("/review/ search", "/review/?q=penguin+invoice"),
        ("/review/ search + filters", "/review/?q=refund&state=completed&model=demo"),
        ("/review/ no search, Failed", "/review/?failed=1"),
        ("/review/ page 20", "/review/?q=budget&page=20"),
        ("admin changelist", "/admin/sessions_app/session/"),
        ("admin changelist search+filter", "/admin/sessions_app/session/?q=penguin&status__exact=completed"),
        ("/review/usage/ (60 days)", "/review/usage/?from=2000-01-01"),
    ]
    count = Session.objects.count()
    envelopes = _envelope_count()
    print(f"{connection.vendor}: {count} sessions, ~{envelopes} envelopes, {args.requests} requests each")
    print(f"load average before: {_load()}")
    print(f"{'who':9} {'page':34} {'p50 ms':>8} {'p99 ms':>8} {'n':>4}  ok?")
    worst = 0.0
    for who, client in clients.items():
        for label, url in pages:
            if who == "reviewer" and url.startswith("/admin/"):
                continue
            p50, p99, n = measure(client, url, args.requests, args.budget)
            worst = max(worst, p99)
            print(f"{who:9} {label:34} {p50:8.1f} {p99:8.1f} {n:4}  {'yes' if p99 < TARGET_MS else 'NO'}", flush=True)
    print(f"worst p99 {worst:.1f} ms (target < {TARGET_MS:.0f} ms); load average after: {_load()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
