"""Shared fixtures and helpers for the core's runtime tests.

Everything here runs without Django: a LocalRuntime over a MemoryJournal, the offline
demo model with no pacing (`delay=0`) and a short `!slow` tick, and a scripted provider
for the cases the demo model cannot express (loops, failures, tiny context windows).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import pytest

import sectr.context
from sectr import LocalRuntime
from sectr.events import Envelope, EventType
from sectr.fold import fold_messages, last_assistant_text
from sectr.journal import MemoryJournal
from sectr.providers.base import (
    CompletionRequest,
    Finish,
    ModelInfo,
    StreamEvent,
    TextDelta,
    ToolCallDelta,
)
from sectr.providers.demo import DemoProvider

#: Seconds between two `!slow` ticks in tests: long enough to act mid-stream, short enough
#: to keep the suite fast.
SLOW_TICK = 0.02

_ENV_VARS = (
    "SECTR_PROVIDER",
    "SECTR_MODEL",
    "SECTR_MODEL_CONTEXT_WINDOW",
    "SECTR_CONTEXT_WINDOW",
    "SECTR_DEMO_DELAY_MS",
    "SECTR_DEMO_SLOW_MS",
)


@pytest.fixture(autouse=True)
def _offline_and_fast(monkeypatch: pytest.MonkeyPatch) -> None:
    """No provider from the environment, and provider retries without backoff sleeps."""
    for name in _ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(sectr.context, "PROVIDER_BACKOFF_SECONDS", 0.0)


@pytest.fixture
def demo() -> DemoProvider:
    return DemoProvider(delay=0, slow_delay=SLOW_TICK)


@pytest.fixture
def rt(demo: DemoProvider) -> LocalRuntime:
    return LocalRuntime(provider=demo)


@pytest.fixture
async def sid(rt: LocalRuntime) -> str:
    return await rt.create_session()


# ---- reading the journal ----


def types_of(envelopes: Sequence[Envelope]) -> list[str]:
    return [e.type.value for e in envelopes]


def of_type(envelopes: Sequence[Envelope], type: EventType) -> list[Envelope]:
    return [e for e in envelopes if e.type is type]


def messages_of(rt: LocalRuntime, session_id: str) -> list[dict[str, Any]]:
    return fold_messages(rt.journal.read(session_id))


def final_text(rt: LocalRuntime, session_id: str) -> str:
    """The text of the last assistant message in the session's fold."""
    return last_assistant_text(messages_of(rt, session_id))


def invocation_envelopes(rt: LocalRuntime, session_id: str, invocation_id: str) -> list[Envelope]:
    return [e for e in rt.journal.read(session_id) if e.invocation_id == invocation_id]


def assert_one_terminal_per_invocation(envelopes: Sequence[Envelope]) -> None:
    """Each INVOCATION_STARTED is closed by exactly one terminal event, and nothing of the
    invocation is journaled after it."""
    terminals = {
        EventType.INVOCATION_SUSPENDED,
        EventType.INVOCATION_COMPLETED,
        EventType.INVOCATION_FAILED,
        EventType.INVOCATION_CANCELLED,
    }
    ended: dict[str, int] = {}
    # A crashed invocation never ends: the `recover` invocation that continues it does.
    recovered = {
        e.payload["reason"].get("of_invocation_id")
        for e in envelopes
        if e.type is EventType.INVOCATION_STARTED and e.payload["reason"].get("kind") == "recover"
    }
    for env in envelopes:
        if env.invocation_id is None:
            continue
        assert env.invocation_id not in ended, f"seq {env.seq} ({env.type}) after the end of {env.invocation_id}"
        if env.type in terminals:
            ended[env.invocation_id] = env.seq
    started = {e.invocation_id for e in envelopes if e.type is EventType.INVOCATION_STARTED} - recovered
    assert started == set(ended), f"invocations without a terminal event: {started - set(ended)}"


def assert_tool_calls_answered_in_order(messages: list[dict[str, Any]]) -> None:
    """Every tool message answers a call of the assistant message before it (never a user
    message or a steer in between)."""
    open_ids: set[str] = set()
    for message in messages:
        role = message.get("role")
        if role == "assistant":
            assert not open_ids, f"assistant message while calls {open_ids} are unanswered"
            open_ids = {c["id"] for c in message.get("tool_calls") or []}
        elif role == "tool":
            assert message["tool_call_id"] in open_ids, f"tool result {message['tool_call_id']} answers no open call"
            open_ids.discard(message["tool_call_id"])
        else:
            assert not open_ids, f"{role} message between a tool call and its result"


async def wait_for(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    """Poll the event loop until `predicate()` holds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.002)


async def crash_when(work: Awaitable[Any], predicate: Callable[[], bool]) -> None:
    """Run `work` until `predicate()` holds, then kill it as a dying worker would: the
    task is cancelled and no terminal event is journaled."""
    task = asyncio.ensure_future(work)
    await wait_for(predicate)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def text_so_far(journal: MemoryJournal, session_id: str) -> str:
    return "".join(e.payload.get("text", "") for e in of_type(journal.read(session_id), EventType.MESSAGE_DELTA))


# ---- a scripted provider ----

Script = Callable[[CompletionRequest, int], Sequence[StreamEvent | BaseException]]


class ScriptedProvider:
    """A provider whose answer to the n-th request (1-based) is `script(request, n)`.

    The answer is a list of stream events; an exception in it is raised at that point of
    the stream (so output before it has been yielded). Every request is recorded.
    """

    provider_id = "scripted"

    def __init__(self, script: Script, *, context_window: int = 8192, pause: float = 0.0) -> None:
        self.script = script
        self.context_window = context_window
        self.pause = pause
        self.requests: list[CompletionRequest] = []

    def model_info(self, model: str) -> ModelInfo:
        return ModelInfo(model_id=model, provider_id=self.provider_id, context_window=self.context_window)

    async def stream(self, request: CompletionRequest) -> AsyncIterator[StreamEvent]:
        self.requests.append(request)
        for item in self.script(request, len(self.requests)):
            await asyncio.sleep(self.pause)
            if isinstance(item, BaseException):
                raise item
            yield item


def usage(input_tokens: int = 1, output_tokens: int = 1) -> dict[str, int]:
    return {"input_tokens": input_tokens, "output_tokens": output_tokens}


def say(text: str, *, tokens: dict[str, int] | None = None) -> list[StreamEvent]:
    return [TextDelta(text), Finish("stop", tokens or usage())]


def call(name: str, arguments: str = "{}", *, call_id: str, tokens: dict[str, int] | None = None) -> list[StreamEvent]:
    return [ToolCallDelta(call_id, name, arguments), Finish("tool_calls", tokens or usage())]
