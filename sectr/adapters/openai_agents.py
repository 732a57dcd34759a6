"""Run an OpenAI Agents SDK `Agent` inside a Sectr session.

    from sectr.adapters.openai_agents import handler
    sectr.handler("support")(handler(agent))

Each model step is one `stream_response` of the agent's model with the agent's
instructions (`get_system_prompt`), model settings and function tools; its input is
`ctx.messages` converted to Responses input items, so a steer, a resume after an approval
or a recovery after a crash all start from the journal. The SDK's `Runner` is not used:
Sectr is the loop, so it can suspend between any two steps without keeping a run alive.

The agent's function tools run through Sectr (`sectr.adapters.ForeignTool`): a tool with
`needs_approval` is a gated tool, so its call becomes a Sectr ask; the decision starts a
new invocation that runs (or refuses) the call from the journal. Team rules, plan mode
and grants apply to every tool.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable
from typing import Any

from agents import Agent, FunctionTool, ModelSettings, RunContextWrapper
from agents.models.interface import Model, ModelTracing
from agents.models.openai_provider import OpenAIProvider
from agents.tool_context import ToolContext

from sectr.adapters import ForeignTool, fresh_call_id, install_tools, run_loop
from sectr.context import MessageStream, ModelTurn, SessionContext
from sectr.runtime import Handler

__all__ = ["handler", "to_input_items"]

TEXT_DELTA = "response.output_text.delta"
REASONING_DELTAS = frozenset({"response.reasoning_summary_text.delta", "response.reasoning_text.delta"})


def handler(
    agent: Agent[Any],
    *,
    context: Any = None,
    read_only: Iterable[str] = (),
    idempotent: Iterable[str] = (),
) -> Handler:
    """An `async def handler(ctx)` that runs `agent` in the session.

    `context` is the SDK's run context object, given to tools and dynamic instructions
    (one value for every session). Tools named in `read_only` may run in plan mode; those
    in `idempotent` are run again after a crash cut them off. A `needs_approval` given as
    a function asks for every call: Sectr decides approval before the call, from the
    journal, and cannot ask the function again on the resumed invocation.
    """
    read_only_names, idempotent_names = frozenset(read_only), frozenset(idempotent)

    async def openai_agents_handler(ctx: SessionContext) -> None:
        await _Run(agent, ctx, context, read_only_names, idempotent_names).run()

    openai_agents_handler.__name__ = f"openai_agents_{agent.name}"
    return openai_agents_handler


class _Run:
    """One invocation of an adapted agent."""

    def __init__(
        self,
        agent: Agent[Any],
        ctx: SessionContext,
        context: Any,
        read_only: frozenset[str],
        idempotent: frozenset[str],
    ) -> None:
        self.agent = agent
        self.ctx = ctx
        self.context = context
        self.read_only = read_only
        self.idempotent = idempotent
        model = agent.model
        self.model: Model = model if isinstance(model, Model) else OpenAIProvider().get_model(model)
        self.model_name = str(getattr(self.model, "model", None) or model or "")
        self.run_context: RunContextWrapper[Any] = RunContextWrapper(context=context)
        self.tools: dict[str, FunctionTool] = {}
        self.system: str | None = None

    async def run(self) -> None:
        if self.agent.handoffs:
            raise ValueError("the OpenAI Agents adapter does not run handoffs: give each agent its own Sectr agent")
        self.system = await self.agent.get_system_prompt(self.run_context)
        for tool in await self.agent.get_all_tools(self.run_context):
            if not isinstance(tool, FunctionTool):
                raise ValueError(f"the OpenAI Agents adapter runs function tools only, not {type(tool).__name__}")
            self.tools[tool.name] = tool
        install_tools(self.ctx, [self._foreign(tool) for tool in self.tools.values()])
        await run_loop(self.ctx, self.step)

    def _foreign(self, tool: FunctionTool) -> ForeignTool:
        async def runner(arguments: dict[str, Any], call_id: str | None) -> Any:
            text = json.dumps(arguments)
            tool_context = ToolContext(
                context=self.context,
                tool_name=tool.name,
                tool_call_id=call_id or f"call_{uuid.uuid4().hex}",
                tool_arguments=text,
                agent=self.agent,
            )
            return await tool.on_invoke_tool(tool_context, text)

        return ForeignTool(
            tool.name,
            tool.description,
            dict(tool.params_json_schema),
            runner,
            gated=bool(tool.needs_approval),
            mutating=tool.name not in self.read_only,
            idempotent=tool.name in self.idempotent,
        )

    async def step(self) -> ModelTurn:
        """One model response, streamed into the journal."""
        ctx = self.ctx
        stream = MessageStream(ctx, self.model_name or None)
        response: Any = None
        settings = self.agent.model_settings
        cap = ctx._output_budget()  # what is left of the run's token budget, as the default handler caps it
        if cap is not None:
            settings = settings.resolve(ModelSettings(max_tokens=cap))
        events = self.model.stream_response(
            self.system,
            to_input_items(ctx.model_messages()),
            settings,
            list(self.tools.values()),
            None,
            [],
            ModelTracing.DISABLED,
            previous_response_id=None,
            conversation_id=None,
            prompt=None,
        )
        async for event in events:
            kind = event.type
            if kind == TEXT_DELTA:
                await stream.text(str(getattr(event, "delta", "")))
            elif kind in REASONING_DELTAS:
                await stream.reasoning(str(getattr(event, "delta", "")))
            elif kind == "response.completed":
                response = getattr(event, "response", None)
        if response is None:
            raise RuntimeError("the model's stream ended without a completed response")
        for item in response.output:
            if getattr(item, "type", None) == "function_call":
                await stream.tool_call(fresh_call_id(ctx, item.call_id), item.name, item.arguments or "{}")
        usage: dict[str, int] = {}
        if response.usage is not None:
            usage = {
                key: value
                for key, value in (
                    ("input_tokens", response.usage.input_tokens),
                    ("output_tokens", response.usage.output_tokens),
                )
                if value
            }
        finish = "tool_calls" if stream.turn.tool_calls else "stop"
        details = getattr(response, "incomplete_details", None)
        if details is not None and getattr(details, "reason", None) == "max_output_tokens":
            finish = "length"
        await stream.end(finish, usage or None)
        return stream.turn


def _user_content(content: Any) -> str | list[dict[str, Any]]:
    if isinstance(content, str):
        return content
    parts: list[dict[str, Any]] = []
    for item in content or []:
        if not isinstance(item, dict):
            continue
        if item.get("type") == "text":
            parts.append({"type": "input_text", "text": str(item.get("text", ""))})
        elif item.get("type") == "image_url":
            url = str((item.get("image_url") or {}).get("url", ""))
            parts.append({"type": "input_image", "image_url": url, "detail": "auto"})
    return parts


def to_input_items(messages: list[dict[str, Any]]) -> list[Any]:
    """The fold of the journal (chat-style messages) as Responses input items."""
    items: list[Any] = []
    for message in messages:
        role = message.get("role")
        if role == "system":
            items.append({"role": "system", "content": str(message.get("content") or "")})
        elif role == "user":
            items.append({"role": "user", "content": _user_content(message.get("content"))})
        elif role == "assistant":
            if message.get("content"):
                items.append({"role": "assistant", "content": str(message["content"])})
            for call in message.get("tool_calls") or []:
                function = call.get("function") or {}
                items.append(
                    {
                        "type": "function_call",
                        "call_id": call["id"],
                        "name": function.get("name", ""),
                        "arguments": function.get("arguments") or "{}",
                    }
                )
        elif role == "tool":
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": message.get("tool_call_id"),
                    "output": message.get("content") or "",
                }
            )
    return items
