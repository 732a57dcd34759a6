"""Export and import: the journal exactly, as JSON (one session) or JSONL (many).

The JSON export is the session's envelopes exactly as stored (seq, invocation_id, type,
payload, created_at), plus a header naming the format, and the reviewers' ratings of it
with the team's score definitions (`scores`, `ratings`): judgements about the session,
which an import reads past (it restores the transcript, not other people's ratings).

The journal references images and audio (`sectr-media://<sha256>`), never holds them. An
export made with media (`export_json(session, media_for=user)`: the `media=1` option of
the export URLs) adds a `media` list after the envelopes, one item per medium the
journal references and the exporting user may read through the session:
``{"sha256", "kind", "mime_type", "bytes", "data": <base64>}``, or, past the export's cap
(SECTR_EXPORT_MEDIA_MAX_BYTES of bytes carried in all), the same without `data` and with
`omitted` saying why. Without it, an export holds the references alone.

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
* Carried media (`media` items with `data`) are checked in the first pass (the sha256
  of the bytes is the one named and the journal references it, the bytes are the
  accepted type they are declared as, at most MEDIA_ITEM_MAX_BYTES each) and stored and
  linked to the new session in the second, as uploads are. A reference whose bytes the
  file does not carry stays in the journal but links nothing, even when this
  installation holds those bytes for another session: the new session's pages name it
  as not available in this installation, and its media URL answers 404.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
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
from sessions_app import media as stored_media
from sessions_app.journal.database import DatabaseJournal
from sessions_app.models import MediaBlob, Rating, Session, SessionMedia
from sessions_app.review import scores
from sessions_app.review.export_reader import ENVELOPE, MEDIA, ExportReader, refused, too_large
from sessions_app.review.transcript import build_timeline, timeline_markdown

FORMAT = "sectr.journal"
VERSION = 1
IMPORT_BATCH = 500
#: The most bytes one carried medium may hold (an upload's part and an MCP result's
#: item are capped lower by default).
MEDIA_ITEM_MAX_BYTES = 32 * 1024 * 1024


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


def export_document(session: Session, media_for: Any = None) -> dict[str, Any]:
    """The export of `session`; with `media_for` (the user exporting), its `media` too."""
    envelopes = load_envelopes(session)
    document = {
        "format": FORMAT,
        "version": VERSION,
        "session": session_header(session),
        "scores": [d.as_dict() for d in scores.team_scores(session.team_id)],
        "ratings": [scores.rating_record(r) for r in reviewer_ratings(session)],
        "envelopes": [envelope_record(env) for env in envelopes],
    }
    if media_for is not None:
        document[MEDIA] = media_records(media_for, session, envelopes)
    return document


def media_records(user: Any, session: Session, envelopes: list[Envelope]) -> list[dict[str, Any]]:
    """The media the journal references that `user` may read through `session`, in the
    order the journal first names them, with their bytes while the cap allows."""
    order: list[str] = []
    for env in envelopes:
        for digest in sorted(stored_media.media_digests(env.payload)):
            if digest not in order:
                order.append(digest)
    readable = stored_media.readable_digests(user, session, order)
    blobs = {blob.sha256: blob for blob in MediaBlob.objects.filter(sha256__in=readable)}
    cap = settings.SECTR_EXPORT_MEDIA_MAX_BYTES
    carried = 0
    records: list[dict[str, Any]] = []
    for digest in order:
        blob = blobs.get(digest)
        if blob is None:
            continue
        record: dict[str, Any] = {"sha256": digest, "kind": blob.kind, "mime_type": blob.mime_type, "bytes": blob.size}
        if carried + blob.size > cap:
            record["omitted"] = f"over the export's media cap of {cap} bytes (SECTR_EXPORT_MEDIA_MAX_BYTES)"
        else:
            try:
                with blob.file.open("rb") as handle:
                    data = handle.read()
            except OSError:
                record["omitted"] = "its file could not be read"
            else:
                record["data"] = base64.b64encode(data).decode("ascii")
                carried += len(data)
        records.append(record)
    return records


def export_json(session: Session, media_for: Any = None) -> str:
    return json.dumps(export_document(session, media_for), ensure_ascii=False, indent=1)


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
#: The keys of a `media` item.
MEDIA_KEYS = frozenset({"sha256", "kind", "mime_type", "bytes", "data", "omitted"})
#: A source of an export's items (export_reader.ExportReader.items), read once per pass.
Items = Callable[[], Iterator[tuple[str, Any]]]


@dataclass
class ImportPlan:
    """What the checking pass learns for the writing pass."""

    count: int
    created_at: datetime
    asks: dict[str, str]  # ask id in the file -> the new session's
    media: frozenset[str] = frozenset()  # the sha256 of the media the file carries the bytes of


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
            if key in (ENVELOPE, MEDIA):
                if not isinstance(value, list):
                    raise refused(f"{key} must be a list")
                for record in value:
                    yield key, record
            else:
                yield key, value

    return items


def _envelopes(
    items: Items, on_media: Callable[[int, Any], None] | None = None
) -> Iterator[tuple[int, dict[str, Any], EventType]]:
    """(index, record, type) of every envelope, each checked against the journal's rules
    (sectr.payloads) and the file's header checked as it comes; refuses with the index and
    seq of the first envelope that breaks one. Each `media` item goes to `on_media`
    (with its 1-based index) as it comes."""
    order = JournalOrder()
    header: dict[str, Any] = {}
    index = 0
    media_index = 0
    for key, value in items():
        if key == MEDIA:
            media_index += 1
            if on_media is not None:
                on_media(media_index, value)
            continue
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
    referenced: set[str] = set()
    carried: dict[str, int] = {}  # sha256 -> its media item's index
    with_bytes: list[str] = []

    def check_media(media_index: int, item: Any) -> None:
        digest, data = checked_media(media_index, item)
        if digest in carried:
            raise refused(f"media item {media_index}: {digest} is listed twice")
        carried[digest] = media_index
        if data is not None:  # checked; the writing pass decodes it again (memory: one item)
            with_bytes.append(digest)

    for index, record, kind in _envelopes(items, check_media):
        count = index
        stored_media.media_digests(record["payload"], referenced)
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
    for digest, media_index in carried.items():
        if digest not in referenced:
            raise refused(f"media item {media_index}: the journal does not reference {digest}")
    return ImportPlan(count=count, created_at=created_at, asks=asks, media=frozenset(with_bytes))


def checked_media(index: int, item: Any) -> tuple[str, bytes | None]:
    """A `media` item's sha256 and bytes (None: not carried), after the checks of the
    module docstring; refuses naming the item and why."""
    where = f"media item {index}"
    if not isinstance(item, dict):
        raise refused(f"{where} is not an object")
    unknown = sorted(set(item) - MEDIA_KEYS)
    if unknown:
        raise refused(f"{where} has unknown key(s) {', '.join(str(k)[:40] for k in unknown[:5])}")
    digest, kind, mime_type = item.get("sha256"), item.get("kind"), item.get("mime_type")
    if not isinstance(digest, str) or not stored_media.SHA256_TEXT.fullmatch(digest):
        raise refused(f"{where}: sha256 must be 64 lowercase hexadecimal digits")
    if kind not in ("image", "audio") or not isinstance(mime_type, str):
        raise refused(f"{where}: kind is image or audio, and mime_type a string")
    encoded = item.get("data")
    if encoded is None:
        return digest, None
    if not isinstance(encoded, str) or len(encoded) * 3 // 4 > MEDIA_ITEM_MAX_BYTES + 3:
        raise refused(f"{where}: data is base64 of at most {MEDIA_ITEM_MAX_BYTES} bytes")
    try:
        data = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise refused(f"{where}: data is not valid base64") from None
    if not data or len(data) > MEDIA_ITEM_MAX_BYTES:
        raise refused(f"{where}: data is base64 of 1 to {MEDIA_ITEM_MAX_BYTES} bytes")
    if hashlib.sha256(data).hexdigest() != digest:
        raise refused(f"{where}: the bytes' sha256 is not {digest}")
    sniffed = stored_media.sniff_mime(data)
    if sniffed != mime_type or not sniffed.startswith(f"{kind}/"):
        found = sniffed or "not an accepted image or audio format"
        raise refused(f"{where}: declared {kind} {mime_type[:60]}, but the bytes are {found}")
    return digest, data


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
    created_files: list[str] = []
    try:
        return _write(items, plan, owner, journal, created_files)
    except BaseException:
        stored_media.forget_files(created_files)  # the transaction rolled back
        raise


def _write(items: Items, plan: ImportPlan, owner: Any, journal: DatabaseJournal, created_files: list[str]) -> Session:
    with transaction.atomic():
        session = Session.objects.create(owner=owner, created_at=plan.created_at)
        stored = 0

        def store(media_index: int, item: Any) -> None:
            nonlocal stored
            digest, data = checked_media(media_index, item)
            if data is None:
                return
            if digest not in plan.media:
                raise refused("the file changed while it was imported")
            blob = stored_media.store_blob(data, item["mime_type"], item["kind"], created_files)
            SessionMedia.objects.get_or_create(session=session, blob=blob)
            stored += 1

        batch: list[NewEvent] = []
        count = 0
        for _index, record, kind in _envelopes(items, store):
            count += 1
            payload = attributed(kind, _rewrite(record["payload"], plan.asks))
            batch.append(NewEvent(kind, payload, record.get("invocation_id")))
            if len(batch) >= IMPORT_BATCH:
                journal.append_sync(session.pk, batch)
                batch = []
        if batch:
            journal.append_sync(session.pk, batch)
        if count != plan.count or stored != len(plan.media):
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
