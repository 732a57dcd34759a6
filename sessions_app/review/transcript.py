"""A session's journal as a read-only timeline for people: the review page, shared
links and the Markdown export all read it.

Unlike the chat's view model (built to be patched live), this is one pass over the
envelopes that keeps everything a reviewer asks about: who sent what and when, tool
calls with their results, asks and the decisions on them (who, verdict, note, rule),
votes, steers, compactions, errors and how each invocation ended.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.utils.safestring import SafeString

from sectr.events import Envelope, EventType
from sessions_app.display.content import Attachment, content_text_and_attachments, pretty_json, result_attachments
from sessions_app.display.markdown import render_markdown


def pretty(value: Any) -> str:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return value
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)


@dataclass
class ToolCallEntry:
    tool_call_id: str
    name: str
    arguments: str
    seq: int
    result: str | None = None
    is_error: bool = False
    #: The seq of a result shown as its own entry further down (it came after an ask,
    #: a decision or anything else the timeline shows after the call).
    result_seq: int | None = None
    #: The images and audio its result stored.
    media: list[Attachment] = field(default_factory=list)

    @property
    def arguments_pretty(self) -> str:
        return pretty(self.arguments)


@dataclass
class TimelineEntry:
    """One thing on the timeline. `kind` picks the template block:
    user, assistant, steer, ask, decision, vote, result, compaction, error, ended, created,
    settings. Entries are in seq order: a tool result that came after something else the
    timeline shows (its ask, the decision) is its own `result` entry, never shown above them."""

    kind: str
    seq: int
    at: datetime
    text: str = ""
    who: str = ""
    model: str = ""
    message_id: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCallEntry] = field(default_factory=list)
    attachments: list[Any] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    usage: dict[str, int] = field(default_factory=dict)

    @property
    def html(self) -> SafeString:
        return render_markdown(self.text)

    @property
    def role(self) -> str:
        return {"user": "user", "assistant": "assistant", "steer": "user"}.get(self.kind, "event")


def decision_source(approver: str | None) -> str:
    """ "rule 3" for an automatic rule decision, "policy: expired" for an expiry, else"""
    if not approver:
        return ""
    if approver.startswith("rule:"):
        return f"rule {approver[5:]}"
    if approver.startswith("policy:"):
        return f"policy: {approver[7:]}"
    return ""


def build_timeline(
    envelopes: Iterable[Envelope], media_session: str = "", missing_media: frozenset[str] = frozenset()
) -> list[TimelineEntry]:
    """The timeline of `envelopes`. With `media_session` (the session's id, for a page
    whose viewer may read it), stored media link to the session's media view; without,
    they are named only (a shared link's visitor could not fetch them). Those in
    `missing_media` (sha256s the viewer cannot read here) are named as not available."""
    entries: list[TimelineEntry] = []
    messages: dict[str, TimelineEntry] = {}
    calls: dict[str, ToolCallEntry] = {}
    holders: dict[str, TimelineEntry] = {}  # tool call id -> the entry showing the call
    asks: dict[str, dict[str, Any]] = {}
    for env in envelopes:
        p = env.payload
        t = env.type.value if isinstance(env.type, EventType) else str(env.type)
        if t == "SESSION_CREATED":
            entries.append(
                TimelineEntry("created", env.seq, env.created_at, details={k: v for k, v in p.items() if v is not None})
            )
        elif t == "SESSION_UPDATED":
            entries.append(TimelineEntry("settings", env.seq, env.created_at, details=dict(p)))
        elif t == "INVOCATION_STARTED":
            reason = p.get("reason") or {}
            if reason.get("kind") == "user_message":
                text, attachments = content_text_and_attachments(
                    (reason.get("input") or {}).get("content"), "", missing_media
                )
                entries.append(
                    TimelineEntry(
                        "user",
                        env.seq,
                        env.created_at,
                        text=text,
                        who=reason.get("author") or "",
                        attachments=attachments,
                    )
                )
            elif reason.get("kind") == "approval_decision":
                decision = reason.get("decision") or {}
                ask = asks.get(str(reason.get("ask_id")), {})
                approver = decision.get("approver") or ""
                verdict = decision.get("verdict") or ("allow_once" if decision.get("approved") else "deny")
                entries.append(
                    TimelineEntry(
                        "decision",
                        env.seq,
                        env.created_at,
                        who=approver,
                        # a response's text is what the model got instead of the call
                        text=str(decision.get("result") if verdict == "respond" else decision.get("note") or ""),
                        details={
                            "run_arguments": pretty_json(decision["arguments"])
                            if isinstance(decision.get("arguments"), dict)
                            else "",
                            "verdict": verdict,
                            "tool": ask.get("name", ""),
                            "rule": decision_source(approver),
                            "ask_id": reason.get("ask_id"),
                        },
                    )
                )
            elif reason.get("kind") in ("retry", "recover"):
                entries.append(TimelineEntry(str(reason["kind"]), env.seq, env.created_at))
        elif t == "MESSAGE_START":
            entry = TimelineEntry(
                "assistant",
                env.seq,
                env.created_at,
                model=str(p.get("model") or ""),
                message_id=str(p.get("message_id")),
            )
            messages[entry.message_id] = entry
            entries.append(entry)
        elif t == "MESSAGE_DELTA":
            message = messages.get(str(p.get("message_id")))
            if message is not None:
                message.text += str(p.get("text") or "")
                message.reasoning += str(p.get("reasoning") or "")
        elif t == "MESSAGE_END":
            message = messages.get(str(p.get("message_id")))
            if message is not None:
                message.usage = dict(p.get("usage") or {})
                message.details["end_seq"] = env.seq
                message.details["finish_reason"] = p.get("finish_reason")
        elif t == "TOOL_CALL":
            call = ToolCallEntry(str(p.get("tool_call_id")), str(p.get("name")), str(p.get("arguments", "")), env.seq)
            calls[call.tool_call_id] = call
            message = messages.get(str(p.get("message_id")))
            if message is None:
                message = TimelineEntry("assistant", env.seq, env.created_at)
                entries.append(message)
            message.tool_calls.append(call)
            holders[call.tool_call_id] = message
        elif t == "TOOL_RESULT":
            answered = calls.get(str(p.get("tool_call_id")))
            if answered is None:
                continue
            answered.media = result_attachments(p.get("media"), media_session, missing_media)
            if entries and entries[-1] is holders.get(answered.tool_call_id):
                answered.result = str(p.get("content", ""))
                answered.is_error = bool(p.get("is_error"))
            else:
                answered.result_seq = env.seq
                entries.append(
                    TimelineEntry(
                        "result",
                        env.seq,
                        env.created_at,
                        text=str(p.get("content", "")),
                        details={"tool": answered.name, "is_error": bool(p.get("is_error")), "call_seq": answered.seq},
                        attachments=answered.media,
                    )
                )
        elif t == "APPROVAL_REQUESTED":
            asks[str(p.get("ask_id"))] = p
            entries.append(
                TimelineEntry(
                    "ask",
                    env.seq,
                    env.created_at,
                    details={"tool": p.get("name"), "arguments": pretty(p.get("arguments")), "ask_id": p.get("ask_id")},
                )
            )
        elif t == "APPROVAL_VOTED":
            entries.append(
                TimelineEntry(
                    "vote",
                    env.seq,
                    env.created_at,
                    who=str(p.get("approver") or ""),
                    text=str(p.get("note") or ""),
                    details={"verdict": p.get("verdict"), "ask_id": p.get("ask_id")},
                )
            )
        elif t == "STEER_RECEIVED":
            entries.append(
                TimelineEntry(
                    "steer", env.seq, env.created_at, text=str(p.get("text", "")), who=str(p.get("author") or "")
                )
            )
        elif t == "TRANSCRIPT_COMPACTED":
            entries.append(
                TimelineEntry(
                    "compaction",
                    env.seq,
                    env.created_at,
                    text=str(p.get("summary") or ""),
                    details={"through_seq": p.get("through_seq"), "kept": len(p.get("messages") or [])},
                )
            )
        elif t == "SESSION_ERROR":
            entries.append(
                TimelineEntry(
                    "error",
                    env.seq,
                    env.created_at,
                    text=str(p.get("error", "")),
                    details={"retryable": p.get("retryable")},
                )
            )
        elif t in ("INVOCATION_COMPLETED", "INVOCATION_FAILED", "INVOCATION_CANCELLED", "INVOCATION_SUSPENDED"):
            details: dict[str, Any] = {"how": t.removeprefix("INVOCATION_").lower()}
            if t == "INVOCATION_COMPLETED":
                details["stop_reason"] = p.get("stop_reason")
            elif t == "INVOCATION_FAILED":
                details["error"] = p.get("error")
            elif t == "INVOCATION_CANCELLED":
                details["by"] = p.get("by")
            entries.append(TimelineEntry("ended", env.seq, env.created_at, details=details))
    return entries


def _media_lines(media: list[Attachment]) -> list[str]:
    """A tool result's stored media in Markdown: each named with its reference (the JSON
    export holds the same references; the bytes are fetched from the session's media)."""
    if not media:
        return []
    return [f"- {a.kind}: {a.label} <{a.ref}>" for a in media] + [""]


def timeline_markdown(title: str, session_id: str, entries: list[TimelineEntry]) -> str:
    """The transcript as Markdown (`Export Markdown`)."""
    lines = [f"# {title or 'Untitled session'}", "", f"Session `{session_id}`", ""]
    for e in entries:
        when = e.at.strftime("%Y-%m-%d %H:%M:%S UTC")
        if e.kind == "user":
            lines += [f"## User{f' ({e.who})' if e.who else ''} · {when}", "", e.text, ""]
            lines += [f"- attachment: {a.label}" for a in e.attachments]
        elif e.kind == "assistant":
            lines += [f"## Assistant{f' ({e.model})' if e.model else ''} · {when}", ""]
            if e.reasoning:
                lines += ["> " + line for line in e.reasoning.splitlines()] + [""]
            if e.text:
                lines += [e.text, ""]
            for call in e.tool_calls:
                lines += [f"**Tool call** `{call.name}`", "", "```json", call.arguments_pretty, "```", ""]
                if call.result is not None:
                    label = "Tool error" if call.is_error else "Tool result"
                    lines += [f"**{label}**", "", "```", call.result, "```", ""]
                lines += _media_lines(call.media)
        elif e.kind == "result":
            label = "Tool error" if e.details["is_error"] else "Tool result"
            lines += [f"**{label}** `{e.details['tool']}` · {when}", "", "```", e.text, "```", ""]
            lines += _media_lines(e.attachments)
        elif e.kind == "steer":
            lines += [f"## Steer{f' ({e.who})' if e.who else ''} · {when}", "", e.text, ""]
        elif e.kind == "ask":
            lines += [f"*Approval asked for `{e.details['tool']}` · {when}*", ""]
        elif e.kind == "decision":
            rule = f" by {e.details['rule']}" if e.details.get("rule") else ""
            note = f": {e.text}" if e.text else ""
            lines += [f"*{e.details['verdict']} by {e.who or 'someone'}{rule} · {when}{note}*", ""]
        elif e.kind == "vote":
            lines += [f"*vote {e.details['verdict']} by {e.who} · {when}*", ""]
        elif e.kind == "compaction":
            lines += [f"*Compacted through #{e.details['through_seq']} · {when}*", "", e.text, ""]
        elif e.kind == "error":
            lines += [f"*Error · {when}: {e.text}*", ""]
        elif e.kind == "ended":
            extra = e.details.get("stop_reason") or e.details.get("error") or e.details.get("by") or ""
            lines += [f"*Run {e.details['how']}{f': {extra}' if extra else ''} · {when}*", ""]
    return "\n".join(lines).rstrip() + "\n"
