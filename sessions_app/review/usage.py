"""/review/usage/: token usage per day, user, API token and model, with costs.

Aggregated by the database from UsageDaily (the rollup the journal keeps, one row per
day, owner, token and model), never by folding journals: the page costs a few GROUP BY
queries over a table that grows with days x users x models, not with envelopes. Costs
multiply the sums by ModelPrice (per million tokens, set in the admin). Charts are
server-rendered SVG bars: the only arithmetic is scaling each bar to the largest one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date, timedelta
from decimal import Decimal
from typing import Any

from django.contrib.auth import get_user_model
from django.db.models import QuerySet, Sum
from django.utils import timezone

from sessions_app import access
from sessions_app.models import Agent, ApiToken, ModelPrice, Team, UsageDaily

DEFAULT_DAYS = 30
MAX_DAYS = 366
BAR_WIDTH = 400  # px of the longest bar


@dataclass
class UsageRow:
    label: str
    input_tokens: int
    output_tokens: int
    messages: int
    cost: Decimal | None
    bar: int = 0  # px

    @property
    def total(self) -> int:
        return self.input_tokens + self.output_tokens


@dataclass
class UsageReport:
    date_from: date
    date_to: date
    team: str
    by_day: list[UsageRow] = field(default_factory=list)
    by_user: list[UsageRow] = field(default_factory=list)
    by_token: list[UsageRow] = field(default_factory=list)
    by_model: list[UsageRow] = field(default_factory=list)
    by_agent: list[UsageRow] = field(default_factory=list)
    total: UsageRow | None = None
    currency: str = "USD"
    errors: list[str] = field(default_factory=list)
    bar_width: int = BAR_WIDTH


def _date(value: Any, default: date, errors: list[str], label: str) -> date:
    if not value:
        return default
    try:
        return date.fromisoformat(str(value))
    except ValueError:
        errors.append(f"{label} is not a date (YYYY-MM-DD); using {default.isoformat()}")
        return default


def usage_rows(user: Any, date_from: date, date_to: date, team: str = "") -> QuerySet[UsageDaily]:
    rows = UsageDaily.objects.filter(day__gte=date_from, day__lte=date_to)
    scope = access.usage_scope(user)
    if scope is not None:
        rows = rows.filter(scope)
    if team:
        rows = rows.filter(team_key__in=Team.objects.filter(name=team).values("pk"))
    return rows


def _prices() -> dict[str, ModelPrice]:
    return {price.model: price for price in ModelPrice.objects.all()}


def _cost(prices: dict[str, ModelPrice], model: str, input_tokens: int, output_tokens: int) -> Decimal | None:
    price = prices.get(model)
    if price is None:
        return None
    million = Decimal(1_000_000)
    return (
        Decimal(input_tokens) * price.input_per_million + Decimal(output_tokens) * price.output_per_million
    ) / million


def _grouped(
    rows: QuerySet[UsageDaily], key: str, prices: dict[str, ModelPrice]
) -> list[tuple[Any, int, int, int, Decimal | None]]:
    """Sums per `key`, costs summed per (key, model) so each model's own price applies."""
    sums = rows.values(key, "model").annotate(i=Sum("input_tokens"), o=Sum("output_tokens"), m=Sum("messages"))
    merged: dict[Any, list[Any]] = {}
    for row in sums:
        entry = merged.setdefault(row[key], [0, 0, 0, None])
        entry[0] += row["i"] or 0
        entry[1] += row["o"] or 0
        entry[2] += row["m"] or 0
        cost = _cost(prices, row["model"], row["i"] or 0, row["o"] or 0)
        if cost is not None:
            entry[3] = (entry[3] or Decimal(0)) + cost
    return [(k, *v) for k, v in merged.items()]


def _scaled(rows: list[UsageRow]) -> list[UsageRow]:
    largest = max((row.total for row in rows), default=0)
    for row in rows:
        row.bar = round(BAR_WIDTH * row.total / largest) if largest else 0
    return rows


def _agent_label(key: str) -> str:
    """ "team/slug v2" for a rollup's agent key ("<agent id>:<version>")."""
    if not key:
        return "default (built-in)"
    agent_id, _, version = key.partition(":")
    agent = Agent.objects.select_related("team").filter(pk=agent_id).first()
    return f"{agent} v{version}" if agent is not None else f"{agent_id} v{version} (deleted)"


def build_report(user: Any, params: Any) -> UsageReport:
    today = timezone.now().date()
    errors: list[str] = []
    date_to = _date(params.get("to"), today, errors, "To")
    date_from = _date(params.get("from"), date_to - timedelta(days=DEFAULT_DAYS - 1), errors, "From")
    if date_from > date_to:
        date_from, date_to = date_to, date_from
    if (date_to - date_from).days >= MAX_DAYS:
        date_from = date_to - timedelta(days=MAX_DAYS - 1)
        errors.append(f"the range is at most {MAX_DAYS} days")
    team = str(params.get("team", "")).strip()[:100]
    report = UsageReport(date_from, date_to, team, errors=errors)
    rows = usage_rows(user, date_from, date_to, team)
    prices = _prices()
    if prices:
        report.currency = next(iter(prices.values())).currency

    days = {d: (i, o, m, c) for d, i, o, m, c in _grouped(rows, "day", prices)}
    span = (date_to - date_from).days + 1
    report.by_day = _scaled(
        [
            UsageRow(day.isoformat(), *days.get(day, (0, 0, 0, None)))
            for day in (date_from + timedelta(days=n) for n in range(span))
        ]
    )
    users = dict(get_user_model().objects.filter(pk__in=rows.values("user_id")).values_list("pk", "username"))
    report.by_user = _scaled(
        sorted(
            (UsageRow(str(users.get(k, k)), i, o, m, c) for k, i, o, m, c in _grouped(rows, "user_id", prices)),
            key=lambda r: -r.total,
        )
    )
    tokens = {t.pk: f"{t.name} ({t.prefix}…)" for t in ApiToken.objects.filter(pk__in=rows.values("api_token_key"))}
    report.by_token = _scaled(
        sorted(
            (
                UsageRow(tokens.get(k, "web UI" if k == 0 else f"token {k} (deleted)"), i, o, m, c)
                for k, i, o, m, c in _grouped(rows, "api_token_key", prices)
            ),
            key=lambda r: -r.total,
        )
    )
    report.by_model = _scaled(
        sorted(
            (UsageRow(str(k), i, o, m, c) for k, i, o, m, c in _grouped(rows, "model", prices)), key=lambda r: -r.total
        )
    )
    report.by_agent = _scaled(
        sorted(
            (UsageRow(_agent_label(str(k)), i, o, m, c) for k, i, o, m, c in _grouped(rows, "agent_key", prices)),
            key=lambda r: -r.total,
        )
    )
    costs = [r.cost for r in report.by_model if r.cost is not None]
    report.total = UsageRow(
        "Total",
        sum(r.input_tokens for r in report.by_model),
        sum(r.output_tokens for r in report.by_model),
        sum(r.messages for r in report.by_model),
        sum(costs, Decimal(0)) if costs else None,
    )
    return report
