"""Shared fixtures for the Django tests: three standing users and a session factory.

owner owns the sessions the factory makes; teammate is a second account (for sharing
and review); outsider must never see the owner's sessions. Users get no usable
password: log them in with `client.force_login` (or use the *_client fixtures).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Protocol

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.db import connection
from django.test import Client

from sectr.events import EventType
from sectr.journal import NewEvent
from sessions_app.journal import DatabaseJournal
from sessions_app.models import Session


def make_user(username: str, **flags: Any) -> Any:
    return get_user_model().objects.create_user(username=username, email=f"{username}@example.org", **flags)


@pytest.fixture
def owner(db: None) -> Any:
    return make_user("owner")


@pytest.fixture
def teammate(db: None) -> Any:
    return make_user("teammate")


@pytest.fixture
def outsider(db: None) -> Any:
    return make_user("outsider")


def _client_for(user: AbstractBaseUser) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def owner_client(owner: Any) -> Client:
    return _client_for(owner)


@pytest.fixture
def teammate_client(teammate: Any) -> Client:
    return _client_for(teammate)


@pytest.fixture
def outsider_client(outsider: Any) -> Client:
    return _client_for(outsider)


@pytest.fixture
def journal() -> DatabaseJournal:
    return DatabaseJournal()


class SessionFactory(Protocol):
    def __call__(
        self,
        user: Any = None,
        *,
        title: str | None = None,
        mode: str = "default",
        model: str = "demo",
        limits: dict[str, int] | None = None,
    ) -> Session: ...


@pytest.fixture
def make_session(db: None, owner: Any) -> SessionFactory:
    """Create a Session row and journal its SESSION_CREATED (seq 1), like create_session."""

    def factory(
        user: Any = None,
        *,
        title: str | None = None,
        mode: str = "default",
        model: str = "demo",
        limits: dict[str, int] | None = None,
    ) -> Session:
        from sessions_app.actions.teams import DEFAULT_TEAM, check_session_team

        who = user or owner
        # The owner's team when they have exactly one, as do_create_session chooses.
        team = check_session_team(who, DEFAULT_TEAM)
        session = Session.objects.create(owner=who, mode=mode, model=model, team=team)
        payload: dict[str, Any] = {"mode": mode, "model": model}
        if title is not None:
            payload["title"] = title
        if limits is not None:
            payload["limits"] = limits
        DatabaseJournal().append_sync(session.id, [NewEvent(EventType.SESSION_CREATED, payload)])
        session.refresh_from_db()
        return session

    return factory


@pytest.fixture
def session(make_session: SessionFactory) -> Session:
    """One session of the owner's, titled "Test session"."""
    return make_session(title="Test session")


def http_scope(
    method: str,
    path: str,
    *,
    headers: list[tuple[bytes, bytes]] | None = None,
    query_string: bytes = b"",
    host: str = "127.0.0.1",
) -> dict[str, Any]:
    """The ASGI scope a server (Daphne) hands the application for one HTTP request to
    `host`: its `host` header first, then `headers`."""
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": query_string,
        "root_path": "",
        "headers": [(b"host", host.encode()), *(headers or [])],
        "client": ("127.0.0.1", 50000),
        "server": (host, 80),
    }


