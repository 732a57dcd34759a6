"""Transcript compaction: a model-written summary plus the recent messages verbatim.

A TRANSCRIPT_COMPACTED envelope replaces everything before it in the fold, so an
invocation only loads and folds what came after the newest compaction.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from sectr.errors import ProviderError
from sectr.events import EventType
from sectr.providers.base import CompletionRequest, Provider, TextDelta

if TYPE_CHECKING:
    from sectr.context import SessionContext

log = logging.getLogger("sectr.compaction")

#: Messages kept verbatim after the summary (at least; more to avoid a bad split).
KEEP_RECENT = 4
#: Automatic compaction starts when a prompt would pass this share of the context window.
AUTO_COMPACT_THRESHOLD = 0.8
SUMMARY_PROMPT = (
    "Summarize the conversation so far for your own later use: the user's goals, facts learned, "
    "decisions made, tool results that matter and open tasks. Be concise."
)
SUMMARY_PREFIX = "Summary of the earlier conversation:\n"


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def estimate_tokens(messages: list[dict[str, Any]]) -> int:
    """A cheap, provider-independent estimate: max(words, characters / 4) plus overhead."""
    words = chars = 0
    for message in messages:
        text = _text_of(message.get("content")) + _text_of(message.get("reasoning_content"))
        for call in message.get("tool_calls") or ():
            text += " " + call["function"]["name"] + " " + call["function"]["arguments"]
        words += len(text.split())
        chars += len(text)
    return max(words, chars // 4) + 4 * len(messages)


def split_point(messages: list[dict[str, Any]], keep_recent: int = KEEP_RECENT) -> int:
    """Index where the verbatim tail starts: never at a tool message, so no tool result is
    ever separated from the assistant message that called it. 0 means nothing to compact."""
    index = max(len(messages) - keep_recent, 0)
    while index > 0 and messages[index].get("role") == "tool":
        index -= 1
    return index


async def summarize(provider: Provider, model: str, messages: list[dict[str, Any]]) -> str:
    request = CompletionRequest(model=model, messages=[*messages, {"role": "user", "content": SUMMARY_PROMPT}])
    parts: list[str] = []
    async for event in provider.stream(request):
        if isinstance(event, TextDelta):
            parts.append(event.text)
    return "".join(parts).strip()


async def compacted_payload(
    provider: Provider, model: str, messages: list[dict[str, Any]], through_seq: int, keep_recent: int = KEEP_RECENT
) -> dict[str, Any] | None:
    """The TRANSCRIPT_COMPACTED payload for `messages`, or None when it would not shorten them."""
    split = split_point(messages, keep_recent)
    if split <= 1:
        return None
    summary = await summarize(provider, model, messages[:split])
    new_messages = [{"role": "system", "content": SUMMARY_PREFIX + summary}, *messages[split:]]
    if len(new_messages) >= len(messages):
        return None
    return {"messages": new_messages, "summary": summary, "through_seq": through_seq}


async def auto_compact(ctx: SessionContext) -> bool:
    """Compact inside a run, before a model step, when the prompt nears the context window."""
    messages = ctx.messages
    if estimate_tokens(messages) <= AUTO_COMPACT_THRESHOLD * ctx.model_info.context_window:
        return False
    await ctx.writer.flush()
    through = ctx.transcript[-1].seq if ctx.transcript else 0
    try:
        payload = await compacted_payload(ctx.provider, ctx.model, messages, through)
    except ProviderError as exc:
        # Best effort: the model step goes ahead uncompacted (and meets the provider's
        # own retry and error handling) rather than failing the run over a summary.
        log.warning("automatic compaction skipped: the summary request failed: %s", exc)
        return False
    if payload is None:
        return False
    await ctx.writer.emit(EventType.TRANSCRIPT_COMPACTED, payload)
    return True
