"""/review/usage/: the usage dashboard. Tokens and cost per day (stacked by model or by
agent), top users and agents, the time from an approval ask to a person's decision, and
the runs that failed; then every breakdown as a table (per day, user, API token, model
and agent).

Aggregated by the database from UsageDaily (the rollup the journal keeps, one row per
day, owner, token, model and agent), never by folding journals: the page costs a fixed
number of GROUP BY queries over a table that grows with days x users x models, not with
envelopes. Costs multiply the sums by ModelPrice (per million tokens, set in the admin).
Asks come from the moderation audit (AuditEntry), failures from Run.

The charts are server-rendered SVG (no script, nothing for the CSP to refuse): a column
per day whose segments are scaled to a rounded-up maximum, drawn in a 100-unit-high
viewBox that stretches to the panel's width; the axis labels are HTML beside it, so
they keep their size on a phone. Each chart has a table view for screen readers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from typing import Any

from django.contrib.auth import get_user_model
from django.db.models import Count, QuerySet, Sum
from django.utils import timezone

from sessions_app import access
from sessions_app.journal.projections import REPLAY_USAGE_PREFIX
from sessions_app.models import Agent, ApiToken, AuditEntry, ModelPrice, Run, Team, UsageDaily
from sessions_app.percentiles import percentile

DEFAULT_DAYS = 30
MAX_DAYS = 366
BAR_WIDTH = 400  # px of the longest bar
#: The chart's colours (static/layout.css .series-N): the largest this many - 1 series
#: by tokens get their own, the rest share the last as "other".
SERIES = 8
TOP = 5  # rows in "top users" and "top agents"
LATEST_FAILURES = 5
STACK_BY = ("model", "agent")


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
class Segment:
    series: int  # the colour (.series-N) and the legend entry
    tokens: int
    y: float  # viewBox units from the top (100 high)
    height: float


@dataclass
class DayColumn:
    day: date
    tokens: int
    cost: Decimal | None
    x: float  # viewBox units from the left (10 a day)
    segments: list[Segment] = field(default_factory=list)
    cost_y: float = 100.0
    cost_height: float = 0.0
    by_series: list[int] = field(default_factory=list)  # tokens per legend entry (the table view)


@dataclass
class Chart:
    """Days as stacked columns in a viewBox `width` x 100, and what labels it."""

    series: list[str]
    columns: list[DayColumn]
    ceiling: float  # tokens at the top of the axis
    cost_ceiling: float
    day_labels: list[str]

    @property
    def width(self) -> int:
        return 10 * len(self.columns)

    @property
    def ticks(self) -> list[str]:
        """The token axis, top to bottom."""
        return [short_number(self.ceiling * n / 4) for n in (4, 3, 2, 1, 0)]

    @property
    def cost_ticks(self) -> list[str]:
        return [f"{round(self.cost_ceiling * n / 4, 6):g}" for n in (4, 3, 2, 1, 0)]

    @property
    def used_days(self) -> list[DayColumn]:
        """The days with any usage (the table view leaves the others out)."""
        return [column for column in self.columns if column.tokens]


@dataclass
class AskTiming:
    decided: int  # by a person
    by_rule: int
    expired: int
    median_seconds: float | None
    p90_seconds: float | None


@dataclass
class RunFailures:
    finished: int
    failed: int
    latest: list[Run]


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
    by: str = "model"
    chart: Chart | None = None
    has_prices: bool = False
    asks: AskTiming | None = None
    runs: RunFailures | None = None
    teams: list[str] = field(default_factory=list)

    @property
    def used_days(self) -> list[UsageRow]:
        """The per-day rows with any usage (a month of zeros says nothing)."""
        return [row for row in self.by_day if row.total or row.messages]

    @property
    def top_users(self) -> list[UsageRow]:
        return self.by_user[:TOP]

    @property
    def top_agents(self) -> list[UsageRow]:
        return self.by_agent[:TOP]

    @property
    def empty(self) -> bool:
        return self.total is None or self.total.total == 0


def short_number(value: float) -> str:
    """1234 -> "1.2k", 2500000 -> "2.5M", 12.5 -> "12.5": the axis labels."""
    for size, suffix in ((1_000_000_000, "G"), (1_000_000, "M"), (1_000, "k"), (1, "")):
        if abs(value) >= size or size == 1:
            return f"{value / size:.1f}".rstrip("0").rstrip(".") + suffix
    return str(value)  # pragma: no cover - the loop returns at size 1


def nice_step(largest: float) -> float:
    """A quarter of the axis: the smallest round step (1, 1.5, 2, 2.5, 3, 4, 5, 6 or 8
    x 10^n) whose four steps reach `largest`, so the axis reads 0, 15, 30, 45, 60 and
    the tallest column fills most of it."""
    if largest <= 0:
        return 0.25
    quarter = largest / 4
    power = 10 ** math.floor(math.log10(quarter))
    for step in (1, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10):
        if step * power >= quarter:
            return step * power
    return 10 * power  # pragma: no cover - the loop ends at 10 x power


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
    """ "team/slug v2" for a rollup's agent key ("<agent id>:<version>"; an experiment's
    replays: "replay:" before it)."""
    if key.startswith(REPLAY_USAGE_PREFIX):
        return "replays: " + _agent_label(key.removeprefix(REPLAY_USAGE_PREFIX))
    if not key:
        return "default (built-in)"
    agent_id, _, version = key.partition(":")
    agent = Agent.objects.select_related("team").filter(pk=agent_id).first()
    return f"{agent} v{version}" if agent is not None else f"{agent_id} v{version} (deleted)"


def _day_labels(first: date, last: date) -> list[str]:
    """At most five dates under the chart, evenly spread: the first, the last, between."""
    span = (last - first).days
    count = min(5, span + 1)
    if count == 1:
        return [first.strftime("%b %d")]
    return [(first + timedelta(days=round(span * n / (count - 1)))).strftime("%b %d") for n in range(count)]


DaySums = dict[date, tuple[int, int, int, Decimal | None]]


def _stacked_chart(
    rows: QuerySet[UsageDaily], by: str, date_from: date, date_to: date, prices: dict[str, ModelPrice]
) -> tuple[Chart, DaySums]:
    """Tokens per day stacked by model or agent, cost per day, and each day's sums (input,
    output, messages, cost) for the per-day table: one GROUP BY."""
    key = "model" if by == "model" else "agent_key"
    fields = ("day", key) if key == "model" else ("day", key, "model")
    sums = rows.values(*fields).annotate(i=Sum("input_tokens"), o=Sum("output_tokens"), m=Sum("messages")).order_by()
    days: dict[date, list[Any]] = {}
    per_day: dict[date, dict[str, int]] = {}
    costs: dict[date, Decimal] = {}
    totals: dict[str, int] = {}
    for row in sums:
        tokens = (row["i"] or 0) + (row["o"] or 0)
        name = str(row[key])
        per_day.setdefault(row["day"], {}).setdefault(name, 0)
        per_day[row["day"]][name] += tokens
        totals[name] = totals.get(name, 0) + tokens
        cost = _cost(prices, row["model"], row["i"] or 0, row["o"] or 0)
        sums_of_day = days.setdefault(row["day"], [0, 0, 0, None])
        sums_of_day[0] += row["i"] or 0
        sums_of_day[1] += row["o"] or 0
        sums_of_day[2] += row["m"] or 0
        if cost is not None:
            costs[row["day"]] = costs.get(row["day"], Decimal(0)) + cost
            sums_of_day[3] = costs[row["day"]]
    ranked = sorted(totals, key=lambda name: (-totals[name], name))
    own = ranked if len(ranked) <= SERIES else ranked[: SERIES - 1]
    index = {name: n for n, name in enumerate(own)}
    labels = [name if key == "model" else _agent_label(name) for name in own]
    if len(ranked) > len(own):
        labels.append("other")
    columns = []
    span = (date_to - date_from).days + 1
    for n in range(span):
        day = date_from + timedelta(days=n)
        stack: dict[int, int] = {}
        for name, tokens in per_day.get(day, {}).items():
            series = index.get(name, len(own))
            stack[series] = stack.get(series, 0) + tokens
        columns.append(
            DayColumn(
                day,
                sum(stack.values()),
                costs.get(day),
                10 * n,
                [Segment(s, t, 0, 0) for s, t in sorted(stack.items())],
            )
        )
    ceiling = 4 * max(1.0, nice_step(max((c.tokens for c in columns), default=0)))  # whole tokens
    cost_ceiling = 4 * nice_step(float(max((c.cost or 0 for c in columns), default=0)))
    for column in columns:
        amounts = dict((segment.series, segment.tokens) for segment in column.segments)
        column.by_series = [amounts.get(n, 0) for n in range(len(labels))]
        top = 100.0
        for segment in column.segments:
            segment.height = 100 * segment.tokens / ceiling
            top -= segment.height
            segment.y = top
        if column.cost:
            column.cost_height = 100 * float(column.cost) / cost_ceiling
            column.cost_y = 100 - column.cost_height
    chart = Chart(labels, columns, ceiling, cost_ceiling, _day_labels(date_from, date_to))
    return chart, {day: (i, o, m, c) for day, (i, o, m, c) in days.items()}


def _scope_sessions(user: Any, team: str) -> Any:
    sessions = access.reviewable_sessions(user)
    return sessions.filter(team__name=team) if team else sessions


def _range(date_from: date, date_to: date) -> tuple[datetime, datetime]:
    return datetime.combine(date_from, time.min, tzinfo=UTC), datetime.combine(
        date_to + timedelta(days=1), time.min, tzinfo=UTC
    )


def _ask_timing(user: Any, team: str, date_from: date, date_to: date) -> AskTiming:
    """How long asks waited for a person's decision (median, 90th percentile), and how
    many a rule decided at once or the expiry policy denied, over asks ended in the range."""
    start, end = _range(date_from, date_to)
    ended = AuditEntry.objects.filter(
        session__in=_scope_sessions(user, team).values("pk"),
        kind__in=AuditEntry.VERDICT_KINDS,
        at__gte=start,
        at__lt=end,
    ).order_by()
    seconds: list[float] = []
    counts = {kind: 0 for kind in AuditEntry.VERDICT_KINDS}
    for kind, waited in ended.values_list("kind", "seconds_to_decide").iterator():
        counts[kind] += 1
        if kind == AuditEntry.DECISION and waited is not None:
            seconds.append(float(waited))
    seconds.sort()
    return AskTiming(
        counts[AuditEntry.DECISION],
        counts[AuditEntry.RULE],
        counts[AuditEntry.EXPIRY],
        percentile(seconds, 0.5),
        percentile(seconds, 0.9),
    )


def _run_failures(user: Any, team: str, date_from: date, date_to: date) -> RunFailures:
    start, end = _range(date_from, date_to)
    finished = Run.objects.filter(
        session__in=_scope_sessions(user, team).values("pk"), finished_at__gte=start, finished_at__lt=end
    )
    counts = dict(
        finished.filter(status__in=Run.FINISHED_STATUSES)
        .values_list("status")
        .annotate(n=Count("pk"))
        .order_by()
        .values_list("status", "n")
    )
    failed = finished.filter(status=Run.FAILED).select_related("session").order_by("-finished_at")
    latest = list(failed[:LATEST_FAILURES]) if counts.get(Run.FAILED) else []
    return RunFailures(sum(counts.values()), counts.get(Run.FAILED, 0), latest)


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
    teams = list(access.teams_for(user, "reviewer").order_by("name").values_list("name", flat=True))
    team = str(params.get("team", "")).strip()[:100]
    if team not in teams:
        team = ""  # not a team the viewer reviews: no filter (their own usage still shows)
    by = str(params.get("by", "")) if params.get("by") in STACK_BY else "model"
    report = UsageReport(date_from, date_to, team, errors=errors, by=by, teams=teams)
    rows = usage_rows(user, date_from, date_to, team)
    prices = _prices()
    report.has_prices = bool(prices)
    if prices:
        report.currency = next(iter(prices.values())).currency
    report.chart, days = _stacked_chart(rows, by, date_from, date_to, prices)
    report.asks = _ask_timing(user, team, date_from, date_to)
    report.runs = _run_failures(user, team, date_from, date_to)

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
