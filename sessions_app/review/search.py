"""Finding sessions for /review/: full-text search over SearchEntry plus the filters of
docs/review.md (Team, User, State, Model, From, To, Has asks, Failed, and a score of
reviewers' ratings with its value).

PostgreSQL matches ``to_tsvector('english', text) @@ websearch_to_tsquery(...)`` through
the GIN index on that very expression (migration 0001_initial); SQLite matches the FTS5 table
kept by triggers. Both find sessions with a semi-join on the index, then filter and
order sessions by their own indexes, so the cost follows the matches, not the journal.
Snippets are computed only for the page shown, and returned as safe HTML: the text is
escaped first and only the database's highlight markers become <mark>.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

from django import forms
from django.contrib.auth import get_user_model
from django.db import connection
from django.db.models import BooleanField, Exists, OuterRef, Q, QuerySet
from django.db.models.expressions import RawSQL
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from sectr.events import EventType
from sessions_app import access
from sessions_app.filter_forms import CutText, Flag, PickOne
from sessions_app.journal.projections import MARK_END, MARK_START
from sessions_app.models import AskIndex, Envelope, Rating, SearchEntry, Session
from sessions_app.review import scores

FTS_TABLE = "sessions_app_searchentry_fts"
MAX_QUERY = 200
_WORD = re.compile(r"\w+", re.UNICODE)
STATES = [s for s, _ in Session.STATUS_CHOICES]


class SearchDate(forms.Field):
    """`From` or `To`: a date (YYYY-MM-DD), picked with the browser's date control."""

    widget = forms.DateInput(attrs={"type": "date"}, format="%Y-%m-%d")

    def __init__(self, label: str) -> None:
        super().__init__(required=False, label=label)

    def to_python(self, value: Any) -> date | None:
        if not value:
            return None
        try:
            return date.fromisoformat(str(value))
        except ValueError:
            raise forms.ValidationError(f"{self.label} is not a date (YYYY-MM-DD); ignored") from None


#: At most this many people in the User select; past it the filter is a text box.
MAX_PEOPLE = 500


class SearchFilterForm(forms.Form):
    """The /review/ search form (and the bulk actions that take its filters).

    Given the `viewer`, Team and User are selects of the teams where they review and of
    the people whose sessions they may review (a name not among them is no filter);
    without one (the bulk actions re-reading a search) they are read as typed, and the
    search itself keeps to what the viewer may review either way."""

    q = CutText(MAX_QUERY, label="Search", widget=forms.TextInput(attrs={"type": "search", "maxlength": MAX_QUERY}))
    team = CutText(100, label="Team")
    user = CutText(150, label="User")
    state = PickOne([(s, s) for s in STATES], label="State")
    model = CutText(200, label="Model")
    agent = CutText(200, label="Agent", widget=forms.TextInput(attrs={"placeholder": "team/slug"}))
    version = CutText(
        10, label="Version", widget=forms.TextInput(attrs={"inputmode": "numeric", "pattern": "[0-9]*", "size": 4})
    )
    has_asks = Flag(label="Has asks")
    failed = Flag(label="Failed")
    # Shown by templates/review/_score_filter.html: a select of the viewer's teams' scores.
    score = CutText(40, label="Score")
    score_value = CutText(60, label="Score value")

    def __init__(self, *args: Any, viewer: Any = None, **kwargs: Any) -> None:
        kwargs.setdefault("auto_id", "f-%s")
        super().__init__(*args, **kwargs)
        if viewer is None:
            return
        teams = access.teams_for(viewer, "reviewer").order_by("name").values_list("name", flat=True)
        self.fields["team"] = PickOne([(name, name) for name in teams], label="Team")
        owners = access.reviewable_sessions(viewer).values("owner_id")
        people = list(
            get_user_model()
            .objects.filter(pk__in=owners)
            .order_by("username")
            .values_list("username", flat=True)[: MAX_PEOPLE + 1]
        )
        if len(people) <= MAX_PEOPLE:
            self.fields["user"] = PickOne([(name, name) for name in people], label="User")

    def text_fields(self) -> list[forms.BoundField]:
        """The fields shown as label-over-control cells (the checkboxes go apart)."""
        return [self[name] for name in self.fields if name not in ("has_asks", "failed", "score", "score_value")]

    def flag_fields(self) -> list[forms.BoundField]:
        return [self["has_asks"], self["failed"]]


