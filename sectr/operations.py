"""The session rules of docs/sessions.md as pure functions: check a SessionState, build events.

`check_*` raise a typed SectrError and write nothing; `*_events` return the NewEvents one
atomic append must write. LocalRuntime and the Django actions both call these, so each
rule exists once.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from sectr.agents import AgentSpec
from sectr.context import CANCELLED_TOOL_CONTENT
from sectr.errors import (
    AlreadyVoted,
    AskNotPending,
    Forbidden,
    NotAtTurnBoundary,
    RetryIneligible,
    SessionBusy,
    StaleRunControl,
    ValidationFailed,
)
from sectr.events import (
    DECISION_SCOPES,
    EDITED_ARGUMENTS_MAX,
    IMPORTED_PREFIX,
    MODES,
    RESPONSE_MAX,
    VERDICTS,
    Envelope,
    EventType,
    approval_decision_reason,
    recover_reason,
    retry_reason,
)
from sectr.fold import fold_messages
from sectr.journal import NewEvent, new_id
from sectr.rules import EXPIRED_APPROVER
from sectr.state import DEFAULT_LIMITS, LIMIT_KEYS, TITLE_MAX, SessionState, clamp_title, prompt_text

REASONING_EFFORTS = ("minimal", "low", "medium", "high")


# ---- validation of settings ----


def check_title(title: Any) -> str:
    if not isinstance(title, str) or not title.strip():
        raise ValidationFailed("title is required (1-120 characters)", code="invalid_title")
    title = " ".join(title.split())
    if len(title) > TITLE_MAX:
        raise ValidationFailed(f"title is longer than {TITLE_MAX} characters", code="invalid_title")
    return title


def check_mode_value(mode: Any) -> str:
    if mode not in MODES:
        raise ValidationFailed(f"mode must be one of {', '.join(MODES)}", code="invalid_mode")
    return str(mode)


def check_limits(limits: Any) -> dict[str, int]:
    if limits is None:
        return dict(DEFAULT_LIMITS)
    if not isinstance(limits, dict):
        raise ValidationFailed("limits must be an object", code="invalid_limits")
    unknown = set(limits) - set(LIMIT_KEYS)
    if unknown:
        raise ValidationFailed(f"unknown limits: {', '.join(sorted(unknown))}", code="invalid_limits")
    checked = dict(DEFAULT_LIMITS)
    for key, value in limits.items():
        if isinstance(value, float) and value.is_integer():
            value = int(value)  # 5.0 is the whole number 5 in JSON (and in JSON Schema)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0 or value > 10**9:
            raise ValidationFailed(
                f"limits.{key} must be a whole number from 0 to 1e9 (0 = off)", code="invalid_limits"
            )
        checked[key] = value
    return checked


def check_reasoning_effort(effort: Any) -> str | None:
    if effort is None or effort == "":
        return None
    if effort not in REASONING_EFFORTS:
        raise ValidationFailed(
            f"reasoning_effort must be one of {', '.join(REASONING_EFFORTS)}", code="invalid_reasoning_effort"
        )
    return str(effort)


def check_model_value(model: Any) -> str:
    if not isinstance(model, str) or not model.strip() or len(model) > 200:
        raise ValidationFailed("model must be a non-empty name", code="invalid_model")
    return model.strip()


# ---- create, clear, fork ----

#: A worktree selector is stored and returned, never read: a bound keeps it a label.
WORKTREE_SELECTOR_MAX = 2048


def check_worktree_selector(value: Any) -> str | dict[str, Any] | None:
    """A session's worktree selector: a non-empty string or a JSON object (at most 2 KiB:
    characters of a string, bytes of an object's JSON), kept as given. The server never
    interprets it; the snapshot's `placement` returns it."""
    if value is None:
        return None
    if isinstance(value, str):
        size = len(value)
    elif isinstance(value, dict):
        try:
            size = len(json.dumps(value, allow_nan=False).encode())
        except (TypeError, ValueError):
            raise ValidationFailed("worktree_selector must be plain JSON", code="invalid_worktree_selector") from None
    else:
        raise ValidationFailed("worktree_selector is a string or an object", code="invalid_worktree_selector")
    if not 1 <= size <= WORKTREE_SELECTOR_MAX:
        raise ValidationFailed(
            f"worktree_selector must hold 1 to {WORKTREE_SELECTOR_MAX} characters", code="invalid_worktree_selector"
        )
    return value


