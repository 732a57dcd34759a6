"""Run a PydanticAI `Agent` inside a Sectr session.

    from sectr.adapters.pydantic_ai import handler
    sectr.handler("researcher")(handler(agent))

Each model step is one request of the PydanticAI agent (`agent.iter`, stopped after its
model request node): the agent's model, instructions, system prompts, model settings,
history processors and tool definitions all apply. The history it gets is `ctx.messages`
converted to PydanticAI messages, so a steer, a resume after an approval or a recovery
after a crash all start from the journal; the agent's run never outlives one step.

Its tools run through Sectr (`sectr.adapters.ForeignTool`): a `requires_approval` tool is
a gated tool, so its call becomes a Sectr ask; the run suspends; the decision starts a new
invocation that runs (or refuses) the call from the journal. Team rules, plan mode and
grants apply to every tool. Text and thinking are journaled as deltas as they stream.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pydantic_ai import Agent, RunContext
from pydantic_ai._agent_graph import ModelRequestNode
from pydantic_ai.exceptions import ApprovalRequired as FrameworkApprovalRequired
from pydantic_ai.exceptions import ModelRetry
from pydantic_ai.messages import (
    BinaryContent,
    ImageUrl,
    ModelMessage,
    ModelRequest,
    ModelRequestPart,
    ModelResponse,
    ModelResponsePart,
    PartDeltaEvent,
    PartStartEvent,
    SystemPromptPart,
    TextPart,
    TextPartDelta,
    ThinkingPart,
    ThinkingPartDelta,
    ToolCallPart,
    ToolReturnPart,
    UserContent,
    UserPromptPart,
)
from pydantic_ai.models import Model, infer_model
from pydantic_ai.settings import ModelSettings
from pydantic_ai.toolsets import AbstractToolset, CombinedToolset
from pydantic_ai.toolsets.abstract import ToolsetTool
from pydantic_ai.usage import RunUsage

from sectr.adapters import ForeignTool, fresh_call_id, install_tools, run_loop
from sectr.context import MessageStream, ModelTurn, SessionContext
from sectr.runtime import Handler

__all__ = ["handler", "to_model_messages"]

FINISH_REASONS = {"stop": "stop", "length": "length", "tool_call": "tool_calls", "content_filter": "content_filter"}


def handler(
    agent: Agent[Any, Any],
    *,
    deps: Any = None,
    read_only: Iterable[str] = (),
    idempotent: Iterable[str] = (),
) -> Handler:
    """An `async def handler(ctx)` that runs `agent` in the session.

    `deps` is given to every tool and instruction function (one value for every session:
    PydanticAI keeps no state between steps here, so anything per session belongs in the
    journal). Tools named in `read_only` may run in plan mode; those in `idempotent` are
    run again after a crash cut them off (the others are answered "may or may not have
    taken effect").
    """
    read_only_names, idempotent_names = frozenset(read_only), frozenset(idempotent)

    async def pydantic_ai_handler(ctx: SessionContext) -> None:
        await _Run(agent, ctx, deps, read_only_names, idempotent_names).run()

    pydantic_ai_handler.__name__ = f"pydantic_ai_{agent.name or 'agent'}"
    return pydantic_ai_handler


class _Run:
    """One invocation of an adapted agent."""

    def __init__(
        self,
        agent: Agent[Any, Any],
        ctx: SessionContext,
        deps: Any,
        read_only: frozenset[str],
        idempotent: frozenset[str],
    ) -> None:
        if agent.model is None:
            raise ValueError("the PydanticAI agent has no model")
        self.agent = agent
        self.ctx = ctx
        self.deps = deps
        self.read_only = read_only
        self.idempotent = idempotent
        self.model: Model = infer_model(agent.model)
        self.toolset: AbstractToolset[Any] = CombinedToolset(list(agent.toolsets))
        self.tools: dict[str, ToolsetTool[Any]] = {}

    def _run_context(self, history: list[ModelMessage], **extra: Any) -> RunContext[Any]:
        return RunContext(
            deps=self.deps,
            model=self.model,
            usage=RunUsage(),
            messages=history,
            run_step=self.ctx.turns,
            conversation_id=self.ctx.session_id,
            **extra,
        )

    async def run(self) -> None:
        async with self.toolset:
            history = to_model_messages(self.ctx.messages)
            self.tools = await self.toolset.get_tools(self._run_context(history))
            install_tools(self.ctx, [self._foreign(name, tool) for name, tool in self.tools.items()])
            await run_loop(self.ctx, self.step)

    def _foreign(self, name: str, tool: ToolsetTool[Any]) -> ForeignTool:
        tool_def = tool.tool_def

        async def runner(arguments: dict[str, Any], call_id: str | None) -> Any:
            return await self._call(name, arguments, call_id)

        return ForeignTool(
            name,
            tool_def.description or "",
            dict(tool_def.parameters_json_schema),
            runner,
            gated=tool_def.kind == "unapproved",
            mutating=name not in self.read_only,
            idempotent=name in self.idempotent,
        )

    async def _call(self, name: str, arguments: dict[str, Any], call_id: str | None) -> Any:
        """Run one tool call after Sectr's gate let it through: a call that needed
        approval was approved, so PydanticAI is told so (`tool_call_approved`)."""
        tool = self.tools[name]
        run_context = self._run_context(
            to_model_messages(self.ctx.messages),
            tool_call_id=call_id,
            tool_name=name,
            tool_call_approved=tool.tool_def.kind == "unapproved",
            max_retries=tool.max_retries,
        )
        validated = tool.args_validator.validate_python(arguments)
        try:
            return await self.toolset.call_tool(name, validated, run_context, tool)
        except ModelRetry as exc:
            # The model is meant to read it and try again: an error result says so.
            raise ToolRetry(exc.message) from None
        except FrameworkApprovalRequired:
            raise ToolRetry(
                "this tool asks for approval from inside its body, which Sectr does not support; "
                "mark it requires_approval=True instead"
            ) from None

    async def step(self) -> ModelTurn:
        """One model request of the agent, streamed into the journal."""
        ctx = self.ctx
        history = to_model_messages(ctx.model_messages())
        stream = MessageStream(ctx, self.model.model_name)
        cap = ctx._output_budget()  # what is left of the run's token budget, as the default handler caps it
        settings: ModelSettings | None = {"max_tokens": cap} if cap is not None else None
        async with self.agent.iter(None, message_history=history, deps=self.deps, model_settings=settings) as run:
            node: Any = run.next_node
            while not isinstance(node, ModelRequestNode):
                node = await run.next(node)
            async with node.stream(run.ctx) as events:
                async for event in events:
                    if isinstance(event, PartStartEvent):
                        if isinstance(event.part, TextPart):
                            await stream.text(event.part.content)
                        elif isinstance(event.part, ThinkingPart):
                            await stream.reasoning(event.part.content)
                    elif isinstance(event, PartDeltaEvent):
                        if isinstance(event.delta, TextPartDelta):
                            await stream.text(event.delta.content_delta)
                        elif isinstance(event.delta, ThinkingPartDelta) and event.delta.content_delta:
                            await stream.reasoning(event.delta.content_delta)
                response = events.response
        for part in response.parts:
            if isinstance(part, ToolCallPart):
                await stream.tool_call(fresh_call_id(ctx, part.tool_call_id), part.tool_name, part.args_as_json_str())
        usage = {
            key: value
            for key, value in (
                ("input_tokens", response.usage.input_tokens),
                ("output_tokens", response.usage.output_tokens),
            )
            if value
        }
        finish = FINISH_REASONS.get(response.finish_reason or "")
        if finish is None:
            finish = "tool_calls" if stream.turn.tool_calls else "stop"
        await stream.end(finish, usage or None)
        return stream.turn


class ToolRetry(Exception):
    """A tool asked the model to try again (PydanticAI's ModelRetry): an error result."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "retry"


def _user_content(content: Any) -> str | list[UserContent]:
    if isinstance(content, str):
        return content
    parts: list[UserContent] = []
    for item in content or []:
        if not isinstance(item, dict):
            continue
        if item.get("type") == "text":
            parts.append(str(item.get("text", "")))
        elif item.get("type") == "image_url":
            url = str((item.get("image_url") or {}).get("url", ""))
            parts.append(BinaryContent.from_data_uri(url) if url.startswith("data:") else ImageUrl(url=url))
    return parts


def to_model_messages(messages: list[dict[str, Any]]) -> list[ModelMessage]:
    """The fold of the journal (OpenAI-style messages) as PydanticAI's message history.

    System and user turns and tool results gather into one ModelRequest until the next
    assistant message, which becomes a ModelResponse (thinking, text, tool calls).
    """
    history: list[ModelMessage] = []
    request: list[ModelRequestPart] = []
    names: dict[str, str] = {}  # tool_call_id: tool name, for the results
    for message in messages:
        role = message.get("role")
        if role == "system":
            request.append(SystemPromptPart(content=str(message.get("content") or "")))
        elif role == "user":
            request.append(UserPromptPart(content=_user_content(message.get("content"))))
        elif role == "tool":
            call_id = str(message.get("tool_call_id"))
            request.append(
                ToolReturnPart(
                    tool_name=names.get(call_id, ""),
                    content=message.get("content") or "",
                    tool_call_id=call_id,
                )
            )
        elif role == "assistant":
            if request:
                history.append(ModelRequest(parts=request))
                request = []
            parts: list[ModelResponsePart] = []
            if message.get("reasoning_content"):
                parts.append(ThinkingPart(content=message["reasoning_content"]))
            if message.get("content"):
                parts.append(TextPart(content=str(message["content"])))
            for call in message.get("tool_calls") or []:
                function = call.get("function") or {}
                names[call["id"]] = function.get("name", "")
                parts.append(
                    ToolCallPart(
                        tool_name=function.get("name", ""),
                        args=function.get("arguments") or "{}",
                        tool_call_id=call["id"],
                    )
                )
            history.append(ModelResponse(parts=parts))
    if request:
        history.append(ModelRequest(parts=request))
    return history
