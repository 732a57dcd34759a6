"""Snapshots and transcripts of a session (docs/sessions.md), as JSON-ready dicts.

Both are projections: a snapshot reads the Session row's cached projection (itself
rebuildable from the journal), a transcript folds the journal (the model's view or
the full history). The API returns them
as they are and the SDK wraps them in small classes.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from sectr.events import Envelope, EventType
from sectr.fold import fold_messages
from sectr.state import SessionState, prompt_text
from sessions_app.display.content import api_result_media
from sessions_app.journal import get_journal
from sessions_app.models import Envelope as EnvelopeRow
from sessions_app.models import Run, Session
from sessions_app.runtime import pinned_agent, session_model_info

#: The views of a transcript: what the model sees (from the newest compaction: its
#: summary and kept messages, then everything after) and the full history people saw.
TRANSCRIPT_VIEWS = ("model", "history")
#: The history is read with one SELECT, fetched and folded this many rows at a time.
HISTORY_CHUNK_ROWS = 2_000


USAGE_KEYS = ("input_tokens", "output_tokens", "reasoning_tokens", "cached_input_tokens")


def _usage(values: dict[str, Any] | None) -> dict[str, int]:
    values = values or {}
    return {key: int(values.get(key, 0) or 0) for key in USAGE_KEYS}


def _iso(value: Any) -> str | None:
    return value.isoformat() if value is not None else None


def placement(session_id: str, worktree_selector: Any = None) -> dict[str, Any] | None:
    """Which worker holds the session's active run (for operators), and the worktree
    selector the session was created with (as given), or None when neither is known."""
    selector = {"worktree_selector": worktree_selector} if worktree_selector is not None else {}
    run = (
        Run.objects.filter(session_id=session_id, status__in=(Run.QUEUED, Run.RUNNING))
        .order_by("-created_at")
        .values("id", "status", "lease_owner", "lease_expires_at", "heartbeat_at")
        .first()
    )
    if run is None:
        return selector or None
    return {
        **selector,
        "run_id": run["id"],
        "run_status": run["status"],
        "worker": run["lease_owner"],
        "lease_expires_at": _iso(run["lease_expires_at"]),
        "heartbeat_at": _iso(run["heartbeat_at"]),
    }


def snapshot(session: Session, *, with_placement: bool = True) -> dict[str, Any]:
    """The fields of docs/sessions.md's snapshot, from the cached projection."""
    state: SessionState = session.projection()
    info = session_model_info(state.model)
    total = state.total_usage
    return {
        "id": session.pk,
        "state": state.status,
        "mode": state.mode,
        "title": state.title,
        "resolved_model": {
            "provider_id": info.provider_id,
            "model_id": info.model_id,
            "context_window": info.context_window,
            "reasoning_effort": state.reasoning_effort,
        },
        "limits": dict(state.limits),
        "turns": state.turns,
        "tool_calls": state.tool_calls,
        "token_usage": {
            "total": _usage(total),
            "by_model": {model: _usage(usage) for model, usage in sorted(state.usage.items())},
        },
        "media": {"image": info.image_input, "audio": info.audio_input},
        "placement": placement(session.pk, state.worktree_selector)
        if with_placement
        else ({"worktree_selector": state.worktree_selector} if state.worktree_selector is not None else None),
        "pending_ask": _ask(state.pending_ask),
        "created_at": _iso(state.created_at or session.created_at),
        "updated_at": _iso(state.updated_at or session.updated_at),
        "owner": session.owner.get_username(),
        "team": session.team.name if session.team_id is not None and session.team is not None else None,
        "last_seq": state.last_seq,
        "closed": session.closed_at is not None,
        "forked_from": state.forked_from,
        "notes": dict(state.notes),
        "last_error": state.last_error["error"] if state.last_error else None,
        "stop_reason": state.last_stop_reason,
        "agent": agent_summary(state.agent),
    }


def agent_summary(pin: dict[str, Any] | None) -> dict[str, Any]:
    """The snapshot's `agent`: which agent and version the session runs with (the
    built-in `default` agent when it names none)."""
    try:
        spec = pinned_agent(pin)
    except LookupError:  # a pin of an imported session, from another installation
        return {**(pin or {}), "name": None}
    return {"id": spec.id, "slug": spec.slug, "name": spec.name, "version": spec.version, "team": spec.team}


def _ask(ask: dict[str, Any] | None) -> dict[str, Any] | None:
    if ask is None:
        return None
    data = {key: ask.get(key) for key in ("ask_id", "tool_call_id", "name", "arguments", "seq", "invocation_id")}
    # A re-ask after a crash cut this call off once it had started (docs/journal.md).
    data["may_have_run"] = bool(ask.get("may_have_run"))
    # What a rule set (docs/moderation.md): quorum, expiry, and the votes so far.
    for key in ("rule_id", "approvals_required", "expires_after_s", "requested_at"):
        if ask.get(key) is not None:
            data[key] = ask[key]
    if ask.get("votes"):
        data["votes"] = list(ask["votes"])
    return data


