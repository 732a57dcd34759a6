"""The SDK's IO-free pieces and the envelope -> SDK event mapping, without a server."""

from __future__ import annotations

import json
from typing import Any

import pytest

from sectr.client import errors
from sectr.client.models import RunEvent
from sectr.client.protocol import RunFollower, SSEDecoder, run_event_from_sse
from sectr.events import Envelope, EventType
from sessions_app.api.events import RunEvents, format_sse

E = EventType


def env(seq: int, type: EventType, payload: dict[str, Any], inv: str | None = "inv_1") -> Envelope:
    return Envelope("ses_1", seq, inv, type, payload)


def user_start(seq: int, inv: str = "inv_1") -> Envelope:
    return env(seq, E.INVOCATION_STARTED, {"reason": {"kind": "user_message", "input": {"content": "hi"}}}, inv)


# ---- envelopes -> SDK events ----


def test_it_maps_every_envelope_of_a_run_to_its_sdk_event() -> None:
    tracker = RunEvents("run_1", {"inv_1"}, start_seq=3)
    journal = [
        env(1, E.SESSION_CREATED, {"mode": "default", "model": "demo"}, None),
        env(2, E.SESSION_UPDATED, {"title": "hi", "title_source": "prompt"}, None),
        user_start(3),
        env(4, E.MESSAGE_START, {"message_id": "m1", "role": "assistant", "model": "demo"}),
        env(5, E.MESSAGE_DELTA, {"message_id": "m1", "reasoning": "thinking", "text": "Let me "}),
        env(6, E.TOOL_CALL, {"message_id": "m1", "tool_call_id": "c1", "name": "get_time", "arguments": "{}"}),
        env(7, E.MESSAGE_END, {"message_id": "m1", "usage": {"input_tokens": 3, "output_tokens": 2}}),
        env(8, E.TOOL_RESULT, {"tool_call_id": "c1", "name": "get_time", "content": "noon"}),
        env(9, E.STEER_RECEIVED, {"text": "be brief", "author": "alice"}),
        env(10, E.MESSAGE_START, {"message_id": "m2", "role": "assistant"}),
        env(11, E.MESSAGE_DELTA, {"message_id": "m2", "text": "Noon."}),
        env(12, E.MESSAGE_END, {"message_id": "m2", "usage": {"input_tokens": 5, "output_tokens": 1}}),
        env(13, E.SESSION_UPDATED, {"mode": "plan"}, None),  # not a title: not the run's
        env(14, E.INVOCATION_COMPLETED, {"stop_reason": "end_turn", "usage": {"input_tokens": 8, "output_tokens": 3}}),
        env(15, E.INVOCATION_STARTED, {"reason": {"kind": "user_message", "input": {"content": "x"}}}, "inv_2"),
    ]
    events = tracker.feed_all(journal)
    assert [(e["seq"], e["kind"]) for e in events] == [
        (2, "session.title"),
        (4, "turn.start"),
        (5, "reasoning.delta"),
        (5, "message.delta"),
        (6, "tool.call"),
        (7, "turn.end"),
        (8, "tool.result"),
        (9, "steer"),
        (10, "turn.start"),
        (11, "message.delta"),
        (12, "turn.end"),
        (14, "result"),
    ]
    assert events[2]["text"] == "thinking" and events[3]["text"] == "Let me "
    assert events[7]["text"] == "be brief" and events[7]["payload"] == {"author": "alice"}
    assert events[-1]["payload"] == {
        "stop": "end_turn",
        "text": "Noon.",
        "usage": {"input_tokens": 8, "output_tokens": 3},
        "error": None,
    }
    assert tracker.finished and tracker.status == "completed"
    assert tracker.feed(journal[-1]) == [], "nothing after the result"


def test_a_suspended_run_ends_with_the_ask_and_an_awaiting_result() -> None:
    tracker = RunEvents("run_1", {"inv_1"}, start_seq=1)
    ask = {"ask_id": "ask_1", "tool_call_id": "c1", "name": "write_note", "arguments": {"title": "t"}}
    events = tracker.feed_all(
        [user_start(1), env(2, E.APPROVAL_REQUESTED, ask), env(3, E.INVOCATION_SUSPENDED, {"ask_id": "ask_1"})]
    )
    assert [e["kind"] for e in events] == ["permission.ask", "result"]
    assert events[0]["payload"] == {**ask, "may_have_run": False}
    assert events[1]["payload"]["stop"] == "awaiting_approval" and events[1]["payload"]["ask"] == events[0]["payload"]
    assert tracker.status == "suspended"


