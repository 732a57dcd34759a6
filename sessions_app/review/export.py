"""Export and import: the journal exactly, as JSON (one session) or JSONL (many).

The JSON export is the session's envelopes exactly as stored (seq, invocation_id, type,
payload, created_at), plus a header naming the format. `import_session` (manage.py
sectr_import) appends those envelopes, in order, to a new session through the journal's
one write door, so its projection, search index and usage rows are built as for any
session, and its fold equals the original's. Ask ids are rewritten (consistently) on
import: they are global keys (AskIndex), and the original session still owns them.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import datetime
from typing import Any

from django.db import transaction

from sectr.errors import ValidationFailed
from sectr.events import Envelope, EventType
from sectr.journal import NewEvent
from sessions_app.journal.database import DatabaseJournal
from sessions_app.models import Session
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


def export_document(session: Session) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "version": VERSION,
        "session": session_header(session),
        "envelopes": [envelope_record(env) for env in load_envelopes(session)],
    }


def export_json(session: Session) -> str:
    return json.dumps(export_document(session), ensure_ascii=False, indent=1)


def export_markdown(session: Session, through_seq: int | None = None) -> str:
    return timeline_markdown(session.title, session.pk, build_timeline(load_envelopes(session, through_seq)))


def export_jsonl(sessions: Any) -> Iterator[str]:
    """One line per session (header and envelopes), for a streamed response: sessions are
    read in chunks and each journal on its own, so memory stays at one session."""
    for session in sessions.iterator(chunk_size=200):
        yield json.dumps(export_document(session), ensure_ascii=False) + "\n"


# ---- import ----


def parse_export(data: Any) -> list[dict[str, Any]]:
    if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("version") != VERSION:
        raise ValidationFailed(f"not a {FORMAT} version {VERSION} export", code="format")
    records = data.get("envelopes")
    if not isinstance(records, list) or not records:
        raise ValidationFailed("the export has no envelopes", code="format")
    for expected, record in enumerate(records, start=1):
        if not isinstance(record, dict) or record.get("seq") != expected:
            raise ValidationFailed(f"envelope {expected} is missing or out of order", code="format")
        try:
            EventType(record.get("type"))
        except ValueError:
            raise ValidationFailed(f"envelope {expected} has an unknown type", code="format") from None
        if not isinstance(record.get("payload"), dict):
            raise ValidationFailed(f"envelope {expected} has no payload object", code="format")
    if records[0]["type"] != EventType.SESSION_CREATED.value:
        raise ValidationFailed("an export starts with SESSION_CREATED", code="format")
    return records


def _renamed_asks(records: list[dict[str, Any]]) -> dict[str, str]:
    asks = {}
    for record in records:
        if record["type"] == EventType.APPROVAL_REQUESTED.value:
            ask_id = record["payload"].get("ask_id")
            if isinstance(ask_id, str):
                asks[ask_id] = f"ask_{uuid.uuid4().hex}"
    return asks


def _rewrite(value: Any, asks: dict[str, str]) -> Any:
    if isinstance(value, dict):
        return {
            k: (asks.get(v, v) if k == "ask_id" and isinstance(v, str) else _rewrite(v, asks)) for k, v in value.items()
        }
    if isinstance(value, list):
        return [_rewrite(v, asks) for v in value]
    return value


def import_session(data: Any, owner: Any) -> Session:
    """A new session of `owner` holding the export's journal (see the module docstring).
    All or nothing: one transaction."""
    records = parse_export(data)
    asks = _renamed_asks(records)
    journal = DatabaseJournal(publish=False)
    with transaction.atomic():
        session = Session.objects.create(owner=owner, created_at=_created_at(records[0]))
        for start in range(0, len(records), IMPORT_BATCH):
            batch = records[start : start + IMPORT_BATCH]
            journal.append_sync(
                session.pk,
                [NewEvent(EventType(r["type"]), _rewrite(r["payload"], asks), r.get("invocation_id")) for r in batch],
            )
    session.refresh_from_db()
    return session


def _created_at(record: dict[str, Any]) -> datetime:
    try:
        return datetime.fromisoformat(str(record.get("created_at")))
    except ValueError:
        raise ValidationFailed("the first envelope has no valid created_at", code="format") from None
