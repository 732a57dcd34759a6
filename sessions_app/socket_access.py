"""Open websockets and SSE streams re-check who is on the other end.

A socket is authorised once, at connect(); without more, a user who logs out, is
deactivated, changes their password or loses the role that let them read a session
would keep receiving its frames for as long as the tab stays open. A consumer built on
RecheckedConsumer re-checks the login behind the socket (its Django session still exists
and still names this user, whose password hash and active flag still match:
django.contrib.auth.get_user), then the consumer's own rule (`access_now`), both in one
thread hop. When either fails it stops sending at once (every later frame is dropped),
leaves its groups and closes with the code `access_now` gave.

When it re-checks: at once when something that can revoke access happens, and every
SECTR_WS_ACCESS_SECONDS (60 s, staggered) as a safety net for what no signal sees (a
Django session that expired, a change made with raw SQL). The events are Django signals
(`connect_access_signals`): a logout, any save of the user (active flag, password,
staff), a membership saved or deleted (a team deleted takes its memberships with it),
and a session deleted. Each sends `{"type": "access.changed"}`, once the transaction
commits, to the user's group (`user_access_group`, every socket of that user, in every
process) or to the session's group. Polling every socket every 3 s instead cost each
process one check per socket per 3 s whatever happened: at 5,000 idle sockets on one
Daphne that is 1,700 checks a second and the process could no longer open sockets.

A logout's message also names the login that ended (`ended_login`, a digest of its
Django session key, never the key): Django sends `user_logged_out` before it deletes the
session, so a re-check that ran at once could still find the login alive and keep the
socket open. A socket opened with that login closes without re-checking.

When to re-check is AccessWatch's one job, for every kind of stream: a websocket consumer
(RecheckedConsumer) and an API event stream (sessions_app.api.sse, whose check is the
bearer token and the session's read access) each give it their check and what to do when
it fails; revoking or deleting an API token signals the same way as the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import random
from collections.abc import Awaitable, Callable, Iterable
from importlib import import_module
from types import SimpleNamespace
from typing import Any

from channels.consumer import get_handler_name
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings
from django.contrib import auth

from sessions_app.journal.publish import publish_on_commit_messages, session_group

logger = logging.getLogger("sectr.consumers")

CLOSE_LOGGED_OUT = 4401
#: A socket whose user may not (or may no longer) see what it shows.
CLOSE_FORBIDDEN = 4403
ACCESS_CHANGED_MESSAGE_TYPE = "access.changed"


def user_access_group(user_id: Any) -> str:
    """The channel-layer group of every open socket of one user (all processes)."""
    return f"sectr.access.user.{int(user_id)}"


class AccessWatch:
    """When a live stream's access is re-checked: at once when `changed()` is called (an
    `access.changed` message reached the stream), and every SECTR_WS_ACCESS_SECONDS
    (staggered) as the safety net. `check` answers None while the stream may go on, else a
    close code; the first code makes it call `revoke(code)` once, and stop."""

    def __init__(
        self,
        check: Callable[[], Awaitable[int | None]],
        revoke: Callable[[int], Awaitable[None]],
        revoked: Callable[[], bool],
    ) -> None:
        self._check = check
        self._revoke = revoke
        self._revoked = revoked
        self._net: asyncio.Task[None] | None = None
        self._soon: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start the safety net (call once the stream is open)."""
        self._net = asyncio.ensure_future(self._recheck_forever())

    async def stop(self) -> None:
        for attribute in ("_net", "_soon"):
            task = getattr(self, attribute)
            setattr(self, attribute, None)
            if task is not None and task is not asyncio.current_task():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    async def _recheck_forever(self) -> None:
        while not self._revoked():
            await asyncio.sleep(settings.SECTR_WS_ACCESS_SECONDS * random.uniform(0.5, 1.0))  # noqa: S311 - staggering
            if await self.recheck_now():
                return

    async def recheck_now(self) -> bool:
        """Re-check now; True if the stream was revoked."""
        try:
            code = await self._check()
        except asyncio.CancelledError:
            raise
        except Exception:  # a database hiccup is not a reason to drop a reader
            logger.warning("access re-check failed", exc_info=True)
            return False
        if code is not None and not self._revoked():
            await self._revoke(code)
        return code is not None

    def changed(self) -> None:
        """Something that may revoke this stream's access happened: re-check soon (one
        check at a time; a change during a check gets a check of its own after it)."""
        if self._revoked():
            return
        previous = self._soon

        async def after_previous() -> None:
            if previous is not None:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await previous
            await self.recheck_now()

        self._soon = asyncio.ensure_future(after_previous())


def is_access_changed(message: dict[str, Any]) -> bool:
    return message.get("type") == ACCESS_CHANGED_MESSAGE_TYPE


def login_digest(session_key: str) -> str:
    """What names a login on the channel layer: a digest of its Django session key."""
    return hashlib.sha256(f"sectr-login:{session_key}".encode()).hexdigest()


def ends_scope_login(message: dict[str, Any], scope: dict[str, Any]) -> bool:
    """True when `message` is the logout of the login this socket was opened with."""
    ended = message.get("ended_login")
    session_key = getattr(scope.get("session"), "session_key", None)
    return bool(ended and session_key and ended == login_digest(session_key))


def current_login(scope: dict[str, Any]) -> Any | None:
    """The socket's user as the database has them now, while the Django session the
    socket was opened with still logs them in; else None."""
    user = scope.get("user")
    session = scope.get("session")
    session_key = getattr(session, "session_key", None)
    if user is None or not user.is_authenticated or not session_key:
        return None
    # A fresh store: the scope's one was loaded at connect and caches what it read.
    store = import_module(settings.SESSION_ENGINE).SessionStore(session_key)
    current = auth.get_user(SimpleNamespace(session=store))  # type: ignore[arg-type]
    return current if current.is_authenticated and current.pk == user.pk else None


