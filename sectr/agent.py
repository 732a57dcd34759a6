"""The default agent handler: a tool-calling loop over the session's model."""

from __future__ import annotations

from sectr.context import SessionContext
from sectr.errors import ApprovalDenied
from sectr.fold import open_tool_calls

LIMIT_CONTENT = "tool call not run: the run reached its {limit} limit"


async def answer_open_tool_calls(ctx: SessionContext) -> None:
    """Execute the tool calls of the last assistant message that have no result yet.

    That is the pending call on an approval-resume turn (approved: run it; denied: an
    error result), then any later calls of the same message, each under the gate again;
    after a crash, calls that were cut off.
    """
    await ctx.writer.flush()  # results a sync `ctx.execute` queued count as answers
    for call in open_tool_calls(ctx.messages):
        flat = {"id": call["id"], "name": call["function"]["name"], "arguments": call["function"]["arguments"]}
        limit = ctx.tool_limit_reached()
        if limit is not None:
            await ctx._tool_result(flat["id"], flat["name"], LIMIT_CONTENT.format(limit=limit), is_error=True)
            continue
        try:
            await ctx.execute_call(flat)
        except ApprovalDenied:
            continue  # the denial is journaled as an error result; the model goes on


def answered_before_the_crash(ctx: SessionContext) -> bool:
    """Whether this recovery has nothing left to do: the lost invocation had given its
    final answer (its worker died, or lost its lease, between the reply's MESSAGE_END and
    the terminal event). Its message is complete, so the fold does not stitch a "please
    continue" after it; calling the model again would answer the same message twice
    (bench/live.py at N=500, where starved workers lost leases, journaled whole replies
    twice)."""
    if ctx.reason.get("kind") != "recover":
        return False
    messages = ctx.messages
    return bool(messages) and messages[-1].get("role") == "assistant" and not messages[-1].get("tool_calls")


async def default_handler(ctx: SessionContext) -> None:
    """Call the model, run the tools it asks for, repeat until it answers in text.

    Obeys steers and cancellation at each model-step boundary and stops at the
    session's limits (max_turns, max_tool_calls, max_consecutive_failures, budget).
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
        turn = await ctx.complete()
        if turn.tool_calls:
            await answer_open_tool_calls(ctx)
            limit = ctx.tool_limit_reached()
            if limit is not None:
                ctx.stop_reason = limit
                return
            await ctx.step_boundary()
            continue
        # The model answered. A steer parked during that last step is journaled now and
        # the model is called again, so the run answers it.
        if await ctx.step_boundary(ending=True):
            continue
        if turn.finish_reason == "length" and ctx.limit_reached() == "budget":
            ctx.stop_reason = "budget"  # the answer was cut short by the run's budget
        return
