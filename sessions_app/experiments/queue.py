"""Pairwise review (docs/experiments.md, "Pairwise review"): an experiment's pairs sent
to a review queue, judged there blind, one pair item at a time.

Sending adds one queue item per (source session, candidate) pair, whose session is that
pair's replay session (so a pair is in a queue at most once, like any session) and whose
`pair` names the replay; the queue's round robin hands them out as it does sessions. A
reviewer opens a pair item by its id alone (the page and its address name no side: the
sides are A and B in the order `blind_flip` fixes per reviewer and pair), chooses A, B or
tie, may score each side with the team's own scores and leave a note; the verdict is
stored as what won and the scores by what each side is, and the item is done.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import Max, Q, QuerySet
from django.utils import timezone

from sectr.errors import Forbidden, NotFound, ValidationFailed
from sessions_app import access
from sessions_app.experiments import actions
from sessions_app.models import Experiment, PairVerdict, Replay, ReviewQueue, ReviewQueueItem
from sessions_app.review import actions as review


@dataclass
class Sent:
    """What sending did: the queue, how many pairs went in, and the experiment's pair
    items in that queue (those added now and any sent before)."""

    queue: ReviewQueue
    added: int
    items: list[ReviewQueueItem]


def _reviewers(team_name: str, reviewers: Any) -> list[Any]:
    if reviewers in (None, ""):
        return []
    if isinstance(reviewers, str):
        reviewers = [r.strip() for r in reviewers.split(",") if r.strip()]
    if not isinstance(reviewers, list) or not all(isinstance(r, str) and len(r) <= 150 for r in reviewers):
        raise ValidationFailed("reviewers is a list of usernames", code="reviewers")
    people = list(get_user_model().objects.filter(username__in=reviewers))
    missing = set(reviewers) - {p.get_username() for p in people}
    if missing:
        raise ValidationFailed(f"{sorted(missing)[0]} is not a reviewer of team {team_name}", code="reviewers")
    return people


def do_send_to_queue(
    actor: Any, experiment_id: Any, *, queue: Any = None, name: Any = None, reviewers: Any = None
) -> Sent:
    """Put every pair of the experiment in a queue of its team: `queue` (an id) or a new
    one (`name`, `reviewers` by username). By the team's moderators; pairs already in the
    queue stay as they are. All or nothing: a refused new queue leaves nothing behind."""
    experiment = actions.get_experiment_for_user(actor, experiment_id)  # NotFound for strangers
    if not access.can_moderate_team(actor, experiment.team):
        raise Forbidden("only the team's moderators send an experiment to a review queue")
    if name is not None and not isinstance(name, str):
        raise ValidationFailed("name is a new queue's name", code="name")
    if (queue in (None, "")) == (name in (None, "")):
        raise ValidationFailed("give either a queue's id or a new queue's name", code="queue")
    if queue not in (None, "") and reviewers not in (None, "", []):
        raise ValidationFailed("reviewers are given for a new queue only", code="reviewers")
    with transaction.atomic():
        if queue not in (None, ""):
            if isinstance(queue, str) and queue.isdigit():
                queue = int(queue)
            if not isinstance(queue, int) or isinstance(queue, bool):
                raise ValidationFailed("queue is a review queue's id", code="queue")
            target = review.get_queue_for_user(actor, queue)
            if target.team_id != experiment.team_id:
                raise ValidationFailed(f"the team {experiment.team.name} has no review queue {queue}", code="queue")
        else:
            people = _reviewers(experiment.team.name, reviewers)
            target = review.do_create_queue(actor, name, people, team=experiment.team.name)
        added = _add_pairs(actor, target, experiment.replays.order_by("pk"))
    items = list(pair_items(target, experiment))
    return Sent(target, added, items)


def _add_pairs(actor: Any, queue: ReviewQueue, replays: Iterable[Replay]) -> int:
    """The round robin of sessions_app.review.actions.do_add_to_queue, for pairs: the
    queue row locked, positions after the last, assignees going on from the last one."""
    locked = ReviewQueue.objects.select_for_update().get(pk=queue.pk)
    present = set(ReviewQueueItem.objects.filter(queue=queue).values_list("session_id", flat=True))
    fresh = [r for r in replays if r.session_id not in present]
    start = (ReviewQueueItem.objects.filter(queue=queue).aggregate(m=Max("position"))["m"] or 0) + 1
    assignees = review.next_reviewers(list(queue.reviewers.order_by("pk")), locked.last_assignee_id)
    items = [
        ReviewQueueItem(
            queue=queue,
            session_id=r.session_id,
            pair=r,
            position=start + i,
            assignee=next(assignees),
            added_by=actor,
        )
        for i, r in enumerate(fresh)
    ]
    ReviewQueueItem.objects.bulk_create(items)
    if items and items[-1].assignee is not None:
        ReviewQueue.objects.filter(pk=queue.pk).update(last_assignee=items[-1].assignee)
    return len(items)


def pair_items(queue: ReviewQueue, experiment: Experiment) -> QuerySet[ReviewQueueItem]:
    return (
        ReviewQueueItem.objects.filter(queue=queue, pair__experiment=experiment)
        .select_related("pair", "assignee")
        .order_by("position")
    )


# ---- judging ----


def get_pair_item_for_user(actor: Any, item_id: Any) -> ReviewQueueItem:
    """A pair item its queue's people may judge: its assignee (or anyone the queue serves,
    when nobody is), the queue's creator and the team's moderators; NotFound for everyone
    else, outsiders and the team's other members alike."""
    if not isinstance(item_id, int) or isinstance(item_id, bool):
        raise NotFound("no such pair")
    item = (
        ReviewQueueItem.objects.select_related("pair__experiment__team", "pair__source", "queue")
        .filter(pk=item_id, pair__isnull=False)
        .first()
    )
    if item is None:
        raise NotFound("no such pair")
    queue = review.get_queue_for_user(actor, item.queue_id)  # NotFound for strangers
    if not review.queue_items_for(actor, queue).filter(pk=item.pk).exists():
        raise NotFound("no such pair")
    item.queue = queue
    return item


