"""Exceptions shared by the core, the Django actions, the API and the SDK."""

from __future__ import annotations

from typing import Any


class ApprovalRequired(Exception):  # noqa: N818 - the public name handlers catch (docs/sessions.md)
    """Raised inside a handler when a gated action needs a person's decision.

    The runtime catches it, journals APPROVAL_REQUESTED + INVOCATION_SUSPENDED and ends
    the invocation. A handler must let it propagate.
    """

    def __init__(
        self,
        name: str,
        arguments: dict[str, Any],
        tool_call_id: str | None = None,
        *,
        terms: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(f"approval required for {name}")
        self.name = name
        self.arguments = arguments
        self.tool_call_id = tool_call_id
        #: What the matching rule adds to the ask: rule_id, approvals_required, expires_after_s.
        self.terms: dict[str, Any] | None = terms


class ApprovalDenied(PermissionError):
    """Executing the pending call of an ask that was denied."""

    def __init__(self, name: str, note: str | None = None) -> None:
        super().__init__(f"{name} was denied" + (f": {note}" if note else ""))
        self.name = name
        self.note = note


class InvocationCancelled(Exception):  # noqa: N818
    """Raised at a model-step boundary when the run was cancelled."""


class SteerArrived(Exception):  # noqa: N818
    """A journal refused a run's INVOCATION_COMPLETED because a steer is parked for it.

    The steer was accepted while the run was ending; rather than lose it, the runtime
    calls the handler again, whose first step boundary journals and answers it.
    """


class LeaseLost(Exception):  # noqa: N818
    """A journal write by a worker whose lease was taken over (fenced)."""


class JournalUnavailable(Exception):  # noqa: N818
    """The journal could not be written or read: its store went away (a database
    restart, a lost connection). Not the invocation's failure, so none is journaled: the
    invocation stops where it is, and its worker lets the run be recovered (crash
    stitching continues it from what the journal holds)."""


class ProviderError(Exception):
    """A model provider failed. `retryable` is True for 429, 5xx and connection errors."""

    def __init__(self, message: str, *, retryable: bool, status: int | None = None) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.status = status


class SectrError(Exception):
    """A refused operation with a stable machine-readable code and an HTTP status."""

    code = "error"
    status = 400

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        status: int | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        #: More fields of the API's error object (e.g. `decided_by` of ask_not_pending).
        self.extra: dict[str, Any] = dict(extra or {})
        if code is not None:
            self.code = code
        if status is not None:
            self.status = status


class ValidationFailed(SectrError):
    code = "invalid"
    status = 400


class NotFound(SectrError):
    code = "not_found"
    status = 404


class Forbidden(SectrError):
    code = "forbidden"
    status = 403


class SessionBusy(SectrError):
    code = "session_busy"
    status = 409


class AskNotPending(SectrError):
    code = "ask_not_pending"
    status = 409


class AlreadyVoted(SectrError):
    """A second vote by the same person on an ask that needs several approvers."""

    code = "already_voted"
    status = 409


class StaleRunControl(SectrError):
    code = "stale_run_control"
    status = 409


class RetryIneligible(SectrError):
    code = "failed_step_retry_ineligible"
    status = 409


class NotAtTurnBoundary(SectrError):
    code = "not_at_turn_boundary"
    status = 412


class TooLarge(SectrError):
    code = "too_large"
    status = 413


class ReplayDiverged(Exception):  # noqa: N818
    """A replayed session's agent made a call the source session never made at that point
    (sectr.replay): the replay stops there, the call unrun, and the divergence is journaled
    in the invocation's end (`stop_reason: "diverged"`)."""

    def __init__(self, name: str, arguments: dict[str, Any], turn: int) -> None:
        super().__init__(f"would call {name} {_short_json(arguments)} (turn {turn}), which the source session did not")
        self.name = name
        self.arguments = arguments
        self.turn = turn

    def payload(self) -> dict[str, Any]:
        return {"name": self.name, "arguments": self.arguments, "turn": self.turn}


def _short_json(value: Any, limit: int = 200) -> str:
    import json

    text = json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"
