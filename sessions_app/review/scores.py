"""A team's scores: what its reviewers rate sessions and messages with.

Every team has the built-in scores (thumbs up/down and a score from 1 to 5, the ratings
Sectr always had: they stay in their own columns of `Rating`, so old ratings read as
before), and its moderators add their own (`ScoreConfig`): categorical (one of a list
of labels), numeric (a number in a range) or boolean. A rating stores a team score's
value under its name in `Rating.values`; a value is checked against the definition when
it is given, and a definition changed or deleted later leaves stored values as they were.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import QuerySet

from sectr.errors import NotFound, SectrError, ValidationFailed
from sessions_app import access
from sessions_app.actions.members import moderated_team
from sessions_app.actions.teams import get_team_for_user
from sessions_app.models import Rating, ScoreConfig, Team

MAX_SCORES_PER_TEAM = 50
MAX_LABELS = 20
MAX_LABEL = 40
MAX_DESCRIPTION = 500
NAME = re.compile(r"^[a-z][a-z0-9_-]{0,39}$")
KINDS = (ScoreConfig.CATEGORICAL, ScoreConfig.NUMERIC, ScoreConfig.BOOLEAN)


@dataclass(frozen=True)
class ScoreDef:
    """One score a rating may carry: a team's own (a ScoreConfig) or a built-in one."""

    name: str
    kind: str
    description: str = ""
    labels: tuple[str, ...] = ()
    minimum: float | None = None
    maximum: float | None = None
    built_in: bool = False
    id: int | None = None

    @classmethod
    def of(cls, config: ScoreConfig) -> ScoreDef:
        return cls(
            name=config.name,
            kind=config.kind,
            description=config.description,
            labels=tuple(config.labels or ()),
            minimum=config.minimum,
            maximum=config.maximum,
            id=config.pk,
        )

    @property
    def range_text(self) -> str:
        if self.kind == ScoreConfig.NUMERIC:
            return f"{number_text(self.minimum)} to {number_text(self.maximum)}"
        if self.kind == ScoreConfig.CATEGORICAL:
            return ", ".join(self.labels)
        return "yes or no"

    @property
    def step(self) -> str:
        """The number input's step: whole numbers when both ends are whole."""
        whole = all(v is not None and float(v).is_integer() for v in (self.minimum, self.maximum))
        return "1" if whole else "any"

    def as_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"name": self.name, "kind": self.kind, "description": self.description}
        if self.kind == ScoreConfig.CATEGORICAL:
            data["labels"] = list(self.labels)
        if self.kind == ScoreConfig.NUMERIC:
            data["minimum"] = plain_number(self.minimum)
            data["maximum"] = plain_number(self.maximum)
        data["built_in"] = self.built_in
        return data


#: The scores every team has: a rating's `thumbs` (true: up) and `score` columns.
THUMBS = ScoreDef("thumbs", ScoreConfig.BOOLEAN, "Thumbs up (yes) or down (no)", built_in=True)
STARS = ScoreDef("score", ScoreConfig.NUMERIC, "Overall, from 1 (poor) to 5 (excellent)", (), 1, 5, built_in=True)
BUILT_IN = (THUMBS, STARS)
BUILT_IN_NAMES = frozenset(s.name for s in BUILT_IN)


def plain_number(value: float | None) -> int | float | None:
    if value is None:
        return None
    return int(value) if float(value).is_integer() else float(value)


def number_text(value: float | None) -> str:
    return str(plain_number(value)) if value is not None else "?"


def team_scores(team_id: int | None) -> list[ScoreDef]:
    """The built-in scores, then the team's own by name (a personal session: built-in only)."""
    own = ScoreConfig.objects.filter(team_id=team_id).order_by("name") if team_id is not None else []
    return [*BUILT_IN, *(ScoreDef.of(c) for c in own)]


def custom_scores(team_id: int | None) -> list[ScoreDef]:
    return [s for s in team_scores(team_id) if not s.built_in]


# ---- definitions ----


def _number(value: Any, what: str) -> float:
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise ValidationFailed(f"{what} must be a number", code="invalid_score") from None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValidationFailed(f"{what} must be a number", code="invalid_score")
    return float(value)