# The query string's names; `from` cannot be a class attribute's name.
SearchFilterForm.base_fields["from"] = SearchDate("From")
SearchFilterForm.base_fields["to"] = SearchDate("To")


@dataclass
class Filters:
    """The /review/ form, validated. Unknown or malformed values are dropped, not errors:
    it is a search form, and a bookmarked URL should still show something."""

    q: str = ""
    team: str = ""
    user: str = ""
    state: str = ""
    model: str = ""
    agent: str = ""  # an agent's slug, team/slug or id; "default": the built-in agent
    version: int | None = None
    date_from: date | None = None
    date_to: date | None = None
    has_asks: bool = False
    failed: bool = False
    score: str = ""  # a score's name: sessions a reviewer rated with it
    score_value: str = ""  # its value: a label, yes/no, a number or >=n, <=n, >n, <n
    errors: list[str] = field(default_factory=list)

    @classmethod
    def from_query(cls, params: Any) -> Filters:
        return cls.from_form(SearchFilterForm(data=params))

    @classmethod
    def from_form(cls, form: SearchFilterForm) -> Filters:
        form.is_valid()  # a date that is none is dropped, and said so (`errors`)
        data = form.cleaned_data
        score, score_value, score_errors = _score_filter(data["score"], data["score_value"])
        return cls(
            score=score,
            score_value=score_value,
            q=data["q"],
            team=data["team"],
            user=data["user"],
            state=data["state"],
            model=data["model"],
            agent=data["agent"],
            version=int(data["version"]) if data["version"].isascii() and data["version"].isdigit() else None,
            date_from=data.get("from"),
            date_to=data.get("to"),
            has_asks=data["has_asks"],
            failed=data["failed"],
            errors=[str(error) for name in ("from", "to") for error in form.errors.get(name, [])] + score_errors,
        )

    def as_query(self) -> dict[str, str]:
        """The filters as URL parameters (for the pager and the bulk export link)."""
        pairs = {
            "q": self.q,
            "team": self.team,
            "user": self.user,
            "state": self.state,
            "model": self.model,
            "agent": self.agent,
            "version": str(self.version) if self.version is not None else "",
            "from": self.date_from.isoformat() if self.date_from else "",
            "to": self.date_to.isoformat() if self.date_to else "",
            "has_asks": "1" if self.has_asks else "",
            "failed": "1" if self.failed else "",
            "score": self.score,
            "score_value": self.score_value if self.score else "",
        }
        return {key: value for key, value in pairs.items() if value}


def _day_start(day: date) -> datetime:
    return datetime.combine(day, time.min, tzinfo=UTC)


def fts5_query(text: str) -> str:
    """The search box's words as an FTS5 query: each word a quoted term, all required
    (FTS5's own syntax (NEAR, column filters, quotes) is not the user's to type)."""
    return " ".join(f'"{word}"' for word in _WORD.findall(text))


def text_match_sql() -> tuple[str, str]:
    """(SQL condition on sessions_app_searchentry matching %s, the parameter transform)."""
    if connection.vendor == "postgresql":
        return "to_tsvector('english'::regconfig, text) @@ websearch_to_tsquery('english'::regconfig, %s)", "plain"
    return f"id IN (SELECT rowid FROM {FTS_TABLE} WHERE {FTS_TABLE} MATCH %s)", "fts5"  # noqa: S608 - fixed name


def _query_param(q: str, transform: str) -> str:
    return fts5_query(q) if transform == "fts5" else q


def matching_session_ids(q: str) -> Any:
    """A subquery of the ids of the sessions with a search entry matching `q` (empty when
    `q` has no word). PostgreSQL evaluates it once, as a set (OFFSET 0 keeps the planner
    from pulling it up into a semi-join it may re-run per session, minutes at 100,000)."""
    condition, transform = text_match_sql()
    param = _query_param(q, transform)
    if not param:
        return SearchEntry.objects.none().values("session_id")
    if connection.vendor == "postgresql":
        # The condition is one of two fixed strings; the user's words are a parameter.
        sql = f"SELECT session_id FROM sessions_app_searchentry WHERE {condition} OFFSET 0"  # noqa: S608
        return RawSQL(sql, [param])  # noqa: S611
    match = RawSQL(condition, [param], output_field=BooleanField())  # noqa: S611
    return SearchEntry.objects.filter(match).values("session_id")


