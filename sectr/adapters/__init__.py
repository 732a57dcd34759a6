"""Run agents written with other frameworks inside a Sectr session.

`sectr.adapters.pydantic_ai.handler(agent)` and `sectr.adapters.openai_agents.handler(agent)`
each return an `async def handler(ctx)`. This package holds what both share and imports
no framework: `import sectr` (and `import sectr.adapters`) works without them installed.

The shape of every adapter is the default handler's loop (sectr.agent) with two parts
swapped in: one model step is the framework's model request, built from `ctx.messages`
and streamed into the journal; and the framework's tools become Sectr tools
(`ForeignTool`), so every call goes through the session's gate (approval, team rules,
plan mode, grants, the crash guard) and is journaled like any other. The framework never
keeps state between steps: each step and each resumed invocation starts again from the
journal.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from sectr.agent import answer_open_tool_calls, answered_before_the_crash
from sectr.context import ModelTurn, SessionContext
from sectr.events import EventType
from sectr.tools import Tool, ToolContext, ToolRegistry

__all__ = ["ForeignTool", "Runner", "fresh_call_id", "install_tools", "run_loop"]

#: Runs one call of a framework tool: (validated-by-the-framework arguments, tool call id) -> value.
Runner = Callable[[dict[str, Any], str | None], Awaitable[Any]]


class ForeignTool(Tool):
    """A framework's tool as a Sectr tool: the schema is the framework's, the arguments
    are checked by the framework when the call runs, and the call runs `runner`.

    `gated`: the framework marks it as needing approval. A foreign tool is mutating and
    not idempotent unless the adapter is told otherwise: Sectr cannot see what it does, so
    plan mode refuses it and a call a crash cut off is not run twice.
    """

    def __init__(
        self,
        name: str,
        description: str,
        parameters: dict[str, Any],
        runner: Runner,
        *,
        gated: bool = False,
        mutating: bool = True,
        idempotent: bool = False,
    ) -> None:
        # Tool.__init__ reads a Python signature; a foreign tool has a JSON schema instead.
        self.name = name
        self.description = description
        self.gated = gated
        self.edit = False
        self.mutating = mutating
        self.idempotent = idempotent
        self.is_async = True
        self.runner = runner
        self.fn = runner
        self.__name__ = name
        self.__wrapped__ = runner
        self._params = {}
        self._context_param = "context"
        self._context_required = True
        self.schema = {
            "type": "function",
            "function": {"name": name, "description": description, "parameters": parameters},
        }

    def validate(self, arguments: dict[str, Any]) -> dict[str, Any]:
        return dict(arguments)  # the framework validates when the call runs

    def bind(self, arguments: dict[str, Any], context: ToolContext | None = None) -> dict[str, Any]:
        return {"arguments": dict(arguments), "call_id": context.tool_call_id if context is not None else None}

    async def invoke(self, kwargs: dict[str, Any]) -> Any:
        return await self.runner(kwargs["arguments"], kwargs["call_id"])

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.runner(*args, **kwargs)


def install_tools(ctx: SessionContext, tools: Iterable[Tool]) -> None:
    """Offer the framework's tools in this invocation, in place of the Sectr agent's.

    They are the tools the framework's model is told about; the gate, plan mode and the
    rules look them up here, so they apply to them exactly as to Sectr's own tools.
    """
    registry = ToolRegistry(tools)
    ctx.tools = registry
    ctx.all_tools = registry


async def run_loop(ctx: SessionContext, step: Callable[[], Awaitable[ModelTurn]]) -> None:
    """The default handler's loop with the framework's model step.

    Answers the calls still open (the approved or denied call on an approval resume,
    calls a crash cut off), then calls `step` until the model answers in text; steers and
    cancellation are taken at each step boundary, and the session's limits and budget
    stop the run as they stop the default handler.
    """
    await answer_open_tool_calls(ctx)
    await ctx.step_boundary()
    if answered_before_the_crash(ctx):
        return
    while True:
        limit = ctx.limit_reached()
        if limit is not None:
            ctx.stop_reason = limit
            return
        if await ctx.budget_spent():
            ctx.stop_reason = "budget"
            return
        await ctx.writer.flush()
        turn = await step()
        ctx.turns += 1
        if turn.tool_calls:
            await answer_open_tool_calls(ctx)
            limit = ctx.tool_limit_reached()
            if limit is not None:
                ctx.stop_reason = limit
                return
            await ctx.step_boundary()
            continue
        if await ctx.step_boundary(ending=True):
            continue
        if turn.finish_reason == "length" and ctx.limit_reached() == "budget":
            ctx.stop_reason = "budget"
        return


def fresh_call_id(ctx: SessionContext, call_id: str | None) -> str:
    """The model's tool call id, or a new one when the session has used it already: some
    models (PydanticAI's TestModel, scripted servers) number calls per request, and a
    session's tool call ids must stay unique across its journal."""
    used = {envelope.payload.get("tool_call_id") for envelope in ctx.transcript if envelope.type is EventType.TOOL_CALL}
    return call_id if call_id and call_id not in used else f"call_{uuid.uuid4().hex}"
