"""Scores and ratings through the Python SDK against a real server (docs/sdk.md):
`client.scores` (sync and async), `session.rate()` and `session.ratings()`. mod moderates
team crew, alice is a member (her sessions are crew's), bob an outsider."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from sectr.client import AsyncClient, Client, InvalidRequestError, NotFoundError, PermissionDeniedError
from tests.server.api.test_api_support import LiveApi, live_api


@pytest.fixture(scope="module")
def api() -> Iterator[LiveApi]:
    with live_api() as live:
        yield live


def test_a_moderator_defines_scores_and_rates_a_session_with_them(api: LiveApi) -> None:
    with Client(api.base_url, token=api.tokens["mod"]) as mod, Client(api.base_url, token=api.tokens["alice"]) as alice:
        tone = mod.scores.create("crew", "tone", "categorical", labels=["warm", "cold"], description="How it sounds")
        assert (tone.name, tone.kind, tone.labels, tone.built_in) == ("tone", "categorical", ["warm", "cold"], False)
        depth = mod.scores.create("crew", "depth", "numeric", minimum=1, maximum=3)
        assert (depth.minimum, depth.maximum) == (1, 3)
        assert mod.scores.update("crew", "depth", maximum=4).maximum == 4
        assert [s.name for s in alice.scores.list("crew")] == ["thumbs", "score", "depth", "tone"]
        with pytest.raises(PermissionDeniedError):
            alice.scores.create("crew", "mine", "boolean")

        session = alice.sessions.create(title="to rate")
        session.run("hello").result()
        moderated = mod.session(session.id)
        rating = moderated.rate({"thumbs": True, "tone": "warm", "depth": 4}, tags=["kind"], comment="nice")
        assert (rating.author, rating.seq, rating.message_id) == ("mod", 0, None)
        assert rating.scores == {"thumbs": True, "tone": "warm", "depth": 4}
        with pytest.raises(InvalidRequestError) as refused:
            moderated.rate({"depth": 5})
        assert "depth is a number from 1 to 4" in str(refused.value)
        listed = moderated.ratings()
        assert [r.scores for r in listed.ratings] == [{"thumbs": True, "tone": "warm", "depth": 4}]
        assert [s.name for s in listed.scores] == ["thumbs", "score", "depth", "tone"]
        own = alice.session(session.id).rate({"tone": "cold"})  # the owner reviews their own session
        assert own.author == "alice"
        mod.scores.delete("crew", "tone")
        kept = [r.scores for r in moderated.ratings().ratings]
        assert kept == [{"thumbs": True, "tone": "warm", "depth": 4}, {"tone": "cold"}]
    with Client(api.base_url, token=api.tokens["bob"]) as bob:
        with pytest.raises(NotFoundError):
            bob.scores.list("crew")
        with pytest.raises(NotFoundError):
            bob.session(session.id).ratings()


def test_the_async_client_has_the_same_scores(api: LiveApi) -> None:
    async def go() -> list[str]:
        async with AsyncClient(api.base_url, token=api.tokens["mod"]) as mod:
            await mod.scores.create("crew", "polite", "boolean")
            session = await mod.sessions.create(title="async rating", team="crew")
            rating = await session.rate({"polite": False, "score": 2})
            assert rating.scores == {"score": 2, "polite": False}
            return [s.name for s in await mod.scores.list("crew")]

    assert "polite" in asyncio.run(go())
