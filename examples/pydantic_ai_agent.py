"""A PydanticAI agent as a Sectr handler plugin (sectr.adapters.pydantic_ai).

Install the adapters' packages and name this module in SECTR_PLUGINS::

    .venv/bin/pip install -r requirements-adapters.txt
    SECTR_PLUGINS=examples.pydantic_ai_agent bash scripts/run.sh

then save a team agent whose `handler` is ``pydantic-ai-release`` (docs/agents.md). Its
sessions run this agent: the model is the installation's OpenAI-compatible endpoint
(OPENAI_BASE_URL, OPENAI_API_KEY, SECTR_MODEL), `release_notes` runs at once, and
`publish_release` (requires_approval) waits for a person's decision in the chat, the
moderation queue or the API, across restarts.
"""

from __future__ import annotations

from django.conf import settings
from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

import sectr
from sectr.adapters.pydantic_ai import handler
from sectr.context import SessionContext

#: What `publish_release` did, in this process (the tests read it).
PUBLISHED: list[str] = []


def build_agent() -> Agent[None, str]:
    """The agent, on the endpoint the settings name (read when a run starts, not at import)."""
    provider = OpenAIProvider(base_url=settings.OPENAI_BASE_URL or None, api_key=settings.OPENAI_API_KEY or "unused")
    model = OpenAIChatModel(settings.SECTR_MODEL or "gpt-4.1-mini", provider=provider)
    agent: Agent[None, str] = Agent(model, name="release", instructions="You prepare and publish releases.")

    @agent.tool_plain
    def release_notes(version: str) -> str:
        """The notes of a release.

        Args:
            version: the version, such as 1.4.0.
        """
        return f"{version}: faster startup, two fixes"

    @agent.tool_plain(requires_approval=True)
    def publish_release(version: str) -> str:
        """Publish a release (a person approves it first).

        Args:
            version: the version to publish.
        """
        PUBLISHED.append(version)
        return f"published {version}"

    return agent


@sectr.handler("pydantic-ai-release")
async def release(ctx: SessionContext) -> None:
    await handler(build_agent(), read_only=["release_notes"], idempotent=["release_notes"])(ctx)
