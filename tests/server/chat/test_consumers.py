"""The websockets, through the real ASGI application (origin check, session auth, routing).

Appends go through DatabaseJournal, so live frames travel the real path: commit, then
publication to the channel layer (in-memory, or Redis in the PostgreSQL pass), then the
consumer's render. No worker runs: the journals are written by the tests.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.test import Client

from sectr.events import EventType
from sectr.journal import NewEvent
from sessions_app.journal import DatabaseJournal
from sessions_app.journal.publish import ENVELOPES_MESSAGE_TYPE, session_group
from sessions_app.models import Session
from tests.server.chat.test_web import append, asked, assert_inert, completed, reply, started
from tests.server.conftest import join_team

pytestmark = [pytest.mark.django_db(transaction=True)]

ORIGIN = (b"origin", b"http://127.0.0.1")
HOST = (b"host", b"127.0.0.1")  # what a browser sends: the origin check compares the two


@pytest.fixture(autouse=True)
def _no_embedded_worker(settings: Any) -> None:
    # The ASGI app starts a worker on its first connection; these tests write the journal.
    settings.SECTR_EMBEDDED_WORKER = False


def _cookie_for(user: Any) -> bytes:
    client = Client()
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}".encode()


async def connect(user: Any, path: str, *, origin: bool = True) -> tuple[WebsocketCommunicator, bool, Any]:
    from sectr_web.asgi import application

    headers = [HOST, ORIGIN] if origin else [HOST]
    if user is not None:
        headers.append((b"cookie", await database_sync_to_async(_cookie_for)(user)))
    communicator = WebsocketCommunicator(application, path, headers=headers)
    connected, detail = await communicator.connect(timeout=5)
    return communicator, connected, detail


async def frames_until_ready(communicator: WebsocketCommunicator) -> list[dict[str, Any]]:
    frames = []
    while True:
        frame = json.loads(await communicator.receive_from(timeout=5))
        if frame.get("ready"):
            return frames
        frames.append(frame)


async def next_frame(communicator: WebsocketCommunicator) -> dict[str, Any]:
    return dict(json.loads(await communicator.receive_from(timeout=5)))


def chat_path(session: Session, after: int = 0) -> str:
    return f"/ws/sessions/{session.pk}/?after={after}"


async def journal(session: Session, events: list[NewEvent], *, publish: bool = True) -> list[Any]:
    return await DatabaseJournal(publish=publish).append(session.pk, events)


# ---- who may connect ----


async def test_the_owner_connects_and_catches_up_from_zero(owner: Any, session: Session) -> None:
    await database_sync_to_async(append)(session, [started("hello"), *reply("You said: hello"), completed()])
    communicator, connected, _ = await connect(owner, chat_path(session))
    assert connected
    frames = await frames_until_ready(communicator)
    assert len(frames) == 1
    html = frames[0]["html"]
    assert (frames[0]["first"], frames[0]["seq"]) == (1, 8)
    assert 'hx-swap-oob="beforeend:#transcript"' in html
    assert 'data-role="user"' in html and "You said: hello" in html
    assert re.search(r'data-role="state"[^>]*hx-swap-oob="true">completed<', html)
    await communicator.disconnect()


async def test_an_outsider_is_refused_before_the_socket_opens(outsider: Any, session: Session) -> None:
    communicator, connected, code = await connect(outsider, chat_path(session))
    assert not connected and code == 4404
    await communicator.disconnect()


async def test_an_anonymous_visitor_is_refused(session: Session) -> None:
    communicator, connected, code = await connect(None, chat_path(session))
    assert not connected and code == 4403
    await communicator.disconnect()


async def test_a_missing_session_is_not_found(owner: Any) -> None:
    communicator, connected, code = await connect(owner, "/ws/sessions/ses_nope/")
    assert not connected and code == 4404
    await communicator.disconnect()


async def test_a_socket_without_an_origin_is_refused(owner: Any, session: Session) -> None:
    communicator, connected, _ = await connect(owner, chat_path(session), origin=False)
    assert not connected
    await communicator.disconnect()


async def test_a_reviewer_connects_without_decision_buttons(teammate: Any, session: Session) -> None:
    reviewer = await database_sync_to_async(join_team)(teammate, "reviewer", session)
    await database_sync_to_async(append)(session, [started("note: buy milk", inv="inv_2"), *asked()])
    communicator, connected, _ = await connect(reviewer, chat_path(session))
    assert connected
    html = "".join(frame["html"] for frame in await frames_until_ready(communicator))
    assert 'data-role="approval"' in html and "Approve once" not in html
    await communicator.disconnect()


# ---- resume and live ----


async def test_resume_after_seq_n_sends_exactly_what_came_after(owner: Any, session: Session) -> None:
    envelopes = await database_sync_to_async(append)(session, [started("one"), *reply("You said: one"), completed()])
    last = envelopes[-1].seq  # 8: created 1, started 2, start 3, deltas 4-6, end 7, completed 8
    communicator, connected, _ = await connect(owner, chat_path(session, after=5))
    assert connected
    frames = await frames_until_ready(communicator)
    assert [(f["first"], f["seq"]) for f in frames] == [(6, last)]
    html = frames[0]["html"]
    # seq 6 (the delta "one") streamed into the open message; seq 7 ended it: the page
    # gets the finished message, nothing from before seq 6 is appended again.
    assert 'data-role="user"' not in html
    assert 'id="m-msg_1"' in html and 'hx-swap-oob="true"' in html and "You said: one" in html
    await communicator.disconnect()


async def test_resume_at_the_end_sends_nothing_but_ready(owner: Any, session: Session) -> None:
    communicator, connected, _ = await connect(owner, chat_path(session, after=session.last_seq))
    assert connected
    assert await frames_until_ready(communicator) == []
    assert await communicator.receive_nothing(timeout=0.2)
    await communicator.disconnect()


async def test_a_cursor_beyond_the_journal_asks_for_a_reload(owner: Any, session: Session) -> None:
    communicator, _, _ = await connect(owner, chat_path(session, after=999))
    assert (await next_frame(communicator)).get("reload") is True
    await communicator.disconnect()


async def test_live_deltas_arrive_as_oob_appends_to_their_message(owner: Any, session: Session) -> None:
    communicator, _, _ = await connect(owner, chat_path(session, after=session.last_seq))
    await frames_until_ready(communicator)
    await journal(session, [started("!slow 3")])
    frame = await next_frame(communicator)
    assert 'data-role="user"' in frame["html"] and "!slow 3" in frame["html"]
    await journal(session, reply("tick 1 ", end=False)[:1])  # MESSAGE_START
    frame = await next_frame(communicator)
    assert 'id="m-msg_1-text"' in frame["html"]
    await journal(session, [NewEvent(EventType.MESSAGE_DELTA, {"message_id": "msg_1", "text": "tick 1 "}, "inv_1")])
    frame = await next_frame(communicator)
    assert frame["html"] == '<span hx-swap-oob="beforeend:#m-msg_1-text">tick 1 </span>\n'
    await journal(session, [NewEvent(EventType.MESSAGE_END, {"message_id": "msg_1"}, "inv_1"), completed()])
    frame = await next_frame(communicator)
    assert re.search(r'<article id="m-msg_1"[^>]*hx-swap-oob="true"', frame["html"])
    assert ">completed<" in frame["html"]
    await communicator.disconnect()


async def test_two_tabs_see_the_same_frames(owner: Any, session: Session) -> None:
    first, _, _ = await connect(owner, chat_path(session, after=session.last_seq))
    second, _, _ = await connect(owner, chat_path(session, after=session.last_seq))
    await frames_until_ready(first)
    await frames_until_ready(second)
    await journal(session, [started("hi")])
    assert await next_frame(first) == await next_frame(second)
    await first.disconnect()
    await second.disconnect()


async def test_an_envelope_seen_already_is_not_sent_twice(owner: Any, session: Session) -> None:
    communicator, _, _ = await connect(owner, chat_path(session, after=session.last_seq))
    await frames_until_ready(communicator)
    envelopes = await journal(session, [started("hi")])
    await next_frame(communicator)
    layer = get_channel_layer()
    message = {"type": ENVELOPES_MESSAGE_TYPE, "session_id": session.pk, "envelopes": [envelopes[0].to_dict()]}
    await layer.group_send(session_group(session.pk), message)
    assert await communicator.receive_nothing(timeout=0.3)
    await communicator.disconnect()


async def test_a_gap_is_filled_from_the_journal(owner: Any, session: Session) -> None:
    communicator, _, _ = await connect(owner, chat_path(session, after=session.last_seq))
    await frames_until_ready(communicator)
    # Two appends whose publications were lost; then only the second one is delivered.
    await journal(session, [started("lost")], publish=False)
    second = await journal(session, [NewEvent(EventType.STEER_RECEIVED, {"text": "also lost"}, "inv_1")], publish=False)
    layer = get_channel_layer()
    message = {"type": ENVELOPES_MESSAGE_TYPE, "session_id": session.pk, "envelopes": [second[0].to_dict()]}
    await layer.group_send(session_group(session.pk), message)
    frame = await next_frame(communicator)
    assert (frame["first"], frame["seq"]) == (second[0].seq - 1, second[0].seq)
    assert "lost" in frame["html"] and "also lost" in frame["html"]
    await communicator.disconnect()


async def test_a_dropped_last_message_arrives_on_resync(owner: Any, session: Session) -> None:
    communicator, _, _ = await connect(owner, chat_path(session, after=session.last_seq))
    await frames_until_ready(communicator)
    await journal(session, [started("nobody published this")], publish=False)
    await communicator.send_to(text_data=json.dumps({"sync": True}))
    frame = await next_frame(communicator)
    assert "nobody published this" in frame["html"]
    await communicator.disconnect()


async def test_the_periodic_resync_finds_what_the_layer_dropped(owner: Any, session: Session, settings: Any) -> None:
    settings.SECTR_WS_RESYNC_SECONDS = 0.2
    communicator, _, _ = await connect(owner, chat_path(session, after=session.last_seq))
    await frames_until_ready(communicator)
    await journal(session, [started("dropped by the layer")], publish=False)
    frame = await next_frame(communicator)
    assert "dropped by the layer" in frame["html"]
    await communicator.disconnect()


async def test_user_and_model_markup_arrives_escaped(owner: Any, session: Session) -> None:
    communicator, _, _ = await connect(owner, chat_path(session, after=session.last_seq))
    await frames_until_ready(communicator)
    await journal(session, [started('<img src=x onerror="alert(1)">')])
    user_frame = await next_frame(communicator)
    evil = "You said: [click](javascript:alert(1)) <script>alert(2)</script> <img src=y onerror=alert(3)>"
    await journal(session, reply(evil, end=False))
    streamed = await next_frame(communicator)
    await journal(session, [NewEvent(EventType.MESSAGE_END, {"message_id": "msg_1"}, "inv_1"), completed()])
    finished = await next_frame(communicator)
    for frame in (user_frame, streamed, finished):
        assert_inert(frame["html"])
    assert "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in user_frame["html"]
    assert "&lt;script&gt;alert(2)&lt;/script&gt;" in finished["html"]
    assert "[click](javascript:alert(1))" in finished["html"]  # shown as text, not as a link
    await communicator.disconnect()


async def test_a_decision_updates_the_card(owner: Any, session: Session) -> None:
    envelopes = await database_sync_to_async(append)(session, [started("note: buy milk", inv="inv_2"), *asked()])
    communicator, _, _ = await connect(owner, chat_path(session, after=envelopes[-1].seq))
    await frames_until_ready(communicator)
    from sessions_app.actions import do_decide

    await database_sync_to_async(do_decide)(owner, "ask_1", "deny")
    frame = await next_frame(communicator)
    assert re.search(r'id="ask-ask_1"[^>]*data-status="denied"[^>]*hx-swap-oob="true"', frame["html"])
    assert "Denied by owner" in frame["html"]
    await communicator.disconnect()


# ---- the approval queue ----


async def test_the_queue_gets_new_asks_of_sessions_the_user_may_decide(
    owner: Any, outsider: Any, teammate: Any, session: Session
) -> None:
    moderator = await database_sync_to_async(join_team)(teammate, "moderator", session)
    sockets = {}
    for name, user in (("owner", owner), ("outsider", outsider), ("moderator", moderator)):
        communicator, connected, _ = await connect(user, "/ws/approvals/")
        assert connected, name
        assert await frames_until_ready(communicator) == []
        sockets[name] = communicator
    await journal(session, [started("note: buy milk", inv="inv_2"), *asked()])
    for name in ("owner", "moderator"):
        html = (await next_frame(sockets[name]))["html"]
        assert 'hx-swap-oob="beforeend:#approval-queue"' in html and "ask-ask_1" in html, name
        assert "Approve once" in html
    assert await sockets["outsider"].receive_nothing(timeout=0.3)
    for communicator in sockets.values():
        await communicator.disconnect()


async def test_the_queue_refuses_anonymous_visitors() -> None:
    communicator, connected, code = await connect(None, "/ws/approvals/")
    assert not connected and code == 4403
    await communicator.disconnect()


async def test_the_queue_drops_a_withdrawn_ask_live(owner: Any, session: Session) -> None:
    from sectr.operations import cancel_awaiting_events

    communicator, connected, _ = await connect(owner, "/ws/approvals/")
    assert connected
    assert await frames_until_ready(communicator) == []
    await journal(session, [started("note: buy milk", inv="inv_2"), *asked()])
    assert "ask-ask_1" in (await next_frame(communicator))["html"]
    state = await DatabaseJournal().state(session.pk)
    await journal(session, cancel_awaiting_events(state, "owner"))
    html = (await next_frame(communicator))["html"]
    assert re.search(r'id="ask-ask_1"[^>]*data-status="withdrawn"[^>]*hx-swap-oob="true"', html), html
    assert "Approve once" not in html
    await communicator.disconnect()
