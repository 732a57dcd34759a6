"""A team's monthly budget on the server (docs/agents.md, "Budgets"): set by its
moderators, read from the usage rollup, alerts once per threshold and month, and runs
that end with stop reason `budget` once it is spent until a moderator raises it."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.core import mail
from django.test import Client
from django.utils import timezone

from sectr.errors import Forbidden, NotFound, ValidationFailed
from sectr.events import EventType
from sessions_app import actions, team_budgets
from sessions_app.actions.team_budgets import do_set_budget
from sessions_app.actions.tokens import do_issue_token
from sessions_app.journal import DatabaseJournal
from sessions_app.models import BudgetAlert, ModelPrice, NotificationDelivery, Team, TeamWebhook, UsageDaily
from sessions_app.moderation.notifications import send_email
from sessions_app.team_budgets import budget_status, read_figure
from tests.server.teams.test_agents import people, run_worker  # noqa: F401 - the standing users

E = EventType


@pytest.fixture(autouse=True)
def _fresh_figures() -> None:
    team_budgets._FIGURES.clear()
    team_budgets._SESSION_TEAMS.clear()


def spend(team: Team, user: Any, tokens: int, *, model: str = "demo", day: Any = None) -> None:
    """Usage as the journal's rollup adds it (one row per day, user, team and model)."""
    row, _ = UsageDaily.objects.get_or_create(
        day=day or timezone.now().date(), user=user, team_key=team.pk, model=model
    )
    UsageDaily.objects.filter(pk=row.pk).update(input_tokens=row.input_tokens + tokens)


@pytest.mark.django_db
def test_only_the_teams_moderators_set_its_budget(people: dict[str, Any]) -> None:  # noqa: F811
    budget = do_set_budget(people["moderator"], "crew", {"monthly_tokens": 1000, "monthly_cost": "12.5"})
    assert (budget.monthly_tokens, budget.monthly_cost, budget.alert_thresholds) == (1000, Decimal("12.5"), [0.8, 1.0])
    for who in ("owner", "member", "reviewer"):
        with pytest.raises(Forbidden):
            do_set_budget(people[who], "crew", {"monthly_tokens": 5})
    with pytest.raises(NotFound):
        do_set_budget(people["outsider"], "crew", {"monthly_tokens": 5})
    assert Team.objects.get(name="crew").budget.monthly_tokens == 1000


@pytest.mark.django_db
@pytest.mark.parametrize(
    "bad",
    [
        {"monthly_tokens": -1},
        {"monthly_tokens": "10"},
        {"monthly_tokens": True},
        {"monthly_cost": 12.5},
        {"monthly_cost": "-1"},
        {"monthly_cost": "1e3"},
        {"monthly_cost": "NaN"},
        {"alert_thresholds": [0]},
        {"alert_thresholds": "0.8"},
        {"alert_thresholds": [0.5] * 11},
        {"colour": "red"},
    ],
)
def test_a_bad_budget_is_refused_and_changes_nothing(people: dict[str, Any], bad: dict[str, Any]) -> None:  # noqa: F811
    do_set_budget(people["moderator"], "crew", {"monthly_tokens": 7})
    with pytest.raises(ValidationFailed):
        do_set_budget(people["moderator"], "crew", bad)
    assert Team.objects.get(name="crew").budget.monthly_tokens == 7


@pytest.mark.django_db
def test_the_spend_is_this_months_usage_priced_with_the_price_table(people: dict[str, Any]) -> None:  # noqa: F811
    crew = Team.objects.get(name="crew")
    ModelPrice.objects.create(model="demo", input_per_million=Decimal("2"), output_per_million=Decimal("4"))
    spend(crew, people["owner"], 500_000)
    spend(crew, people["owner"], 9_000_000, day=timezone.now().date().replace(day=1) - timedelta(days=1))  # last month
    spend(crew, people["owner"], 100, model="unpriced")
    status = budget_status(crew.pk)
    assert status["spent_tokens"] == 500_100
    assert status["spent_cost"] == "1.0000"
    assert status["monthly_tokens"] is None and status["alert_thresholds"] == [0.8, 1.0]


