"""The process's Runtime: the database journal, the configured handler, tools and provider.

The handler and the tools beside the built-in ones come from the plugin registry
(sessions_app.plugins: entry points, SECTR_PLUGINS, SECTR_TOOLS, SECTR_HANDLER). The
provider comes from the settings (sessions_app.provider_config), wrapped so that stored media
references reach it as inline data.

`get_runtime()` is the one way to get the runtime (its journal is `get_journal()`'s).
"""

from __future__ import annotations

from functools import cache

from sectr.providers.base import ModelInfo
from sectr.rules import Policy
from sectr.runtime import Runtime
from sessions_app.dbthread import run_in_db_thread
from sessions_app.journal import get_journal
from sessions_app.media import MediaResolvingProvider
from sessions_app.models import ApprovalRule
from sessions_app.plugins import configured_handler, configured_tools
from sessions_app.provider_config import configured_provider, model_info


@cache
def get_runtime() -> Runtime:
    # The journal holds media by reference (sectr-media://sha256); the provider gets the
    # bytes inline, resolved just before each model call.
    provider = MediaResolvingProvider(configured_provider())
    return Runtime(
        get_journal(),
        handler=configured_handler(),
        tools=configured_tools(),
        provider=provider,
        rules=session_policy,
    )


async def session_policy(session_id: str) -> Policy:
    """The approval rules of a session's team, read from the database as each invocation
    starts (a rule a moderator changed applies from the next invocation on)."""
    return await run_in_db_thread(ApprovalRule.policy_for_session, session_id)


def session_model_info(model: str) -> ModelInfo:
    """What the registry knows of a session's model, as the runtime resolves it.

    The same entry decides which media parts a prompt may carry (sessions_app.media).
    """
    return model_info(model, get_runtime().provider.provider_id)

def is_gated_tool(name: str) -> bool:
    """Whether the process's runtime gates this tool (an unknown tool is never run)."""
    tools = get_runtime().tools
    return name in tools and tools.get(name).gated
