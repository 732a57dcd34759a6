"""Teams' monthly budgets (docs/agents.md, "Budgets"): what a team has spent this month,
whether its runs may go on, and the alerts at its thresholds.

The figure is the usage rollup (`UsageDaily`, written with the journal): one indexed
aggregate over the team's rows of this month, priced with `ModelPrice`. The run start
path asks `session_budget_spent`, which keeps each session's team and each team's figure
in memory for `SECTR_BUDGET_CHECK_SECONDS` (default 5): a run start costs no query while
the figure is fresh, and a team may overspend by what it spends in that window (the
bounded error). A moderator's change of the budget drops this process's copy at once;
other processes see it within the window.

Alerts: when a figure is read and a threshold (default 80 % and 100 %) is crossed, the
alert is recorded once per team, month and threshold (`BudgetAlert`, unique) and sent
to the team's webhooks and its moderators' email through the notification outbox.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Sum
from django.utils import timezone

from sessions_app.dbthread import run_in_db_thread
from sessions_app.models import (
    BudgetAlert,
    Membership,
    ModelPrice,
    NotificationDelivery,
    Session,
    Team,
    TeamBudget,
    TeamWebhook,
    UsageDaily,
)

log = logging.getLogger("sectr.budgets")
DEFAULT_THRESHOLDS = (0.8, 1.0)
BUDGET_EVENT = "budget.alert"


def month_start(now: datetime | None = None) -> date:
    """The first day of the current month, UTC (the usage rollup's days are UTC days)."""
    return (now or timezone.now()).astimezone(UTC).date().replace(day=1)


@dataclass(frozen=True)
class TeamFigure:
    """A team's budget and what it spent this month, as read at `read_at` (monotonic)."""

    monthly_tokens: int | None
    monthly_cost: Decimal | None
    thresholds: tuple[float, ...]
    spent_tokens: int
    spent_cost: Decimal
    read_at: float

    @property
    def share(self) -> float:
        """The largest share of a set budget spent (0 with no budget)."""
        shares = []
        if self.monthly_tokens is not None:
            shares.append(self.spent_tokens / self.monthly_tokens if self.monthly_tokens > 0 else float("inf"))
        if self.monthly_cost is not None:
            shares.append(float(self.spent_cost / self.monthly_cost) if self.monthly_cost > 0 else float("inf"))
        return max(shares, default=0.0)

    @property
    def spent(self) -> bool:
        return self.share >= 1.0


def team_spend(team_id: int, month: date) -> tuple[int, Decimal]:
    """Tokens (input + output) and their cost the team's sessions used since `month` began.
    A model without a price costs nothing (it is counted in tokens only)."""
    rows = (
        UsageDaily.objects.filter(team_key=team_id, day__gte=month)
        .values("model")
        .annotate(input=Sum("input_tokens"), output=Sum("output_tokens"))
    )
    prices = {price.model: price for price in ModelPrice.objects.all()}
    tokens = 0
    cost = Decimal(0)
    for row in rows:
        tokens += int(row["input"] or 0) + int(row["output"] or 0)
        price = prices.get(row["model"])
        if price is not None:
            cost += price.cost_of(int(row["input"] or 0), int(row["output"] or 0))
    return tokens, cost


def read_figure(team_id: int) -> TeamFigure:
    budget = TeamBudget.objects.filter(team_id=team_id).first()
    if budget is None or (budget.monthly_tokens is None and budget.monthly_cost is None):
        return TeamFigure(None, None, (), 0, Decimal(0), time.monotonic())
    tokens, cost = team_spend(team_id, month_start())
    thresholds = tuple(float(t) for t in (budget.alert_thresholds or DEFAULT_THRESHOLDS))
    figure = TeamFigure(budget.monthly_tokens, budget.monthly_cost, thresholds, tokens, cost, time.monotonic())
    send_due_alerts(team_id, figure)
    return figure


def _threshold_key(threshold: float) -> str:
    return f"{threshold:g}"


def send_due_alerts(team_id: int, figure: TeamFigure) -> list[str]:
    """Record and send the alerts of the thresholds `figure` has crossed, each once a month."""
    month = month_start()
    sent: list[str] = []
    for threshold in sorted(figure.thresholds):
        if figure.share < threshold:
            break
        key = _threshold_key(threshold)
        try:
            with transaction.atomic():
                BudgetAlert.objects.create(team_id=team_id, month=month, threshold=key)
                _enqueue_alert(team_id, figure, threshold, month)
        except IntegrityError:
            continue  # sent already this month (by this or another process)
        sent.append(key)
        log.info("team %s crossed %s of its budget", team_id, key)
    return sent


def _enqueue_alert(team_id: int, figure: TeamFigure, threshold: float, month: date) -> None:
    team = Team.objects.get(pk=team_id)
    payload: dict[str, Any] = {
        "event": BUDGET_EVENT,
        "team": team.name,
        "month": month.isoformat(),
        "threshold": threshold,
        "monthly_tokens": figure.monthly_tokens,
        "monthly_cost": str(figure.monthly_cost) if figure.monthly_cost is not None else None,
        "spent_tokens": figure.spent_tokens,
        "spent_cost": str(figure.spent_cost),
        "spent": figure.spent,
    }
    common = {"team_id": team_id, "event": BUDGET_EVENT, "ask_id": "", "session_id": "", "payload": payload}
    deliveries = [
        NotificationDelivery(channel=NotificationDelivery.WEBHOOK, webhook=hook, **common)
        for hook in TeamWebhook.objects.filter(team_id=team_id, active=True)
    ]
    recipients = sorted(
        {
            email
            for email in Membership.objects.filter(
                team_id=team_id, role=Membership.MODERATOR, user__is_active=True
            ).values_list("user__email", flat=True)
            if email
        }
    )
    if recipients:
        deliveries.append(NotificationDelivery(channel=NotificationDelivery.EMAIL, recipients=recipients, **common))
    NotificationDelivery.objects.bulk_create(deliveries)


def budget_email(payload: dict[str, Any]) -> tuple[str, str]:
    """The subject and body of a budget alert's email."""
    share = int(round(float(payload.get("threshold") or 0) * 100))
    team = payload.get("team")
    subject = f"[Sectr] Team {team} has used {share} % of its monthly budget"
    lines = [f"Team {team} has used {share} % of its budget for {payload.get('month', '')[:7]}:"]
    if payload.get("monthly_tokens") is not None:
        lines.append(f"- tokens: {payload.get('spent_tokens')} of {payload.get('monthly_tokens')}")
    if payload.get("monthly_cost") is not None:
        lines.append(f"- cost: {payload.get('spent_cost')} of {payload.get('monthly_cost')}")
    if payload.get("spent"):
        lines.append("\nThe team's new runs stop at once until a moderator raises the budget.")
    return subject, "\n".join(lines) + "\n"


# ---- the run start path ----

_SESSION_TEAMS: dict[str, int | None] = {}
_FIGURES: dict[int, TeamFigure] = {}
KEPT = 10_000


def forget_team(team_id: int) -> None:
    """Drop this process's figure of a team (its budget just changed)."""
    _FIGURES.pop(team_id, None)


def _check_seconds() -> float:
    return float(settings.SECTR_BUDGET_CHECK_SECONDS)


def remember_session_team(session_id: str, team_id: int | None) -> None:
    """A session's team, as another read of the run's start learned it (a session never
    changes team)."""
    if len(_SESSION_TEAMS) >= KEPT:
        _SESSION_TEAMS.clear()
    _SESSION_TEAMS[session_id] = team_id


def _session_team(session_id: str) -> int | None:
    team_id: int | None = Session.objects.filter(pk=session_id).values_list("team_id", flat=True).first()
    return team_id


async def session_budget_spent(session_id: str) -> bool:
    """Whether the session's team has spent its monthly budget (the runtime's budget
    source). No query while this process knows the session's team (the run start's rules
    read tells it) and its figure of the team is fresh."""
    if session_id in _SESSION_TEAMS:
        team_id = _SESSION_TEAMS[session_id]
    else:
        team_id = await run_in_db_thread(_session_team, session_id)
        remember_session_team(session_id, team_id)
    if team_id is None:
        return False  # a personal session has no team budget
    figure = _FIGURES.get(team_id)
    if figure is None or time.monotonic() - figure.read_at > _check_seconds():
        figure = await run_in_db_thread(read_figure, team_id)
        _FIGURES[team_id] = figure
    return figure.spent


def budget_status(team_id: int) -> dict[str, Any]:
    """The budget as the API reads it: the limits, thresholds and this month's spend."""
    budget = TeamBudget.objects.filter(team_id=team_id).first()
    tokens, cost = team_spend(team_id, month_start())
    return {
        "monthly_tokens": budget.monthly_tokens if budget else None,
        "monthly_cost": str(budget.monthly_cost) if budget and budget.monthly_cost is not None else None,
        "alert_thresholds": list(budget.alert_thresholds or DEFAULT_THRESHOLDS) if budget else list(DEFAULT_THRESHOLDS),
        "spent_tokens": tokens,
        "spent_cost": str(cost.quantize(Decimal("0.0001"))),
    }
