"""The peer's workload for bench/peers.py: a LangGraph graph that streams `ticks` chunks
`tick_ms` apart, like the demo model's `!slow N`. Each chunk carries the moment it was
produced (the peer has no journal to read it back from; Sectr's side stamps to a file).
Runs inside LangGraph's local Agent Server (`langgraph dev`, its own venv), not Sectr's."""

from __future__ import annotations

import asyncio
import time
from typing import TypedDict

from langgraph.config import get_stream_writer  # type: ignore[import-not-found]  # its own venv
from langgraph.graph import END, START, StateGraph  # type: ignore[import-not-found]


class TickerState(TypedDict, total=False):
    ticks: int
    tick_ms: int
    text: str


async def stream_ticks(state: TickerState) -> TickerState:
    write = get_stream_writer()
    pause = state.get("tick_ms", 100) / 1000
    text = []
    for tick in range(1, state.get("ticks", 30) + 1):
        if tick > 1:
            await asyncio.sleep(pause)
        chunk = f"tick {tick} "
        text.append(chunk)
        write({"tick": tick, "text": chunk, "t": time.time()})
    return {"text": "".join(text)}


builder = StateGraph(TickerState)
builder.add_node("stream_ticks", stream_ticks)
builder.add_edge(START, "stream_ticks")
builder.add_edge("stream_ticks", END)
graph = builder.compile()
