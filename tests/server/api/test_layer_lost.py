"""A channel layer that fails an event stream is never a hung response, nor a 500.

A stream joins its session's groups before it sends anything; when the layer fails that
(Redis away for longer than its connections retry) the stream ends at once with a
``retry:`` field and the client resumes with its Last-Event-ID. Before a 200 went out
(the POST that answers with its run's stream) it is a 503 with Retry-After, and nothing
is posted. An error escaping a stream after its 200 left the client waiting on a
response that never ended (Daphne cannot answer 500 once a response has started).
"""

from __future__ import annotations

from typing import Any

import pytest
from channels.layers import get_channel_layer
from django.test import Client
from redis.exceptions import ConnectionError as RedisConnectionError

from sessions_app import actions
from sessions_app.actions.tokens import do_issue_token
from sessions_app.api import sse
from sessions_app.dbthread import run_in_db_thread
from sessions_app.models import Run

pytestmark = pytest.mark.django_db(transaction=True)

LOST = "Error 111 connecting to 127.0.0.1:6379. Connection refused."


@pytest.fixture
def layer_down(monkeypatch: pytest.MonkeyPatch) -> None:
    """The layer refuses every join, as a Redis client does while Redis is away."""

    async def refuse(group: str, channel: str) -> None:
        raise RedisConnectionError(LOST)

    async def refuse_many(groups: list[str], channel: str) -> None:
        raise RedisConnectionError(LOST)

    layer = get_channel_layer()
    monkeypatch.setattr(layer, "group_add", refuse)
    if hasattr(layer, "group_add_many"):  # the Redis layer: a stream joins its groups at once
        monkeypatch.setattr(layer, "group_add_many", refuse_many)


async def test_a_stream_the_layer_cannot_join_ends_with_retry(owner: Any, layer_down: None) -> None:
    session = await run_in_db_thread(actions.do_create_session, owner)
    posted = await run_in_db_thread(actions.do_post_message, owner, session.pk, "hello")
    run = await run_in_db_thread(Run.objects.get, pk=posted.pk)
    frames = [frame async for frame in sse.RunStream(run, 0).frames()]
    assert frames == [b": live updates are unavailable\nretry: 2000\n\n"]


async def test_a_stream_whose_layer_receive_failed_ends_with_retry(owner: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    session = await run_in_db_thread(actions.do_create_session, owner)
    posted = await run_in_db_thread(actions.do_post_message, owner, session.pk, "!slow 50")
    run = await run_in_db_thread(Run.objects.get, pk=posted.pk)

    async def fail(channel: str) -> dict[str, Any]:
        raise RedisConnectionError(LOST)

    layer = get_channel_layer()
    monkeypatch.setattr(layer, "receive", fail)
    # The stream's own reader, which a layer that hands messages over (the Redis
    # layer's listening channels, whose receive loop reconnects by itself) does without.
    monkeypatch.setattr(layer, "new_listening_channel", None, raising=False)
    frames = [frame async for frame in sse.RunStream(run, 0).frames()]
    assert frames[0].startswith(b": stream of ")
    assert frames[-1] == b": live updates are unavailable\nretry: 2000\n\n"


def test_a_post_asking_for_its_stream_is_503_and_posts_nothing(owner: Any, layer_down: None) -> None:
    session = actions.do_create_session(owner)
    _, raw = do_issue_token(owner, "t")
    response = Client().post(
        f"/api/v1/sessions/{session.pk}/runs",
        {"content": "hello"},
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {raw}",
        HTTP_ACCEPT="text/event-stream",
    )
    assert response.status_code == 503
    assert response["Retry-After"] == "2"
    assert response.json()["error"]["code"] == "unavailable"
    assert LOST not in response.content.decode()  # the cause stays in the log
    assert not Run.objects.filter(session_id=session.pk).exists()


async def test_a_join_from_the_database_thread_raises_there_when_the_layer_refuses_it(
    owner: Any, layer_down: None
) -> None:
    """The thread that posts a streamed run waits for the stream's join on the event
    loop, and gets its failure (so it posts nothing), not a hang or a success."""
    import asyncio

    token = (await run_in_db_thread(do_issue_token, owner))[0]
    session = await run_in_db_thread(actions.do_create_session, owner)
    stream = sse.RunStream.to_join_before_run(session.pk)
    loop = asyncio.get_running_loop()
    with pytest.raises(sse.ChannelLayerUnavailable):
        await loop.run_in_executor(None, stream.join_from_thread, token, loop)
    await stream.close()


async def test_a_join_from_the_database_thread_returns_once_the_groups_are_joined(owner: Any) -> None:
    import asyncio

    from sessions_app.journal.publish import session_group
    from sessions_app.socket_access import user_access_group

    token = (await run_in_db_thread(do_issue_token, owner))[0]
    session = await run_in_db_thread(actions.do_create_session, owner)
    stream = sse.RunStream.to_join_before_run(session.pk)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, stream.join_from_thread, token, loop)
    assert stream._joined == [session_group(session.pk), user_access_group(owner.pk)]
    await stream.close()
    assert stream._joined == []
