"""The offline deterministic demo model (docs/journal.md).

Everything it says is a pure function of the request, so tests can assert exact
transcripts and token counts. The decision is made on the request's messages
(OpenAI-style dicts, as folded):

1. The last message is a tool result (one or several after the assistant's tool
   calls): ``NAME returned: <content>`` per result, one line each, or
   ``NAME was denied`` when the content starts with "denied".
2. Otherwise the last user message decides, in this order:
   - exactly ``please continue`` (crash stitching): carry on with the reply that was
     interrupted (``!slow N`` goes on from the next tick);
   - ``Summarize the conversation...`` (compaction): ``Summary: `` and the first five
     words of each earlier user message, joined with ``; ``;
   - ``request.metadata["steer"]`` set: ``Steer received: <text>``;
   - ``!system``: ``system: `` and the text of the system messages it was given, one
     per line (``system: (none)`` without any); ``!offered``: ``tools: `` and the sorted
     names of the tools it was offered, comma-separated (``tools: (none)``);
   - ``!tool NAME {json}``, ``!tools NAME {json} ; NAME {json} ...`` (several calls in
     one assistant message, parallel calls; the JSON may be left out, then ``{}``),
     ``!slow N``, ``!long N`` (N words, also when more words
     follow the number: ``!long 500 words of filler`` writes 500 words);
   - plain words: ``note: <text>`` calls write_note, ``calculate <expr>`` calls
     calculator, the word "time" calls get_time (the more specific pattern wins when
     several match); anything else is answered ``You said: <text>``.

Every tool call is preceded by a reasoning delta ``The user asked me to call NAME.``.
Usage counts one token per whitespace-separated word: input is every message's text
content, output is the text + reasoning + tool-call arguments actually streamed;
``reasoning_tokens`` (a part of ``output_tokens``, as with OpenAI) is reported when
there was reasoning.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from sectr.events import usage_dict
from sectr.providers.base import (
    CompletionRequest,
    Finish,
    ModelInfo,
    ReasoningDelta,
    StreamEvent,
    TextDelta,
    ToolCallDelta,
)
from sectr.providers.registry import lookup_model

CONTINUE_TEXT = "please continue"
SUMMARY_REQUEST_PREFIX = "Summarize the conversation"
SUMMARY_WORDS_PER_MESSAGE = 5
STEER_REPLY_PREFIX = "Steer received: "

LOREM = (
    "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor "
    "incididunt ut labore et dolore magna aliqua"
).split()

_TOOL_RE = re.compile(r"!tool\s+(\S+)\s*(.*)", re.DOTALL)
_TOOLS_RE = re.compile(r"!tools\s+(.+)", re.DOTALL)
_TOOLS_NAME_RE = re.compile(r"\s*([^\s{};]+)\s*")
_SLOW_RE = re.compile(r"!slow\s+(\d+)")
#: `!long N` may be followed by more words (a test prompt that says what it is for): N words.
_LONG_RE = re.compile(r"!long\s+(\d+)(?:\s.*)?", re.DOTALL)
_NOTE_RE = re.compile(r"\bnote:\s*(.+)", re.IGNORECASE | re.DOTALL)
_CALCULATE_RE = re.compile(r"\bcalculate\s+(.+)", re.IGNORECASE | re.DOTALL)
_TIME_RE = re.compile(r"\btime\b", re.IGNORECASE)
_TICK_RE = re.compile(r"tick (\d+)")
_CHUNK_RE = re.compile(r"\s*\S+\s*")


def _env_seconds(environ: Mapping[str, str], name: str, default_ms: float) -> float:
    raw = environ.get(name, "").strip()
    try:
        return max(float(raw), 0.0) / 1000 if raw else default_ms / 1000
    except ValueError:
        return default_ms / 1000


def count_words(text: str) -> int:
    return len(text.split())


def message_text(message: Mapping[str, Any]) -> str:
    """A message's text: its string content, or its text parts joined with spaces."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(
            str(part.get("text", "")) for part in content if isinstance(part, Mapping) and part.get("type") == "text"
        )
    return ""


def word_chunks(text: str) -> list[str]:
    """Split text into one-word chunks, each with the whitespace after it (lossless)."""
    chunks = _CHUNK_RE.findall(text)
    if not chunks and text:
        chunks = [text]
    return chunks


