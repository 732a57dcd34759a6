"""Streams that start with the run, and a session's stream of every run, against a real server.

`POST /sessions/{id}/runs` with `Accept: text/event-stream` answers with the run's event
stream itself (the same events as `GET /runs/{id}/events`); `GET /sessions/{id}/events`
follows every run of a session with the run stream's events and resume rules.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from sectr.client import AsyncClient, Client, NotFoundError, RunEvent, SessionBusyError
from tests.server.api.cutting_proxy import CuttingProxy
from tests.server.api.test_api import assert_error, events, new_session, read_stream, start_run, wait_for_state
from tests.server.api.test_api_support import LiveApi, live_api, sse_events

pytestmark = pytest.mark.slow

STREAM = {"Accept": "text/event-stream"}


@pytest.fixture(scope="module")
def api() -> Iterator[LiveApi]:
    with live_api(env={"SECTR_SSE_HEARTBEAT_SECONDS": "0.5", "SECTR_DEMO_SLOW_MS": "40"}) as live:
        yield live


def post_stream(api: LiveApi, session_id: str, content: str, user: str = "alice") -> tuple[httpx.Response, list[Any]]:
    with api.http(user).stream(
        "POST", f"/sessions/{session_id}/runs", json={"content": content}, headers=STREAM
    ) as response:
        if response.status_code == 200:
            return response, list(sse_events(response))
        response.read()
        return response, []


def session_events(
    api: LiveApi, session_id: str, results: int, user: str = "alice", headers: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    """The session stream's events until its `results`-th result (it does not end by itself)."""
    found: list[dict[str, Any]] = []
    with api.http(user).stream("GET", f"/sessions/{session_id}/events", headers=headers) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        for frame in sse_events(response):
            if "event" in frame:
                found.append(frame)
                if sum(f["event"] == "result" for f in found) == results:
                    break
    return found


# ---- POST as the stream ----


def test_the_post_answers_with_the_runs_stream_when_asked(api: LiveApi) -> None:
    session_id = new_session(api)
    response, frames = post_stream(api, session_id, "!slow 5")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    run_id = response.headers["x-sectr-run-id"]
    assert response.headers["location"] == f"/api/v1/runs/{run_id}"
    streamed = events(frames)
    assert [f["event"] for f in streamed][:2] == ["session.title", "turn.start"]
    assert "".join(f["data"]["text"] for f in streamed if f["event"] == "message.delta") == "".join(
        f"tick {i} " for i in range(1, 6)
    )
    assert streamed[-1]["event"] == "result" and all(f["data"]["run_id"] == run_id for f in streamed)
    # Exactly the run's stream: a replay of GET /runs/{id}/events is the same.
    assert events(read_stream(api, run_id)) == streamed


def test_the_json_answer_stays_the_default(api: LiveApi) -> None:
    session_id = new_session(api)
    response = api.http().post(
        f"/sessions/{session_id}/runs", json={"content": "hi"}, headers={"Accept": "application/json"}
    )  # fmt: skip
    assert response.status_code == 202 and response.json()["status"] in ("queued", "running")
    wait_for_state(api, session_id, ("completed",))
    # Refusing the event stream (q=0) is the JSON answer too.
    response = api.http().post(
        f"/sessions/{session_id}/runs", json={"content": "hi"}, headers={"Accept": "text/event-stream;q=0, */*"}
    )  # fmt: skip
    assert response.status_code == 202, response.text


def test_a_refused_post_is_a_json_error_even_when_a_stream_was_asked_for(api: LiveApi) -> None:
    session_id = new_session(api)
    start_run(api, session_id, "!slow 30")
    response, frames = post_stream(api, session_id, "second")
    assert not frames
    assert_error(response, 409, "session_busy")
    response, _ = post_stream(api, session_id, "not mine", user="bob")
    assert_error(response, 404, "not_found")
    response = api.http().post(f"/sessions/{session_id}/runs", json={"content": 7}, headers=STREAM)
    assert response.status_code == 400 and response.headers["content-type"] == "application/json"


