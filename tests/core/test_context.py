"""SessionContext (docs/sessions.md): one test or more per member of the table."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

import sectr
from sectr import LocalRuntime, SessionContext, tool
from sectr.agent import default_handler
from sectr.errors import ApprovalDenied, ApprovalRequired
from sectr.events import EventType
from sectr.providers.demo import DemoProvider

from .conftest import final_text, of_type, types_of


@tool(gated=True, edit=True)
def edit_file(path: str, text: str) -> str:
    """Replace a file's text (an edit: runs unasked in accept_edits mode).

    Args:
        path: the file.
        text: its new text.
    """
    return f"wrote {len(text)} characters to {path}"


@tool(gated=True)
def deploy(target: str) -> str:
    """Deploy somewhere (gated, not an edit, not mutating for plan mode's purposes).

    Args:
        target: where to.
    """
    return f"deployed to {target}"


@tool
def shout(text: str) -> str:
    """Upper-case text.

    Args:
        text: what to shout.
    """
    return text.upper()


def runtime_with(handler: Any, demo: DemoProvider, **kwargs: Any) -> LocalRuntime:
    return LocalRuntime(handler=handler, provider=demo, tools=[edit_file, deploy, shout], **kwargs)


class Recorder:
    """A handler that runs `body(ctx)` and keeps the context for the test to inspect."""

    def __init__(self, body: Any = None) -> None:
        self.body = body
        self.contexts: list[SessionContext] = []
        self.seen: dict[str, Any] = {}

    async def __call__(self, ctx: SessionContext) -> None:
        self.contexts.append(ctx)
        if self.body is not None:
            await self.body(ctx, self.seen)

    @property
    def ctx(self) -> SessionContext:
        return self.contexts[-1]


# ---- identity, transcript, messages, reason ----


async def test_session_id_and_invocation_id_identify_the_session_and_this_invocation(demo: DemoProvider) -> None:
    rec = Recorder()
    rt = runtime_with(rec, demo)
    sid = await rt.create_session()
    first = await rt.send(sid, "one")
    second = await rt.send(sid, "two")
    assert [c.session_id for c in rec.contexts] == [sid, sid]
    assert [c.invocation_id for c in rec.contexts] == [first.invocation_id, second.invocation_id]
    assert first.invocation_id != second.invocation_id
    started = of_type(rt.journal.read(sid), EventType.INVOCATION_STARTED)
    assert [e.invocation_id for e in started] == [first.invocation_id, second.invocation_id]


async def test_transcript_is_the_raw_envelopes_with_this_invocations_start(demo: DemoProvider) -> None:
    async def body(ctx: SessionContext, seen: dict[str, Any]) -> None:
        seen["transcript"] = list(ctx.transcript)

    rec = Recorder(body)
    rt = runtime_with(rec, demo)
    sid = await rt.create_session()
    outcome = await rt.send(sid, "hello")
    transcript = rec.seen["transcript"]
    assert all(isinstance(e, sectr.Envelope) for e in transcript)
    assert [e.seq for e in transcript] == list(range(1, len(transcript) + 1))
    last = transcript[-1]
    assert last.type is EventType.INVOCATION_STARTED
    assert last.invocation_id == outcome.invocation_id
    assert last.payload["reason"]["input"] == {"content": "hello"}


async def test_messages_include_the_current_user_message_and_grow_as_the_invocation_journals(
    demo: DemoProvider,
) -> None:
    async def body(ctx: SessionContext, seen: dict[str, Any]) -> None:
        seen["at_start"] = [dict(m) for m in ctx.messages]
        async with ctx.message() as m:
            await m.text("Hello ")
            seen["mid_message"] = [dict(m) for m in ctx.messages]
            await m.text("there")
            await m.tool_call("call_1", "shout", '{"text": "hi"}')
        seen["after_message"] = [dict(m) for m in ctx.messages]
        await ctx.aexecute("shout", "call_1", text="hi")
        seen["after_tool"] = [dict(m) for m in ctx.messages]

    rec = Recorder(body)
    rt = runtime_with(rec, demo)
    sid = await rt.create_session()
    await rt.send(sid, "earlier")
    await rt.send(sid, "now")
    seen = rec.seen
    assert seen["at_start"][-1] == {"role": "user", "content": "now"}
    # the previous invocation's exchange is there too
    assert [m["role"] for m in seen["at_start"]] == ["user", "assistant", "tool", "user"]
    assert seen["mid_message"][-1] == {"role": "assistant", "content": "Hello "}
    assert seen["after_message"][-1]["content"] == "Hello there"
    assert seen["after_message"][-1]["tool_calls"][0]["function"] == {"name": "shout", "arguments": '{"text": "hi"}'}
    assert seen["after_tool"][-1] == {"role": "tool", "tool_call_id": "call_1", "content": "HI"}
    # and what the handler saw is what the journal folds to
    assert sectr.fold_messages(rt.journal.read(sid))[-1] == seen["after_tool"][-1]


async def test_reason_is_the_reason_dict_of_this_invocation(demo: DemoProvider) -> None:
    rec = Recorder()
    rt = runtime_with(rec, demo)
    sid = await rt.create_session()
    await rt.send(sid, "hi", author="ann")
    assert rec.ctx.reason == {"kind": "user_message", "input": {"content": "hi"}, "author": "ann"}


# ---- input and decision ----


async def test_input_is_the_user_message_input(demo: DemoProvider) -> None:
    rec = Recorder()
    rt = runtime_with(rec, demo)
    sid = await rt.create_session()
    parts = [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]
    await rt.send(sid, parts)
    assert rec.ctx.input == {"content": parts}


async def test_input_raises_type_error_on_an_approval_decision(demo: DemoProvider) -> None:
    async def body(ctx: SessionContext, seen: dict[str, Any]) -> None:
        if ctx.reason["kind"] == "user_message":
            ctx.request_approval("launch", {"n": 1})
        with pytest.raises(TypeError):
            ctx.input  # noqa: B018 - the property access is the test
        seen["decision"] = ctx.decision

    rec = Recorder(body)
    rt = runtime_with(rec, demo)
    sid = await rt.create_session()
    suspended = await rt.send(sid, "go")
    done = await rt.decide(sid, suspended.payload["ask_id"], "allow_once", approver="bob", note="ok")
    assert done.type is EventType.INVOCATION_COMPLETED
    assert rec.seen["decision"] == {"approved": True, "approver": "bob", "verdict": "allow_once", "note": "ok"}


async def test_decision_raises_type_error_on_a_user_message(demo: DemoProvider) -> None:
    async def body(ctx: SessionContext, seen: dict[str, Any]) -> None:
        with pytest.raises(TypeError):
            ctx.decision  # noqa: B018
        seen["ok"] = True

    rec = Recorder(body)
    rt = runtime_with(rec, demo)
    sid = await rt.create_session()
    outcome = await rt.send(sid, "hi")
    assert outcome.type is EventType.INVOCATION_COMPLETED
    assert rec.seen["ok"]


async def test_decision_of_a_denial(demo: DemoProvider) -> None:
    async def body(ctx: SessionContext, seen: dict[str, Any]) -> None:
        if ctx.reason["kind"] == "user_message":
            ctx.request_approval("launch", {"n": 1})
        seen["decision"] = ctx.decision

    rec = Recorder(body)
    rt = runtime_with(rec, demo)
    sid = await rt.create_session()
    suspended = await rt.send(sid, "go")
    await rt.decide(sid, suspended.payload["ask_id"], "deny", approver="bob")
    assert rec.seen["decision"] == {"approved": False, "approver": "bob", "verdict": "deny"}


# ---- pending_tool_call ----


async def test_pending_tool_call_is_none_on_a_user_message(demo: DemoProvider) -> None:
    rec = Recorder()
    rt = runtime_with(rec, demo)
    sid = await rt.create_session()
    await rt.send(sid, "hi")
    assert rec.ctx.pending_tool_call is None


async def test_pending_tool_call_on_approval_resume_is_the_unanswered_call(demo: DemoProvider) -> None:
    seen: dict[str, Any] = {}

    async def handler(ctx: SessionContext) -> None:
        seen.setdefault("pending", []).append(ctx.pending_tool_call)
        await default_handler(ctx)

    rt = runtime_with(handler, demo)
    sid = await rt.create_session()
    suspended = await rt.send(sid, "note: buy milk")
    ask_id = suspended.payload["ask_id"]
    call = of_type(rt.journal.read(sid), EventType.TOOL_CALL)[-1]
    await rt.decide(sid, ask_id, "allow_once")
    assert seen["pending"][0] is None
    assert seen["pending"][1] == {
        "name": "write_note",
        "arguments": {"title": "buy milk", "body": "buy milk"},
        "tool_call_id": call.payload["tool_call_id"],
        "ask_id": ask_id,
    }


async def test_pending_tool_call_is_none_for_a_request_approval_ask(demo: DemoProvider) -> None:
    async def body(ctx: SessionContext, seen: dict[str, Any]) -> None:
        if ctx.reason["kind"] == "user_message":
            ctx.request_approval("launch", {"n": 1})
        seen["pending"] = ctx.pending_tool_call

    rec = Recorder(body)
    rt = runtime_with(rec, demo)
    sid = await rt.create_session()
    suspended = await rt.send(sid, "go")
    await rt.decide(sid, suspended.payload["ask_id"], "allow_once")
    assert rec.seen["pending"] is None


# ---- execute / aexecute ----


async def test_execute_journals_a_tool_result_only_with_a_call_id(demo: DemoProvider) -> None:
    async def body(ctx: SessionContext, seen: dict[str, Any]) -> None:
        seen["quiet"] = await ctx.aexecute("shout", text="quiet")
        async with ctx.message() as m:
            await m.tool_call("call_x", "shout", '{"text": "loud"}')
        seen["loud"] = await ctx.aexecute("shout", "call_x", text="loud")

    rec = Recorder(body)
    rt = runtime_with(rec, demo)
    sid = await rt.create_session()
    await rt.send(sid, "go")
    assert rec.seen["quiet"].content == "QUIET" and not rec.seen["quiet"].is_error
    assert rec.seen["loud"].value == "LOUD"
    results = of_type(rt.journal.read(sid), EventType.TOOL_RESULT)
    assert [r.payload for r in results] == [{"tool_call_id": "call_x", "name": "shout", "content": "LOUD"}]


async def test_execute_of_an_unknown_tool_raises_lookup_error(demo: DemoProvider) -> None:
    async def body(ctx: SessionContext, seen: dict[str, Any]) -> None:
        with pytest.raises(LookupError):
            await ctx.aexecute("no_such_tool", x=1)
        seen["ok"] = True

    rec = Recorder(body)
    rt = runtime_with(rec, demo)
    sid = await rt.create_session()
    assert (await rt.send(sid, "go")).type is EventType.INVOCATION_COMPLETED
    assert rec.seen["ok"]


async def test_execute_turns_a_tool_exception_into_an_error_result(demo: DemoProvider) -> None:
    @tool
    def broken() -> str:
        """Always fails."""
        raise RuntimeError("disk on fire")

    async def handler(ctx: SessionContext) -> None:
        async with ctx.message() as m:
            await m.tool_call("c1", "broken", "{}")
        result = await ctx.aexecute("broken", "c1")
        assert result.is_error and "disk on fire" in result.content

    rt = LocalRuntime(handler=handler, provider=demo, tools=[broken])
    sid = await rt.create_session()
    outcome = await rt.send(sid, "go")
    assert outcome.type is EventType.INVOCATION_COMPLETED
    (result,) = of_type(rt.journal.read(sid), EventType.TOOL_RESULT)
    assert result.payload["is_error"] is True
    assert result.payload["content"] == "Error: RuntimeError: disk on fire"


async def test_a_gated_tool_raises_approval_required_and_the_runtime_suspends(demo: DemoProvider) -> None:
    async def body(ctx: SessionContext, seen: dict[str, Any]) -> None:
        try:
            await ctx.aexecute("deploy", "c9", target="prod")
        except ApprovalRequired as ask:
            seen["ask"] = (ask.name, ask.arguments, ask.tool_call_id)
            raise

    rec = Recorder(body)
    rt = runtime_with(rec, demo)
    sid = await rt.create_session()
    outcome = await rt.send(sid, "go")
    assert rec.seen["ask"] == ("deploy", {"target": "prod"}, "c9")
    tail = rt.journal.read(sid)[-2:]
    assert types_of(tail) == ["APPROVAL_REQUESTED", "INVOCATION_SUSPENDED"]
    requested, suspended = tail
    assert suspended == outcome
    assert requested.payload == {
        "ask_id": outcome.payload["ask_id"],
        "tool_call_id": "c9",
        "name": "deploy",
        "arguments": {"target": "prod"},
    }
    assert requested.invocation_id == outcome.invocation_id
    state = await rt.state(sid)
    assert state.status == "awaiting"
    assert state.pending_ask is not None and state.pending_ask["ask_id"] == outcome.payload["ask_id"]


async def test_the_approved_call_proceeds_on_resume(demo: DemoProvider) -> None:
    async def body(ctx: SessionContext, seen: dict[str, Any]) -> None:
        if ctx.reason["kind"] == "user_message":
            async with ctx.message() as m:
                await m.tool_call("c1", "deploy", '{"target": "prod"}')
        pending = ctx.pending_tool_call
        target = pending["arguments"]["target"] if pending else "prod"
        seen.setdefault("results", []).append(await ctx.aexecute("deploy", "c1", target=target))

    rec = Recorder(body)
    rt = runtime_with(rec, demo)
    sid = await rt.create_session()
    suspended = await rt.send(sid, "go")
    assert suspended.type is EventType.INVOCATION_SUSPENDED
    done = await rt.decide(sid, suspended.payload["ask_id"], "allow_once")
    assert done.type is EventType.INVOCATION_COMPLETED
    assert [r.content for r in rec.seen["results"]] == ["deployed to prod"]
    (result,) = of_type(rt.journal.read(sid), EventType.TOOL_RESULT)
    assert result.payload == {"tool_call_id": "c1", "name": "deploy", "content": "deployed to prod"}


async def test_the_denied_call_raises_approval_denied_a_permission_error(demo: DemoProvider) -> None:
    async def body(ctx: SessionContext, seen: dict[str, Any]) -> None:
        if ctx.reason["kind"] == "user_message":
            async with ctx.message() as m:
                await m.tool_call("c1", "deploy", '{"target": "prod"}')
        try:
            await ctx.aexecute("deploy", "c1", target="prod")
        except PermissionError as exc:
            seen["denied"] = exc

    rec = Recorder(body)
    rt = runtime_with(rec, demo)
    sid = await rt.create_session()
    suspended = await rt.send(sid, "go")
    done = await rt.decide(sid, suspended.payload["ask_id"], "deny", approver="bob", note="not today")
    assert done.type is EventType.INVOCATION_COMPLETED
    denied = rec.seen["denied"]
    assert isinstance(denied, ApprovalDenied) and isinstance(denied, PermissionError)
    assert denied.note == "not today"
    (result,) = of_type(rt.journal.read(sid), EventType.TOOL_RESULT)
    assert result.payload["is_error"] is True
    assert result.payload["content"].startswith("denied")
    assert "not today" in result.payload["content"]


async def test_a_gated_execute_without_call_id_is_approved_on_resume(demo: DemoProvider) -> None:
    """An ask raised by `execute` without a call id is matched on resume by name and arguments."""
    results: list[str] = []

    async def handler(ctx: SessionContext) -> None:
        results.append((await ctx.aexecute("deploy", target="staging")).content)

    rt = runtime_with(handler, demo)
    sid = await rt.create_session()
    suspended = await rt.send(sid, "go")
    assert suspended.type is EventType.INVOCATION_SUSPENDED
    done = await rt.decide(sid, suspended.payload["ask_id"], "allow_once")
    assert done.type is EventType.INVOCATION_COMPLETED, done.payload
    assert results == ["deployed to staging"]
    # the same call with other arguments is a different action: it asks again
    seen: list[Any] = []

    async def other(ctx: SessionContext) -> None:
        if ctx.reason["kind"] == "approval_decision":
            try:
                await ctx.aexecute("deploy", target="prod")
            except ApprovalRequired as exc:
                seen.append(exc.arguments)
                raise
        else:
            await ctx.aexecute("deploy", target="staging")

    rt2 = runtime_with(other, demo)
    sid2 = await rt2.create_session()
    suspended = await rt2.send(sid2, "go")
    again = await rt2.decide(sid2, suspended.payload["ask_id"], "allow_once")
    assert again.type is EventType.INVOCATION_SUSPENDED
    assert seen == [{"target": "prod"}]


async def test_allow_always_skips_the_ask_now_and_in_later_invocations(demo: DemoProvider) -> None:
    async def handler(ctx: SessionContext) -> None:
        if ctx.reason["kind"] == "user_message":
            async with ctx.message() as m:
                await m.tool_call(f"c_{ctx.invocation_id}", "deploy", '{"target": "a"}')
            await ctx.aexecute("deploy", f"c_{ctx.invocation_id}", target="a")
        else:
            pending = ctx.pending_tool_call
            assert pending is not None
            await ctx.aexecute("deploy", pending["tool_call_id"], **pending["arguments"])
            # a second call of the same tool in the same invocation does not ask
            await ctx.aexecute("deploy", target="b")

    rt = runtime_with(handler, demo)
    sid = await rt.create_session()
    suspended = await rt.send(sid, "first")
    done = await rt.decide(sid, suspended.payload["ask_id"], "allow_always", approver="bob")
    assert done.type is EventType.INVOCATION_COMPLETED, done.payload
    assert (await rt.state(sid)).grants == ["deploy"]
    later = await rt.send(sid, "second")
    assert later.type is EventType.INVOCATION_COMPLETED
    assert len(of_type(rt.journal.read(sid), EventType.APPROVAL_REQUESTED)) == 1


async def test_allow_once_grants_nothing(demo: DemoProvider) -> None:
    async def handler(ctx: SessionContext) -> None:
        if ctx.reason["kind"] == "user_message":
            await ctx.aexecute("deploy", target="a")
        else:
            await ctx.aexecute("deploy", target="a")

    rt = runtime_with(handler, demo)
    sid = await rt.create_session()
    suspended = await rt.send(sid, "first")
    await rt.decide(sid, suspended.payload["ask_id"], "allow_once")
    assert (await rt.state(sid)).grants == []
    assert (await rt.send(sid, "second")).type is EventType.INVOCATION_SUSPENDED


async def test_accept_edits_runs_edit_tools_unasked_but_still_asks_for_other_gated_tools(demo: DemoProvider) -> None:
    rt = LocalRuntime(provider=demo, tools=[edit_file, deploy])
    sid = await rt.create_session(mode="accept_edits")
    edited = await rt.send(sid, '!tool edit_file {"path": "a.txt", "text": "hello"}')
    assert edited.type is EventType.INVOCATION_COMPLETED
    assert final_text(rt, sid) == "edit_file returned: wrote 5 characters to a.txt"
    asked = await rt.send(sid, '!tool deploy {"target": "prod"}')
    assert asked.type is EventType.INVOCATION_SUSPENDED
    noted = await rt.decide(sid, asked.payload["ask_id"], "deny")
    assert noted.type is EventType.INVOCATION_COMPLETED
    assert (await rt.send(sid, "note: hello")).type is EventType.INVOCATION_SUSPENDED


async def test_default_mode_asks_for_edit_tools(demo: DemoProvider) -> None:
    rt = LocalRuntime(provider=demo, tools=[edit_file])
    sid = await rt.create_session()
    outcome = await rt.send(sid, '!tool edit_file {"path": "a.txt", "text": "hello"}')
    assert outcome.type is EventType.INVOCATION_SUSPENDED


async def test_plan_mode_refuses_mutating_tools_with_an_error_result_and_runs_read_only_ones(
    rt: LocalRuntime,
) -> None:
    sid = await rt.create_session(mode="plan")
    outcome = await rt.send(sid, '!tool write_note {"title": "t", "body": "b"}')
    assert outcome.type is EventType.INVOCATION_COMPLETED
    journal = rt.journal.read(sid)
    assert of_type(journal, EventType.APPROVAL_REQUESTED) == []
    (result,) = of_type(journal, EventType.TOOL_RESULT)
    assert result.payload["is_error"] is True
    assert "plan mode" in result.payload["content"]
    assert (await rt.state(sid)).notes == {}
    assert final_text(rt, sid).startswith("write_note returned: refused")
    await rt.send(sid, "calculate 6*7")
    assert final_text(rt, sid) == "calculator returned: 42"


# ---- request_approval ----


async def test_request_approval_always_raises_and_suspends_without_a_tool_call(demo: DemoProvider) -> None:
    raised: list[ApprovalRequired] = []

    async def handler(ctx: SessionContext) -> None:
        for _ in range(2):  # raises every time, also on an approval-resume turn
            try:
                ctx.request_approval("send_email", {"to": "x@example.com"})
            except ApprovalRequired as exc:
                raised.append(exc)
        ctx.request_approval("send_email", {"to": "x@example.com"})

    rt = runtime_with(handler, demo)
    sid = await rt.create_session()
    outcome = await rt.send(sid, "go")
    assert len(raised) == 2 and raised[0].tool_call_id is None
    requested = of_type(rt.journal.read(sid), EventType.APPROVAL_REQUESTED)[-1]
    assert requested.payload["tool_call_id"] is None
    assert requested.payload["name"] == "send_email"
    assert requested.payload["arguments"] == {"to": "x@example.com"}
    again = await rt.decide(sid, outcome.payload["ask_id"], "allow_once")
    assert again.type is EventType.INVOCATION_SUSPENDED
    assert len(raised) == 4


# ---- handler shapes ----


async def test_a_plain_def_handler_runs_in_a_thread_and_can_execute(demo: DemoProvider) -> None:
    seen: dict[str, Any] = {}
    loop_thread = threading.get_ident()

    def handler(ctx: SessionContext) -> None:
        seen["thread"] = threading.get_ident()
        seen["content"] = ctx.input["content"]
        seen["result"] = ctx.execute("shout", text=ctx.input["content"])
        seen["gated"] = None
        try:
            ctx.execute("deploy", target="x")
        except ApprovalRequired as exc:
            seen["gated"] = exc.name
        ctx.execute("deploy", "c1", target="prod")  # lets ApprovalRequired escape: suspends

    rt = runtime_with(handler, demo)
    sid = await rt.create_session()
    outcome = await rt.send(sid, "hey")
    assert seen["thread"] != loop_thread
    assert seen["content"] == "hey"
    assert seen["result"].content == "HEY"
    assert seen["gated"] == "deploy"
    assert outcome.type is EventType.INVOCATION_SUSPENDED


# ---- the sync execute inside an async handler (on the event loop) ----


@tool
async def async_shout(text: str) -> str:
    """Upper-case text, asynchronously.

    Args:
        text: what to shout.
    """
    return text.upper()


class SlowAppendJournal(sectr.MemoryJournal):
    """A journal whose appends take a while (a database round trip), to see who waits."""

    delay = 0.0

    async def append(self, session_id: str, events: Any, *, fence: Any = None) -> list[sectr.Envelope]:
        if self.delay:
            await asyncio.sleep(self.delay)
        return await super().append(session_id, events, fence=fence)


async def _tool_call_message(ctx: SessionContext, call_id: str, name: str, arguments: str) -> None:
    async with ctx.message() as m:
        await m.tool_call(call_id, name, arguments)


async def test_the_sync_execute_in_an_async_handler_runs_a_sync_tool_and_journals_its_result(
    demo: DemoProvider,
) -> None:
    seen: dict[str, Any] = {}

    async def handler(ctx: SessionContext) -> None:
        await _tool_call_message(ctx, "c1", "shout", '{"text": "hi"}')
        seen["result"] = ctx.execute("shout", "c1", text="hi")
        seen["no_id"] = ctx.execute("shout", text="quiet")
        async with ctx.message() as m:
            await m.text("done")

    rt = runtime_with(handler, demo)
    sid = await rt.create_session()
    outcome = await rt.send(sid, "go")
    assert outcome.type is EventType.INVOCATION_COMPLETED
    assert seen["result"].content == "HI" and not seen["result"].is_error
    assert seen["no_id"].content == "QUIET"
    journal = rt.journal.read(sid)
    results = of_type(journal, EventType.TOOL_RESULT)
    assert [r.payload for r in results] == [{"tool_call_id": "c1", "name": "shout", "content": "HI"}]
    # The queued result is written in emission order: before the message that followed it.
    kinds = types_of(journal)
    assert kinds.index(EventType.TOOL_RESULT) < len(kinds) - 1 - kinds[::-1].index(EventType.MESSAGE_START)
    assert [m["role"] for m in sectr.fold_messages(journal)] == ["user", "assistant", "tool", "assistant"]


async def test_the_sync_execute_on_the_loop_does_not_wait_for_the_journal(demo: DemoProvider) -> None:
    journal = SlowAppendJournal()
    seen: dict[str, float] = {}

    async def handler(ctx: SessionContext) -> None:
        await _tool_call_message(ctx, "c1", "shout", '{"text": "hi"}')
        journal.delay = 0.3
        started = asyncio.get_running_loop().time()
        ctx.execute("shout", "c1", text="hi")
        seen["execute"] = asyncio.get_running_loop().time() - started
        seen["results_right_after"] = len(of_type(ctx.transcript, EventType.TOOL_RESULT))
        await ctx.writer.flush()
        seen["results_after_flush"] = len(of_type(ctx.transcript, EventType.TOOL_RESULT))
        journal.delay = 0.0

    rt = LocalRuntime(handler=handler, provider=demo, tools=[shout], journal=journal)
    sid = await rt.create_session()
    await rt.send(sid, "go")
    assert seen["execute"] < 0.1  # the 0.3 s append happened later, on the loop
    assert seen["results_right_after"] == 0
    assert seen["results_after_flush"] == 1


async def test_the_sync_execute_in_an_async_handler_raises_lookup_error_for_an_unknown_tool(
    demo: DemoProvider,
) -> None:
    errors: list[BaseException] = []

    async def handler(ctx: SessionContext) -> None:
        try:
            ctx.execute("no_such_tool", x=1)
        except LookupError as exc:
            errors.append(exc)

    rt = runtime_with(handler, demo)
    sid = await rt.create_session()
    assert (await rt.send(sid, "go")).type is EventType.INVOCATION_COMPLETED
    assert len(errors) == 1 and "no_such_tool" in str(errors[0])


async def test_the_sync_execute_in_an_async_handler_asks_then_runs_the_approved_call(demo: DemoProvider) -> None:
    seen: list[Any] = []

    async def handler(ctx: SessionContext) -> None:
        if ctx.reason["kind"] == "user_message":
            await _tool_call_message(ctx, "c1", "deploy", '{"target": "prod"}')
            try:
                ctx.execute("deploy", "c1", target="prod")
            except ApprovalRequired as exc:
                seen.append(exc)
                raise
        else:
            seen.append(ctx.execute("deploy", "c1", target="prod"))

    rt = runtime_with(handler, demo)
    sid = await rt.create_session()
    outcome = await rt.send(sid, "go")
    assert outcome.type is EventType.INVOCATION_SUSPENDED
    assert isinstance(seen[0], ApprovalRequired) and seen[0].tool_call_id == "c1"
    (ask,) = of_type(rt.journal.read(sid), EventType.APPROVAL_REQUESTED)
    assert ask.payload["tool_call_id"] == "c1" and ask.payload["arguments"] == {"target": "prod"}
    outcome = await rt.decide(sid, outcome.payload["ask_id"], "allow_once", approver="bob")
    assert outcome.type is EventType.INVOCATION_COMPLETED
    assert seen[1].content == "deployed to prod"
    (result,) = of_type(rt.journal.read(sid), EventType.TOOL_RESULT)
    assert result.payload == {"tool_call_id": "c1", "name": "deploy", "content": "deployed to prod"}


async def test_the_sync_execute_in_an_async_handler_raises_approval_denied_on_a_denied_resume(
    demo: DemoProvider,
) -> None:
    seen: list[BaseException] = []

    async def handler(ctx: SessionContext) -> None:
        if ctx.reason["kind"] == "user_message":
            await _tool_call_message(ctx, "c1", "deploy", '{"target": "prod"}')
            ctx.execute("deploy", "c1", target="prod")
        else:
            try:
                ctx.execute("deploy", "c1", target="prod")
            except ApprovalDenied as exc:
                seen.append(exc)

    rt = runtime_with(handler, demo)
    sid = await rt.create_session()
    outcome = await rt.send(sid, "go")
    outcome = await rt.decide(sid, outcome.payload["ask_id"], "deny", approver="bob", note="not today")
    assert outcome.type is EventType.INVOCATION_COMPLETED
    assert len(seen) == 1 and isinstance(seen[0], PermissionError) and "not today" in str(seen[0])
    (result,) = of_type(rt.journal.read(sid), EventType.TOOL_RESULT)
    assert result.payload["is_error"] is True
    assert result.payload["content"] == "denied: bob denied this call (not today)"


async def test_the_sync_execute_of_an_async_tool_on_the_loop_is_a_type_error_naming_aexecute(
    demo: DemoProvider,
) -> None:
    errors: list[BaseException] = []
    awaited: list[str] = []

    async def handler(ctx: SessionContext) -> None:
        try:
            ctx.execute("async_shout", text="x")
        except TypeError as exc:
            errors.append(exc)
        awaited.append((await ctx.aexecute("async_shout", text="x")).content)

    rt = LocalRuntime(handler=handler, provider=demo, tools=[async_shout])
    sid = await rt.create_session()
    assert (await rt.send(sid, "go")).type is EventType.INVOCATION_COMPLETED
    assert len(errors) == 1 and "await ctx.aexecute('async_shout'" in str(errors[0])
    assert awaited == ["X"]


async def test_request_approval_in_an_async_handler_raises_approval_required(demo: DemoProvider) -> None:
    seen: list[ApprovalRequired] = []

    async def handler(ctx: SessionContext) -> None:
        try:
            ctx.request_approval("deploy everything", {"region": "eu"})
        except ApprovalRequired as exc:
            seen.append(exc)
            raise

    rt = runtime_with(handler, demo)
    sid = await rt.create_session()
    outcome = await rt.send(sid, "go")
    assert outcome.type is EventType.INVOCATION_SUSPENDED
    assert seen[0].name == "deploy everything" and seen[0].tool_call_id is None
    (ask,) = of_type(rt.journal.read(sid), EventType.APPROVAL_REQUESTED)
    assert ask.payload["arguments"] == {"region": "eu"} and ask.payload["tool_call_id"] is None


async def test_a_call_answered_by_the_sync_execute_is_not_run_again_by_the_default_agent(
    demo: DemoProvider,
) -> None:
    runs: list[str] = []

    @tool(name="count_runs")
    def count_runs() -> str:
        """Count how often it runs."""
        runs.append("ran")
        return f"run {len(runs)}"

    async def handler(ctx: SessionContext) -> None:
        await _tool_call_message(ctx, "c1", "count_runs", "{}")
        ctx.execute("count_runs", "c1")
        await default_handler(ctx)  # its open-call pass must see the queued result

    rt = LocalRuntime(handler=handler, provider=demo, tools=[count_runs])
    sid = await rt.create_session()
    assert (await rt.send(sid, "go")).type is EventType.INVOCATION_COMPLETED
    assert runs == ["ran"]
    assert final_text(rt, sid) == "count_runs returned: run 1"


async def test_a_custom_handler_can_do_its_own_work_then_hand_over_to_the_default_agent(
    demo: DemoProvider,
) -> None:
    async def handler(ctx: SessionContext) -> None:
        preflight = await ctx.aexecute("shout", text="preflight")  # no call id: not in the journal
        async with ctx.message() as m:
            await m.text(f"{preflight.content}: on it.")
        await default_handler(ctx)

    rt = runtime_with(handler, demo)
    sid = await rt.create_session()
    outcome = await rt.send(sid, "calculate 2+3")
    assert outcome.type is EventType.INVOCATION_COMPLETED
    roles_and_text = [(m["role"], m.get("content")) for m in sectr.fold_messages(rt.journal.read(sid))]
    assert roles_and_text[:2] == [("user", "calculate 2+3"), ("assistant", "PREFLIGHT: on it.")]
    assert final_text(rt, sid) == "calculator returned: 5"
    assert outcome.payload["stop_reason"] == "end_turn"


async def test_a_sync_handler_that_is_cancelled_cannot_write_after_the_end(demo: DemoProvider) -> None:
    release = threading.Event()
    after: list[BaseException | str] = []

    def handler(ctx: SessionContext) -> None:
        release.wait(5)
        try:

            async def write() -> None:
                async with ctx.message() as m:
                    await m.text("too late")

            ctx.call(write())
            after.append("wrote")
        except BaseException as exc:  # noqa: BLE001 - recorded for the assertion
            after.append(exc)

    rt = runtime_with(handler, demo)
    sid = await rt.create_session()
    task = asyncio.create_task(rt.send(sid, "go"))
    await asyncio.sleep(0.05)
    await rt.cancel(sid)
    outcome = await task
    assert outcome.type is EventType.INVOCATION_CANCELLED
    release.set()
    for _ in range(200):
        if after:
            break
        await asyncio.sleep(0.01)
    assert after and after[0] != "wrote"
    assert rt.journal.read(sid)[-1] == outcome


async def test_editing_ctx_messages_changes_nothing_else(demo: DemoProvider) -> None:
    seen: dict[str, Any] = {}

    async def handler(ctx: SessionContext) -> None:
        messages = ctx.messages
        messages[-1]["content"] = "tampered"
        messages.insert(0, {"role": "system", "content": "be brief"})
        seen["again"] = ctx.messages
        await default_handler(ctx)

    rt = runtime_with(handler, demo)
    sid = await rt.create_session()
    await rt.send(sid, "hello")
    assert seen["again"] == [{"role": "user", "content": "hello"}]
    assert final_text(rt, sid) == "You said: hello"
