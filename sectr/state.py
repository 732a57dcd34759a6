"""The session projection: everything a session *is*, derived from its envelopes alone.

`apply_envelope(state, envelope)` folds one envelope into a SessionState (in place, and
returns it); `project(envelopes)` folds a whole journal. The Django app caches the
projection on the Session row in the same transaction as each append, and can rebuild it
from the journal at any time.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any

from sectr.events import Envelope, EventType, add_usage
from sectr.fold import copy_json

LIMIT_KEYS = ("max_turns", "max_tool_calls", "max_consecutive_failures", "max_run_tokens")
DEFAULT_LIMITS = {"max_turns": 50, "max_tool_calls": 100, "max_consecutive_failures": 5, "max_run_tokens": 0}
STATES = ("idle", "running", "awaiting", "completed", "failed", "cancelled")
TITLE_MAX = 120
#: Tools whose successful results change the session's notes (shown on its page).
NOTE_TOOLS = ("write_note", "delete_note")


@dataclass
class SessionState:
    session_id: str
    status: str = "idle"
    title: str | None = None
    title_source: str | None = None  # "user" (created with or renamed) or "prompt" (first message)
    mode: str = "default"
    model: str = "demo"
    reasoning_effort: str | None = None
    limits: dict[str, int] = field(default_factory=lambda: dict(DEFAULT_LIMITS))
    forked_from: dict[str, Any] | None = None
    #: The agent version the session is pinned to ({"id", "slug", "team", "version"});
    #: None: the built-in default agent.
    agent: dict[str, Any] | None = None
    worktree_selector: str | dict[str, Any] | None = None  # stored and returned, never interpreted
    #: A replay of another session (sectr.replay): {"source", "live_reads", "turns" (user
    #: turns given so far), "diverged" (the divergence, once it happened)}; None otherwise.
    replay: dict[str, Any] | None = None
    current_invocation_id: str | None = None  # the active invocation, while running
    last_invocation_id: str | None = None
    last_reason: dict[str, Any] | None = None
    last_stop_reason: str | None = None
    last_error: dict[str, Any] | None = None  # {"error", "retryable", "invocation_id"} while failed
    open_message_id: str | None = None  # started, not ended (a crash leaves it open)
    open_message_model: str | None = None
    open_message_tool_calls: int = 0  # TOOL_CALLs of the open message (a crash may leave some)
    pending_ask: dict[str, Any] | None = None
    asks: dict[str, dict[str, Any]] = field(default_factory=dict)
    grants: list[str] = field(default_factory=list)  # tool names with an allow_always grant
    usage: dict[str, dict[str, int]] = field(default_factory=dict)  # per model
    turns: int = 0  # model steps (assistant messages)
    tool_calls: int = 0
    notes: dict[str, str] = field(default_factory=dict)
    note_calls: dict[str, dict[str, Any]] = field(default_factory=dict)  # note tool calls awaiting a result
    last_seq: int = 0
    compaction_seq: int = 0
    created_at: datetime | None = None
    updated_at: datetime | None = None

    @property
    def is_active(self) -> bool:
        """A run is in progress (an invocation started and has not ended)."""
        return self.status == "running"

    @property
    def at_turn_boundary(self) -> bool:
        return self.status != "running"

    @property
    def total_usage(self) -> dict[str, int]:
        total: dict[str, int] = {"input_tokens": 0, "output_tokens": 0, "reasoning_tokens": 0, "cached_input_tokens": 0}
        for usage in self.usage.values():
            total = add_usage(total, usage)
        return total

    def copy(self) -> SessionState:
        # The fields hold JSON-like values and datetimes only: copying the containers is
        # a deep copy, at a fraction of copy.deepcopy's cost (a worker copies the state
        # of every run it starts).
        return SessionState(**{name: copy_json(getattr(self, name)) for name in _FIELD_NAMES})

    def to_dict(self) -> dict[str, Any]:
        # What dataclasses.asdict would return, without its deepcopy of every leaf: every
        # append other than a delta stores this (Session.cached_columns).
        data = {name: copy_json(getattr(self, name)) for name in _FIELD_NAMES}
        for key in ("created_at", "updated_at"):
            value = data[key]
            data[key] = value.isoformat() if value else None
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SessionState:
        data = dict(data)
        for key in ("created_at", "updated_at"):
            if data.get(key):
                data[key] = datetime.fromisoformat(data[key])
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})


_FIELD_NAMES = tuple(f.name for f in fields(SessionState))


def clamp_title(text: str) -> str:
    title = " ".join(text.split())
    return title[:TITLE_MAX]


def prompt_text(content: Any) -> str:
    """The plain text of a user message's content (string or OpenAI parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type") == "text")
    return ""