# ---- the session's stream ----


def test_the_session_stream_follows_every_run_and_resumes_like_a_run_stream(api: LiveApi) -> None:
    session_id = new_session(api)
    first = start_run(api, session_id, "!slow 4")
    wait_for_state(api, session_id, ("completed",))
    second = start_run(api, session_id, "!slow 6")
    third = start_run(api, session_id, "after", queue=True)  # starts when the second ends
    found = session_events(api, session_id, results=3)
    # Each run's events, in journal order: exactly what each run's own stream replays.
    per_run = [events(read_stream(api, run["run_id"])) for run in (first, second, third)]
    assert found == per_run[0] + per_run[1] + per_run[2]
    seqs = [int(f["id"]) for f in found]
    assert seqs == sorted(set(seqs))
    # Resuming mid-run (Last-Event-ID or ?after=): the rest, nothing twice, and that
    # run's result still carries its whole text.
    middle = per_run[1][3]["id"]
    tail = session_events(api, session_id, results=2, headers={"Last-Event-ID": middle})
    assert tail == [f for f in found if int(f["id"]) > int(middle)]
    assert tail[-1]["data"]["payload"]["text"] == "You said: after"
    result_of_second = next(f for f in tail if f["event"] == "result")
    assert result_of_second["data"]["payload"]["text"] == "".join(f"tick {i} " for i in range(1, 7))
    # Live: a stream opened after the last event gets the next run's events as they come.
    with api.http().stream(
        "GET", f"/sessions/{session_id}/events", params={"after": found[-1]["id"]}
    ) as response:  # fmt: skip
        fourth = start_run(api, session_id, "!slow 3")
        live = []
        for frame in sse_events(response):
            if "event" in frame:
                live.append(frame)
                if frame["event"] == "result":
                    break
    assert live == events(read_stream(api, fourth["run_id"]))


def test_the_session_stream_is_for_those_who_read_the_session(api: LiveApi) -> None:
    session_id = new_session(api)
    run = start_run(api, session_id, "hello")
    wait_for_state(api, session_id, ("completed",))
    # A moderator of the session's team reads it; an outsider gets 404, as everywhere.
    assert events(session_events(api, session_id, results=1, user="mod")) == events(read_stream(api, run["run_id"]))
    assert_error(api.http("bob").get(f"/sessions/{session_id}/events"), 404, "not_found")
    assert_error(api.http().get("/sessions/ses_nope/events"), 404, "not_found")
    anonymous = httpx.get(api.base_url + f"/api/v1/sessions/{session_id}/events")
    assert anonymous.status_code == 401
    assert_error(api.http().get(f"/sessions/{session_id}/events", params={"after": "x"}), 400, "invalid_after")


# ---- the Python SDK: run(stream=True) and session.events() ----