def session_summary(session: Session) -> dict[str, Any]:
    """A list entry: the snapshot without its placement (one query per page, not per row)."""
    return snapshot(session, with_placement=False)


# ---- transcripts ----


def transcript(session: Session, view: str = "model") -> dict[str, Any]:
    """`messages` (role, text, tool_calls, tool_result, parts), `complete` and `view`.

    `view="model"` (the default) is the conversation the model currently sees
    (`ctx.messages` of the next invocation): from the newest compaction on, so it starts
    with the compaction's summary and kept messages. `view="history"` is everything
    people saw: compactions inside the session are skipped (a fork's opening
    compaction, which holds the source's conversation, is kept). Either view comes from
    one SELECT, which SQLite and PostgreSQL both answer from one snapshot of the
    journal, however long the session: `complete` is True when that read held every
    envelope of the view (from seq 1, or from the compaction it starts at) without a gap.
    """
    if view not in TRANSCRIPT_VIEWS:
        raise ValueError(f"unknown transcript view {view!r}")
    media: dict[str, list[dict[str, Any]]] = {}  # tool call id -> its result's media
    if view == "model":
        envelopes = get_journal().load_since_compaction_sync(session.pk)
        starts_well = bool(envelopes) and (envelopes[0].seq == 1 or envelopes[0].type is EventType.TRANSCRIPT_COMPACTED)
        complete = starts_well and _gapless(envelopes)
        messages = fold_messages(_noting_media(envelopes, media))
        last_seq = envelopes[-1].seq if envelopes else 0
    else:
        reader = _HistoryReader(session.pk)
        messages = fold_messages(_noting_media(reader.envelopes(), media))
        complete, last_seq = reader.complete, reader.last_seq
    return {
        "session_id": session.pk,
        "view": view,
        "messages": [transcript_message(m, media, session.pk) for m in messages],
        "complete": complete,
        "last_seq": last_seq,
    }


def _noting_media(envelopes: Iterable[Envelope], media: dict[str, list[dict[str, Any]]]) -> Iterator[Envelope]:
    """The envelopes, passed through, noting each TOOL_RESULT's `media` by its call: the
    fold keeps a tool message to what the model reads (its text), the transcript adds them."""
    for envelope in envelopes:
        if envelope.type is EventType.TOOL_RESULT and envelope.payload.get("media"):
            media[str(envelope.payload.get("tool_call_id"))] = envelope.payload["media"]
        yield envelope


def _gapless(envelopes: list[Envelope]) -> bool:
    first = envelopes[0].seq if envelopes else 0
    return all(env.seq == first + i for i, env in enumerate(envelopes))


class _HistoryReader:
    """The whole journal of a session from one SELECT, streamed (the fold keeps messages,
    not envelopes), minus the compactions made inside the session."""

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.complete = False
        self.last_seq = 0

    def envelopes(self) -> Iterator[Envelope]:
        rows = (
            EnvelopeRow.objects.filter(session_id=self.session_id)
            .order_by("seq")
            .values_list("seq", "invocation_id", "type", "payload", "created_at")
            .iterator(chunk_size=HISTORY_CHUNK_ROWS)
        )
        gapless = True
        for seq, invocation_id, event_type, payload, created_at in rows:
            gapless = gapless and seq == self.last_seq + 1
            self.last_seq = seq
            kind = EventType(event_type)
            if kind is EventType.TRANSCRIPT_COMPACTED and payload.get("through_seq"):
                continue
            yield Envelope(self.session_id, seq, invocation_id, kind, payload, created_at)
        self.complete = gapless and self.last_seq > 0


def transcript_message(
    message: dict[str, Any], media: Mapping[str, list[dict[str, Any]]] | None = None, session_id: str = ""
) -> dict[str, Any]:
    """One folded (OpenAI-style) message as a transcript entry. A tool result with stored
    images or audio (`media`, by tool call id) lists them with their API URLs."""
    role = message.get("role", "")
    content = message.get("content")
    parts = content if isinstance(content, list) else None
    text = prompt_text(content) if content is not None else None
    calls = [
        {
            "id": call.get("id"),
            "name": call.get("function", {}).get("name"),
            "arguments": call.get("function", {}).get("arguments"),
        }
        for call in message.get("tool_calls") or []
    ]
    tool_result = None
    if role == "tool":
        tool_result = {"tool_call_id": message.get("tool_call_id"), "content": content}
        found = (media or {}).get(str(message.get("tool_call_id")))
        if found:
            tool_result["media"] = api_result_media(found, session_id)
    return {
        "role": role,
        "text": text,
        "reasoning": message.get("reasoning_content"),
        "tool_calls": calls,
        "tool_result": tool_result,
        "parts": parts,
    }
