"""The Python SDK's additions that mirror the TypeScript SDK: fork and clear options
(model by provider and id, worktree selectors returned in `placement`), checks of parts
before anything is sent, a total `deadline`, the session-affinity header, `title.value`,
and request controls kept apart from a call's own options."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sectr.client import (
    AFFINITY_HEADER,
    AsyncClient,
    Client,
    DeadlineExceededError,
    InvalidRequestError,
    PromptValidationError,
    RequestControls,
    audio_part_from_bytes,
    image_part_from_bytes,
    image_part_from_path,
    image_part_from_url,
    text_part,
)
from sectr.client.parts import PART_MAX_BYTES
from tests.server.api.test_api_support import LiveApi, live_api

pytestmark = pytest.mark.slow

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 64
WAV = b"RIFF\x24\x00\x00\x00WAVEfmt " + b"\x00" * 64


@pytest.fixture(scope="module")
def api() -> Iterator[LiveApi]:
    with live_api() as live:  # `!slow 25` takes 2.5 s: the default 100 ms a tick
        yield live


class Recorder:
    """An httpx transport that records each request's headers before sending it for real."""

    def __init__(self) -> None:
        self.inner = httpx.HTTPTransport()
        self.requests: list[httpx.Request] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return self.inner.handle_request(request)


class RecordingTransport(httpx.BaseTransport):
    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        return self.recorder.handle_request(request)


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def client(api: LiveApi, recorder: Recorder) -> Iterator[Client]:
    with Client(api.base_url, token=api.tokens["alice"], transport=RecordingTransport(recorder)) as client:
        yield client


def test_the_servers_event_kinds_are_the_sdks() -> None:
    import json

    from sessions_app.api.events import EVENT_KINDS

    surface = json.loads((Path(__file__).resolve().parents[3] / "sdk" / "surface.json").read_text())
    assert list(EVENT_KINDS) == surface["event_kinds"]


# ---- fork and clear ----


def test_fork_takes_provider_model_and_selector_and_returns_them(client: Client) -> None:
    session = client.sessions.create(title="Source")
    session.run("hello").result()
    selector = {"repo": "sectr", "branch": "feature/x"}
    fork = client.sessions.fork(session.id, provider_id="demo", model_id="llama3.1", worktree_selector=selector)
    snap = fork.snapshot()
    assert snap.resolved_model.provider_id == "demo" and snap.resolved_model.model_id == "llama3.1"
    assert snap.placement == {"worktree_selector": selector}
    # The list shows it too, and a fork of the fork inherits it unless it names another.
    listed = {s.id: s for s in client.sessions.list(limit=100)}
    assert listed[fork.id].placement == {"worktree_selector": selector}
    assert fork.fork().snapshot().placement == {"worktree_selector": selector}
    assert fork.fork(worktree_selector="wt-2").snapshot().placement == {"worktree_selector": "wt-2"}
    assert session.snapshot().placement is None


def test_clear_takes_a_selector_and_keeps_the_model(client: Client) -> None:
    session = client.sessions.create(model="llama3.1")
    cleared = session.clear(worktree_selector="wt-7")
    snap = cleared.last_snapshot
    assert snap is not None and snap.placement == {"worktree_selector": "wt-7"}
    assert snap.resolved_model.model_id == "llama3.1" and cleared.id != session.id
    assert cleared.clear().snapshot().placement == {"worktree_selector": "wt-7"}


def test_fork_refuses_another_provider_and_a_bad_selector(api: LiveApi, client: Client) -> None:
    session = client.sessions.create()
    with pytest.raises(InvalidRequestError) as caught:
        session.fork(provider_id="elsewhere", model_id="gpt-x")
    assert caught.value.code == "invalid_provider_id" and caught.value.status == 400
    with pytest.raises(InvalidRequestError) as caught:
        session.fork(model="demo", model_id="llama3.1")
    assert caught.value.code == "invalid_model"
    http = api.http("alice")
    before = client.sessions.list(limit=100).count
    for body in ({"worktree_selector": 5}, {"worktree_selector": "x" * 2049}, {"worktree_selector": []}):
        answer = http.post(f"/sessions/{session.id}/clear", json=body)
        assert answer.status_code == 400, body
        assert answer.json()["error"]["code"] in ("invalid_worktree_selector", "invalid_body"), answer.text
    assert http.post(f"/sessions/{session.id}/clear", json={"worktree_selecter": "x"}).status_code == 400
    assert client.sessions.list(limit=100).count == before  # the refusals created nothing


# ---- checks before sending ----


def run_requests(recorder: Recorder) -> list[httpx.Request]:
    return [r for r in recorder.requests if r.method == "POST" and r.url.path.endswith("/runs")]


