"""A team's webhooks through the Python SDK against a real server (docs/teams.md):
`client.teams.webhooks / add_webhook / delete_webhook`, sync and async. mod moderates
team crew, alice is a member, bob an outsider. The URLs are literal public addresses
(judged without DNS); nothing here makes an ask, so they are never called."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from sectr.client import AsyncClient, Client, InvalidRequestError, NotFoundError, PermissionDeniedError, Webhook
from tests.server.api.test_api_support import LiveApi, live_api

HOOK = "https://93.184.215.14/sdk-hook"
SECRET = "sdk-secret-not-returned-77"


@pytest.fixture(scope="module")
def api() -> Iterator[LiveApi]:
    with live_api() as live:
        yield live


def test_a_moderator_adds_lists_and_deletes_a_webhook_and_never_reads_its_secret(api: LiveApi) -> None:
    with Client(api.base_url, token=api.tokens["mod"]) as mod:
        hook = mod.teams.add_webhook("crew", HOOK, kind="slack", secret=SECRET)
        assert isinstance(hook, Webhook)
        assert (hook.url, hook.kind, hook.active) == (HOOK, "slack", True)
        assert "secret" not in hook.raw and SECRET not in repr(hook.raw)
        assert [(h.id, h.url, h.kind) for h in mod.teams.webhooks("crew")] == [(hook.id, HOOK, "slack")]
        with pytest.raises(InvalidRequestError) as refused:
            mod.teams.add_webhook("crew", "http://127.0.0.1:9/hook")
        assert refused.value.status == 400 and "internal addresses" in str(refused.value)
        mod.teams.delete_webhook("crew", hook.id)
        assert mod.teams.webhooks("crew") == []
        with pytest.raises(NotFoundError):
            mod.teams.delete_webhook("crew", hook.id)


def test_a_member_is_refused_and_an_outsider_is_not_told_the_team_exists(api: LiveApi) -> None:
    with Client(api.base_url, token=api.tokens["alice"]) as alice, Client(api.base_url, token=api.tokens["bob"]) as bob:
        with pytest.raises(PermissionDeniedError):
            alice.teams.webhooks("crew")
        with pytest.raises(PermissionDeniedError):
            alice.teams.add_webhook("crew", HOOK)
        with pytest.raises(NotFoundError):
            bob.teams.webhooks("crew")
        with pytest.raises(NotFoundError):
            bob.teams.add_webhook("crew", HOOK)


def test_the_async_client_has_the_same_webhooks(api: LiveApi) -> None:
    async def main() -> None:
        async with AsyncClient(api.base_url, token=api.tokens["mod"]) as mod:
            hook = await mod.teams.add_webhook("crew", HOOK)
            assert hook.kind == "json"
            assert [h.id for h in await mod.teams.webhooks("crew")] == [hook.id]
            await mod.teams.delete_webhook("crew", hook.id)
            assert await mod.teams.webhooks("crew") == []

    asyncio.run(main())


def test_a_typo_in_a_webhook_option_names_the_method(api: LiveApi) -> None:
    with Client(api.base_url, token=api.tokens["mod"]) as mod, pytest.raises(TypeError, match="add_webhook"):
        mod.teams.add_webhook("crew", HOOK, kinds="slack")  # type: ignore[call-arg]
