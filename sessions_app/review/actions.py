"""Every state change of team review: check_* validates, do_* writes once, atomically.

Ratings, the reviewed mark, review queues and share links are people's judgements about
a session, not part of it: they live beside the journal (sessions_app.models), never in
it, so rating or sharing a session changes nothing its owner or the model sees.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, NamedTuple

from django.db import IntegrityError, transaction
from django.db.models import Count, Max, Q, QuerySet
from django.utils import timezone

from sectr.errors import Forbidden, NotFound, SectrError, ValidationFailed
from sessions_app import access
from sessions_app.models import (
    Envelope,
    Membership,
    Rating,
    ReviewMark,
    ReviewNote,
    ReviewQueue,
    ReviewQueueItem,
    Session,
    ShareLink,
    Team,
)
from sessions_app.review import scores

MAX_TAGS = 10
MAX_TAG = 40
MAX_COMMENT = 10_000
MAX_SHARE_DAYS = 365


# ---- ratings ----


def check_rating(
    thumbs: Any, score: Any, tags: Any, comment: Any, *, required: bool = True
) -> tuple[int | None, int | None, list[str], str]:
    """The built-in parts of a rating; thumbs may be left out (None) when not `required`
    (a reviewer's rating may carry only the team's own scores)."""
    if thumbs in ("up", "+1", 1, "1", True, "true", "yes"):
        value: int | None = 1
    elif thumbs in ("down", "-1", -1, False, "false", "no"):
        value = -1
    elif thumbs in (None, "") and not required:
        value = None
    else:
        raise ValidationFailed("a rating needs thumbs up or down", code="thumbs")
    if score in (None, ""):
        number: int | None = None
    else:
        try:
            number = int(score)
        except (TypeError, ValueError):
            raise ValidationFailed("the score must be a whole number from 1 to 5", code="score") from None
        if not 1 <= number <= 5 or isinstance(score, bool) or (isinstance(score, float) and not score.is_integer()):
            raise ValidationFailed("the score must be a whole number from 1 to 5", code="score")
    if isinstance(tags, str):
        tags = [t for t in (part.strip() for part in tags.split(",")) if t]
    if tags is None:
        tags = []
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise ValidationFailed("tags must be a list of words", code="tags")
    tags = list(dict.fromkeys(t.strip() for t in tags if t.strip()))
    if len(tags) > MAX_TAGS or any(len(t) > MAX_TAG for t in tags):
        raise ValidationFailed(f"at most {MAX_TAGS} tags of at most {MAX_TAG} characters", code="tags")
    text = str(comment or "").strip()
    if len(text) > MAX_COMMENT:
        raise ValidationFailed(f"the comment is longer than {MAX_COMMENT} characters", code="comment")
    return value, number, tags, text


def message_end_seq(session: Session, message_id: str) -> int:
    """The MESSAGE_END seq of an assistant message of `session` (what a message rating pins)."""
    seq = (
        Envelope.objects.filter(session=session, type="MESSAGE_END", payload__message_id=message_id)
        .values_list("seq", flat=True)
        .first()
    )
    if seq is None:
        raise NotFound("no such message in this session")
    return int(seq)


def _save_rating(
    actor: Any,
    session: Session,
    source: str,
    message_id: str,
    thumbs: Any,
    score: Any,
    tags: Any,
    comment: Any,
    values: Any = None,
) -> Rating:
    own = scores.check_values(session.team_id, values)
    value, number, tag_list, text = check_rating(thumbs, score, tags, comment, required=source == Rating.END_USER)
    if value is None and number is None and not own:
        raise ValidationFailed("a rating needs at least one score (thumbs, 1-5 or one of the team's)", code="scores")
    if message_id and not isinstance(message_id, str):
        raise ValidationFailed("message_id is a message's id", code="message_id")
    seq = message_end_seq(session, message_id) if message_id else 0
    now = timezone.now()
    # What an update writes; a new rating also gets its created_at.
    given: dict[str, Any] = {
        "message_id": message_id,
        "thumbs": value,
        "score": number,
        "tags": tag_list,
        "comment": text,
        "values": own,
        "updated_at": now,
    }
    with transaction.atomic():
        rating, _ = Rating.objects.update_or_create(
            session=session,
            seq=seq,
            author=actor,
            source=source,
            defaults=given,
            create_defaults={**given, "created_at": now},
        )
    return rating


def do_rate(
    actor: Any,
    session_id: str,
    *,
    thumbs: Any,
    message_id: str = "",
    score: Any = None,
    tags: Any = "",
    comment: Any = "",
    values: Any = None,
) -> Rating:
    """A reviewer's rating of a session (message_id "") or one assistant message, with
    thumbs, the 1-5 score and/or the team's own scores (`values`, by name: at least one
    of them); rating the same thing again replaces the reviewer's earlier rating."""
    session = access.get_session_for_user(actor, session_id, "review")
    return _save_rating(actor, session, Rating.REVIEWER, message_id, thumbs, score, tags, comment, values)