def test_a_re_ask_after_a_crash_says_the_call_may_have_run() -> None:
    tracker = RunEvents("run_1", {"inv_1"}, start_seq=1)
    ask = {"ask_id": "ask_2", "tool_call_id": "c1", "name": "write_note", "arguments": {}, "may_have_run": True}
    events = tracker.feed_all(
        [user_start(1), env(2, E.APPROVAL_REQUESTED, ask), env(3, E.INVOCATION_SUSPENDED, {"ask_id": "ask_2"})]
    )
    assert events[0]["payload"]["may_have_run"] is True and events[1]["payload"]["ask"]["may_have_run"] is True


def test_the_resumed_run_starts_with_the_approval() -> None:
    tracker = RunEvents("run_2", {"inv_2"}, start_seq=5)
    reason = {"kind": "approval_decision", "ask_id": "ask_1", "decision": {"approved": True, "verdict": "allow_once"}}
    (event,) = tracker.feed(env(5, E.INVOCATION_STARTED, {"reason": reason}, "inv_2"))
    assert event["kind"] == "approval" and event["payload"] == {
        "ask_id": "ask_1",
        "approved": True,
        "verdict": "allow_once",
    }


def test_a_recover_invocation_continues_the_run_and_its_answer() -> None:
    tracker = RunEvents("run_1", {"inv_1"}, start_seq=1)
    events = tracker.feed_all(
        [
            user_start(1),
            env(2, E.MESSAGE_START, {"message_id": "m1"}),
            env(3, E.MESSAGE_DELTA, {"message_id": "m1", "text": "tick 1 "}),
            env(4, E.SESSION_ERROR, {"error": "worker lost", "message_id": "m1", "retryable": True}),
            env(5, E.INVOCATION_STARTED, {"reason": {"kind": "recover", "of_invocation_id": "inv_1"}}, "inv_9"),
            env(6, E.MESSAGE_START, {"message_id": "m2"}, "inv_9"),
            env(7, E.MESSAGE_DELTA, {"message_id": "m2", "text": "tick 2 "}, "inv_9"),
            env(8, E.MESSAGE_END, {"message_id": "m2", "usage": {"input_tokens": 1, "output_tokens": 2}}, "inv_9"),
            env(9, E.INVOCATION_FAILED, {"error": "boom", "retryable": True}, "inv_9"),
        ]
    )
    assert [e["kind"] for e in events] == [
        "turn.start",
        "message.delta",
        "recover_notice",
        "turn.start",
        "message.delta",
        "turn.end",
        "result",
    ]
    assert events[2]["payload"] == {"invocation_id": "inv_9", "of_invocation_id": "inv_1"}
    assert events[-1]["payload"]["text"] == "tick 1 tick 2 ", "a stitched message is one answer"
    assert events[-1]["payload"]["stop"] == "error" and events[-1]["payload"]["error"] == "boom"
    assert tracker.invocation_ids == {"inv_1", "inv_9"}


def test_an_sse_frame_carries_the_seq_the_kind_and_the_event() -> None:
    event = {"kind": "message.delta", "run_id": "run_1", "seq": 7, "text": "line\nbreak ünï", "payload": {}}
    frame = format_sse(event)
    assert frame.startswith(b"id: 7\nevent: message.delta\ndata: ") and frame.endswith(b"\n\n")
    (parsed,) = SSEDecoder().feed(frame)
    assert (parsed.id, parsed.event, json.loads(parsed.data)) == ("7", "message.delta", event)


def test_an_sse_frames_data_is_the_compact_json_of_the_event_byte_for_byte() -> None:
    payload = {"u": 'é\u2028\x00"\\', "f": [1.5, -0.0, 1e300, float("inf")], "n": None, "b": True, "d": {"k": []}}
    event = {"kind": "tool.result", "run_id": "run_1", "seq": None, "text": None, "payload": payload}
    expected = "event: tool.result\ndata: " + json.dumps(event, separators=(",", ":"), ensure_ascii=False) + "\n\n"
    assert format_sse(event) == expected.encode()


# ---- the client side ----


def test_the_decoder_handles_chunks_comments_crlf_and_multiline_data() -> None:
    decoder = SSEDecoder()
    stream = b": ping\r\n\r\nid: 3\r\nevent: x\r\ndata: a\r\ndata: b\r\n\r\nid: 4\ndata: c\n\n"
    events = [e for i in range(len(stream)) for e in decoder.feed(stream[i : i + 1])]
    assert [(e.id, e.event, e.data) for e in events] == [("3", "x", "a\nb"), ("4", "message", "c")]


