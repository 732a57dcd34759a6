"""The OpenAPI 3.1 document of ``/api/v1/``, generated from the route table.

Paths and methods come from the route table it is given (sessions_app.api.urls.ROUTES,
the same table the URL patterns are made from), so the document cannot drift from the endpoints; the schemas
below describe the bodies the views accept and the dicts sessions_app.display.snapshots,
sessions_app.api.events and the views return.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

import sectr
from sectr.events import DECISION_SCOPES, RESPONSE_MAX, VERDICTS
from sectr.rules import MAX_APPROVALS, MAX_EXPIRY_SECONDS, MAX_GLOB, MAX_RULE_ARGUMENTS, MAX_TOOL_GLOB
from sessions_app.api.events import EVENT_KINDS
from sessions_app.media import AUDIO_FORMATS, PROMPT_MAX_PARTS

PREFIX = "/api/v1/"
_CONVERTER = re.compile(r"<(?:\w+:)?(\w+)>")


def openapi_path(django_path: str) -> str:
    """``sessions/<str:session_id>`` -> ``/api/v1/sessions/{session_id}``."""
    return PREFIX + _CONVERTER.sub(r"{\1}", django_path)


def ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [schema, {"type": "null"}]}


STRING = {"type": "string"}
#: A string field where "" is refused (it never means "the default").
NONEMPTY = {"type": "string", "minLength": 1}
INTEGER = {"type": "integer"}
BOOLEAN = {"type": "boolean"}
OBJECT = {"type": "object"}
#: A label for where a session should run, stored and returned as given (at most 2 KiB of JSON).
WORKTREE_SELECTOR = {"anyOf": [{"type": "string", "minLength": 1, "maxLength": 2048}, {"type": "object"}]}
DATETIME = {"type": "string", "format": "date-time"}
MODE = {"type": "string", "enum": ["default", "plan", "accept_edits"]}
VERDICT = {"type": "string", "enum": list(VERDICTS)}
REASONING_EFFORT = {"type": "string", "enum": ["minimal", "low", "medium", "high"]}
ROLE = {"type": "string", "enum": ["member", "reviewer", "moderator"]}
WEBHOOK_KIND = {"type": "string", "enum": ["json", "slack"]}
STATE = {"type": "string", "enum": ["idle", "running", "awaiting", "completed", "failed", "cancelled"]}
TRANSCRIPT_VIEW = {"type": "string", "enum": ["model", "history"]}
#: An empty query parameter (`?view=`) is one that was not given.
EMPTY = {"type": "string", "maxLength": 0}


def or_empty(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [schema, EMPTY]}


#: The query parameters of the operations (Operation.query names them); a value outside
#: its schema is a 400 naming the parameter (`invalid_<name>`).
QUERY_PARAMETERS: dict[str, dict[str, Any]] = {
    "limit": {"schema": {"type": "integer", "minimum": 1, "maximum": 100, "default": 50}},
    "offset": {"schema": {"type": "integer", "minimum": 0, "maximum": 10**9, "default": 0}},
    "after": {
        "schema": {"type": "integer", "minimum": 0, "maximum": 10**12 - 1},
        "description": "resume after this seq (Last-Event-ID wins when both are sent)",
    },
    "view": {
        "schema": or_empty({**TRANSCRIPT_VIEW, "default": "model"}),
        "description": "model (the default): the conversation the model sees (from the newest compaction);"
        " history: all of it",
    },
}
RUN_STATUS = {
    "type": "string",
    "enum": ["pending", "queued", "running", "suspended", "completed", "failed", "cancelled"],
}


def _object(properties: dict[str, Any], required: tuple[str, ...] = (), *, closed: bool = True) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        schema["required"] = list(required)
    if closed:
        schema["additionalProperties"] = False
    return schema


def _request(properties: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    """A request body: closed, and an optional field may also be null (the views read a
    null as "not given", sessions_app.api.views.optional)."""
    return _object({k: v if k in required else nullable(v) for k, v in properties.items()}, required)


USAGE = _object(
    {key: INTEGER for key in ("input_tokens", "output_tokens", "reasoning_tokens", "cached_input_tokens")},
    ("input_tokens", "output_tokens"),
    closed=False,
)
LIMITS = _object(
    {
        key: {"type": "integer", "minimum": 0, "maximum": 10**9}
        for key in ("max_turns", "max_tool_calls", "max_consecutive_failures", "max_run_tokens")
    }
)

RUN_PROPERTIES: dict[str, Any] = {
    "run_id": STRING,
    "session_id": STRING,
    "status": RUN_STATUS,
    "reason": nullable({"type": "string", "enum": ["user_message", "approval_decision", "retry", "recover"]}),
    "stop_reason": nullable(STRING),
    "usage": ref("Usage"),
    "error": nullable(STRING),
    "invocation_ids": {"type": "array", "items": STRING},
    "start_seq": nullable(INTEGER),
    "created_at": DATETIME,
    "started_at": nullable(DATETIME),
    "finished_at": nullable(DATETIME),
    "events_url": STRING,
    "result": nullable(ref("RunResult")),
}
ACTION = {"type": "string", "enum": ["allow", "deny", "ask"]}
AGENT_PARAMS = _object(
    {  # null: not set
        "temperature": nullable({"type": "number", "minimum": 0, "maximum": 2}),
        "reasoning_effort": nullable(REASONING_EFFORT),
        "max_output_tokens": nullable({"type": "integer", "minimum": 1, "maximum": 10**7}),
    }
)
#: What an agent's version holds, as answers show it.
AGENT_FIELDS: dict[str, Any] = {
    "name": STRING,
    "description": STRING,
    "instructions": STRING,
    "model": nullable(STRING),
    "params": AGENT_PARAMS,
    "tools": nullable({"type": "array", "items": STRING}),
    "mode": nullable(MODE),
    "limits": nullable(ref("Limits")),
    "handler": STRING,
}
TOOL_PATTERN = {"type": "string", "pattern": r"^[A-Za-z0-9_\-*?\[\]!]{1,128}$"}
#: What a create or a save may send (null or left out: the default, or the latest version's).
AGENT_INPUT: dict[str, Any] = {
    "name": {"type": "string", "minLength": 1, "maxLength": 120, "pattern": r"\S"},
    "description": {"type": "string", "maxLength": 2000},
    "instructions": {"type": "string", "maxLength": 100000},
    # "" (or null): the installation's default model.
    "model": {"type": "string", "maxLength": 200, "pattern": r"^$|\S"},
    "params": AGENT_PARAMS,
    "tools": {"type": "array", "items": TOOL_PATTERN, "maxItems": 200},
    "mode": MODE,
    "limits": ref("Limits"),
    # "" (or null) is the default handler.
    "handler": {"type": "string", "pattern": r"^[A-Za-z0-9_.:\-]{0,200}$"},
}
#: A decimal amount as a string (no float rounding): "100", "12.50".
DECIMAL = {"type": "string", "pattern": r"^[0-9]{1,11}(\.[0-9]{1,4})?$"}
#: A pair verdict's scores: each side's values of the team's own scores, by name.
PAIR_SCORES = {
    "type": "object",
    "properties": {side: {"type": "object", "additionalProperties": True} for side in ("baseline", "candidate")},
    "additionalProperties": False,
}
AGENT_SLUG = {"type": "string", "pattern": "^[a-z0-9][a-z0-9-]{0,62}$"}
AGENT_NOTE = {"type": "string", "maxLength": 500}
#: The fields of a rule both shapes of RuleInput share (sectr.rules.check_rule's limits).
RULE_INPUT: dict[str, Any] = {
    "tool": {"type": "string", "minLength": 1, "maxLength": MAX_TOOL_GLOB, "pattern": "[^\\s\\x1c-\\x1f\\x85\\ufeff]"},
    "arguments": {
        "type": "object",
        "maxProperties": MAX_RULE_ARGUMENTS,
        "propertyNames": {"minLength": 1, "maxLength": 100},
        "additionalProperties": {"type": "string", "maxLength": MAX_GLOB},
    },
    "position": {"type": "integer", "minimum": 0},
}

SCORE_KIND = {"type": "string", "enum": ["categorical", "numeric", "boolean"]}
#: A score's value: a label (categorical), a number (numeric), true/false (boolean, and thumbs: true is up).
SCORE_VALUE = {"anyOf": [STRING, {"type": "number"}, BOOLEAN]}
#: What a score definition may change (sessions_app.review.scores.check_definition).
SCORE_SHAPE = {
    "labels": {"type": "array", "minItems": 2, "maxItems": 20, "items": {"type": "string", "maxLength": 40}},
    "minimum": {"type": "number"},
    "maximum": {"type": "number"},
    "description": {"type": "string", "maxLength": 500},
}

SCHEMAS: dict[str, Any] = {
    "Error": _object(
        {
            "error": _object(
                # More fields per code: ask_not_pending names decided_by, status, verdict.
                {"code": STRING, "message": STRING, "decided_by": nullable(STRING)},
                ("code", "message"),
                closed=False,
            )
        },
        ("error",),
    ),
    "Usage": USAGE,
    "Limits": LIMITS,
    "Ask": _object(
        {
            "ask_id": STRING,
            "tool_call_id": nullable(STRING),
            "name": STRING,
            "arguments": OBJECT,
            "seq": INTEGER,
            "invocation_id": STRING,
            "may_have_run": BOOLEAN,
        },
        closed=False,
    ),
    "Snapshot": _object(
        {
            "id": STRING,
            "state": STATE,
            "mode": MODE,
            "title": nullable(STRING),
            "resolved_model": _object(
                {
                    "provider_id": STRING,
                    "model_id": STRING,
                    "context_window": INTEGER,
                    "reasoning_effort": nullable(REASONING_EFFORT),
                }
            ),
            "limits": ref("Limits"),
            "turns": INTEGER,
            "tool_calls": INTEGER,
            "token_usage": _object(
                {"total": ref("Usage"), "by_model": {"type": "object", "additionalProperties": ref("Usage")}}
            ),
            "media": _object({"image": BOOLEAN, "audio": BOOLEAN}),
            "placement": nullable(
                _object(
                    {
                        # As the fork or clear that made the session gave it; never interpreted.
                        "worktree_selector": WORKTREE_SELECTOR,
                        "run_id": STRING,
                        "run_status": STRING,
                        "worker": nullable(STRING),
                        "lease_expires_at": nullable(DATETIME),
                        "heartbeat_at": nullable(DATETIME),
                    }
                )
            ),
            "pending_ask": nullable(ref("Ask")),
            "created_at": nullable(DATETIME),
            "updated_at": nullable(DATETIME),
            "owner": STRING,
            "team": nullable(STRING),
            "last_seq": INTEGER,
            "closed": BOOLEAN,
            "forked_from": nullable(_object({"session_id": STRING, "seq": INTEGER}, closed=False)),
            "notes": {"type": "object", "additionalProperties": STRING},
            "last_error": nullable(STRING),
            "stop_reason": nullable(STRING),
            "agent": _object(
                {
                    "id": nullable(STRING),
                    "slug": STRING,
                    "name": nullable(STRING),
                    "version": INTEGER,
                    "team": nullable(STRING),
                }
            ),
        },
        (
            "id",
            "state",
            "mode",
            "title",
            "resolved_model",
            "limits",
            "turns",
            "tool_calls",
            "token_usage",
            "media",
            "pending_ask",
            "owner",
        ),
    ),
    "SessionList": _object(
        {
            "sessions": {"type": "array", "items": ref("Snapshot")},
            "count": INTEGER,
            "limit": INTEGER,
            "offset": INTEGER,
            "next_offset": nullable(INTEGER),
        },
        ("sessions", "count", "next_offset"),
    ),
    "AuditEntry": _object(
        {
            "at": DATETIME,
            "kind": {"type": "string", "enum": ["decision", "rule", "expiry", "vote", "withdrawn", "ask"]},
            "actor": STRING,
            "verdict": nullable(VERDICT),
            "note": nullable(STRING),
            "team": nullable(STRING),
            "session_id": STRING,
            "session_title": STRING,
            "requester": STRING,
            "ask_id": STRING,
            "tool": STRING,
            "arguments": OBJECT,
            "edited": BOOLEAN,
            "run_arguments": nullable(OBJECT),
            "seconds_to_decide": nullable({"type": "number"}),
            "rule": nullable(STRING),
            "seq": INTEGER,
        },
        ("at", "kind", "actor", "session_id", "ask_id", "tool", "seq"),
    ),
    "AuditPage": _object(
        {
            "entries": {"type": "array", "items": ref("AuditEntry")},
            "count": INTEGER,
            "limit": INTEGER,
            "offset": INTEGER,
            "next_offset": nullable(INTEGER),
        },
        ("entries", "count", "next_offset"),
    ),
    "ResultMedia": {
        "type": "array",
        "items": _object(
            {
                "ref": STRING,
                "kind": {"type": "string", "enum": ["image", "audio"]},
                "mime_type": STRING,
                "bytes": INTEGER,
                "url": nullable(STRING),
            },
            ("ref", "kind", "mime_type", "bytes", "url"),
        ),
    },
    "TranscriptMessage": _object(
        {
            "role": {"type": "string", "enum": ["user", "assistant", "tool", "system"]},
            "text": nullable(STRING),
            "reasoning": nullable(STRING),
            "tool_calls": {"type": "array", "items": _object({"id": STRING, "name": STRING, "arguments": STRING})},
            "tool_result": nullable(
                _object({"tool_call_id": STRING, "content": nullable(STRING), "media": ref("ResultMedia")})
            ),
            "parts": nullable({"type": "array", "items": OBJECT}),
        },
        ("role", "text", "tool_calls", "tool_result", "parts"),
    ),
    "Transcript": _object(
        {
            "session_id": STRING,
            "view": TRANSCRIPT_VIEW,
            "messages": {"type": "array", "items": ref("TranscriptMessage")},
            "complete": BOOLEAN,
            "last_seq": INTEGER,
        },
        ("messages", "complete"),
    ),
    "RunResult": _object(
        {"stop": STRING, "text": STRING, "usage": ref("Usage"), "error": nullable(STRING), "ask": ref("Ask")},
        ("stop", "text", "usage", "error"),
    ),
    "Run": _object(
        RUN_PROPERTIES,
        ("run_id", "session_id", "status", "events_url"),
    ),
    "Event": _object(
        {
            "kind": {"type": "string", "enum": list(EVENT_KINDS)},
            "run_id": STRING,
            "seq": nullable(INTEGER),
            "text": nullable(STRING),
            "payload": OBJECT,
        },
        ("kind", "run_id", "seq", "payload"),
    ),
    # One event of GET /runs/{run_id}/events as an SSE parser reads it: `data` is an
    # Event as JSON; `id` (the seq) is absent only on the `result` of a run cancelled
    # before it started.
    "ServerSentEvent": _object(
        {
            "id": {"type": "string", "pattern": "^[0-9]+$"},
            "event": {"type": "string", "enum": list(EVENT_KINDS)},
            "data": {"type": "string", "contentMediaType": "application/json", "contentSchema": ref("Event")},
            "retry": {"type": "integer", "minimum": 0},
        },
        ("event", "data"),
    ),
    "Compacted": _object({"compacted": BOOLEAN}, ("compacted",)),
    "CreateSession": _request(
        {
            "title": {"type": "string", "minLength": 1, "maxLength": 120},
            "mode": MODE,
            "model": NONEMPTY,
            "limits": ref("Limits"),
            "reasoning_effort": REASONING_EFFORT,
            "team": nullable({"type": "string", "maxLength": 64}),
            "agent": {"type": "string", "minLength": 1, "maxLength": 200},
            "agent_version": {"type": "integer", "minimum": 1},
        }
    ),
    "Fork": _request(
        {
            "title": {"type": "string", "minLength": 1, "maxLength": 120},
            "model": NONEMPTY,
            # provider_id + model_id name the model as a snapshot's resolved_model does;
            # provider_id must be the server's own provider.
            "provider_id": NONEMPTY,
            "model_id": NONEMPTY,
            "reasoning_effort": REASONING_EFFORT,
            "at_seq": {"type": "integer", "minimum": 1},
            "agent_version": {"type": "integer", "minimum": 1},
            "worktree_selector": WORKTREE_SELECTOR,
        }
    ),
    "Clear": _request({"worktree_selector": WORKTREE_SELECTOR, "agent_version": {"type": "integer", "minimum": 1}}),
    "Rename": _request({"title": {"type": "string", "minLength": 1, "maxLength": 120}}, ("title",)),
    "SetMode": _request({"mode": MODE}, ("mode",)),
    "SetModel": _request({"model": NONEMPTY, "reasoning_effort": REASONING_EFFORT}, ("model",)),
    "TextPart": _object({"type": {"const": "text"}, "text": STRING}, ("type", "text")),
    "ImagePart": _object(
        {
            "type": {"const": "image_url"},
            "image_url": _object(
                {
                    "url": {
                        "type": "string",
                        "description": "data:<image type>;base64,... (an upload) or an https URL",
                    },
                    "detail": {"type": "string", "enum": ["auto", "low", "high"]},
                },
                ("url",),
            ),
            "mime_type": STRING,
        },
        ("type", "image_url"),
    ),
    "AudioPart": _object(
        {
            "type": {"const": "input_audio"},
            "input_audio": _object(
                {
                    "data": {"type": "string", "contentEncoding": "base64"},
                    "format": {"type": "string", "enum": list(AUDIO_FORMATS)},
                },
                ("data", "format"),
            ),
        },
        ("type", "input_audio"),
    ),
    "StartRun": _request(
        {
            "content": {
                "anyOf": [
                    {"type": "string", "minLength": 1},
                    {
                        "type": "array",
                        "minItems": 1,
                        "maxItems": PROMPT_MAX_PARTS,
                        "items": {"oneOf": [ref("TextPart"), ref("ImagePart"), ref("AudioPart")]},
                    },
                ]
            },
            "queue": BOOLEAN,
        },
        ("content",),
    ),
    "Steer": _request({"text": {"type": "string", "minLength": 1}}, ("text",)),
    # `scope` goes with an approving verdict only (a deny with a scope is a 400
    # invalid_scope); `arguments` (the call as edited) with allow_once, `result` (the
    # answer instead of the call) with respond, both only on an ask one person decides
    # (400 otherwise): one shape per kind of verdict.
    "Decide": {
        "anyOf": [
            _request(
                {
                    "verdict": {"const": "allow_once"},
                    "note": NONEMPTY,
                    "scope": {"type": "string", "enum": list(DECISION_SCOPES)},
                    "arguments": OBJECT,
                },
                ("verdict",),
            ),
            _request(
                {
                    "verdict": {"const": "allow_always"},
                    "note": NONEMPTY,
                    "scope": {"type": "string", "enum": list(DECISION_SCOPES)},
                },
                ("verdict",),
            ),
            _request({"verdict": {"const": "deny"}, "note": NONEMPTY, "scope": {"type": "null"}}, ("verdict",)),
            _request(
                {
                    "verdict": {"const": "respond"},
                    "note": NONEMPTY,
                    "result": {"type": "string", "minLength": 1, "maxLength": RESPONSE_MAX, "pattern": r"\S"},
                },
                ("verdict", "result"),
            ),
        ]
    },
    "AskEntry": _object(
        {
            "ask_id": STRING,
            "session_id": STRING,
            "team": nullable(STRING),
            "owner": STRING,
            "tool": STRING,
            "tool_call_id": nullable(STRING),
            "arguments": OBJECT,
            "may_have_run": BOOLEAN,
            "state": or_empty({"type": "string", "enum": ["pending", "decided"]}),
            "status": {"type": "string", "enum": ["pending", "approved", "denied", "withdrawn"]},
            "requested_at": nullable(DATETIME),
            "deadline": nullable(DATETIME),
            "approvals_required": INTEGER,
            "votes": {"type": "array", "items": OBJECT},
            "rule_id": nullable(STRING),
            "decided_by": nullable(STRING),
            "verdict": nullable(STRING),
            "decided_at": nullable(DATETIME),
        },
        ("ask_id", "session_id", "tool", "may_have_run", "state", "status", "approvals_required", "votes"),
    ),
    "AskList": _object(
        {
            "asks": {"type": "array", "items": ref("AskEntry")},
            "count": INTEGER,
            "limit": INTEGER,
            "offset": INTEGER,
            "next_offset": nullable(INTEGER),
        },
        ("asks", "count", "next_offset"),
    ),
    "Decision": _object(
        {
            **{key: value for key, value in RUN_PROPERTIES.items()},
            "run_id": nullable(STRING),
            "status": {"type": "string", "enum": [*RUN_STATUS["enum"], "voted"]},
            "ask": ref("AskEntry"),
        },
        ("run_id", "status", "ask"),
    ),
    # Quorum and expiry belong to action ask: an allow or deny rule takes neither (400
    # invalid_rule), so two shapes.
    "RuleInput": {
        "anyOf": [
            _request(
                {
                    **RULE_INPUT,
                    "action": {"const": "ask"},
                    "approvals_required": {"type": "integer", "minimum": 1, "maximum": MAX_APPROVALS},
                    "expires_after_s": {"type": "integer", "minimum": 1, "maximum": MAX_EXPIRY_SECONDS},
                },
                ("tool", "action"),
            ),
            _request(
                {
                    **RULE_INPUT,
                    "action": {"type": "string", "enum": ["allow", "deny"]},
                    "approvals_required": {"const": 1},
                    "expires_after_s": {"type": "null"},
                },
                ("tool", "action"),
            ),
        ]
    },
    "Rule": _object(
        {
            "id": STRING,
            "position": INTEGER,
            "tool": STRING,
            "arguments": {"type": "object", "additionalProperties": STRING},
            "action": ACTION,
            "approvals_required": INTEGER,
            "expires_after_s": nullable(INTEGER),
            "created_by": nullable(STRING),
            "updated_at": DATETIME,
        },
        ("id", "position", "tool", "action", "approvals_required", "expires_after_s"),
    ),
    "RuleList": _object({"team": STRING, "rules": {"type": "array", "items": ref("Rule")}}, ("team", "rules")),
    "AgentVersion": _object(
        {
            "agent_id": STRING,
            "version": INTEGER,
            **AGENT_FIELDS,
            "note": STRING,
            "author": nullable(STRING),
            "created_at": DATETIME,
        },
        ("agent_id", "version", "name", "instructions", "tools", "handler", "created_at"),
    ),
    "AgentVersionList": _object(
        {"agent_id": STRING, "versions": {"type": "array", "items": ref("AgentVersion")}}, ("agent_id", "versions")
    ),
    "Agent": _object(
        {
            "id": STRING,
            "slug": STRING,
            "team": nullable(STRING),
            "name": STRING,
            "description": STRING,
            "latest_version": INTEGER,
            "editable": BOOLEAN,
            "created_at": DATETIME,
            "current": ref("AgentVersion"),
        },
        ("id", "slug", "team", "name", "latest_version", "current"),
    ),
    "AgentList": _object({"agents": {"type": "array", "items": ref("Agent")}}, ("agents",)),
    "ExperimentCandidate": _object(
        {"label": STRING, "agent": nullable(STRING), "slug": STRING, "version": INTEGER, "model": STRING},
        ("label", "agent", "slug", "version", "model"),
    ),
    "Experiment": _object(
        {
            "id": STRING,
            "team": STRING,
            "name": STRING,
            "created_by": nullable(STRING),
            "created_at": DATETIME,
            "live_reads": BOOLEAN,
            "candidates": {"type": "array", "items": ref("ExperimentCandidate")},
            "replays": {
                "type": "array",
                "items": _object(
                    {
                        "source": STRING,
                        "candidate": INTEGER,
                        "session": STRING,
                        "state": {"type": "string", "enum": ["running", "done", "diverged", "failed"]},
                        "turns": INTEGER,
                        "turns_done": INTEGER,
                        "tokens": INTEGER,
                        "cost": nullable(DECIMAL),
                        "divergence": nullable({"type": "object"}),
                    },
                    ("source", "candidate", "session", "state", "turns", "turns_done", "tokens", "cost", "divergence"),
                ),
            },
            "summary": {
                "type": "array",
                "items": _object(
                    {
                        key: INTEGER
                        for key in (
                            "candidate",
                            "replays",
                            "done",
                            "diverged",
                            "failed",
                            "running",
                            "tokens",
                            "wins",
                            "losses",
                            "ties",
                        )
                    }
                    | {
                        "cost": nullable(DECIMAL),
                        "scores": {"type": "object", "additionalProperties": ref("PairScore")},
                    },
                ),
            },
        },
        ("id", "team", "name", "created_at", "live_reads", "candidates"),
    ),
    "PairScoreSide": _object(
        {
            "count": INTEGER,
            "mean": nullable({"type": "number"}),
            "counts": {"type": "object", "additionalProperties": INTEGER},
        },
        ("count", "mean"),
    ),
    "PairScore": _object(
        {"kind": STRING, "baseline": ref("PairScoreSide"), "candidate": ref("PairScoreSide")},
        ("kind", "baseline", "candidate"),
    ),
    "SendToQueue": _request(
        {
            "queue": INTEGER,
            "name": {"type": "string", "minLength": 1, "maxLength": 100},
            "reviewers": {"type": "array", "items": STRING},
        }
    ),
    "PairQueueItem": _object(
        {
            "id": INTEGER,
            "position": INTEGER,
            "source": STRING,
            "candidate": INTEGER,
            "assignee": nullable(STRING),
            "done": BOOLEAN,
        },
        ("id", "position", "source", "candidate", "assignee", "done"),
    ),
    "SentToQueue": _object(
        {
            "queue": _object({"id": INTEGER, "name": STRING, "team": STRING}, ("id", "name", "team")),
            "added": INTEGER,
            "items": {"type": "array", "items": ref("PairQueueItem")},
        },
        ("queue", "added", "items"),
    ),
    "ExperimentList": _object({"experiments": {"type": "array", "items": ref("Experiment")}}, ("experiments",)),
    "CreateExperiment": _request(
        {
            "name": {"type": "string", "minLength": 1, "maxLength": 120},
            "candidates": {
                "type": "array",
                "minItems": 1,
                "maxItems": 4,
                "items": _object({"agent": nullable(STRING), "version": nullable(INTEGER), "model": nullable(STRING)}),
            },
            "sessions": {"type": "array", "items": STRING, "maxItems": 100},
            "queue": INTEGER,
            "last": {"type": "integer", "minimum": 1, "maximum": 100},
            "live_reads": BOOLEAN,
        },
        ("name", "candidates"),
    ),
    "PairVerdictInput": _request(
        {
            "source": STRING,
            "candidate": INTEGER,
            "winner": {"type": "string", "enum": ["baseline", "candidate", "tie"]},
            "note": {"type": "string", "maxLength": 2000},
            "scores": PAIR_SCORES,
        },
        ("source", "candidate", "winner"),
    ),
    "PairVerdict": _object(
        {
            "source": STRING,
            "candidate": INTEGER,
            "winner": STRING,
            "note": STRING,
            "reviewer": STRING,
            "scores": PAIR_SCORES,
        },
        ("source", "candidate", "winner", "note", "reviewer"),
    ),
    "CreateAgent": _request({"slug": AGENT_SLUG, "note": AGENT_NOTE, **AGENT_INPUT}, ("slug", "name")),
    "SaveAgent": _request({"note": AGENT_NOTE, **AGENT_INPUT}),
    "Budget": _object(
        {
            "monthly_tokens": nullable(INTEGER),
            "monthly_cost": nullable(DECIMAL),
            "alert_thresholds": {"type": "array", "items": {"type": "number"}},
            "spent_tokens": INTEGER,
            "spent_cost": DECIMAL,
        },
        ("monthly_tokens", "monthly_cost", "alert_thresholds", "spent_tokens", "spent_cost"),
    ),
    "BudgetInput": _object(
        {
            "monthly_tokens": nullable({"type": "integer", "minimum": 0, "maximum": 10**15}),
            "monthly_cost": nullable(DECIMAL),
            "alert_thresholds": {
                "type": "array",
                "maxItems": 10,
                "items": {"type": "number", "exclusiveMinimum": 0, "maximum": 10},
            },
        }
    ),
    "TeamList": _object(
        {
            "teams": {
                "type": "array",
                "items": _object({"name": STRING, "role": nullable(ROLE), "staff": BOOLEAN}, ("name", "role", "staff")),
            }
        },
        ("teams",),
    ),
    "Member": _object({"username": STRING, "role": ROLE, "added_at": DATETIME}, ("username", "role", "added_at")),
    "MemberList": _object({"team": STRING, "members": {"type": "array", "items": ref("Member")}}, ("team", "members")),
    "MemberInput": _object(
        {
            "username": {"type": "string", "minLength": 1, "maxLength": 254},
            "email": {"type": "string", "minLength": 1, "maxLength": 254},
            "role": ROLE,
        },
    ),
    "MemberRole": _object({"role": ROLE}, ("role",)),
    "Webhook": _object(
        {
            "id": INTEGER,
            "url": STRING,
            "kind": WEBHOOK_KIND,
            "active": BOOLEAN,
            "created_at": DATETIME,
        },
        ("id", "url", "kind", "active", "created_at"),
    ),
    "WebhookList": _object(
        {"team": STRING, "webhooks": {"type": "array", "items": ref("Webhook")}}, ("team", "webhooks")
    ),
    "WebhookInput": _request(
        {
            "url": {"type": "string", "minLength": 1, "maxLength": 500},
            "kind": WEBHOOK_KIND,
            "secret": {"type": "string", "maxLength": 200},
        },
        ("url",),
    ),
    "McpServer": _object(
        {
            "name": STRING,
            "kind": {"type": "string", "enum": ["http", "stdio"]},
            "url": nullable(STRING),
            "header_names": {"type": "array", "items": STRING},
            "enabled": BOOLEAN,
            "timeout_s": {"type": "number"},
            "tools": nullable({"type": "array", "items": STRING}),
            "health": {"type": "string", "enum": ["unknown", "ok", "error", "disabled"]},
            "last_error": nullable(STRING),
            "protocol_version": nullable(STRING),
            "refreshed_at": nullable(DATETIME),
            "discovery_reason": nullable({"type": "string", "enum": ["saved", "refresh", "changed", "expired"]}),
            "tools_fresh_until": nullable(DATETIME),
            "discovered_tools": {
                "type": "array",
                "items": _object(
                    {
                        "name": STRING,
                        "tool": STRING,
                        "description": STRING,
                        "gate": {"type": "string", "enum": ["asks", "runs without asking"]},
                        "read_only": BOOLEAN,
                        "offered": BOOLEAN,
                        "input_schema": OBJECT,
                    },
                    ("name", "tool", "gate", "read_only", "offered"),
                ),
            },
        },
        ("name", "kind", "enabled", "health", "header_names", "discovered_tools"),
    ),
    "McpServerList": _object(
        {
            "team": STRING,
            "servers": {"type": "array", "items": ref("McpServer")},
            "installation_servers": {
                "type": "array",
                "items": _object({"name": STRING, "enabled": BOOLEAN}, ("name", "enabled")),
            },
        },
        ("team", "servers", "installation_servers"),
    ),
    "McpServerInput": _object(
        {
            "name": {"type": "string", "pattern": "^[a-z0-9][a-z0-9-]{0,31}$"},
            "url": {"type": "string", "minLength": 1, "maxLength": 2000},
            "headers": {"type": "object", "additionalProperties": {"type": "string", "maxLength": 8192}},
            "enabled": BOOLEAN,
            "timeout_s": {"type": "number", "minimum": 1, "maximum": 600},
            "tools": nullable({"type": "array", "maxItems": 100, "items": {"type": "string", "minLength": 1}}),
        },
    ),
    "Score": _object(
        {
            "name": STRING,
            "kind": SCORE_KIND,
            "description": STRING,
            "labels": {"type": "array", "items": STRING},
            "minimum": {"type": "number"},
            "maximum": {"type": "number"},
            "built_in": BOOLEAN,
        },
        ("name", "kind", "description", "built_in"),
    ),
    "ScoreList": _object({"team": STRING, "scores": {"type": "array", "items": ref("Score")}}, ("team", "scores")),
    "ScoreInput": _request(
        {
            "name": {"type": "string", "pattern": "^[a-z][a-z0-9_-]{0,39}$"},
            "kind": SCORE_KIND,
            **SCORE_SHAPE,
        },
        ("name", "kind"),
    ),
    "ScoreUpdate": _request(SCORE_SHAPE),
    "Rating": _object(
        {
            "id": INTEGER,
            "seq": INTEGER,
            "message_id": nullable(STRING),
            "author": STRING,
            "source": {"type": "string", "enum": ["reviewer", "end_user"]},
            "scores": {"type": "object", "additionalProperties": SCORE_VALUE},
            "tags": {"type": "array", "items": STRING},
            "comment": STRING,
            "updated_at": DATETIME,
        },
        ("id", "seq", "message_id", "author", "source", "scores", "tags", "comment", "updated_at"),
    ),
    "RatingList": _object(
        {
            "session": STRING,
            "scores": {"type": "array", "items": ref("Score")},
            "ratings": {"type": "array", "items": ref("Rating")},
        },
        ("session", "scores", "ratings"),
    ),
    "RatingInput": _request(
        {
            "message_id": NONEMPTY,
            "scores": {"type": "object", "additionalProperties": nullable(SCORE_VALUE)},
            "tags": {"type": "array", "maxItems": 10, "items": {"type": "string", "maxLength": 40}},
            "comment": {"type": "string", "maxLength": 10_000},
        }
    ),
    "MoveAgent": _request({"version": {"type": "integer", "minimum": 1}, "agent": NONEMPTY}),
}

#: Query parameters that are text (the others are whole numbers: limit, offset, after).
#: YYYY-MM-DD or an ISO 8601 time; empty means no bound.
DATE_FILTER = {
    "anyOf": [
        {"type": "string", "format": "date"},
        {"type": "string", "format": "date-time"},
        {"type": "string", "maxLength": 0},
    ]
}
#: ?format= of the operations whose formats are not json/csv, and their content types.
FORMATS: dict[str, dict[str, str]] = {
    "export_session": {"json": "application/json", "markdown": "text/markdown"},
}
#: Operations that answer with stored bytes (their stored image or audio type).
BINARY = frozenset({"get_session_media"})
TEXT_QUERY: dict[str, dict[str, Any]] = {
    "state": or_empty({"type": "string", "enum": ["pending", "decided"]}),
    # Filters: any text (one that matches nothing gives an empty page).
    "team": STRING,
    "tool": STRING,
    # GET /audit (sessions_app.api.audit)
    "format": {"type": "string", "enum": ["json", "csv"]},  # GET /export: FORMATS below
    "media": {"type": "string", "enum": ["0", "1"]},  # GET /sessions/{id}/export: carry the media's bytes
    "actor": STRING,
    "verdict": or_empty(VERDICT),
    "kind": or_empty({"type": "string", "enum": ["decision", "rule", "expiry", "vote", "withdrawn", "ask"]}),
    "session": STRING,
    "from": DATE_FILTER,
    "to": DATE_FILTER,
}

ERROR_DESCRIPTIONS = {
    400: (
        "Invalid input: malformed JSON, wrong types, an empty string, a string with NUL or a lone surrogate"
        " (invalid_unicode), a query parameter outside its schema, a bad media part"
        " (capability, mime_type, size, url, prompt)"
    ),
    401: "Missing, invalid or revoked token",
    403: "The caller may read but not do this",
    404: "No such object (or not the caller's)",
    405: "Method not allowed",
    409: "Conflict: session_busy, awaiting_approval, ask_not_pending (with decided_by), already_voted, "
    "stale_run_control, failed_step_retry_ineligible, already_member, last_moderator, score_exists",
    412: "Not at a turn boundary",
    413: "Body too large",
    429: "Rate limited (see Retry-After)",
}


def _error(status: int) -> dict[str, Any]:
    return {"description": ERROR_DESCRIPTIONS[status], "content": {"application/json": {"schema": ref("Error")}}}


def _event_stream(end: str, lead: str = "") -> dict[str, Any]:
    """The response of a streaming operation. A sequential media type: `itemSchema`
    (OpenAPI 3.2's keyword, read by 3.1 tools that know event streams) describes one
    event of the stream, whose `data` is an Event as JSON text. There is no `schema`:
    the body is not one document."""
    return {
        "description": (
            f"{lead}Server-Sent Events: each event has `id:` the envelope seq, `event:` the Event's kind and"
            f" `data:` the Event as JSON; comments (`: ping`) keep the connection alive; {end}"
        ),
        "content": {
            "text/event-stream": {
                "itemSchema": ref("ServerSentEvent"),
                "example": (
                    'id: 7\nevent: message.delta\ndata: {"kind": "message.delta", "run_id": "run_1",'
                    ' "seq": 7, "text": "Hi", "payload": {"message_id": "msg_1"}}\n\n'
                ),
            }
        },
    }


def _operation(route_path: str, method: str, operation: Any) -> dict[str, Any]:
    params: list[dict[str, Any]] = [
        {"name": name, "in": "path", "required": True, "schema": STRING} for name in _CONVERTER.findall(route_path)
    ]
    for name in operation.query:
        if name == "limit":
            schema = {**QUERY_PARAMETERS["limit"]["schema"], "maximum": operation.limit_max}
            params.append({"name": name, "in": "query", "required": False, "schema": schema})
        elif name in QUERY_PARAMETERS:
            params.append({"name": name, "in": "query", "required": False, **QUERY_PARAMETERS[name]})
        elif name == "format" and operation.operation_id in FORMATS:
            schema = {"type": "string", "enum": list(FORMATS[operation.operation_id])}
            params.append({"name": name, "in": "query", "required": False, "schema": schema})
        else:
            schema = TEXT_QUERY.get(name, {"type": "integer", "minimum": 0})
            params.append({"name": name, "in": "query", "required": False, "schema": schema})
    if operation.streaming:
        params.append(
            {
                "name": "Last-Event-ID",
                "in": "header",
                "required": False,
                "schema": {"type": "string", "pattern": "^([ \\t]*[0-9]{1,12}[ \\t]*)?$"},
                "description": "resume after this seq",
            }
        )
    doc: dict[str, Any] = {"operationId": operation.operation_id, "summary": operation.summary}
    if params:
        doc["parameters"] = params
    if operation.request is not None:
        # A body whose every field is optional may be left out (an empty body is {}).
        schema = SCHEMAS[operation.request]
        body_required = all(bool(shape.get("required")) for shape in schema.get("anyOf", [schema]))
        doc["requestBody"] = {
            "required": body_required,
            "content": {"application/json": {"schema": ref(operation.request)}},
        }
    if operation.streaming:
        success: dict[str, Any] = _event_stream(operation.stream_end)
    elif operation.status == 204:
        success = {"description": "Done"}
    elif operation.operation_id in BINARY:
        binary = {"schema": {"type": "string", "format": "binary"}}
        success = {"description": "The bytes", "content": {"image/*": binary, "audio/*": binary}}
    elif operation.response is None:
        success = {"description": "OK", "content": {"application/json": {"schema": OBJECT}}}
    else:
        success = {"description": "OK", "content": {"application/json": {"schema": ref(operation.response)}}}
    if operation.operation_id in FORMATS:
        for content_type in FORMATS[operation.operation_id].values():
            success["content"].setdefault(content_type, {"schema": STRING})
    elif "format" in operation.query:  # ?format=csv: the same rows as CSV, streamed
        success["content"]["text/csv"] = {"schema": STRING}
    responses: dict[str, Any] = {str(operation.status): success}
    if operation.streams_on_accept:
        responses["200"] = _event_stream(
            "the stream ends after the `result` event",
            "With `Accept: text/event-stream`: the run's events from its start, as GET /runs/{run_id}/events"
            " (the run's id in the X-Sectr-Run-Id and Location headers). ",
        )
        responses["200"]["headers"] = {
            "X-Sectr-Run-Id": {"description": "the run started", "schema": STRING},
            "Location": {"description": "the run: /api/v1/runs/{run_id}", "schema": STRING},
        }
    statuses = set(operation.errors) | {405}
    if operation.query:
        statuses |= {400}  # a query parameter outside its schema
    if operation.auth:
        statuses |= {401, 429}
    else:
        doc["security"] = []
    for status in sorted(statuses):
        responses[str(status)] = _error(status)
    doc["responses"] = responses
    return doc


class DescribedRoute(Protocol):
    @property
    def path(self) -> str: ...

    @property
    def operations(self) -> Mapping[str, Any]: ...


def build_document(routes: Iterable[DescribedRoute]) -> dict[str, Any]:
    """The OpenAPI 3.1 document of `routes` (sessions_app.api.urls.ROUTES, which serves it)."""
    paths: dict[str, Any] = {}
    for route in routes:
        paths[openapi_path(route.path)] = {
            method.lower(): _operation(route.path, method, operation) for method, operation in route.operations.items()
        }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Sectr API",
            "version": sectr.__version__,
            "description": "Durable LLM agent sessions: create, run, stream, steer, approve. See docs/api.md.",
        },
        "servers": [{"url": "/"}],
        "security": [{"bearer": []}],
        "paths": paths,
        "components": {
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer", "description": "manage.py sectr_token USERNAME"}
            },
            "schemas": SCHEMAS,
        },
    }