def test_bad_parts_are_refused_before_anything_is_uploaded(client: Client, recorder: Recorder, tmp_path: Path) -> None:
    session = client.sessions.create()
    cases: list[tuple[Any, str]] = [
        ([text_part("x"), {"type": "image_url", "image_url": {"url": "http://example.com/a.png"}}], "url"),
        ([text_part("x"), {"type": "image_url", "image_url": {"url": "https://127.0.0.1/a.png"}}], "url"),
        ([{"type": "input_audio", "input_audio": {"url": "https://example.com/a.wav", "format": "wav"}}], "url"),
        (
            [text_part("x"), {"type": "image_url", "image_url": {"url": "data:image/png;base64,R0lGODlhAQAB"}}],
            "mime_type",
        ),
        ([text_part(str(i)) for i in range(17)], "prompt"),
    ]
    for content, code in cases:
        with pytest.raises(PromptValidationError) as caught:
            session.run(content)
        assert caught.value.code == code, content
    # Types come from the bytes, not the name or the label.
    (tmp_path / "photo.png").write_bytes(b"GIF89a" + b"\x00" * 32)
    assert image_part_from_path(tmp_path / "photo.png")["image_url"]["url"].startswith("data:image/gif;")
    (tmp_path / "notes.png").write_bytes(b"just text, not an image")
    with pytest.raises(PromptValidationError) as caught:
        image_part_from_path(tmp_path / "notes.png")
    assert caught.value.code == "mime_type"
    with pytest.raises(PromptValidationError) as caught:
        image_part_from_bytes(PNG, "image/jpeg")
    assert caught.value.code == "mime_type"
    with pytest.raises(PromptValidationError) as caught:
        image_part_from_url("http://example.com/cat.png")
    assert caught.value.code == "url"
    big = tmp_path / "big.png"
    big.write_bytes(PNG + b"\x00" * PART_MAX_BYTES)
    with pytest.raises(PromptValidationError) as caught:
        image_part_from_path(big)
    assert caught.value.code == "size"
    assert run_requests(recorder) == []  # none of them reached the server


def test_an_image_for_a_model_without_images_is_refused_by_the_snapshot(client: Client, recorder: Recorder) -> None:
    plain = client.sessions.create(model="llama3.1")
    assert plain.last_snapshot is not None and plain.last_snapshot.media["image"] is False
    with pytest.raises(PromptValidationError) as caught:
        plain.run([text_part("x"), image_part_from_bytes(PNG)])
    assert caught.value.code == "capability"
    # A handle without a snapshot reads one first (one GET), then refuses all the same.
    handle = client.session(plain.id)
    with pytest.raises(PromptValidationError):
        handle.run([audio_part_from_bytes(WAV)])
    assert run_requests(recorder) == []
    ok = client.sessions.create()
    assert ok.run([text_part("a picture"), image_part_from_bytes(PNG)]).result().stop_reason == "end_turn"
    assert len(run_requests(recorder)) == 1


# ---- deadline ----


def test_a_run_with_a_deadline_ends_in_time_with_a_typed_error(client: Client) -> None:
    session = client.sessions.create()
    started = time.monotonic()
    run = session.run("!slow 25", deadline=1)
    with pytest.raises(DeadlineExceededError) as caught:
        run.result()
    elapsed = time.monotonic() - started
    assert 0.9 <= elapsed < 1.6, elapsed
    assert caught.value.code == "deadline_exceeded" and "1 s" in str(caught.value)
    run_info = client.runs.get(run.id)
    assert run_info.active  # only the client stopped waiting; the run goes on until cancelled
    run.cancel()


def test_iterating_a_run_stops_at_its_deadline(client: Client) -> None:
    session = client.sessions.create()
    run = session.run("!slow 25", controls=RequestControls(deadline=0.8))
    seen = []
    started = time.monotonic()
    with pytest.raises(DeadlineExceededError):
        for event in run:
            seen.append(event.kind)
    assert time.monotonic() - started < 1.4 and "turn.start" in seen
    run.cancel()


def test_the_async_client_keeps_a_deadline_too(api: LiveApi) -> None:
    async def scenario() -> float:
        async with AsyncClient(api.base_url, token=api.tokens["alice"]) as client:
            session = await client.sessions.create()
            started = time.monotonic()
            run = await session.run("!slow 25", deadline=1)
            with pytest.raises(DeadlineExceededError):
                await run.result()
            elapsed = time.monotonic() - started
            await run.cancel()
            return elapsed

    assert asyncio.run(scenario()) < 1.6


def test_a_call_with_a_deadline_that_cannot_be_met_fails_fast() -> None:
    # A server that accepts the connection and never answers.
    import socket

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        with Client(f"http://127.0.0.1:{port}", token="t") as silent:
            started = time.monotonic()
            with pytest.raises(DeadlineExceededError):
                silent.sessions.get("ses_x", deadline=0.5)
            assert time.monotonic() - started < 1.2


# ---- affinity, title, controls ----


def test_calls_about_a_session_carry_the_affinity_header(client: Client, recorder: Recorder) -> None:
    session = client.sessions.create(title="Affinity")
    recorder.requests.clear()
    session.snapshot()
    session.rename("Renamed")
    run = session.run("hi")
    run.result()
    run.status()
    for request in recorder.requests:
        assert request.headers.get(AFFINITY_HEADER) == session.id, request.url
    assert {r.url.path.rsplit("/", 1)[-1] for r in recorder.requests} >= {"events", "runs", "rename"}
    recorder.requests.clear()
    client.sessions.list()
    assert AFFINITY_HEADER not in recorder.requests[0].headers


def test_the_title_reads_as_a_string_and_as_title_value(client: Client) -> None:
    snap = client.sessions.create(title="Plan").snapshot()
    assert snap.title == "Plan" and snap.title is not None and snap.title.value == "Plan"
    assert client.sessions.create().snapshot().title is None


def test_a_typo_in_a_keyword_names_the_sdk_method(client: Client) -> None:
    session = client.sessions.create()
    with pytest.raises(TypeError, match=r"Session\.run\(\) got an unexpected keyword argument 'on_permision_ask'"):
        session.run("hi", on_permision_ask=lambda ask: "deny")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"Sessions\.fork\(\) got an unexpected keyword argument 'worktree'"):
        client.sessions.fork(session.id, worktree="x")
    with pytest.raises(TypeError, match=r"Session\.clear\(\) got an unexpected keyword argument 'timout'"):
        session.clear(timout=3)
    # Controls pass, as keywords or as one RequestControls.
    assert session.snapshot(controls=RequestControls(timeout=5, headers={"X-Trace": "1"})).id == session.id
    assert session.snapshot(timeout=5, deadline=5).id == session.id
