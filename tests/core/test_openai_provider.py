"""OpenAIProvider against a real local OpenAI-compatible server (tests/openai_stub_server.py).

No mocks: the `openai` package speaks HTTP and SSE to the stub, which replays the
stream shapes real servers send.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from sectr.errors import ProviderError
from sectr.providers import (
    CompletionRequest,
    DemoProvider,
    Finish,
    OpenAIProvider,
    ReasoningDelta,
    StreamEvent,
    TextDelta,
    ToolCallDelta,
    default_model_from_env,
    known_models,
    lookup_model,
    provider_from_env,
)
from tests.openai_stub_server import (
    ErrorReply,
    OpenAIStubServer,
    SSEStream,
    chunk,
    echo_reply,
    error_reply,
    text_stream,
    tool_call_stream,
    usage_chunk,
)

HELLO = [{"role": "user", "content": "hello"}]


@pytest.fixture
def stub() -> Iterator[OpenAIStubServer]:
    with OpenAIStubServer() as server:
        yield server


@pytest.fixture
async def provider(stub: OpenAIStubServer) -> AsyncIterator[OpenAIProvider]:
    provider = OpenAIProvider(base_url=stub.base_url, api_key="sk-test", default_model="stub-model", timeout=10)
    yield provider
    await provider.aclose()


async def collect(provider: OpenAIProvider, request: CompletionRequest | None = None) -> list[StreamEvent]:
    request = request or CompletionRequest(model="stub-model", messages=HELLO)
    return [event async for event in provider.stream(request)]


async def collect_until_error(
    provider: OpenAIProvider, request: CompletionRequest | None = None
) -> tuple[list[StreamEvent], ProviderError]:
    request = request or CompletionRequest(model="stub-model", messages=HELLO)
    events: list[StreamEvent] = []
    with pytest.raises(ProviderError) as caught:
        async for event in provider.stream(request):
            events.append(event)
    return events, caught.value


# ---- streams ----


async def test_it_streams_text_and_usage(stub: OpenAIStubServer, provider: OpenAIProvider) -> None:
    stub.script([text_stream("Hel", "lo", " there", usage=(12, 3))])
    events = await collect(provider)
    assert events == [
        TextDelta("Hel"),
        TextDelta("lo"),
        TextDelta(" there"),
        Finish("stop", {"input_tokens": 12, "output_tokens": 3}),
    ]


async def test_it_sends_model_messages_and_stream_options(stub: OpenAIStubServer, provider: OpenAIProvider) -> None:
    stub.script([text_stream("ok")])
    await collect(provider)
    [body] = stub.requests
    assert body["model"] == "stub-model"
    assert body["messages"] == HELLO
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert "tools" not in body
    assert "reasoning_effort" not in body
    assert "max_tokens" not in body
    assert stub.headers[0]["authorization"] == "Bearer sk-test"


async def test_it_sends_tools_reasoning_effort_and_max_tokens_when_set(
    stub: OpenAIStubServer, provider: OpenAIProvider
) -> None:
    tools = [
        {
            "type": "function",
            "function": {
                "name": "calculator",
                "description": "Evaluate arithmetic.",
                "parameters": {
                    "type": "object",
                    "properties": {"expression": {"type": "string"}},
                    "required": ["expression"],
                },
            },
        }
    ]
    stub.script([text_stream("ok")])
    request = CompletionRequest(
        model="o3-mini", messages=HELLO, tools=tools, reasoning_effort="high", max_output_tokens=100
    )
    await collect(provider, request)
    [body] = stub.requests
    assert body["model"] == "o3-mini"
    assert body["tools"] == tools
    assert body["reasoning_effort"] == "high"
    assert body["max_tokens"] == 100  # a local server; api.openai.com gets max_completion_tokens


async def test_the_default_model_is_used_when_the_request_names_none(
    stub: OpenAIStubServer, provider: OpenAIProvider
) -> None:
    stub.script([text_stream("ok")])
    await collect(provider, CompletionRequest(model="", messages=HELLO))
    assert stub.requests[0]["model"] == "stub-model"


async def test_no_model_at_all_is_a_permanent_error(stub: OpenAIStubServer) -> None:
    provider = OpenAIProvider(base_url=stub.base_url)
    _, error = await collect_until_error(provider, CompletionRequest(model="", messages=HELLO))
    assert error.retryable is False
    assert stub.requests == []


async def test_messages_are_sent_as_the_api_takes_them(stub: OpenAIStubServer, provider: OpenAIProvider) -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
    audio = {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}}
    call = {"id": "call_1", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "what is this?"}, image, audio]},
        {"role": "assistant", "content": None, "reasoning_content": "thinking...", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "12:00"},
    ]
    stub.script([text_stream("ok")])
    await collect(provider, CompletionRequest(model="stub-model", messages=messages))
    sent = stub.requests[0]["messages"]
    assert sent[1]["content"] == [{"type": "text", "text": "what is this?"}, image, audio]
    assert sent[2] == {"role": "assistant", "content": None, "tool_calls": [call]}  # no reasoning_content
    assert sent[3] == {"role": "tool", "tool_call_id": "call_1", "content": "12:00"}


async def test_it_streams_reasoning_content(stub: OpenAIStubServer, provider: OpenAIProvider) -> None:
    stub.script([text_stream("42", reasoning=["Let me ", "think."])])
    events = await collect(provider)
    assert events[:3] == [ReasoningDelta("Let me "), ReasoningDelta("think."), TextDelta("42")]


async def test_it_accepts_the_reasoning_key_too(stub: OpenAIStubServer, provider: OpenAIProvider) -> None:
    # Ollama and OpenRouter name the field "reasoning"
    stub.script(
        [
            SSEStream(
                [
                    chunk({"role": "assistant", "reasoning": "hmm"}),
                    chunk({"content": "ok"}),
                    chunk(finish_reason="stop"),
                ]
            )
        ]
    )
    events = await collect(provider)
    assert events == [ReasoningDelta("hmm"), TextDelta("ok"), Finish("stop", None)]


async def test_usage_in_a_final_chunk_with_empty_choices(stub: OpenAIStubServer, provider: OpenAIProvider) -> None:
    stream = text_stream("ok", usage=None)
    stream.chunks.append(usage_chunk(120, 45, reasoning_tokens=30, cached_tokens=64))
    assert stream.chunks[-1]["choices"] == []  # type: ignore[index]
    stub.script([stream])
    events = await collect(provider)
    assert events[-1] == Finish(
        "stop", {"input_tokens": 120, "output_tokens": 45, "reasoning_tokens": 30, "cached_input_tokens": 64}
    )


async def test_a_tool_call_split_over_many_chunks_is_emitted_once_complete(
    stub: OpenAIStubServer, provider: OpenAIProvider
) -> None:
    arguments = '{"expression": "(1 + 2) * 3 / 4", "precision": 2}'
    stream = tool_call_stream([("call_abc", "calculator", arguments)], pieces=7)
    fragments = [
        c for c in stream.chunks if isinstance(c, dict) and c["choices"] and "tool_calls" in c["choices"][0]["delta"]
    ]
    assert len(fragments) == 8  # id and name, then the arguments in 7 pieces
    stub.script([stream])
    events = await collect(provider)
    assert events == [
        ToolCallDelta(id="call_abc", name="calculator", arguments=arguments),
        Finish("tool_calls", {"input_tokens": 10, "output_tokens": 5}),
    ]


async def test_parallel_tool_calls_interleaved_come_out_whole_in_index_order(
    stub: OpenAIStubServer, provider: OpenAIProvider
) -> None:
    first = '{"title": "groceries", "body": "milk, eggs"}'
    second = '{"expression": "6 * 7"}'
    stub.script(
        [tool_call_stream([("call_1", "write_note", first), ("call_2", "calculator", second)], interleave=True)]
    )
    events = await collect(provider)
    assert events[:2] == [
        ToolCallDelta(id="call_1", name="write_note", arguments=first),
        ToolCallDelta(id="call_2", name="calculator", arguments=second),
    ]
    assert isinstance(events[2], Finish) and events[2].finish_reason == "tool_calls"


async def test_tool_calls_are_ordered_by_index_not_arrival(stub: OpenAIStubServer, provider: OpenAIProvider) -> None:
    stub.script(
        [
            SSEStream(
                [
                    chunk({"tool_calls": [{"index": 1, "id": "b", "function": {"name": "second", "arguments": "{}"}}]}),
                    chunk({"tool_calls": [{"index": 0, "id": "a", "function": {"name": "first", "arguments": "{"}}]}),
                    chunk({"tool_calls": [{"index": 0, "function": {"arguments": "}"}}]}),
                    chunk(finish_reason="tool_calls"),
                ]
            )
        ]
    )
    events = await collect(provider)
    assert [(e.id, e.name, e.arguments) for e in events if isinstance(e, ToolCallDelta)] == [
        ("a", "first", "{}"),
        ("b", "second", "{}"),
    ]


async def test_ollama_style_tool_calls_with_index_0_and_finish_stop(
    stub: OpenAIStubServer, provider: OpenAIProvider
) -> None:
    # One complete call per chunk, every one at index 0, and finish_reason "stop"
    stub.script(
        [
            SSEStream(
                [
                    chunk(
                        {"tool_calls": [{"index": 0, "id": "x1", "function": {"name": "get_time", "arguments": "{}"}}]}
                    ),
                    chunk(
                        {
                            "tool_calls": [
                                {
                                    "index": 0,
                                    "id": "x2",
                                    "function": {"name": "calculator", "arguments": '{"expression": "1+1"}'},
                                }
                            ]
                        }
                    ),
                    chunk(finish_reason="stop"),
                ]
            )
        ]
    )
    events = await collect(provider)
    assert events == [
        ToolCallDelta(id="x1", name="get_time", arguments="{}"),
        ToolCallDelta(id="x2", name="calculator", arguments='{"expression": "1+1"}'),
        Finish("tool_calls", None),
    ]


async def test_text_before_tool_calls(stub: OpenAIStubServer, provider: OpenAIProvider) -> None:
    stream = tool_call_stream([("c", "get_time", "{}")])
    stream.chunks.insert(1, chunk({"content": "Let me check."}))
    stub.script([stream])
    events = await collect(provider)
    assert events[0] == TextDelta("Let me check.")
    assert events[1] == ToolCallDelta(id="c", name="get_time", arguments="{}")


async def test_keep_alive_comments_are_ignored(stub: OpenAIStubServer, provider: OpenAIProvider) -> None:
    stream = text_stream("a", "b")
    stream.chunks.insert(1, ": keep-alive\n\n")
    stub.script([stream])
    assert [e for e in await collect(provider) if isinstance(e, TextDelta)] == [TextDelta("a"), TextDelta("b")]


# ---- errors ----


@pytest.mark.parametrize(
    ("status", "retryable"),
    [
        (429, True),
        (500, True),
        (502, True),
        (503, True),
        (400, False),
        (401, False),
        (403, False),
        (404, False),
        (422, False),
    ],
)
async def test_http_errors_are_classified(
    stub: OpenAIStubServer, provider: OpenAIProvider, status: int, retryable: bool
) -> None:
    stub.script([error_reply(status, f"nope {status}")])
    events, error = await collect_until_error(provider)
    assert events == []
    assert error.status == status
    assert error.retryable is retryable
    assert f"nope {status}" in str(error)
    assert len(stub.requests) == 1  # the provider does not retry by itself: the runtime decides


async def test_an_error_body_that_is_not_openai_shaped(stub: OpenAIStubServer, provider: OpenAIProvider) -> None:
    stub.script([ErrorReply(503, body={"detail": "model is loading"})])
    _, error = await collect_until_error(provider)
    assert (error.status, error.retryable) == (503, True)


async def test_a_connection_dropped_mid_stream_is_retryable(stub: OpenAIStubServer, provider: OpenAIProvider) -> None:
    stream = text_stream("one ", "two ", "three ", "four")
    stream.drop_after = 3  # role chunk, "one ", "two ", then the socket closes
    stub.script([stream])
    events, error = await collect_until_error(provider)
    assert events == [TextDelta("one "), TextDelta("two ")]
    assert error.retryable is True
    assert error.status is None


async def test_a_stream_that_ends_before_the_answer_finished_is_retryable(
    stub: OpenAIStubServer, provider: OpenAIProvider
) -> None:
    # A clean end of body, but no finish_reason and no [DONE]: a proxy cut it short
    stub.script([SSEStream([chunk({"content": "par"}), chunk({"content": "tial"})], done=False)])
    events, error = await collect_until_error(provider)
    assert events == [TextDelta("par"), TextDelta("tial")]
    assert error.retryable is True


async def test_a_drop_after_the_finish_only_loses_usage(stub: OpenAIStubServer, provider: OpenAIProvider) -> None:
    stream = text_stream("done")
    stream.drop_after = len(stream.chunks) - 1  # everything but the usage chunk
    stub.script([stream])
    assert await collect(provider) == [TextDelta("done"), Finish("stop", None)]


async def test_an_error_event_inside_the_stream_is_retryable(stub: OpenAIStubServer, provider: OpenAIProvider) -> None:
    stub.script(
        [SSEStream([chunk({"content": "a"}), 'data: {"error": {"message": "upstream overloaded", "code": 502}}\n\n'])]
    )
    events, error = await collect_until_error(provider)
    assert events == [TextDelta("a")]
    assert error.retryable is True
    assert "upstream overloaded" in str(error)


async def test_a_refused_connection_is_retryable() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    provider = OpenAIProvider(base_url=f"http://127.0.0.1:{port}/v1", default_model="m", timeout=5)
    _, error = await collect_until_error(provider)
    await provider.aclose()
    assert error.retryable is True
    assert error.status is None


async def test_a_timeout_is_retryable(stub: OpenAIStubServer) -> None:
    provider = OpenAIProvider(base_url=stub.base_url, default_model="m", timeout=0.3)
    stub.script([text_stream("slow", chunk_delay=2.0)])
    _, error = await collect_until_error(provider)
    await provider.aclose()
    assert error.retryable is True


# ---- the stub's own conveniences, relied on by other tests ----


async def test_the_stub_falls_back_when_the_script_is_used_up() -> None:
    with OpenAIStubServer(fallback=echo_reply) as server:
        echo = OpenAIProvider(base_url=server.base_url, default_model="stub-model")
        events = await collect(echo)
        await echo.aclose()
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "You said: hello"
    assert server.pending == 0


async def test_an_unscripted_request_gets_a_500(stub: OpenAIStubServer, provider: OpenAIProvider) -> None:
    _, error = await collect_until_error(provider)
    assert (error.status, error.retryable) == (500, True)


def test_one_provider_serves_several_event_loops(stub: OpenAIStubServer) -> None:
    # Each event loop gets its own HTTP client (a connection pool must not cross loops).
    provider = OpenAIProvider(base_url=stub.base_url, default_model="stub-model")

    async def stream_once() -> list[StreamEvent]:
        try:
            return await collect(provider)
        finally:
            await provider.aclose()
            await asyncio.sleep(0.01)  # let the transports finish closing before the loop does

    stub.script([text_stream("one"), text_stream("two")])
    first = asyncio.run(stream_once())
    second = asyncio.run(stream_once())
    assert first[0] == TextDelta("one")
    assert second[0] == TextDelta("two")


# ---- configuration and the registry ----


def test_provider_from_env_defaults_to_the_demo_model() -> None:
    assert isinstance(provider_from_env({}), DemoProvider)
    assert isinstance(provider_from_env({"SECTR_PROVIDER": "demo"}), DemoProvider)
    assert default_model_from_env({}) == "demo"
    assert default_model_from_env({"SECTR_MODEL": "gpt-4o"}) == "demo"  # without SECTR_PROVIDER=openai


def test_provider_from_env_configures_openai() -> None:
    environ = {
        "SECTR_PROVIDER": "openai",
        "OPENAI_BASE_URL": "http://localhost:11434/v1",
        "OPENAI_API_KEY": "sk-x",
        "SECTR_MODEL": "llama3.1:8b",
    }
    provider = provider_from_env(environ)
    assert isinstance(provider, OpenAIProvider)
    assert (provider.base_url, provider.api_key, provider.default_model) == (
        "http://localhost:11434/v1",
        "sk-x",
        "llama3.1:8b",
    )
    assert default_model_from_env(environ) == "llama3.1:8b"
    info = provider.model_info("llama3.1:8b")
    assert (info.provider_id, info.context_window) == ("openai", 131_072)


def test_provider_from_env_openai_without_a_key() -> None:
    provider = provider_from_env({"SECTR_PROVIDER": "openai", "SECTR_MODEL": "m"})
    assert isinstance(provider, OpenAIProvider)
    assert provider.api_key == "not-needed"
    assert provider.base_url is None


async def test_a_provider_from_env_talks_to_the_configured_server(stub: OpenAIStubServer) -> None:
    provider = provider_from_env(
        {"SECTR_PROVIDER": "openai", "OPENAI_BASE_URL": stub.base_url, "SECTR_MODEL": "qwen2.5:7b"}
    )
    stub.script([text_stream("hi")])
    assert isinstance(provider, OpenAIProvider)
    events = [event async for event in provider.stream(CompletionRequest(model="", messages=HELLO))]
    await provider.aclose()
    assert events[0] == TextDelta("hi")
    assert stub.requests[0]["model"] == "qwen2.5:7b"
    assert stub.headers[0]["authorization"] == "Bearer not-needed"


@pytest.mark.parametrize(
    ("model_id", "context_window", "image", "reasoning"),
    [
        ("gpt-4o", 128_000, True, False),
        ("gpt-4o-mini-2024-07-18", 128_000, True, False),  # a dated snapshot
        ("openai/gpt-4.1", 1_047_576, True, False),  # OpenRouter's spelling
        ("o3-mini", 200_000, False, True),
        ("llama3.1:70b", 131_072, False, False),  # another Ollama tag
        ("Qwen/Qwen2.5-7B-Instruct", 32_768, False, False),  # a Hugging Face id (vLLM)
    ],
)
def test_lookup_model_knows_common_models(model_id: str, context_window: int, image: bool, reasoning: bool) -> None:
    info = lookup_model(model_id, environ={})
    assert info.model_id == model_id
    assert (info.context_window, info.image_input, info.reasoning) == (context_window, image, reasoning)
    assert info.audio_input is False


def test_lookup_model_gives_unknown_ids_a_default_without_media() -> None:
    info = lookup_model("my-finetune", environ={})
    assert (info.model_id, info.provider_id, info.context_window) == ("my-finetune", "openai", 32768)
    assert not (info.image_input or info.audio_input or info.reasoning)
    assert lookup_model("my-finetune", environ={"SECTR_CONTEXT_WINDOW": "4096"}).context_window == 4096
    assert lookup_model("my-finetune", "vllm", environ={}).provider_id == "vllm"


def test_the_context_window_override_applies_to_every_model() -> None:
    environ = {"SECTR_MODEL_CONTEXT_WINDOW": "2048", "SECTR_CONTEXT_WINDOW": "4096"}
    assert lookup_model("gpt-4o", environ=environ).context_window == 2048
    assert lookup_model("demo", environ=environ).context_window == 2048
    assert lookup_model("unknown", environ=environ).context_window == 2048
    assert lookup_model("gpt-4o", environ={"SECTR_MODEL_CONTEXT_WINDOW": "lots"}).context_window == 128_000


def test_the_demo_model_entry() -> None:
    info = lookup_model("demo", environ={})
    assert (info.provider_id, info.context_window) == ("demo", 8192)
    assert info.reasoning and info.image_input and info.audio_input
    assert [m.model_id for m in known_models("demo")] == ["demo"]
    assert "gpt-4o" in {m.model_id for m in known_models("openai")}
