"""manage.py sectr_seed --sessions N: fill a scratch database for benchmarks (bench/review.py).

Writes N sessions of a few users and teams, each a short conversation (user message,
an assistant reply streamed in deltas, sometimes a tool call or an ask), straight into
the tables with bulk inserts: going through the journal one append at a time would take
hours at 100,000 sessions. The projections the journal would keep (the Session columns,
SearchEntry, UsageDaily, AskIndex) are written from the same envelopes, so the pages read
what they would read in production. On PostgreSQL the journal and the search index go in
with COPY (psycopg's `cursor.copy`), elsewhere with bulk_create in big batches.
`--turns N` gives each session 1..N user/assistant turns and `--delta-words` sets how
many words each streamed delta carries (fewer: more envelopes, as real streaming).
Refuses a database that already holds sessions unless --force: it is for scratch
databases only.
"""

from __future__ import annotations

import json
import random
import time
import uuid
from collections import defaultdict
from datetime import datetime, timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connection, transaction
from django.utils import timezone

from sectr.events import Envelope as JournalEnvelope
from sectr.events import EventType
from sectr.state import project
from sessions_app.models import (
    AskIndex,
    Envelope,
    Membership,
    SearchEntry,
    Session,
    Team,
    UsageDaily,
)

WORDS = (
    "penguin invoice deploy kubernetes refund latency database migration budget weather schedule "
    "report customer password outage backup python rust pricing contract holiday translation "
    "summary meeting roadmap incident certificate billing analytics forecast inventory shipping"
).split()
# Plus ~1,000 made-up words, so that a search word matches a few percent of the sessions
# as in real text, not all of them.
SYLLABLES = "ka lo mi re su ta ve no pi da ri zo".split()
WORDS += [a + b + c for a in SYLLABLES for b in SYLLABLES for c in SYLLABLES[:7]]
MODELS = ("demo", "gpt-4o-mini", "llama-3.1-8b")
BATCH = 5000


