"""An `approval_prompt` call as an ask in a session of the caller (database code: the
server runs it in the journal's threads).

Each call is journaled as a run of the session's agent (sessions_app.approval_service
.relay) that asked about one tool call: a user message naming the client, an assistant
message with the call, then either the decision of a team rule (APPROVAL_REQUESTED with
its `decision`, the call's result, the run's end) or an ask (APPROVAL_REQUESTED with
the rule's terms, INVOCATION_SUSPENDED). From there it is an ask like any other: the
queue, the chat page, action links, the API, quorum and expiry decide it, and the journal
writes the audit, the ask index and the notifications in the same transaction.

A session waits on one ask at a time, so a call finds a session of its group that is not
waiting (nor running the decision of its last ask) and takes it, or opens the group's
next session ("<client> (2)"); a session the caller named is waited for instead.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction

from sectr import operations
from sectr.errors import AskNotPending, StaleRunControl
from sectr.events import EventType
from sectr.journal import NewEvent, new_id
from sectr.rules import RuleDecision
from sectr.state import TITLE_MAX, SessionState
from sessions_app.access import check_access
from sessions_app.approval_relay import RELAY_AGENT, result_text
from sessions_app.journal import get_journal
from sessions_app.models import ApprovalRule, AskIndex, AuditEntry, McpApproval, Session, Team
from sessions_app.provider_config import default_model

#: The longest tool name an ask keeps (the ask index's and the audit's column).
TOOL_NAME_MAX = 100
TOOL_USE_ID_MAX = 200
#: Who withdraws an ask whose caller stopped waiting (SECTR_MCP_APPROVAL_WAIT_S).
WAIT_LIMIT_ACTOR = "mcp:wait-limit"
_BUSY = ("awaiting", "running")


class CallRefused(ValueError):
    """A call the tool answers with an error (its text says why), asking nothing."""


@dataclass(frozen=True)
class Caller:
    """Who calls, and where their asks go: `group` names the sessions (one MCP session,
    or a token and client per UTC day); `named_session` is a session the caller named."""

    user: Any
    team: Team | None
    client: str
    title: str
    group: str
    named_session: str | None = None


@dataclass(frozen=True)
class Outcome:
    """The answer of `approval_prompt`: allow (with the input to run) or deny (a message)."""

    allow: bool
    updated_input: dict[str, Any] | None = None
    message: str = ""

    def as_json(self) -> dict[str, Any]:
        if self.allow:
            return {"behavior": "allow", "updatedInput": self.updated_input or {}}
        return {"behavior": "deny", "message": self.message}


@dataclass(frozen=True)
class Opened:
    """The ask a call made or found; `outcome` when it is decided already; `busy` when
    the named session waits on another ask (nothing was asked: try again later)."""

    ask_id: str = ""
    session_id: str = ""
    deadline: datetime | None = None
    outcome: Outcome | None = None
    busy: bool = False
    found: bool = False


def check_call(arguments: Any) -> tuple[str, dict[str, Any], str]:
    """(tool_name, input, tool_use_id or "") of a call's arguments, or CallRefused."""
    if not isinstance(arguments, dict):
        raise CallRefused("arguments must be an object {tool_name, input, tool_use_id?}")
    unknown = sorted(set(arguments) - {"tool_name", "input", "tool_use_id"})
    if unknown:
        raise CallRefused(f"unknown argument(s): {', '.join(k[:40] for k in unknown[:5])}")
    name = arguments.get("tool_name")
    if not isinstance(name, str) or not name.strip() or len(name) > TOOL_NAME_MAX:
        raise CallRefused(f"tool_name must be a non-empty string of at most {TOOL_NAME_MAX} characters")
    tool_input = arguments.get("input", {})
    if not isinstance(tool_input, dict):
        raise CallRefused("input must be an object (the arguments of the tool call)")
    tool_use_id = arguments.get("tool_use_id") or ""
    if not isinstance(tool_use_id, str) or len(tool_use_id) > TOOL_USE_ID_MAX:
        raise CallRefused(f"tool_use_id must be a string of at most {TOOL_USE_ID_MAX} characters")
    try:
        plain = json.loads(json.dumps(tool_input, allow_nan=False))
    except (TypeError, ValueError):
        raise CallRefused("input must be plain JSON") from None
    return name, plain, tool_use_id