def search_sessions(user: Any, filters: Filters) -> QuerySet[Session]:
    """The sessions `user` may review that match `filters`, newest activity first."""
    sessions = (
        access.reviewable_sessions(user, teams_first=True).filter(is_replay=False).select_related("owner", "agent")
    )
    if filters.q:
        if not _query_param(filters.q, text_match_sql()[1]):
            return sessions.none()
        sessions = sessions.filter(pk__in=matching_session_ids(filters.q))
    if filters.team:
        sessions = _filter_team(sessions, filters.team)
    if filters.user:
        sessions = sessions.filter(owner__username=filters.user)
    if filters.state:
        sessions = sessions.filter(status=filters.state)
    if filters.model:
        sessions = sessions.filter(model=filters.model)
    if filters.agent:
        sessions = _filter_agent(sessions, filters.agent)
        if filters.version is not None:
            sessions = sessions.filter(agent_version=filters.version)
    if filters.date_from:
        sessions = sessions.filter(updated_at__gte=_day_start(filters.date_from))
    if filters.date_to:
        sessions = sessions.filter(updated_at__lt=_day_start(filters.date_to + timedelta(days=1)))
    if filters.has_asks:
        sessions = sessions.filter(Exists(AskIndex.objects.filter(session=OuterRef("pk"))))
    if filters.failed:
        failed_once = Envelope.objects.filter(session=OuterRef("pk"), type=EventType.INVOCATION_FAILED.value)
        sessions = sessions.filter(Q(status="failed") | Exists(failed_once))
    if filters.score:
        rated = Rating.objects.filter(session=OuterRef("pk"), source=Rating.REVIEWER).filter(
            _score_condition(filters.score, filters.score_value)
        )
        sessions = sessions.filter(Exists(rated))
    return sessions.order_by("-updated_at", "-pk")


_COMPARISON = re.compile(r"^(>=|<=|>|<)?\s*(-?\d+(?:\.\d+)?)$")
_LOOKUPS = {">=": "gte", "<=": "lte", ">": "gt", "<": "lt", None: "exact"}
_YES, _NO = ("yes", "true", "up"), ("no", "false", "down")


def _score_filter(name: str, value: str) -> tuple[str, str, list[str]]:
    """The score filter as given, or dropped with a note when the name cannot be one."""
    name, value = name.strip(), value.strip()
    if name and not scores.NAME.match(name):
        return "", "", [f"{name[:40]} is not a score's name; ignored"]
    return name, value if name else "", []


def _score_condition(name: str, value: str) -> Q:
    """Ratings that carry score `name` (with `value`, when given: a label, yes/no, or a
    number, optionally after >=, <=, > or <)."""
    comparison = _COMPARISON.match(value)
    lowered = value.lower()
    if name == "thumbs":
        if lowered in _YES:
            return Q(thumbs=1)
        if lowered in _NO:
            return Q(thumbs=-1)
        return Q(thumbs__isnull=False) if not value else Q(pk__in=[])
    if name == "score":
        if comparison:
            return Q(**{f"score__{_LOOKUPS[comparison.group(1)]}": float(comparison.group(2))})
        return Q(score__isnull=False) if not value else Q(pk__in=[])
    if not value:
        return Q(values__has_key=name)
    if comparison:
        number = float(comparison.group(2))
        return Q(values__has_key=name) & Q(
            **{f"values__{name}__{_LOOKUPS[comparison.group(1)]}": int(number) if number.is_integer() else number}
        )
    if lowered in _YES + _NO:
        return Q(**{f"values__{name}": lowered in _YES}) | Q(**{f"values__{name}": value})
    return Q(**{f"values__{name}": value})


def _filter_agent(sessions: QuerySet[Session], agent: str) -> QuerySet[Session]:
    """By the pinned agent: its id, `team/slug`, or a slug (of any team the reviewer sees);
    `default` also finds the sessions of the built-in agent."""
    if agent.startswith("agt_"):
        return sessions.filter(agent_id=agent)
    team, _, slug = agent.rpartition("/")
    matching = sessions.filter(agent__slug=slug)
    if team:
        matching = matching.filter(agent__team__name=team)
    if agent == "default":
        return sessions.filter(Q(agent__isnull=True) | Q(pk__in=matching.values("pk")))
    return matching


def _filter_team(sessions: QuerySet[Session], team: str) -> QuerySet[Session]:
    return sessions.filter(team__name=team)


