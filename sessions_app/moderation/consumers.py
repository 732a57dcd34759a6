"""The live approval queue's websocket (``/ws/approvals/``): it pushes approval cards to
/approvals/: new asks of the sessions the user may decide (every session's for
moderators) and their decisions and withdrawals.

The socket re-checks its viewer every SECTR_WS_ACCESS_SECONDS (sessions_app.socket_access):
logging out closes it (4401), and so does losing the moderator role (4403: the page
reconnects and gets the narrower queue); nothing is sent after that.

Database access only through database_sync_to_async; HTML only through Django templates
(auto-escaped).
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

from channels.db import database_sync_to_async
from django.template.loader import render_to_string

from sectr.errors import Forbidden
from sectr.events import Envelope, EventType
from sessions_app import access
from sessions_app.chat.consumers import CLOSE_FORBIDDEN
from sessions_app.chat.view_model import ApprovalView
from sessions_app.journal.publish import MODERATION_GROUP
from sessions_app.models import Session
from sessions_app.socket_access import RecheckedConsumer, reloaded_user


@database_sync_to_async
def queue_viewer(user: Any) -> dict[str, Any]:
    if user is None or not user.is_authenticated:
        raise Forbidden("log in first")
    return {"user_id": user.pk, "moderator": access.is_moderator(user)}


@database_sync_to_async
def current_queue_viewer(user: Any) -> dict[str, Any]:
    fresh = reloaded_user(user)
    return {"user_id": fresh.pk, "moderator": access.is_moderator(fresh)}


@database_sync_to_async
def approval_cards(
    viewer: dict[str, Any], session_id: str, envelopes: list[Envelope]
) -> list[tuple[str, ApprovalView]]:
    """(what happened, card) for the asks in `envelopes` that this viewer may decide."""
    session = Session.objects.select_related("owner").filter(pk=session_id).first()
    if session is None or not (viewer["moderator"] or session.owner_id == viewer["user_id"]):
        return []
    state = session.projection()
    cards: list[tuple[str, ApprovalView]] = []
    for envelope in envelopes:
        if envelope.type is EventType.APPROVAL_REQUESTED:
            ask_id, change = str(envelope.payload.get("ask_id")), "new"
        elif envelope.type is EventType.INVOCATION_STARTED:
            ask_id, change = str((envelope.payload.get("reason") or {}).get("ask_id")), "decided"
        elif envelope.type is EventType.INVOCATION_CANCELLED and envelope.payload.get("ask_id"):
            ask_id, change = str(envelope.payload["ask_id"]), "withdrawn"
        else:
            continue
        ask = state.asks.get(ask_id)
        if ask is None:
            continue
        card = ApprovalView.from_ask(ask, session.pk)
        card.session_title = session.title
        card.owner = session.owner.get_username()
        cards.append((change, card))
    return cards


class ApprovalsConsumer(RecheckedConsumer):
    async def connect(self) -> None:
        try:
            self.viewer = await queue_viewer(self.scope.get("user"))
        except Forbidden:
            await self.close(code=CLOSE_FORBIDDEN)
            return
        await self.channel_layer.group_add(MODERATION_GROUP, self.channel_name)
        self.groups_joined = [MODERATION_GROUP]
        await self.accept()
        self.start_rechecking()

    async def current_access(self) -> int | None:
        viewer = await current_queue_viewer(self.scope.get("user"))
        if self.viewer["moderator"] and not viewer["moderator"]:
            return CLOSE_FORBIDDEN  # its cards of other people's sessions must go too
        self.viewer = viewer
        return None

    async def disconnect(self, code: int) -> None:
        await self.stop_rechecking()
        if getattr(self, "viewer", None):
            with contextlib.suppress(Exception):
                await self.channel_layer.group_discard(MODERATION_GROUP, self.channel_name)

    async def journal_envelopes(self, message: dict[str, Any]) -> None:
        if self.access_revoked:
            return
        envelopes = [Envelope.from_dict(data) for data in message.get("envelopes", [])]
        cards = await approval_cards(self.viewer, str(message.get("session_id")), envelopes)
        parts = []
        for change, card in cards:
            context = {"item": card, "can_approve": True, "show_session": True}
            if change == "new" and card.is_pending:
                parts.append(render_to_string("moderation/_approval_append.html", context))
            else:
                parts.append(render_to_string("chat/_approval.html", {**context, "oob": True}))
        if parts:
            await self.send(text_data=json.dumps({"html": "".join(parts)}))
