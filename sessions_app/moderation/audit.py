"""The moderation audit as people and programs read it: filters, rows, CSV, statistics.

The rows are `AuditEntry`, a projection of the journal written with each append
(sessions_app.journal.moderation). A viewer sees only the rows of sessions they may
audit: their own sessions, the sessions of teams where they are a reviewer or moderator,
and every session for staff (`auditable_sessions`).
"""

from __future__ import annotations

import csv
import itertools
import json
import re
from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, time
from typing import Any

from asgiref.sync import sync_to_async
from django import forms
from django.db.models import QuerySet
from django.http import StreamingHttpResponse
from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime

from sectr.errors import ValidationFailed
from sessions_app import access
from sessions_app.filter_forms import CutText, first_error
from sessions_app.models import AuditEntry, Session
from sessions_app.percentiles import percentile

#: Kinds listed by default: every verdict, vote and withdrawal (asks themselves are not decisions).
DEFAULT_KINDS = (
    AuditEntry.DECISION,
    AuditEntry.RULE,
    AuditEntry.EXPIRY,
    AuditEntry.VOTE,
    AuditEntry.WITHDRAWN,
)
KIND_LABELS = {
    AuditEntry.DECISION: "Decision",
    AuditEntry.RULE: "Rule decision",
    AuditEntry.EXPIRY: "Expired",
    AuditEntry.VOTE: "Vote",
    AuditEntry.WITHDRAWN: "Withdrawn",
    AuditEntry.ASK: "Ask",
}
VERDICTS = ("allow_once", "allow_always", "deny", "respond")
CSV_COLUMNS = (
    "at",
    "kind",
    "actor",
    "verdict",
    "note",
    "team",
    "session_id",
    "session_title",
    "requester",
    "ask_id",
    "tool",
    "arguments",
    "edited",
    "run_arguments",
    "seconds_to_decide",
    "rule",
    "seq",
)


def auditable_sessions(user: Any) -> QuerySet[Session]:
    """The sessions whose audit rows `user` may read: their own, those of the teams where
    they are a reviewer or moderator, every session for staff."""
    return access.reviewable_sessions(user)


class Moment(forms.Field):
    """`from` or `to`: a date (the day's start or end) or an ISO 8601 time."""

    def __init__(self, name: str, *, end: bool) -> None:
        super().__init__(required=False)
        self.name = name
        self.end = end

    def to_python(self, value: Any) -> datetime | None:
        try:
            return _moment(str(value or "").strip()[:40], self.name, end=self.end)
        except ValidationFailed as exc:
            raise forms.ValidationError(exc.message) from None


class AuditFilterForm(forms.Form):
    """The audit's filters (the page, its CSV and GET /api/v1/audit). A verdict or kind
    that is none, or a time that cannot be read, is an error (400), not ignored: an
    audit that silently dropped a filter would list rows the reader did not ask for."""

    team = CutText(150)
    tool = CutText(100)
    actor = CutText(150)
    verdict = CutText(150)
    kind = CutText(150)
    session = CutText(40)

    def clean_verdict(self) -> str:
        verdict: str = self.cleaned_data["verdict"]
        if verdict and verdict not in VERDICTS:
            raise forms.ValidationError(f"verdict must be one of {', '.join(VERDICTS)}")
        return verdict

    def clean_kind(self) -> str:
        kind: str = self.cleaned_data["kind"]
        if kind and kind not in KIND_LABELS:
            raise forms.ValidationError(f"kind must be one of {', '.join(KIND_LABELS)}")
        return kind


# The query string's names; `from` cannot be a class attribute's name.
AuditFilterForm.base_fields["from"] = Moment("from", end=False)
AuditFilterForm.base_fields["to"] = Moment("to", end=True)


@dataclass
class AuditFilters:
    team: str = ""
    tool: str = ""
    actor: str = ""
    verdict: str = ""
    kind: str = ""
    session: str = ""
    since: datetime | None = None
    until: datetime | None = None

    @classmethod
    def from_query(cls, query: Any) -> AuditFilters:
        """The filters of a query string; ValidationFailed (400) for a value that cannot be
        one (the first, in the form's order)."""
        form = AuditFilterForm(data=query)
        if not form.is_valid():
            raise ValidationFailed(first_error(form) or "invalid filter", code="invalid_filter")
        data = form.cleaned_data
        return cls(
            team=data["team"],
            tool=data["tool"],
            actor=data["actor"],
            verdict=data["verdict"],
            kind=data["kind"],
            session=data["session"],
            since=data["from"],
            until=data["to"],
        )

    def as_query(self) -> dict[str, str]:
        values = {
            "team": self.team,
            "tool": self.tool,
            "actor": self.actor,
            "verdict": self.verdict,
            "kind": self.kind,
            "session": self.session,
            "from": self.since.date().isoformat() if self.since else "",
            "to": self.until.date().isoformat() if self.until else "",
        }
        return {name: value for name, value in values.items() if value}


#: A day as the filters take it (Python's own parser also takes 20261204 and 2026-W49-5).
DAY = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")


