"""The offline demo model (docs/journal.md): exact replies, chunking and token counts."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from typing import Any

import pytest

from sectr.providers import (
    CompletionRequest,
    DemoProvider,
    Finish,
    Provider,
    ReasoningDelta,
    StreamEvent,
    TextDelta,
    ToolCallDelta,
)
from sectr.providers.demo import LOREM, plan_reply


def user(content: str | list[dict[str, Any]]) -> dict[str, Any]:
    return {"role": "user", "content": content}


def assistant(
    content: str | None, *, tool_calls: Sequence[tuple[str, str]] = (), reasoning: str | None = None
) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": "{}"}}
            for call_id, name in tool_calls
        ]
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    return message


def tool(call_id: str, content: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


async def collect(
    messages: list[dict[str, Any]],
    *,
    metadata: dict[str, Any] | None = None,
    max_output_tokens: int | None = None,
    provider: DemoProvider | None = None,
) -> list[StreamEvent]:
    provider = provider or DemoProvider(delay=0, slow_delay=0)
    request = CompletionRequest(
        model="demo", messages=messages, metadata=metadata or {}, max_output_tokens=max_output_tokens
    )
    return [event async for event in provider.stream(request)]


def texts(events: list[StreamEvent]) -> list[str]:
    return [event.text for event in events if isinstance(event, TextDelta)]


def reasoning(events: list[StreamEvent]) -> str:
    return "".join(event.text for event in events if isinstance(event, ReasoningDelta))


def calls(events: list[StreamEvent]) -> list[ToolCallDelta]:
    return [event for event in events if isinstance(event, ToolCallDelta)]


def finish(events: list[StreamEvent]) -> Finish:
    assert isinstance(events[-1], Finish)
    assert sum(isinstance(event, Finish) for event in events) == 1
    return events[-1]


# ---- plain replies, chunking, usage ----


async def test_it_echoes_plain_text_one_word_per_chunk() -> None:
    events = await collect([user("hello world")])
    assert texts(events) == ["You ", "said: ", "hello ", "world"]
    assert finish(events) == Finish("stop", {"input_tokens": 2, "output_tokens": 4})


async def test_it_counts_input_words_of_every_message_and_text_parts_only() -> None:
    messages = [
        {"role": "system", "content": "Be nice now"},
        user("hi there"),
        assistant("You said: hi there"),
        user(
            [
                {"type": "text", "text": "look at"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                {"type": "text", "text": "this"},
            ]
        ),
    ]
    events = await collect(messages)
    assert "".join(texts(events)) == "You said: look at this"
    # media is acknowledged in reasoning, so tests can see it reached the model
    assert reasoning(events) == "I received 1 image."
    assert finish(events).usage == {"input_tokens": 3 + 2 + 4 + 3, "output_tokens": 5 + 4, "reasoning_tokens": 4}


async def test_it_acknowledges_audio_and_several_images() -> None:
    parts: list[dict[str, Any]] = [
        {"type": "text", "text": "what is this"},
        {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
        {"type": "image_url", "image_url": {"url": "https://example.com/b.png"}},
        {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
    ]
    events = await collect([user(parts)])
    assert reasoning(events) == "I received 2 images and 1 audio clip."
    assert "".join(texts(events)) == "You said: what is this"


async def test_it_keeps_the_text_exact_across_chunks() -> None:
    events = await collect([user("  spaced   out\ttext  ")])
    assert "".join(texts(events)) == "You said: spaced   out\ttext"
    assert all(len(chunk.split()) == 1 for chunk in texts(events))


# ---- !tool and the plain-word tools ----


async def test_tool_command_reasons_then_calls_the_tool_with_the_json_as_given() -> None:
    events = await collect([user('!tool lookup {"q": "x y"}')])
    kinds = [type(event).__name__ for event in events]
    assert kinds[-2:] == ["ToolCallDelta", "Finish"]
    assert set(kinds[:-2]) == {"ReasoningDelta"}
    assert reasoning(events) == "The user asked me to call lookup."
    [call] = calls(events)
    assert call.name == "lookup"
    assert call.arguments == '{"q": "x y"}'
    # input: 5 words; output: 7 reasoning words + 3 argument words
    assert finish(events) == Finish("tool_calls", {"input_tokens": 5, "output_tokens": 10, "reasoning_tokens": 7})


async def test_tool_command_without_json_sends_empty_object() -> None:
    [call] = calls(await collect([user("!tool get_time")]))
    assert (call.name, call.arguments) == ("get_time", "{}")


async def test_tool_call_ids_are_deterministic_and_depend_on_the_context() -> None:
    messages = [user("hi"), assistant("You said: hi"), user("!tool ping {}")]
    first = calls(await collect(messages))[0].id
    again = calls(await collect(messages))[0].id
    other = calls(await collect([user("!tool ping {}")]))[0].id
    assert first == again
    assert first.startswith("call_3_0_")
    assert other.startswith("call_1_0_")
    assert first != other


@pytest.mark.parametrize("text", ["what time is it?", "Time please", "time"])
async def test_the_word_time_calls_get_time(text: str) -> None:
    events = await collect([user(text)])
    assert reasoning(events) == "The user asked me to call get_time."
    assert [(call.name, call.arguments) for call in calls(events)] == [("get_time", "{}")]
    assert finish(events).finish_reason == "tool_calls"


async def test_time_inside_another_word_is_plain_text() -> None:
    events = await collect([user("a timeout happened sometimes")])
    assert "".join(texts(events)) == "You said: a timeout happened sometimes"
    assert calls(events) == []


async def test_calculate_calls_the_calculator_with_the_expression() -> None:
    [call] = calls(await collect([user("please calculate 2 + 3 * 4?")]))
    assert call.name == "calculator"
    assert json.loads(call.arguments) == {"expression": "2 + 3 * 4"}
    assert call.arguments == '{"expression": "2 + 3 * 4"}'


async def test_note_calls_write_note_with_a_five_word_title() -> None:
    [call] = calls(await collect([user("note: buy milk and eggs tomorrow morning")]))
    assert call.name == "write_note"
    assert json.loads(call.arguments) == {
        "title": "buy milk and eggs tomorrow",
        "body": "buy milk and eggs tomorrow morning",
    }


async def test_the_more_specific_pattern_wins() -> None:
    [note] = calls(await collect([user("note: calculate the time")]))
    [calc] = calls(await collect([user("calculate time * 2")]))
    assert note.name == "write_note"
    assert calc.name == "calculator"


# ---- tool results ----


async def test_it_reports_a_tool_result_by_the_calls_name() -> None:
    messages = [user("!tool lookup {}"), assistant(None, tool_calls=[("c1", "lookup")]), tool("c1", "42 apples")]
    events = await collect(messages)
    assert "".join(texts(events)) == "lookup returned: 42 apples"
    assert finish(events) == Finish("stop", {"input_tokens": 3 + 2, "output_tokens": 4})


async def test_it_reports_a_denial() -> None:
    messages = [
        user("note: x"),
        assistant(None, tool_calls=[("c1", "write_note")]),
        tool("c1", "denied: by bob (not today)"),
    ]
    assert "".join(texts(await collect(messages))) == "write_note was denied"


async def test_it_answers_several_tool_results_one_line_each_in_order() -> None:
    messages = [
        user("go"),
        assistant(None, tool_calls=[("a", "get_time"), ("b", "calculator")]),
        tool("a", "12:00"),
        tool("b", "denied: no"),
    ]
    events = await collect(messages)
    assert "".join(texts(events)) == "get_time returned: 12:00\ncalculator was denied"
    assert texts(events)[2] == "12:00\n"


async def test_only_the_results_after_the_latest_assistant_message_count() -> None:
    messages = [
        user("go"),
        assistant(None, tool_calls=[("a", "get_time")]),
        tool("a", "12:00"),
        assistant("get_time returned: 12:00"),
        user("again"),
        assistant(None, tool_calls=[("b", "calculator")]),
        tool("b", "4"),
    ]
    assert "".join(texts(await collect(messages))) == "calculator returned: 4"


# ---- steer ----


async def test_a_steer_gets_steer_received() -> None:
    messages = [user("!slow 5"), assistant("tick 1 tick 2 "), user("go left instead")]
    events = await collect(messages, metadata={"steer": "go left instead"})
    assert "".join(texts(events)) == "Steer received: go left instead"
    assert finish(events).finish_reason == "stop"


async def test_a_steer_flag_uses_the_last_user_message() -> None:
    events = await collect([user("first"), assistant("ok"), user("turn around")], metadata={"steer": True})
    assert "".join(texts(events)) == "Steer received: turn around"


async def test_a_steer_that_looks_like_a_command_is_not_run() -> None:
    events = await collect([user("hi"), user("!tool delete_note {}")], metadata={"steer": "!tool delete_note {}"})
    assert calls(events) == []
    assert "".join(texts(events)) == "Steer received: !tool delete_note {}"


# ---- !slow and !long ----


async def test_slow_streams_ticks() -> None:
    events = await collect([user("!slow 3")])
    assert texts(events) == ["tick 1 ", "tick 2 ", "tick 3 "]
    assert finish(events) == Finish("stop", {"input_tokens": 2, "output_tokens": 6})


async def test_slow_ticks_are_paced_by_slow_delay() -> None:
    provider = DemoProvider(delay=0, slow_delay=0.05)
    started = time.monotonic()
    events = await collect([user("!slow 4")], provider=provider)
    assert len(texts(events)) == 4
    assert time.monotonic() - started >= 0.15  # three gaps between four ticks


async def test_long_streams_n_words_one_per_chunk() -> None:
    events = await collect([user("!long 40")])
    chunks = texts(events)
    assert len(chunks) == 40
    words = "".join(chunks).split()
    assert words[:3] == ["lorem", "ipsum", "dolor"]
    assert words[len(LOREM)] == "lorem"  # the list cycles
    assert finish(events) == Finish("stop", {"input_tokens": 2, "output_tokens": 40})


async def test_long_followed_by_more_words_still_writes_n_words() -> None:
    events = await collect([user("!long 12 words to fill the context\nplease")])
    words = "".join(texts(events)).split()
    assert len(words) == 12
    assert words[0] == "lorem" and "said:" not in words
    assert finish(events) == Finish("stop", {"input_tokens": 8, "output_tokens": 12})


async def test_long_glued_to_more_digits_or_letters_is_not_a_command() -> None:
    events = await collect([user("!long 3x")])
    assert "".join(texts(events)) == "You said: !long 3x"


async def test_long_is_not_slowed_by_the_chunk_delay() -> None:
    provider = DemoProvider(delay=1.0, slow_delay=1.0)
    events = await asyncio.wait_for(collect([user("!long 200")], provider=provider), timeout=5)
    assert len(texts(events)) == 200


async def test_chunks_are_delay_apart() -> None:
    provider = DemoProvider(delay=0.03, slow_delay=0)
    started = time.monotonic()
    await collect([user("one two three four")], provider=provider)  # "You said: one two three four": 6 chunks
    assert time.monotonic() - started >= 0.14


async def test_a_stream_can_be_abandoned_mid_way() -> None:
    provider = DemoProvider(delay=0, slow_delay=30)
    stream = provider.stream(CompletionRequest(model="demo", messages=[user("!slow 100")]))
    first = await asyncio.wait_for(anext(stream), timeout=2)
    assert first == TextDelta("tick 1 ")
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(anext(stream), timeout=0.05)  # cancelled in its sleep


# ---- crash continuation ----


@pytest.mark.parametrize("partial", ["tick 1 tick 2 ", "tick 1 tick 2"])
async def test_continue_after_a_crash_in_slow_goes_on_from_the_next_tick(partial: str) -> None:
    events = await collect([user("!slow 5"), assistant(partial), user("please continue")])
    assert texts(events) == ["tick 3 ", "tick 4 ", "tick 5 "]
    assert finish(events).finish_reason == "stop"


async def test_continue_twice_in_slow() -> None:
    messages = [
        user("!slow 6"),
        assistant("tick 1 "),
        user("please continue"),
        assistant("tick 2 tick 3 "),
        user("please continue"),
    ]
    assert texts(await collect(messages)) == ["tick 4 ", "tick 5 ", "tick 6 "]


async def test_continue_streams_the_rest_of_a_plain_reply() -> None:
    events = await collect([user("hello big world"), assistant("You said: hel"), user("please continue")])
    assert "".join(texts(events)) == "lo big world"
    assert texts(events) == ["lo ", "big ", "world"]


async def test_continue_without_a_matching_prefix_gives_the_full_reply() -> None:
    events = await collect([user("hello"), assistant("something else"), user("please continue")])
    assert "".join(texts(events)) == "You said: hello"


async def test_continue_after_an_empty_partial_gives_the_full_reply() -> None:
    events = await collect([user("hello"), assistant(""), user("please continue")])
    assert "".join(texts(events)) == "You said: hello"


async def test_continue_a_tool_results_reply() -> None:
    messages = [
        user("!tool a {}"),
        assistant(None, tool_calls=[("c1", "a")]),
        tool("c1", "x"),
        assistant("a retu"),
        user("please continue"),
    ]
    assert "".join(texts(await collect(messages))) == "rned: x"


async def test_continue_a_tool_call_does_not_repeat_the_reasoning_already_said() -> None:
    messages = [
        user("what time is it"),
        assistant(None, reasoning="The user asked me to call get_time."),
        user("please continue"),
    ]
    events = await collect(messages)
    assert reasoning(events) == ""
    assert [call.name for call in calls(events)] == ["get_time"]
    assert finish(events).finish_reason == "tool_calls"


async def test_continue_a_steer_reply() -> None:
    messages = [
        user("!slow 3"),
        assistant("tick 1 "),
        user("go right"),
        assistant("Steer rec"),
        user("please continue"),
    ]
    assert "".join(texts(await collect(messages))) == "eived: go right"


async def test_please_continue_typed_first_is_answered() -> None:
    events = await collect([user("please continue")])
    assert "".join(texts(events)) == "There is nothing to continue."


# ---- summarisation ----


async def test_a_summary_request_gets_the_first_words_of_each_user_message() -> None:
    messages = [
        {"role": "system", "content": "You are helpful."},
        user("hello there my good friend how are you"),
        assistant("You said: hello there my good friend how are you"),
        user("!long 5"),
        assistant("lorem ipsum dolor sit amet"),
        user("Summarize the conversation so far in a few sentences."),
    ]
    events = await collect(messages)
    assert "".join(texts(events)) == "Summary: hello there my good friend; !long 5"
    assert calls(events) == []


async def test_a_summary_of_nothing() -> None:
    events = await collect([user("Summarize the conversation")])
    assert "".join(texts(events)) == "Summary: nothing was said yet"


# ---- max_output_tokens ----


async def test_max_output_tokens_stops_with_length() -> None:
    events = await collect([user("hello big world")], max_output_tokens=2)
    assert texts(events) == ["You ", "said: "]
    assert finish(events) == Finish("length", {"input_tokens": 3, "output_tokens": 2})


async def test_max_output_tokens_never_emits_a_truncated_tool_call() -> None:
    events = await collect([user("!tool lookup {}")], max_output_tokens=7)  # room for reasoning only
    assert calls(events) == []
    assert reasoning(events) == "The user asked me to call lookup."
    assert finish(events) == Finish("length", {"input_tokens": 3, "output_tokens": 7, "reasoning_tokens": 7})


async def test_max_output_tokens_with_room_to_spare_changes_nothing() -> None:
    events = await collect([user("!slow 2")], max_output_tokens=4)
    assert texts(events) == ["tick 1 ", "tick 2 "]
    assert finish(events).finish_reason == "stop"


# ---- configuration ----


def test_delays_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SECTR_DEMO_DELAY_MS", raising=False)
    monkeypatch.delenv("SECTR_DEMO_SLOW_MS", raising=False)
    default = DemoProvider()
    assert (default.delay, default.slow_delay) == (0.005, 0.1)
    monkeypatch.setenv("SECTR_DEMO_DELAY_MS", "0")
    monkeypatch.setenv("SECTR_DEMO_SLOW_MS", "250")
    configured = DemoProvider()
    assert (configured.delay, configured.slow_delay) == (0.0, 0.25)
    assert DemoProvider(delay=0.5).delay == 0.5


def test_model_info_is_the_demo_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SECTR_MODEL_CONTEXT_WINDOW", raising=False)
    provider: Provider = DemoProvider()
    info = provider.model_info("demo")
    assert (info.model_id, info.provider_id, info.context_window) == ("demo", "demo", 8192)
    assert info.reasoning and info.image_input and info.audio_input
    monkeypatch.setenv("SECTR_MODEL_CONTEXT_WINDOW", "500")
    assert provider.model_info("demo").context_window == 500


def test_plan_reply_is_a_pure_function() -> None:
    messages = [user("note: a b c")]
    assert plan_reply(messages) == plan_reply(messages)
    assert messages == [user("note: a b c")]


def test_tools_plans_several_calls_in_order_and_bad_lists_are_plain_text() -> None:
    plan = plan_reply(
        [user('!tools write_note {"title": "a;b", "body": "x"} ; get_time ;calculator {"expression": "1"}')]
    )
    assert plan.tool_calls == [
        ("write_note", '{"title": "a;b", "body": "x"}'),  # a ";" inside the JSON is the JSON's
        ("get_time", "{}"),
        ("calculator", '{"expression": "1"}'),
    ]
    assert plan.reasoning == "The user asked me to call write_note, get_time, calculator."
    for bad in ("!tools", "!tools a {1}", "!tools a [1]", "!tools a {} b", "!tools a ;", "!tools ; a"):
        assert plan_reply([user(bad)]).tool_calls == [], bad
        assert plan_reply([user(bad)]).text == f"You said: {bad}"
    assert plan_reply([user("!tool get_time {}")]).tool_calls == [("get_time", "{}")]  # unchanged
