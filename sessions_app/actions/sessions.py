"""Every state change of a session, in one place (Zulip style).

Each `do_*` validates first (the pure rules of sectr.operations), then writes once,
atomically (the journal append and the Run row in one transaction, under the session's
row lock), then notifies on commit (the journal publishes its envelopes; a queued run
wakes the workers). Bad input raises a typed sectr.errors.SectrError and writes nothing.
Views, the API, consumers and workers call these; none of them saves models itself.

Locking precondition of every `do_*` that changes a session: it takes the session's row
lock itself (`_locked`), so callers must not hold other session locks.

Access: a `do_*` that locks the session checks the actor's access once, on the row it
locked (`_locked(session_id, actor, need)`: NotFound for strangers, Forbidden for readers,
nothing written), so callers do not check first. The ones that lock no row of the source
(fork, clear, regenerate, edit, close) check once as they read it; compaction checks once
before its model call (which an outsider must not cause), then locks to write.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from asgiref.sync import async_to_sync
from django.db import connections, router, transaction
from django.utils import timezone

from sectr import operations
from sectr.compaction import compacted_payload
from sectr.errors import (
    NotAtTurnBoundary,
    NotFound,
    SessionBusy,
    StaleRunControl,
    ValidationFailed,
)
from sectr.events import EventType
from sectr.fold import fold_messages
from sectr.journal import NewEvent
from sectr.state import SessionState
from sessions_app import access, media, runs
from sessions_app.access import check_access, check_session_id, get_session_for_user
from sessions_app.actions.agents import resolve_new_session_agent
from sessions_app.actions.teams import DEFAULT_TEAM, check_session_team
from sessions_app.budgets import BudgetExceeded, setting_budget, spend
from sessions_app.journal import get_journal
from sessions_app.models import MediaBlob, Run, Session
from sessions_app.plain_sql import hot_cursor, model_columns, model_instances
from sessions_app.provider_config import default_model
from sessions_app.runs import promote_pending_run
from sessions_app.runtime import get_runtime, session_model_info

log = logging.getLogger("sectr.actions")


@contextmanager
def _locked(
    session_id: str, actor: Any = None, need: access.Need | None = None
) -> Iterator[tuple[Session, SessionState]]:
    """A transaction holding the session's row lock, with its current projection.

    On PostgreSQL the row lock serialises writers of one session; on SQLite the
    IMMEDIATE transaction already serialises every writer. With `need`, `actor`'s
    access is checked on the locked row (NotFound / Forbidden, nothing written): one
    read of the row for both, where a check before the lock read it twice.
    """
    if need is not None:
        check_session_id(session_id)
    with transaction.atomic():
        session = _locked_session_row(session_id)
        if need is not None:
            check_access(actor, session, need)
        yield session, session.projection()


def _locked_session_row(session_id: str) -> Session:
    """`Session.objects.select_for_update().get(pk=session_id)` in plain SQL (every run's
    POST locks its session, and compiling the queryset cost more than running it);
    NotFound when there is no such row."""
    connection = connections[router.db_for_write(Session)]
    qn = connection.ops.quote_name
    table = qn(Session._meta.db_table)
    sql = f"SELECT {model_columns(connection, Session, table)} FROM {table} WHERE {qn('id')} = %s"  # noqa: S608 - quoted names
    if connection.features.has_select_for_update:
        sql += " FOR UPDATE"
    with hot_cursor(connection) as cursor:
        cursor.execute(sql, [session_id])
        rows = cursor.fetchall()
    if not rows:
        raise NotFound("no such session")
    session: Session = model_instances(connection, Session, rows)[0]
    return session


def _username(user: Any) -> str | None:
    return user.get_username() if user is not None and user.is_authenticated else None


# ---- create ----


def check_new_session_budget(actor: Any) -> None:
    """Spend one of `actor`'s new sessions this window (SECTR_SESSION_CREATE_LIMIT, "30/60");
    BudgetExceeded (429) past it. The pages and the API call it before create, fork and
    clear; scripts and commands that call the actions directly are not bounded.
    """
    limit, window = setting_budget("SECTR_SESSION_CREATE_LIMIT", "30/60")
    if not limit or actor is None or not actor.is_authenticated:
        return
    # The join time is part of the key: a rebuilt database hands the same user id out again.
    joined = getattr(actor, "date_joined", None)
    spent = spend("new-session", f"{actor.pk}:{joined.timestamp() if joined else 0:.6f}", window)
    if spent.count > limit:
        raise BudgetExceeded(
            f"at most {limit} new sessions per {window} s; try again in {spent.retry_after} s",
            retry_after=spent.retry_after,
        )


def do_create_session(
    owner: Any,
    *,
    title: str | None = None,
    mode: str | None = None,
    model: str | None = None,
    limits: dict[str, int] | None = None,
    reasoning_effort: str | None = None,
    team: Any = DEFAULT_TEAM,
    agent: Any = None,
    agent_version: Any = None,
) -> Session:
    """A new session of `owner`, in `team` (a name; None: personal; left out: the owner's
    team when they have exactly one), pinned to `agent` at `agent_version` (an id or
    `team/slug`; left out: the team's first agent, else the built-in one)."""
    chosen = check_session_team(owner, team)
    pinned = resolve_new_session_agent(owner, chosen, agent, agent_version)
    events = operations.create_events(
        title=title,
        mode=mode,
        model=model,
        limits=limits,
        reasoning_effort=reasoning_effort,
        default_model=default_model(),
        agent=pinned.spec() if pinned is not None else None,
    )
    with transaction.atomic():
        session = Session.objects.create(owner=owner, team=chosen)
        get_journal().append_sync(session.pk, events)
    session.refresh_from_db()
    return session


def _inherited_team(actor: Any, source: Session) -> Any:
    """A fork or clear stays in the source's team when its new owner has a role there."""
    return source.team_id if access.team_role(actor, source.team_id) is not None else None


# ---- runs ----


def do_post_message(actor: Any, session_id: str, content: str | list[dict[str, Any]], *, queue: bool = False) -> Run:
    """Start a run for a user message; 409 while a run is active unless `queue`.

    A queued message waits as a `pending` Run (nothing journaled) and starts when the
    active run ends. A pending run (a queued prompt or retry) is never overtaken.
    """
    check_content(content)
    with _locked(session_id, actor, "write") as (session, state):
        if state.status == "awaiting":
            operations.check_can_start(state)  # 409 awaiting_approval: decide the ask first
        if state.is_active or runs.has_pending_run(session):
            if not queue:
                raise SessionBusy("a run is active in this session; wait for it, cancel it, or queue the message")
            reason: dict[str, Any] = {"kind": "user_message", "input": {"content": content}}
            if (author := _username(actor)) is not None:
                reason["author"] = author
            return runs.queue_pending_run(session, reason)
        invocation_id, events = operations.message_events(state, content, author=_username(actor))
        return runs.queue_run(session, invocation_id, events)


def check_content(content: Any) -> None:
    if isinstance(content, str):
        if not content.strip():
            raise ValidationFailed("the message is empty", code="prompt")
        if len(content) > 200_000:
            raise ValidationFailed("the message is longer than 200,000 characters", code="prompt")
        return
    if not isinstance(content, list) or not content:
        raise ValidationFailed("content must be a string or a non-empty list of parts", code="prompt")
    for part in content:
        if not isinstance(part, dict) or part.get("type") not in ("text", "image_url", "input_audio"):
            raise ValidationFailed(
                "each part must be an object with type text, image_url or input_audio", code="prompt"
            )
        if part["type"] == "text" and not isinstance(part.get("text"), str):
            raise ValidationFailed("a text part needs a string text", code="prompt")


def do_retry(actor: Any, session_id: str) -> Run:
    with _locked(session_id, actor, "write") as (session, state):
        invocation_id, events = operations.retry_events(state)
        return runs.queue_run(session, invocation_id, events)


def _run(run_id: str) -> Run:
    try:
        return Run.objects.get(pk=run_id)
    except (Run.DoesNotExist, ValueError):
        raise NotFound("no such run") from None


def _current_run(session: Session, state: SessionState) -> Run:
    """The run a Stop or Steer on the session means: the running one, or the one paused on an ask."""
    invocation_id: str | None = None
    if state.status == "running":
        invocation_id = state.current_invocation_id
    elif state.status == "awaiting" and state.pending_ask:
        invocation_id = state.pending_ask.get("invocation_id")
    run = Run.objects.filter(session=session, invocation_id=invocation_id).first() if invocation_id else None
    if run is None:
        raise StaleRunControl("no run is active in this session")
    return run


def do_steer(actor: Any, run_id: str, text: str) -> Run:
    """Park a steer in the run's slot; the worker journals it at the next step boundary."""
    run = _run(run_id)
    with _locked(run.session_id, actor, "write") as (_session, state):
        return runs.park_steer(run, state, text, _username(actor))


def do_steer_current(actor: Any, session_id: str, text: str) -> Run:
    """do_steer for the session's current run (the page's Steer button, which sends what
    is in the message box: an empty box is refused before the run is looked up)."""
    with _locked(session_id, actor, "write") as (session, state):
        if not isinstance(text, str) or not text.strip():
            raise ValidationFailed("write the steer in the message box first", code="invalid_steer")
        return runs.park_steer(_current_run(session, state), state, text, _username(actor))


def do_cancel(actor: Any, run_id: str) -> Run:
    """Cancel a run: a worker stops it at once; a suspended run's ask is withdrawn.

    A run no worker holds (pending, queued, suspended) ends here, under the session
    lock (sessions_app.runs.cancel_run); then the session's next queued message, if
    any, starts.
    """
    run = _run(run_id)
    return _cancel(actor, run.session_id, lambda _session, _state: run)


def do_cancel_current(actor: Any, session_id: str) -> Run:
    """do_cancel for the session's current run (the page's Stop button)."""
    return _cancel(actor, session_id, _current_run)


def _cancel(actor: Any, session_id: str, which: Callable[[Session, SessionState], Run]) -> Run:
    with _locked(session_id, actor, "write") as (session, state):
        run, ended = runs.cancel_run(which(session, state), state, _username(actor))
    if ended:
        # No worker will finish this run, so nobody else would start the next message.
        promote_pending_run(run.session_id)
    return run


# ---- session operations ----


def do_rename(actor: Any, session_id: str, title: str) -> Session:
    title = operations.check_title(title)
    with _locked(session_id, actor, "write") as (session, _state):
        get_journal().append_sync(
            session.pk, [NewEvent(EventType.SESSION_UPDATED, {"title": title, "title_source": "user"})]
        )
    return Session.objects.get(pk=session_id)


def do_set_mode(actor: Any, session_id: str, mode: str) -> Session:
    with _locked(session_id, actor, "write") as (session, state):
        mode = operations.check_mode_change(state, mode)
        get_journal().append_sync(session.pk, [NewEvent(EventType.SESSION_UPDATED, {"mode": mode})])
    return Session.objects.get(pk=session_id)


def do_move_agent(actor: Any, session_id: str, version: Any, agent: Any = None) -> Session:
    """Move a session to another version of its agent (or, with `agent`, to another
    agent of its team): one SESSION_UPDATED with `agent`, only between runs."""
    with _locked(session_id, actor, "write") as (session, state):
        if agent is None:
            agent = (state.agent or {}).get("id")
            if agent is None:
                raise ValidationFailed(
                    "this session runs the built-in agent, which has one version", code="invalid_agent"
                )
        target = resolve_new_session_agent(actor, session.team, agent, version)
        if target is None:
            raise ValidationFailed("name an agent version to move to", code="invalid_agent")
        get_journal().append_sync(session.pk, operations.agent_moved_events(state, target.spec().pin))
    session.refresh_from_db()
    return session


def do_set_model(actor: Any, session_id: str, model: str, reasoning_effort: str | None = None) -> Session:
    with _locked(session_id, actor, "write") as (session, state):
        changes: dict[str, Any] = {"model": operations.check_model_value(model)}
        if reasoning_effort is not None:
            changes["reasoning_effort"] = operations.check_reasoning_effort(reasoning_effort)
        if state.is_active:
            raise SessionBusy("the model cannot change while a run is active")
        get_journal().append_sync(session.pk, [NewEvent(EventType.SESSION_UPDATED, changes)])
    return Session.objects.get(pk=session_id)


def check_model_choice(model: Any, provider_id: Any, model_id: Any) -> str | None:
    """The model a fork names by `model` or by `provider_id` + `model_id` (the provider
    must be the one this server runs), or None to keep the source's."""
    return operations.check_model_choice(model, provider_id, model_id, get_runtime().provider.provider_id)


def do_fork(
    actor: Any,
    session_id: str,
    *,
    at_seq: int | None = None,
    title: str | None = None,
    model: str | None = None,
    reasoning_effort: str | None = None,
    reason: str | None = None,
    agent_version: Any = None,
    worktree_selector: Any = None,
) -> Session:
    """A new session owned by `actor` starting from the source's fold (now, or at `at_seq`),
    pinned to the source's agent version (or, with `agent_version`, another version of it).

    `worktree_selector` (default: the source's) is stored as given and returned in the
    snapshot's placement; the server never interprets it."""
    source = get_session_for_user(actor, session_id, "read")
    state = source.projection()
    pin = _repinned(actor, source, state, agent_version)
    if at_seq is not None and (
        not isinstance(at_seq, int) or isinstance(at_seq, bool) or not 1 <= at_seq <= state.last_seq
    ):
        raise ValidationFailed(f"at_seq must be a whole number from 1 to {state.last_seq}", code="invalid_seq")
    # Load from the newest compaction at or before the fork point: O(since compaction).
    upto = state.last_seq if at_seq is None else at_seq
    compaction = (
        source.envelopes.filter(type=EventType.TRANSCRIPT_COMPACTED.value, seq__lte=upto).order_by("-seq").first()
    )
    start = compaction.seq if compaction else 1
    envelopes = [row.to_envelope() for row in source.envelopes.filter(seq__gte=start, seq__lte=upto).order_by("seq")]
    events = operations.fork_events(
        state,
        envelopes,
        at_seq=at_seq,
        title=title,
        model=model,
        reasoning_effort=reasoning_effort,
        reason=reason,
        agent=pin,
        worktree_selector=worktree_selector,
    )
    with transaction.atomic():
        fork = Session.objects.create(owner=actor, team_id=_inherited_team(actor, source))
        get_journal().append_sync(fork.pk, events)
    fork.refresh_from_db()
    return fork


# ---- branches: regenerate and edit ----
#
# The journal is append-only, so neither rewrites a session. Both fork the session at
# the seq just before a user message (the fork holds the conversation up to, not
# including, that message) and send a message in the fork: the same one again
# (Regenerate) or the edited text (Edit). The source keeps the earlier answer and
# lists the fork among its branches; the fork's notice links back to the source.


def _user_turn(session: Session, seq: int | None) -> tuple[int, Any]:
    """The seq and content of the user message at `seq` (or of the newest one)."""
    starts = session.envelopes.filter(type=EventType.INVOCATION_STARTED.value).order_by("-seq")
    if seq is not None:
        starts = starts.filter(seq=seq)
    for row in starts.only("seq", "payload").iterator(chunk_size=50):
        reason = row.payload.get("reason") or {}
        given = reason.get("input") if isinstance(reason, dict) else None
        if reason.get("kind") == "user_message" and isinstance(given, dict):
            return row.seq, given.get("content", "")
        if seq is not None:
            break
    if seq is not None:
        raise ValidationFailed(f"event #{seq} is not a message of this session", code="invalid_seq")
    raise ValidationFailed("this session has no message to answer again", code="invalid_seq")


def _branch(actor: Any, source: Session, user_seq: int, content: Any, reason: str) -> Session:
    # One transaction: the fork and its first run appear together or not at all (the
    # run's wake-up is sent on commit, by runs.queue_run).
    with transaction.atomic():
        fork = do_fork(actor, source.pk, at_seq=user_seq - 1, title=source.title or None, reason=reason)
        do_post_message(actor, fork.pk, content)
    fork.refresh_from_db()
    return fork


def do_regenerate(actor: Any, session_id: str) -> Session:
    """Answer the session's newest user message again, in a fork (see above); the fork is returned.

    Only between runs: a reply still being written has nothing to regenerate yet.
    """
    source = get_session_for_user(actor, session_id, "write")
    state = source.projection()
    if not state.at_turn_boundary or runs.has_pending_run(source):
        raise NotAtTurnBoundary("wait for the current run to end before regenerating")
    user_seq, content = _user_turn(source, None)
    return _branch(actor, source, user_seq, content, "regenerate")


def do_edit_message(actor: Any, session_id: str, seq: int, content: str) -> Session:
    """Send an edited version of the user message at `seq`, in a fork at the seq before it."""
    source = get_session_for_user(actor, session_id, "write")
    if not isinstance(seq, int) or isinstance(seq, bool) or not 2 <= seq <= source.last_seq:
        raise ValidationFailed(f"seq must be a whole number from 2 to {source.last_seq}", code="invalid_seq")
    check_content(content)
    user_seq, _original = _user_turn(source, seq)
    return _branch(actor, source, user_seq, content, "edit")


def _repinned(actor: Any, source: Session, state: SessionState, agent_version: Any) -> dict[str, Any] | None:
    """The pin of a fork or clear given `agent_version`: the source's agent at that
    version (None: keep the source's pin)."""
    if agent_version is None:
        return None
    agent = (state.agent or {}).get("id")
    if agent is None:
        raise ValidationFailed("this session runs the built-in agent, which has one version", code="invalid_agent")
    target = resolve_new_session_agent(actor, source.team, agent, agent_version)
    return target.spec().pin if target is not None else None


def do_clear(actor: Any, session_id: str, *, agent_version: Any = None, worktree_selector: Any = None) -> Session:
    """A new empty session inheriting the source's settings, agent pin (or another
    version of its agent) and worktree selector (unless one is given)."""
    source = get_session_for_user(actor, session_id, "write")
    state = source.projection()
    events = operations.clear_events(
        state, agent=_repinned(actor, source, state, agent_version), worktree_selector=worktree_selector
    )
    with transaction.atomic():
        cleared = Session.objects.create(owner=actor, team_id=_inherited_team(actor, source))
        get_journal().append_sync(cleared.pk, events)
    cleared.refresh_from_db()
    return cleared


def do_close(actor: Any, session_id: str) -> Session:
    """Release runtime resources and keep the data; the next message reopens it."""
    get_session_for_user(actor, session_id, "write")
    Session.objects.filter(pk=session_id, closed_at__isnull=True).update(closed_at=timezone.now())
    return Session.objects.get(pk=session_id)


def do_delete(actor: Any, session_id: str) -> None:
    """Delete the session, its journal, runs and media permanently (412 while a run is active)."""
    with _locked(session_id, actor, "write") as (session, state):
        if state.is_active or runs.has_active_run(session):
            raise NotAtTurnBoundary("a run is active; cancel it before deleting the session")
        blob_ids = list(session.media_links.values_list("blob_id", flat=True))
        session.delete()
        MediaBlob.delete_orphans(blob_ids)


@dataclass(frozen=True)
class DeletedSession:
    """What a retention deletion removed (for its log line)."""

    session_id: str
    owner: str
    updated_at: datetime
    envelopes: int
    media_blobs: int


def do_delete_expired(
    session_id: str, *, cutoff: datetime, held: Callable[[str], str | None] = lambda _session_id: None
) -> DeletedSession | None:
    """Retention's delete: the session, its journal, runs and media, like `do_delete`, if
    under its lock it is still idle since before `cutoff`, has no active run and `held`
    names no reason to keep it (under review, shared). None when it is kept.

    No actor: retention is the system's decision (sectr_retention), not a user's.
    """
    with _locked(session_id) as (session, state):
        if session.updated_at >= cutoff or state.is_active or runs.has_active_run(session):
            return None  # used again since it was picked, or a run is going
        if held(session_id):
            return None
        blob_ids = list(session.media_links.values_list("blob_id", flat=True))
        envelopes = session.envelopes.count()
        owner = session.owner.get_username()
        updated_at = session.updated_at
        session.delete()
        blobs = MediaBlob.delete_orphans(blob_ids)
    return DeletedSession(session_id, owner, updated_at, envelopes, blobs)


def do_compact(actor: Any, session_id: str) -> bool:
    """Manual compaction at a turn boundary: True when the model-visible history got shorter."""
    get_session_for_user(actor, session_id, "write")
    session = Session.objects.get(pk=session_id)
    state = session.projection()
    if not state.at_turn_boundary:
        raise NotAtTurnBoundary("compaction happens only between runs")
    envelopes = get_journal().load_since_compaction_sync(session_id)
    messages = fold_messages(envelopes)
    provider = get_runtime().provider
    # The summary is a model call: made outside any transaction, then re-checked.
    payload = async_to_sync(compacted_payload)(provider, state.model, messages, state.last_seq)
    if payload is None:
        return False
    with _locked(session_id) as (session, now):
        if now.last_seq != state.last_seq or not now.at_turn_boundary:
            raise NotAtTurnBoundary("the session moved on while compacting; try again")
        get_journal().append_sync(session.pk, [NewEvent(EventType.TRANSCRIPT_COMPACTED, payload)])
    return True


def do_post_message_with_media(actor: Any, session_id: str, content: Any, *, queue: bool = False) -> Run:
    """do_post_message for content that may hold media parts.

    Validation comes first and writes nothing; then, in one transaction, the media are
    stored and the message is journaled (a refusal by do_post_message, such as 409 busy,
    rolls the media rows back and removes any file this call wrote).
    """
    if not isinstance(content, list):
        return do_post_message(actor, session_id, content, queue=queue)
    session = get_session_for_user(actor, session_id, "write")
    checked = media.validate_parts(content, session_model_info(session.model))
    created: list[str] = []
    try:
        with transaction.atomic():
            parts = media.store_parts(session, checked, created)
            return do_post_message(actor, session_id, parts, queue=queue)
    except BaseException:
        media.forget_files(created)
        raise