def _labels(value: Any) -> list[str]:
    if isinstance(value, str):
        value = [part.strip() for part in value.split(",")]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValidationFailed("labels must be a list of words", code="invalid_score")
    labels = list(dict.fromkeys(v.strip() for v in value if v.strip()))
    if not 2 <= len(labels) <= MAX_LABELS or any(len(v) > MAX_LABEL for v in labels):
        raise ValidationFailed(
            f"a categorical score needs 2 to {MAX_LABELS} labels of at most {MAX_LABEL} characters",
            code="invalid_score",
        )
    return labels


def check_definition(data: Any, *, kind: str | None = None) -> dict[str, Any]:
    """The fields of a score definition (name, kind, labels, minimum, maximum,
    description); `kind` given means an update, whose name and kind stay."""
    if not isinstance(data, dict):
        raise ValidationFailed("a score is a JSON object", code="invalid_score")
    unknown = set(data) - {"name", "kind", "labels", "minimum", "maximum", "description"}
    if unknown:
        raise ValidationFailed(f"unknown field {sorted(unknown)[0]!r}", code="invalid_score")
    fields: dict[str, Any] = {}
    if kind is None:
        name = data.get("name")
        if not isinstance(name, str) or not NAME.match(name):
            raise ValidationFailed(
                "a score's name is 1 to 40 lower-case letters, digits, - or _, starting with a letter",
                code="invalid_score",
            )
        if name in BUILT_IN_NAMES:
            raise ValidationFailed(f"{name!r} is a built-in score", code="invalid_score")
        kind = data.get("kind")
        if kind not in KINDS:
            raise ValidationFailed("kind must be categorical, numeric or boolean", code="invalid_score")
        fields.update(name=name, kind=kind)
    elif data.get("name") is not None or data.get("kind") is not None:
        raise ValidationFailed("a score's name and kind do not change (make a new score)", code="invalid_score")
    description = data.get("description") if data.get("description") is not None else ""
    if not isinstance(description, str) or len(description) > MAX_DESCRIPTION:
        raise ValidationFailed(f"the description is text of at most {MAX_DESCRIPTION} characters", code="invalid_score")
    fields["description"] = description.strip()
    if kind == ScoreConfig.CATEGORICAL:
        fields["labels"] = _labels(data.get("labels"))
    elif data.get("labels") not in (None, [], ""):
        raise ValidationFailed("only a categorical score has labels", code="invalid_score")
    if kind == ScoreConfig.NUMERIC:
        if data.get("minimum") in (None, "") or data.get("maximum") in (None, ""):
            raise ValidationFailed("a numeric score needs a minimum and a maximum", code="invalid_score")
        low, high = _number(data["minimum"], "minimum"), _number(data["maximum"], "maximum")
        if not low < high:
            raise ValidationFailed("the minimum must be below the maximum", code="invalid_score")
        fields.update(minimum=low, maximum=high)
    elif any(data.get(k) not in (None, "") for k in ("minimum", "maximum")):
        raise ValidationFailed("only a numeric score has a minimum and a maximum", code="invalid_score")
    return fields


def _moderated_team(actor: Any, team_name: str) -> Team:
    return moderated_team(actor, team_name, "its scores")  # 404 for strangers, 403 for readers


def list_scores(actor: Any, team_name: str) -> list[ScoreDef]:
    """The team's scores, for anyone with a role in it."""
    return team_scores(get_team_for_user(actor, team_name).pk)


def _get_config(team: Team, name: str) -> ScoreConfig:
    config = ScoreConfig.objects.filter(team=team, name=name).first() if isinstance(name, str) else None
    if config is None:
        if name in BUILT_IN_NAMES:
            raise ValidationFailed(f"{name!r} is a built-in score and does not change", code="invalid_score")
        raise NotFound("no such score")
    return config


def do_create_score(actor: Any, team_name: str, data: Any) -> ScoreDef:
    team = _moderated_team(actor, team_name)
    fields = check_definition(data)
    try:
        with transaction.atomic():
            Team.objects.select_for_update().filter(pk=team.pk).first()
            if ScoreConfig.objects.filter(team=team).count() >= MAX_SCORES_PER_TEAM:
                raise ValidationFailed(f"a team has at most {MAX_SCORES_PER_TEAM} scores", code="invalid_score")
            config = ScoreConfig.objects.create(team=team, created_by=actor.get_username(), **fields)
    except IntegrityError:
        raise SectrError(
            f"team {team.name} has a score named {fields['name']!r} already", code="score_exists", status=409
        ) from None
    return ScoreDef.of(config)


