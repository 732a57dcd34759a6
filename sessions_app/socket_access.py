"""Open websockets re-check who is on the other end.

A socket is authorised once, at connect(); without more, a user who logs out, is
deactivated, changes their password or loses the role that let them read a session
would keep receiving its frames for as long as the tab stays open. A consumer built on
RecheckedConsumer re-checks every SECTR_WS_ACCESS_SECONDS (3 s): the login behind the
socket (its Django session still exists and still names this user, whose password hash
and active flag still match: django.contrib.auth.get_user), then the consumer's own
rule (`access_now`, given the user as just read), both in one thread hop (at 100 open
sockets the re-checks were a sixth of a busy Daphne's samples when they took two hops
and read the user twice). When either fails it stops sending at once (every later frame
is dropped), leaves its groups and closes with the code `access_now` gave.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from importlib import import_module
from types import SimpleNamespace
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings
from django.contrib import auth

logger = logging.getLogger("sectr.consumers")

CLOSE_LOGGED_OUT = 4401
ACCESS_RECHECK_SECONDS = float(os.environ.get("SECTR_WS_ACCESS_SECONDS", "3"))


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


def login_is_current(scope: dict[str, Any]) -> bool:
    """Whether the Django session the socket was opened with still logs in its user."""
    return current_login(scope) is not None


class RecheckedConsumer(AsyncWebsocketConsumer):
    """A websocket consumer whose access is re-checked while it is open."""

    access_revoked = False
    _access_task: asyncio.Task[None] | None = None
    groups_joined: list[str]

    def access_now(self, user: Any) -> int | None:
        """None while the socket may stay open; else the close code. Runs in a database
        thread after the login check, with `user` freshly read (a new object: the scope's
        caches its permissions)."""
        return None

    def start_rechecking(self) -> None:
        self._access_task = asyncio.ensure_future(self.recheck_forever())

    async def stop_rechecking(self) -> None:
        task, self._access_task = self._access_task, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def recheck_forever(self) -> None:
        while not self.access_revoked:
            await asyncio.sleep(ACCESS_RECHECK_SECONDS)
            try:
                code = await self.recheck()
            except asyncio.CancelledError:
                raise
            except Exception:  # a database hiccup is not a reason to drop a reader
                logger.warning("access re-check failed", exc_info=True)
                continue
            if code is not None:
                await self.revoke(code)
                return

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
