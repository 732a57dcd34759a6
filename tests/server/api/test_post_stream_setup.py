"""How `POST /sessions/{id}/runs` with `Accept: text/event-stream` sets up its stream: it
joins the session's channel-layer group before the post, so the run's events reach it
through the layer and it starts without reading the journal; a refused post, or a client
gone before the first frame, leaves no group joined.

Through the real ASGI application, on the database and channel layer the environment
gives (SQLite with the in-memory layer, or PostgreSQL with Redis); the test journals the
run's words itself (no worker)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from asgiref.testing import ApplicationCommunicator
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer

from sessions_app.api import sse
from sessions_app.journal import publish
from sessions_app.journal.publish import session_group
from sessions_app.models import ApiToken, Run, Session
from sessions_app.socket_access import user_access_group
from tests.server.chat.test_consumers import journal
from tests.server.chat.test_web import completed, reply
from tests.server.conftest import http_scope

pytestmark = [pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def _no_worker(settings: Any) -> None:
    settings.SECTR_EMBEDDED_WORKER = False  # the test writes the run's envelopes itself


def post(raw_token: str, session_id: str) -> ApplicationCommunicator:
    from sectr_web.asgi import application

    headers = [
        (b"authorization", f"Bearer {raw_token}".encode()),
        (b"accept", b"text/event-stream"),
        (b"content-type", b"application/json"),
    ]
    scope = http_scope("POST", f"/api/v1/sessions/{session_id}/runs", headers=headers)
    return ApplicationCommunicator(application, scope)


async def send_post(raw_token: str, session_id: str, body: dict[str, Any]) -> ApplicationCommunicator:
    communicator = post(raw_token, session_id)
    await communicator.send_input({"type": "http.request", "body": json.dumps(body).encode(), "more_body": False})
    return communicator


async def read_until(communicator: ApplicationCommunicator, needle: str, timeout: float = 10.0) -> str:
    text = ""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while needle not in text:
        message = await communicator.receive_output(timeout=max(deadline - loop.time(), 0.01))
        assert message["type"] == "http.response.body", message
        text += message.get("body", b"").decode()
        assert message.get("more_body", False) or needle in text, text
    return text


async def stream_a_run(token: str, session: Session, words: str = "done") -> tuple[Run, str]:
    """POST a prompt for its stream, journal the run's reply of `words` and its end, and
    read the stream to its result and its end: the run and the stream's text."""
    communicator = await send_post(token, session.pk, {"content": "hello"})
    start = await communicator.receive_output(timeout=10)
    assert start["status"] == 200, start
    text = await read_until(communicator, ": stream of")
    run = await database_sync_to_async(Run.objects.get)(session_id=session.pk)
    await journal(session, [*reply(words, inv=run.invocation_id), completed(run.invocation_id)])
    text += await read_until(communicator, "event: result")
    await communicator.wait(timeout=5)
    return run, text


def joined(session_id: str) -> int:
    """How many channels of this process are in the session's group (either layer)."""
    return members(session_group(session_id))


def members(group: str) -> int:
    """How many channels of this process are in `group` (either layer)."""
    layer: Any = get_channel_layer()
    if hasattr(layer, "_get_layer"):  # channels_redis' pub/sub layer: one per event loop
        inner = layer._get_layer()
        return len(inner.groups.get(inner._get_group_channel_name(group), ()))
    return len(layer.groups.get(group, {}))


@pytest.fixture
def token(owner: Any) -> str:
    return ApiToken.issue(owner, "posting")[1]


@pytest.fixture
def journal_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The `after_seq` of every journal read a stream makes from now on."""
    reads: list[int] = []
    read_envelopes = sse.read_envelopes

    def counted(session_id: str, after_seq: int, limit: int = sse.READ_PAGE) -> Any:
        reads.append(after_seq)
        return read_envelopes(session_id, after_seq, limit)

    monkeypatch.setattr(sse, "read_envelopes", counted)
    return reads


async def test_the_posts_stream_starts_without_reading_the_journal(
    token: str, session: Session, journal_reads: list[int]
) -> None:
    reads = journal_reads
    run, text = await stream_a_run(token, session, "live words")
    assert "live " in text and "words" in text and run.pk in text
    assert reads == []  # the prompt's events and the words all came through the layer
    assert joined(session.pk) == 0


async def test_the_posts_stream_starts_with_its_own_batch_when_the_layer_brings_it_late(
    token: str, session: Session, journal_reads: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The post's publication may reach the layer after the worker's first batch (it
    waits its turn on the server loop): the stream starts with the batch the post
    committed, so the worker's batch is no gap (no journal read), and the post's late
    message is a duplicate: every event once, in order."""
    reads = journal_reads
    held: list[Any] = []
    send_sync = publish._send_sync
    monkeypatch.setattr(publish, "_send_sync", held.append)  # the post's publication, held back
    communicator = await send_post(token, session.pk, {"content": "hello"})
    start = await communicator.receive_output(timeout=10)
    assert start["status"] == 200, start
    text = await read_until(communicator, ": stream of")
    monkeypatch.setattr(publish, "_send_sync", send_sync)
    run = await database_sync_to_async(Run.objects.get)(session_id=session.pk)
    await journal(session, reply("early words", inv=run.invocation_id))
    text += await read_until(communicator, "words")
    assert held
    for messages in held:
        send_sync(messages)  # now, after the worker's batch
    await asyncio.sleep(0.2)
    await journal(session, [completed(run.invocation_id)])
    text += await read_until(communicator, "event: result")
    await communicator.wait(timeout=5)
    assert reads == []
    ids = [int(line[4:]) for line in text.splitlines() if line.startswith("id: ")]
    assert ids == sorted(set(ids)), text
    assert "early " in text and '"words"' in text