def do_end_user_feedback(actor: Any, session_id: str, message_id: str, thumbs: Any) -> Rating:
    """The chat page's own thumbs on an assistant message, by someone who may write the
    session (its owner): stored apart from reviewers' ratings (source end_user)."""
    session = access.get_session_for_user(actor, session_id, "write")
    return _save_rating(actor, session, Rating.END_USER, message_id, thumbs, None, [], "")


def do_set_reviewed(actor: Any, session_id: str, reviewed: bool) -> bool:
    session = access.get_session_for_user(actor, session_id, "review")
    with transaction.atomic():
        if reviewed:
            ReviewMark.objects.update_or_create(
                session=session, defaults={"reviewed_by": actor, "reviewed_at": timezone.now()}
            )
        else:
            ReviewMark.objects.filter(session=session).delete()
    return reviewed


MAX_NOTE = 10_000


def do_add_note(actor: Any, session_id: str, body: Any, seq: int | None = None) -> ReviewNote:
    session = access.get_session_for_user(actor, session_id, "review")
    text = str(body or "").strip()
    if not 1 <= len(text) <= MAX_NOTE:
        raise ValidationFailed(f"a note needs 1 to {MAX_NOTE} characters", code="note")
    return ReviewNote.objects.create(session=session, author=actor, body=text, seq=seq)


# ---- queues ----
#
# A queue belongs to one team, and everything about it follows that team's roles: its
# reviewers and moderators (and staff) may be given it; among them its creator, the
# reviewers it names and the team's moderators see it, list it, count it and work it; only
# the team's sessions go in it, only the team's reviewers are assigned to it. Everyone else
# gets NotFound, as for a session they may not read. A role in some other team counts for
# nothing here.


def is_queue_moderator(user: Any, queue: ReviewQueue) -> bool:
    """A moderator of the queue's team (or staff): sees and works every item of it."""
    return access.has_team_role(user, queue.team_id, "moderator") or access.is_staff(user)


def queues_for(user: Any) -> QuerySet[ReviewQueue]:
    """The queues `user` may open (get_queue_for_user), as one query: for lists and counts."""
    if access.is_staff(user):
        return ReviewQueue.objects.all()
    if user is None or not user.is_authenticated:
        return ReviewQueue.objects.none()
    roles = Membership.objects.filter(user_id=user.pk)
    reviewing = roles.filter(role__in=(Membership.REVIEWER, Membership.MODERATOR)).values("team_id")
    moderating = roles.filter(role=Membership.MODERATOR).values("team_id")
    named = ReviewQueue.reviewers.through.objects.filter(user_id=user.pk).values("reviewqueue_id")
    return ReviewQueue.objects.filter(team_id__in=reviewing).filter(
        Q(team_id__in=moderating) | Q(created_by_id=user.pk) | Q(pk__in=named)
    )


def check_queue_name(name: Any) -> str:
    text = str(name or "").strip()
    if not 1 <= len(text) <= 100:
        raise ValidationFailed("a queue needs a name of 1 to 100 characters", code="name")
    return text


def check_queue_team(actor: Any, team: Any) -> Team:
    """The team a new queue of `actor` belongs to: `team` by name, where the actor reviews
    or moderates (staff: any); None or "" means their one such team, if they have one."""
    reviewing = access.teams_for(actor, "reviewer").order_by("name")
    if team in (None, ""):
        teams = list(reviewing[:2])
        if len(teams) != 1:
            raise ValidationFailed("choose the team the queue is for", code="team")
        return teams[0]
    found = reviewing.filter(name=team).first() if isinstance(team, str) and len(team) <= 64 else None
    if found is None:
        raise ValidationFailed("you review no team of that name", code="team")
    return found