@dataclass
class DemoPlan:
    """What the demo model will say for a request, before pacing and limits."""

    reasoning: str = ""
    chunks: list[str] = field(default_factory=list)
    #: pace chunks with slow_delay (``!slow``), normal delay, or none at all (``!long``)
    pace: str = "normal"
    tool_calls: list[tuple[str, str]] = field(default_factory=list)  # (name, arguments JSON)

    @property
    def text(self) -> str:
        return "".join(self.chunks)


def _tool_plan(name: str, arguments: str) -> DemoPlan:
    return DemoPlan(reasoning=f"The user asked me to call {name}.", tool_calls=[(name, arguments)])


def _tools_plan(text: str) -> DemoPlan | None:
    """The plan of ``!tools NAME {json} ; NAME {json} ...``: one call each, in order (None
    when the text is not such a list)."""
    decoder = json.JSONDecoder()
    calls: list[tuple[str, str]] = []
    position = 0
    while True:
        match = _TOOLS_NAME_RE.match(text, position)
        if match is None:
            return None
        name, position = match.group(1), match.end()
        arguments: Any = {}
        if text.startswith("{", position):
            try:
                arguments, position = decoder.raw_decode(text, position)
            except ValueError:
                return None
            if not isinstance(arguments, dict):
                return None
        calls.append((name, json.dumps(arguments)))
        rest = text[position:].lstrip()
        if not rest:
            break
        if not rest.startswith(";"):
            return None
        position = len(text) - len(rest) + 1
    names = ", ".join(name for name, _ in calls)
    return DemoPlan(reasoning=f"The user asked me to call {names}.", tool_calls=calls)


def _text_plan(text: str) -> DemoPlan:
    return DemoPlan(chunks=word_chunks(text))


def _tool_results_reply(messages: list[dict[str, Any]]) -> DemoPlan:
    """Reply to the tool results at the end of `messages`, one line each, in order."""
    start = len(messages)
    while start > 0 and messages[start - 1].get("role") == "tool":
        start -= 1
    names: dict[str, str] = {}
    for message in reversed(messages[:start]):
        if message.get("role") == "assistant":
            for call in message.get("tool_calls") or []:
                function = call.get("function") or {}
                names[str(call.get("id"))] = str(function.get("name", "tool"))
            break
    lines = []
    for result in messages[start:]:
        name = names.get(str(result.get("tool_call_id")), str(result.get("name") or "tool"))
        content = message_text(result)
        if content.startswith("denied"):
            lines.append(f"{name} was denied")
        else:
            lines.append(f"{name} returned: {content}")
    return _text_plan("\n".join(lines))


def _summary_reply(messages: list[dict[str, Any]]) -> DemoPlan:
    heads = []
    for message in messages[:-1]:
        if message.get("role") == "user":
            words = message_text(message).split()[:SUMMARY_WORDS_PER_MESSAGE]
            if words:
                heads.append(" ".join(words))
    return _text_plan("Summary: " + ("; ".join(heads) if heads else "nothing was said yet"))


def _command_reply(text: str) -> DemoPlan:
    """The reply to a (non-steer) user message text."""
    stripped = text.strip()
    if (match := _TOOLS_RE.fullmatch(stripped)) and (plan := _tools_plan(match.group(1))) is not None:
        return plan
    if match := _TOOL_RE.fullmatch(stripped):
        return _tool_plan(match.group(1), match.group(2).strip() or "{}")
    if match := _SLOW_RE.fullmatch(stripped):
        count = int(match.group(1))
        return DemoPlan(chunks=[f"tick {i} " for i in range(1, count + 1)], pace="slow")
    if match := _LONG_RE.fullmatch(stripped):
        count = int(match.group(1))
        words = [LOREM[i % len(LOREM)] for i in range(count)]
        return DemoPlan(chunks=word_chunks(" ".join(words)), pace="none")
    if match := _NOTE_RE.search(stripped):
        body = match.group(1).strip()
        title = " ".join(body.split()[:5])
        return _tool_plan("write_note", json.dumps({"title": title, "body": body}))
    if match := _CALCULATE_RE.search(stripped):
        expression = match.group(1).strip().rstrip("?!. ").strip()
        return _tool_plan("calculator", json.dumps({"expression": expression}))
    if _TIME_RE.search(stripped):
        return _tool_plan("get_time", "{}")
    return _text_plan(f"You said: {stripped}")


