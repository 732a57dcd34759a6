"""manage.py sectr_reindex [--session ID ...]: rebuild the review projections from the journal.

The search index (SearchEntry, and on SQLite its FTS5 table, kept by triggers) and the
fork links are rebuilt session by session, each in its own transaction holding the
Session row lock that appends take, so no append interleaves with its rebuild.

The daily usage rollup (UsageDaily) sums every session of a (day, owner, team, API
token, model): one session's share of a row cannot be told apart once the row is wrong,
so it is rebuilt whole, only when no --session is named, in one transaction that first
locks the table against writes (PostgreSQL; on SQLite the transaction's write lock does
the same): appends that end a message wait until it commits and then add their usage on
top, so nothing is counted twice or lost.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connection, transaction

from sectr.state import SessionState
from sessions_app.journal.projections import ReviewProjection, observe_all, rebuild_review_projections
from sessions_app.models import Envelope, ForkLink, Run, SearchEntry, Session, UsageDaily

CHUNK = 500


class Command(BaseCommand):
    help = (
        "Rebuilds the search index and fork links from the journal (all sessions, or those named with "
        "--session), and with no --session the daily usage rollup too."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--session", action="append", dest="sessions", default=[], metavar="ID", help="only this session"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        started = time.monotonic()
        named: list[str] = options["sessions"]
        if named:
            missing = sorted(set(named) - set(Session.objects.filter(pk__in=named).values_list("pk", flat=True)))
            if missing:
                raise CommandError(f"no such session: {', '.join(missing)}")
        ids = named or list(Session.objects.order_by("pk").values_list("pk", flat=True))
        token_keys = _token_keys()
        entries = 0
        for done, session_id in enumerate(ids, start=1):
            with transaction.atomic():
                session = Session.objects.select_for_update(no_key=True).get(pk=session_id)
                rebuild_review_projections(session, usage=False, token_keys=token_keys)
            if done % 5000 == 0:
                self.stdout.write(f"{done} sessions indexed ({time.monotonic() - started:.0f} s)")
        entries = SearchEntry.objects.filter(session_id__in=named).count() if named else SearchEntry.objects.count()
        self.stdout.write(f"rebuilt the search index of {len(ids)} session(s): {entries} entries")
        if named:
            self.stdout.write("the usage rollup is rebuilt only for every session (run without --session)")
            return
        rows = rebuild_usage(token_keys)
        forks = ForkLink.objects.count()
        self.stdout.write(
            f"rebuilt the usage rollup: {rows} rows; {forks} fork links ({time.monotonic() - started:.0f} s)"
        )


def _token_keys() -> dict[str, int]:
    """Invocation id: the API token that started it (usage per token), for every run with one."""
    return {
        invocation_id: int(key)
        for invocation_id, key in Run.objects.exclude(api_token_key=0).values_list("invocation_id", "api_token_key")
        if invocation_id and key
    }


def rebuild_usage(token_keys: dict[str, int]) -> int:
    """Replace UsageDaily with the sums of every session's journal, in one transaction."""
    table = connection.ops.quote_name(UsageDaily._meta.db_table)
    with transaction.atomic():
        if connection.vendor == "postgresql":
            # Blocks the appends' upserts (ROW EXCLUSIVE), not reads, until the commit.
            with connection.cursor() as cursor:
                cursor.execute(f"LOCK TABLE {table} IN SHARE ROW EXCLUSIVE MODE")
        UsageDaily.objects.all().delete()
        sums: dict[tuple[Any, ...], list[int]] = defaultdict(lambda: [0, 0, 0, 0, 0])
        sessions = Session.objects.order_by("pk").only("id", "owner_id", "team_id")
        for session in sessions.iterator(chunk_size=CHUNK):
            envelopes = (row.to_envelope() for row in Envelope.objects.filter(session=session).order_by("seq"))
            projection = ReviewProjection(session, "default", texts={}, token_keys=token_keys)
            observe_all(projection, envelopes, SessionState(session_id=session.pk))
            for (day, token_key, model, agent), row in projection.usage.items():
                total = sums[(day, session.owner_id, session.team_id or 0, token_key, model, agent)]
                for i, value in enumerate(row):
                    total[i] += value
        UsageDaily.objects.bulk_create(
            [
                UsageDaily(
                    day=day, user_id=user_id, team_key=team_key, api_token_key=token_key, model=model,
                    agent_key=agent, input_tokens=i, output_tokens=o, reasoning_tokens=r, cached_input_tokens=c,
                    messages=m,
                )
                for (day, user_id, team_key, token_key, model, agent), (i, o, r, c, m) in sums.items()
            ],
            batch_size=2000,
        )  # fmt: skip
    return len(sums)
