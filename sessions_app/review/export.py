"""Export and import: the journal exactly, as JSON (one session) or JSONL (many).

The JSON export is the session's envelopes exactly as stored (seq, invocation_id, type,
payload, created_at), plus a header naming the format, and the reviewers' ratings of it
with the team's score definitions (`scores`, `ratings`): judgements about the session,
which an import reads past (it restores the transcript, not other people's ratings).

An import (`import_file`, manage.py sectr_import) restores a transcript, not other
people's decisions, and trusts nothing in its file:

* A first pass reads the file envelope by envelope (export_reader: memory follows one
  envelope, never the file; the size is capped by SECTR_IMPORT_MAX_BYTES) and checks each
  against the journal's rules (sectr.payloads, as an invocation's writer does), their
  order (seqs 1, 2, 3 ..., one SESSION_CREATED, first) and their projection. The first
  envelope that breaks one refuses the whole import, naming its index, its seq and why.
* A second pass appends them, in order and in batches, to a new session through the
  journal's one write door, all in one transaction, so its projection, search index and
  usage rows are built as for any session, and its fold equals the original's.
* Every person the journal names (who voted, decided, cancelled, wrote or steered) is
  renamed `imported:<name>`: the audit, a quorum and a filter by user never take an
  imported vote or decision for a live user's. The new session's owner is whoever the
  operator names (`--owner`), never the file's.
* Ask ids are rewritten (consistently): they are global keys (AskIndex), and the
  original session still owns them.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import transaction

from sectr.events import Envelope, EventType, imported_name
from sectr.journal import NewEvent
from sectr.payloads import INT_BOUND, InvalidEvent, JournalOrder, check_event
from sectr.state import SessionState, apply_envelope
from sessions_app.journal.database import DatabaseJournal
from sessions_app.models import Rating, Session
from sessions_app.review import scores
from sessions_app.review.export_reader import ENVELOPE, ExportReader, refused, too_large
from sessions_app.review.transcript import build_timeline, timeline_markdown

FORMAT = "sectr.journal"
VERSION = 1
IMPORT_BATCH = 500


def envelope_record(env: Envelope) -> dict[str, Any]:
    return {
        "seq": env.seq,
        "invocation_id": env.invocation_id,
        "type": env.type.value,
        "payload": env.payload,
        "created_at": env.created_at.isoformat(),
    }


def session_header(session: Session) -> dict[str, Any]:
    return {
        "id": session.pk,
        "title": session.title,
        "owner": session.owner.get_username(),
        "created_at": session.created_at.isoformat(),
        "last_seq": session.last_seq,
    }


def load_envelopes(session: Session, through_seq: int | None = None) -> list[Envelope]:
    rows = session.envelopes.order_by("seq")
    if through_seq is not None:
        rows = rows.filter(seq__lte=through_seq)
    return [row.to_envelope() for row in rows]


def reviewer_ratings(session: Session) -> list[Rating]:
    return list(
        Rating.objects.filter(session=session, source=Rating.REVIEWER)
        .select_related("author")
        .order_by("seq", "created_at", "pk")
    )


def export_document(session: Session) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "version": VERSION,
        "session": session_header(session),
        "scores": [d.as_dict() for d in scores.team_scores(session.team_id)],
        "ratings": [scores.rating_record(r) for r in reviewer_ratings(session)],
        "envelopes": [envelope_record(env) for env in load_envelopes(session)],
    }


def export_json(session: Session) -> str:
    return json.dumps(export_document(session), ensure_ascii=False, indent=1)


def export_markdown(session: Session, through_seq: int | None = None) -> str:
    text = timeline_markdown(session.title, session.pk, build_timeline(load_envelopes(session, through_seq)))
    return text + ratings_markdown(reviewer_ratings(session))


def ratings_markdown(ratings: list[Rating]) -> str:
    """The reviewers' ratings, after the transcript ("" when there are none)."""
    if not ratings:
        return ""
    lines = ["", "## Ratings", ""]
    for rating in ratings:
        target = f"message #{rating.seq}" if rating.seq else "the session"
        values = ", ".join(f"{name} {value}" for name, value in scores.rating_values(rating))
        tags = f" · tags: {', '.join(rating.tags)}" if rating.tags else ""
        comment = f" · {rating.comment}" if rating.comment else ""
        lines.append(f"- {rating.author.get_username()} on {target}: {values}{tags}{comment}")
    return "\n".join(lines) + "\n"