def do_update_score(actor: Any, team_name: str, name: str, data: Any) -> ScoreDef:
    """Change a score's description, labels or range; fields left out keep their values."""
    team = _moderated_team(actor, team_name)
    config = _get_config(team, name)
    if not isinstance(data, dict):
        raise ValidationFailed("a score is a JSON object", code="invalid_score")
    kept: dict[str, Any] = {"description": config.description}
    if config.kind == ScoreConfig.CATEGORICAL:
        kept["labels"] = config.labels
    if config.kind == ScoreConfig.NUMERIC:
        kept.update(minimum=config.minimum, maximum=config.maximum)
    given = {key: value for key, value in data.items() if value is not None}
    fields = check_definition({**kept, **given}, kind=config.kind)
    for key, value in fields.items():
        setattr(config, key, value)
    config.save(update_fields=list(fields))
    return ScoreDef.of(config)


def do_delete_score(actor: Any, team_name: str, name: str) -> None:
    """The definition goes; ratings keep the values they were given (shown as stored)."""
    team = _moderated_team(actor, team_name)
    _get_config(team, name).delete()


# ---- values ----


def check_value(score: ScoreDef, raw: Any) -> Any:
    """A value of `score` as stored: a label, a number, or true/false; ValidationFailed
    (naming the score) for anything else."""
    if score.kind == ScoreConfig.BOOLEAN:
        if raw in (True, "true", "yes", "1", 1, "up"):
            return True
        if raw in (False, "false", "no", "0", 0, "down"):
            return False
        raise ValidationFailed(f"{score.name} is yes or no", code="invalid_value")
    if score.kind == ScoreConfig.CATEGORICAL:
        if not isinstance(raw, str) or raw not in score.labels:
            raise ValidationFailed(f"{score.name} is one of: {', '.join(score.labels)}", code="invalid_value")
        return raw
    try:
        number = _number(raw, score.name)
    except ValidationFailed:
        raise ValidationFailed(f"{score.name} is a number from {score.range_text}", code="invalid_value") from None
    low = score.minimum if score.minimum is not None else -math.inf
    high = score.maximum if score.maximum is not None else math.inf
    if not low <= number <= high or (score.step == "1" and not number.is_integer()):
        raise ValidationFailed(f"{score.name} is a number from {score.range_text}", code="invalid_value")
    return plain_number(number)


def check_values(team_id: int | None, values: Any) -> dict[str, Any]:
    """{name: value} for the team's own scores; unknown names and bad values refused,
    empty values ("" or None) left out."""
    if values in (None, ""):
        return {}
    if not isinstance(values, dict):
        raise ValidationFailed("scores are an object of score name to value", code="invalid_value")
    known = {s.name: s for s in custom_scores(team_id)}
    checked: dict[str, Any] = {}
    for name, raw in values.items():
        if name in BUILT_IN_NAMES:
            raise ValidationFailed(f"give {name} as its own field", code="invalid_value")
        score = known.get(name)
        if score is None:
            raise ValidationFailed(f"this team has no score named {name!r}", code="invalid_value")
        if raw in (None, ""):
            continue
        checked[name] = check_value(score, raw)
    return checked


def value_text(value: Any) -> str:
    if value is True:
        return "yes"
    if value is False:
        return "no"
    return str(value)


def rating_values(rating: Rating) -> list[tuple[str, str]]:
    """(score name, value as text) of every score a rating carries, built-in ones first."""
    shown: list[tuple[str, str]] = []
    if rating.thumbs:
        shown.append(("thumbs", "up" if rating.thumbs > 0 else "down"))
    if rating.score is not None:
        shown.append(("score", f"{rating.score}/5"))
    shown += [(name, value_text(value)) for name, value in sorted((rating.values or {}).items())]
    return shown


def rating_record(rating: Rating) -> dict[str, Any]:
    """A rating as the API and the JSON export give it."""
    scores: dict[str, Any] = {}
    if rating.thumbs:
        scores["thumbs"] = rating.thumbs > 0
    if rating.score is not None:
        scores["score"] = rating.score
    scores.update(rating.values or {})
    return {
        "id": rating.pk,
        "seq": rating.seq,
        "message_id": rating.message_id or None,
        "author": rating.author.get_username(),
        "source": rating.source,
        "scores": scores,
        "tags": list(rating.tags or []),
        "comment": rating.comment,
        "updated_at": rating.updated_at.isoformat(),
    }