def _media_note(message: Mapping[str, Any]) -> str:
    """Reasoning that acknowledges the media parts of a user message, if any."""
    content = message.get("content")
    if not isinstance(content, list):
        return ""
    images = sum(1 for part in content if isinstance(part, Mapping) and part.get("type") == "image_url")
    audios = sum(1 for part in content if isinstance(part, Mapping) and part.get("type") == "input_audio")
    seen = [f"{n} {kind}{'s' if n > 1 else ''}" for n, kind in ((images, "image"), (audios, "audio clip")) if n]
    return f"I received {' and '.join(seen)}." if seen else ""


def _last_user_index(messages: list[dict[str, Any]]) -> int | None:
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].get("role") == "user":
            return index
    return None


def _drop_prefix(chunks: list[str], prefix_len: int) -> list[str]:
    """The chunks left after the first `prefix_len` characters (a straddling chunk is cut)."""
    rest: list[str] = []
    consumed = 0
    for chunk in chunks:
        if consumed >= prefix_len:
            rest.append(chunk)
        elif consumed + len(chunk) > prefix_len:
            rest.append(chunk[prefix_len - consumed :])
        consumed += len(chunk)
    return rest


def _continuation_reply(messages: list[dict[str, Any]]) -> DemoPlan:
    """Carry on with the reply a crash interrupted (last message: "please continue")."""
    cut = len(messages) - 1
    if cut == 0 or messages[cut - 1].get("role") != "assistant":
        return _text_plan("There is nothing to continue.")
    partial = messages[cut - 1]
    content = partial.get("content")
    partial_text = content if isinstance(content, str) else ""
    # What the interrupted reply would have been: the same decision, made on the
    # context the interrupted step saw (everything before the partial message).
    context = messages[: cut - 1]
    # A steer is known only from request metadata, which a continuation no longer
    # carries; the interrupted text itself says whether it was answering one.
    was_steer = bool(partial_text) and (
        partial_text.startswith(STEER_REPLY_PREFIX) or STEER_REPLY_PREFIX.startswith(partial_text)
    )
    full = plan_reply(context, {"steer": True} if was_steer else {})

    if full.pace == "slow" and (ticks := _TICK_RE.findall(partial_text)):
        done = int(ticks[-1])
        full.chunks = [chunk for chunk in full.chunks if int(chunk.split()[1]) > done]
    elif partial_text and full.text.startswith(partial_text):
        full.chunks = _drop_prefix(full.chunks, len(partial_text))
    if full.reasoning and partial.get("reasoning_content") == full.reasoning:
        full.reasoning = ""  # already said before the crash
    return full


def _system_reply(messages: list[dict[str, Any]]) -> DemoPlan:
    texts = [message_text(m) for m in messages if m.get("role") == "system"]
    return _text_plan("system: " + ("\n".join(texts) if texts else "(none)"))


def _offered_reply(tools: list[dict[str, Any]]) -> DemoPlan:
    names = sorted(str((t.get("function") or {}).get("name", "")) for t in tools)
    return _text_plan("tools: " + (", ".join(names) if names else "(none)"))


def plan_reply(
    messages: list[dict[str, Any]],
    metadata: Mapping[str, Any] | None = None,
    tools: list[dict[str, Any]] | None = None,
) -> DemoPlan:
    """The demo model's deterministic answer to `messages` (see the module docstring)."""
    metadata = metadata or {}
    if not messages:
        return _text_plan("You said: ")
    if messages[-1].get("role") == "tool":
        return _tool_results_reply(messages)
    user_index = _last_user_index(messages)
    if user_index is None:
        return _text_plan("You said: ")
    user_message = messages[user_index]
    text = message_text(user_message)
    if user_index == len(messages) - 1 and text.strip() == CONTINUE_TEXT:
        return _continuation_reply(messages)
    if text.lstrip().startswith(SUMMARY_REQUEST_PREFIX):
        return _summary_reply(messages[: user_index + 1])
    steer = metadata.get("steer")
    if steer:
        steer_text = steer if isinstance(steer, str) else text
        return _text_plan(f"{STEER_REPLY_PREFIX}{steer_text.strip()}")
    if text.strip() == "!system":
        return _system_reply(messages)
    if text.strip() == "!offered":
        return _offered_reply(tools or [])
    plan = _command_reply(text)
    if note := _media_note(user_message):
        plan.reasoning = f"{note} {plan.reasoning}".strip()
    return plan