def check_queue_reviewers(team: Team, people: Iterable[Any], code: str = "reviewers") -> list[Any]:
    """`people` if every one reviews or moderates `team` (staff included); ValidationFailed otherwise."""
    chosen = list(people)
    for person in chosen:
        if person is None or not access.has_team_role(person, team.pk, "reviewer"):
            name = person.get_username() if person is not None else "nobody"
            raise ValidationFailed(f"{name} is not a reviewer of team {team.name}", code=code)
    return chosen


def do_create_queue(actor: Any, name: Any, reviewers: Iterable[Any] = (), team: Any = None) -> ReviewQueue:
    """A queue of `team` (by name; default: the actor's one team where they review)."""
    text = check_queue_name(name)
    home = check_queue_team(actor, team)
    people = check_queue_reviewers(home, reviewers)
    try:
        with transaction.atomic():
            queue = ReviewQueue.objects.create(team=home, name=text, created_by=actor)
            queue.reviewers.set(people)
    except IntegrityError:
        raise SectrError(
            f"team {home.name} has a queue named {text!r} already", code="queue_exists", status=409
        ) from None
    return queue


def get_queue_for_user(actor: Any, queue_id: int) -> ReviewQueue:
    """A queue its team's moderators, its creator and its reviewers may work with, while
    they review or moderate its team; NotFound for everyone else."""
    queue = ReviewQueue.objects.select_related("team").filter(pk=queue_id).first()
    if queue is None:
        raise NotFound("no such queue")
    if access.is_staff(actor):
        return queue
    if not access.has_team_role(actor, queue.team_id, "reviewer"):
        raise NotFound("no such queue")
    if not (
        is_queue_moderator(actor, queue)
        or queue.created_by_id == actor.pk
        or queue.reviewers.filter(pk=actor.pk).exists()
    ):
        raise NotFound("no such queue")
    return queue


class Added(NamedTuple):
    """What an add did: how many went in, how many were there already, and who got
    the new ones (username: count, in the order they were handed out; "" for nobody)."""

    added: int
    duplicates: int
    assigned: dict[str, int]


def next_reviewers(reviewers: list[Any], last_id: int | None) -> Iterator[Any]:
    """The round robin over `reviewers` (ordered by pk), going on after the one with
    pk `last_id` (or from the first, when that one is gone or was never set)."""
    if not reviewers:
        return itertools.repeat(None)
    start = next((i + 1 for i, r in enumerate(reviewers) if r.pk == last_id), 0)
    if last_id is not None and start == 0:  # the last assignee left the queue: go on after their place
        start = next((i for i, r in enumerate(reviewers) if r.pk > last_id), 0)
    return itertools.islice(itertools.cycle(reviewers), start % len(reviewers), None)


def do_add_to_queue(actor: Any, queue_id: int, sessions: Iterable[Session]) -> Added:
    """Put sessions of the queue's team in it, assigned in turn to its reviewers
    (unassigned when it has none), going on from whoever got the last item of an earlier
    add. Sessions already in it are refused (skipped), never doubled; sessions of other
    teams (or none) are never added. Takes the queue row lock, so two people adding at
    once number their items without gaps or clashes and share one round robin."""
    with transaction.atomic():
        queue = get_queue_for_user(actor, queue_id)
        locked = ReviewQueue.objects.select_for_update().filter(pk=queue.pk).first()
        last_id = locked.last_assignee_id if locked is not None else None
        # One query for the whole batch (a search may put thousands in): what `actor` may
        # review, of the queue's team.
        wanted = [s.pk for s in sessions]
        candidates: list[Session] = []
        if queue.team_id is not None:  # (a queue from before teams, staff's, takes no more)
            candidates = list(access.reviewable_sessions(actor).filter(pk__in=wanted, team_id=queue.team_id))
        present = set(
            ReviewQueueItem.objects.filter(queue=queue, session__in=[s.pk for s in candidates]).values_list(
                "session_id", flat=True
            )
        )
        fresh = [s for s in dict((s.pk, s) for s in candidates).values() if s.pk not in present]
        start = (ReviewQueueItem.objects.filter(queue=queue).aggregate(m=Max("position"))["m"] or 0) + 1
        assignees = next_reviewers(list(queue.reviewers.order_by("pk")), last_id)
        items = [
            ReviewQueueItem(queue=queue, session=s, position=start + i, assignee=next(assignees), added_by=actor)
            for i, s in enumerate(fresh)
        ]
        ReviewQueueItem.objects.bulk_create(items)
        if items and items[-1].assignee is not None:
            ReviewQueue.objects.filter(pk=queue.pk).update(last_assignee=items[-1].assignee)
    assigned: dict[str, int] = {}
    for item in items:
        who = item.assignee.get_username() if item.assignee is not None else ""
        assigned[who] = assigned.get(who, 0) + 1
    return Added(len(fresh), len(candidates) - len(fresh), assigned)


