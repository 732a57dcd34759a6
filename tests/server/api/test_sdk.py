"""sectr.client against a real server: every call of docs/sdk.md, sync and async."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sectr.client import (
    AskAlreadyResolvedError,
    AsyncClient,
    AuthenticationError,
    Cancellation,
    Client,
    InvalidRequestError,
    InvalidStateError,
    NotFoundError,
    PermissionAsk,
    PromptValidationError,
    RequestCancelled,
    RunEvent,
    SectrError,
    SessionBusyError,
    SessionMode,
    TransportError,
    audio_part_from_path,
    image_part_from_path,
    text_part,
)
from tests.server.api.test_api_support import LiveApi, live_api

pytestmark = pytest.mark.slow

NOTE = '!tool write_note {"title": "plan", "body": "ship it"}'
PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 64
WAV = b"RIFF\x24\x00\x00\x00WAVEfmt " + b"\x00" * 64


@pytest.fixture(scope="module")
def api() -> Iterator[LiveApi]:
    with live_api(env={"SECTR_DEMO_SLOW_MS": "40"}) as live:
        yield live


@pytest.fixture
def client(api: LiveApi) -> Iterator[Client]:
    with Client(api.base_url, token=api.tokens["alice"]) as client:
        yield client


def kinds(events: list[RunEvent]) -> list[str]:
    return [event.kind for event in events]


def delta_text(events: list[RunEvent]) -> str:
    return "".join(event.text or "" for event in events if event.kind == "message.delta")


# ---- sessions ----


def test_create_get_list_and_snapshot(client: Client) -> None:
    session = client.sessions.create(title="SDK", mode=SessionMode.PLAN, limits={"max_turns": 9})
    snap = session.snapshot()
    assert (snap.id, snap.state, snap.mode, snap.title, snap.owner) == (session.id, "idle", "plan", "SDK", "alice")
    assert snap.resolved_model.model_id == "demo" and snap.resolved_model.context_window > 0
    assert snap.limits["max_turns"] == 9 and snap.turns == 0 and snap.tool_calls == 0
    assert snap.token_usage["total"]["input_tokens"] == 0 and snap.media == {"image": True, "audio": True}
    assert snap.pending_ask is None and snap.placement is None and snap.created_at and snap.updated_at
    assert client.sessions.get(session.id).last_snapshot == snap
    assert session.id in [s.id for s in client.sessions.list(limit=100)]
    with pytest.raises(NotFoundError) as caught:
        client.sessions.get("ses_missing")
    assert caught.value.status == 404 and caught.value.code == "not_found"


def test_a_run_is_iterated_and_its_result_computed(client: Client) -> None:
    session = client.sessions.create()
    events = list(session.run("hello SDK"))
    assert kinds(events) == [
        "session.title",
        "turn.start",
        *["message.delta"] * (len(events) - 4),
        "turn.end",
        "result",
    ]
    assert delta_text(events) == "You said: hello SDK"
    assert events[-1].payload["stop"] == "end_turn" and events[-1].text == "You said: hello SDK"
    assert [e.seq for e in events] == sorted({e.seq for e in events if e.seq is not None})
    result = session.run("again").result()
    assert (result.text, result.stop_reason, result.error) == ("You said: again", "end_turn", None)
    assert result.usage["output_tokens"] == 3 and result.usage["input_tokens"] > 3
    snap = session.snapshot()
    assert snap.title == "hello SDK" and snap.state == "completed" and snap.turns == 2
    transcript = session.transcript()
    assert transcript.complete
    assert [(m.role, m.text) for m in transcript.messages] == [
        ("user", "hello SDK"),
        ("assistant", "You said: hello SDK"),
        ("user", "again"),
        ("assistant", "You said: again"),
    ]
    info = client.runs.get(result.run_id)
    assert info.status == "completed" and info.result is not None and info.result.text == "You said: again"
    replayed = client.runs.attach(result.run_id).result()
    assert replayed.text == result.text and replayed.usage == result.usage


def test_a_run_is_consumed_once(client: Client) -> None:
    session = client.sessions.create()
    run = session.run("once")
    list(run)
    with pytest.raises(InvalidStateError):
        run.result()
    with pytest.raises(InvalidStateError):
        list(run)
    other = session.run("twice")
    first = other.result()
    assert other.result() is first
    with pytest.raises(InvalidStateError):
        iter(other)


def test_a_second_run_on_a_busy_session_raises(client: Client, api: LiveApi) -> None:
    session = client.sessions.create()
    run = session.run("!slow 20")
    with pytest.raises(SessionBusyError):
        session.run("not now")  # this handle knows its run is still going
    with Client(api.base_url, token=api.tokens["alice"]) as other:
        with pytest.raises(SessionBusyError) as caught:
            other.session(session.id).run("not now either")  # the server says 409
        assert caught.value.status == 409 and caught.value.code == "session_busy"
        queued = other.session(session.id).run("later", queue=True)
        assert run.result().stop_reason == "end_turn"
        assert queued.result().text == "You said: later"


def test_images_and_audio_are_sent_as_parts(client: Client, tmp_path: Path) -> None:
    (tmp_path / "cat.png").write_bytes(PNG)
    (tmp_path / "hello.wav").write_bytes(WAV)
    session = client.sessions.create()
    parts = [
        text_part("what is this"),
        image_part_from_path(tmp_path / "cat.png"),
        audio_part_from_path(tmp_path / "hello.wav"),
    ]
    events = list(session.run(parts))
    reasoning = "".join(e.text or "" for e in events if e.kind == "reasoning.delta")
    assert "1 image and 1 audio clip" in reasoning
    assert events[-1].text == "You said: what is this"
    (user, _assistant) = session.transcript().messages
    assert user.text == "what is this" and user.parts is not None
    assert user.parts[1]["image_url"]["url"].startswith("sectr-media://")
    assert user.parts[2]["input_audio"]["url"].startswith("sectr-media://")
    with pytest.raises(PromptValidationError) as caught:
        session.run([text_part("x"), {"type": "image_url", "image_url": {"url": "http://example.com/a.png"}}])
    assert caught.value.code == "url" and caught.value.status == 400
    plain = client.sessions.create(model="llama3.1")
    with pytest.raises(PromptValidationError) as caught:
        plain.run([text_part("x"), image_part_from_path(tmp_path / "cat.png")])
    assert caught.value.code == "capability"


# ---- run controls ----


def test_cancel_ends_the_run_with_a_cancelled_result(client: Client) -> None:
    session = client.sessions.create()
    run = session.run("!slow 40")
    events = []
    for event in run:
        events.append(event)
        if event.kind == "message.delta" and event.text == "tick 2 ":
            run.cancel()
    assert events[-1].kind == "result" and events[-1].payload["stop"] == "cancelled"
    assert "tick 40" not in delta_text(events)
    assert session.snapshot().state == "cancelled"
    with pytest.raises(InvalidStateError) as caught:
        run.steer("too late")
    assert caught.value.code == "stale_run_control"
    assert session.run("reopened").result().stop_reason == "end_turn"


def test_steer_is_answered_by_the_same_run(client: Client) -> None:
    session = client.sessions.create()
    run = session.run("!slow 8")
    events = []
    for event in run:
        events.append(event)
        if event.kind == "message.delta" and event.text == "tick 2 ":
            run.steer("also say hi")
    assert "steer" in kinds(events)
    assert [e.text for e in events if e.kind == "steer"] == ["also say hi"]
    assert events[-1].text == "Steer received: also say hi"


def test_a_responder_answers_the_ask_and_the_run_follows_the_resumed_run(client: Client) -> None:
    session = client.sessions.create()
    asks: list[PermissionAsk] = []

    def allow(ask: PermissionAsk) -> str:
        asks.append(ask)
        return "allow_always"

    run = session.run(NOTE, on_permission_ask=allow)
    events = list(run)
    assert kinds(events).count("result") == 1 and events[-1].kind == "result"
    assert ["permission.ask", "approval"] == [k for k in kinds(events) if k in ("permission.ask", "approval")]
    assert asks[0].name == "write_note" and asks[0].arguments == {"title": "plan", "body": "ship it"}
    assert len(run.run_ids) == 2 and run.id == run.run_ids[1]
    assert events[-1].text == "write_note returned: saved note 'plan' (created)"
    assert session.snapshot().raw["notes"] == {"plan": "ship it"}
    # allow_always: the grant holds for the session, so the next call does not ask.
    again = session.run('!tool write_note {"title": "plan", "body": "v2"}').result()
    assert again.stop_reason == "end_turn" and again.ask is None


def test_resolve_ask_while_iterating_follows_the_resumed_run(client: Client) -> None:
    session = client.sessions.create()
    run = session.run(NOTE)
    seen = []
    for event in run:
        seen.append(event.kind)
        if event.kind == "permission.ask":
            run.resolve_ask(event.payload["ask_id"], "deny", note="no notes today")
    assert seen[-1] == "result" and "approval" in seen
    with pytest.raises(InvalidStateError):
        run.result()  # iteration consumed it
    assert session.transcript().messages[-1].text == "write_note was denied"


def test_an_unanswered_ask_ends_the_run_awaiting_approval(client: Client) -> None:
    session = client.sessions.create()
    result = session.run(NOTE).result()
    assert result.stop_reason == "awaiting_approval" and result.awaiting_approval
    assert result.ask is not None and result.ask.name == "write_note"
    assert session.snapshot().pending_ask["ask_id"] == result.ask.ask_id  # type: ignore[index]
    with pytest.raises(SessionBusyError) as caught:
        session.run("anything")
    assert caught.value.code == "awaiting_approval"
    resumed = client.asks.resolve(result.ask.ask_id, "allow_once")
    assert resumed.result().text == "write_note returned: saved note 'plan' (created)"
    with pytest.raises(AskAlreadyResolvedError):
        client.asks.resolve(result.ask.ask_id, "deny")


TWO_NOTES = '!tools write_note {"title": "p", "body": "1"} ; write_note {"title": "q", "body": "2"}'


def test_approve_all_answers_every_gated_call_of_the_turn(client: Client) -> None:
    session = client.sessions.create()
    result = session.run(TWO_NOTES).result()
    assert result.ask is not None and result.stop_reason == "awaiting_approval"
    with pytest.raises(InvalidRequestError) as caught:
        client.asks.decide(result.ask.ask_id, "deny", scope="turn")
    assert caught.value.code == "invalid_scope"
    decision = client.asks.decide(result.ask.ask_id, "allow_once", scope="turn")
    assert decision.run is not None
    assert decision.run.result().text.count("write_note returned:") == 2  # no second ask


async def test_approve_all_from_the_async_client(api: LiveApi) -> None:
    async with AsyncClient(api.base_url, token=api.tokens["alice"]) as client:
        session = await client.sessions.create()
        awaiting = await (await session.run(TWO_NOTES)).result()
        assert awaiting.ask is not None
        decision = await client.asks.decide(awaiting.ask.ask_id, "allow_once", scope="turn")
        assert decision.run is not None
        assert (await decision.run.result()).text.count("write_note returned:") == 2


def test_retry_is_refused_unless_the_session_failed(client: Client) -> None:
    session = client.sessions.create()
    with pytest.raises(InvalidStateError) as caught:
        session.retry()
    assert caught.value.code == "failed_step_retry_ineligible" and caught.value.status == 409


# ---- session operations ----


def test_fork_clear_compact_rename_mode_model_close_and_delete(client: Client) -> None:
    session = client.sessions.create(title="source")
    assert session.compact() is False  # nothing to compact yet
    for word in ("one", "two", "three"):
        session.run(f"say {word}").result()
    middle = session.transcript()
    fork = session.fork(title="forked", reasoning_effort="high")
    snap = fork.snapshot()
    assert (snap.title, snap.resolved_model.reasoning_effort, snap.raw["forked_from"]["session_id"]) == (
        "forked",
        "high",
        session.id,
    )
    assert snap.token_usage["total"]["input_tokens"] == 0, "usage starts at zero"
    assert [m.text for m in fork.transcript().messages] == [m.text for m in middle.messages]
    early_seq = session.snapshot().last_seq - 8
    travelled = client.sessions.fork(session.id, at_seq=early_seq, model="gpt-4o")
    assert len(travelled.transcript().messages) < len(middle.messages)
    assert travelled.snapshot().resolved_model.model_id == "gpt-4o"
    assert session.compact() is True
    assert session.snapshot().last_seq > middle.last_seq
    # The transcript is what the model sees now: the summary first, then the kept messages;
    # the full history stays available as its own view.
    seen, history = session.transcript(), session.transcript(view="history")
    assert seen.view == "model" and seen.complete and seen.messages[0].role == "system"
    assert seen.messages[0].text and seen.messages[0].text.startswith("Summary")
    assert len(seen.messages) < len(history.messages)
    assert history.view == "history" and history.complete
    assert [m.text for m in history.messages] == [m.text for m in middle.messages]
    assert session.rename("renamed").title == "renamed"
    assert session.set_mode(SessionMode.ACCEPT_EDITS).mode == "accept_edits"
    assert session.set_model("gpt-4o-mini").resolved_model.model_id == "gpt-4o-mini"
    cleared = session.clear()
    cleared_snap = cleared.snapshot()
    assert cleared.id != session.id and cleared_snap.mode == "accept_edits" and cleared_snap.turns == 0
    assert session.close().raw["closed"] is True
    assert session.run("still works after close").result().stop_reason == "end_turn"
    session.delete()
    with pytest.raises(NotFoundError):
        session.snapshot()
    with pytest.raises(InvalidRequestError) as caught:
        cleared.rename("")
    assert caught.value.code == "invalid_title"


# ---- errors and request controls ----


def test_errors_are_typed(api: LiveApi) -> None:
    with Client(api.base_url, token="sectr_not-a-token") as bad, pytest.raises(AuthenticationError) as caught:
        bad.sessions.create()
    assert caught.value.status == 401
    with Client(api.base_url, token=api.tokens["bob"]) as bob, Client(api.base_url, token=api.tokens["alice"]) as alice:
        secret = alice.sessions.create(title="alice only")
        with pytest.raises(NotFoundError):
            bob.sessions.get(secret.id)
        with pytest.raises(AuthenticationError):  # per-call headers override the client's
            alice.sessions.get(secret.id, headers={"Authorization": "Bearer sectr_wrong"})
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed_port = sock.getsockname()[1]
    with Client(f"http://127.0.0.1:{closed_port}", token="x") as nowhere, pytest.raises(TransportError):
        nowhere.sessions.list()
    assert issubclass(TransportError, SectrError) and issubclass(SessionBusyError, SectrError)


def test_a_request_times_out(api: LiveApi) -> None:
    with socket.socket() as silent:  # accepts connections (backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        with Client(f"http://127.0.0.1:{silent.getsockname()[1]}", token="x") as client:
            with pytest.raises(TransportError) as caught:
                client.sessions.list(timeout=0.3)
            assert "Timeout" in str(caught.value)


def test_a_cancellation_stops_waiting_but_not_the_run(client: Client) -> None:
    session = client.sessions.create()
    cancel = Cancellation()
    run = session.run("!slow 40", cancel=cancel)
    timer = threading.Timer(0.3, cancel.cancel)
    timer.start()
    seen = []
    with pytest.raises(RequestCancelled):
        for event in run:
            seen.append(event)
    assert seen and seen[-1].kind != "result"
    assert run.status().status == "running", "cancelling the call does not cancel the run"
    run.cancel(cancel=None)  # the run control still works (a new call, no cancellation)
    assert client.runs.attach(run.id).result().stop_reason == "cancelled"


# ---- the async client ----


async def test_the_async_client_does_the_same(api: LiveApi, tmp_path: Path) -> None:
    (tmp_path / "cat.png").write_bytes(PNG)
    async with AsyncClient(api.base_url, token=api.tokens["alice"]) as client:
        session = await client.sessions.create(title="async", mode="default")
        assert (await session.snapshot()).title == "async"
        events = [event async for event in await session.run("hello async")]
        assert events[-1].kind == "result" and events[-1].text == "You said: hello async"

        async def allow(ask: PermissionAsk) -> str:
            await asyncio.sleep(0)
            return "allow_once"

        run = await session.run(NOTE, on_permission_ask=allow)
        result = await run.result()
        assert result.text == "write_note returned: saved note 'plan' (created)" and len(result.run_ids) == 2
        assert await run.result() is result
        with pytest.raises(InvalidStateError):
            run.__aiter__()
        slow = await session.run("!slow 20")
        with pytest.raises(SessionBusyError):
            await session.run("busy")
        async for event in slow:
            if event.kind == "message.delta":
                await slow.steer("async steer")
                break
        assert (await client.runs.attach(slow.id).result()).text == "Steer received: async steer"
        image = await session.run([text_part("pic"), image_part_from_path(tmp_path / "cat.png")])
        assert (await image.result()).text == "You said: pic"
        transcript = await session.transcript()
        assert transcript.complete and transcript.messages[-2].parts is not None
        fork = await session.fork(title="async fork")
        assert (await fork.set_mode(SessionMode.PLAN)).mode == "plan"
        assert (await fork.rename("renamed")).title == "renamed"
        assert await session.compact() is True
        seen, history = await session.transcript(), await session.transcript(view="history")
        assert seen.view == "model" and seen.messages[0].role == "system"
        assert history.view == "history" and history.complete and len(history.messages) > len(seen.messages)
        assert [m.text for m in history.messages] == [m.text for m in transcript.messages]
        cleared = await session.clear()
        assert (await cleared.snapshot()).turns == 0
        await fork.close()
        await fork.delete()
        with pytest.raises(NotFoundError):
            await client.sessions.get(fork.id)
        assert fork.id not in [s.id for s in await client.sessions.list()]
        pending = await session.run(NOTE)
        awaiting = await pending.result()
        assert awaiting.stop_reason == "awaiting_approval"
        resumed = await client.asks.resolve(awaiting.ask.ask_id if awaiting.ask else "", "deny")
        assert (await resumed.result()).text == "write_note was denied"
        with pytest.raises(AskAlreadyResolvedError):
            await client.asks.resolve(awaiting.ask.ask_id if awaiting.ask else "", "deny")
        with pytest.raises(InvalidStateError):
            await session.retry()


async def test_an_async_cancellation_raises_request_cancelled(api: LiveApi) -> None:
    async with AsyncClient(api.base_url, token=api.tokens["alice"]) as client:
        session = await client.sessions.create()
        cancel = Cancellation()
        run = await session.run("!slow 40", cancel=cancel)
        threading.Timer(0.3, cancel.cancel).start()
        with pytest.raises(RequestCancelled):
            async for _event in run:
                pass
        await run.cancel(cancel=None)
        info: Any = await client.runs.get(run.id)
        assert info.status in ("running", "cancelled")


# ---- moderation: asks and team rules (docs/moderation.md) ----


def test_a_moderator_lists_and_decides_asks_and_edits_rules(api: LiveApi, client: Client) -> None:
    with (
        Client(api.base_url, token=api.tokens["mod"]) as moderator,
        Client(api.base_url, token=api.tokens["bob"]) as outsider,
    ):
        rule = moderator.teams.create_rule("crew", "delete_note", "deny", arguments={"title": "keep-*"})
        assert (rule.tool, rule.action, rule.arguments, rule.position) == (
            "delete_note",
            "deny",
            {"title": "keep-*"},
            0,
        )
        moved = moderator.teams.update_rule("crew", rule.id, "delete_*", "deny")
        assert moved.tool == "delete_*" and [r.id for r in client.teams.rules("crew")] == [rule.id]
        with pytest.raises(SectrError) as refused:
            client.teams.create_rule("crew", "*", "allow")  # alice is a member, not a moderator
        assert refused.value.status == 403
        with pytest.raises(NotFoundError):
            outsider.teams.rules("crew")
        moderator.teams.delete_rule("crew", rule.id)
        assert moderator.teams.rules("crew") == []

        session = client.sessions.create(title="shared")
        assert session.snapshot().team == "crew"  # alice's only team
        assert client.sessions.create(title="mine", team="").snapshot().team is None
        result = session.run(NOTE).result()
        assert result.awaiting_approval
        pending = moderator.asks.list(state="pending", team="crew", tool="write_note")
        ask = next(a for a in pending if a.session_id == session.id)
        assert (ask.status, ask.owner, ask.arguments["title"]) == ("pending", "alice", "plan")
        assert outsider.asks.list().count == 0
        decision = moderator.asks.decide(ask.ask_id, "deny", note="not now")
        assert decision.run is not None and decision.ask is not None and decision.ask.decided_by == "mod"
        assert decision.run.result().text == "write_note was denied"
        with pytest.raises(AskAlreadyResolvedError) as late:
            client.asks.decide(ask.ask_id, "allow_once")
        assert (late.value.decided_by, late.value.verdict) == ("mod", "deny")
        assert ask.ask_id in [a.ask_id for a in moderator.asks.list(state="decided")]


async def test_the_async_client_lists_asks_and_rules(api: LiveApi) -> None:
    async with AsyncClient(api.base_url, token=api.tokens["mod"]) as moderator:
        rule = await moderator.teams.create_rule("crew", "calculator", "allow")
        assert [r.id for r in await moderator.teams.rules("crew")] == [rule.id]
        page = await moderator.asks.list(state="decided", limit=5)
        assert page.count >= 0 and len(page) <= 5
        await moderator.teams.delete_rule("crew", rule.id)
        assert await moderator.teams.rules("crew") == []
