"""Benchmark of the approval queue: queries and time to render /approvals/ with N pending asks.

    DATABASE_URL=sqlite:////tmp/queue-bench.sqlite3 .venv/bin/python bench/approvals_queue.py --asks 200
    DATABASE_URL=postgres://postgres@127.0.0.1/sectr_queue_bench .venv/bin/python bench/approvals_queue.py --asks 200

Migrates the database and, unless it already holds them, journals N sessions of team
`bench-ops`, each a short conversation ending in a pending ask (through DatabaseJournal,
as a run writes them). Then requests /approvals/ --requests times in-process through
Django's test client (full middleware, templates, database; no network) as a moderator of
the team, and prints the number of SQL queries of one render and the median/max time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "sectr_web.settings")
os.environ.setdefault("ALLOWED_HOSTS", "testserver,localhost")

import django  # noqa: E402

django.setup()

from django.contrib.auth import get_user_model  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from django.test import Client  # noqa: E402

from sectr.events import EventType  # noqa: E402
from sectr.journal import NewEvent  # noqa: E402
from sessions_app.journal import DatabaseJournal  # noqa: E402
from sessions_app.models import AskIndex, Membership, Session, Team  # noqa: E402


def conversation(number: int) -> list[NewEvent]:
    """What a run journals up to an ask: a message, a reply, a second message, a tool call."""
    inv1, inv2, ask_id, call_id = f"inv_a{number}", f"inv_b{number}", f"ask_bench_{number}", f"call_{number}"
    events = [
        NewEvent(
            EventType.INVOCATION_STARTED, {"reason": {"kind": "user_message", "input": {"content": "hello"}}}, inv1
        ),
        NewEvent(EventType.MESSAGE_START, {"message_id": f"m1_{number}", "role": "assistant", "model": "demo"}, inv1),
    ]
    events += [
        NewEvent(EventType.MESSAGE_DELTA, {"message_id": f"m1_{number}", "text": f"word{i} "}, inv1) for i in range(20)
    ]
    events += [
        NewEvent(EventType.MESSAGE_END, {"message_id": f"m1_{number}", "usage": {}}, inv1),
        NewEvent(EventType.INVOCATION_COMPLETED, {"stop_reason": "end_turn", "usage": {}}, inv1),
        NewEvent(
            EventType.INVOCATION_STARTED,
            {"reason": {"kind": "user_message", "input": {"content": f"note: bench {number}"}}},
            inv2,
        ),
        NewEvent(EventType.MESSAGE_START, {"message_id": f"m2_{number}", "role": "assistant", "model": "demo"}, inv2),
        NewEvent(
            EventType.TOOL_CALL,
            {
                "message_id": f"m2_{number}",
                "tool_call_id": call_id,
                "name": "write_note",
                "arguments": f'{{"title": "bench {number}"}}',
            },
            inv2,
        ),
        NewEvent(EventType.MESSAGE_END, {"message_id": f"m2_{number}", "usage": {}}, inv2),
        NewEvent(
            EventType.APPROVAL_REQUESTED,
            {
                "ask_id": ask_id,
                "tool_call_id": call_id,
                "name": "write_note",
                "arguments": {"title": f"bench {number}", "body": "x"},
            },
            inv2,
        ),
    ]
    return events


def seed(asks: int) -> Any:
    user_model = get_user_model()
    owner = user_model.objects.filter(username="bench-owner").first() or user_model.objects.create_user("bench-owner")
    moderator = user_model.objects.filter(username="bench-mod").first() or user_model.objects.create_user("bench-mod")
    team, created = Team.objects.get_or_create(name="bench-ops")
    if created:
        Membership.objects.create(team=team, user=owner, role="member")
        Membership.objects.create(team=team, user=moderator, role="moderator")
    journal = DatabaseJournal(publish=False)
    have = AskIndex.objects.filter(session__team=team, status=AskIndex.PENDING).count()
    for number in range(have, asks):
        session = Session.objects.create(owner=owner, team=team, title=f"bench {number}")
        journal.append_sync(session.pk, conversation(number))
    return moderator


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--asks", type=int, default=200)
    parser.add_argument("--requests", type=int, default=10)
    args = parser.parse_args()
    call_command("migrate", verbosity=0)
    moderator = seed(args.asks)
    client = Client()
    client.force_login(moderator)
    response = client.get("/approvals/")  # warm templates and connections
    assert response.status_code == 200, response.status_code
    queries: list[str] = []

    def count(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        queries.append(sql)
        return execute(sql, params, many, context)

    # A wrapper rather than CaptureQueriesContext: the request's start resets the query log.
    with connection.execute_wrapper(count):
        response = client.get("/approvals/")
    cards = response.content.decode().count('data-role="approval"')
    samples = []
    for _ in range(args.requests):
        started = time.perf_counter()
        client.get("/approvals/")
        samples.append((time.perf_counter() - started) * 1000)
    print(
        f"{connection.vendor}: /approvals/ with {cards} cards: {len(queries)} queries, "
        f"median {statistics.median(samples):.0f} ms, max {max(samples):.0f} ms ({args.requests} requests)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
