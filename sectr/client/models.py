"""What the SDK hands back: snapshots, transcripts, run events and results."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from sectr.client.errors import ProtocolError

#: The kinds of a run's events, in the order they can come (`result` always last).
EVENT_KINDS = (
    "turn.start",
    "message.delta",
    "reasoning.delta",
    "tool.call",
    "tool.result",
    "permission.ask",
    "approval",
    "steer",
    "compaction",
    "session.title",
    "recover_notice",
    "turn.end",
    "result",
)


class SessionMode(str, Enum):
    DEFAULT = "default"
    PLAN = "plan"
    ACCEPT_EDITS = "accept_edits"

    def __str__(self) -> str:
        return self.value


class Verdict(str, Enum):
    ALLOW_ONCE = "allow_once"
    ALLOW_ALWAYS = "allow_always"
    DENY = "deny"
    RESPOND = "respond"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Edit:
    """A responder's (or `resolve_ask`'s) answer: run the asked call once, with these
    arguments instead of the model's (verdict allow_once with `arguments`)."""

    arguments: dict[str, Any]


@dataclass(frozen=True)
class Respond:
    """A responder's answer: the model gets `result` as the call's result, attributed to
    the token's owner; the tool does not run (verdict respond)."""

    result: str


def _require(data: Any, *keys: str) -> dict[str, Any]:
    if not isinstance(data, dict) or any(key not in data for key in keys):
        raise ProtocolError(f"the server's answer lacks {', '.join(keys)}")
    return data


class Title(str):
    """A session's title: a string, also readable as ``title.value`` (the TypeScript
    SDK's ``snapshot.title?.value``)."""

    __slots__ = ()

    @property
    def value(self) -> str:
        return str(self)


@dataclass(frozen=True)
class ResolvedModel:
    provider_id: str
    model_id: str
    context_window: int
    reasoning_effort: str | None


@dataclass(frozen=True)
class Snapshot:
    """A session's state (docs/sessions.md). `raw` is the whole JSON answer."""

    id: str
    state: str
    mode: str
    title: Title | None
    resolved_model: ResolvedModel
    limits: dict[str, int]
    turns: int
    tool_calls: int
    token_usage: dict[str, Any]
    media: dict[str, bool]
    placement: dict[str, Any] | None
    pending_ask: dict[str, Any] | None
    created_at: str | None
    updated_at: str | None
    owner: str
    last_seq: int = 0
    team: str | None = None  # the session's team (docs/moderation.md), None for a personal session
    #: The agent and version the session runs with: {"id", "slug", "name", "version", "team"}
    #: ("id" None for the built-in default agent).
    agent: dict[str, Any] | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, data: Any) -> Snapshot:
        data = _require(data, "id", "state", "mode", "resolved_model", "token_usage", "owner")
        try:
            return cls(
                id=data["id"],
                state=data["state"],
                mode=data["mode"],
                title=Title(data["title"]) if isinstance(data.get("title"), str) else None,
                resolved_model=ResolvedModel(**_require(data["resolved_model"], "provider_id", "model_id")),
                limits=dict(data.get("limits") or {}),
                turns=int(data.get("turns", 0)),
                tool_calls=int(data.get("tool_calls", 0)),
                token_usage=dict(data["token_usage"]),
                media=dict(data.get("media") or {}),
                placement=data.get("placement"),
                pending_ask=data.get("pending_ask"),
                created_at=data.get("created_at"),
                updated_at=data.get("updated_at"),
                owner=data["owner"],
                last_seq=int(data.get("last_seq", 0)),
                team=data.get("team"),
                agent=data.get("agent") if isinstance(data.get("agent"), dict) else None,
                raw=data,
            )
        except (TypeError, ValueError) as exc:
            raise ProtocolError(f"malformed snapshot: {exc}") from None

    def __getitem__(self, key: str) -> Any:
        return self.raw[key]


@dataclass(frozen=True)
class TranscriptMessage:
    role: str
    text: str | None
    tool_calls: list[dict[str, Any]]
    tool_result: dict[str, Any] | None
    parts: list[dict[str, Any]] | None
    reasoning: str | None = None


@dataclass(frozen=True)
class Transcript:
    """A session's messages: `view` "model" (what the model sees, from the newest
    compaction) or "history" (everything); `complete` when they came from one
    consistent read of the journal."""

    messages: list[TranscriptMessage]
    complete: bool
    last_seq: int = 0
    view: str = "model"

    @classmethod
    def from_json(cls, data: Any) -> Transcript:
        data = _require(data, "messages", "complete")
        try:
            messages = [
                TranscriptMessage(
                    role=m["role"],
                    text=m.get("text"),
                    tool_calls=list(m.get("tool_calls") or []),
                    tool_result=m.get("tool_result"),
                    parts=m.get("parts"),
                    reasoning=m.get("reasoning"),
                )
                for m in data["messages"]
            ]
        except (TypeError, KeyError) as exc:
            raise ProtocolError(f"malformed transcript: {exc}") from None
        return cls(
            messages=messages,
            complete=bool(data["complete"]),
            last_seq=int(data.get("last_seq", 0)),
            view=str(data.get("view") or "model"),
        )


@dataclass(frozen=True)
class RunEvent:
    """One event of a run (docs/sdk.md): `kind`, `text` for deltas, `payload`, `seq`."""

    kind: str
    run_id: str
    seq: int | None
    text: str | None
    payload: dict[str, Any]

    @classmethod
    def from_json(cls, data: Any) -> RunEvent:
        data = _require(data, "kind", "run_id", "payload")
        if not isinstance(data["payload"], dict):
            raise ProtocolError("an event's payload must be an object")
        seq = data.get("seq")
        return cls(
            data["kind"], data["run_id"], int(seq) if seq is not None else None, data.get("text"), data["payload"]
        )


@dataclass(frozen=True)
class PermissionAsk:
    """A gated tool call waiting for a verdict (a `permission.ask` event).

    `may_have_run`: a crash cut off an earlier attempt of this very call after it had
    started, so it may already have taken effect; approving runs it again."""

    ask_id: str
    name: str
    arguments: dict[str, Any]
    tool_call_id: str | None
    run_id: str
    may_have_run: bool = False

    @classmethod
    def from_payload(cls, payload: dict[str, Any], run_id: str) -> PermissionAsk:
        _require(payload, "ask_id", "name")
        return cls(
            ask_id=payload["ask_id"],
            name=payload["name"],
            arguments=dict(payload.get("arguments") or {}),
            tool_call_id=payload.get("tool_call_id"),
            run_id=run_id,
            may_have_run=payload.get("may_have_run") is True,
        )


@dataclass(frozen=True)
class RunResult:
    """How a run ended. A stop is a result, not an error (cancelled, limits, budget...).

    `run_id` is the last run followed (a run resumed after an approval is a new run on
    the server; `run_ids` lists them all), `usage` sums them, `text` is the answer of the
    last one, `ask` the pending ask when `stop_reason` is ``awaiting_approval``.
    """

    run_id: str
    text: str
    stop_reason: str
    usage: dict[str, int]
    error: str | None = None
    ask: PermissionAsk | None = None
    run_ids: tuple[str, ...] = ()

    @property
    def awaiting_approval(self) -> bool:
        return self.stop_reason == "awaiting_approval"