def oversees_queue(user: Any, queue: ReviewQueue) -> bool:
    """Its creator and its team's moderators (and staff) see every item and reassign them."""
    return queue.created_by_id == getattr(user, "pk", None) or is_queue_moderator(user, queue)


def do_assign(actor: Any, item_id: int, assignee: Any | None) -> ReviewQueueItem:
    """Hand an item to another reviewer of the queue's team (None: to anyone), by the
    queue's creator or a moderator of its team."""
    item = ReviewQueueItem.objects.select_related("queue").filter(pk=item_id).first()
    if item is None:
        raise NotFound("no such queue item")
    queue = get_queue_for_user(actor, item.queue_id)
    if not oversees_queue(actor, queue):
        raise Forbidden("only the queue's creator and the team's moderators reassign its items")
    if assignee is not None and queue.team is not None:
        check_queue_reviewers(queue.team, [assignee], code="assignee")
    elif assignee is not None:
        raise ValidationFailed("a queue without a team takes no assignees", code="assignee")
    ReviewQueueItem.objects.filter(pk=item.pk).update(assignee=assignee)
    item.assignee = assignee
    item.queue = queue
    return item


def do_mark_item_done(actor: Any, item_id: int, done: bool = True) -> ReviewQueueItem:
    item = ReviewQueueItem.objects.filter(pk=item_id).first()
    if item is None:
        raise NotFound("no such queue item")
    queue = get_queue_for_user(actor, item.queue_id)
    if item.assignee_id not in (None, actor.pk) and not is_queue_moderator(actor, queue):
        raise Forbidden("this item is assigned to someone else")
    item.queue = queue
    item.done_at = timezone.now() if done else None
    ReviewQueueItem.objects.filter(pk=item.pk).update(done_at=item.done_at)
    return item


def queue_items_for(actor: Any, queue: ReviewQueue) -> QuerySet[ReviewQueueItem]:
    """The items of `queue` `actor` sees and walks through: all of them for its creator
    and its team's moderators, else those assigned to them or to nobody."""
    items = ReviewQueueItem.objects.filter(queue=queue)
    if not oversees_queue(actor, queue):
        items = items.filter(Q(assignee_id=actor.pk) | Q(assignee__isnull=True))
    return items.order_by("position")


@dataclass(frozen=True)
class Share:
    """One person's part of a queue: their items, how many are done."""

    username: str  # "" for the items assigned to nobody
    total: int
    done: int

    @property
    def left(self) -> int:
        return self.total - self.done


def queue_shares(queue: ReviewQueue) -> list[Share]:
    """Everyone's part of the queue (one query), by username, the unassigned last."""
    rows = (
        ReviewQueueItem.objects.filter(queue=queue)
        .values("assignee__username")
        .annotate(total=Count("pk"), done=Count("pk", filter=Q(done_at__isnull=False)))
    )
    shares = [Share(row["assignee__username"] or "", row["total"], row["done"]) for row in rows]
    return sorted(shares, key=lambda s: (s.username == "", s.username))


def progress_text(shares: list[Share], username: str) -> str:
    """ "Your 2 items are done; 3 left for carol." from `username`'s point of view."""
    mine = next((s for s in shares if s.username == username), None)
    parts: list[str] = []
    if mine is not None:
        noun = "item" if mine.total == 1 else "items"
        if mine.left == 0:
            parts.append(f"Your {mine.total} {noun} {'is' if mine.total == 1 else 'are'} done")
        else:
            parts.append(f"{mine.left} of your {mine.total} {noun} left")
    for share in shares:
        if share.username == username or share.left == 0:
            continue
        parts.append(f"{share.left} left for {share.username or 'anyone'}")
    if not parts:
        return "All done." if shares else "Nothing in this queue yet."
    if mine is None and all(s.left == 0 for s in shares):
        return "All done."
    return "; ".join(parts) + "."


