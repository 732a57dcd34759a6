"""Run events as clients see them: journal envelopes mapped to SDK event kinds (docs/sdk.md).

A run's events are the envelopes of its invocation(s), in journal order. `RunEvents`
follows one run through its session's journal envelope by envelope (the SSE endpoint
feeds it replayed and live envelopes alike, `GET /runs/{id}` feeds it the journal) and
turns each envelope into at most a couple of SDK events:

=====================  ==========================================================
envelope               SDK event kind
=====================  ==========================================================
INVOCATION_STARTED     ``approval`` (reason approval_decision), ``recover_notice``
                       (reason recover: a crashed invocation continues this run);
                       nothing for user_message and retry
MESSAGE_START / END    ``turn.start`` / ``turn.end`` (one model step)
MESSAGE_DELTA          ``reasoning.delta`` and/or ``message.delta`` (``text``)
TOOL_CALL / RESULT     ``tool.call`` / ``tool.result`` (with ``media``, each stored
                       image or audio's reference and API ``url``, when it has any)
TOOL_STARTED           nothing (it tells crash recovery a call may have taken effect)
APPROVAL_REQUESTED     ``permission.ask``; ``approval`` when a rule decided it at once
                       (its ``decision``, approver ``rule:<id>``)
APPROVAL_VOTED         nothing (a vote belongs to no run; the deciding vote's run
                       starts with ``approval``)
STEER_RECEIVED         ``steer``
TRANSCRIPT_COMPACTED   ``compaction`` (summary and counts, not the messages)
SESSION_UPDATED title  ``session.title`` (the title the run's prompt set, or a rename
                       while it runs)
SESSION_ERROR          nothing (a ``recover_notice`` follows when a worker crashed)
terminal envelope      ``result``, always last: ``{"stop", "text", "usage", "error"}``
=====================  ==========================================================

An SDK event is a JSON-ready dict ``{"kind", "run_id", "seq", "text", "payload"}``
(``text`` is set for deltas, steers and the result, else None). The mapping is a pure
function of the journal, so a replay produces exactly the events a live reader saw:
that is what makes `Last-Event-ID` resumption exact.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from json.encoder import c_make_encoder, encode_basestring  # type: ignore[attr-defined]
from typing import Any

from sectr.events import Envelope, EventType, add_usage, usage_dict
from sessions_app.display.content import api_result_media

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

#: The stop reason of a run that ends on each terminal envelope (COMPLETED carries its own).
TERMINAL_STOP = {
    EventType.INVOCATION_SUSPENDED: "awaiting_approval",
    EventType.INVOCATION_FAILED: "error",
    EventType.INVOCATION_CANCELLED: "cancelled",
}

#: Run.status for each terminal envelope.
TERMINAL_STATUS = {
    EventType.INVOCATION_COMPLETED: "completed",
    EventType.INVOCATION_SUSPENDED: "suspended",
    EventType.INVOCATION_FAILED: "failed",
    EventType.INVOCATION_CANCELLED: "cancelled",
}


def sdk_event(
    kind: str, run_id: str, seq: int | None, payload: dict[str, Any], text: str | None = None
) -> dict[str, Any]:
    return {"kind": kind, "run_id": run_id, "seq": seq, "text": text, "payload": payload}


def result_payload(
    stop: str, text: str, usage: dict[str, int], error: str | None, ask: dict[str, Any] | None = None
) -> dict[str, Any]:
    # The Usage shape always (input and output tokens, zeros for a run with no model step).
    payload: dict[str, Any] = {"stop": stop, "text": text, "usage": add_usage(usage_dict(), usage), "error": error}
    if ask is not None:
        payload["ask"] = ask
    return payload


@dataclass
class RunEvents:
    """One run's view of its session's journal (see the module docstring).

    Feed it the session's envelopes in seq order from ``start_seq - 1`` on (envelopes of
    other invocations are ignored). `finished` turns True at the run's terminal envelope,
    whose `result` event is the last one it yields; `result` then holds its payload.
    """

    run_id: str
    invocation_ids: set[str]
    start_seq: int
    finished: bool = False
    status: str | None = None  # Run status at the end ("completed", "suspended", ...)
    result: dict[str, Any] | None = None
    usage: dict[str, int] = field(default_factory=dict)
    last_text: str = ""  # the run's answer: the newest assistant text (see _answer)
    #: Text of the current answer: one assistant message, or several when a crash or a
    #: provider error cut a message short and the next one continues it (crash stitching).
    _answer: str = ""
    _stitched: bool = False
    _pending_ask: dict[str, Any] | None = None

    def belongs(self, envelope: Envelope) -> bool:
        if envelope.invocation_id in self.invocation_ids:
            return True
        if envelope.type is EventType.INVOCATION_STARTED:
            reason = envelope.payload.get("reason") or {}
            # A recover invocation continues the run whose invocation crashed.
            return reason.get("kind") == "recover" and reason.get("of_invocation_id") in self.invocation_ids
        return (
            envelope.type is EventType.SESSION_UPDATED
            and envelope.invocation_id is None
            and "title" in envelope.payload
            and envelope.seq >= self.start_seq - 1  # the run's prompt titles the session just before it
        )

    def feed(self, envelope: Envelope) -> list[dict[str, Any]]:
        """The SDK events of one envelope (none when it is not this run's)."""
        if self.finished or not self.belongs(envelope):
            return []
        if envelope.invocation_id is not None:
            self.invocation_ids.add(envelope.invocation_id)
        return self._map(envelope)

    def feed_all(self, envelopes: Iterable[Envelope]) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        for envelope in envelopes:
            events.extend(self.feed(envelope))
            if self.finished:
                break
        return events

    def _event(self, kind: str, envelope: Envelope, payload: dict[str, Any], text: str | None = None) -> dict[str, Any]:
        return sdk_event(kind, self.run_id, envelope.seq, payload, text)

    def _map(self, env: Envelope) -> list[dict[str, Any]]:
        p = env.payload
        t = env.type
        if t is EventType.INVOCATION_STARTED:
            reason = p.get("reason") or {}
            if reason.get("kind") == "approval_decision":
                decision = reason.get("decision") or {}
                return [self._event("approval", env, {"ask_id": reason.get("ask_id"), **decision})]
            if reason.get("kind") == "recover":
                payload = {"invocation_id": env.invocation_id, "of_invocation_id": reason.get("of_invocation_id")}
                return [self._event("recover_notice", env, payload)]
            return []
        if t is EventType.MESSAGE_START:
            if not self._stitched:
                self._answer = ""
            self._stitched = False
            return [self._event("turn.start", env, {"message_id": p.get("message_id"), "model": p.get("model")})]
        if t is EventType.MESSAGE_DELTA:
            events = []
            message_id = p.get("message_id", "")
            if p.get("reasoning"):
                events.append(self._event("reasoning.delta", env, {"message_id": message_id}, p["reasoning"]))
            if p.get("text"):
                self._answer += p["text"]
                self.last_text = self._answer
                events.append(self._event("message.delta", env, {"message_id": message_id}, p["text"]))
            return events
        if t is EventType.MESSAGE_END:
            if p.get("usage"):
                self.usage = add_usage(self.usage, p["usage"])
            payload = {
                "message_id": p.get("message_id"),
                "finish_reason": p.get("finish_reason"),
                "usage": p.get("usage"),
            }
            return [self._event("turn.end", env, payload)]
        if t is EventType.TOOL_CALL:
            keys = ("message_id", "tool_call_id", "name", "arguments")
            return [self._event("tool.call", env, {k: p.get(k) for k in keys})]
        if t is EventType.TOOL_RESULT:
            payload = {k: p.get(k) for k in ("tool_call_id", "name", "content")}
            payload["is_error"] = bool(p.get("is_error"))
            if p.get("media"):  # stored images and audio: references, with where to fetch them
                payload["media"] = api_result_media(p["media"], env.session_id)
            return [self._event("tool.result", env, payload)]
        if t is EventType.APPROVAL_REQUESTED:
            if isinstance(p.get("decision"), dict):
                # A rule decided it at once (sectr.rules): an approval, never a question
                # a responder should answer; the run goes on.
                payload = {
                    "ask_id": p.get("ask_id"),
                    "name": p.get("name"),
                    "rule_id": p.get("rule_id"),
                    **p["decision"],
                }
                return [self._event("approval", env, payload)]
            keys = ("ask_id", "tool_call_id", "name", "arguments")
            self._pending_ask = {k: p.get(k) for k in keys}
            self._pending_ask["may_have_run"] = bool(p.get("may_have_run"))
            for key in ("rule_id", "approvals_required", "expires_after_s"):
                if p.get(key) is not None:
                    self._pending_ask[key] = p[key]
            return [self._event("permission.ask", env, dict(self._pending_ask))]
        if t is EventType.STEER_RECEIVED:
            return [self._event("steer", env, {"author": p.get("author")}, p.get("text", ""))]
        if t is EventType.TRANSCRIPT_COMPACTED:
            payload = {
                "summary": p.get("summary"),
                "through_seq": p.get("through_seq"),
                "message_count": len(p.get("messages") or []),
            }
            return [self._event("compaction", env, payload)]
        if t is EventType.SESSION_UPDATED:
            return [self._event("session.title", env, {"title": p["title"], "source": p.get("title_source")})]
        if t in TERMINAL_STATUS:
            return [self._finish(env)]
        if t is EventType.SESSION_ERROR and p.get("message_id"):
            self._stitched = True  # the next message continues the one cut short
        return []  # SESSION_ERROR, SESSION_CREATED: no event of their own

    def _finish(self, env: Envelope) -> dict[str, Any]:
        self.finished = True
        self.status = TERMINAL_STATUS[env.type]
        stop = env.payload.get("stop_reason") or TERMINAL_STOP.get(env.type, "end_turn")
        error = env.payload.get("error") if env.type is EventType.INVOCATION_FAILED else None
        ask = self._pending_ask if env.type is EventType.INVOCATION_SUSPENDED else None
        self.result = result_payload(stop, self.last_text, dict(self.usage), error, ask)
        return self._event("result", env, self.result, self.last_text)


#: json.dumps with these options makes a new encoder per call, and so does a JSONEncoder's
#: encode (its C encoder, built again on each call with the same options); a frame per
#: streamed chunk per client makes that worth keeping the C encoder itself (the same one
#: encode builds, without the circular-reference check, for JSON-ready trees), about a
#: third of format_sse's CPU. Without the C accelerator, the JSONEncoder's encode as before.
_json_encoder = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, check_circular=False)
if c_make_encoder is not None:
    _c_encode = c_make_encoder(
        None, _json_encoder.default, encode_basestring, None, ":", ",", False, False, _json_encoder.allow_nan
    )

    def _encode_json(value: dict[str, Any]) -> str:
        return "".join(_c_encode(value, 0))

else:  # pragma: no cover - CPython builds have the accelerator

    def _encode_json(value: dict[str, Any]) -> str:
        return _json_encoder.encode(value)


def format_sse(event: dict[str, Any]) -> bytes:
    """One SSE frame: ``id`` is the envelope seq, ``event`` the kind, ``data`` the event."""
    seq = event.get("seq")
    head = f"event: {event['kind']}\ndata: " if seq is None else f"id: {seq}\nevent: {event['kind']}\ndata: "
    return (head + _encode_json(event) + "\n\n").encode()
