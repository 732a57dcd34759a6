"""A team's budget in the core (docs/agents.md, "Budgets"): asked as each invocation
starts and before each model step of the default handler; once spent, a new run ends at
once with stop reason `budget`, and a run already going finishes its current step."""

from __future__ import annotations

from sectr import LocalRuntime
from sectr.events import EventType
from sectr.providers.demo import DemoProvider

from .conftest import of_type


class Budget:
    """A budget source whose answer the test turns, counting the questions."""

    def __init__(self, spent: bool = False) -> None:
        self.spent = spent
        self.asked: list[str] = []

    async def __call__(self, session_id: str) -> bool:
        self.asked.append(session_id)
        return self.spent


async def test_a_run_of_a_team_whose_budget_is_spent_ends_at_once() -> None:
    budget = Budget(spent=True)
    rt = LocalRuntime(provider=DemoProvider(delay=0), budget=budget)
    sid = await rt.create_session()
    outcome = await rt.send(sid, "hello")
    assert outcome.type is EventType.INVOCATION_COMPLETED
    assert outcome.payload["stop_reason"] == "budget" and outcome.payload["budget"] == "team"
    assert of_type(rt.journal.read(sid), EventType.MESSAGE_START) == []  # the model was never called
    assert budget.asked == [sid]


async def test_a_run_going_finishes_its_step_and_stops_before_the_next() -> None:
    budget = Budget()
    rt = LocalRuntime(provider=DemoProvider(delay=0), budget=budget)
    sid = await rt.create_session()

    original = rt.runtime.provider.stream

    async def spend_then_stream(request):  # type: ignore[no-untyped-def]
        async for event in original(request):
            yield event
        budget.spent = True  # this step spent the rest of the budget

    rt.runtime.provider.stream = spend_then_stream  # type: ignore[method-assign]
    outcome = await rt.send(sid, "what time is it")  # a tool call, then (not) the answer
    assert outcome.payload["stop_reason"] == "budget" and outcome.payload["budget"] == "team"
    envelopes = rt.journal.read(sid)
    assert len(of_type(envelopes, EventType.MESSAGE_END)) == 1  # the step that was going ended whole
    [result] = of_type(envelopes, EventType.TOOL_RESULT)
    assert not result.payload.get("is_error")  # its tool call was answered before the stop


async def test_a_raised_budget_lets_runs_go_on() -> None:
    budget = Budget(spent=True)
    rt = LocalRuntime(provider=DemoProvider(delay=0), budget=budget)
    sid = await rt.create_session()
    await rt.send(sid, "hello")
    budget.spent = False
    outcome = await rt.send(sid, "hello again")
    assert outcome.payload["stop_reason"] == "end_turn" and "budget" not in outcome.payload


async def test_the_runs_own_token_budget_is_not_the_teams() -> None:
    rt = LocalRuntime(provider=DemoProvider(delay=0), budget=Budget())
    sid = await rt.create_session(limits={"max_run_tokens": 3})
    outcome = await rt.send(sid, "!long 50")
    assert outcome.payload["stop_reason"] == "budget"
    assert "budget" not in {k for k in outcome.payload if k != "stop_reason"}