async def test_the_stream_joins_its_access_group_with_the_sessions_before_the_post(
    token: str, session: Session, owner: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both of the stream's groups are joined before the post (in one step: one SUBSCRIBE
    with the pub/sub layer), so a revocation from then on reaches the stream; both are
    left when it ends."""
    access = user_access_group(owner.pk)
    seen: list[tuple[int, int, bool]] = []
    join_unless_closed = sse.RunStream._join_unless_closed

    async def observed(stream: sse.RunStream) -> None:
        await join_unless_closed(stream)
        posted = await database_sync_to_async(Run.objects.filter(session_id=session.pk).exists)()
        seen.append((joined(session.pk), members(access), posted))

    monkeypatch.setattr(sse.RunStream, "_join_unless_closed", observed)
    await stream_a_run(token, session)
    assert seen == [(1, 1, False)]
    assert (joined(session.pk), members(access)) == (0, 0)


@pytest.mark.parametrize(
    ("case", "status"),
    [("bad token", 401), ("bad body", 400), ("no such session", 404), ("bad id", 404)],
)
async def test_a_refused_post_leaves_no_group_joined(
    token: str, session: Session, outsider: Any, case: str, status: int
) -> None:
    session_id = {"no such session": "ses_missing", "bad id": "not*an*id"}.get(case, session.pk)
    raw = "sectr_wrong" if case == "bad token" else token
    body = {"content": "hello", "extra": 1} if case == "bad body" else {"content": "hello"}
    communicator = await send_post(raw, session_id, body)
    start = await communicator.receive_output(timeout=10)
    assert start["status"] == status, start
    await communicator.wait(timeout=5)
    assert joined(session_id if case != "bad id" else session.pk) == 0
    assert not await database_sync_to_async(Run.objects.filter(session_id=session.pk).exists)()


async def test_a_client_gone_before_the_first_frame_leaves_no_group_joined(token: str, session: Session) -> None:
    communicator = await send_post(token, session.pk, {"content": "hello"})
    await communicator.send_input({"type": "http.disconnect"})
    await communicator.wait(timeout=5)
    for _ in range(50):  # a stream cut short leaves its groups in its `finally`
        if joined(session.pk) == 0:
            break
        await asyncio.sleep(0.05)
    assert joined(session.pk) == 0


@pytest.mark.parametrize("case", ["bad token", "past the rate limit"])
async def test_a_refused_token_costs_no_subscription(
    token: str, session: Session, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    """401 and 429 come before the stream joins anything: with the pub/sub layer a join is
    a SUBSCRIBE to Redis (and its UNSUBSCRIBE), which an unauthenticated client must not
    be able to make the server do."""
    from sessions_app.api import auth
    from sessions_app.budgets import spend

    layer: Any = get_channel_layer()
    channels: list[str] = []
    new_channel = layer.new_channel

    async def recorded(prefix: str = "specific.") -> str:
        channels.append(prefix)
        return await new_channel(prefix)

    monkeypatch.setattr(layer, "new_channel", recorded)
    raw = "sectr_wrong" if case == "bad token" else token
    if case == "past the rate limit":
        monkeypatch.setattr(auth, "rate_limit", lambda: (1, 60))
        prefix = await database_sync_to_async(lambda: ApiToken.authenticate(token).prefix)()
        await database_sync_to_async(spend)("api", prefix, 60)
    communicator = await send_post(raw, session.pk, {"content": "hello"})
    start = await communicator.receive_output(timeout=10)
    assert start["status"] == (401 if case == "bad token" else 429), start
    await communicator.wait(timeout=5)
    assert channels == [], "the refused post made a channel and joined the session's group"
    assert not await database_sync_to_async(Run.objects.filter(session_id=session.pk).exists)()


async def test_the_posts_request_takes_no_request_thread(token: str, session: Session) -> None:
    """The POST's queries run in the journal's threads, so its request has no
    thread-sensitive work: request_started is not sent (its receivers concern the request
    thread's connections), and request_finished is sent on the event loop, with no hop."""
    import threading

    from django.core.signals import request_finished, request_started

    started: list[threading.Thread] = []
    finished: list[threading.Thread] = []

    def record_started(**kwargs: Any) -> None:
        started.append(threading.current_thread())

    def record_finished(**kwargs: Any) -> None:
        finished.append(threading.current_thread())

    request_started.connect(record_started)
    request_finished.connect(record_finished)
    try:
        await stream_a_run(token, session)
    finally:
        request_started.disconnect(record_started)
        request_finished.disconnect(record_finished)
    assert started == []
    assert finished == [threading.current_thread()]


async def test_the_post_takes_one_database_hop(token: str, session: Session, monkeypatch: pytest.MonkeyPatch) -> None:
    """Admission (the token, its rate limit), the join of the stream's groups and the post
    run in one call in the journal's threads, and the run is attributed to its token."""
    from sessions_app.api import views

    hops: list[str] = []
    run_plain_in_db_thread = views.run_plain_in_db_thread

    async def counted(func: Any, *args: Any, **kwargs: Any) -> Any:
        hops.append(func.__qualname__)
        return await run_plain_in_db_thread(func, *args, **kwargs)

    monkeypatch.setattr(views, "run_plain_in_db_thread", counted)
    run, _text = await stream_a_run(token, session)
    assert len(hops) == 1, hops
    key = await database_sync_to_async(lambda: ApiToken.authenticate(token).pk)()
    assert run.api_token_key == key
