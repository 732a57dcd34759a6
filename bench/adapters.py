"""CPU cost per streamed chunk of the framework adapters next to the default handler.
Run: .venv/bin/python bench/adapters.py [--chunks 2000] [--runs 5]

Each case runs one reply of N text chunks in a LocalRuntime over a MemoryJournal and
measures this process's CPU time (time.process_time, best of the runs), divided by N:

- in process: the default handler with a provider yielding N deltas, against the
  PydanticAI adapter with a FunctionModel yielding N deltas (no network either side);
- over HTTP: the default handler's OpenAIProvider, against the OpenAI Agents SDK adapter's
  chat completions model, both on the local OpenAI-compatible server (its thread's CPU,
  the same for both, is included).

Needs requirements-adapters.txt.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agents import Agent as SdkAgent  # noqa: E402
from agents import OpenAIChatCompletionsModel  # noqa: E402
from openai import AsyncOpenAI  # noqa: E402
from pydantic_ai import Agent  # noqa: E402
from pydantic_ai.messages import ModelMessage  # noqa: E402
from pydantic_ai.models.function import AgentInfo, FunctionModel  # noqa: E402

from sectr import LocalRuntime  # noqa: E402
from sectr.adapters.openai_agents import handler as openai_agents_handler  # noqa: E402
from sectr.adapters.pydantic_ai import handler as pydantic_ai_handler  # noqa: E402
from sectr.events import EventType  # noqa: E402
from sectr.providers.base import CompletionRequest, Finish, ModelInfo, StreamEvent, TextDelta  # noqa: E402
from sectr.providers.openai_compat import OpenAIProvider  # noqa: E402
from tests.openai_stub_server import STUB_MODEL, OpenAIStubServer, text_stream  # noqa: E402


class ChunkProvider:
    """A Sectr provider yielding `n` one-word deltas."""

    provider_id = "bench"

    def __init__(self, n: int) -> None:
        self.n = n

    def model_info(self, model: str) -> ModelInfo:
        return ModelInfo(model or "bench", self.provider_id, 1_000_000)

    async def stream(self, request: CompletionRequest) -> AsyncIterator[StreamEvent]:
        for _ in range(self.n):
            yield TextDelta("word ")
        yield Finish("stop", {"input_tokens": 1, "output_tokens": self.n})


def pydantic_agent(n: int) -> Agent[None, str]:
    async def stream(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[str]:
        for _ in range(n):
            yield "word "

    return Agent(FunctionModel(stream_function=stream))


#: Clients made for a run, closed on its own event loop (not when collected after it closed).
CLIENTS: list[AsyncOpenAI] = []


async def one_reply(make_runtime: Callable[[], LocalRuntime], n: int) -> float:
    rt = make_runtime()
    sid = await rt.create_session()
    start = time.process_time()
    outcome = await rt.send(sid, "go")
    spent = time.process_time() - start
    while CLIENTS:
        await CLIENTS.pop().close()
    assert outcome.type is EventType.INVOCATION_COMPLETED, outcome
    deltas = [e for e in rt.journal.read(sid) if e.type is EventType.MESSAGE_DELTA]
    assert len(deltas) >= n * 0.99, f"{len(deltas)} deltas for {n} chunks"
    return spent


def best_per_chunk(make_runtime: Callable[[], LocalRuntime], n: int, runs: int) -> float:
    times = [asyncio.run(one_reply(make_runtime, n)) for _ in range(runs)]
    return min(times) / n * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chunks", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    n, runs = args.chunks, args.runs
    results: dict[str, float] = {}
    results["default handler, in-process provider"] = best_per_chunk(
        lambda: LocalRuntime(provider=ChunkProvider(n)), n, runs
    )
    results["PydanticAI adapter, FunctionModel"] = best_per_chunk(
        lambda: LocalRuntime(handler=pydantic_ai_handler(pydantic_agent(n))), n, runs
    )
    words = ["word "] * n
    with OpenAIStubServer(fallback=lambda body: text_stream(*words)) as server:
        results["default handler, OpenAIProvider over HTTP"] = best_per_chunk(
            lambda: LocalRuntime(provider=OpenAIProvider(base_url=server.base_url, default_model=STUB_MODEL)), n, runs
        )

        def sdk_runtime() -> LocalRuntime:
            client = AsyncOpenAI(base_url=server.base_url, api_key="bench", max_retries=0)
            CLIENTS.append(client)
            model = OpenAIChatCompletionsModel(model=STUB_MODEL, openai_client=client)
            return LocalRuntime(handler=openai_agents_handler(SdkAgent(name="bench", model=model)))

        results["OpenAI Agents SDK adapter over HTTP"] = best_per_chunk(sdk_runtime, n, runs)
    print(f"CPU per streamed chunk, {n} chunks, best of {runs}:")
    for name, micros in results.items():
        print(f"  {name:45} {micros:8.1f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