# ---- summaries (the review dashboard) ----


@dataclass
class ScoreSummary:
    """How often a score was given in some ratings, and what: a count per label (yes/no
    for a boolean), or the average of the numbers."""

    name: str
    kind: str
    count: int = 0
    total: float = 0.0
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def average(self) -> float | None:
        return self.total / self.count if self.kind == ScoreConfig.NUMERIC and self.count else None

    def add(self, value: Any) -> None:
        self.count += 1
        if self.kind == ScoreConfig.NUMERIC and isinstance(value, int | float) and not isinstance(value, bool):
            self.total += float(value)
        else:
            label = value_text(value)
            self.counts[label] = self.counts.get(label, 0) + 1


def summarize(ratings: Iterable[Rating], definitions: Iterable[ScoreDef]) -> list[ScoreSummary]:
    """One summary per score defined (in order, with every label counted, if only 0) and
    per other score found in the ratings."""
    summaries: dict[str, ScoreSummary] = {}
    for d in definitions:
        labels = ("up", "down") if d is THUMBS else ("yes", "no") if d.kind == ScoreConfig.BOOLEAN else d.labels
        summaries[d.name] = ScoreSummary(d.name, d.kind, counts=dict.fromkeys(labels, 0))
    for rating in ratings:
        found: dict[str, Any] = dict(rating.values or {})
        if rating.thumbs:
            found["thumbs"] = "up" if rating.thumbs > 0 else "down"
        if rating.score is not None:
            found["score"] = rating.score
        for name, value in found.items():
            if name not in summaries:
                number = isinstance(value, int | float) and not isinstance(value, bool)
                summaries[name] = ScoreSummary(name, ScoreConfig.NUMERIC if number else ScoreConfig.CATEGORICAL)
            summaries[name].add(value)
    return list(summaries.values())


def reviewer_ratings_for(user: Any, team: str = "") -> QuerySet[Rating]:
    """Reviewers' ratings of the sessions `user` may review (of one team by name, if given)."""
    sessions = access.reviewable_sessions(user)
    if team:
        sessions = sessions.filter(team__name=team)
    return Rating.objects.filter(source=Rating.REVIEWER, session__in=sessions.values("pk"))


@dataclass
class Dashboard:
    """The review dashboard's part on scores: per score, how often and what was given."""

    summaries: list[ScoreSummary]
    ratings: int


def dashboard(user: Any, date_from: date, date_to: date, team: str = "") -> Dashboard:
    """Reviewers' ratings saved from `date_from` to `date_to` (whole days, UTC) of the
    sessions `user` may review, summarised per score: the built-in ones, the own scores
    of the teams `user` reviews (or of `team`), and any other score found."""
    start = datetime.combine(date_from, time.min, tzinfo=UTC)
    end = datetime.combine(date_to + timedelta(days=1), time.min, tzinfo=UTC)
    rows = reviewer_ratings_for(user, team).filter(updated_at__gte=start, updated_at__lt=end)
    teams = access.teams_for(user, "reviewer")
    if team:
        teams = teams.filter(name=team)
    own = ScoreConfig.objects.filter(team__in=teams).order_by("name")
    definitions = list(BUILT_IN) + list({c.name: ScoreDef.of(c) for c in own}.values())
    values = rows.order_by("pk").values_list("thumbs", "score", "values")
    ratings = [Rating(thumbs=t, score=s, values=v) for t, s, v in values]
    return Dashboard(summarize(ratings, definitions), len(ratings))


def score_names_for(user: Any) -> list[str]:
    """The built-in scores' names, then the own scores of the teams `user` reviews (the
    review search's `Score` filter offers these)."""
    own = (
        ScoreConfig.objects.filter(team__in=access.teams_for(user, "reviewer"))
        .values_list("name", flat=True)
        .distinct()
        .order_by("name")
    )
    return [*BUILT_IN_NAMES_ORDERED, *(name for name in own if name not in BUILT_IN_NAMES)]


BUILT_IN_NAMES_ORDERED = tuple(s.name for s in BUILT_IN)
