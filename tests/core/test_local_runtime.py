"""LocalRuntime's session operations (docs/sessions.md): construction, fork, clear,
rename, mode, titles, manual and automatic compaction, and a handler written only
against docs/sessions.md."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import sectr
from sectr import LocalRuntime, SessionContext, tool
from sectr.compaction import KEEP_RECENT, SUMMARY_PREFIX, estimate_tokens, split_point
from sectr.errors import ApprovalRequired, NotAtTurnBoundary, ProviderError, SessionBusy, ValidationFailed
from sectr.events import EventType
from sectr.fold import fold_messages
from sectr.providers import DemoProvider, OpenAIProvider
from sectr.providers.base import CompletionRequest, ToolCallDelta
from sectr.state import TITLE_MAX

from .conftest import (
    ScriptedProvider,
    assert_one_terminal_per_invocation,
    assert_tool_calls_answered_in_order,
    call,
    final_text,
    messages_of,
    of_type,
    say,
    text_so_far,
    types_of,
    usage,
    wait_for,
)


@tool
def ping() -> str:
    """Answer pong."""
    return "pong"


# ---- construction (docs/sessions.md) ----


def test_defaults_are_the_default_handler_the_builtin_tools_and_the_environments_provider() -> None:
    rt = LocalRuntime()
    assert rt.runtime.handler is sectr.agent.default_handler
    assert isinstance(rt.runtime.provider, DemoProvider)
    assert rt.runtime.tools.names() == ["get_time", "calculator", "write_note", "delete_note"]


def test_tools_are_added_to_the_builtin_ones() -> None:
    rt = LocalRuntime(tools=[ping])
    assert rt.runtime.tools.names() == ["get_time", "calculator", "write_note", "delete_note", "ping"]


def test_the_environment_can_configure_the_openai_provider(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SECTR_PROVIDER", "openai")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("SECTR_MODEL", "llama3.1:8b")
    rt = LocalRuntime()
    assert isinstance(rt.runtime.provider, OpenAIProvider)


async def test_the_session_model_defaults_to_the_environments(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SECTR_PROVIDER", "openai")
    monkeypatch.setenv("SECTR_MODEL", "llama3.1:8b")
    rt = LocalRuntime(provider=DemoProvider(delay=0))
    sid = await rt.create_session()
    assert (await rt.state(sid)).model == "llama3.1:8b"


async def test_create_session_validates_its_settings(rt: LocalRuntime) -> None:
    with pytest.raises(ValidationFailed):
        await rt.create_session(mode="yolo")
    with pytest.raises(ValidationFailed):
        await rt.create_session(title="")
    with pytest.raises(ValidationFailed):
        await rt.create_session(limits={"max_turns": -1})
    with pytest.raises(ValidationFailed):
        await rt.create_session(reasoning_effort="extreme")
    sid = await rt.create_session(
        mode="plan", title="  My   session ", limits={"max_turns": 7}, reasoning_effort="high"
    )
    state = await rt.state(sid)
    assert (state.mode, state.title, state.limits["max_turns"], state.reasoning_effort) == (
        "plan",
        "My session",
        7,
        "high",
    )


async def test_the_quickstart_of_spec_section_5_runs(demo: DemoProvider) -> None:
    rt = sectr.LocalRuntime(handler=None, tools=[ping], provider=demo)
    sid = await rt.create_session(mode="default")
    outcome = await rt.send(sid, "hello")
    assert outcome.type is EventType.INVOCATION_COMPLETED
    outcome = await rt.send(sid, "note: remember this")
    assert outcome.type is EventType.INVOCATION_SUSPENDED
    outcome = await rt.decide(sid, outcome.payload["ask_id"], "allow_once", approver="bob")
    assert outcome.type is EventType.INVOCATION_COMPLETED
    envelopes = rt.journal.read(sid)
    assert [e.seq for e in envelopes] == list(range(1, len(envelopes) + 1))
    assert envelopes[-1] == outcome
    assert_one_terminal_per_invocation(envelopes)


# ---- a handler written against docs/sessions.md only ----


async def test_a_handler_written_against_the_spec_runs_unchanged(demo: DemoProvider) -> None:
    log: list[Any] = []

    async def handler(ctx):  # type: ignore[no-untyped-def]  # exactly as a reader of docs/sessions.md writes it
        if ctx.reason["kind"] == "user_message":
            text = ctx.input["content"]
            assert ctx.messages[-1] == {"role": "user", "content": text}
            log.append(("sum", (await ctx.aexecute("calculator", expression="2+2")).content))
            if text.startswith("ship"):
                ctx.request_approval("ship", {"what": text.split()[1]})
            await ctx.aexecute("write_note", title="log", body=text)  # gated: asks
        else:
            decision = ctx.decision
            log.append(("decision", decision["approved"], decision.get("approver")))
            if not decision["approved"]:
                return
            last_user = [m for m in ctx.messages if m["role"] == "user"][-1]["content"]
            if last_user.startswith("ship"):
                log.append(("shipped", last_user.split()[1]))
            else:
                result = await ctx.aexecute("write_note", title="log", body=last_user)
                log.append(("note", result.content))

    rt = LocalRuntime(handler=handler, provider=demo)
    sid = await rt.create_session()
    first = await rt.send(sid, "ship v2")
    assert first.type is EventType.INVOCATION_SUSPENDED
    assert of_type(rt.journal.read(sid), EventType.APPROVAL_REQUESTED)[-1].payload["name"] == "ship"
    await rt.decide(sid, first.payload["ask_id"], "allow_once", approver="bob")
    second = await rt.send(sid, "remember milk")
    assert second.type is EventType.INVOCATION_SUSPENDED
    done = await rt.decide(sid, second.payload["ask_id"], "allow_once", approver="ann")
    assert done.type is EventType.INVOCATION_COMPLETED
    assert log == [
        ("sum", "4"),
        ("decision", True, "bob"),
        ("shipped", "v2"),
        ("sum", "4"),
        ("decision", True, "ann"),
        ("note", "saved note 'log' (created)"),
    ]


async def test_a_sync_handler_written_against_the_spec_runs_unchanged(demo: DemoProvider) -> None:
    seen: list[Any] = []

    def handler(ctx):  # type: ignore[no-untyped-def]
        if ctx.reason["kind"] == "approval_decision":
            seen.append(ctx.decision["approved"])
            seen.append(ctx.execute("write_note", title="t", body="b").content)
            return
        seen.append(ctx.execute("calculator", expression=ctx.input["content"]).content)
        try:
            ctx.execute("write_note", title="t", body="b")
        except ApprovalRequired:
            seen.append("asked")
            raise

    rt = LocalRuntime(handler=handler, provider=demo)
    sid = await rt.create_session()
    outcome = await rt.send(sid, "6*7")
    outcome = await rt.decide(sid, outcome.payload["ask_id"], "allow_once")
    assert outcome.type is EventType.INVOCATION_COMPLETED
    assert seen == ["42", "asked", True, "saved note 't' (created)"]


# ---- fork ----


async def test_fork_now_copies_the_folded_history_with_usage_at_zero(rt: LocalRuntime) -> None:
    sid = await rt.create_session(mode="plan", title="Origin", limits={"max_turns": 9}, reasoning_effort="low")
    await rt.send(sid, "hello")
    await rt.send(sid, "calculate 2+3")
    source = await rt.state(sid)
    fork = await rt.fork(sid)
    journal = rt.journal.read(fork)
    assert types_of(journal) == ["SESSION_CREATED", "TRANSCRIPT_COMPACTED"]
    created, compacted = journal
    assert created.payload["forked_from"] == {"session_id": sid, "seq": source.last_seq}
    assert compacted.payload["messages"] == messages_of(rt, sid)
    state = await rt.state(fork)
    assert (state.mode, state.model, state.limits, state.reasoning_effort) == (
        "plan",
        source.model,
        source.limits,
        "low",
    )
    assert state.title == "Fork of Origin"
    assert state.usage == {} and state.total_usage["input_tokens"] == 0
    assert state.turns == 0 and state.tool_calls == 0
    assert state.forked_from == {"session_id": sid, "seq": source.last_seq}
    # the fork goes its own way; the source does not change
    before = len(rt.journal.read(sid))
    await rt.send(fork, "calculate 10*10")
    assert final_text(rt, fork) == "calculator returned: 100"
    assert len(rt.journal.read(sid)) == before
    assert messages_of(rt, fork)[: len(compacted.payload["messages"])] == compacted.payload["messages"]


async def test_fork_overrides_title_model_and_reasoning_effort(rt: LocalRuntime, sid: str) -> None:
    await rt.send(sid, "hello")
    fork = await rt.fork(sid, title="Experiment", model="demo-2", reasoning_effort="high")
    state = await rt.state(fork)
    assert (state.title, state.model, state.reasoning_effort) == ("Experiment", "demo-2", "high")
    with pytest.raises(ValidationFailed):
        await rt.fork(sid, title="")
    with pytest.raises(ValidationFailed):
        await rt.fork(sid, reasoning_effort="max")


async def test_fork_drops_trailing_unanswered_tool_calls(rt: LocalRuntime, sid: str) -> None:
    await rt.send(sid, "hello")
    await rt.send(sid, "note: secret plan")  # awaiting: an unanswered write_note call
    fork = await rt.fork(sid)
    (compacted,) = of_type(rt.journal.read(fork), EventType.TRANSCRIPT_COMPACTED)
    messages = compacted.payload["messages"]
    assert messages == messages_of(rt, sid)[:-1]  # the assistant message with only the call is gone
    assert messages[-1] == {"role": "user", "content": "note: secret plan"}
    state = await rt.state(fork)
    assert state.pending_ask is None and state.status == "idle"
    assert (await rt.send(fork, "hello again")).type is EventType.INVOCATION_COMPLETED


async def test_fork_keeps_the_answered_calls_of_a_partly_answered_message() -> None:
    def script(request: CompletionRequest, n: int) -> list[Any]:
        if n == 1:
            return [ToolCallDelta("p1", "ping", "{}"), *call("write_note", '{"title": "a", "body": "b"}', call_id="w1")]
        return say("done")

    rt = LocalRuntime(provider=ScriptedProvider(script), tools=[ping])
    sid = await rt.create_session()
    assert (await rt.send(sid, "go")).type is EventType.INVOCATION_SUSPENDED
    fork = await rt.fork(sid)
    (compacted,) = of_type(rt.journal.read(fork), EventType.TRANSCRIPT_COMPACTED)
    messages = compacted.payload["messages"]
    assert [c["id"] for c in messages[1]["tool_calls"]] == ["p1"]
    assert messages[2] == {"role": "tool", "tool_call_id": "p1", "content": "pong"}
    assert_tool_calls_answered_in_order(messages)


async def test_fork_at_an_earlier_seq_is_time_travel(rt: LocalRuntime, sid: str) -> None:
    first = await rt.send(sid, "first")
    await rt.send(sid, "second")
    fork = await rt.fork(sid, at_seq=first.seq)
    created, compacted = rt.journal.read(fork)
    assert created.payload["forked_from"] == {"session_id": sid, "seq": first.seq}
    assert compacted.payload["messages"] == [
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "You said: first"},
    ]
    # at a seq in the middle of a tool call, the unanswered call is dropped
    await rt.send(sid, "calculate 1+1")
    tool_call = of_type(rt.journal.read(sid), EventType.TOOL_CALL)[-1]
    fork2 = await rt.fork(sid, at_seq=tool_call.seq)
    messages = rt.journal.read(fork2)[1].payload["messages"]
    assert messages[-1] == {"role": "user", "content": "calculate 1+1"}


async def test_fork_at_an_impossible_seq_is_invalid(rt: LocalRuntime, sid: str) -> None:
    await rt.send(sid, "hi")
    last = (await rt.state(sid)).last_seq
    for bad in (0, -3, last + 1):
        with pytest.raises(ValidationFailed):
            await rt.fork(sid, at_seq=bad)


async def test_fork_now_is_refused_mid_run_but_an_earlier_seq_is_not(rt: LocalRuntime, sid: str) -> None:
    first = await rt.send(sid, "hi")
    task = asyncio.create_task(rt.send(sid, "!slow 6"))
    await wait_for(lambda: "tick 1" in text_so_far(rt.journal, sid))
    with pytest.raises(NotAtTurnBoundary):
        await rt.fork(sid)
    fork = await rt.fork(sid, at_seq=first.seq)
    assert len(rt.journal.read(fork)[1].payload["messages"]) == 2
    await task


async def test_a_forked_session_can_be_forked_and_compacted_again(rt: LocalRuntime, sid: str) -> None:
    for _ in range(3):
        await rt.send(sid, "!long 30")
    fork = await rt.fork(sid)
    await rt.send(fork, "!long 30")
    fork_of_fork = await rt.fork(fork)
    assert rt.journal.read(fork_of_fork)[1].payload["messages"] == messages_of(rt, fork)
    assert await rt.compact(fork_of_fork) is True


# ---- clear ----


async def test_clear_is_a_new_empty_session_inheriting_mode_model_and_limits(rt: LocalRuntime) -> None:
    sid = await rt.create_session(mode="accept_edits", model="demo", title="Old", limits={"max_tool_calls": 3})
    await rt.send(sid, "hello")
    cleared = await rt.clear(sid)
    assert cleared != sid
    journal = rt.journal.read(cleared)
    assert types_of(journal) == ["SESSION_CREATED"]
    state = await rt.state(cleared)
    assert (state.mode, state.model, state.limits["max_tool_calls"]) == ("accept_edits", "demo", 3)
    assert state.title is None and state.usage == {} and messages_of(rt, cleared) == []
    await rt.send(cleared, "fresh start")
    assert (await rt.state(cleared)).title == "fresh start"


# ---- rename, mode, title ----


async def test_rename_takes_1_to_120_characters(rt: LocalRuntime, sid: str) -> None:
    for bad in ("", "   ", "x" * (TITLE_MAX + 1)):
        with pytest.raises(ValidationFailed) as info:
            await rt.rename(sid, bad)
        assert info.value.status == 400
    assert (await rt.rename(sid, "x" * TITLE_MAX)).title == "x" * TITLE_MAX
    assert (await rt.rename(sid, "a")).title == "a"
    assert (await rt.rename(sid, "  spaced \n out  ")).title == "spaced out"


async def test_the_first_prompt_sets_the_title_clamped(rt: LocalRuntime, sid: str) -> None:
    long_prompt = "word " * 60
    await rt.send(sid, long_prompt)
    state = await rt.state(sid)
    assert state.title == " ".join(long_prompt.split())[:TITLE_MAX]
    assert len(state.title) == TITLE_MAX
    await rt.send(sid, "a second prompt")
    assert (await rt.state(sid)).title == state.title


async def test_a_rename_is_never_overwritten_by_a_prompt(rt: LocalRuntime, sid: str) -> None:
    await rt.rename(sid, "Chosen")
    await rt.send(sid, "first prompt")
    assert (await rt.state(sid)).title == "Chosen"
    other = await rt.create_session()
    await rt.send(other, "first prompt")
    await rt.rename(other, "Renamed")
    await rt.send(other, "later prompt")
    assert (await rt.state(other)).title == "Renamed"


async def test_a_title_given_at_creation_is_kept(rt: LocalRuntime) -> None:
    sid = await rt.create_session(title="Given")
    await rt.send(sid, "first prompt")
    assert (await rt.state(sid)).title == "Given"


async def test_the_title_of_a_parts_prompt_is_its_text(rt: LocalRuntime, sid: str) -> None:
    parts = [
        {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}},
        {"type": "text", "text": "what is this?"},
    ]
    await rt.send(sid, parts)
    assert (await rt.state(sid)).title == "what is this?"


async def test_set_mode_is_refused_mid_run(rt: LocalRuntime, sid: str) -> None:
    task = asyncio.create_task(rt.send(sid, "!slow 5"))
    await wait_for(lambda: "tick 1" in text_so_far(rt.journal, sid))
    with pytest.raises(SessionBusy):
        await rt.set_mode(sid, "plan")
    await task
    with pytest.raises(ValidationFailed):
        await rt.set_mode(sid, "chaos")
    assert (await rt.set_mode(sid, "plan")).mode == "plan"
    assert (await rt.state(sid)).mode == "plan"


# ---- manual compaction ----


async def _long_history(rt: LocalRuntime, sid: str, times: int = 4) -> None:
    for _ in range(times):
        await rt.send(sid, "!long 50")


async def test_compact_shortens_the_history_with_a_summary_and_the_recent_messages(rt: LocalRuntime, sid: str) -> None:
    await _long_history(rt, sid)
    before = messages_of(rt, sid)
    assert await rt.compact(sid) is True
    compacted = rt.journal.read(sid)[-1]
    assert compacted.type is EventType.TRANSCRIPT_COMPACTED and compacted.invocation_id is None
    after = messages_of(rt, sid)
    assert len(after) < len(before)
    assert estimate_tokens(after) < estimate_tokens(before)
    assert after[0]["role"] == "system" and after[0]["content"].startswith(SUMMARY_PREFIX)
    assert compacted.payload["summary"].startswith("Summary: ")
    assert after[1:] == before[-KEEP_RECENT:]
    assert compacted.payload["through_seq"] == compacted.seq - 1
    # a second compaction right away has nothing to shorten
    assert await rt.compact(sid) is False
    assert of_type(rt.journal.read(sid), EventType.TRANSCRIPT_COMPACTED) == [compacted]


async def test_compact_on_a_short_history_is_a_no_op(rt: LocalRuntime, sid: str) -> None:
    assert await rt.compact(sid) is False
    await rt.send(sid, "hello")
    assert await rt.compact(sid) is False
    assert of_type(rt.journal.read(sid), EventType.TRANSCRIPT_COMPACTED) == []


async def test_compaction_never_separates_a_tool_call_from_its_result(rt: LocalRuntime, sid: str) -> None:
    # user, assistant | user, assistant(call), tool, assistant | user, assistant: keeping the
    # last four verbatim would start at the tool message; the split moves to its call.
    await rt.send(sid, "!long 50")
    await rt.send(sid, "calculate 1+1")
    await rt.send(sid, "!long 5")
    before = messages_of(rt, sid)
    assert before[len(before) - KEEP_RECENT]["role"] == "tool"
    assert await rt.compact(sid) is True
    after = messages_of(rt, sid)
    assert after[1]["role"] == "assistant" and after[1]["tool_calls"]
    assert after[2]["role"] == "tool"
    assert_tool_calls_answered_in_order(after)


def test_split_point_moves_back_over_tool_messages() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "u"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "a"}, {"id": "b"}]},
        {"role": "tool", "tool_call_id": "a", "content": "1"},
        {"role": "tool", "tool_call_id": "b", "content": "2"},
        {"role": "assistant", "content": "done"},
    ]
    assert split_point(messages, keep_recent=2) == 1
    assert split_point(messages, keep_recent=3) == 1
    assert split_point(messages, keep_recent=1) == 4
    assert split_point(messages, keep_recent=10) == 0


async def test_compact_is_refused_mid_run(rt: LocalRuntime, sid: str) -> None:
    await _long_history(rt, sid, 3)
    task = asyncio.create_task(rt.send(sid, "!slow 5"))
    await wait_for(lambda: "tick 1" in text_so_far(rt.journal, sid))
    with pytest.raises(NotAtTurnBoundary) as info:
        await rt.compact(sid)
    assert info.value.status == 412
    await task
    assert await rt.compact(sid) is True


async def test_the_next_invocation_starts_from_the_newest_compaction(rt: LocalRuntime, demo: DemoProvider) -> None:
    contexts: list[SessionContext] = []

    async def handler(ctx: SessionContext) -> None:
        contexts.append(ctx)
        await sectr.agent.default_handler(ctx)

    rt = LocalRuntime(handler=handler, provider=demo)
    sid = await rt.create_session()
    await _long_history(rt, sid)
    await rt.compact(sid)
    compacted = rt.journal.read(sid)[-1]
    await rt.send(sid, "after")
    transcript = contexts[-1].transcript
    assert transcript[0] == compacted
    assert contexts[-1].messages[0]["role"] == "system"
    assert final_text(rt, sid) == "You said: after"


async def test_compaction_while_awaiting_keeps_the_open_call_answerable(rt: LocalRuntime, sid: str) -> None:
    await _long_history(rt, sid)
    suspended = await rt.send(sid, "note: keep me")
    assert await rt.compact(sid) is True
    done = await rt.decide(sid, suspended.payload["ask_id"], "allow_once")
    assert done.type is EventType.INVOCATION_COMPLETED
    assert (await rt.state(sid)).notes == {"keep me": "keep me"}
    assert final_text(rt, sid).startswith("write_note returned: saved note")
    assert_tool_calls_answered_in_order(messages_of(rt, sid))


# ---- automatic compaction ----


async def test_a_prompt_past_80_percent_of_the_context_window_compacts_first(
    monkeypatch: pytest.MonkeyPatch, demo: DemoProvider
) -> None:
    monkeypatch.setenv("SECTR_MODEL_CONTEXT_WINDOW", "400")
    rt = LocalRuntime(provider=demo)
    sid = await rt.create_session()
    sent = 0
    while not of_type(rt.journal.read(sid), EventType.TRANSCRIPT_COMPACTED):
        assert estimate_tokens(messages_of(rt, sid)) <= 0.8 * 400 + 200, "should have compacted by now"
        outcome = await rt.send(sid, "!long 60")
        assert outcome.type is EventType.INVOCATION_COMPLETED
        sent += 1
    assert sent > 1
    journal = rt.journal.read(sid)
    (compacted,) = of_type(journal, EventType.TRANSCRIPT_COMPACTED)
    # inside the run, before its model step, after its own start
    invocation = [e for e in journal if e.invocation_id == compacted.invocation_id]
    assert types_of(invocation)[:3] == ["INVOCATION_STARTED", "TRANSCRIPT_COMPACTED", "MESSAGE_START"]
    kept = compacted.payload["messages"]
    assert kept[0]["content"].startswith(SUMMARY_PREFIX)
    assert kept[-1] == {"role": "user", "content": "!long 60"}  # this run's prompt survives
    assert estimate_tokens(kept) <= 0.8 * 400
    assert_one_terminal_per_invocation(journal)


async def test_automatic_compaction_uses_the_providers_context_window() -> None:
    def script(request: CompletionRequest, n: int) -> list[Any]:
        last = request.messages[-1]["content"]
        if last.startswith("Summarize"):
            return say("short summary")
        return say("word " * 40, tokens=usage(1, 40))

    provider = ScriptedProvider(script, context_window=150)
    rt = LocalRuntime(provider=provider)
    sid = await rt.create_session()
    for _ in range(4):
        await rt.send(sid, "talk")
    compactions = of_type(rt.journal.read(sid), EventType.TRANSCRIPT_COMPACTED)
    assert compactions, "a 150-token window must compact a 160-word history"
    assert compactions[0].payload["summary"] == "short summary"
    # every request the model saw after a compaction starts with the summary
    model_requests = [r for r in provider.requests if not r.messages[-1]["content"].startswith("Summarize")]
    assert model_requests[-1].messages[0]["content"] == SUMMARY_PREFIX + "short summary"
    assert fold_messages(rt.journal.read(sid))[0]["role"] == "system"


async def test_a_failing_summary_request_skips_automatic_compaction_without_failing_the_run() -> None:
    def script(request: CompletionRequest, n: int) -> list[Any]:
        if request.messages[-1]["content"].startswith("Summarize"):
            return [ProviderError("summaries are down", retryable=False)]
        return say("word " * 40, tokens=usage(1, 40))

    rt = LocalRuntime(provider=ScriptedProvider(script, context_window=150))
    sid = await rt.create_session()
    for _ in range(4):
        outcome = await rt.send(sid, "talk")
        assert outcome.type is EventType.INVOCATION_COMPLETED
    assert of_type(rt.journal.read(sid), EventType.TRANSCRIPT_COMPACTED) == []