class Command(BaseCommand):
    help = "Fill a scratch database with N synthetic sessions (for bench/review.py)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--sessions", type=int, default=1000)
        parser.add_argument("--users", type=int, default=50)
        parser.add_argument("--teams", type=int, default=5)
        parser.add_argument("--days", type=int, default=60)
        parser.add_argument("--seed", type=int, default=1)
        parser.add_argument("--turns", type=int, default=1, help="each session has 1..N turns")
        parser.add_argument("--delta-words", type=int, default=8, help="words per streamed delta")
        parser.add_argument("--force", action="store_true", help="add to a database that has sessions already")

    def handle(self, *args: Any, **options: Any) -> None:
        if Session.objects.exists() and not options["force"]:
            raise CommandError("the database has sessions: sectr_seed is for scratch databases (--force to add)")
        rng = random.Random(options["seed"])
        users, teams = self._people(options["users"], options["teams"])
        total = options["sessions"]
        started = time.monotonic()
        now = timezone.now()
        done = envelope_count = 0
        while done < total:
            count = min(BATCH, total - done)
            # Each batch commits whole, its usage with it: an interrupted seed leaves a
            # smaller but consistent database (add to it with --force).
            usage: dict[tuple[Any, ...], list[int]] = defaultdict(lambda: [0, 0, 0])
            with transaction.atomic():
                envelope_count += self._batch(rng, users, teams, count, now, options, usage)
                _add_usage(usage)
            done += count
            self.stdout.write(f"{done} sessions, {envelope_count} envelopes ({time.monotonic() - started:.0f} s)")
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("ANALYZE")
        self.stdout.write(f"seeded {total} sessions, {envelope_count} envelopes in {time.monotonic() - started:.0f} s")

    def _people(self, user_count: int, team_count: int) -> tuple[list[Any], list[Team]]:
        user_model = get_user_model()
        users = [user_model.objects.get_or_create(username=f"seed{i}")[0] for i in range(user_count)]
        teams = [Team.objects.get_or_create(name=f"seed-team-{i}")[0] for i in range(team_count)]
        for i, user in enumerate(users):
            Membership.objects.get_or_create(
                team=teams[i % team_count], user=user, defaults={"role": "reviewer" if i % 5 == 0 else "member"}
            )
        return users, teams

    def _batch(
        self, rng: random.Random, users: list[Any], teams: list[Team], count: int, now: Any, options: dict[str, Any],
        usage: dict[tuple[Any, ...], list[int]],
    ) -> int:  # fmt: skip
        days = options["days"]
        sessions, asks = [], []
        envelopes: list[tuple[Any, ...]] = []  # (session_id, seq, invocation_id, type, payload, created_at)
        entries: list[tuple[Any, ...]] = []  # (session_id, seq, kind, text)
        for _ in range(count):
            owner_index = rng.randrange(len(users))
            owner = users[owner_index]
            team = teams[owner_index % len(teams)]
            at = now - timedelta(seconds=rng.randrange(days * 86400))
            model = rng.choice(MODELS)
            sid = f"ses_{uuid.uuid4().hex}"
            turns = [
                (
                    " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12))),  # noqa: S311 - not crypto
                    " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 40))),
                )
                for _ in range(rng.randint(1, max(1, options["turns"])))
            ]
            journal = _conversation(sid, at, model, turns, rng, options["delta_words"])
            state = project(journal, session_id=sid)
            total = state.total_usage
            session = Session(
                id=sid, owner=owner, team=team, created_at=at, updated_at=journal[-1].created_at,
                **{k: v for k, v in Session.cached_columns(state).items() if k != "token_total"},
                token_total=total.get("input_tokens", 0) + total.get("output_tokens", 0),
            )  # fmt: skip
            sessions.append(session)
            envelopes += [(sid, e.seq, e.invocation_id, e.type.value, e.payload, e.created_at) for e in journal]
            turn = 0
            for e in journal:
                if e.type is EventType.INVOCATION_STARTED:
                    entries.append((sid, e.seq, "user", turns[turn][0]))
                elif e.type is EventType.MESSAGE_END:
                    entries.append((sid, e.seq, "assistant", turns[turn][1]))
                    turn += 1
                elif e.type is EventType.TOOL_CALL:
                    entries.append((sid, e.seq, "tool", e.payload["name"]))
                elif e.type is EventType.APPROVAL_REQUESTED:
                    asks.append(AskIndex(ask_id=e.payload["ask_id"], session_id=sid))
            row = usage[(at.date(), owner.pk, team.pk, model)]
            row[0] += total.get("input_tokens", 0)
            row[1] += total.get("output_tokens", 0)
            row[2] += len(turns)
        Session.objects.bulk_create(sessions, batch_size=BATCH)
        _insert(Envelope, ("session_id", "seq", "invocation_id", "type", "payload", "created_at"), envelopes)
        _insert(SearchEntry, ("session_id", "seq", "kind", "text"), entries)
        AskIndex.objects.bulk_create(asks, batch_size=BATCH)
        return len(envelopes)


def _add_usage(usage: dict[tuple[Any, ...], list[int]]) -> None:
    """Add a batch's usage into UsageDaily (an upsert, as the journal's writes do)."""
    table = connection.ops.quote_name(UsageDaily._meta.db_table)
    sql = (
        f"INSERT INTO {table} (day, user_id, team_key, api_token_key, model, agent_key, input_tokens, "  # noqa: S608
        "output_tokens, reasoning_tokens, cached_input_tokens, messages) "
        "VALUES (%s, %s, %s, 0, %s, '', %s, %s, 0, 0, %s) "
        "ON CONFLICT (day, user_id, team_key, api_token_key, model, agent_key) DO UPDATE SET "
        f"input_tokens = {table}.input_tokens + excluded.input_tokens, "
        f"output_tokens = {table}.output_tokens + excluded.output_tokens, "
        f"messages = {table}.messages + excluded.messages"
    )
    rows = [
        (connection.ops.adapt_datefield_value(day), user_id, team_key, model, i, o, m)
        for (day, user_id, team_key, model), (i, o, m) in usage.items()
    ]
    with connection.cursor() as cursor:
        cursor.executemany(sql, rows)


