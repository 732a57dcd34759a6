"""The process's Runtime: the database journal, the configured handler, tools and provider.

The handler and the tools beside the built-in ones come from the plugin registry
(sessions_app.plugins: entry points, SECTR_PLUGINS, SECTR_TOOLS, SECTR_HANDLER), and so
do the handlers an agent may name. Each invocation runs with the agent version its
session is pinned to (`session_agent`), obeys its team's approval rules
(`session_policy`) and its team's budget (sessions_app.team_budgets), all read as it
starts. The provider comes from the settings (sessions_app.provider_config), wrapped so that stored media
references reach it as inline data.

`get_runtime()` is the one way to get the runtime (its journal is `get_journal()`'s).
"""

from __future__ import annotations

from contextvars import ContextVar
from functools import cache
from typing import Any

from sectr.agents import DEFAULT_AGENT, AgentSpec
from sectr.errors import ValidationFailed
from sectr.events import Envelope
from sectr.providers.base import ModelInfo
from sectr.rules import Policy
from sectr.runtime import Runtime
from sectr.state import SessionState
from sectr.tools import Tool, ToolArgumentError
from sessions_app.approval_relay import RELAY_AGENT, RELAY_HANDLER, is_relay_pin, relay_decision
from sessions_app.dbthread import run_in_db_thread, run_plain_in_db_thread
from sessions_app.journal import get_journal
from sessions_app.journal.database import transcript_is_current
from sessions_app.mcp_servers import check_edited_mcp_arguments, team_mcp_tools
from sessions_app.media import MediaResolvingProvider
from sessions_app.models import AgentVersion, ApprovalRule
from sessions_app.plugins import configured_handler, configured_handlers, configured_tools
from sessions_app.provider_config import configured_provider, model_info
from sessions_app.team_budgets import remember_session_team, session_budget_spent


@cache
def get_runtime() -> Runtime:
    # The journal holds media by reference (sectr-media://sha256); the provider gets the
    # bytes inline, resolved just before each model call.
    provider = MediaResolvingProvider(configured_provider())
    return Runtime(
        get_journal(),
        handler=configured_handler(),
        tools=configured_tools(),
        # The built-in handler of the sessions an MCP client's asks go to (approval_service).
        handlers={**configured_handlers(), RELAY_HANDLER: relay_decision},
        provider=provider,
        rules=session_policy,
        agent=session_agent,
        budget=session_budget_spent,
        # The MCP tools of the session's team its agent selects (sessions_app.mcp_servers).
        extra_tools=session_mcp_tools,
        # The journal's two reads and the rules' in one thread hop (session_start).
        start=session_start,
    )


async def session_policy(session_id: str) -> Policy:
    """The approval rules of a session's team, read from the database as each invocation
    starts (a rule a moderator changed applies from the next invocation on)."""
    policy, team_id = await run_in_db_thread(ApprovalRule.policy_and_team_for_session, session_id)
    # The budget check that follows needs the team: it has it now, without a query.
    remember_session_team(session_id, team_id)
    return policy


#: The session as the run's claim read it (`runs.Claim.session`), set by the worker in
#: the run's task for `session_start`, which takes it (once) when the session matches.
#: With the transcript the claim read too (`runs.Claim.transcript`), or None.
claimed_session: ContextVar[tuple[str, tuple[SessionState, int | None], list[Envelope] | None] | None] = ContextVar(
    "claimed_session", default=None
)


def read_start(
    session_id: str,
    known: tuple[SessionState, int | None] | None = None,
    transcript: list[Envelope] | None = None,
) -> tuple[list[Envelope], SessionState, Policy, int | None]:
    """An invocation's transcript, state and rules, and its session's team (three plain
    statements; two for a personal session; one fewer with `known`, the session as the
    run's claim read it, and one fewer again with its `transcript`: DatabaseJournal.start_sync)."""
    transcript, state, team_id = get_journal().start_sync(session_id, known, transcript)
    return transcript, state, ApprovalRule.policy_of_team(team_id), team_id