def run_threads(count: int, target: Callable[[int], Any]) -> tuple[list[Any], list[BaseException]]:
    """Run target(i) in `count` threads released together by a barrier; each thread closes
    its own database connection. Returns (results, errors); no thread is left running."""
    barrier = threading.Barrier(count)
    results: list[Any] = []
    errors: list[BaseException] = []

    def body(i: int) -> None:
        try:
            barrier.wait(timeout=30)
            results.append(target(i))
        except BaseException as error:  # reported by the test
            errors.append(error)
        finally:
            connection.close()

    threads = [threading.Thread(target=body, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=90)
    assert not any(thread.is_alive() for thread in threads)
    return results, errors


def compiled_models(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """From now on, for the rest of the test: the model of every query Django compiles, in
    order (for the once-a-second looks that must compile their statement only once)."""
    from django.db.models.sql.compiler import SQLCompiler

    compiled: list[Any] = []
    as_sql = SQLCompiler.as_sql

    def counting(self: SQLCompiler, *args: Any, **kwargs: Any) -> Any:
        compiled.append(self.query.model)
        return as_sql(self, *args, **kwargs)

    monkeypatch.setattr(SQLCompiler, "as_sql", counting)
    return compiled


def join_team(user: Any, role: str, *owners_or_sessions: Any, team: str = "crew") -> Any:
    """Give `user` `role` in `team` (made if missing), with the given owners as members and
    their personal sessions (or the given sessions) moved into the team. Returns a fresh
    user object."""
    from sessions_app.models import Membership, Session, Team

    crew, _ = Team.objects.get_or_create(name=team)
    for thing in owners_or_sessions:
        if isinstance(thing, Session):
            Session.objects.filter(pk=thing.pk).update(team=crew)
            thing.team_id = crew.pk
            owner_id = thing.owner_id
        else:
            owner_id = thing.pk
            Session.objects.filter(owner_id=owner_id, team__isnull=True).update(team=crew)
        Membership.objects.get_or_create(team=crew, user_id=owner_id, defaults={"role": Membership.MEMBER})
    Membership.objects.update_or_create(team=crew, user=user, defaults={"role": role})
    return type(user).objects.get(pk=user.pk)


def crew_people(*also: str) -> dict[str, Any]:
    """The users by name: owner (a member of team crew), member, reviewer and moderator (of
    crew, in those roles), outsider (moderator of team other), staff, and the users `also`
    (in no team)."""
    from sessions_app.actions.teams import do_create_team, do_set_membership

    do_create_team("crew")
    do_create_team("other")
    users = {name: make_user(name) for name in ("owner", "member", "reviewer", "moderator", "outsider", *also)}
    users["staff"] = make_user("staff", is_staff=True)
    do_set_membership("crew", "owner", "member")
    for role in ("member", "reviewer", "moderator"):
        do_set_membership("crew", role, role)
    do_set_membership("other", "outsider", "moderator")
    return users


async def until_idle(worker: Any, *, timeout: float, pending: bool = False) -> None:
    """Wait until no run is queued or running (and, with `pending`, none waits behind
    another, except behind an ask) and `worker` has no task, for 5 polls in a row; fails if
    that takes longer than `timeout` seconds."""
    import asyncio
    import time

    from sessions_app.dbthread import run_in_db_thread
    from sessions_app.models import Run

    waiting = [Run.QUEUED, Run.RUNNING, *([Run.PENDING] if pending else [])]

    def busy() -> bool:
        return Run.objects.filter(status__in=waiting).exclude(status=Run.PENDING, session__status="awaiting").exists()

    deadline = time.monotonic() + timeout
    quiet = 0
    while quiet < 5:
        idle = not await run_in_db_thread(busy) and not worker.tasks
        quiet = quiet + 1 if idle else 0
        assert time.monotonic() < deadline, "runs did not finish in time"
        await asyncio.sleep(0.05)


def work_until_idle(runtime: Any, *, timeout: float = 30.0, concurrency: int = 4, pending: bool = False) -> None:
    """Run an in-process worker with `runtime` until its runs are done (until_idle, with
    `timeout` and `pending`)."""
    import asyncio

    from sessions_app.worker import Worker

    async def main() -> None:
        worker = Worker(concurrency=concurrency, poll_interval=0.05, lease=5.0, runtime=runtime, listen=False)
        task = asyncio.ensure_future(worker.run(drain_timeout=5))
        try:
            await until_idle(worker, timeout=timeout, pending=pending)
        finally:
            worker.stop()
            await task

    asyncio.run(main())
