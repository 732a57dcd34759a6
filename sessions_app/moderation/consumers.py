"""The live approval queue's websocket (``/ws/approvals/?team=&tool=&age=``).

It pushes to /approvals/ the asks of the sessions this user may decide (the
moderation group of sessions_app.journal.publish): a new ask appends a card (when the
page's filters admit it); a vote re-renders the card with the votes so far; a decision
(a person's, a rule's, the expiry policy's) or a withdrawal replaces the card by who
decided it and how, and the page's script then takes it out of the queue.

The user's right is checked at connect and again for every ask (access can change while
the socket is open). The socket also re-checks its viewer every SECTR_WS_ACCESS_SECONDS
(sessions_app.socket_access): logging out closes it (4401), and so does losing a
moderator role or staff (4403: the page reconnects and gets the narrower queue, so no
card of a session it may no longer decide stays on screen); nothing is sent after that.

Database access only through database_sync_to_async; HTML only through Django templates
(auto-escaped).
"""

from __future__ import annotations

import contextlib
import json
from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from django.template.loader import render_to_string

from sectr.events import Envelope, EventType
from sessions_app import access
from sessions_app.chat.consumers import CLOSE_FORBIDDEN
from sessions_app.journal.publish import MODERATION_GROUP
from sessions_app.models import Session
from sessions_app.moderation.queue import QueueCard, QueueFilters, build_card
from sessions_app.ops.metrics import WEBSOCKET_CLIENTS
from sessions_app.socket_access import RecheckedConsumer, reloaded_user

#: what happened to an ask: "new" (append a card), "changed" (re-render it), "resolved"
Change = str


def ask_changes(envelopes: list[Envelope]) -> list[tuple[Change, str]]:
    """(change, ask id) for each moderation envelope of one append, in order."""
    changes: list[tuple[Change, str]] = []
    for envelope in envelopes:
        payload = envelope.payload
        if envelope.type is EventType.APPROVAL_REQUESTED:
            changes.append(("new", str(payload.get("ask_id"))))
        elif envelope.type is EventType.INVOCATION_STARTED:
            reason = payload.get("reason") or {}
            if isinstance(reason, dict) and reason.get("kind") == "approval_decision":
                changes.append(("resolved", str(reason.get("ask_id"))))
        elif envelope.type is EventType.INVOCATION_CANCELLED and payload.get("ask_id"):
            changes.append(("resolved", str(payload["ask_id"])))
        elif envelope.type.value == "APPROVAL_VOTED":
            changes.append(("changed", str(payload.get("ask_id"))))
    # One append may ask and decide at once (a rule): only the last word on an ask counts.
    last: dict[str, int] = {ask_id: i for i, (_change, ask_id) in enumerate(changes)}
    return [(change, ask_id) for i, (change, ask_id) in enumerate(changes) if last[ask_id] == i]


@database_sync_to_async
def queue_cards(user: Any, session_id: str, envelopes: list[Envelope]) -> list[tuple[Change, QueueCard]]:
    """The cards to push for one append, if this user may decide the session's asks."""
    changes = ask_changes(envelopes)
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
def viewer_may_connect(user: Any) -> bool:
    return bool(user is not None and user.is_authenticated and user.is_active)


def moderation_reach(user: Any) -> tuple[bool, frozenset[int]]:
    """(staff?, the teams the user moderates): what decides which asks the queue shows."""
    return access.is_staff(user), frozenset(access.teams_for(user, "moderator").values_list("pk", flat=True))


@database_sync_to_async
def current_viewer(user: Any) -> tuple[Any, tuple[bool, frozenset[int]]]:
    fresh = reloaded_user(user)
    return fresh, moderation_reach(fresh)


class ApprovalsConsumer(RecheckedConsumer):
    async def connect(self) -> None:
        self.user = self.scope.get("user")
        if not await viewer_may_connect(self.user):
            await self.close(code=CLOSE_FORBIDDEN)
            return
        query = parse_qs(self.scope.get("query_string", b"").decode("latin-1"))
        self.filters = QueueFilters.from_query({name: values[-1] for name, values in query.items()})
        self.reach = await database_sync_to_async(moderation_reach)(self.user)
        self.joined = True
        await self.channel_layer.group_add(MODERATION_GROUP, self.channel_name)
        self.groups_joined = [MODERATION_GROUP]
        await self.accept()
        WEBSOCKET_CLIENTS.labels("approvals").inc()
        self.counted = True
        await self.send(text_data=json.dumps({"ready": True}))
        self.start_rechecking()

    async def current_access(self) -> int | None:
        fresh, reach = await current_viewer(self.user)
        staff, teams = reach
        if (self.reach[0] and not staff) or not self.reach[1] <= teams:
            return CLOSE_FORBIDDEN  # cards of sessions it may no longer decide must go too
        self.user, self.reach = fresh, reach
        return None

    async def disconnect(self, code: int) -> None:
        await self.stop_rechecking()
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
            if change == "new":
                # A new ask is young: an `Age` filter admits it only later (on reload).
                if self.filters.admits(card):
                    parts.append(render_to_string("moderation/_approval_append.html", {"item": card}))
            else:
                parts.append(render_to_string("moderation/_card.html", {"item": card, "oob": True}))
        if parts:
            await self.send(text_data=json.dumps({"html": "".join(parts)}))