def _apply_settings(state: SessionState, payload: dict[str, Any]) -> None:
    if "title" in payload and payload["title"] is not None:
        state.title = payload["title"]
        state.title_source = payload.get("title_source", "user")
    for key in ("mode", "model"):
        if payload.get(key):
            setattr(state, key, payload[key])
    if "reasoning_effort" in payload:
        state.reasoning_effort = payload["reasoning_effort"]
    if isinstance(payload.get("agent"), dict):
        state.agent = dict(payload["agent"])
    if isinstance(payload.get("limits"), dict):
        state.limits = {**state.limits, **{k: int(v) for k, v in payload["limits"].items() if k in LIMIT_KEYS}}


def apply_envelope(state: SessionState, env: Envelope) -> SessionState:
    """Fold one envelope into `state` (mutated and returned)."""
    p = env.payload
    t = env.type
    state.last_seq = env.seq
    state.updated_at = env.created_at
    if t is EventType.MESSAGE_DELTA:  # the most frequent by far, and it changes nothing else
        return state
    if t is EventType.SESSION_CREATED:
        state.created_at = env.created_at
        _apply_settings(state, p)
        if p.get("forked_from"):
            state.forked_from = p["forked_from"]
        if p.get("worktree_selector") is not None:
            state.worktree_selector = p["worktree_selector"]
        if p.get("replay"):
            replay = p["replay"]
            state.replay = {
                "source": replay.get("source"),
                "live_reads": bool(replay.get("live_reads")),
                "turns": 0,
                "diverged": None,
            }
    elif t is EventType.SESSION_UPDATED:
        _apply_settings(state, p)
    elif t is EventType.INVOCATION_STARTED:
        reason = p.get("reason", {})
        state.status = "running"
        state.current_invocation_id = env.invocation_id
        state.last_invocation_id = env.invocation_id
        state.last_reason = reason
        state.last_error = None
        state.last_stop_reason = None
        if state.replay is not None and reason.get("kind") == "user_message":
            state.replay["turns"] = int(state.replay.get("turns") or 0) + 1
        if reason.get("kind") == "approval_decision":
            ask = state.asks.get(reason.get("ask_id", ""))
            decision = reason.get("decision", {})
            if ask is not None:
                ask["status"] = "approved" if decision.get("approved") else "denied"
                ask["verdict"] = decision.get("verdict") or ("allow_once" if decision.get("approved") else "deny")
                ask["approver"] = decision.get("approver")
                if ask["verdict"] == "allow_always" and ask["name"] not in state.grants:
                    state.grants.append(ask["name"])
                edited = decision.get("arguments")
                call = state.note_calls.get(ask.get("tool_call_id") or "")
                if call is not None and isinstance(edited, dict):
                    # The note a person's edit wrote is the edited one, not the model's.
                    call["arguments"] = json.dumps(edited)
                elif call is not None and ask["verdict"] == "respond":
                    # Answered by a person: the call never ran, so it writes no note.
                    state.note_calls.pop(ask["tool_call_id"], None)
            if state.pending_ask and state.pending_ask.get("ask_id") == reason.get("ask_id"):
                state.pending_ask = None
    elif t is EventType.MESSAGE_START:
        state.open_message_id = p.get("message_id")
        state.open_message_model = p.get("model")
        state.open_message_tool_calls = 0
        state.turns += 1
    elif t is EventType.MESSAGE_END:
        model = p.get("model") or state.open_message_model or state.model
        if state.open_message_id == p.get("message_id"):
            state.open_message_id = None
        if p.get("usage"):
            state.usage[model] = add_usage(state.usage.get(model, {}), p["usage"])
    elif t is EventType.TOOL_CALL:
        state.tool_calls += 1
        if state.open_message_id is not None and p.get("message_id") == state.open_message_id:
            state.open_message_tool_calls += 1
        if p.get("name") in NOTE_TOOLS:
            state.note_calls[p["tool_call_id"]] = {"name": p["name"], "arguments": p.get("arguments", "")}
    elif t is EventType.TOOL_RESULT:
        call = state.note_calls.pop(p.get("tool_call_id", ""), None)
        if call is not None and not p.get("is_error"):
            _apply_note(state, call)
    elif t is EventType.APPROVAL_REQUESTED:
        ask = {
            **p,
            "invocation_id": env.invocation_id,
            "seq": env.seq,
            "status": "pending",
            "requested_at": env.created_at.isoformat(),
        }
        decision = p.get("decision")
        if isinstance(decision, dict):
            # Decided at once by a rule (sectr.rules): never pending, and never a grant
            # (a rule's allow is for this call only).
            ask["status"] = "approved" if decision.get("approved") else "denied"
            ask["verdict"] = "allow_once" if decision.get("approved") else "deny"
            ask["approver"] = decision.get("approver")
            state.asks[p["ask_id"]] = ask
        else:
            ask["votes"] = []
            state.asks[p["ask_id"]] = ask
            state.pending_ask = ask
    elif t is EventType.APPROVAL_VOTED:
        voted = state.asks.get(p.get("ask_id", ""))
        if voted is not None and voted.get("status") == "pending":
            vote = {k: p[k] for k in ("approver", "verdict", "note") if p.get(k) is not None}
            voted.setdefault("votes", []).append(vote)
            pending = state.pending_ask
            # After a round trip through JSON, pending_ask is a copy of the asks entry.
            if pending is not None and pending is not voted and pending.get("ask_id") == voted.get("ask_id"):
                pending.setdefault("votes", []).append(dict(vote))
    elif t is EventType.INVOCATION_SUSPENDED:
        state.status = "awaiting"
        state.open_message_id = None  # an invocation's end closes its message (as the fold does)
        state.current_invocation_id = None
        state.last_stop_reason = "awaiting_approval"
    elif t is EventType.INVOCATION_COMPLETED:
        state.status = "completed"
        state.open_message_id = None  # an invocation's end closes its message (as the fold does)
        state.current_invocation_id = None
        state.last_stop_reason = p.get("stop_reason", "end_turn")
        if state.replay is not None and state.last_stop_reason == "diverged" and not state.replay.get("diverged"):
            state.replay["diverged"] = p.get("divergence") or {}
    elif t is EventType.INVOCATION_FAILED:
        state.status = "failed"
        state.open_message_id = None  # an invocation's end closes its message (as the fold does)
        state.current_invocation_id = None
        state.last_stop_reason = "error"
        state.last_error = {
            "error": p.get("error", ""),
            "retryable": bool(p.get("retryable")),
            "invocation_id": env.invocation_id,
        }
    elif t is EventType.INVOCATION_CANCELLED:
        state.status = "cancelled"
        state.current_invocation_id = None
        state.last_stop_reason = "cancelled"
        state.open_message_id = None
        if state.pending_ask is not None:  # cancelling a paused run withdraws its ask
            state.asks.get(state.pending_ask["ask_id"], {})["status"] = "withdrawn"
            state.pending_ask = None
    elif t is EventType.SESSION_ERROR:
        # A crash or a provider error closed the open message (fold rule 8).
        state.open_message_id = None
    elif t is EventType.TRANSCRIPT_COMPACTED:
        state.compaction_seq = env.seq
    return state


def _apply_note(state: SessionState, call: dict[str, Any]) -> None:
    import json

    try:
        args = json.loads(call["arguments"]) if isinstance(call["arguments"], str) else dict(call["arguments"])
    except (ValueError, TypeError):
        return
    title = str(args.get("title", ""))
    if call["name"] == "write_note":
        state.notes[title] = str(args.get("body", ""))
    else:
        state.notes.pop(title, None)


def project(envelopes: Iterable[Envelope], session_id: str | None = None) -> SessionState:
    state: SessionState | None = None
    for env in envelopes:
        if state is None:
            state = SessionState(session_id=env.session_id)
        apply_envelope(state, env)
    return state or SessionState(session_id=session_id or "")