def export_jsonl(sessions: Any) -> Iterator[str]:
    """One line per session (header and envelopes), for a streamed response: sessions are
    read in chunks and each journal on its own, so memory stays at one session."""
    for session in sessions.iterator(chunk_size=200):
        yield json.dumps(export_document(session), ensure_ascii=False) + "\n"


# ---- import ----

#: The keys of an envelope record in the file (what `envelope_record` writes).
RECORD_KEYS = frozenset({"seq", "invocation_id", "type", "payload", "created_at"})
#: `scores` and `ratings` are read past: an import restores the journal alone.
HEADER_KEYS = frozenset({"format", "version", "session", "scores", "ratings"})
#: A source of an export's items (export_reader.ExportReader.items), read once per pass.
Items = Callable[[], Iterator[tuple[str, Any]]]


@dataclass
class ImportPlan:
    """What the checking pass learns for the writing pass."""

    count: int
    created_at: datetime
    asks: dict[str, str]  # ask id in the file -> the new session's


def file_items(path: str | Path, max_bytes: int) -> Items:
    """The items of an export file (export_reader), read anew by each pass."""

    def items() -> Iterator[tuple[str, Any]]:
        try:
            with open(path, "rb") as handle:
                if os.fstat(handle.fileno()).st_size > max_bytes:
                    raise too_large(max_bytes)
                yield from ExportReader(handle, max_bytes=max_bytes).items()
        except OSError as exc:
            raise refused(f"cannot read the file: {exc.strerror or exc}") from None

    return items


def document_items(data: Any) -> Items:
    """The items of an export already in memory (a parsed document)."""

    def items() -> Iterator[tuple[str, Any]]:
        if not isinstance(data, dict):
            raise refused(f"not a {FORMAT} version {VERSION} export")
        for key, value in data.items():
            if key == ENVELOPE:
                if not isinstance(value, list):
                    raise refused("envelopes must be a list")
                for record in value:
                    yield ENVELOPE, record
            else:
                yield key, value

    return items


def _envelopes(items: Items) -> Iterator[tuple[int, dict[str, Any], EventType]]:
    """(index, record, type) of every envelope, each checked against the journal's rules
    (sectr.payloads) and the file's header checked as it comes; refuses with the index and
    seq of the first envelope that breaks one."""
    order = JournalOrder()
    header: dict[str, Any] = {}
    index = 0
    for key, value in items():
        if key != ENVELOPE:
            _check_header(key, value)
            header[key] = value
            continue
        index += 1
        yield index, _checked_record(index, value, order), EventType(value["type"])
    if header.get("format") != FORMAT or header.get("version") != VERSION:
        raise refused(f"not a {FORMAT} version {VERSION} export")
    if index == 0:
        raise refused("the export has no envelopes")


def _check_header(key: str, value: Any) -> None:
    if key not in HEADER_KEYS:
        raise refused(f"unknown key {key[:40]!r} in the export")
    if (key == "format" and value != FORMAT) or (key == "version" and value != VERSION):
        raise refused(f"not a {FORMAT} version {VERSION} export")


def _checked_record(index: int, record: Any, order: JournalOrder) -> dict[str, Any]:
    seq = record.get("seq") if isinstance(record, dict) else None
    where = f"envelope {index} (seq {str(seq)[:20]})"
    try:
        if not isinstance(record, dict):
            raise InvalidEvent("is not an object")
        unknown = sorted(set(record) - RECORD_KEYS)
        if unknown:
            raise InvalidEvent(f"has unknown key(s) {', '.join(str(k)[:40] for k in unknown[:5])}")
        kind = check_event(record.get("type"), record.get("payload"), record.get("invocation_id"))
        order.check(seq, kind)
        _created_at(record)
    except InvalidEvent as exc:
        raise refused(f"{where}: {exc}") from None
    return record


