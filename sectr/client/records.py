"""Request bodies and the smaller answers (run status, session pages), shared by both clients."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sectr.client.errors import InvalidRequestError, ProtocolError
from sectr.client.models import RunResult, Snapshot


def session_body(
    title: str | None, mode: Any, model: str | None, limits: dict[str, int] | None, reasoning_effort: str | None
) -> dict[str, Any]:
    body: dict[str, Any] = {}
    for key, value in (
        ("title", title),
        ("mode", str(mode) if mode is not None else None),
        ("model", model),
        ("limits", limits),
        ("reasoning_effort", reasoning_effort),
    ):
        if value is not None:
            body[key] = value
    return body


def fork_body(title: str | None, reasoning_effort: str | None, model: str | None, at_seq: int | None) -> dict[str, Any]:
    body: dict[str, Any] = {}
    for key, value in (("title", title), ("reasoning_effort", reasoning_effort), ("model", model), ("at_seq", at_seq)):
        if value is not None:
            body[key] = value
    return body


def run_body(content: Any, queue: bool) -> dict[str, Any]:
    if not isinstance(content, str | list):
        raise InvalidRequestError("content is a string or a list of parts", code="prompt")
    body: dict[str, Any] = {"content": content}
    if queue:
        body["queue"] = True
    return body


@dataclass(frozen=True)
class RunInfo:
    """A run's status as the server reports it (``GET /runs/{id}``)."""

    run_id: str
    session_id: str
    status: str
    stop_reason: str | None
    usage: dict[str, int]
    error: str | None
    result: RunResult | None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def active(self) -> bool:
        return self.status in ("pending", "queued", "running")

    @classmethod
    def from_json(cls, data: Any) -> RunInfo:
        if not isinstance(data, dict) or "run_id" not in data or "status" not in data:
            raise ProtocolError("a run answer without run_id and status")
        result = None
        if isinstance(data.get("result"), dict):
            payload = data["result"]
            result = RunResult(
                run_id=data["run_id"],
                text=str(payload.get("text") or ""),
                stop_reason=str(payload.get("stop")),
                usage=dict(payload.get("usage") or {}),
                error=payload.get("error"),
                run_ids=(data["run_id"],),
            )
        return cls(
            run_id=data["run_id"],
            session_id=str(data.get("session_id", "")),
            status=data["status"],
            stop_reason=data.get("stop_reason"),
            usage=dict(data.get("usage") or {}),
            error=data.get("error"),
            result=result,
            raw=data,
        )


@dataclass(frozen=True)
class SessionPage:
    sessions: list[Snapshot]
    count: int
    next_offset: int | None

    @classmethod
    def from_json(cls, data: Any) -> SessionPage:
        if not isinstance(data, dict) or not isinstance(data.get("sessions"), list):
            raise ProtocolError("a session list without sessions")
        return cls(
            [Snapshot.from_json(s) for s in data["sessions"]], int(data.get("count", 0)), data.get("next_offset")
        )

    def __iter__(self) -> Any:
        return iter(self.sessions)

    def __len__(self) -> int:
        return len(self.sessions)