async def session_start(session_id: str) -> tuple[list[Envelope], SessionState, Policy]:
    """The runtime's `start` source: what `session_policy` and the journal's `state` and
    `load_since_compaction` read, in one database-thread hop."""
    claimed = claimed_session.get()
    known: tuple[SessionState, int | None] | None = None
    read: list[Envelope] | None = None
    if claimed is not None and claimed[0] == session_id:
        claimed_session.set(None)
        _id, known, read = claimed
        if read is not None and transcript_is_current(read, known[0]) and known[1] is None:
            # A personal session whose claim read it all: nothing to read (no rules), no
            # thread hop.
            remember_session_team(session_id, None)
            return read, known[0], ApprovalRule.policy_of_team(None)
    # Without asgiref's SyncToAsync (run_plain_in_db_thread): read_start only reads, and
    # never calls back into the event loop; the SyncToAsync's own set-up was two thirds
    # of what a run's start cost the event loop (py-spy --gil, bench/run_lifecycle.py).
    transcript, state, policy, team_id = await run_plain_in_db_thread(read_start, session_id, known, read)
    remember_session_team(session_id, team_id)  # for the budget check, as session_policy
    return transcript, state, policy


#: Agent versions already read, by (agent id, version number). A version never changes,
#: so what is kept here is never stale; only its size is bounded.
_AGENT_VERSIONS: dict[tuple[str, int], AgentSpec] = {}
AGENT_VERSIONS_KEPT = 1024


def read_agent_version(agent_id: str, number: int) -> AgentSpec:
    version = AgentVersion.objects.select_related("agent__team").filter(agent_id=agent_id, number=number).first()
    if version is None:
        raise LookupError(f"agent {agent_id} version {number} is not on this installation")
    return version.spec()


def _pin_key(pin: dict[str, Any] | None) -> tuple[str, int] | None:
    if not pin or not pin.get("id"):
        return None
    return (str(pin["id"]), int(pin.get("version") or 1))


def _keep(key: tuple[str, int], spec: AgentSpec) -> AgentSpec:
    if len(_AGENT_VERSIONS) >= AGENT_VERSIONS_KEPT:
        _AGENT_VERSIONS.clear()
    _AGENT_VERSIONS[key] = spec
    return spec


def pinned_agent(pin: dict[str, Any] | None) -> AgentSpec:
    """The spec of a pin, from code that may touch the database (a snapshot, a page)."""
    if is_relay_pin(pin):
        return RELAY_AGENT
    key = _pin_key(pin)
    if key is None:
        return DEFAULT_AGENT
    return _AGENT_VERSIONS.get(key) or _keep(key, read_agent_version(*key))


async def session_agent(state: SessionState) -> AgentSpec:
    """The agent version a session is pinned to, as an invocation starts: no query for the
    built-in agent or a version this process has read before, one indexed read otherwise."""
    if is_relay_pin(state.agent):
        return RELAY_AGENT
    key = _pin_key(state.agent)
    if key is None:
        return DEFAULT_AGENT
    spec = _AGENT_VERSIONS.get(key)
    if spec is None:
        spec = _keep(key, await run_in_db_thread(read_agent_version, *key))
    return spec


async def session_mcp_tools(state: SessionState) -> list[Tool]:
    """The runtime's `extra_tools`: the MCP tools of the session's team that its pinned
    agent selects (sessions_app.mcp_servers)."""
    return await team_mcp_tools(state.session_id, await session_agent(state))


def session_model_info(model: str) -> ModelInfo:
    """What the registry knows of a session's model, as the runtime resolves it.

    The same entry decides which media parts a prompt may carry (sessions_app.media).
    """
    return model_info(model, get_runtime().provider.provider_id)


def is_gated_tool(name: str) -> bool:
    """Whether the process's runtime gates this tool (an unknown tool is never run)."""
    tools = get_runtime().tools
    return name in tools and tools.get(name).gated


def check_edited_arguments(name: str, arguments: dict[str, Any], session_id: str | None = None) -> None:
    """Arguments a person edited must fit the tool's signature, as the model's must: a
    400 (invalid_arguments) naming each problem now, rather than a run that fails later.
    An MCP tool of the session's team is checked against its whole input JSON Schema
    (sessions_app.mcp_servers.check_edited_mcp_arguments). A tool this process does not
    know (a plugin's, since removed) is left to the run."""
    tools = get_runtime().tools
    if name not in tools:
        if session_id is not None:
            check_edited_mcp_arguments(session_id, name, arguments)
        return
    try:
        tools.get(name).validate(arguments)
    except ToolArgumentError as exc:
        raise ValidationFailed(f"the edited arguments do not fit the tool: {exc}", code="invalid_arguments") from None
