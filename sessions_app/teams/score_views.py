"""The Scores section of a team's page: its moderators define, change and delete the
team's own scores (sessions_app.review.scores); everyone with a role reads them."""

from __future__ import annotations

from typing import Any

from sessions_app.review import scores
from sessions_app.teams.views import team_change
from sessions_app.web import HtmxHttpRequest


def definition_from_form(post: Any, *, new: bool) -> dict[str, Any]:
    """A score definition from the form's fields, as the API takes it (empty fields left
    out, so a field that does not belong to the kind is refused only when filled)."""
    keys = (
        ("name", "kind", "labels", "minimum", "maximum", "description")
        if new
        else (
            "labels",
            "minimum",
            "maximum",
            "description",
        )
    )
    data: dict[str, Any] = {key: str(post.get(key) or "").strip() for key in keys}
    return {key: value for key, value in data.items() if value or key == "description"}


@team_change("scores")
def create_score(request: HtmxHttpRequest, name: str) -> str:
    score = scores.do_create_score(request.user, name, definition_from_form(request.POST, new=True))
    return f"Score {score.name} added."


@team_change("scores")
def update_score(request: HtmxHttpRequest, name: str, score: str) -> str:
    changed = scores.do_update_score(request.user, name, score, definition_from_form(request.POST, new=False))
    return f"Score {changed.name} saved."


@team_change("scores")
def delete_score(request: HtmxHttpRequest, name: str, score: str) -> str:
    scores.do_delete_score(request.user, name, score)
    return f"Score {score} deleted; ratings keep the values given with it."