@dataclass
class ResultPage:
    """One page of results without counting them all: a COUNT(*) of a search that matches
    most of 100,000 sessions costs more than the page itself, so a page reads one row
    more than it shows to know whether there is a next one."""

    number: int
    object_list: list[Session]
    has_next: bool

    @classmethod
    def of(cls, sessions: QuerySet[Session], number: Any, size: int) -> ResultPage:
        try:
            page = max(1, min(int(number or 1), 10_000))
        except (TypeError, ValueError):
            page = 1
        rows = list(sessions[(page - 1) * size : page * size + 1])
        return cls(page, rows[:size], len(rows) > size)

    @property
    def has_previous(self) -> bool:
        return self.number > 1

    @property
    def has_other_pages(self) -> bool:
        return self.has_previous or self.has_next

    @property
    def previous_page_number(self) -> int:
        return self.number - 1

    @property
    def next_page_number(self) -> int:
        return self.number + 1


@dataclass(frozen=True)
class Snippet:
    seq: int
    kind: str
    html: SafeString


SNIPPET_WORDS = 12


def _highlight_in_python(session_ids: list[str], q: str, placeholders: str) -> dict[str, Snippet]:
    terms = [word.lower() for word in _WORD.findall(q)]
    if not terms:
        return {}
    sql = (
        "SELECT session_id, seq, kind, text FROM sessions_app_searchentry "  # noqa: S608 - placeholders only
        f"WHERE session_id IN ({placeholders}) ORDER BY session_id, seq"
    )
    found: dict[str, Snippet] = {}
    with connection.cursor() as cursor:
        cursor.execute(sql, session_ids)
        for session_id, seq, kind, text in cursor.fetchall():
            if session_id in found:
                continue
            marked = _mark_terms(text, terms)
            if marked is not None:
                found[session_id] = Snippet(seq, kind, highlight(marked))
    return found


def _mark_terms(text: str, terms: list[str]) -> str | None:
    """A window of `text` around its first word that starts with a search term (FTS5's
    porter stemmer matches "penguins" for "penguin": a prefix is the near equivalent),
    with every such word between the markers; None when no word matches."""
    words = text.split()
    hits = [
        i
        for i, word in enumerate(words)
        if any(token.lower().startswith(terms_) for token in _WORD.findall(word) for terms_ in terms)
    ]
    if not hits:
        return None
    start = max(0, hits[0] - SNIPPET_WORDS // 3)
    window = words[start : start + SNIPPET_WORDS]
    prefix = "… " if start else ""
    suffix = " …" if start + SNIPPET_WORDS < len(words) else ""

    def mark(found: re.Match[str]) -> str:
        token = found.group(0)
        return f"{MARK_START}{token}{MARK_END}" if any(token.lower().startswith(t) for t in terms) else token

    return prefix + _WORD.sub(mark, " ".join(window)) + suffix


def highlight(raw: str) -> SafeString:
    """Escape `raw`, then turn the database's markers into <mark> (and nothing else)."""
    escaped = str(escape(raw))
    return mark_safe(escaped.replace(MARK_START, "<mark>").replace(MARK_END, "</mark>"))  # noqa: S308 - escaped above


def snippets_for(session_ids: list[str], q: str) -> dict[str, Snippet]:
    """The first matching text of each session, highlighted (one query for a page)."""
    if not q or not session_ids:
        return {}
    placeholders = ", ".join(["%s"] * len(session_ids))
    if connection.vendor == "postgresql":
        options = f"StartSel={MARK_START},StopSel={MARK_END},MaxWords=24,MinWords=8,MaxFragments=1"
        sql = (
            "SELECT e.session_id, e.seq, e.kind, ts_headline('english'::regconfig, e.text, query, %s) "  # noqa: S608
            "FROM sessions_app_searchentry e, websearch_to_tsquery('english'::regconfig, %s) query "
            f"WHERE e.session_id IN ({placeholders}) "  # placeholders only
            "AND to_tsvector('english'::regconfig, e.text) @@ query ORDER BY e.session_id, e.seq"
        )
        params: list[Any] = [options, q, *session_ids]
    else:
        # FTS5's snippet() would evaluate the MATCH over the whole index before the
        # session filter applies; the page's own entries (a few per session, on the
        # (session, seq) index) are highlighted here instead, word by word.
        return _highlight_in_python(session_ids, q, placeholders)
    found: dict[str, Snippet] = {}
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        for session_id, seq, kind, text in cursor.fetchall():
            if session_id not in found:
                found[session_id] = Snippet(seq, kind, highlight(text))
    return found
