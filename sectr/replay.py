"""Replay: a session's user turns run again by another agent version, without side effects.

A replay session is created with `replay: {"source": <session id>, "live_reads"?: bool}`
in its SESSION_CREATED. It receives the source's user messages in order, one run per
message (the Django app queues them as pending runs; see docs/experiments.md). While it
runs, every tool it may call is wrapped in a `ReplayTool`:

- a call whose name and arguments (compared as JSON values) equal a call the source made
  in the same turn gets that call's recorded result, verbatim, error or not, and nothing
  runs. Each recorded call answers once; within a turn, the order does not matter;
- a call of a read-only tool (neither gated nor mutating) runs for real when the replay
  allows live reads;
- any other call is a divergence (`ReplayDiverged`): the invocation ends with
  `stop_reason: "diverged"` and `divergence: {name, arguments, turn}`, the call unrun,
  and every later turn of the replay ends at once (`stop_reason: "replay_stopped"`).

A recorded result keeps its `media` (the references to the images and audio the source's
call stored): the replay's TOOL_RESULT journals them as the source's did, so the bytes
are shared, never copied (the server links them to the replay session when it creates
it, so the replay's readers see them; docs/experiments.md).

A replay never asks: its tools are ungated, since a person's recorded decision is part
of the recorded result (a denial's error text, an edited call's prefix, a response).

A turn is what follows one user message (an INVOCATION_STARTED with reason
`user_message`), up to the next: calls the source made after approvals, retries and
recoveries of that turn all belong to it. Steers are not replayed (they answer a run as
it happened, not a message the agent is given).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sectr.errors import ReplayDiverged
from sectr.events import Envelope, EventType
from sectr.tools import Tool, ToolContext, ToolRegistry

__all__ = [
    "RecordedCall",
    "RecordedResult",
    "RecordedTurn",
    "ReplayPlan",
    "ReplayTool",
    "recorded_turns",
    "replay_registry",
]

#: The stop reasons of a replay's invocations.
DIVERGED = "diverged"
REPLAY_STOPPED = "replay_stopped"


def _arguments_value(arguments: Any) -> Any:
    """The JSON value of a call's arguments (the model's text, or an object already)."""
    if isinstance(arguments, str):
        try:
            return json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            return arguments  # compared as text: only the same text matches
    return arguments


@dataclass(frozen=True)
class RecordedCall:
    name: str
    arguments: Any
    content: str
    is_error: bool = False
    media: tuple[dict[str, Any], ...] = ()


def _result_media(payload: dict[str, Any]) -> tuple[dict[str, Any], ...]:
    media = payload.get("media")
    return tuple(dict(item) for item in media if isinstance(item, dict)) if isinstance(media, list) else ()


@dataclass
class RecordedTurn:
    """One user message of the source and the calls that answered it, in journal order."""

    content: Any
    calls: list[RecordedCall] = field(default_factory=list)


def is_user_turn(envelope: Envelope) -> bool:
    return (
        envelope.type is EventType.INVOCATION_STARTED
        and (envelope.payload.get("reason") or {}).get("kind") == "user_message"
    )


def recorded_turns(envelopes: Iterable[Envelope]) -> list[RecordedTurn]:
    """The source's user turns with the calls each got a result for (a call never
    answered, cut off by a crash with no result since, records nothing)."""
    turns: list[RecordedTurn] = []
    open_calls: dict[str, tuple[int, str, Any]] = {}
    for envelope in envelopes:
        payload = envelope.payload
        if is_user_turn(envelope):
            reason = payload.get("reason") or {}
            turns.append(RecordedTurn((reason.get("input") or {}).get("content")))
        elif envelope.type is EventType.TOOL_CALL and turns:
            call_id = payload.get("tool_call_id")
            if call_id:
                open_calls[call_id] = (
                    len(turns) - 1,
                    payload.get("name", ""),
                    _arguments_value(payload.get("arguments")),
                )
        elif envelope.type is EventType.TOOL_RESULT:
            found = open_calls.pop(payload.get("tool_call_id") or "", None)
            if found is not None:
                index, name, arguments = found
                content, is_error = str(payload.get("content", "")), bool(payload.get("is_error"))
                call = RecordedCall(name, arguments, content, is_error, _result_media(payload))
                turns[index].calls.append(call)
    return turns


@dataclass(frozen=True)
class RecordedResult:
    """A tool's answer taken verbatim from the source: the context journals its content,
    error flag and media as they are (no `Error: ...` wrapping)."""

    content: str
    is_error: bool
    media: tuple[dict[str, Any], ...] = ()


class ReplayPlan:
    """What one invocation of a replay session may answer: the recorded calls of its
    turn that earlier invocations of the same turn have not used yet."""

    def __init__(self, turn: int, calls: Sequence[RecordedCall], *, live_reads: bool = False) -> None:
        self.turn = turn  # 1-based, as people count
        self.remaining = list(calls)
        self.live_reads = live_reads

    @classmethod
    def for_invocation(
        cls, source: Sequence[Envelope], transcript: Sequence[Envelope], turn: int, *, live_reads: bool = False
    ) -> ReplayPlan:
        """The plan of the replay's turn `turn` (1-based), `transcript` its envelopes
        so far: calls already answered in this turn (before a crash) are used up."""
        turns = recorded_turns(source)
        calls = turns[turn - 1].calls if 0 < turn <= len(turns) else []
        plan = cls(turn, calls, live_reads=live_reads)
        start = None
        for index in range(len(transcript) - 1, -1, -1):
            if is_user_turn(transcript[index]):
                start = index
                break
        if start is not None:
            asked: dict[str, tuple[str, Any]] = {}
            for envelope in transcript[start:]:
                payload = envelope.payload
                if envelope.type is EventType.TOOL_CALL:
                    asked[payload.get("tool_call_id") or ""] = (
                        payload.get("name", ""),
                        _arguments_value(payload.get("arguments")),
                    )
                elif envelope.type is EventType.TOOL_RESULT and payload.get("tool_call_id") in asked:
                    plan.take(*asked.pop(payload["tool_call_id"]))
        return plan

    def take(self, name: str, arguments: Any) -> RecordedCall | None:
        for index, call in enumerate(self.remaining):
            if call.name == name and call.arguments == arguments:
                return self.remaining.pop(index)
        return None


def is_read_only(tool: Tool) -> bool:
    return not tool.gated and not tool.mutating


class ReplayTool(Tool):
    """A tool of a replay session: the recorded result, a live read, or a divergence."""

    def __init__(self, original: Tool, plan: ReplayPlan) -> None:  # noqa: D107 - see the class
        # The original's schema, name, description and argument checks, unchanged: the
        # candidate sees exactly the tool it would see outside a replay.
        self.__dict__.update(original.__dict__)
        self.original = original
        self.plan = plan
        self.gated = False  # a replay never asks: a recorded decision answers
        self.idempotent = True  # nothing runs that a crash could cut off
        self.is_async = False
        self.fn = self._answer

    def bind(self, arguments: dict[str, Any], context: ToolContext | None = None) -> dict[str, Any]:
        bound = self.original.bind(arguments, context)  # the same argument errors as outside
        return {"bound": bound, "arguments": dict(arguments)}

    def _recorded(self, arguments: dict[str, Any]) -> RecordedResult | None:
        call = self.plan.take(self.name, arguments)
        if call is not None:
            return RecordedResult(call.content, call.is_error, call.media)
        if self.plan.live_reads and is_read_only(self.original):
            return None
        raise ReplayDiverged(self.name, arguments, self.plan.turn)

    def _answer(self, bound: dict[str, Any], arguments: dict[str, Any]) -> Any:
        """The synchronous path (`ctx.execute` in a handler's thread or on the loop)."""
        recorded = self._recorded(arguments)
        if recorded is not None:
            return recorded
        if self.original.is_async:
            raise ReplayDiverged(self.name, arguments, self.plan.turn)  # cannot run it here
        return self.original.fn(**bound)

    async def invoke(self, kwargs: dict[str, Any]) -> Any:
        recorded = self._recorded(kwargs["arguments"])
        if recorded is not None:
            return recorded
        return await self.original.invoke(kwargs["bound"])


def replay_registry(tools: ToolRegistry, plan: ReplayPlan) -> ToolRegistry:
    return ToolRegistry(ReplayTool(tool, plan) for tool in tools)
