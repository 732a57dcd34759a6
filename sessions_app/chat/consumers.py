"""The chat's websocket: a session's live journal tail as htmx OOB swaps.

ChatConsumer (``/ws/sessions/<id>/?after=N``), one per browser tab:

1. connect() checks the user may read the session *before* joining the group or
   accepting (4403 for an anonymous user, 4404 for anyone else who may not read it;
   strangers never learn the session exists);
2. joins the session's group, accepts, then reads the journal once: everything up to
   `after` (the last seq the page rendered) primes a ChatViewModel, everything after it
   is rendered and sent;
3. forwards live envelopes from the channel layer, skipping seqs it has sent already
   and, on a gap (the layer delivers at most once), reading the journal after its
   last seq instead of trusting the message;
4. every SECTR_WS_RESYNC_SECONDS it re-joins the group (a restarted Redis forgot it) and
   compares its last seq with the journal's, so even a dropped *last* message of a run
   shows up. One task per process does this for all its sockets (`_Resyncer`): one query
   for the last seqs of every session shown, and only a socket that is behind reads the
   journal (a task and a query per socket every 10 s kept 5,000 idle sockets from
   opening: bench/sockets.py);
5. every SECTR_WS_ACCESS_SECONDS it re-checks the login and the user's right to read
   the session (sessions_app.socket_access): logged out, deactivated, a lost role or a
   deleted session closes the socket (4401, 4403/4404) and nothing is sent after that.

Frames are JSON: ``{"first": seq, "seq": last seq, "html": OOB swaps}`` (html may be
empty), ``{"ready": true, "seq": N}`` once caught up, ``{"reload": true}`` when the
page's cursor is ahead of the journal (the page is from another database). The page
keeps `seq` as its cursor and sends it as `after` when it reconnects.

Database access only through database_sync_to_async; HTML only through
sessions_app.chat.render (Django templates, auto-escaped).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import weakref
from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from django.conf import settings

from sectr.errors import Forbidden, NotFound
from sectr.events import Envelope
from sectr.loops import PerLoop
from sessions_app import access
from sessions_app.chat.render import chat_context, render_changes, session_agent_label
from sessions_app.chat.view_model import ChatViewModel
from sessions_app.input_checks import is_whole_number, unstorable_text
from sessions_app.journal import get_journal
from sessions_app.journal.publish import session_group
from sessions_app.models import Session
from sessions_app.socket_access import CLOSE_FORBIDDEN, RecheckedConsumer
from sessions_app.telemetry.metrics import WEBSOCKET_CLIENTS

logger = logging.getLogger("sectr.consumers")

CLOSE_NOT_FOUND = 4404


# ---- database helpers (each one runs in a thread) ----


def chat_permissions_now(user: Any, session_id: str) -> dict[str, Any]:
    """The viewer's rights on the session, and who they and the session's owner are (an
    approval card depends on both); NotFound / Forbidden when they may not read it."""
    if user is None or not user.is_authenticated:
        raise Forbidden("log in first")
    session = access.get_session_for_user(user, session_id, "read")
    return {
        "can_write": access.can_write(user, session),
        "can_approve": access.can_approve(user, session),
        "can_fork": True,
        "viewer": user.get_username(),
        "session_owner": session.owner.get_username(),
    }


chat_permissions = database_sync_to_async(chat_permissions_now)


@database_sync_to_async
def load_journal(session_id: str, after_seq: int = 0) -> list[Envelope]:
    return get_journal().load_sync(session_id, after_seq)


@database_sync_to_async
def journal_last_seq(session_id: str) -> int | None:
    row = Session.objects.filter(pk=session_id).values_list("last_seq", flat=True).first()
    return int(row) if row is not None else None


@database_sync_to_async
def journal_last_seqs(session_ids: list[str]) -> dict[str, int]:
    """The last seq of each session (a deleted one is missing), 500 ids a query."""
    found: dict[str, int] = {}
    for start in range(0, len(session_ids), 500):
        chunk = session_ids[start : start + 500]
        found.update(Session.objects.filter(pk__in=chunk).values_list("pk", "last_seq"))
    return found


class _Resyncer:
    """The periodic resync of every chat socket of one event loop (one task)."""

    def __init__(self) -> None:
        self.consumers: weakref.WeakSet[ChatConsumer] = weakref.WeakSet()
        self.task: asyncio.Task[None] | None = None

    def add(self, consumer: ChatConsumer) -> None:
        self.consumers.add(consumer)
        if self.task is None or self.task.done():
            self.task = asyncio.ensure_future(self.run())

    def discard(self, consumer: ChatConsumer) -> None:
        self.consumers.discard(consumer)

    async def run(self) -> None:
        while self.consumers:
            await asyncio.sleep(settings.SECTR_WS_RESYNC_SECONDS)
            try:
                await self.resync_all()
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.warning("resync of %d socket(s) failed", len(self.consumers), exc_info=True)

    async def resync_all(self) -> None:
        consumers = [c for c in list(self.consumers) if not c.access_revoked and c.vm is not None]
        if not consumers:
            return
        newest = await journal_last_seqs(sorted({c.session_id for c in consumers}))
        for consumer in consumers:
            with contextlib.suppress(Exception):
                await consumer.channel_layer.group_add(consumer.group, consumer.channel_name)
            seq = newest.get(consumer.session_id)
            if seq is None or seq > consumer.last_seq:
                asyncio.ensure_future(consumer.resync_to(seq))  # reads (or closes: deleted)


#: The running loop's _Resyncer.
resyncer = PerLoop(_Resyncer).get


def parse_after(scope: dict[str, Any]) -> int:
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    raw = (query.get("after") or ["0"])[0]
    return int(raw) if is_whole_number(raw) else 0


class ChatConsumer(RecheckedConsumer):
    session_id: str
    group: str
    vm: ChatViewModel | None = None
    last_seq: int = 0

    async def connect(self) -> None:
        self.session_id = str(self.scope["url_route"]["kwargs"]["session_id"])
        if unstorable_text(self.session_id) is not None:  # a NUL no database query may carry
            await self.close(code=CLOSE_NOT_FOUND)
            return
        try:
            self.permissions = await chat_permissions(self.scope.get("user"), self.session_id)
        except NotFound:
            await self.close(code=CLOSE_NOT_FOUND)
            return
        except Forbidden:
            await self.close(code=CLOSE_FORBIDDEN)
            return
        self.lock = asyncio.Lock()
        self.group = session_group(self.session_id)
        # Join before reading the journal: whatever is appended after the read arrives
        # through the group (and the seq check drops what the read already had).
        await self.channel_layer.group_add(self.group, self.channel_name)
        self.groups_joined = [self.group]
        await self.accept()
        WEBSOCKET_CLIENTS.labels("chat").inc()
        self.counted = True
        async with self.lock:
            await self.catch_up(parse_after(self.scope))
        resyncer().add(self)
        await self.start_rechecking()

    def access_now(self, user: Any) -> int | None:
        try:
            self.permissions = chat_permissions_now(user, self.session_id)
        except NotFound:
            return CLOSE_NOT_FOUND
        except Forbidden:
            return CLOSE_FORBIDDEN
        return None

    async def disconnect(self, code: int) -> None:
        if getattr(self, "counted", False):
            WEBSOCKET_CLIENTS.labels("chat").dec()
            self.counted = False
        await self.stop_rechecking()
        resyncer().discard(self)
        if getattr(self, "group", None):
            with contextlib.suppress(Exception):
                await self.channel_layer.group_discard(self.group, self.channel_name)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        """The page may ask for a resync ({"sync": true}); anything else is ignored."""
        try:
            message = json.loads(text_data or "{}")
        except ValueError:
            return
        if isinstance(message, dict) and message.get("sync"):
            await self.resync()

    # ---- catching up and forwarding ----

    async def catch_up(self, after: int) -> None:
        envelopes = await load_journal(self.session_id, 0)
        newest = envelopes[-1].seq if envelopes else 0
        if after > newest:
            await self.send(text_data=json.dumps({"reload": True, "seq": newest}))
            after = 0
        self.vm = ChatViewModel(self.session_id)
        self.vm.apply_all(e for e in envelopes if e.seq <= after)
        self.vm.take_changes()
        self.last_seq = after
        await self.send_envelopes([e for e in envelopes if e.seq > after])
        await self.send(text_data=json.dumps({"ready": True, "seq": self.last_seq}))

    async def send_envelopes(self, envelopes: list[Envelope]) -> None:
        if not envelopes or self.vm is None:
            return
        for envelope in envelopes:
            self.vm.apply(envelope)
        changes = self.vm.take_changes()
        first, self.last_seq = envelopes[0].seq, envelopes[-1].seq
        extra = {}
        if changes.agent:  # moved to another agent version: the header's label, read now
            extra["agent"] = await database_sync_to_async(session_agent_label)(
                self.scope.get("user"), self.vm.state.agent
            )
        html = render_changes(changes, chat_context(self.vm, **self.permissions, **extra))
        await self.send(text_data=json.dumps({"first": first, "seq": self.last_seq, "html": html}))

    async def journal_envelopes(self, message: dict[str, Any]) -> None:
        """A batch of appended envelopes from the channel layer (sessions_app.journal.publish)."""
        async with self.lock:
            if self.vm is None:
                return
            batch = [Envelope.from_dict(data) for data in message.get("envelopes", [])]
            fresh = [e for e in batch if e.seq > self.last_seq]
            if not fresh:
                return  # sent already (by the catch-up read or a resync)
            contiguous = fresh[0].seq == self.last_seq + 1 and all(
                later.seq == earlier.seq + 1 for earlier, later in zip(fresh, fresh[1:], strict=False)
            )
            if not contiguous:
                # A message was dropped or overtaken: the journal has what we missed.
                fresh = await load_journal(self.session_id, self.last_seq)
            await self.send_envelopes(fresh)

    async def resync(self) -> None:
        async with self.lock:
            await self._catch_up_to(await journal_last_seq(self.session_id))

    async def resync_to(self, newest: int | None) -> None:
        """`resync` with the journal's last seq already read (by _Resyncer, for all its
        sockets in one query): a socket that is behind reads only the missing envelopes."""
        async with self.lock:
            await self._catch_up_to(newest)

    async def _catch_up_to(self, newest: int | None) -> None:
        """Under the lock: send what the journal has after the socket's last seq, when
        `newest` says there is some (None: the session was deleted, close)."""
        if newest is None:
            await self.revoke(CLOSE_NOT_FOUND)
            return
        if newest > self.last_seq:
            await self.send_envelopes(await load_journal(self.session_id, self.last_seq))
