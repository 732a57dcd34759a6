"""The websocket origin check compares scheme, host and port, as CSRF does."""

from __future__ import annotations

from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client, override_settings

from sectr_web.websocket_origin import origin_is_allowed

pytestmark = [pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def _no_embedded_worker(settings: Any) -> None:
    settings.SECTR_EMBEDDED_WORKER = False


def _cookie_for(user: Any) -> bytes:
    client = Client()
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}".encode()


async def opens(user: Any, host: str, origin: str) -> bool:
    from sectr_web.asgi import application

    cookie = await database_sync_to_async(_cookie_for)(user)
    headers = [(b"host", host.encode()), (b"origin", origin.encode()), (b"cookie", cookie)]
    communicator = WebsocketCommunicator(application, "/ws/approvals/", headers=headers)
    connected, _ = await communicator.connect(timeout=5)
    await communicator.disconnect()
    return bool(connected)


async def test_the_sites_own_origin_opens_the_socket(owner: Any) -> None:
    assert await opens(owner, "127.0.0.1:8000", "http://127.0.0.1:8000")
    assert await opens(owner, "localhost", "http://localhost:80")


async def test_another_port_of_the_same_host_is_refused(owner: Any) -> None:
    assert not await opens(owner, "127.0.0.1:8000", "http://127.0.0.1:3000")
    assert not await opens(owner, "localhost:8000", "http://localhost")


async def test_another_scheme_or_host_is_refused(owner: Any) -> None:
    assert not await opens(owner, "127.0.0.1:8000", "https://127.0.0.1:8000")
    assert not await opens(owner, "evil.example:8000", "http://evil.example:8000")  # not in ALLOWED_HOSTS
    assert not await opens(owner, "127.0.0.1:8000", "null")


def scope(origin: str, host: str = "sectr.internal:8000", scheme: str = "ws") -> dict[str, Any]:
    return {"type": "websocket", "scheme": scheme, "headers": [(b"host", host.encode()), (b"origin", origin.encode())]}


@override_settings(
    ALLOWED_HOSTS=["sectr.internal"],
    CSRF_TRUSTED_ORIGINS=["https://app.example.com:8443", "https://*.example.org"],
)
def test_trusted_origins_match_with_their_port() -> None:
    assert origin_is_allowed(scope("https://app.example.com:8443"))
    assert not origin_is_allowed(scope("https://app.example.com:9443"))
    assert not origin_is_allowed(scope("https://app.example.com"))
    assert origin_is_allowed(scope("https://chat.example.org"))
    assert not origin_is_allowed(scope("https://chat.example.org:8443"))
    assert not origin_is_allowed(scope("http://chat.example.org"))
    assert origin_is_allowed(scope("https://sectr.internal:8000", scheme="wss"))
    assert not origin_is_allowed(scope("http://sectr.internal:8000", scheme="wss"))