def _created_at(record: dict[str, Any]) -> datetime:
    value = record.get("created_at")
    try:
        if not isinstance(value, str):
            raise ValueError
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise InvalidEvent("created_at must be an ISO 8601 date and time") from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def check_import(items: Items) -> ImportPlan:
    """The first pass: every envelope checked and folded into a projection (what the
    journal will do on append), nothing written. Memory: one envelope and the projection."""
    state = SessionState(session_id="import")
    asks: dict[str, str] = {}
    created_at: datetime | None = None
    count = 0
    for index, record, kind in _envelopes(items):
        count = index
        if created_at is None:
            created_at = _created_at(record)
        if kind is EventType.APPROVAL_REQUESTED:
            ask_id = record["payload"]["ask_id"]
            if ask_id in asks:
                raise refused(f"envelope {index} (seq {index}): ask {ask_id[:64]!r} is asked twice")
            asks[ask_id] = f"ask_{uuid.uuid4().hex}"
        envelope = Envelope("import", index, record.get("invocation_id"), kind, record["payload"], created_at)
        if kind is not EventType.MESSAGE_DELTA:
            apply_envelope(state, envelope)
            for model, usage in state.usage.items():
                if any(value > INT_BOUND for value in usage.values()):
                    where = f"envelope {index} (seq {index})"
                    raise refused(f"{where}: the usage of {model[:60]!r} adds up past {INT_BOUND}")
    assert created_at is not None  # _envelopes refuses an export without envelopes
    return ImportPlan(count=count, created_at=created_at, asks=asks)


def attributed(kind: EventType, payload: dict[str, Any]) -> dict[str, Any]:
    """`payload` (a copy of the file's, changed in place) with every person it names as
    `imported:<name>`: who voted, decided (and every approver of a quorum), cancelled,
    wrote a message or steered. An import restores a transcript; the people in it did
    not act here, so the audit, a quorum and a filter by user never take them for a
    live user."""

    def rename(holder: Any, key: str) -> None:
        if isinstance(holder, dict) and isinstance(holder.get(key), str) and holder[key]:
            holder[key] = imported_name(holder[key])

    if kind is EventType.APPROVAL_VOTED:
        rename(payload, "approver")
    elif kind is EventType.APPROVAL_REQUESTED:
        rename(payload.get("decision"), "approver")
    elif kind is EventType.INVOCATION_STARTED:
        reason = payload["reason"]
        rename(reason, "author")
        decision = reason.get("decision")
        rename(decision, "approver")
        if isinstance(decision, dict) and isinstance(decision.get("approvers"), list):
            decision["approvers"] = [imported_name(name) for name in decision["approvers"]]
    elif kind is EventType.STEER_RECEIVED:
        rename(payload, "author")
    elif kind is EventType.INVOCATION_CANCELLED:
        rename(payload, "by")
    return payload


def _rewrite(value: Any, asks: dict[str, str]) -> Any:
    """A copy of `value` with every ask id renamed (ask ids are global keys: AskIndex)."""
    if isinstance(value, dict):
        return {
            k: (asks.get(v, v) if k == "ask_id" and isinstance(v, str) else _rewrite(v, asks)) for k, v in value.items()
        }
    if isinstance(value, list):
        return [_rewrite(v, asks) for v in value]
    return value


def write_import(items: Items, plan: ImportPlan, owner: Any) -> Session:
    """The second pass: the checked envelopes appended to a new session of `owner` in
    batches of IMPORT_BATCH, all in one transaction (a failure, or a file that changed
    since the first pass, leaves nothing)."""
    journal = DatabaseJournal(publish=False)
    with transaction.atomic():
        session = Session.objects.create(owner=owner, created_at=plan.created_at)
        batch: list[NewEvent] = []
        count = 0
        for _index, record, kind in _envelopes(items):
            count += 1
            payload = attributed(kind, _rewrite(record["payload"], plan.asks))
            batch.append(NewEvent(kind, payload, record.get("invocation_id")))
            if len(batch) >= IMPORT_BATCH:
                journal.append_sync(session.pk, batch)
                batch = []
        if batch:
            journal.append_sync(session.pk, batch)
        if count != plan.count:
            raise refused("the file changed while it was imported")
    session.refresh_from_db()
    return session


def import_items(items: Items, owner: Any) -> Session:
    """A new session of `owner` holding the export's journal (see the module docstring):
    checked whole first, then written; all or nothing."""
    return write_import(items, check_import(items), owner)


def import_session(data: Any, owner: Any) -> Session:
    """`import_items` for an export already parsed into memory."""
    return import_items(document_items(data), owner)


def import_file(path: str | Path, owner: Any, *, max_bytes: int | None = None) -> Session:
    """`import_items` for an export file, read piece by piece (twice: check, then write)."""
    limit = settings.SECTR_IMPORT_MAX_BYTES if max_bytes is None else max_bytes
    return import_items(file_items(path, limit), owner)
