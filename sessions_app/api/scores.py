"""The scores API (docs/review.md, "Scores"): a team's scores (its moderators define
them) and reviewers' ratings of a session or one of its messages. Thin: parse, call an
action, shape the answer."""

from __future__ import annotations

from typing import Any

from asgiref.sync import sync_to_async
from django.http import HttpResponse

from sectr.errors import ValidationFailed
from sessions_app import access
from sessions_app.api.views import ApiCall, check_fields, check_id, json_response, optional
from sessions_app.models import Rating
from sessions_app.review import actions, scores

SCORE_FIELDS = ("name", "kind", "labels", "minimum", "maximum", "description")
RATING_FIELDS = ("message_id", "scores", "tags", "comment")


async def list_scores(call: ApiCall, name: str) -> HttpResponse:
    def read() -> dict[str, Any]:
        return {"team": name, "scores": [s.as_dict() for s in scores.list_scores(call.user, name)]}

    return json_response(await sync_to_async(read)())


async def create_score(call: ApiCall, name: str) -> HttpResponse:
    def create() -> dict[str, Any]:
        return scores.do_create_score(call.user, name, call.body).as_dict()

    return json_response(await sync_to_async(create)(), status=201)


async def update_score(call: ApiCall, name: str, score: str) -> HttpResponse:
    def update() -> dict[str, Any]:
        return scores.do_update_score(call.user, name, score, call.body).as_dict()

    return json_response(await sync_to_async(update)())


async def delete_score(call: ApiCall, name: str, score: str) -> HttpResponse:
    await sync_to_async(scores.do_delete_score)(call.user, name, score)
    return HttpResponse(status=204)


def _ratings(user: Any, session_id: str) -> dict[str, Any]:
    session = access.get_session_for_user(user, session_id, "review")
    rows = Rating.objects.filter(session=session, source=Rating.REVIEWER).select_related("author")
    return {
        "session": session.pk,
        "scores": [s.as_dict() for s in scores.team_scores(session.team_id)],
        "ratings": [scores.rating_record(r) for r in rows.order_by("seq", "created_at", "pk")],
    }


async def list_ratings(call: ApiCall, session_id: str) -> HttpResponse:
    check_id(session_id, "session")
    return json_response(await sync_to_async(_ratings)(call.user, session_id))


async def rate(call: ApiCall, session_id: str) -> HttpResponse:
    """Save the caller's rating of the session (or of `message_id`): `scores` by name,
    the built-in `thumbs` (true: up) and `score` (1-5) among them."""
    check_id(session_id, "session")
    body = call.body
    check_fields(body, *RATING_FIELDS)
    given = optional(body, "scores", dict) or {}
    message_id = optional(body, "message_id", str) or ""
    tags = optional(body, "tags", list) or []
    comment = optional(body, "comment", str, allow_empty=True) or ""
    own = {key: value for key, value in given.items() if key not in scores.BUILT_IN_NAMES}
    thumbs = given.get("thumbs")
    if thumbs is not None and not isinstance(thumbs, bool):
        raise ValidationFailed("thumbs is true (up) or false (down)", code="invalid_value")

    def save() -> dict[str, Any]:
        rating = actions.do_rate(
            call.user,
            session_id,
            thumbs=None if thumbs is None else ("up" if thumbs else "down"),
            message_id=message_id,
            score=given.get("score"),
            tags=tags,
            comment=comment,
            values=own,
        )
        return scores.rating_record(Rating.objects.select_related("author").get(pk=rating.pk))

    return json_response(await sync_to_async(save)())
