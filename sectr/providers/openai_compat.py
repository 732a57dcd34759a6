"""A provider for any OpenAI-compatible chat completions server, through the `openai` package.

Works against OpenAI, Ollama, vLLM, llama.cpp server, LM Studio and OpenRouter. The
stream is read chunk by chunk: text and reasoning deltas are passed on as they come;
tool calls, which servers split over many chunks (id and name first, the arguments in
pieces, parallel calls told apart by ``index``), are assembled and emitted complete,
in index order, when the choice finishes; usage comes from the last chunk (whose
``choices`` may be empty).

Errors become :class:`sectr.errors.ProviderError`: 408, 409, 429 and 5xx answers,
connection failures, timeouts and a stream that breaks off before its choice
finished are retryable (the same statuses the `openai` package itself would retry);
other 4xx answers are permanent.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx
import httpx2
import openai
from openai.types.chat import ChatCompletionChunk
from openai.types.completion_usage import CompletionUsage

from sectr.errors import ProviderError
from sectr.events import usage_dict
from sectr.loops import PerLoop
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

DEFAULT_TIMEOUT = 600.0

#: The message keys the chat completions API accepts. The fold adds
#: ``reasoning_content`` to assistant messages; several servers (DeepSeek, OpenAI)
#: answer 400 when it is sent back, so it is dropped.
_MESSAGE_KEYS = ("role", "content", "name", "tool_calls", "tool_call_id")

_RETRYABLE_STATUSES = frozenset({408, 409, 429})

#: Transport failures that can surface while a stream is read (the openai package
#: wraps most of them in APIConnectionError; these are the ones it may not).
_TRANSPORT_ERRORS: tuple[type[Exception], ...] = (httpx.HTTPError, httpx2.HTTPError)
_STREAM_ERRORS: tuple[type[Exception], ...] = (openai.APIError, *_TRANSPORT_ERRORS)


def is_retryable_status(status: int) -> bool:
    return status in _RETRYABLE_STATUSES or status >= 500


def provider_error_from(exc: Exception, *, mid_stream: bool = False) -> ProviderError:
    """Classify an exception from the `openai` package (or its transport)."""
    if isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        body = exc.body
        detail = body.get("message") if isinstance(body, dict) else None
        return ProviderError(
            f"model server answered HTTP {status}: {detail if isinstance(detail, str) else exc.message}",
            retryable=is_retryable_status(status),
            status=status,
        )
    if isinstance(exc, openai.APITimeoutError):
        return ProviderError(f"model server timed out: {exc}", retryable=True)
    if isinstance(exc, openai.APIConnectionError):
        where = "during the stream" if mid_stream else "before the stream"
        cause = exc.__cause__ or exc
        return ProviderError(f"connection to the model server failed {where}: {cause}", retryable=True)
    if isinstance(exc, openai.APIError):
        # An error event inside the stream (OpenRouter reports upstream failures so) or
        # a response that could not be read: the next attempt may well succeed.
        return ProviderError(f"model server stream failed: {exc.message}", retryable=True)
    if isinstance(exc, _TRANSPORT_ERRORS):
        return ProviderError(f"connection to the model server dropped: {exc!r}", retryable=True)
    raise TypeError(f"not a provider error: {exc!r}") from exc


def to_openai_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The folded messages as the API takes them: known keys only; content parts
    (text, image_url, input_audio) are passed through unchanged."""
    return [{key: message[key] for key in _MESSAGE_KEYS if key in message} for message in messages]


def usage_from(usage: CompletionUsage) -> dict[str, int]:
    details = usage.completion_tokens_details
    prompt_details = usage.prompt_tokens_details
    return usage_dict(
        input_tokens=usage.prompt_tokens or 0,
        output_tokens=usage.completion_tokens or 0,
        reasoning_tokens=(details.reasoning_tokens or 0) if details else 0,
        cached_input_tokens=(prompt_details.cached_tokens or 0) if prompt_details else 0,
    )


def _extra_text(delta: Any, *names: str) -> str:
    """A non-standard string field of a delta (``reasoning_content``, ``reasoning``)."""
    extra: Mapping[str, Any] = getattr(delta, "model_extra", None) or {}
    for name in names:
        value = extra.get(name)
        if value is None:
            value = getattr(delta, name, None)
        if isinstance(value, str) and value:
            return value
    return ""


@dataclass
class _PendingToolCall:
    index: int
    id: str
    name: str
    arguments: str