def check_model_choice(model: Any, provider_id: Any, model_id: Any, served_provider: str) -> str | None:
    """The model a fork asks for: `model`, or `model_id` (the same name), optionally
    with the `provider_id` that serves it, which must be this server's provider."""
    if provider_id is not None and provider_id != served_provider:
        raise ValidationFailed(
            f"provider_id {str(provider_id)[:80]!r} is not served here (this server's provider is {served_provider!r})",
            code="invalid_provider_id",
        )
    if model is not None and model_id is not None and model != model_id:
        raise ValidationFailed("model and model_id name different models; give one", code="invalid_model")
    chosen = model_id if model_id is not None else model
    return check_model_value(chosen) if chosen is not None else None


def created_event(
    *,
    title: str | None,
    mode: str,
    model: str,
    limits: dict[str, int],
    reasoning_effort: str | None = None,
    forked_from: dict[str, Any] | None = None,
    agent: dict[str, Any] | None = None,
    worktree_selector: str | dict[str, Any] | None = None,
    replay: dict[str, Any] | None = None,
) -> NewEvent:
    payload: dict[str, Any] = {"mode": mode, "model": model, "limits": limits}
    if replay:
        payload["replay"] = dict(replay)
    if agent:
        payload["agent"] = dict(agent)
    if title:
        payload["title"] = title
    if reasoning_effort:
        payload["reasoning_effort"] = reasoning_effort
    if forked_from:
        payload["forked_from"] = forked_from
    if worktree_selector is not None:
        payload["worktree_selector"] = worktree_selector
    return NewEvent(EventType.SESSION_CREATED, payload)


def create_events(
    *,
    title: Any = None,
    mode: Any = None,
    model: Any = None,
    limits: Any = None,
    reasoning_effort: Any = None,
    default_model: str = "demo",
    agent: AgentSpec | None = None,
    replay: dict[str, Any] | None = None,
) -> list[NewEvent]:
    """Validate a new session's settings (None = default) and build its SESSION_CREATED.

    With an `agent` (an `AgentSpec`), the session is pinned to it, and what the caller
    leaves out comes from the agent: its mode, model, limits and reasoning effort.
    """
    if agent is not None:
        mode = mode or agent.mode
        model = model or agent.model
        limits = limits if limits is not None else (dict(agent.limits) if agent.limits is not None else None)
        reasoning_effort = reasoning_effort or agent.params.get("reasoning_effort")
    return [
        created_event(
            title=check_title(title) if title is not None else None,
            mode=check_mode_value(mode or "default"),
            model=check_model_value(model or default_model),
            limits=check_limits(limits),
            reasoning_effort=check_reasoning_effort(reasoning_effort),
            agent=agent.pin if agent is not None and agent.id is not None else None,
            replay=replay,
        )
    ]


def agent_moved_events(state: SessionState, pin: dict[str, Any]) -> list[NewEvent]:
    """Move a session to another version of its agent (or another agent): one
    SESSION_UPDATED with `agent`. Only between runs, like a change of mode."""
    if state.is_active:
        raise SessionBusy("the agent cannot change while a run is active")
    return [NewEvent(EventType.SESSION_UPDATED, {"agent": dict(pin)})]


def clear_events(
    state: SessionState, *, agent: dict[str, Any] | None = None, worktree_selector: Any = None
) -> list[NewEvent]:
    """A new empty session inheriting mode, model, reasoning effort, limits, the agent pin
    (`agent`: another pin instead) and the worktree selector (unless one is given)."""
    selector = check_worktree_selector(worktree_selector)
    return [
        created_event(
            title=None,
            mode=state.mode,
            model=state.model,
            limits=dict(state.limits),
            reasoning_effort=state.reasoning_effort,
            agent=agent if agent is not None else state.agent,
            worktree_selector=selector if selector is not None else state.worktree_selector,
        )
    ]


