"""The usage dashboard's numbers (/review/usage/): tokens per day stacked by model or by
agent, with the largest series in their own colour and the rest as "other"; the time
from an approval ask to a person's decision; failed runs; the empty range; and who sees
what. The rows are written directly: what is under test is the report, not the rollup."""

from __future__ import annotations

from datetime import date, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from sessions_app.models import AuditEntry, ModelPrice, Run, Session, UsageDaily
from sessions_app.review import usage
from tests.server.chat.test_web import logged_in
from tests.server.conftest import join_team

pytestmark = pytest.mark.django_db


def report_day() -> date:
    """Today as the report sees it, read by each test: a module-level constant went stale
    when the run crossed midnight between collecting and running the tests."""
    return timezone.now().date()


@pytest.fixture
def reviewer(teammate: Any, owner: Any, session: Session) -> Any:
    return join_team(teammate, "reviewer", owner)


def spend(user: Any, day: date, model: str, tokens: int, team: Session | None = None) -> None:
    UsageDaily.objects.create(
        day=day,
        user=user,
        team_key=team.team_id if team is not None and team.team_id else 0,
        model=model,
        input_tokens=tokens // 2,
        output_tokens=tokens - tokens // 2,
        messages=1,
    )


def test_days_stack_by_model_with_the_largest_first_and_the_rest_as_other(
    reviewer: Any, owner: Any, session: Session
) -> None:
    this_day = report_day()
    session.refresh_from_db()
    for n in range(10):  # ten models: seven get a colour, three are "other"
        spend(owner, this_day - timedelta(days=1), f"model-{n}", 100 * (n + 1), session)
    spend(owner, this_day, "model-9", 4000, session)
    report = usage.build_report(reviewer, {"team": "crew"})
    chart = report.chart
    assert chart is not None
    assert chart.series[:3] == ["model-9", "model-8", "model-7"] and chart.series[-1] == "other"
    assert len(chart.series) == usage.SERIES
    yesterday, today = chart.columns[-2], chart.columns[-1]
    assert yesterday.tokens == sum(100 * (n + 1) for n in range(10)) and today.tokens == 4000
    other = chart.series.index("other")
    assert yesterday.by_series[other] == 100 + 200 + 300
    # The axis tops at a round number at or above the tallest day; segments stack to it.
    assert chart.ceiling == 6000 and chart.ticks == ["6k", "4.5k", "3k", "1.5k", "0"]
    assert sum(s.height for s in today.segments) == pytest.approx(100 * 4000 / 6000)
    assert today.segments[0].y == pytest.approx(100 - 100 * 4000 / 6000)
    # 30 days, five date labels at most; the per-day table leaves the empty days out.
    assert len(chart.columns) == 30 and len(chart.day_labels) == 5
    assert [row.label for row in report.used_days] == [yesterday.day.isoformat(), this_day.isoformat()]
    assert [column.day for column in chart.used_days] == [yesterday.day, this_day]


def test_stacked_by_agent_and_cost_per_day(reviewer: Any, owner: Any, session: Session) -> None:
    this_day = report_day()
    session.refresh_from_db()
    UsageDaily.objects.create(
        day=this_day,
        user=owner,
        team_key=session.team_id,
        model="demo",
        agent_key="",
        input_tokens=1000,
        output_tokens=0,
    )
    ModelPrice.objects.create(model="demo", input_per_million=Decimal("2"), output_per_million=Decimal("4"))
    report = usage.build_report(reviewer, {"by": "agent"})
    assert report.by == "agent" and report.chart is not None
    assert report.chart.series == ["default (built-in)"]
    assert report.has_prices and report.chart.columns[-1].cost == Decimal("0.002")
    assert report.chart.cost_ticks[0] == "0.002"
    assert usage.build_report(reviewer, {"by": "nonsense"}).by == "model"


def test_asks_wait_median_and_p90_count_peoples_decisions_only(reviewer: Any, session: Session) -> None:
    now = timezone.now()
    for n, waited in enumerate([10, 20, 30, 40, 600]):
        AuditEntry.objects.create(
            session=session, seq=n + 1, kind=AuditEntry.DECISION, ask_id=f"a{n}", at=now, seconds_to_decide=waited
        )
    AuditEntry.objects.create(session=session, seq=10, kind=AuditEntry.RULE, ask_id="r", at=now, seconds_to_decide=0)
    AuditEntry.objects.create(session=session, seq=11, kind=AuditEntry.EXPIRY, ask_id="e", at=now)
    AuditEntry.objects.create(session=session, seq=12, kind=AuditEntry.ASK, ask_id="q", at=now)
    old = datetime(2020, 1, 1, tzinfo=now.tzinfo)
    AuditEntry.objects.create(
        session=session, seq=13, kind=AuditEntry.DECISION, ask_id="o", at=old, seconds_to_decide=9
    )
    asks = usage.build_report(reviewer, {}).asks
    assert asks is not None
    assert (asks.decided, asks.by_rule, asks.expired) == (5, 1, 1)
    assert asks.median_seconds == 30 and asks.p90_seconds == pytest.approx(376)


def test_runs_failed_of_those_finished_with_the_latest_listed(reviewer: Any, session: Session) -> None:
    now = timezone.now()
    for n, status in enumerate([Run.COMPLETED, Run.COMPLETED, Run.FAILED, Run.CANCELLED]):
        Run.objects.create(session=session, status=status, finished_at=now - timedelta(minutes=n), error="boom")
    Run.objects.create(session=session, status=Run.RUNNING)
    runs = usage.build_report(reviewer, {}).runs
    assert runs is not None and (runs.finished, runs.failed) == (4, 1)
    assert [run.status for run in runs.latest] == [Run.FAILED]


def test_an_empty_range_is_empty_and_the_page_says_so_in_a_sentence(reviewer: Any, owner: Any) -> None:
    this_day = report_day()
    spend(owner, this_day, "demo", 10)
    page = logged_in(reviewer).get("/review/usage/", {"from": "2020-01-01", "to": "2020-01-30"}).content.decode()
    assert "No tokens were used from Jan 1 to Jan 30, 2020" in page
    assert "<svg" not in page and "2020-01-15" not in page and "Per day" not in page


def test_the_cost_hint_links_staff_to_the_prices_and_tells_others_who_sets_them(
    reviewer: Any, owner: Any, session: Session
) -> None:
    this_day = report_day()
    session.refresh_from_db()
    spend(owner, this_day, "demo", 10, session)
    page = logged_in(reviewer).get("/review/usage/").content.decode()
    assert "An administrator sets them in the admin" in page and "/admin/sessions_app/modelprice/" not in page
    owner.is_staff = True
    owner.save(update_fields=["is_staff"])
    staff: Client = logged_in(owner)
    assert 'href="/admin/sessions_app/modelprice/"' in staff.get("/review/usage/").content.decode()


def test_a_team_the_viewer_does_not_review_is_no_filter(reviewer: Any, owner: Any, session: Session) -> None:
    report = usage.build_report(reviewer, {"team": "someone-elses"})
    assert report.team == "" and report.teams == ["crew"]
