"""What a model provider is: a stream of text, reasoning, complete tool calls and usage."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class ModelInfo:
    """One entry of the model registry (sectr.providers.registry)."""

    model_id: str
    provider_id: str
    context_window: int
    reasoning: bool = False
    image_input: bool = False
    audio_input: bool = False


@dataclass
class CompletionRequest:
    model: str
    messages: list[dict[str, Any]]  # OpenAI-style, as folded
    tools: list[dict[str, Any]] = field(default_factory=list)  # OpenAI function schemas
    reasoning_effort: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    #: Facts about the request the messages alone cannot show, e.g. {"steer": text} when
    #: the newest user message came from a steer. Real providers ignore it.
    metadata: dict[str, Any] = field(default_factory=dict)
    #: The session the request belongs to (OpenTelemetry's gen_ai.conversation.id);
    #: empty when the caller has none. Real providers do not send it.
    conversation_id: str = ""


@dataclass(frozen=True)
class TextDelta:
    text: str


@dataclass(frozen=True)
class ReasoningDelta:
    text: str


@dataclass(frozen=True)
class ToolCallDelta:
    """A complete tool call: providers assemble arguments split over chunks first."""

    id: str
    name: str
    arguments: str  # the JSON text exactly as the model produced it


@dataclass(frozen=True)
class Finish:
    finish_reason: str | None
    usage: dict[str, int] | None


StreamEvent = TextDelta | ReasoningDelta | ToolCallDelta | Finish


class Provider(Protocol):
    provider_id: str

    def model_info(self, model: str) -> ModelInfo: ...

    def stream(self, request: CompletionRequest) -> AsyncIterator[StreamEvent]:
        """Yield deltas and complete tool calls, then exactly one Finish.

        Raises sectr.errors.ProviderError (retryable for 429, 5xx and connection
        errors; permanent for other 4xx).
        """
        ...
