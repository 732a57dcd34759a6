"""Open websockets re-check access: logging out, deactivation, a lost role or a deleted
session close them within seconds, and no frame is sent after that.

Each test runs twice: with the events alone (the safety net's period is ten minutes, so
only the signal-driven `access.changed` can close the socket in time) and with the
periodic re-check alone (the events switched off, a 0.3 s period)."""

from __future__ import annotations

import time
from importlib import import_module
from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.test import Client

from sessions_app.models import Session
from tests.server.chat.test_consumers import HOST, ORIGIN, chat_path, frames_until_ready, journal
from tests.server.chat.test_web import started
from tests.server.conftest import join_team

pytestmark = [pytest.mark.django_db(transaction=True)]

RECHECK = 0.3
QUIET = 1.0  # how long "nothing more arrives" is watched for


@pytest.fixture(autouse=True, params=["events", "polling"])
def _rechecks(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, settings: Any) -> None:
    settings.SECTR_EMBEDDED_WORKER = False
    if request.param == "events":
        settings.SECTR_WS_ACCESS_SECONDS = 600.0
    else:
        settings.SECTR_WS_ACCESS_SECONDS = RECHECK
        monkeypatch.setattr("sessions_app.socket_access._notify", lambda group, ended_login=None: None)


def login(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


async def open_socket(client: Client, path: str) -> WebsocketCommunicator:
    from sectr_web.asgi import application

    cookie = f"sessionid={client.cookies['sessionid'].value}".encode()
    communicator = WebsocketCommunicator(application, path, headers=[HOST, ORIGIN, (b"cookie", cookie)])
    connected, _ = await communicator.connect(timeout=5)
    assert connected
    return communicator


async def closed_within(communicator: WebsocketCommunicator, seconds: float) -> int:
    """The close code, waiting for it through any frames sent before it."""
    deadline = time.monotonic() + seconds
    while True:
        output = await communicator.receive_output(timeout=max(deadline - time.monotonic(), 0.01))
        if output["type"] == "websocket.close":
            return int(output.get("code", 1000))


async def nothing_after_close(communicator: WebsocketCommunicator, session: Session) -> None:
    await journal(session, [started("after the close", inv="inv_late")])
    assert await communicator.receive_nothing(timeout=QUIET)


def leave_teams(user: Any) -> None:
    """The user loses every team role (as `sectr_team remove` would do)."""
    from sessions_app.models import Membership

    Membership.objects.filter(user=user).delete()


async def test_logging_out_closes_the_chat_socket(owner: Any, session: Session) -> None:
    client = await database_sync_to_async(login)(owner)
    communicator = await open_socket(client, chat_path(session))
    await frames_until_ready(communicator)
    await database_sync_to_async(client.logout)()  # the Django session is deleted
    assert await closed_within(communicator, 3) == 4401
    await nothing_after_close(communicator, session)


async def test_a_logout_closes_its_sockets_before_the_login_is_deleted(
    owner: Any, session: Session, request: pytest.FixtureRequest
) -> None:
    # Django sends user_logged_out before it deletes the Django session: a re-check made
    # at that moment still finds the login alive. The logout names its login, so the
    # socket opened with it closes anyway (a race the browser's queue test met). With the
    # events off, the periodic re-check keeps it open until the login is really gone.
    events = request.node.callspec.params["_rechecks"] == "events"
    from django.contrib.auth.signals import user_logged_out
    from django.http import HttpRequest

    client = await database_sync_to_async(login)(owner)
    other_client = await database_sync_to_async(login)(owner)  # the same user, another login
    communicator = await open_socket(client, chat_path(session))
    other = await open_socket(other_client, chat_path(session))
    await frames_until_ready(communicator)
    await frames_until_ready(other)
    store = import_module(settings.SESSION_ENGINE).SessionStore(client.cookies["sessionid"].value)
    logging_out = HttpRequest()
    logging_out.session = store

    def signal_only() -> None:  # the signal, with the Django session still in place
        user_logged_out.send(sender=type(owner), request=logging_out, user=owner)

    await database_sync_to_async(signal_only)()
    assert await database_sync_to_async(store.exists)(store.session_key)
    if not events:
        assert await communicator.receive_nothing(timeout=QUIET)
        await database_sync_to_async(store.delete)()
    assert await closed_within(communicator, 3) == 4401
    assert await other.receive_nothing(timeout=QUIET)  # the other login's socket stays open
    await other.disconnect()


async def test_deactivation_closes_the_chat_socket(owner: Any, session: Session) -> None:
    client = await database_sync_to_async(login)(owner)
    communicator = await open_socket(client, chat_path(session))
    await frames_until_ready(communicator)
    owner.is_active = False
    await database_sync_to_async(owner.save)()
    assert await closed_within(communicator, 3) == 4401
    await nothing_after_close(communicator, session)


async def test_losing_the_role_closes_the_chat_socket(teammate: Any, session: Session) -> None:
    moderator = await database_sync_to_async(join_team)(teammate, "moderator", session)
    client = await database_sync_to_async(login)(moderator)
    communicator = await open_socket(client, chat_path(session))
    await frames_until_ready(communicator)
    await database_sync_to_async(leave_teams)(moderator)
    assert await closed_within(communicator, 3) in (4403, 4404)
    await nothing_after_close(communicator, session)


async def test_deleting_the_session_closes_the_chat_socket(owner: Any, session: Session) -> None:
    from sessions_app.actions import do_delete

    client = await database_sync_to_async(login)(owner)
    communicator = await open_socket(client, chat_path(session))
    await frames_until_ready(communicator)
    await database_sync_to_async(do_delete)(owner, session.pk)
    assert await closed_within(communicator, 3) == 4404


async def test_a_socket_that_keeps_its_access_stays_open(owner: Any, session: Session) -> None:
    client = await database_sync_to_async(login)(owner)
    communicator = await open_socket(client, chat_path(session))
    await frames_until_ready(communicator)
    assert await communicator.receive_nothing(timeout=QUIET), "closed without a reason"
    await journal(session, [started("still here", inv="inv_2")])
    frame = await communicator.receive_json_from(timeout=3)
    assert "still here" in frame["html"]
    await communicator.disconnect()


async def test_the_queue_closes_on_logout_and_on_losing_the_moderator_role(
    owner: Any, teammate: Any, session: Session
) -> None:
    owner_client = await database_sync_to_async(login)(owner)
    owners_queue = await open_socket(owner_client, "/ws/approvals/")
    moderator = await database_sync_to_async(join_team)(teammate, "moderator", session)
    moderator_client = await database_sync_to_async(login)(moderator)
    moderators_queue = await open_socket(moderator_client, "/ws/approvals/")
    await database_sync_to_async(owner_client.logout)()
    await database_sync_to_async(leave_teams)(moderator)
    assert await closed_within(owners_queue, 3) == 4401
    assert await closed_within(moderators_queue, 3) == 4403
    from tests.server.chat.test_web import asked

    await journal(session, [started("note: buy milk", inv="inv_2"), *asked()])
    assert await owners_queue.receive_nothing(timeout=QUIET)
    assert await moderators_queue.receive_nothing(timeout=QUIET)
