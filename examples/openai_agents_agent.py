"""An OpenAI Agents SDK agent as a Sectr handler plugin (sectr.adapters.openai_agents).

Install the adapters' packages and name this module in SECTR_PLUGINS::

    .venv/bin/pip install -r requirements-adapters.txt
    SECTR_PLUGINS=examples.openai_agents_agent bash scripts/run.sh

then save a team agent whose `handler` is ``openai-agents-release`` (docs/agents.md). Its
sessions run this agent: the model is the installation's OpenAI-compatible endpoint
(OPENAI_BASE_URL, OPENAI_API_KEY, SECTR_MODEL), `release_notes` runs at once, and
`publish_release` (needs_approval) waits for a person's decision in the chat, the
moderation queue or the API, across restarts.
"""

from __future__ import annotations

from agents import Agent, OpenAIChatCompletionsModel, function_tool
from django.conf import settings
from openai import AsyncOpenAI

import sectr
from sectr.adapters.openai_agents import handler
from sectr.context import SessionContext

#: What `publish_release` did, in this process (the tests read it).
PUBLISHED: list[str] = []


@function_tool
def release_notes(version: str) -> str:
    """The notes of a release.

    Args:
        version: the version, such as 1.4.0.
    """
    return f"{version}: faster startup, two fixes"


@function_tool(needs_approval=True)
def publish_release(version: str) -> str:
    """Publish a release (a person approves it first).

    Args:
        version: the version to publish.
    """
    PUBLISHED.append(version)
    return f"published {version}"


def build_agent() -> Agent[None]:
    """The agent, on the endpoint the settings name (read when a run starts, not at import)."""
    client = AsyncOpenAI(base_url=settings.OPENAI_BASE_URL or None, api_key=settings.OPENAI_API_KEY or "unused")
    return Agent(
        name="release",
        instructions="You prepare and publish releases.",
        model=OpenAIChatCompletionsModel(model=settings.SECTR_MODEL or "gpt-4.1-mini", openai_client=client),
        tools=[release_notes, publish_release],
    )


@sectr.handler("openai-agents-release")
async def release(ctx: SessionContext) -> None:
    await handler(build_agent(), read_only=["release_notes"], idempotent=["release_notes"])(ctx)