def sides_of(experiment: Experiment, replay: Replay, reviewer: Any) -> tuple[str, str]:
    """What A and B are for this reviewer and pair."""
    if actions.blind_flip(experiment, replay.source_id, replay.candidate, reviewer):
        return PairVerdict.CANDIDATE, PairVerdict.BASELINE
    return PairVerdict.BASELINE, PairVerdict.CANDIDATE


def do_judge_item(
    actor: Any, item_id: Any, choice: Any, *, a_scores: Any = None, b_scores: Any = None, note: Any = ""
) -> PairVerdict:
    """A blind verdict on a pair item, given as the sides seen (`a`, `b`, `tie`, and each
    side's scores), stored as what won and the scores by side; the item is then done.
    Again: replaces the reviewer's earlier verdict on that pair."""
    item = get_pair_item_for_user(actor, item_id)
    replay = item.pair
    assert replay is not None
    experiment = replay.experiment
    if choice not in ("a", "b", "tie"):
        raise ValidationFailed("choose a, b or tie", code="invalid_choice")
    side_a, side_b = sides_of(experiment, replay, actor)
    winner = PairVerdict.TIE if choice == "tie" else side_a if choice == "a" else side_b
    checked: dict[str, dict[str, Any]] = {}
    for letter, side, values in (("A", side_a, a_scores), ("B", side_b, b_scores)):
        if values in (None, "", {}):
            continue
        try:
            checked.update(actions.check_pair_scores(experiment.team_id, {side: values}))
        except ValidationFailed as exc:
            # Named as the reviewer sees the side, never as what it is.
            raise ValidationFailed(f"Scores for {letter}: {exc.message}", code=exc.code) from None
    with transaction.atomic():
        verdict = actions.save_verdict(actor, experiment, replay, winner, note, checked)
        ReviewQueueItem.objects.filter(pk=item.pk).update(done_at=timezone.now())
    return verdict


def next_open_item(actor: Any, queue: ReviewQueue, after: int = 0) -> ReviewQueueItem | None:
    """The reviewer's next open item of the queue (after position `after`, else from the
    start): their own or nobody's, in order."""
    items = review.queue_items_for(actor, queue).filter(done_at__isnull=True)
    for chosen in (items.filter(Q(assignee_id=actor.pk) | Q(assignee__isnull=True)), items):
        found = chosen.filter(position__gt=after).first() or chosen.first()
        if found is not None:
            return found
    return None
