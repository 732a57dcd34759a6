"""manage.py sectr_import: a restore of a transcript, not of other people's decisions.

Every hostile file is refused with one line naming the envelope (index and seq) and
the reason, a non-zero exit and nothing written; people named in a file are
`imported:<name>` (never a live user's vote, decision or audit row); --owner is
required; the file is read envelope by envelope under a size cap.
"""

from __future__ import annotations

import io
import json
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connections
from django.test import override_settings

from sectr.errors import ValidationFailed
from sectr.events import Envelope, EventType
from sectr.fold import fold_messages
from sectr.journal import NewEvent
from sessions_app.actions.asks import do_decide
from sessions_app.journal import DatabaseJournal
from sessions_app.journal.moderation import rebuild_audit
from sessions_app.management.commands.sectr_import import Command
from sessions_app.models import AskIndex, AuditEntry, Run, SearchEntry, Session
from sessions_app.models import Envelope as EnvelopeRow
from sessions_app.review import export
from sessions_app.review.export_reader import ExportReader
from tests.server.conftest import join_team

AT = "2026-01-02T03:04:05+00:00"


def record(seq: int, type: str, payload: Any, invocation_id: str | None = None) -> dict[str, Any]:
    return {"seq": seq, "invocation_id": invocation_id, "type": type, "payload": payload, "created_at": AT}


def journal_records(*rest: tuple[str, Any, str | None]) -> list[dict[str, Any]]:
    records = [record(1, "SESSION_CREATED", {"mode": "default", "model": "demo", "title": "Imported"})]
    for seq, (type, payload, invocation_id) in enumerate(rest, start=2):
        records.append(record(seq, type, payload, invocation_id))
    return records


def document(records: list[dict[str, Any]], owner: str = "teammate") -> dict[str, Any]:
    header = {"id": "ses_x", "title": "Imported", "owner": owner, "created_at": AT, "last_seq": len(records)}
    return {"format": "sectr.journal", "version": 1, "session": header, "envelopes": records}


def user_turn(text: str, inv: str = "inv_1", author: str = "teammate") -> tuple[str, Any, str]:
    return (
        "INVOCATION_STARTED",
        {"reason": {"kind": "user_message", "input": {"content": text}, "author": author}},
        inv,
    )


def reply(inv: str = "inv_1", mid: str = "m1", text: str = "Hello") -> list[tuple[str, Any, str]]:
    return [
        ("MESSAGE_START", {"message_id": mid, "role": "assistant", "model": "demo"}, inv),
        ("MESSAGE_DELTA", {"message_id": mid, "text": text}, inv),
        ("MESSAGE_END", {"message_id": mid, "usage": {"input_tokens": 3, "output_tokens": 1}}, inv),
        ("INVOCATION_COMPLETED", {"stop_reason": "end_turn"}, inv),
    ]


def quorum_ask(ask_id: str = "ask_old", inv: str = "inv_2") -> list[tuple[str, Any, str | None]]:
    ask = {"ask_id": ask_id, "tool_call_id": None, "name": "deploy", "arguments": {}, "approvals_required": 2}
    return [
        user_turn("deploy", inv),
        ("APPROVAL_REQUESTED", ask, inv),
        ("INVOCATION_SUSPENDED", {"ask_id": ask_id}, inv),
    ]


def write(tmp_path: Path, data: Any, name: str = "export.json") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data), encoding="utf-8")
    return path


def import_file(path: Path, *options: str) -> str:
    out = io.StringIO()
    call_command("sectr_import", str(path), *(options or ("--owner", "owner")), stdout=out)
    return out.getvalue().strip().splitlines()[-1]


def counts() -> tuple[int, ...]:
    return tuple(m.objects.count() for m in (Session, EnvelopeRow, AuditEntry, AskIndex, SearchEntry, Run))


# ---- hostile files: one line, non-zero exit, nothing written ----