def _insert(model: Any, columns: tuple[str, ...], rows: list[tuple[Any, ...]]) -> None:
    """Insert plain rows: COPY on PostgreSQL, one executemany elsewhere (JSON as text,
    times as the backend stores them), not bulk_create's per-value preparation."""
    table = connection.ops.quote_name(model._meta.db_table)
    names = ", ".join(connection.ops.quote_name(c) for c in columns)
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            with cursor.copy(f"COPY {table} ({names}) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row([json.dumps(v) if isinstance(v, dict) else v for v in row])
            return
        adapt = connection.ops.adapt_datetimefield_value
        marks = ", ".join(["%s"] * len(columns))
        cursor.executemany(
            f"INSERT INTO {table} ({names}) VALUES ({marks})",  # noqa: S608 - model's own names
            [
                [json.dumps(v) if isinstance(v, dict) else adapt(v) if isinstance(v, datetime) else v for v in row]
                for row in rows
            ],
        )


def _conversation(
    sid: str, at: Any, model: str, turns: list[tuple[str, str]], rng: random.Random, delta_words: int
) -> list[JournalEnvelope]:
    title = turns[0][0][:60]
    events: list[tuple[EventType, dict[str, Any], str | None]] = [
        (EventType.SESSION_CREATED, {"mode": "default", "model": model, "title": title}, None),
    ]
    for number, (prompt, answer) in enumerate(turns, start=1):
        _turn(events, model, prompt, answer, rng, delta_words, last=number == len(turns))
    return [
        JournalEnvelope(sid, seq, invocation, kind, payload, at + timedelta(milliseconds=seq))
        for seq, (kind, payload, invocation) in enumerate(events, start=1)
    ]


def _turn(
    events: list[tuple[EventType, dict[str, Any], str | None]], model: str, prompt: str, answer: str,
    rng: random.Random, delta_words: int, last: bool,
) -> None:  # fmt: skip
    """One invocation: the user's message, the reply streamed, sometimes a tool call; the
    last turn of a session may end in an ask (suspended) or a failure."""
    inv = f"inv_{uuid.uuid4().hex[:24]}"
    mid = f"msg_{uuid.uuid4().hex[:24]}"
    events += [
        (EventType.INVOCATION_STARTED, {"reason": {"kind": "user_message", "input": {"content": prompt}}}, inv),
        (EventType.MESSAGE_START, {"message_id": mid, "role": "assistant", "model": model}, inv),
    ]
    words = answer.split(" ")
    step = max(1, delta_words)
    for start in range(0, len(words), step):
        events.append(
            (EventType.MESSAGE_DELTA, {"message_id": mid, "text": " ".join(words[start : start + step]) + " "}, inv)
        )
    if rng.random() < 0.2:
        events.append(
            (
                EventType.TOOL_CALL,
                {"message_id": mid, "tool_call_id": "call_1", "name": "get_time", "arguments": "{}"},
                inv,
            )
        )
    usage = {"input_tokens": len(prompt.split()), "output_tokens": len(words)}
    events.append((EventType.MESSAGE_END, {"message_id": mid, "usage": usage}, inv))
    roll = rng.random() if last else 1.0
    if roll < 0.05:
        ask = f"ask_{uuid.uuid4().hex}"
        events.append(
            (
                EventType.APPROVAL_REQUESTED,
                {"ask_id": ask, "tool_call_id": None, "name": "write_note", "arguments": {}},
                inv,
            )
        )
        events.append((EventType.INVOCATION_SUSPENDED, {"ask_id": ask}, inv))
    elif roll < 0.1:
        events.append((EventType.INVOCATION_FAILED, {"error": "provider error", "retryable": True}, inv))
    else:
        events.append((EventType.INVOCATION_COMPLETED, {"stop_reason": "end_turn", "usage": usage}, inv))