def _request_input_tokens(messages: list[dict[str, Any]]) -> int:
    return sum(count_words(message_text(message)) for message in messages)


class DemoProvider:
    """The offline model: streams its plan word by word, a few milliseconds apart."""

    provider_id = "demo"

    def __init__(
        self,
        *,
        delay: float | None = None,
        slow_delay: float | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        env = os.environ if environ is None else environ
        #: seconds between two chunks (env SECTR_DEMO_DELAY_MS, default 5 ms)
        self.delay = _env_seconds(env, "SECTR_DEMO_DELAY_MS", 5) if delay is None else delay
        #: seconds between two ``!slow`` ticks (env SECTR_DEMO_SLOW_MS, default 100 ms)
        self.slow_delay = _env_seconds(env, "SECTR_DEMO_SLOW_MS", 100) if slow_delay is None else slow_delay
        self._environ = env
        #: Benchmarks only (env SECTR_DEMO_STAMP_FILE): the moment each ``!slow`` tick is
        #: produced is appended to this file as ``<session id> <tick> <unix time>``, so a
        #: bench can time every chunk from its production to its frame at the client.
        #: A side file, not a field of the delta: the journal and the frames stay exactly
        #: what they are without it (nothing the measured path does changes but one
        #: short append, taken after the stamp).
        self._stamp_path = env.get("SECTR_DEMO_STAMP_FILE", "").strip()
        self._stamp_fd: int | None = None

    def _stamp(self, conversation_id: str, chunk: str) -> None:
        produced = time.time()
        if self._stamp_fd is None:
            self._stamp_fd = os.open(self._stamp_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        tick = chunk.split()[1]
        # One write per line with O_APPEND: lines of every process stay whole in one file.
        os.write(self._stamp_fd, f"{conversation_id or '-'} {tick} {produced:.6f}\n".encode())

    def model_info(self, model: str) -> ModelInfo:
        # Whatever id the session names, the demo model is what answers.
        info = lookup_model("demo", self.provider_id, environ=self._environ)
        return ModelInfo(
            model_id=model or "demo",
            provider_id=self.provider_id,
            context_window=info.context_window,
            reasoning=info.reasoning,
            image_input=info.image_input,
            audio_input=info.audio_input,
        )

    async def stream(self, request: CompletionRequest) -> AsyncIterator[StreamEvent]:
        messages = request.messages
        plan = plan_reply(messages, request.metadata, request.tools)
        limit = request.max_output_tokens
        input_tokens = _request_input_tokens(messages)
        output_tokens = 0
        reasoning_tokens = 0

        def fits(words: int) -> bool:
            return limit is None or output_tokens + words <= limit

        def finish(reason: str) -> Finish:
            return Finish(reason, usage_dict(input_tokens, output_tokens, reasoning_tokens=reasoning_tokens))

        if plan.reasoning:
            for index, chunk in enumerate(word_chunks(plan.reasoning)):
                if not fits(count_words(chunk)):
                    yield finish("length")
                    return
                if index:
                    await asyncio.sleep(self.delay)
                output_tokens += count_words(chunk)
                reasoning_tokens += count_words(chunk)
                yield ReasoningDelta(chunk)

        pause = {"slow": self.slow_delay, "normal": self.delay, "none": 0.0}[plan.pace]
        for index, chunk in enumerate(plan.chunks):
            if not fits(count_words(chunk)):
                yield finish("length")
                return
            if index or plan.reasoning:
                await asyncio.sleep(pause)
            output_tokens += count_words(chunk)
            if self._stamp_path and plan.pace == "slow":
                self._stamp(request.conversation_id, chunk)
            yield TextDelta(chunk)

        if plan.tool_calls:
            digest = hashlib.sha1(
                json.dumps(messages, sort_keys=True, default=str).encode(), usedforsecurity=False
            ).hexdigest()[:8]
            for index, (name, arguments) in enumerate(plan.tool_calls):
                if not fits(count_words(arguments)):
                    yield finish("length")
                    return
                await asyncio.sleep(self.delay)
                output_tokens += count_words(arguments)
                yield ToolCallDelta(id=f"call_{len(messages)}_{index}_{digest}", name=name, arguments=arguments)
            yield finish("tool_calls")
            return
        yield finish("stop")