class _ToolCallAssembler:
    """Collects tool-call fragments by index until the choice finishes."""

    def __init__(self) -> None:
        self._calls: list[_PendingToolCall] = []

    def add(self, fragments: list[Any]) -> None:
        for fragment in fragments:
            function = fragment.function
            name = (function.name if function else None) or ""
            arguments = (function.arguments if function else None) or ""
            if isinstance(fragment.index, int):
                index = fragment.index
                call = self._latest(index)
            else:  # no index at all: an id starts a call, anything else continues the last
                call = self._calls[-1] if self._calls and not fragment.id else None
                index = call.index if call else max((c.index for c in self._calls), default=-1) + 1
            # Some servers reuse index 0 for every call; a new id means a new call.
            if call is None or (fragment.id and call.id and fragment.id != call.id):
                call = _PendingToolCall(index=index, id=fragment.id or "", name="", arguments="")
                self._calls.append(call)
            if fragment.id and not call.id:
                call.id = fragment.id
            if name and not call.name:
                call.name = name
            call.arguments += arguments

    def _latest(self, index: int) -> _PendingToolCall | None:
        for call in reversed(self._calls):
            if call.index == index:
                return call
        return None

    def __len__(self) -> int:
        return len(self._calls)

    def drain(self) -> list[ToolCallDelta]:
        # sorted() is stable: calls sharing an index keep their arrival order.
        calls = sorted(self._calls, key=lambda call: call.index)
        self._calls = []
        return [
            ToolCallDelta(id=call.id or f"call_{secrets.token_hex(8)}", name=call.name, arguments=call.arguments)
            for call in calls
        ]


class OpenAIProvider:
    """Streams chat completions from an OpenAI-compatible server."""

    provider_id = "openai"

    def __init__(
        self,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        default_model: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        self.base_url = base_url or None
        self.api_key = api_key or "not-needed"
        self.default_model = default_model or ""
        self.timeout = timeout
        # One client per event loop: an httpx connection pool must not outlive or
        # cross the loop it was made in (tests run a loop each, workers one for all).
        self._clients: PerLoop[openai.AsyncOpenAI] = PerLoop(self._new_client)

    def model_info(self, model: str) -> ModelInfo:
        return lookup_model(model or self.default_model, self.provider_id)

    def _new_client(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=self.base_url, api_key=self.api_key, max_retries=0, timeout=self.timeout)

    def _client(self) -> openai.AsyncOpenAI:
        return self._clients.get()

    async def aclose(self) -> None:
        """Close the current event loop's HTTP client (others close with their loop)."""
        client = self._clients.pop()
        if client is not None:
            await client.close()

    def _max_tokens_key(self) -> str:
        # OpenAI's reasoning models refuse max_tokens; many local servers only know it.
        host = urlsplit(self.base_url).hostname if self.base_url else "api.openai.com"
        return "max_completion_tokens" if host == "api.openai.com" else "max_tokens"

    def request_body(self, request: CompletionRequest) -> dict[str, Any]:
        """The keyword arguments of ``chat.completions.create`` for `request`."""
        model = request.model or self.default_model
        if not model:
            raise ProviderError("no model configured (set SECTR_MODEL)", retryable=False)
        body: dict[str, Any] = {
            "model": model,
            "messages": to_openai_messages(request.messages),
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if request.tools:
            body["tools"] = request.tools
        if request.reasoning_effort:
            body["reasoning_effort"] = request.reasoning_effort
        if request.max_output_tokens:
            body[self._max_tokens_key()] = request.max_output_tokens
        if request.temperature is not None:
            body["temperature"] = request.temperature
        return body

    async def stream(self, request: CompletionRequest) -> AsyncIterator[StreamEvent]:
        body = self.request_body(request)
        try:
            response = await self._client().chat.completions.create(**body)
        except _STREAM_ERRORS as exc:
            raise provider_error_from(exc) from exc

        tool_calls = _ToolCallAssembler()
        finish_reason: str | None = None
        had_tool_calls = False
        usage: dict[str, int] | None = None
        try:
            async for chunk in response:
                if chunk.usage is not None:
                    usage = usage_from(chunk.usage)
                for event in self._chunk_events(chunk, tool_calls):
                    yield event
                for choice in chunk.choices:
                    if choice.index == 0 and choice.finish_reason:
                        finish_reason = choice.finish_reason
                        had_tool_calls = had_tool_calls or len(tool_calls) > 0
                        for call in tool_calls.drain():
                            yield call
        except _STREAM_ERRORS as exc:
            if finish_reason is None:
                raise provider_error_from(exc, mid_stream=True) from exc
            # The answer is complete; only the trailing usage chunk was lost.
        finally:
            await response.close()

        if finish_reason is None:
            # The body ended cleanly but the choice never finished: a proxy or server
            # cut the stream short. What was streamed is partial.
            raise ProviderError("the model server's stream ended before the answer finished", retryable=True)
        if had_tool_calls and finish_reason == "stop":
            finish_reason = "tool_calls"  # Ollama and some llama.cpp builds say "stop"
        yield Finish(finish_reason, usage)

    @staticmethod
    def _chunk_events(chunk: ChatCompletionChunk, tool_calls: _ToolCallAssembler) -> list[StreamEvent]:
        events: list[StreamEvent] = []
        for choice in chunk.choices:
            if choice.index != 0:  # n=1 is asked for; ignore anything else
                continue
            delta = choice.delta
            reasoning = _extra_text(delta, "reasoning_content", "reasoning")
            if reasoning:
                events.append(ReasoningDelta(reasoning))
            if delta.content:
                events.append(TextDelta(delta.content))
            if delta.tool_calls:
                tool_calls.add(list(delta.tool_calls))
        return events