def _moment(raw: str, name: str, *, end: bool) -> datetime | None:
    """`raw` as a time: a day (YYYY-MM-DD) is its first or, for `to`, its last moment;
    anything else must be an ISO 8601 time. The day is read first: Python reads a bare
    date as that day's midnight, which as `to` would leave the whole day out."""
    if not raw:
        return None
    try:
        day = parse_date(raw) if DAY.fullmatch(raw) else None
        moment = datetime.combine(day, time.max if end else time.min) if day is not None else parse_datetime(raw)
    except ValueError as exc:
        # Well formed but no such day or time (2026-13-01, 2026-02-30T10:00): Django's
        # parsers raise instead of returning None.
        raise ValidationFailed(f"{name} is not a real date or time: {raw} ({exc})", code="invalid_filter") from None
    if moment is None:
        raise ValidationFailed(f"{name} must be a date (YYYY-MM-DD) or an ISO 8601 time", code="invalid_filter")
    if timezone.is_naive(moment):
        moment = timezone.make_aware(moment, timezone.get_current_timezone())
    return moment


def audit_entries(user: Any, filters: AuditFilters | None = None) -> QuerySet[AuditEntry]:
    """The audit rows `user` may read, newest first, narrowed by `filters`."""
    filters = filters or AuditFilters()
    entries = AuditEntry.objects.filter(session__in=auditable_sessions(user)).select_related("session__team")
    entries = entries.filter(kind=filters.kind) if filters.kind else entries.filter(kind__in=DEFAULT_KINDS)
    if filters.team:
        entries = entries.filter(session__team__name=filters.team)
    if filters.tool:
        entries = entries.filter(tool=filters.tool)
    if filters.actor:
        entries = entries.filter(actor=filters.actor)
    if filters.verdict:
        entries = entries.filter(verdict=filters.verdict)
    if filters.session:
        entries = entries.filter(session_id=filters.session)
    if filters.since:
        entries = entries.filter(at__gte=filters.since)
    if filters.until:
        entries = entries.filter(at__lte=filters.until)
    return entries.order_by("-at", "-id")


def team_name(entry: AuditEntry) -> str:
    return entry.session.team.name if entry.session.team is not None else ""


def entry_dict(entry: AuditEntry) -> dict[str, Any]:
    """One row as the API serves it (and as the CSV's columns name it)."""
    return {
        "at": entry.at.isoformat(),
        "kind": entry.kind,
        "actor": entry.actor,
        "verdict": entry.verdict or None,
        "note": entry.note or None,
        "team": team_name(entry) or None,
        "session_id": entry.session_id,
        "session_title": entry.session.title,
        "requester": entry.requester,
        "ask_id": entry.ask_id,
        "tool": entry.tool,
        "arguments": entry.arguments,
        "edited": entry.edited,
        "run_arguments": entry.run_arguments,
        "seconds_to_decide": entry.seconds_to_decide,
        "rule": entry.rule or None,
        "seq": entry.seq,
    }


class _Echo:
    """A file-like object whose write returns the line (csv.writer into a stream)."""

    def write(self, value: str) -> str:
        return value


def csv_lines(entries: Iterable[AuditEntry]) -> Iterator[str]:
    """The CSV export, line by line (for StreamingHttpResponse): a header, then one row each."""
    writer = csv.writer(_Echo())
    yield writer.writerow(CSV_COLUMNS)
    for entry in entries:
        row = entry_dict(entry)
        row["arguments"] = json.dumps(entry.arguments, ensure_ascii=False, sort_keys=True)
        row["edited"] = "edited" if entry.edited else ""
        if entry.run_arguments is not None:
            row["run_arguments"] = json.dumps(entry.run_arguments, ensure_ascii=False, sort_keys=True)
        values = ["" if row[name] is None else row[name] for name in CSV_COLUMNS]
        # A cell starting with = + - @ is a formula to a spreadsheet: quote it as text.
        yield writer.writerow([_defuse(value) for value in values])


def _defuse(value: Any) -> Any:
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + value
    return value


async def stream_in_thread(lines: Iterator[str], batch: int = 200) -> AsyncIterator[str]:
    """`lines` as an async iterator, read `batch` lines at a time in the database thread.

    StreamingHttpResponse under ASGI buffers a sync iterator whole; this keeps the
    export streaming (the rows come from one server-side cursor, always read from the
    same thread: sync_to_async is thread-sensitive).
    """

    def take() -> str:
        return "".join(itertools.islice(lines, batch))

    while chunk := await sync_to_async(take)():
        yield chunk


@dataclass
class TeamTiming:
    team: str  # "" for personal sessions
    decisions: int
    median_seconds: float | None
    p90_seconds: float | None


def time_to_decision(entries: QuerySet[AuditEntry]) -> list[TeamTiming]:
    """Median and p90 seconds from ask to a person's decision, per team, over `entries`.

    Only people's decisions count: rule decisions take no time and expiries measure the
    policy, not the moderators.
    """
    people = entries.filter(kind=AuditEntry.DECISION, seconds_to_decide__isnull=False).order_by()
    by_team: dict[str, list[float]] = {}
    for name, seconds in people.values_list("session__team__name", "seconds_to_decide").iterator():
        if seconds is not None:
            by_team.setdefault(str(name or ""), []).append(float(seconds))
    timings = []
    for name in sorted(by_team):
        values = sorted(by_team[name])
        timings.append(TeamTiming(name, len(values), percentile(values, 0.5), percentile(values, 0.9)))
    return timings


def csv_response(entries: QuerySet[AuditEntry]) -> StreamingHttpResponse:
    """The CSV export of `entries`, streamed row by row (the audit may be long)."""
    rows = stream_in_thread(csv_lines(entries.iterator(chunk_size=500)))
    response = StreamingHttpResponse(rows, content_type="text/csv; charset=utf-8")
    stamp = timezone.now().strftime("%Y%m%d-%H%M%S")
    response["Content-Disposition"] = f'attachment; filename="sectr-audit-{stamp}.csv"'
    return response
