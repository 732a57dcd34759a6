"""Walking through a review queue: where `Previous` and `Next` lead from one of its items.

A queue's items are sessions (reviewed on the session's page, `?queue=<id>`) and pairs
of an experiment (judged on the blind pair page, addressed by the item's id alone); both
kinds are walked in the queue's order, from either kind of page.
"""

from __future__ import annotations

from typing import Any

from django.urls import reverse

from sessions_app.models import ReviewQueue
from sessions_app.review import actions


def item_address(queue_id: int, item_id: int, session_id: str, pair_id: int | None) -> str:
    """Where an item is reviewed: a pair's blind page names no session."""
    if pair_id is not None:
        return reverse("review_pair", args=[item_id])
    return f"{reverse('review_session', args=[session_id])}?queue={queue_id}"


def queue_nav(
    user: Any, queue: ReviewQueue, *, item_id: int | None = None, session_id: str = ""
) -> dict[str, Any] | None:
    """The queue bar of an item's page: its place among the items `user` walks through,
    the progress, and the addresses of the items before and after it (None at the ends).
    The item is `item_id`, or the session item of `session_id`; None when it is not
    among the user's items."""
    items = list(actions.queue_items_for(user, queue).values_list("pk", "session_id", "pair_id", "done_at"))
    index = next(
        (
            i
            for i, (pk, sid, pair, _done) in enumerate(items)
            if (pk == item_id if item_id is not None else sid == session_id and pair is None)
        ),
        None,
    )
    if index is None:
        return None

    def address(row: tuple[int, str, int | None, Any]) -> str:
        return item_address(queue.pk, row[0], row[1], row[2])

    following = items[index + 1] if index + 1 < len(items) else None
    return {
        "queue": queue,
        "item_id": items[index][0],
        "done": items[index][3] is not None,
        "position": index + 1,
        "count": len(items),
        "done_count": sum(1 for *_rest, done in items if done is not None),
        "previous": address(items[index - 1]) if index > 0 else None,
        "next": address(following) if following is not None else None,
        "next_item": following[0] if following is not None else None,
        "progress": actions.progress_text(actions.queue_shares(queue), user.get_username()),
    }