def strip_trailing_unanswered(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Drop the tool calls nobody answered from the last assistant message (a fork must not
    inherit an open ask). Its answered calls stay with their results; a message left with
    no calls and no text goes."""
    messages = [dict(m) for m in messages]
    index = next((i for i in range(len(messages) - 1, -1, -1) if messages[i].get("role") == "assistant"), None)
    if index is None or not messages[index].get("tool_calls"):
        return messages
    last = messages[index]
    answered = {m.get("tool_call_id") for m in messages[index + 1 :] if m.get("role") == "tool"}
    kept = [c for c in last["tool_calls"] if c.get("id") in answered]
    if len(kept) == len(last["tool_calls"]):
        return messages
    if kept:
        last["tool_calls"] = kept
    elif last.get("content"):
        del last["tool_calls"]
    else:
        del messages[index]
    return messages


def fork_events(
    source: SessionState,
    source_envelopes: list[Envelope],
    *,
    at_seq: int | None,
    title: str | None = None,
    model: str | None = None,
    reasoning_effort: str | None = None,
    reason: str | None = None,
    agent: dict[str, Any] | None = None,
    worktree_selector: Any = None,
) -> list[NewEvent]:
    """SESSION_CREATED(forked_from) + TRANSCRIPT_COMPACTED holding the source's fold.

    The fork keeps the source's agent pin unless `agent` names another.

    `source_envelopes` are the source's envelopes from its newest compaction at or before
    `at_seq` (or the newest, for a fork now) up to `at_seq`. `reason` says why the
    fork was made when it was not a plain fork ("regenerate", "edit"), for the page.
    """
    if at_seq is None:
        if not source.at_turn_boundary:
            raise NotAtTurnBoundary("a session can be forked only between runs")
        at_seq = source.last_seq
    elif not isinstance(at_seq, int) or isinstance(at_seq, bool) or at_seq < 1 or at_seq > source.last_seq:
        raise ValidationFailed(f"at_seq must be between 1 and {source.last_seq}", code="invalid_seq")
    selector = check_worktree_selector(worktree_selector)
    messages = strip_trailing_unanswered(fold_messages(e for e in source_envelopes if e.seq <= at_seq))
    created = created_event(
        title=check_title(title)
        if title is not None
        else (f"Fork of {source.title}"[:TITLE_MAX] if source.title else None),
        mode=source.mode,
        model=check_model_value(model) if model is not None else source.model,
        limits=dict(source.limits),
        reasoning_effort=check_reasoning_effort(reasoning_effort)
        if reasoning_effort is not None
        else source.reasoning_effort,
        forked_from={"session_id": source.session_id, "seq": at_seq, **({"reason": reason} if reason else {})},
        agent=agent if agent is not None else source.agent,
        worktree_selector=selector if selector is not None else source.worktree_selector,
    )
    compacted = NewEvent(EventType.TRANSCRIPT_COMPACTED, {"messages": messages, "through_seq": 0})
    return [created, compacted]


# ---- runs ----


def check_can_start(state: SessionState) -> None:
    if state.is_active:
        raise SessionBusy("a run is active in this session; wait for it, cancel it, or queue the message")
    if state.status == "awaiting":
        raise SessionBusy("this session is waiting for an approval decision", code="awaiting_approval")


def message_events(
    state: SessionState, content: str | list[dict[str, Any]], *, author: str | None = None
) -> tuple[str, list[NewEvent]]:
    """The events that start a run for a user message: (invocation_id, events)."""
    invocation_id = new_id("inv")
    events: list[NewEvent] = []
    if state.title_source is None:
        title = clamp_title(prompt_text(content))
        if title:
            events.append(NewEvent(EventType.SESSION_UPDATED, {"title": title, "title_source": "prompt"}))
    reason: dict[str, Any] = {"kind": "user_message", "input": {"content": content}}
    if author:
        reason["author"] = author
    events.append(NewEvent(EventType.INVOCATION_STARTED, {"reason": reason}, invocation_id))
    return invocation_id, events


def check_decision(state: SessionState, ask_id: str, verdict: Any) -> dict[str, Any]:
    if verdict not in VERDICTS:
        raise ValidationFailed(f"verdict must be one of {', '.join(VERDICTS)}", code="invalid_verdict")
    ask = state.asks.get(ask_id)
    pending = state.pending_ask
    if ask is None or ask.get("status") != "pending" or not pending or pending.get("ask_id") != ask_id:
        extra = {}
        if ask is not None and ask.get("status") != "pending":
            extra = {"status": ask.get("status"), "decided_by": ask.get("approver"), "verdict": ask.get("verdict")}
        raise AskNotPending(
            "this ask is not pending (it was decided already, withdrawn, or never existed)", extra=extra
        )
    return ask


def check_scope_value(verdict: Any, scope: Any) -> str | None:
    """A decision's scope on its own: None, or "turn" with an approving verdict."""
    if scope is None:
        return None
    if scope not in DECISION_SCOPES:
        raise ValidationFailed(f"scope must be one of {', '.join(DECISION_SCOPES)}", code="invalid_scope")
    if verdict in ("deny", "respond"):
        raise ValidationFailed(
            f'scope "turn" (approve all) goes with an approval only, not with {verdict}', code="invalid_scope"
        )
    return str(scope)


def check_scope(ask: dict[str, Any], verdict: str, scope: Any) -> str | None:
    """The scope of a decision (None, or "turn": "Approve all" for the ask's turn).

    Only an approving verdict may carry one, and only on an ask one person decides (an
    ask needing several approvals is voted on call by call)."""
    if check_scope_value(verdict, scope) is None:
        return None
    if int(ask.get("approvals_required") or 1) > 1:
        raise ValidationFailed(
            "approve all is not possible on an ask needing several approvals; vote on it alone", code="invalid_scope"
        )
    if ask.get("tool_call_id") is None:
        raise ValidationFailed("approve all applies to a tool call's ask only", code="invalid_scope")
    return str(scope)


def check_answer_values(verdict: Any, arguments: Any = None, result: Any = None) -> None:
    """Edited `arguments` and a `result` on their own: arguments an object (JSON, at most
    EDITED_ARGUMENTS_MAX characters) with allow_once only; a result a non-empty text (at
    most RESPONSE_MAX characters), required with respond and only there."""
    if arguments is not None:
        if verdict != "allow_once":
            raise ValidationFailed("arguments (an edited call) go with allow_once only", code="invalid_arguments")
        if not isinstance(arguments, dict):
            raise ValidationFailed("arguments must be a JSON object", code="invalid_arguments")
        try:
            size = len(json.dumps(arguments, allow_nan=False))
        except (TypeError, ValueError):
            raise ValidationFailed("arguments must be plain JSON", code="invalid_arguments") from None
        if size > EDITED_ARGUMENTS_MAX:
            raise ValidationFailed(
                f"arguments are longer than {EDITED_ARGUMENTS_MAX:,} characters as JSON", code="invalid_arguments"
            )
    if verdict == "respond":
        if not isinstance(result, str) or not result.strip():
            raise ValidationFailed("respond needs a result: the text the model gets instead", code="invalid_result")
        if len(result) > RESPONSE_MAX:
            raise ValidationFailed(f"result is longer than {RESPONSE_MAX:,} characters", code="invalid_result")
    elif result is not None:
        raise ValidationFailed("result goes with the verdict respond only", code="invalid_result")


def check_answer(ask: dict[str, Any], verdict: str, arguments: Any = None, result: Any = None) -> None:
    """Edited arguments or a response on this ask: only on a tool call's ask that one
    person decides (an ask needing several approvals is voted on as asked)."""
    check_answer_values(verdict, arguments, result)
    if arguments is None and verdict != "respond":
        return
    what = "edited arguments" if arguments is not None else "respond"
    if int(ask.get("approvals_required") or 1) > 1:
        raise ValidationFailed(
            f"{what} is not possible on an ask needing several approvals; vote on the call as asked",
            code="needs_quorum",
        )
    if ask.get("tool_call_id") is None:
        raise ValidationFailed(f"{what} applies to a tool call's ask only", code="invalid_verdict")


def decision_events(
    state: SessionState,
    ask_id: str,
    verdict: str,
    *,
    approver: str | None = None,
    note: str | None = None,
    scope: str | None = None,
    arguments: dict[str, Any] | None = None,
    result: str | None = None,
) -> tuple[str, list[NewEvent]]:
    ask = check_decision(state, ask_id, verdict)
    scope = check_scope(ask, verdict, scope)
    check_answer(ask, verdict, arguments, result)
    if arguments is not None:
        arguments = json.loads(json.dumps(arguments))  # plain JSON, a copy the caller cannot change
    invocation_id = new_id("inv")
    reason = approval_decision_reason(
        ask_id,
        verdict not in ("deny", "respond"),
        approver=approver,
        verdict=verdict,
        note=note or None,
        scope=scope,
        arguments=arguments,
        result=result,
    )
    return invocation_id, [NewEvent(EventType.INVOCATION_STARTED, {"reason": reason}, invocation_id)]


def vote_events(
    state: SessionState,
    ask_id: str,
    verdict: str,
    *,
    approver: str | None,
    note: str | None = None,
    requester: str | None = None,
    scope: str | None = None,
    arguments: dict[str, Any] | None = None,
    result: str | None = None,
) -> tuple[str | None, list[NewEvent]]:
    """A person's verdict on an ask, under its quorum (docs/moderation.md).

    An ask needing one approval (the default) is decided by the first verdict: the
    events of `decision_events`, no vote envelope. An ask needing N > 1 approvals journals
    each verdict as APPROVAL_VOTED; a deny, or the Nth approval from N different people,
    also journals the usual approval_decision INVOCATION_STARTED, which resumes the run
    (its invocation id is returned; None while the quorum is still short). The requester's
    own approval never counts towards N > 1 (refused, 403), nor does anyone's second vote
    (409 already_voted). The decision names who completed it (`approver`) and every
    approver (`approvers`); it is `allow_always` only when every approval said so.
    Edited `arguments` and `respond` (with its `result`) decide an ask one person
    decides only (400 needs_quorum otherwise).
    """
    ask = check_decision(state, ask_id, verdict)
    check_scope(ask, verdict, scope)
    check_answer(ask, verdict, arguments, result)
    required = int(ask.get("approvals_required") or 1)
    if required <= 1:
        return decision_events(
            state, ask_id, verdict, approver=approver, note=note, scope=scope, arguments=arguments, result=result
        )
    if not approver:
        raise ValidationFailed("a vote on an ask needing several approvals must name its approver", code="invalid_vote")
    votes: list[dict[str, Any]] = list(ask.get("votes") or [])
    if any(vote.get("approver") == approver for vote in votes):
        raise AlreadyVoted(f"{approver} has voted on this ask already; it needs {required} different approvers")
    if verdict != "deny" and requester is not None and approver == requester:
        raise Forbidden(
            f"your own approval does not count on an ask needing {required} approvals; another moderator must approve",
            code="own_ask",
        )
    vote: dict[str, Any] = {"ask_id": ask_id, "approver": approver, "verdict": verdict}
    if note:
        vote["note"] = note
    events = [NewEvent(EventType.APPROVAL_VOTED, vote)]
    # An imported vote is history, not a live approval: it never counts toward a quorum.
    live = [v for v in votes if not str(v.get("approver") or "").startswith(IMPORTED_PREFIX)]
    approvals = [v for v in live if v.get("verdict") != "deny"] + ([vote] if verdict != "deny" else [])
    if verdict != "deny" and len(approvals) < required:
        return None, events
    if verdict == "deny":
        final_verdict = "deny"
    else:
        final_verdict = "allow_always" if all(v.get("verdict") == "allow_always" for v in approvals) else "allow_once"
    invocation_id = new_id("inv")
    reason = approval_decision_reason(
        ask_id, final_verdict != "deny", approver=approver, verdict=final_verdict, note=note or None
    )
    if final_verdict != "deny":
        reason["decision"]["approvers"] = [str(v["approver"]) for v in approvals]
    events.append(NewEvent(EventType.INVOCATION_STARTED, {"reason": reason}, invocation_id))
    return invocation_id, events


def expired_events(state: SessionState, ask_id: str, expires_after_s: int | None = None) -> tuple[str, list[NewEvent]]:
    """The denial of an ask whose deadline passed (approver "policy:expired")."""
    after = f" after {expires_after_s} s" if expires_after_s else ""
    return decision_events(state, ask_id, "deny", approver=EXPIRED_APPROVER, note=f"the ask expired{after}")


def retry_events(state: SessionState) -> tuple[str, list[NewEvent]]:
    if state.status != "failed" or not state.last_error or not state.last_error.get("retryable"):
        raise RetryIneligible("only a session that failed with a retryable error can be retried")
    invocation_id = new_id("inv")
    reason = retry_reason(state.last_error.get("invocation_id") or state.last_invocation_id or "")
    return invocation_id, [NewEvent(EventType.INVOCATION_STARTED, {"reason": reason}, invocation_id)]


def recover_events(
    state: SessionState, crashed_invocation_id: str, error: str = "worker lost"
) -> tuple[str, list[NewEvent]]:
    """SESSION_ERROR (closing any open message) + a `recover` invocation that continues it.

    An open message that already holds tool calls is ended first (MESSAGE_END with
    finish_reason "tool_calls"), so the SESSION_ERROR does not stitch a "please continue"
    between those calls and the results the recovering run gives them.
    """
    invocation_id = new_id("inv")
    events: list[NewEvent] = []
    error_payload: dict[str, Any] = {"error": error, "retryable": True}
    if state.open_message_id and state.open_message_tool_calls:
        end = {"message_id": state.open_message_id, "finish_reason": "tool_calls"}
        events.append(NewEvent(EventType.MESSAGE_END, end, crashed_invocation_id))
    elif state.open_message_id:
        error_payload["message_id"] = state.open_message_id
    return invocation_id, [
        *events,
        NewEvent(EventType.SESSION_ERROR, error_payload, crashed_invocation_id),
        NewEvent(EventType.INVOCATION_STARTED, {"reason": recover_reason(crashed_invocation_id)}, invocation_id),
    ]


def check_steer(state: SessionState, text: Any) -> str:
    if not isinstance(text, str) or not text.strip():
        raise ValidationFailed("steer text is required", code="invalid_steer")
    if len(text) > 20_000:
        raise ValidationFailed("steer text is longer than 20,000 characters", code="invalid_steer")
    if not state.is_active:
        raise StaleRunControl("the run has ended; send a new message instead")
    return text


def check_mode_change(state: SessionState, mode: Any) -> str:
    mode = check_mode_value(mode)
    if state.is_active:
        raise SessionBusy("the mode cannot change while a run is active")
    return mode


def orphan_result_events(
    open_calls: Iterable[dict[str, Any]], content: str, invocation_id: str | None
) -> list[NewEvent]:
    """Error results for the tool calls nobody answered, so that the history the next run
    folds is valid (every tool call followed by its result) whatever comes next."""
    return [
        NewEvent(
            EventType.TOOL_RESULT,
            {"tool_call_id": call["id"], "name": call["function"]["name"], "content": content, "is_error": True},
            invocation_id,
        )
        for call in open_calls
    ]


def cancelled_events(
    invocation_id: str | None,
    *,
    open_message_id: str | None,
    open_calls: Iterable[dict[str, Any]],
    by: str | None = None,
    ask_id: str | None = None,
) -> list[NewEvent]:
    """How a cancelled run ends, wherever it is cancelled (its own worker, a cancel of a
    run whose worker died, a cancel of a queued or paused run): the open message is
    ended as cancelled (its partial text kept), orphaned tool calls get the error result
    CANCELLED_TOOL_CONTENT, then INVOCATION_CANCELLED (with who cancelled, and the ask
    withdrawn, when there was one)."""
    events: list[NewEvent] = []
    if open_message_id:
        end = {"message_id": open_message_id, "finish_reason": "cancelled"}
        events.append(NewEvent(EventType.MESSAGE_END, end, invocation_id))
    events.extend(orphan_result_events(open_calls, CANCELLED_TOOL_CONTENT, invocation_id))
    payload: dict[str, Any] = {}
    if ask_id:
        payload["ask_id"] = ask_id
    if by:
        payload["by"] = by
    events.append(NewEvent(EventType.INVOCATION_CANCELLED, payload, invocation_id))
    return events


def lost_run_failed_events(invocation_id: str | None, *, open_message_id: str | None, error: str) -> list[NewEvent]:
    """How a run ends that was lost too often (its workers kept dying): the open message
    is closed by a SESSION_ERROR, then INVOCATION_FAILED, retryable."""
    events: list[NewEvent] = []
    if open_message_id:
        payload = {"error": error, "message_id": open_message_id, "retryable": True}
        events.append(NewEvent(EventType.SESSION_ERROR, payload, invocation_id))
    events.append(NewEvent(EventType.INVOCATION_FAILED, {"error": error, "retryable": True}, invocation_id))
    return events


def cancel_awaiting_events(state: SessionState, by: str | None = None) -> list[NewEvent]:
    """Cancel a run paused on an ask: the ask is withdrawn and its call gets an error result.

    The suspended invocation already has its terminal event (INVOCATION_SUSPENDED), so
    these events belong to no invocation (invocation_id None): each invocation keeps
    exactly one terminal event, and a run's event stream never shows two endings.
    """
    ask = state.pending_ask
    if state.status != "awaiting" or ask is None:
        raise StaleRunControl("there is no active run to cancel")
    calls = []
    if ask.get("tool_call_id"):
        calls.append({"id": ask["tool_call_id"], "function": {"name": ask["name"]}})
    return cancelled_events(None, open_message_id=None, open_calls=calls, by=by, ask_id=ask["ask_id"])