def open_ask(caller: Caller, tool_name: str, tool_input: dict[str, Any], tool_use_id: str = "") -> Opened:
    """The ask for one call: found by `tool_use_id` when the caller asked about this
    tool use before, else made (decided at once when a team rule matches)."""
    if tool_use_id:
        found = McpApproval.objects.filter(owner=caller.user, tool_use_id=tool_use_id).first()
        if found is not None:
            return _found(found)
    try:
        with transaction.atomic():
            session, state = _free_session(caller)
            if session is None or state is None:
                return Opened(busy=True)
            ask_id = new_id("ask")
            # First, so that a second call for the same tool use waits here (PostgreSQL's
            # unique index; SQLite's single writer) and then fails, asking nothing.
            McpApproval.objects.create(
                owner=caller.user,
                tool_use_id=tool_use_id,
                group=caller.group,
                session=session,
                ask_id=ask_id,
                client=caller.client[:200],
            )
            events, outcome = _ask_events(caller, state, ask_id, tool_name, tool_input)
            get_journal().append_sync(session.pk, events)
    except IntegrityError:
        if not tool_use_id:
            raise
        return _found(McpApproval.objects.get(owner=caller.user, tool_use_id=tool_use_id))
    deadline = AskIndex.objects.filter(pk=ask_id).values_list("deadline", flat=True).first()
    return Opened(ask_id, session.pk, deadline, outcome)


def _found(row: McpApproval) -> Opened:
    deadline = AskIndex.objects.filter(pk=row.ask_id).values_list("deadline", flat=True).first()
    return Opened(row.ask_id, row.session_id, deadline, read_outcome(row.ask_id), found=True)


def _busy(session: Session, state: SessionState) -> bool:
    return state.status in _BUSY or session.closed_at is not None


def _free_session(caller: Caller) -> tuple[Session | None, SessionState | None]:
    """A session of the caller's group that waits on nothing, locked; a new one when
    every one does. A named session that is busy: (None, None)."""
    if caller.named_session is not None:
        session = Session.objects.select_for_update().filter(pk=caller.named_session).first()
        if session is None:
            raise CallRefused("no such session")
        check_access(caller.user, session, "write")
        state = session.projection()
        return (None, None) if _busy(session, state) else (session, state)
    ids = list(
        McpApproval.objects.filter(owner=caller.user, group=caller.group)
        .values_list("session_id", flat=True)
        .distinct()
    )
    free = (
        Session.objects.filter(pk__in=ids, closed_at__isnull=True)
        .exclude(status__in=_BUSY)
        .order_by("created_at")
        .values_list("pk", flat=True)[:5]
    )
    for session_id in list(free):
        session = Session.objects.select_for_update().get(pk=session_id)
        state = session.projection()
        if not _busy(session, state):
            return session, state
    title = caller.title if not ids else f"{caller.title} ({len(set(ids)) + 1})"
    events = operations.create_events(title=title[:TITLE_MAX], default_model=default_model(), agent=RELAY_AGENT)
    session = Session.objects.create(owner=caller.user, team=caller.team)
    get_journal().append_sync(session.pk, events)
    session.refresh_from_db()
    return session, session.projection()


