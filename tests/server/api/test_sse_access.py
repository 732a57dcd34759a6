"""An open SSE stream (`GET /api/v1/runs/{id}/events`) re-checks access as the websockets
do: removal from the team, a revoked token, a deactivated user or a deleted session end it
within seconds, and no event is sent after that; a role that still reads keeps it open.

Through the real ASGI application, on the database and channel layer the environment
gives (SQLite with the in-memory layer, or PostgreSQL with Redis). Each test runs twice,
as tests/server/chat/test_socket_access.py does: with the events alone (a ten-minute safety
net, so only the signal-driven `access.changed` can end the stream in time) and with the
periodic re-check alone (the events switched off, a 0.3 s period)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from asgiref.testing import ApplicationCommunicator
from channels.db import database_sync_to_async

from sessions_app import actions
from sessions_app.actions.tokens import do_revoke_token_by_id, do_revoke_tokens
from sessions_app.models import ApiToken, Membership, Run, Session
from tests.server.chat.test_consumers import journal
from tests.server.chat.test_web import reply
from tests.server.conftest import http_scope, join_team

pytestmark = [pytest.mark.django_db(transaction=True)]

RECHECK = 0.3
ENDS_WITHIN = 3.0  # seconds: the sockets' bound
QUIET = 1.0


@pytest.fixture(autouse=True, params=["events", "polling"])
def _rechecks(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, settings: Any) -> None:
    settings.SECTR_EMBEDDED_WORKER = False  # the test writes the run's envelopes itself
    if request.param == "events":
        settings.SECTR_WS_ACCESS_SECONDS = 600.0
    else:
        settings.SECTR_WS_ACCESS_SECONDS = RECHECK
        monkeypatch.setattr("sessions_app.socket_access._notify", lambda group: None)


class Stream:
    """One SSE response read chunk by chunk from the ASGI application."""

    def __init__(self, communicator: ApplicationCommunicator) -> None:
        self.communicator = communicator
        self.text = ""
        self.ended = False

    async def read(self, timeout: float) -> str | None:
        """The next chunk, "" when the response ended, None when nothing came in time."""
        try:
            message = await self.communicator.receive_output(timeout=timeout)
        except TimeoutError:
            return None
        assert message["type"] == "http.response.body", message
        chunk = message.get("body", b"").decode()
        self.text += chunk
        if not message.get("more_body", False):
            self.ended = True
            return ""
        return chunk

    async def until(self, needle: str, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while needle not in self.text:
            assert not self.ended, f"the stream ended before {needle!r}: {self.text!r}"
            assert time.monotonic() < deadline, f"no {needle!r} in {self.text!r}"
            await self.read(max(deadline - time.monotonic(), 0.01))

    async def ends_within(self, seconds: float) -> float:
        """How long it took the response to end (fails after `seconds`)."""
        start = time.monotonic()
        while not self.ended:
            left = seconds - (time.monotonic() - start)
            assert left > 0, f"still streaming after {seconds} s: {self.text[-300:]!r}"
            await self.read(left)
        return time.monotonic() - start

    async def close(self) -> None:
        if not self.ended:
            await self.communicator.send_input({"type": "http.disconnect"})
        await self.communicator.wait(timeout=5)


async def open_stream(raw_token: str, run: Run) -> Stream:
    from sectr_web.asgi import application

    headers = [(b"authorization", f"Bearer {raw_token}".encode())]
    scope = http_scope("GET", f"/api/v1/runs/{run.pk}/events", headers=headers)
    communicator = ApplicationCommunicator(application, scope)
    await communicator.send_input({"type": "http.request", "body": b"", "more_body": False})
    start = await communicator.receive_output(timeout=10)
    assert start["type"] == "http.response.start" and start["status"] == 200, start
    return Stream(communicator)


@pytest.fixture
async def streaming(owner: Any, teammate: Any, make_session: Any) -> AsyncIterator[dict[str, Any]]:
    """A reviewer of the owner's team, with an API token, streams a run of the owner's
    that is under way (its first words already journaled)."""
    reviewer = await database_sync_to_async(join_team)(teammate, "reviewer", owner)
    session = await database_sync_to_async(make_session)(title="team work")
    run = await database_sync_to_async(actions.do_post_message)(owner, session.pk, "hello")
    token, raw = await database_sync_to_async(ApiToken.issue)(reviewer, "reading")
    await journal(session, reply("first words", inv=run.invocation_id, end=False))
    stream = await open_stream(raw, run)
    await stream.until("first")
    state = {"reviewer": reviewer, "session": session, "run": run, "token": token, "stream": stream}
    yield state
    await stream.close()


async def more(state: dict[str, Any], text: str) -> None:
    """The run goes on: another delta of its message (one word: one event)."""
    await journal(state["session"], reply(text, inv=state["run"].invocation_id, end=False)[1:])


async def assert_ends_and_sends_nothing_more(state: dict[str, Any]) -> None:
    stream: Stream = state["stream"]
    await stream.ends_within(ENDS_WITHIN)
    if not await database_sync_to_async(Session.objects.filter(pk=state["session"].pk).exists)():
        return  # deleted: nothing more can be journaled
    await more(state, "afterwards")
    await asyncio.sleep(QUIET)
    assert "afterwards" not in stream.text


def leave_team(user: Any) -> None:
    Membership.objects.filter(user=user).delete()


def set_role(user: Any, role: str) -> None:
    Membership.objects.filter(user=user).update(role=role)
    # .update() sends no signal; save() does, as sectr_team and the team page do
    for membership in Membership.objects.filter(user=user):
        membership.save()


def deactivate(user: Any) -> None:
    user.is_active = False
    user.save()


CHANGES: dict[str, Callable[[dict[str, Any]], Any]] = {
    "removed from the team": lambda state: leave_team(state["reviewer"]),
    "token revoked": lambda state: do_revoke_token_by_id(state["reviewer"], state["token"].pk),
    "token revoked by the admin's bulk action": lambda state: do_revoke_tokens(
        ApiToken.objects.filter(pk=state["token"].pk)
    ),
    "token deleted": lambda state: ApiToken.objects.filter(pk=state["token"].pk).get().delete(),
    "user deactivated": lambda state: deactivate(state["reviewer"]),
    "session deleted": lambda state: Session.objects.get(pk=state["session"].pk).delete(),
}


@pytest.mark.parametrize("change", list(CHANGES))
async def test_the_stream_ends_when_access_goes(streaming: dict[str, Any], change: str) -> None:
    await more(streaming, "continuing")
    await streaming["stream"].until("continuing")
    await database_sync_to_async(CHANGES[change])(streaming)
    await assert_ends_and_sends_nothing_more(streaming)


async def test_the_stream_goes_on_for_a_role_that_still_reads(streaming: dict[str, Any]) -> None:
    # Down from reviewer to member: members read their team's sessions (and so their runs).
    await database_sync_to_async(set_role)(streaming["reviewer"], "member")
    await asyncio.sleep(QUIET)
    await more(streaming, "membersread")
    await streaming["stream"].until("membersread")
    assert not streaming["stream"].ended


async def test_the_stream_ends_when_the_role_goes_below_read(streaming: dict[str, Any]) -> None:
    # Demoted step by step: reviewer, member (still reads), then no role at all.
    await database_sync_to_async(set_role)(streaming["reviewer"], "member")
    await more(streaming, "asamember")
    await streaming["stream"].until("asamember")
    await database_sync_to_async(leave_team)(streaming["reviewer"])
    await assert_ends_and_sends_nothing_more(streaming)


async def test_a_reconnect_after_the_end_is_refused(streaming: dict[str, Any]) -> None:
    await database_sync_to_async(leave_team)(streaming["reviewer"])
    await streaming["stream"].ends_within(ENDS_WITHIN)
    from httpx import ASGITransport, AsyncClient

    from sectr_web.asgi import application

    raw = await database_sync_to_async(lambda: ApiToken.issue(streaming["reviewer"], "again")[1])()
    async with AsyncClient(transport=ASGITransport(app=application), base_url="http://127.0.0.1") as client:
        response = await client.get(
            f"/api/v1/runs/{streaming['run'].pk}/events", headers={"Authorization": f"Bearer {raw}"}
        )
    assert response.status_code == 404