def event(seq: int | None, kind: str = "message.delta", run_id: str = "run_1", **payload: Any) -> RunEvent:
    return RunEvent(kind, run_id, seq, "t" if kind.endswith("delta") else None, payload)


def test_the_follower_resumes_inside_an_envelope_without_loss_or_repeat() -> None:
    follower = RunFollower("run_1")
    assert follower.resume_headers() == {}
    delivered = [follower.accept(e).deliver for e in (event(4), event(5, "reasoning.delta"))]
    assert all(delivered)
    # Cut after the first of seq 5's two events: resume from seq 5 and skip what was seen.
    assert follower.resume_headers() == {"Last-Event-ID": "4"}
    replay = [event(5, "reasoning.delta"), event(5, "message.delta"), event(6, "turn.end")]
    steps = [follower.accept(e) for e in replay]
    assert [s.deliver.kind if s.deliver else None for s in steps] == [None, "message.delta", "turn.end"]
    assert follower.resume_headers() == {"Last-Event-ID": "5"}
    assert follower.accept(event(6, "turn.end")).deliver is None
    done = follower.accept(event(7, "result", stop="end_turn", text="ok", usage={"output_tokens": 2}))
    assert done.done and follower.result is not None and follower.result.text == "ok"
    assert follower.result.usage == {"output_tokens": 2}


def test_the_follower_moves_on_to_the_resumed_run() -> None:
    follower = RunFollower("run_1")
    follower.accept(event(3, "permission.ask", ask_id="ask_1", name="write_note", arguments={}))
    step = follower.accept(event(4, "result", stop="awaiting_approval", text="", usage={"input_tokens": 1}))
    assert step.done and step.ask is not None and step.ask.ask_id == "ask_1" and step.deliver is None
    assert not follower.after_ask(), "nobody answered: the run ends awaiting approval"
    follower.resumed("run_2")
    assert follower.after_ask() and follower.run_id == "run_2" and follower.resume_headers() == {}
    follower.accept(event(5, "approval", run_id="run_2"))
    follower.accept(event(9, "result", run_id="run_2", stop="end_turn", text="done", usage={"input_tokens": 2}))
    assert follower.result is not None
    assert (follower.result.run_id, follower.result.run_ids) == ("run_2", ("run_1", "run_2"))
    assert follower.result.usage == {"input_tokens": 3}
    with pytest.raises(errors.ProtocolError):
        follower.accept(event(10, run_id="run_other"))


@pytest.mark.parametrize(
    ("status", "code", "kind"),
    [
        (401, "invalid_token", errors.AuthenticationError),
        (403, "forbidden", errors.PermissionDeniedError),
        (404, "not_found", errors.NotFoundError),
        (409, "session_busy", errors.SessionBusyError),
        (409, "awaiting_approval", errors.SessionBusyError),
        (409, "ask_not_pending", errors.AskAlreadyResolvedError),
        (409, "stale_run_control", errors.InvalidStateError),
        (409, "failed_step_retry_ineligible", errors.InvalidStateError),
        (412, "not_at_turn_boundary", errors.InvalidStateError),
        (400, "url", errors.PromptValidationError),
        (413, "too_large", errors.PromptValidationError),
        (400, "invalid_title", errors.InvalidRequestError),
        (429, "rate_limited", errors.RateLimitError),
        (500, "internal_error", errors.SectrError),
    ],
)
def test_error_answers_become_typed_errors(status: int, code: str, kind: type[errors.SectrError]) -> None:
    body = json.dumps({"error": {"code": code, "message": "m"}}).encode()
    error = errors.error_from_response(status, body, {"retry-after": "7"})
    assert type(error) is kind and (error.code, error.status, error.message) == (code, status, "m")
    if isinstance(error, errors.RateLimitError):
        assert error.retry_after == 7.0


def test_answers_that_break_the_protocol_raise_protocol_errors() -> None:
    assert isinstance(errors.error_from_response(404, b"<html>"), errors.ProtocolError)
    with pytest.raises(errors.ProtocolError):
        run_event_from_sse(SSEDecoder().feed(b"event: result\ndata: {not json\n\n")[0])
    with pytest.raises(errors.ProtocolError):
        run_event_from_sse(
            SSEDecoder().feed(b'event: result\ndata: {"kind": "turn.end", "run_id": "r", "payload": {}}\n\n')[0]
        )
