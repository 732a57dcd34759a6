"""The chat page's view model: a session's journal turned into things a person sees.

`ChatViewModel.apply(envelope)` folds one envelope into a list of renderable items
(user messages, assistant messages with their reasoning and tool calls, approval
cards, steers, notices for errors, stops, compactions and recoveries) and into the
session's projection (`sectr.state.SessionState`, for the state word, the token meter
and the controls). The page builds one from the whole journal and renders every item;
the websocket consumer keeps one per connection and, after each batch of envelopes,
asks `take_changes()` what to re-render. Both render the same template partials
(templates/chat/), so the page after a reload and the page kept live by
the socket are the same HTML.

Nothing here touches the database or renders HTML except Markdown (sessions_app.display.markdown);
which tools are gated comes from the process's runtime (sessions_app.runtime.is_gated_tool).
The helpers and the approval card the moderation and review pages show too live in
sessions_app.display.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.utils.safestring import SafeString

from sectr.events import Envelope, EventType
from sectr.state import SessionState, apply_envelope
from sessions_app.display.approvals import ApprovalView, TurnCall, votes_of
from sessions_app.display.content import (
    Attachment,
    content_text_and_attachments,
    dom_id,
    pretty_json,
    result_attachments,
)
from sessions_app.display.markdown import render_markdown
from sessions_app.provider_config import model_info
from sessions_app.runtime import is_gated_tool

# ---- items ----


@dataclass
class ToolCallView:
    tool_call_id: str
    name: str
    arguments: Any
    message_id: str | None
    seq: int
    result: str | None = None
    is_error: bool = False
    result_seq: int | None = None
    awaiting_approval: bool = False
    kind: str = "tool-call"
    #: The images and audio its result stored (shown through the session's media view).
    media: list[Attachment] = field(default_factory=list)

    @property
    def dom_id(self) -> str:
        return dom_id("tc", self.tool_call_id)

    @property
    def arguments_pretty(self) -> str:
        return pretty_json(self.arguments)

    @property
    def refused_in_plan_mode(self) -> bool:
        return bool(self.is_error and self.result and self.result.startswith("refused:") and "plan mode" in self.result)

    @property
    def status(self) -> str:
        if self.result is None:
            return "awaiting approval" if self.awaiting_approval else "running"
        if self.refused_in_plan_mode:
            return "refused (plan mode)"
        if self.is_error:
            return "denied" if self.result.startswith("denied") else "error"
        return "done"


@dataclass
class AssistantView:
    message_id: str
    seq: int
    invocation_id: str | None
    model: str | None = None
    text_parts: list[str] = field(default_factory=list)
    reasoning_parts: list[str] = field(default_factory=list)
    tool_calls: list[ToolCallView] = field(default_factory=list)
    open: bool = True
    interrupted: str | None = None  # why the message was cut short, if it was
    end_seq: int | None = None
    usage: dict[str, Any] | None = None
    historic: bool = False  # carried over by a fork (from TRANSCRIPT_COMPACTED)
    at: datetime | None = None  # when it started
    turn_seq: int | None = None  # the seq of the user message whose run wrote it
    kind: str = "assistant"
    _html: SafeString | None = None

    @property
    def dom_id(self) -> str:
        return dom_id("m", self.message_id)

    @property
    def text(self) -> str:
        return "".join(self.text_parts)

    @property
    def reasoning(self) -> str:
        return "".join(self.reasoning_parts)

    @property
    def html(self) -> SafeString:
        """The finished message as sanitised Markdown (rendered once, then cached)."""
        if self._html is None:
            self._html = render_markdown(self.text)
        return self._html

    @property
    def fork_seq(self) -> int | None:
        """Fork "from here": everything up to this reply and its tool results."""
        if self.open or self.historic or self.end_seq is None:
            return None
        seqs = [self.end_seq] + [tc.result_seq for tc in self.tool_calls if tc.result_seq is not None]
        return max(seqs)

    @property
    def can_regenerate(self) -> bool:
        """A finished reply to a message of this session (the page shows it on the last one)."""
        return not self.open and not self.historic and self.turn_seq is not None


@dataclass
class UserView:
    seq: int
    text: str
    attachments: list[Attachment] = field(default_factory=list)
    author: str | None = None
    historic: bool = False
    at: datetime | None = None
    branches: list[dict[str, Any]] = field(default_factory=list)  # forks made just before it (set by the page)
    kind: str = "user"
    _html: SafeString | None = None

    @property
    def dom_id(self) -> str:
        return f"ev-{self.seq}" if not self.historic else f"hist-{self.seq}"

    @property
    def html(self) -> SafeString:
        """The message as the same safe Markdown as a reply (a person's text is no safer)."""
        if self._html is None:
            self._html = render_markdown(self.text)
        return self._html

    @property
    def can_edit(self) -> bool:
        """Edit forks at the seq before this message, so only this session's own messages."""
        return not self.historic and self.seq > 1


@dataclass
class SteerView:
    seq: int
    text: str
    author: str | None = None
    at: datetime | None = None
    kind: str = "steer"

    @property
    def dom_id(self) -> str:
        return f"ev-{self.seq}"


@dataclass
class NoticeView:
    """Something that happened to the run: an error, a stop, a compaction, a recovery."""

    seq: int
    tone: str  # "error", "stopped", "compaction", "info"
    title: str
    detail: str = ""
    at: datetime | None = None
    # A fork's notice links to the session it came from (the page adds that session's title).
    source_session_id: str | None = None
    source_seq: int | None = None
    kind: str = "notice"

    @property
    def dom_id(self) -> str:
        return f"ev-{self.seq}"


Item = UserView | AssistantView | ApprovalView | SteerView | NoticeView

#: A fork's notice by why it was made (SESSION_CREATED's forked_from.reason): title, detail.
FORK_NOTICES = {
    "fork": ("Forked conversation", "This session continues a copy of"),
    "regenerate": ("Regenerated reply", "The last message is sent again; the earlier answer stays in"),
    "edit": ("Edited message", "The edited message is sent here; the original and its answers stay in"),
}


@dataclass
class Changes:
    """What one batch of envelopes changed on screen, in the order it must be applied."""

    appended: list[Item] = field(default_factory=list)  # new items at the end of the transcript
    tool_calls_added: list[ToolCallView] = field(default_factory=list)  # into an existing message
    replaced: list[Item | ToolCallView] = field(default_factory=list)  # re-render in place
    text: dict[str, list[str]] = field(default_factory=dict)  # message dom id -> streamed text
    reasoning: dict[str, list[str]] = field(default_factory=dict)
    status: bool = False  # state word, token meter, run controls
    settings: bool = False  # title, mode, model
    agent: bool = False  # the pinned agent or version (the header's agent)
    notes: bool = False

    @property
    def empty(self) -> bool:
        return not (
            self.appended
            or self.tool_calls_added
            or self.replaced
            or self.text
            or self.reasoning
            or self.status
            or self.settings
            or self.agent
            or self.notes
        )


# ---- the model ----


class ChatViewModel:
    def __init__(self, session_id: str, missing_media: frozenset[str] = frozenset()) -> None:
        self.session_id = session_id
        #: Media the journal references that the viewer cannot read here (an import
        #: that did not carry them): named as not available, never a broken image.
        self.missing_media = missing_media
        self.state = SessionState(session_id=session_id)
        self.items: list[Item] = []
        self.messages: dict[str, AssistantView] = {}
        self.tool_calls: dict[str, ToolCallView] = {}
        self.approvals: dict[str, ApprovalView] = {}
        self.last_input_tokens = 0  # the newest prompt's size, for the context meter
        self._last_assistant: AssistantView | None = None
        self._turn_seq: int | None = None  # the seq of the newest user message of this session
        self._at: datetime | None = None  # the envelope being applied's time
        self._reset_changes()

    @classmethod
    def from_envelopes(
        cls, session_id: str, envelopes: Iterable[Envelope], missing_media: frozenset[str] = frozenset()
    ) -> ChatViewModel:
        model = cls(session_id, missing_media)
        model.apply_all(envelopes)
        model.take_changes()
        return model

    @property
    def last_seq(self) -> int:
        return self.state.last_seq

    # ---- the context meter and controls ----

    @property
    def context_window(self) -> int:
        return model_info(self.state.model).context_window

    @property
    def context_percent(self) -> int:
        window = self.context_window
        return min(100, round(100 * self.last_input_tokens / window)) if window else 0

    @property
    def total_usage(self) -> dict[str, int]:
        return self.state.total_usage

    @property
    def total_tokens(self) -> int:
        usage = self.total_usage
        return usage.get("input_tokens", 0) + usage.get("output_tokens", 0)

    @property
    def can_retry(self) -> bool:
        error = self.state.last_error
        return self.state.status == "failed" and bool(error and error.get("retryable"))

    @property
    def run_active(self) -> bool:
        return self.state.status == "running"

    @property
    def pending_approval(self) -> ApprovalView | None:
        ask = self.state.pending_ask
        return self.approvals.get(str(ask.get("ask_id"))) if ask else None

    # ---- folding ----

    def apply_all(self, envelopes: Iterable[Envelope]) -> None:
        for envelope in envelopes:
            self.apply(envelope)

    def apply(self, envelope: Envelope) -> None:
        before = (self.state.status, self.state.mode, self.state.model, self.state.title, len(self.state.notes))
        agent_before = self.state.agent
        notes_before = dict(self.state.notes) if envelope.type is EventType.TOOL_RESULT else None
        apply_envelope(self.state, envelope)
        self._at = envelope.created_at
        handler = getattr(self, "_on_" + envelope.type.value.lower(), None)
        if handler is not None:
            handler(envelope)
        after = (self.state.status, self.state.mode, self.state.model, self.state.title, len(self.state.notes))
        if envelope.type is not EventType.MESSAGE_DELTA:
            self.changes.status = True
        if before[:4] != after[:4]:
            self.changes.settings = True
        if self.state.agent != agent_before:
            self.changes.agent = True
        if notes_before is not None and notes_before != self.state.notes:
            self.changes.notes = True

    def take_changes(self) -> Changes:
        changes = self.changes
        self._reset_changes()
        return changes

    def _reset_changes(self) -> None:
        self.changes = Changes()
        self._touched: set[int] = set()  # ids of items appended or replaced in this batch

    def _append(self, item: Item) -> None:
        if item.at is None:
            item.at = self._at
        self.items.append(item)
        self.changes.appended.append(item)
        self._touched.add(id(item))

    def _replace(self, item: Item | ToolCallView) -> None:
        if id(item) in self._touched:
            return  # it will be rendered whole, as it is at the end of the batch
        if isinstance(item, ToolCallView) and item.message_id is not None:
            parent = self.messages.get(item.message_id)
            if parent is not None and id(parent) in self._touched:
                return
        self._touched.add(id(item))
        self.changes.replaced.append(item)

    def _fresh(self, item: Item | ToolCallView) -> bool:
        return id(item) in self._touched

    # ---- one method per event type (the ones that show) ----

    def _on_invocation_started(self, envelope: Envelope) -> None:
        reason = envelope.payload.get("reason") or {}
        kind = reason.get("kind")
        if kind == "user_message":
            given = reason.get("input")
            content = given.get("content", "") if isinstance(given, dict) else ""
            text, attachments = content_text_and_attachments(content, self.session_id, self.missing_media)
            self._turn_seq = envelope.seq
            self._append(UserView(envelope.seq, text, attachments, reason.get("author")))
        elif kind == "approval_decision":
            ask_id = str(reason.get("ask_id", ""))
            card = self.approvals.get(ask_id)
            ask = self.state.asks.get(ask_id)
            if card is not None and ask is not None:
                card.status = str(ask.get("status", card.status))
                card.verdict = ask.get("verdict")
                card.approver = ask.get("approver")
                card.votes = votes_of(ask)
                given = reason.get("decision")
                decision: dict[str, Any] = given if isinstance(given, dict) else {}
                card.note = decision.get("note")
                if decision.get("verdict") == "respond":
                    card.note = str(decision.get("result") or "")  # what the model got instead
                elif isinstance(decision.get("arguments"), dict):
                    edited = json.dumps(decision["arguments"], ensure_ascii=False, sort_keys=True)
                    card.note = f"ran with edited arguments {edited}" + (f"; {card.note}" if card.note else "")
                self._replace(card)
                self._update_tool_call_for_ask(ask)
        elif kind == "recover":
            self._append(NoticeView(envelope.seq, "info", "Recovered: a worker was lost, the run continues"))
        elif kind == "retry":
            self._append(NoticeView(envelope.seq, "info", "Retrying the failed step"))

    def _on_message_start(self, envelope: Envelope) -> None:
        message_id = str(envelope.payload.get("message_id"))
        message = AssistantView(message_id, envelope.seq, envelope.invocation_id, envelope.payload.get("model"))
        message.turn_seq = self._turn_seq
        self.messages[message_id] = message
        self._last_assistant = message
        self._append(message)

    def _on_message_delta(self, envelope: Envelope) -> None:
        payload = envelope.payload
        message_id = str(payload.get("message_id"))
        message = self.messages.get(message_id)
        if message is None:  # a delta without a start (a bad journal): show it anyway
            message = AssistantView(message_id, envelope.seq, envelope.invocation_id)
            self.messages[message_id] = message
            self._last_assistant = message
            self._append(message)
        text = payload.get("text")
        reasoning = payload.get("reasoning")
        fresh = self._fresh(message)
        if isinstance(text, str) and text:
            message.text_parts.append(text)
            if not fresh:
                self.changes.text.setdefault(message.dom_id, []).append(text)
        if isinstance(reasoning, str) and reasoning:
            message.reasoning_parts.append(reasoning)
            if not fresh:
                self.changes.reasoning.setdefault(message.dom_id, []).append(reasoning)

    def _on_message_end(self, envelope: Envelope) -> None:
        message = self.messages.get(str(envelope.payload.get("message_id")))
        if message is None:
            return
        message.open = False
        message.end_seq = envelope.seq
        message.usage = envelope.payload.get("usage")
        message._html = None
        usage = envelope.payload.get("usage") or {}
        if isinstance(usage.get("input_tokens"), int):
            self.last_input_tokens = usage["input_tokens"]
        self._replace(message)

    def _on_tool_call(self, envelope: Envelope) -> None:
        payload = envelope.payload
        message_id = payload.get("message_id")
        message = self.messages.get(str(message_id)) if message_id is not None else self._last_assistant
        if message is None:
            message = self._last_assistant
        call = ToolCallView(
            tool_call_id=str(payload.get("tool_call_id")),
            name=str(payload.get("name", "")),
            arguments=payload.get("arguments", ""),
            message_id=message.message_id if message is not None else None,
            seq=envelope.seq,
        )
        self.tool_calls[call.tool_call_id] = call
        if message is None:  # a tool call with no assistant message: give it one
            message = AssistantView(f"orphan-{envelope.seq}", envelope.seq, envelope.invocation_id, open=False)
            message.end_seq = envelope.seq
            call.message_id = message.message_id
            self.messages[message.message_id] = message
            message.tool_calls.append(call)
            self._append(message)
            return
        message.tool_calls.append(call)
        if not self._fresh(message):
            self.changes.tool_calls_added.append(call)
            self._touched.add(id(call))

    def _on_tool_result(self, envelope: Envelope) -> None:
        payload = envelope.payload
        call = self.tool_calls.get(str(payload.get("tool_call_id")))
        if call is None:
            return
        content = payload.get("content", "")
        call.result = content if isinstance(content, str) else pretty_json(content)
        call.is_error = bool(payload.get("is_error"))
        call.media = result_attachments(payload.get("media"), self.session_id, self.missing_media)
        call.result_seq = envelope.seq
        call.awaiting_approval = False
        self._replace(call)
        # Its message's "fork from here" now reaches past this result.
        if call.message_id is not None and (message := self.messages.get(call.message_id)) is not None:
            if not message.open:
                self._replace(message)

    def _on_approval_requested(self, envelope: Envelope) -> None:
        ask = self.state.asks.get(str(envelope.payload.get("ask_id")))
        if ask is None:
            return
        card = ApprovalView.from_ask(ask, self.session_id)
        card.call_shown = str(ask.get("tool_call_id")) in self.tool_calls
        if card.is_pending and card.call_shown:
            card.turn_calls = self._turn_calls_waiting(self.tool_calls[str(ask.get("tool_call_id"))])
        self.approvals[card.ask_id] = card
        self._append(card)
        self._update_tool_call_for_ask(ask)

    def _on_approval_voted(self, envelope: Envelope) -> None:
        """A vote on an ask needing several approvals: the card shows it ("1 of 2
        approvals: bob"; the voter sees that they voted)."""
        ask_id = str(envelope.payload.get("ask_id"))
        card = self.approvals.get(ask_id)
        ask = self.state.asks.get(ask_id)
        if card is not None and ask is not None and card.is_pending:
            card.votes = votes_of(ask)
            self._replace(card)

    def _turn_calls_waiting(self, asked: ToolCallView) -> list[TurnCall]:
        """`turn_calls_waiting` from what this view model has seen of the transcript."""
        message = self.messages.get(asked.message_id) if asked.message_id is not None else None
        if message is None:
            return []
        siblings = message.tool_calls
        later = siblings[siblings.index(asked) + 1 :] if asked in siblings else []
        return [
            TurnCall(call.tool_call_id, call.name, call.arguments)
            for call in later
            if call.result is None and is_gated_tool(call.name)
        ]

    def _update_tool_call_for_ask(self, ask: dict[str, Any]) -> None:
        call = self.tool_calls.get(str(ask.get("tool_call_id")))
        if call is not None and call.result is None:
            call.awaiting_approval = ask.get("status") == "pending"
            self._replace(call)

    def _on_steer_received(self, envelope: Envelope) -> None:
        self._append(SteerView(envelope.seq, str(envelope.payload.get("text", "")), envelope.payload.get("author")))

    def _on_session_error(self, envelope: Envelope) -> None:
        payload = envelope.payload
        self._close_open_messages("interrupted by an error")
        retry = " (retryable)" if payload.get("retryable") else ""
        self._append(NoticeView(envelope.seq, "error", f"Error{retry}", str(payload.get("error", ""))))

    def _on_invocation_failed(self, envelope: Envelope) -> None:
        payload = envelope.payload
        self._close_open_messages("the run failed")
        hint = " You can retry it." if payload.get("retryable") else ""
        self._append(NoticeView(envelope.seq, "error", "The run failed." + hint, str(payload.get("error", ""))))

    def _on_invocation_cancelled(self, envelope: Envelope) -> None:
        self._close_open_messages("stopped")
        by = envelope.payload.get("by")
        self._append(NoticeView(envelope.seq, "stopped", f"Stopped by {by}" if by else "Stopped"))
        for card in self.approvals.values():
            ask = self.state.asks.get(card.ask_id, {})
            if card.status == "pending" and ask.get("status") == "withdrawn":
                card.status = "withdrawn"
                self._replace(card)

    def _on_invocation_completed(self, envelope: Envelope) -> None:
        self._close_open_messages(None)
        stop = envelope.payload.get("stop_reason", "end_turn")
        if stop not in ("end_turn", None):
            label = {
                "max_turns": "the turn limit",
                "max_tool_calls": "the tool call limit",
                "max_consecutive_failures": "too many failures in a row",
                "budget": "the token budget",
                "timeout": "the time limit",
                "cancelled": "a stop",
            }.get(str(stop), str(stop))
            text = f"The run ended at {label}"
            if stop == "budget" and envelope.payload.get("budget") == "team":
                text = "The run ended: the team's monthly budget is spent. A moderator of the team can raise it."
            self._append(NoticeView(envelope.seq, "stopped", text, f"stop reason: {stop}"))

    def _on_invocation_suspended(self, envelope: Envelope) -> None:
        self._close_open_messages(None)

    def _on_transcript_compacted(self, envelope: Envelope) -> None:
        payload = envelope.payload
        kept = payload.get("messages")
        messages: list[Any] = kept if isinstance(kept, list) else []
        forked = self.state.forked_from
        if forked and not any(not isinstance(item, NoticeView) for item in self.items):
            title, detail = FORK_NOTICES.get(str(forked.get("reason")), FORK_NOTICES["fork"])
            source_seq = forked.get("seq")
            self._append(
                NoticeView(
                    envelope.seq,
                    "fork",
                    title,
                    detail,
                    source_session_id=str(forked.get("session_id", "")) or None,
                    source_seq=source_seq if isinstance(source_seq, int) else None,
                )
            )
            self._append_history(envelope.seq, messages)
            return
        summary = payload.get("summary")
        detail = str(summary) if summary else f"{len(messages)} messages kept for the model"
        self._append(NoticeView(envelope.seq, "compaction", "Conversation compacted", detail))

    def _append_history(self, seq: int, messages: list[Any]) -> None:
        """A fork's inherited conversation, shown as (read-only) messages."""
        calls: dict[str, ToolCallView] = {}
        for index, message in enumerate(messages):
            if not isinstance(message, dict):
                continue
            key = f"{seq}-{index}"
            role = message.get("role")
            if role == "user":
                text, attachments = content_text_and_attachments(
                    message.get("content", ""), self.session_id, self.missing_media
                )
                self._append(UserView(seq * 10_000 + index, text, attachments, historic=True))
            elif role == "assistant":
                view = AssistantView(f"hist-{key}", seq, None, open=False, historic=True)
                view.end_seq = seq
                content = message.get("content")
                if isinstance(content, str):
                    view.text_parts.append(content)
                if isinstance(message.get("reasoning_content"), str):
                    view.reasoning_parts.append(message["reasoning_content"])
                for call in message.get("tool_calls") or []:
                    function = (call.get("function") or {}) if isinstance(call, dict) else {}
                    tool_call = ToolCallView(
                        tool_call_id=f"hist-{key}-{call.get('id')}",
                        name=str(function.get("name", "")),
                        arguments=function.get("arguments", ""),
                        message_id=view.message_id,
                        seq=seq,
                    )
                    calls[str(call.get("id"))] = tool_call
                    view.tool_calls.append(tool_call)
                self.messages[view.message_id] = view
                self._append(view)
            elif role == "tool":
                found = calls.get(str(message.get("tool_call_id")))
                if found is not None:
                    content = message.get("content", "")
                    found.result = content if isinstance(content, str) else pretty_json(content)

    def _close_open_messages(self, why: str | None) -> None:
        for message in self.messages.values():
            if message.open:
                message.open = False
                message.interrupted = why
                message.end_seq = message.end_seq or self.state.last_seq
                message._html = None
                self._replace(message)

    def _on_session_created(self, envelope: Envelope) -> None:
        self.changes.settings = True

    def _on_session_updated(self, envelope: Envelope) -> None:
        self.changes.settings = True