@pytest.mark.django_db
def test_each_threshold_alerts_once_a_month_by_webhook_and_email(people: dict[str, Any]) -> None:  # noqa: F811
    crew = Team.objects.get(name="crew")
    TeamWebhook.objects.create(team=crew, url="https://hooks.example.org/x")
    do_set_budget(people["moderator"], "crew", {"monthly_tokens": 1000})
    spend(crew, people["owner"], 850)
    read_figure(crew.pk)
    read_figure(crew.pk)
    assert list(BudgetAlert.objects.values_list("threshold", flat=True)) == ["0.8"]
    deliveries = NotificationDelivery.objects.filter(event="budget.alert")
    assert sorted(d.channel for d in deliveries) == ["email", "webhook"]
    email = deliveries.get(channel="email")
    assert email.recipients == ["moderator@example.org"]
    send_email(email)
    assert mail.outbox[-1].subject == "[Sectr] Team crew has used 80 % of its monthly budget"
    assert "tokens: 850 of 1000" in mail.outbox[-1].body
    spend(crew, people["owner"], 200)
    read_figure(crew.pk)
    assert sorted(BudgetAlert.objects.values_list("threshold", flat=True)) == ["0.8", "1"]
    assert NotificationDelivery.objects.filter(event="budget.alert").count() == 4


@pytest.mark.django_db(transaction=True)
def test_a_spent_budget_stops_new_runs_until_a_moderator_raises_it(people: dict[str, Any]) -> None:  # noqa: F811
    crew = Team.objects.get(name="crew")
    session = actions.do_create_session(people["owner"])
    do_set_budget(people["moderator"], "crew", {"monthly_tokens": 100})
    spend(crew, people["owner"], 100)
    actions.do_post_message(people["owner"], session.pk, "hello")
    run_worker()
    end = DatabaseJournal().load_sync(session.pk)[-1]
    assert end.type is E.INVOCATION_COMPLETED
    assert (end.payload["stop_reason"], end.payload["budget"]) == ("budget", "team")
    page = Client()
    page.force_login(people["owner"])
    assert "the team&#x27;s monthly budget is spent" in page.get(f"/sessions/{session.pk}/").content.decode()
    do_set_budget(people["moderator"], "crew", {"monthly_tokens": 10_000})  # raised: this process forgets its figure
    actions.do_post_message(people["owner"], session.pk, "hello again")
    run_worker()
    end = DatabaseJournal().load_sync(session.pk)[-1]
    assert end.payload["stop_reason"] == "end_turn"


@pytest.mark.django_db(transaction=True)
def test_a_personal_session_has_no_team_budget(people: dict[str, Any]) -> None:  # noqa: F811
    session = actions.do_create_session(people["owner"], team=None)
    do_set_budget(people["moderator"], "crew", {"monthly_tokens": 0})
    actions.do_post_message(people["owner"], session.pk, "hello")
    run_worker()
    assert DatabaseJournal().load_sync(session.pk)[-1].payload["stop_reason"] == "end_turn"


@pytest.mark.django_db(transaction=True)
def test_the_budget_api(people: dict[str, Any]) -> None:  # noqa: F811
    def client(who: str) -> Client:
        return Client(HTTP_AUTHORIZATION=f"Bearer {do_issue_token(people[who], 't')[1]}")

    mod = client("moderator")
    put = mod.put(
        "/api/v1/teams/crew/budget",
        data={"monthly_tokens": 5000, "monthly_cost": "20.00", "alert_thresholds": [0.5, 1]},
        content_type="application/json",
    )
    assert put.status_code == 200, put.content
    assert put.json() == {
        "monthly_tokens": 5000,
        "monthly_cost": "20.0000",
        "alert_thresholds": [0.5, 1.0],
        "spent_tokens": 0,
        "spent_cost": "0.0000",
    }
    member = client("member")
    assert member.get("/api/v1/teams/crew/budget").json()["monthly_tokens"] == 5000
    assert (
        member.put("/api/v1/teams/crew/budget", data={"monthly_tokens": 1}, content_type="application/json").status_code
        == 403
    )
    outsider = client("outsider")
    assert outsider.get("/api/v1/teams/crew/budget").status_code == 404
    bad = mod.put("/api/v1/teams/crew/budget", data={"monthly_cost": 3}, content_type="application/json")
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_budget"