class RecheckedConsumer(AsyncWebsocketConsumer):
    """A websocket consumer whose access is re-checked while it is open (AccessWatch)."""

    access_revoked = False
    _watch: AccessWatch | None = None
    groups_joined: list[str]

    async def dispatch(self, message: dict[str, Any]) -> None:
        """Channels' dispatch without its `aclose_old_connections()` before every message:
        that is a thread hop per message (every streamed batch of every socket: about
        1,000 a second for 100 streams), and these consumers never use the database on
        the event loop; their database work runs in database_sync_to_async, which closes
        stale connections in its own thread."""
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        await handler(message)

    def access_now(self, user: Any) -> int | None:
        """None while the socket may stay open; else the close code. Runs in a database
        thread after the login check, with `user` freshly read (a new object: the scope's
        caches its permissions)."""
        return None

    def _access_watch(self) -> AccessWatch:
        if self._watch is None:
            self._watch = AccessWatch(self.recheck, self.revoke, lambda: self.access_revoked)
        return self._watch

    async def start_rechecking(self) -> None:
        """Join the user's access group, then start the safety net. Call after accept()."""
        user = self.scope.get("user")
        if user is not None and user.is_authenticated:
            group = user_access_group(user.pk)
            await self.channel_layer.group_add(group, self.channel_name)
            self.groups_joined = [*getattr(self, "groups_joined", []), group]
        self._access_watch().start()

    async def stop_rechecking(self) -> None:
        if self._watch is not None:
            await self._watch.stop()

    async def recheck_and_revoke(self) -> bool:
        """Re-check now; True if the socket was closed."""
        return await self._access_watch().recheck_now()

    async def access_changed(self, message: dict[str, Any]) -> None:
        """Something that may revoke this socket's access happened: re-check now (or
        close at once when it is the logout of this socket's own login)."""
        if ends_scope_login(message, self.scope):
            if not self.access_revoked:
                await self.revoke(CLOSE_LOGGED_OUT)
            return
        self._access_watch().changed()

    async def recheck(self) -> int | None:
        return await database_sync_to_async(self._recheck_now)()

    def _recheck_now(self) -> int | None:
        user = current_login(self.scope)
        if user is None:
            return CLOSE_LOGGED_OUT
        return self.access_now(user)

    async def revoke(self, code: int) -> None:
        """Stop sending now, leave the groups, close."""
        self.access_revoked = True
        for group in getattr(self, "groups_joined", []):
            with contextlib.suppress(Exception):
                await self.channel_layer.group_discard(group, self.channel_name)
        await self.close(code=code)

    async def send(self, text_data: str | None = None, bytes_data: bytes | None = None, close: bool = False) -> None:
        if self.access_revoked:
            return  # nothing more for a socket whose access has gone
        await super().send(text_data=text_data, bytes_data=bytes_data, close=close)


# ---- the events that re-check sockets at once ----


def _notify(group: str, ended_login: str | None = None) -> None:
    message: dict[str, Any] = {"type": ACCESS_CHANGED_MESSAGE_TYPE}
    if ended_login:
        message["ended_login"] = ended_login
    publish_on_commit_messages([(group, message)])


def notify_user_access_changed(user_ids: Iterable[Any]) -> None:
    """Re-check every open stream of these users once the transaction commits: for a
    change no signal sees (a bulk update, as the admin's token revocation makes)."""
    for user_id in sorted(set(user_ids)):
        _notify(user_access_group(user_id))


def _user_changed(sender: Any, instance: Any = None, user: Any = None, **_kwargs: Any) -> None:
    who = user if user is not None else instance
    if who is not None and getattr(who, "pk", None) is not None:
        _notify(user_access_group(who.pk))


def _logged_out(sender: Any, request: Any = None, user: Any = None, **_kwargs: Any) -> None:
    if user is None or getattr(user, "pk", None) is None:
        return
    session_key = getattr(getattr(request, "session", None), "session_key", None)
    _notify(user_access_group(user.pk), ended_login=login_digest(session_key) if session_key else None)


def _membership_changed(sender: Any, instance: Any, **_kwargs: Any) -> None:
    if instance.user_id is not None:
        _notify(user_access_group(instance.user_id))


def _token_changed(sender: Any, instance: Any, created: bool = False, **_kwargs: Any) -> None:
    if not created and instance.user_id is not None:  # a revoked (or deleted) token
        _notify(user_access_group(instance.user_id))


def _session_deleted(sender: Any, instance: Any, **_kwargs: Any) -> None:
    _notify(session_group(str(instance.pk)))


def connect_access_signals() -> None:
    """Connect the receivers above (sessions_app's AppConfig.ready)."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.signals import user_logged_out
    from django.db.models.signals import post_delete, post_save

    from sessions_app.models import ApiToken, Membership, Session

    user_model = get_user_model()
    user_logged_out.connect(_logged_out, dispatch_uid="sectr-access-logout")
    post_save.connect(_user_changed, sender=user_model, dispatch_uid="sectr-access-user-saved")
    post_delete.connect(_user_changed, sender=user_model, dispatch_uid="sectr-access-user-deleted")
    post_save.connect(_membership_changed, sender=Membership, dispatch_uid="sectr-access-membership-saved")
    post_delete.connect(_membership_changed, sender=Membership, dispatch_uid="sectr-access-membership-deleted")
    post_save.connect(_token_changed, sender=ApiToken, dispatch_uid="sectr-access-token-saved")
    post_delete.connect(_token_changed, sender=ApiToken, dispatch_uid="sectr-access-token-deleted")
    post_delete.connect(_session_deleted, sender=Session, dispatch_uid="sectr-access-session-deleted")