class Recording(httpx.HTTPTransport):
    """The SDK's transport, noting each request's method and path."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[str] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.sent.append(f"{request.method} {request.url.path}")
        return super().handle_request(request)


def test_the_sdk_reads_the_posts_answer_as_the_runs_stream(api: LiveApi) -> None:
    transport = Recording()
    with Client(api.base_url, token=api.tokens["alice"], transport=transport) as client:
        session = client.sessions.create(title="post stream")
        run = session.run("!slow 4", stream=True)
        events = list(run)
        assert events[-1].kind == "result" and events[-1].payload["text"] == "tick 1 tick 2 tick 3 tick 4 "
        assert [line for line in transport.sent if "/runs" in line] == [f"POST /api/v1/sessions/{session.id}/runs"]
        assert list(client.runs.attach(run.id)) == events
        other = client.sessions.create(title="busy")
        other.run("!slow 30")
        with pytest.raises(SessionBusyError):
            client.session(other.id).run("again", stream=True)


def test_the_async_sdk_streams_the_post_and_the_session(api: LiveApi) -> None:
    async def scenario() -> tuple[list[RunEvent], list[RunEvent], list[RunEvent]]:
        async with AsyncClient(api.base_url, token=api.tokens["alice"]) as client:
            session = await client.sessions.create(title="async streams")
            run = await session.run("!slow 3", stream=True)
            streamed = [event async for event in run]
            replay = [event async for event in client.runs.attach(run.id)]
            found = []
            async for event in session.events():
                found.append(event)
                if event.kind == "result":
                    break
            return streamed, replay, found

    streamed, replay, found = asyncio.run(scenario())
    assert streamed == replay == found and streamed[-1].payload["text"] == "tick 1 tick 2 tick 3 "


def test_the_sdk_follows_a_session_across_runs_and_cuts(api: LiveApi) -> None:
    with CuttingProxy(api.live.port) as proxy, Client(proxy.url, token=api.tokens["alice"]) as client:
        session = client.sessions.create(title="session stream")
        first = session.run("!slow 3").result()
        second = None
        found: list[RunEvent] = []
        for event in session.events():
            found.append(event)
            if event.kind == "result" and second is None:
                second = session.run("!slow 12")
            elif event.kind == "message.delta" and event.text in ("tick 4 ", "tick 8 "):
                proxy.cut()  # the SDK reconnects from its last event
            elif event.kind == "result":
                break
        assert second is not None and proxy.cuts == 2
    with Client(api.base_url, token=api.tokens["alice"]) as client:
        expected = list(client.runs.attach(first.run_id)) + list(client.runs.attach(second.id))
        assert found == expected, "every event of both runs, once, in order"
        middle = expected[5].seq
        assert middle is not None
        tail = []
        for event in client.session(session.id).events(after=middle):
            tail.append(event)
            if event.kind == "result" and event.run_id == second.id:
                break
        assert tail == [event for event in expected if event.seq is not None and event.seq > middle]
        with pytest.raises(NotFoundError):
            next(iter(client.session("ses_nope").events()))


# ---- the bytes on the wire ----


def raw_stream(api: LiveApi, path: str, user: str = "alice") -> list[bytes]:
    """The chunks of a chunked HTTP/1.1 response to GET `path`, read from the socket as
    Daphne sent them, each checked against its size line, up to the last (empty) one."""
    with socket.create_connection(("127.0.0.1", api.live.port), timeout=30) as sock:
        request = f"GET /api/v1{path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {api.tokens[user]}\r\n\r\n"
        sock.sendall(request.encode())
        reader = sock.makefile("rb")
        head = []
        while (line := reader.readline()) != b"\r\n":
            head.append(line)
        assert head[0].startswith(b"HTTP/1.1 200"), head
        assert b"transfer-encoding: chunked\r\n" in [h.lower() for h in head], head
        chunks = []
        while True:
            size = int(reader.readline().rstrip(b"\r\n"), 16)
            chunk = reader.read(size)
            assert len(chunk) == size and reader.read(2) == b"\r\n", chunk
            if size == 0:
                return chunks
            chunks.append(chunk)


def test_a_live_stream_sends_the_bytes_of_its_replay_in_well_formed_chunks(api: LiveApi) -> None:
    session_id = new_session(api)
    run_id = start_run(api, session_id, "!slow 20")["run_id"]
    live = raw_stream(api, f"/runs/{run_id}/events")
    replay = raw_stream(api, f"/runs/{run_id}/events")

    def events_only(chunks: list[bytes]) -> bytes:
        frames = b"".join(chunks).split(b"\n\n")
        return b"\n\n".join(frame for frame in frames if not frame.startswith(b":"))

    assert len(live) >= 10  # the ticks came one by one, each in a chunk of its own
    assert events_only(live) == events_only(replay)
    assert events_only(live).count(b"\nevent: message.delta\n") == 20
    assert b"\nevent: result\n" in live[-1]