def _text(records: list[dict[str, Any]], replace: tuple[str, str]) -> str:
    return json.dumps(document(records)).replace(*replace)


HOSTILE: dict[str, tuple[Callable[[], Any], str]] = {
    "reason x": (
        lambda: document(journal_records(("INVOCATION_STARTED", {"reason": "x"}, "inv_1"))),
        "envelope 2 (seq 2): payload.reason.kind must be one of",
    ),
    "NUL": (
        lambda: _text(journal_records(user_turn("hi NULHERE")), ("NULHERE", "\\u0000")),
        "envelope 2 (seq 2): payload.reason.input.content contains a NUL character",
    ),
    "lone surrogate": (
        lambda: _text(journal_records(user_turn("hi"), *reply(text="SURROGATE")), ("SURROGATE", "\\ud800")),
        "envelope 4 (seq 4): payload.text is not valid Unicode (a lone surrogate)",
    ),
    "huge integer": (
        lambda: _text(journal_records(user_turn("hi"), *reply()), ('"input_tokens": 3', '"input_tokens": ' + "9" * 30)),
        "envelope 5 (seq 5): payload.usage.input_tokens is an integer out of bounds",
    ),
    "malformed delta": (
        lambda: document(
            journal_records(user_turn("hi"), ("MESSAGE_DELTA", {"message_id": "m1", "txt": "x"}, "inv_1"))
        ),
        "envelope 3 (seq 3): payload has unknown key(s) txt",
    ),
    "delta not text": (
        lambda: document(journal_records(user_turn("hi"), ("MESSAGE_DELTA", {"message_id": "m1", "text": ["x"]}, "i"))),
        "envelope 3 (seq 3): payload.text must be a string",
    ),
    "second SESSION_CREATED": (
        lambda: document(journal_records(user_turn("hi"), ("SESSION_CREATED", {"mode": "default"}, None))),
        "envelope 3 (seq 3): a journal has exactly one SESSION_CREATED, and it comes first",
    ),
    "seq gap": (
        lambda: document([*journal_records(user_turn("hi")), record(4, "INVOCATION_COMPLETED", {}, "inv_1")]),
        "envelope 3 (seq 4): seq must be 3",
    ),
    "unknown type": (
        lambda: document(journal_records(("PROMOTE_TO_ADMIN", {}, None))),
        "envelope 2 (seq 2): unknown event type 'PROMOTE_TO_ADMIN'",
    ),
    "unknown record key": (
        lambda: document([{**journal_records()[0], "session_id": "ses_other"}]),
        "envelope 1 (seq 1): has unknown key(s) session_id",
    ),
    "vote with a bad verdict": (
        lambda: document(
            journal_records(*quorum_ask(), ("APPROVAL_VOTED", {"ask_id": "ask_old", "approver": "x"}, None))
        ),
        "envelope 5 (seq 5): payload.verdict must be one of",
    ),
    "title too long": (
        lambda: document([record(1, "SESSION_CREATED", {"mode": "default", "title": "t" * 500})]),
        "envelope 1 (seq 1): payload.title is longer than 120 characters",
    ),
    "usage that adds up too far": (
        lambda: document(
            journal_records(
                user_turn("hi"),
                *[
                    ("MESSAGE_END", {"message_id": f"m{i}", "usage": {"input_tokens": 2**53 - 1}}, "inv_1")
                    for i in range(2)
                ],
            )
        ),
        "envelope 4 (seq 4): the usage of 'demo' adds up past",
    ),
    "NaN": (
        lambda: _text(journal_records(user_turn("hi"), *reply()), ('"output_tokens": 1', '"output_tokens": NaN')),
        "not valid JSON near character",
    ),
    "truncated": (lambda: json.dumps(document(journal_records(user_turn("hi"))))[:-30], "not valid JSON at character"),
    "trailing data": (lambda: json.dumps(document(journal_records())) + "{}", "data after the export's object"),
    "deep nesting": (lambda: '{"format": "sectr.journal", "session": ' + "[" * 100_000, "nests too deep"),
    "no envelopes": (lambda: document([]), "the export has no envelopes"),
    "another format": (lambda: {**document(journal_records()), "format": "other"}, "not a sectr.journal version 1"),
    "not an object": (lambda: "[1, 2]", "expected an export (a JSON object)"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_it_refuses_a_hostile_file_with_one_line_and_writes_nothing(case: str, owner: Any, tmp_path: Path) -> None:
    make, reason = HOSTILE[case]
    path = write(tmp_path, make())
    before = counts()
    with pytest.raises(CommandError) as refused:
        import_file(path)
    message = str(refused.value)
    assert message.startswith(f"cannot import {path}: ") and reason in message, message
    assert "\n" not in message and "Traceback" not in message
    assert counts() == before


def test_a_refusal_exits_non_zero_with_one_line_on_stderr(
    owner: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write(tmp_path, HOSTILE["second SESSION_CREATED"][0]())
    # manage.py's way in (exit status, stderr), but keeping the test database open.
    monkeypatch.setattr(connections, "close_all", lambda: None)
    with pytest.raises(SystemExit) as exited:
        Command().run_from_argv(["manage.py", "sectr_import", str(path), "--owner", "owner"])
    assert exited.value.code == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "envelope 3 (seq 3)" in lines[0], lines
    assert not Session.objects.exists()


def test_a_file_that_breaks_a_rule_late_writes_nothing_of_its_good_start(owner: Any, tmp_path: Path) -> None:
    """Checked whole before the first write: 2,000 good envelopes, then a bad one."""
    turns = [user_turn("hi")] + [("MESSAGE_DELTA", {"message_id": "m1", "text": "x"}, "inv_1")] * 2000
    path = write(tmp_path, document(journal_records(*turns, ("INVOCATION_STARTED", {"reason": "x"}, "inv_9"))))
    before = counts()
    with pytest.raises(CommandError, match=r"envelope 2003 \(seq 2003\)"):
        import_file(path)
    assert counts() == before


# ---- the owner ----


def test_it_refuses_without_owner_and_never_takes_the_files(owner: Any, teammate: Any, tmp_path: Path) -> None:
    path = write(tmp_path, document(journal_records(user_turn("hi"), *reply()), owner="teammate"))
    with pytest.raises(CommandError, match="pass --owner USERNAME"):
        call_command("sectr_import", str(path), stdout=io.StringIO())
    with pytest.raises(CommandError, match="no active user 'nobody'"):
        import_file(path, "--owner", "nobody")
    teammate.is_active = False
    teammate.save()
    with pytest.raises(CommandError, match="no active user 'teammate'"):
        import_file(path, "--owner", "teammate")
    assert not Session.objects.exists()
    imported = Session.objects.get(pk=import_file(path, "--owner", "owner"))
    assert imported.owner == owner


# ---- people in a file are imported, never live users ----


def test_a_forged_vote_and_decision_are_not_in_the_live_audit_as_that_user(
    owner: Any, teammate: Any, outsider: Any, tmp_path: Path
) -> None:
    decision = {
        "approved": True,
        "approver": "outsider",
        "approvers": ["teammate", "outsider"],
        "verdict": "allow_once",
    }
    by_rule = {"approved": False, "approver": "rule:no-deploys", "verdict": "deny"}
    records = journal_records(
        *quorum_ask(),
        ("APPROVAL_VOTED", {"ask_id": "ask_old", "approver": "teammate", "verdict": "allow_once"}, None),
        (
            "INVOCATION_STARTED",
            {"reason": {"kind": "approval_decision", "ask_id": "ask_old", "decision": decision}},
            "i3",
        ),
        ("STEER_RECEIVED", {"text": "faster", "author": "teammate"}, "i3"),
        ("INVOCATION_CANCELLED", {"by": "outsider"}, "i3"),
        ("APPROVAL_REQUESTED", {"ask_id": "ask_rule", "name": "t", "arguments": {}, "decision": by_rule}, "i4"),
    )
    imported = Session.objects.get(pk=import_file(write(tmp_path, document(records))))
    for _ in range(2):  # as appended, and as sectr_rebuild_audit recomputes it
        rows = AuditEntry.objects.filter(session=imported)
        actors = {(row.kind, row.actor) for row in rows}
        assert actors == {
            (AuditEntry.ASK, "owner"),
            (AuditEntry.VOTE, "imported:teammate"),
            (AuditEntry.DECISION, "imported:outsider"),
            (AuditEntry.RULE, "imported:rule:no-deploys"),  # a rule's decision keeps its kind
        }
        assert rows.get(kind=AuditEntry.RULE).rule == "no-deploys"
        assert not AuditEntry.objects.filter(actor__in=["teammate", "outsider"]).exists()
        rebuild_audit(session_ids=[imported.pk])
    envelopes = DatabaseJournal().load_sync(imported.pk)
    reason = envelopes[5].payload["reason"]
    assert reason["decision"]["approver"] == "imported:outsider"
    assert reason["decision"]["approvers"] == ["imported:teammate", "imported:outsider"]
    assert envelopes[1].payload["reason"]["author"] == "imported:teammate"
    assert envelopes[6].payload["author"] == "imported:teammate"
    assert envelopes[7].payload["by"] == "imported:outsider"
    # The ask was renamed (a global key the original session still owns); the rename
    # and the attribution leave the fold as it was.
    assert envelopes[2].payload["ask_id"] != "ask_old" and AskIndex.objects.filter(session=imported).count() == 2
    original = [
        Envelope(
            r["session_id"] if "session_id" in r else "x",
            r["seq"],
            r["invocation_id"],
            EventType(r["type"]),
            r["payload"],
        )
        for r in records
    ]
    assert fold_messages(envelopes) == fold_messages(original)


def test_an_imported_vote_never_counts_toward_a_live_quorum(
    owner: Any, teammate: Any, outsider: Any, tmp_path: Path
) -> None:
    records = journal_records(
        *quorum_ask(),
        ("APPROVAL_VOTED", {"ask_id": "ask_old", "approver": "outsider", "verdict": "allow_once"}, None),
    )
    imported = Session.objects.get(pk=import_file(write(tmp_path, document(records))))
    # Moderators of the owner's team, which the imported session joins.
    teammate, outsider = join_team(teammate, "moderator", owner), join_team(outsider, "moderator", owner)
    ask_id = AskIndex.objects.get(session=imported).ask_id
    # One live approval of two: the imported vote is history, the quorum is still short.
    assert do_decide(teammate, ask_id, "allow_once") is None
    imported.refresh_from_db()
    assert imported.status == "awaiting" and not Run.objects.filter(session=imported).exists()
    # The real outsider may vote (their imported namesake did not vote here); two live
    # approvals decide it.
    assert do_decide(outsider, ask_id, "allow_once") is not None


# ---- the round trip, the size cap, streaming ----


def test_an_export_imports_to_an_equal_fold_through_the_streaming_reader(
    owner: Any, make_session: Any, tmp_path: Path
) -> None:
    session = make_session(title="Original")
    rest = [user_turn("hi"), *reply(), *quorum_ask()]
    journal = DatabaseJournal(publish=False)
    journal.append_sync(session.pk, [NewEvent(EventType(type), payload, inv) for type, payload, inv in rest])
    path = tmp_path / "export.json"
    path.write_text(export.export_json(session), encoding="utf-8")
    imported = Session.objects.get(pk=import_file(path))
    assert fold_messages(journal.load_sync(imported.pk)) == fold_messages(journal.load_sync(session.pk))
    session.refresh_from_db()
    assert imported.status == "awaiting" and imported.last_seq == session.last_seq


def test_it_refuses_a_file_over_the_size_cap(owner: Any, tmp_path: Path) -> None:
    path = write(tmp_path, document(journal_records(user_turn("hi"), *reply())))
    with override_settings(SECTR_IMPORT_MAX_BYTES=path.stat().st_size - 1):
        with pytest.raises(CommandError, match="larger than the import limit of .* bytes"):
            import_file(path)
    with override_settings(SECTR_IMPORT_MAX_BYTES=path.stat().st_size):
        import_file(path)


def test_the_reader_counts_bytes_as_it_reads_a_stream_of_unknown_size() -> None:
    data = json.dumps(document(journal_records(user_turn("hi")))).encode()
    reader = ExportReader(io.BytesIO(data), max_bytes=len(data) - 1, chunk_bytes=16)
    with pytest.raises(ValidationFailed, match="larger than the import limit"):
        list(reader.items())


@pytest.mark.parametrize("chunk_bytes", [1, 3, 7, 64, 1 << 16])
def test_the_reader_yields_what_json_loads_reads_whatever_the_chunk_size(chunk_bytes: int) -> None:
    records = journal_records(user_turn("héllo ✓ 🐧 " * 5), *reply(text="x" * 100))
    records[2]["payload"]["big"] = 123456789012345
    data = json.dumps(document(records), ensure_ascii=False, indent=1).encode()
    reader = ExportReader(io.BytesIO(data), max_bytes=len(data), chunk_bytes=chunk_bytes)
    items = list(reader.items())
    assert [value for key, value in items if key == "envelopes"] == json.loads(data)["envelopes"]
    assert dict((key, value) for key, value in items if key != "envelopes") == {
        key: value for key, value in json.loads(data).items() if key != "envelopes"
    }


def big_export(tmp_path: Path, turns: int) -> Path:
    """A generated export of `turns` turns, 10 envelopes each (deltas mostly)."""
    path = tmp_path / f"big-{turns}.json"
    with path.open("w", encoding="utf-8") as handle:
        handle.write('{"format": "sectr.journal", "version": 1, "session": {}, "envelopes": [\n')
        handle.write(json.dumps(record(1, "SESSION_CREATED", {"mode": "default", "model": "demo"})))
        seq = 1
        for turn in range(turns):
            inv, mid = f"inv_{turn}", f"m{turn}"
            events = [user_turn(f"question {turn} " + "words " * 20, inv)]
            events.append(("MESSAGE_START", {"message_id": mid, "role": "assistant", "model": "demo"}, inv))
            events += [("MESSAGE_DELTA", {"message_id": mid, "text": f"piece {i} " * 8}, inv) for i in range(6)]
            events.append(("MESSAGE_END", {"message_id": mid, "usage": {"input_tokens": 9, "output_tokens": 7}}, inv))
            events.append(("INVOCATION_COMPLETED", {"stop_reason": "end_turn"}, inv))
            for type, payload, invocation_id in events:
                seq += 1
                handle.write(",\n" + json.dumps(record(seq, type, payload, invocation_id)))
        handle.write("\n]}\n")
    return path


def import_peak(path: Path, owner: Any) -> tuple[int, float, Session]:
    tracemalloc.start()
    started = time.perf_counter()
    try:
        session = export.import_file(path, owner)
        return tracemalloc.get_traced_memory()[1], time.perf_counter() - started, session
    finally:
        tracemalloc.stop()


def test_the_import_memory_follows_one_batch_not_the_file(owner: Any, tmp_path: Path) -> None:
    """Ten times the envelopes, about the same peak: the file is never held whole (the
    old json.load of the file held all of it, and more, at once)."""
    small, large = big_export(tmp_path, 50), big_export(tmp_path, 500)
    small_peak, _, _ = import_peak(small, owner)
    large_peak, _, session = import_peak(large, owner)
    assert session.last_seq == 5_001
    grown = large.stat().st_size - small.stat().st_size
    assert large_peak - small_peak < grown / 4, (small_peak, large_peak, grown)
