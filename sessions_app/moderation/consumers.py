"""The live approval queue's websocket (``/ws/approvals/?team=&tool=&age=``).

It pushes to /approvals/ the asks of the sessions this user may decide (the
moderation group of sessions_app.journal.publish): a new ask appends a card (when the
page's filters admit it); a vote re-renders the card with the votes so far; a decision
(a person's, a rule's, the expiry policy's) or a withdrawal replaces the card by who
decided it and how, and the page's script then takes it out of the queue.

Every push respects the page's filters (`Team`, `Tool`, `Age`). An `Age` filter admits
an ask only once it is old enough, so a matching ask that is still too young (a new
one, or one asked just before the page loaded) is held back on a timer and pushed when
its age reaches the filter, if it is still pending and the user may still decide it;
until then its votes and decisions are not sent (it is not on the page).

Catching up at connect: the page names the moment it read the queue (`since`). An ask
made or decided after that moment but before the socket joined the group would never
reach the page, so the socket answers `{"stale": true}` after `ready` when one exists
(one query) and the page reloads its queue. A vote alone in that moment is not caught
(the ask index keeps no time of votes); the next change of the card brings it.

The user's right is checked at connect and again for every ask (access can change while
the socket is open). The socket also re-checks its viewer every SECTR_WS_ACCESS_SECONDS
(sessions_app.socket_access): logging out closes it (4401), and so does losing a
moderator role or staff (4403: the page reconnects and gets the narrower queue, so no
card of a session it may no longer decide stays on screen); nothing is sent after that.

Database access only through database_sync_to_async; HTML only through Django templates
(auto-escaped).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from django.db.models import Q
from django.template.loader import render_to_string
from django.utils import timezone

from sectr.asks import ask_changes
from sectr.events import Envelope
from sessions_app import access
from sessions_app.journal.publish import MODERATION_GROUP
from sessions_app.models import Session
from sessions_app.moderation.queue import (
    AGE_CHOICES,
    QueueCard,
    QueueFilters,
    asks_in_reach,
    build_card,
    pending_asks,
)
from sessions_app.socket_access import CLOSE_FORBIDDEN, RecheckedConsumer
from sessions_app.telemetry.metrics import WEBSOCKET_CLIENTS

#: what happened to an ask: "new" (append a card), "changed" (re-render it), "resolved"
Change = str


#: A queue card's change by what happened to its ask (sectr.asks).
_CARD_CHANGES: dict[str, Change] = {"requested": "new", "voted": "changed"}


def card_changes(envelopes: list[Envelope]) -> list[tuple[Change, str]]:
    """(change, ask id) for each moderation envelope of one append, in order."""
    changes: list[tuple[Change, str]] = [
        (_CARD_CHANGES.get(change.kind, "resolved"), change.ask_id)
        for envelope in envelopes
        for change in ask_changes(envelope)
        if not change.at_once  # a rule's decision at once: its card arrives as asked
    ]
    # One append may ask and decide at once (a rule): only the last word on an ask counts.
    last: dict[str, int] = {ask_id: i for i, (_change, ask_id) in enumerate(changes)}
    return [(change, ask_id) for i, (change, ask_id) in enumerate(changes) if last[ask_id] == i]


@database_sync_to_async
def queue_cards(user: Any, session_id: str, envelopes: list[Envelope]) -> list[tuple[Change, QueueCard]]:
    """The cards to push for one append, if this user may decide the session's asks."""
    changes = card_changes(envelopes)
    if not changes or user is None or not user.is_authenticated:
        return []
    session = Session.objects.select_related("owner").filter(pk=session_id).first()
    if session is None or not access.can_approve(user, session):
        return []
    asks = session.projection().asks
    cards: list[tuple[Change, QueueCard]] = []
    for change, ask_id in changes:
        ask = asks.get(ask_id)
        if ask is None:
            continue
        card = build_card(session, ask)
        if change == "new" and not card.is_pending:
            continue  # asked and decided in the same append (a rule): nothing to queue
        cards.append((change, card))
    return cards


@database_sync_to_async
def current_card(user: Any, session_id: str, ask_id: str) -> QueueCard | None:
    """The ask's card as it is now, if it is pending and `user` may decide it."""
    session = Session.objects.select_related("owner", "team").filter(pk=session_id).first()
    if session is None or not access.can_approve(user, session):
        return None
    ask = session.projection().asks.get(ask_id)
    if ask is None or ask.get("status") != "pending":
        return None
    return build_card(session, ask)


#: At connect, asks that became old enough this long ago are pushed too (the page's GET
#: came a moment before the socket; a card already on the page is not added twice).
CONNECT_SLACK = timedelta(seconds=10)


@database_sync_to_async
def young_asks(user: Any, filters: QueueFilters) -> list[tuple[str, str, datetime | None]]:
    """(ask id, session id, asked at) of the pending asks the filters admit but for the
    `Age` one, not yet old enough for it (one query)."""
    if not filters.age:
        return []
    matching = pending_asks(user, QueueFilters(team=filters.team, tool=filters.tool))
    since = timezone.now() - AGE_CHOICES[filters.age] - CONNECT_SLACK
    return list(matching.filter(requested_at__gt=since).values_list("ask_id", "session_id", "requested_at").order_by())


def parse_since(values: list[str] | None) -> datetime | None:
    """The page's `since` (an ISO time with its offset), or None when absent or malformed."""
    if not values:
        return None
    try:
        since = datetime.fromisoformat(values[-1])
    except ValueError:
        return None
    return since if since.tzinfo is not None else None