# ---- share links ----


def do_create_share(actor: Any, session_id: str, *, days: Any = 7, require_login: bool = False) -> ShareLink:
    """A read-only link to the transcript as it is now (the session's last seq)."""
    session = access.get_session_for_user(actor, session_id, "review")
    try:
        lifetime = int(days)
    except (TypeError, ValueError):
        raise ValidationFailed("the expiry must be a number of days", code="expiry") from None
    if not 1 <= lifetime <= MAX_SHARE_DAYS:
        raise ValidationFailed(f"the expiry must be 1 to {MAX_SHARE_DAYS} days", code="expiry")
    now = timezone.now()
    last_seq = Session.objects.filter(pk=session.pk).values_list("last_seq", flat=True).first() or 0
    return ShareLink.objects.create(
        session=session,
        seq=last_seq,
        created_by=actor,
        created_at=now,
        expires_at=now + timedelta(days=lifetime),
        require_login=bool(require_login),
    )


def may_revoke_share(actor: Any, share: ShareLink) -> bool:
    """Its creator, a moderator of its session's team, and staff revoke a link."""
    return (
        share.created_by_id == actor.pk
        or access.is_staff(actor)
        or access.has_team_role(actor, share.session.team_id, "moderator")
    )


def do_revoke_share(actor: Any, share_id: int) -> ShareLink:
    share = ShareLink.objects.select_related("session").filter(pk=share_id).first()
    if share is None or not may_revoke_share(actor, share):
        raise NotFound("no such share link")
    if share.revoked_at is None:
        share.revoked_at = timezone.now()
        ShareLink.objects.filter(pk=share.pk).update(revoked_at=share.revoked_at)
    return share


def team_shares_for(actor: Any) -> QuerySet[ShareLink]:
    """The share links of the sessions of every team `actor` moderates (staff: every
    team's), for the moderators' list with `Revoke`."""
    if access.is_staff(actor):
        return ShareLink.objects.filter(session__team__isnull=False)
    moderated = Membership.objects.filter(user_id=actor.pk, role=Membership.MODERATOR).values("team_id")
    return ShareLink.objects.filter(session__team_id__in=moderated)


def moderates_any_team(actor: Any) -> bool:
    return access.has_any_role(actor, "moderator")


def creator_still_shares(share: ShareLink) -> bool:
    """A link works only while its creator could make it now: an active user who may still
    review (and so share) the session. Leaving the team, a demotion below reviewer or a
    deactivation stops every link they made; checked at every view, so no change of role,
    however it is made, leaves a link behind."""
    creator = share.created_by
    return bool(creator.is_active) and access.can_review(creator, share.session)


def live_share(token: str, user: Any) -> ShareLink:
    """The share link `token` names if it is live (and the viewer logged in when it asks
    for that); NotFound for anything else: revoked, expired, unknown, malformed, or made
    by someone who may no longer share the session."""
    if not isinstance(token, str) or not 16 <= len(token) <= 64:
        raise NotFound("no such link")
    share = ShareLink.objects.select_related("session", "created_by").filter(token=token).first()
    if share is None or not share.is_live() or not creator_still_shares(share):
        raise NotFound("no such link")
    if share.require_login and not user.is_authenticated:
        raise NotFound("no such link")
    return share


def why_share_fails(token: str, user: Any) -> tuple[str, ShareLink | None]:
    """Why `token` shows no transcript, for the page that says so: "revoked", "expired",
    "stopped" (its maker may no longer share the session), "login" (it asks the viewer
    to log in first) or "unknown" (no such link), with the link when there is one."""
    if not isinstance(token, str) or not 16 <= len(token) <= 64:
        return "unknown", None
    share = ShareLink.objects.select_related("session", "created_by").filter(token=token).first()
    if share is None:
        return "unknown", None
    if share.revoked_at is not None:
        return "revoked", share
    if not share.is_live():
        return "expired", share
    if not creator_still_shares(share):
        return "stopped", share
    if share.require_login and not user.is_authenticated:
        return "login", share
    return "unknown", None
