"""The agents of the Python SDK against a real server (docs/agents.md): `client.agents`
(sync and async), `sessions.create(agent=..., agent_version=...)` and `snapshot.agent`.
alice is a member of team crew, mod its moderator, bob an outsider."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from sectr.client import AsyncClient, Client, NotFoundError, SectrError
from tests.server.api.test_api_support import LiveApi, live_api


@pytest.fixture(scope="module")
def api() -> Iterator[LiveApi]:
    with live_api() as live:
        yield live


def test_a_moderator_makes_an_agent_and_a_member_runs_it(api: LiveApi) -> None:
    with Client(api.base_url, token=api.tokens["mod"]) as mod, Client(api.base_url, token=api.tokens["alice"]) as alice:
        agent = mod.agents.create(
            "crew", "release", "Release assistant", instructions="Ship it carefully.", tools=["get_time"]
        )
        assert (agent.slug, agent.team, agent.latest_version, agent.editable) == ("release", "crew", 1, True)
        assert agent.current.instructions == "Ship it carefully." and agent.current.tools == ["get_time"]
        v2 = mod.agents.update(agent.id, note="terser", instructions="Ship it.")
        assert (v2.version, v2.note, v2.tools) == (2, "terser", ["get_time"])
        assert [v.version for v in mod.agents.versions(agent.id)] == [2, 1]
        assert mod.agents.version(agent.id, 1).instructions == "Ship it carefully."
        assert [a.slug for a in alice.agents.list()] == ["release"]
        assert alice.agents.get("crew/release").editable is False

        session = alice.sessions.create(agent="crew/release", agent_version=1)
        assert session.last_snapshot is not None
        assert session.last_snapshot.agent == {
            "id": agent.id,
            "slug": "release",
            "name": "Release assistant",
            "version": 1,
            "team": "crew",
        }
        assert session.run("!system").result().text == "system: Ship it carefully."
        assert session.run("!offered").result().text == "tools: get_time"
        latest = alice.sessions.create(agent=agent.id)
        assert latest.run("!system").result().text == "system: Ship it."

        with pytest.raises(SectrError) as refused:
            alice.agents.update(agent.id, instructions="mine now")
        assert refused.value.status == 403
    with Client(api.base_url, token=api.tokens["bob"]) as bob:
        with pytest.raises(NotFoundError):
            bob.agents.get(agent.id)
        assert bob.agents.list() == []


def test_a_typo_in_an_agent_field_names_the_method(api: LiveApi) -> None:
    with Client(api.base_url, token=api.tokens["mod"]) as mod, pytest.raises(TypeError, match="update"):
        mod.agents.update("agt_x", instructons="typo")  # type: ignore[call-arg]


def test_the_async_client_has_the_same_agents(api: LiveApi) -> None:
    async def main() -> None:
        async with AsyncClient(api.base_url, token=api.tokens["mod"]) as mod:
            agent = await mod.agents.create("crew", "triage", "Triage", instructions="Sort it.")
            version = await mod.agents.update(agent.id, tools=["calculator"])
            assert version.version == 2 and version.tools == ["calculator"]
            assert [v.version for v in await mod.agents.versions(agent.id)] == [2, 1]
            assert "triage" in [a.slug for a in await mod.agents.list(team="crew")]
            session = await mod.sessions.create(team="crew", agent="crew/triage")
            assert session.last_snapshot is not None and session.last_snapshot.agent["version"] == 2  # type: ignore[index]

    asyncio.run(main())
