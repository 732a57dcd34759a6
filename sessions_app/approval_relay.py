"""The agent of the sessions an MCP client's asks go to, and its handler.

An ask pauses a session on one call (the journal's rule: a session waits on one ask at
a time). Once decided, the decision resumes the session like any other (a run of its
agent); this agent's handler runs nothing and calls no model: it journals the call's
result as the decision made it (the client runs the call itself, or not) and ends.
"""

from __future__ import annotations

import json
from typing import Any

from sectr.agents import AgentSpec
from sectr.context import SessionContext
from sectr.events import EventType

RELAY_HANDLER = "sectr.mcp_approvals"
RELAY_AGENT = AgentSpec(
    slug="mcp-approvals",
    id="mcp-approvals",
    name="MCP approvals",
    description="Permission prompts of an MCP client (approval_prompt at /mcp)",
    tools=(),
    handler=RELAY_HANDLER,
)


def is_relay_pin(pin: dict[str, Any] | None) -> bool:
    return bool(pin) and pin.get("id") == RELAY_AGENT.id  # type: ignore[union-attr]


def result_text(decision: dict[str, Any]) -> tuple[str, bool]:
    """What the journal shows as the call's result for a decision: (text, is_error)."""
    approver = decision.get("approver") or "someone"
    verdict = decision.get("verdict")
    note = decision.get("note")
    if verdict == "respond":
        return f"answered by {approver} instead of running: {decision.get('result') or ''}", True
    if not decision.get("approved"):
        return f"denied by {approver}" + (f": {note}" if note else ""), True
    text = f"allowed by {approver}; the MCP client runs the call"
    if isinstance(decision.get("arguments"), dict):
        text += f" with the arguments {approver} edited: {json.dumps(decision['arguments'], ensure_ascii=False)}"
    return text, False


async def relay_decision(ctx: SessionContext) -> None:
    """Journal the decided call's result; nothing runs here (the client runs it)."""
    call = ctx.pending_tool_call
    if call is None:
        return
    text, is_error = result_text(ctx.decision)
    payload: dict[str, Any] = {"tool_call_id": call["tool_call_id"], "name": call["name"], "content": text}
    if is_error:
        payload["is_error"] = True
    await ctx.writer.emit(EventType.TOOL_RESULT, payload)