@database_sync_to_async
def changed_since(user: Any, filters: QueueFilters, since: datetime) -> bool:
    """Whether an ask the user may decide, under the page's `Team` and `Tool` filters, was
    made or decided at or after `since` (one query)."""
    asks = asks_in_reach(user, filters)
    return asks.filter(Q(requested_at__gte=since) | Q(decided_at__gte=since)).exists()


@database_sync_to_async
def viewer_may_connect(user: Any) -> bool:
    return bool(user is not None and user.is_authenticated and user.is_active)


def moderation_reach(user: Any) -> tuple[bool, frozenset[int]]:
    """(staff?, the teams the user moderates): what decides which asks the queue shows."""
    return access.is_staff(user), frozenset(access.teams_for(user, "moderator").values_list("pk", flat=True))


class ApprovalsConsumer(RecheckedConsumer):
    async def connect(self) -> None:
        self.user = self.scope.get("user")
        if not await viewer_may_connect(self.user):
            await self.close(code=CLOSE_FORBIDDEN)
            return
        query = parse_qs(self.scope.get("query_string", b"").decode("latin-1"))
        self.viewer = self.user.get_username()  # whose cards: a voter's or the requester's say so
        self.filters = QueueFilters.from_query({name: values[-1] for name, values in query.items()})
        self.reach = await database_sync_to_async(moderation_reach)(self.user)
        self.maturing: dict[str, asyncio.Task[None]] = {}  # ask id: its push once old enough
        self.joined = True
        await self.channel_layer.group_add(MODERATION_GROUP, self.channel_name)
        self.groups_joined = [MODERATION_GROUP]
        await self.accept()
        WEBSOCKET_CLIENTS.labels("approvals").inc()
        self.counted = True
        await self.send(text_data=json.dumps({"ready": True}))
        await self.start_rechecking()
        since = parse_since(query.get("since"))
        if since is not None and await changed_since(self.user, self.filters, since):
            await self.send(text_data=json.dumps({"stale": True}))
        for ask_id, session_id, asked_at in await young_asks(self.user, self.filters):
            self.hold_back(ask_id, session_id, asked_at)

    def hold_back(self, ask_id: str, session_id: str, asked_at: datetime | None) -> None:
        """Push the ask's card once the `Age` filter admits it (once per ask)."""
        if asked_at is None or ask_id in self.maturing or not self.filters.age:
            return
        delay = (asked_at + AGE_CHOICES[self.filters.age] - timezone.now()).total_seconds()
        self.maturing[ask_id] = asyncio.ensure_future(self.push_when_old_enough(ask_id, session_id, delay))

    async def push_when_old_enough(self, ask_id: str, session_id: str, delay: float) -> None:
        try:
            await asyncio.sleep(max(0.0, delay))
            if self.access_revoked:
                return
            card = await current_card(self.user, session_id, ask_id)
            if card is not None and self.filters.admits(card):
                await self.send(
                    text_data=json.dumps(
                        {
                            "html": render_to_string(
                                "moderation/_approval_append.html", {"item": card, "viewer": self.viewer}
                            )
                        }
                    )
                )
        finally:
            if self.maturing.get(ask_id) is asyncio.current_task():
                del self.maturing[ask_id]

    def stop_holding(self, ask_id: str) -> None:
        task = self.maturing.pop(ask_id, None)
        if task is not None:
            task.cancel()

    def access_now(self, fresh: Any) -> int | None:
        reach = moderation_reach(fresh)
        staff, teams = reach
        if (self.reach[0] and not staff) or not self.reach[1] <= teams:
            return CLOSE_FORBIDDEN  # cards of sessions it may no longer decide must go too
        self.user, self.reach = fresh, reach
        return None

    async def disconnect(self, code: int) -> None:
        await self.stop_rechecking()
        for ask_id in list(getattr(self, "maturing", {})):
            self.stop_holding(ask_id)
        if getattr(self, "counted", False):
            WEBSOCKET_CLIENTS.labels("approvals").dec()
            self.counted = False
        if getattr(self, "joined", False):
            with contextlib.suppress(Exception):
                await self.channel_layer.group_discard(MODERATION_GROUP, self.channel_name)

    async def journal_envelopes(self, message: dict[str, Any]) -> None:
        if self.access_revoked:
            return
        envelopes = [Envelope.from_dict(data) for data in message.get("envelopes", [])]
        cards = await queue_cards(self.user, str(message.get("session_id")), envelopes)
        parts = []
        for change, card in cards:
            if not self.filters.matches(card):
                continue  # another team or tool: never on this page
            wait = self.filters.seconds_until_old_enough(card)
            if wait is None:
                continue
            if wait > 0:
                # Too young for the `Age` filter, so not on the page: held back until it is.
                if card.is_pending:
                    self.hold_back(card.ask_id, card.session_id, card.asked_at)
                else:
                    self.stop_holding(card.ask_id)
            elif change == "new":
                parts.append(
                    render_to_string("moderation/_approval_append.html", {"item": card, "viewer": self.viewer})
                )
            else:
                parts.append(
                    render_to_string("moderation/_card.html", {"item": card, "oob": True, "viewer": self.viewer})
                )
        if parts:
            await self.send(text_data=json.dumps({"html": "".join(parts)}))