def _ask_events(
    caller: Caller, state: SessionState, ask_id: str, name: str, arguments: dict[str, Any]
) -> tuple[list[NewEvent], Outcome | None]:
    """The run that asks about the call; the rule's Outcome when a rule decides it."""
    invocation_id, message_id, call_id = new_id("inv"), new_id("msg"), new_id("call")
    reason: dict[str, Any] = {"kind": "user_message", "input": {"content": f"{caller.client} asks to run {name}"}}
    if (author := caller.user.get_username()) is not None:
        reason["author"] = author
    events = [
        NewEvent(EventType.INVOCATION_STARTED, {"reason": reason}, invocation_id),
        NewEvent(EventType.MESSAGE_START, {"message_id": message_id, "role": "assistant"}, invocation_id),
        NewEvent(
            EventType.TOOL_CALL,
            {"message_id": message_id, "tool_call_id": call_id, "name": name, "arguments": json.dumps(arguments)},
            invocation_id,
        ),
        NewEvent(EventType.MESSAGE_END, {"message_id": message_id, "finish_reason": "tool_calls"}, invocation_id),
    ]
    policy, _team = ApprovalRule.policy_and_team_for_session(state.session_id)
    rule = policy.first_match(name, arguments)
    ask: dict[str, Any] = {"ask_id": ask_id, "tool_call_id": call_id, "name": name, "arguments": arguments}
    if rule is not None and rule.action in ("allow", "deny"):
        decision = RuleDecision.of(rule).decision
        text, is_error = result_text(decision)
        result: dict[str, Any] = {"tool_call_id": call_id, "name": name, "content": text}
        if is_error:
            result["is_error"] = True
        events += [
            NewEvent(EventType.APPROVAL_REQUESTED, {**ask, "rule_id": rule.id, "decision": decision}, invocation_id),
            NewEvent(EventType.TOOL_RESULT, result, invocation_id),
            NewEvent(EventType.INVOCATION_COMPLETED, {"stop_reason": "end_turn"}, invocation_id),
        ]
        if decision["approved"]:
            return events, Outcome(True, arguments)
        return events, Outcome(False, message=f"Denied by the team's approval rule {rule.id} ({rule.tool}).")
    terms = policy.ask_terms(rule if rule is not None and rule.action == "ask" else None)
    events += [
        NewEvent(EventType.APPROVAL_REQUESTED, {**ask, **terms}, invocation_id),
        NewEvent(EventType.INVOCATION_SUSPENDED, {"ask_id": ask_id}, invocation_id),
    ]
    return events, None


def ask_status(ask_id: str) -> str | None:
    """The ask's status in the ask index (pending, approved, denied, withdrawn); None:
    it is gone (its session was deleted)."""
    return AskIndex.objects.filter(pk=ask_id).values_list("status", flat=True).first()


def read_outcome(ask_id: str) -> Outcome | None:
    """The answer for a decided ask; None while it is pending."""
    status = ask_status(ask_id)
    if status == AskIndex.PENDING:
        return None
    if status is None:
        return Outcome(False, message="The ask no longer exists (its session was deleted).")
    kinds = (AuditEntry.DECISION, AuditEntry.RULE, AuditEntry.EXPIRY, AuditEntry.WITHDRAWN)
    entry = AuditEntry.objects.filter(ask_id=ask_id, kind__in=kinds).order_by("-seq").first()
    if entry is None:  # the audit is rebuilt from the journal: answer from the index alone
        return Outcome(False, message=f"The ask was {status}.")
    actor = entry.actor or "someone"
    if status == "approved":
        updated = entry.run_arguments if isinstance(entry.run_arguments, dict) else entry.arguments
        return Outcome(True, dict(updated or {}))
    if entry.kind == AuditEntry.WITHDRAWN:
        if entry.actor == WAIT_LIMIT_ACTOR:
            return Outcome(False, message="No decision came in time; the ask was withdrawn.")
        return Outcome(False, message=f"The ask was withdrawn by {actor}.")
    if entry.kind == AuditEntry.EXPIRY:
        return Outcome(False, message=f"Denied: {entry.note or 'the ask expired'} with no decision.")
    if entry.verdict == "respond":
        return Outcome(False, message=f"{actor} answered instead of allowing the call: {entry.note}")
    return Outcome(False, message=f"Denied by {actor}" + (f": {entry.note}" if entry.note else "."))


def withdraw(ask_id: str, waited_s: float) -> Outcome:
    """End the wait for a pending ask: withdraw it (the audit shows who: the wait limit)
    and deny. When it was decided a moment ago, that decision's answer instead."""
    row = McpApproval.objects.filter(ask_id=ask_id).first()
    if row is not None:
        with transaction.atomic():
            session = Session.objects.select_for_update().get(pk=row.session_id)
            state = session.projection()
            pending = state.pending_ask or {}
            if state.status == "awaiting" and pending.get("ask_id") == ask_id:
                try:
                    events = operations.cancel_awaiting_events(state, by=WAIT_LIMIT_ACTOR)
                except (StaleRunControl, AskNotPending):
                    events = []
                if events:
                    get_journal().append_sync(session.pk, events)
                    limit = f"No decision within {waited_s:g} s (SECTR_MCP_APPROVAL_WAIT_S)"
                    return Outcome(False, message=f"{limit}; the ask was withdrawn.")
    return read_outcome(ask_id) or Outcome(False, message="No decision came in time.")
