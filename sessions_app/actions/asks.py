"""Approval asks: a person's verdict or vote (quorum), and the expiry of overdue asks.

Every verdict on an ask serialises on its session's row lock (`_locked`): the first
verdict that completes a decision wins and resumes the session as a new run; any later
one finds the ask no longer pending and gets AskNotPending (409) naming who decided it.
The expiry sweep (sessions_app.moderation.expiry) denies through the same door, so a
person and any number of workers racing on one ask still decide it exactly once.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import QuerySet
from django.utils import timezone

from sectr import operations
from sectr.errors import AskNotPending, NotFound, ValidationFailed
from sessions_app import access, runs
from sessions_app.action_links import ActionLink, LinkRefused
from sessions_app.actions.sessions import _locked, _username
from sessions_app.compiled import AtNow
from sessions_app.journal import get_journal
from sessions_app.models import ActionLinkUse, AskIndex, Run, Session
from sessions_app.runtime import check_edited_arguments

ASK_STATES = ("pending", "decided")


def find_ask_session(ask_id: str) -> Session:
    if not isinstance(ask_id, str) or not ask_id.startswith("ask_") or len(ask_id) > 64:
        raise NotFound("no such ask")
    index = AskIndex.objects.select_related("session").filter(pk=ask_id).first()
    if index is None:
        raise NotFound("no such ask")
    return index.session


def do_decide(
    actor: Any,
    ask_id: str,
    verdict: str,
    *,
    note: str | None = None,
    scope: str | None = None,
    arguments: dict[str, Any] | None = None,
    result: str | None = None,
) -> Run | None:
    """A person's verdict on an ask: the decision (N = 1) or a vote (N > 1, sectr.operations.vote_events).

    `allow_once` with `arguments` runs the call as the person edited it; `respond` with
    `result` answers the call with their text instead of running it (sectr.context).

    `scope="turn"` ("Approve all", an approving verdict on an ask one person decides)
    also approves the later gated calls of the ask's turn that would otherwise ask; the
    core journals each as decided by the same person (sectr.context `_turn_decision`).
    Returns the resumed run, or None for a vote that leaves the quorum short. Locking:
    takes the session's row lock itself, and checks the actor's access on it (404
    strangers, 403 readers) before anything else.
    """
    session_id = find_ask_session(ask_id).pk
    with _locked(session_id, actor, "approve") as (session, state):
        if note is not None and (not isinstance(note, str) or len(note) > 2000):
            raise ValidationFailed("note must be a string of at most 2,000 characters", code="invalid_note")
        operations.check_scope_value(verdict, scope)
        operations.check_answer_values(verdict, arguments, result)
        if arguments is not None:
            ask = state.asks.get(ask_id) or {}
            if ask.get("status") == "pending":  # a decided one is refused as such, below
                check_edited_arguments(str(ask.get("name") or ""), arguments, session.pk)
        requester = session.owner.get_username()
        invocation_id, events = operations.vote_events(
            state,
            ask_id,
            verdict,
            approver=_username(actor),
            note=note,
            requester=requester,
            scope=scope,
            arguments=arguments,
            result=result,
        )
        if invocation_id is None:
            get_journal().append_sync(session.pk, events)
            return None
        return runs.queue_run(session, invocation_id, events)


def do_expire_ask(ask_id: str, now: datetime | None = None) -> Run | None:
    """Deny an ask whose deadline has passed (approver "policy:expired") and resume its
    run; None when it is not due or no longer pending (decided, withdrawn, or expired by
    another worker a moment ago). Safe to call from any number of workers at once."""
    now = now or timezone.now()
    session = find_ask_session(ask_id)
    with _locked(session.pk) as (session, state):
        # Re-read under the lock: the row the sweep saw may be stale by now.
        index = AskIndex.objects.filter(pk=ask_id, status=AskIndex.PENDING, deadline__lte=now).first()
        if index is None:
            return None
        ask = state.asks.get(ask_id) or {}
        try:
            invocation_id, events = operations.expired_events(state, ask_id, ask.get("expires_after_s"))
        except AskNotPending:
            return None
        return runs.queue_run(session, invocation_id, events)


#: due_ask_ids' statement (the sweep's default limit), compiled once (sessions_app.compiled).
_due_asks = AtNow(
    lambda now: (
        AskIndex.objects.filter(status=AskIndex.PENDING, deadline__lte=now)
        .order_by("deadline")
        .values_list("ask_id")[:100]
    ),
    AskIndex._meta.get_field("deadline"),
)


def due_ask_ids(now: datetime | None = None, limit: int = 100) -> list[str]:
    """Pending asks whose deadline has passed, oldest deadline first (index status, deadline).

    Every worker asks once a second, idle or not: the sweep's statement is compiled once
    and only `now` changes (compiling the queryset each time was most of the look's
    ~0.8 ms of CPU on an idle worker)."""
    now = now or timezone.now()
    if limit == 100:
        return [row[0] for row in _due_asks.rows(now)]
    return list(
        AskIndex.objects.filter(status=AskIndex.PENDING, deadline__lte=now)
        .order_by("deadline")
        .values_list("ask_id", flat=True)[:limit]
    )


def visible_asks(
    actor: Any, *, state: str | None = None, team: str | None = None, tool: str | None = None
) -> QuerySet[AskIndex]:
    """The asks `actor` may see, filtered (GET /api/v1/asks), newest first."""
    asks = access.visible_asks(actor)
    if state is not None:
        if state not in ASK_STATES:
            raise ValidationFailed("state must be pending or decided", code="invalid_filter")
        asks = asks.filter(status="pending") if state == "pending" else asks.exclude(status="pending")
    if team:
        asks = asks.filter(session__team__name=team)
    if tool:
        asks = asks.filter(tool=tool)
    return asks.select_related("session", "session__team", "session__owner").order_by("-requested_at", "ask_id")


LINK_VERDICTS = ("allow_once", "deny")


def do_decide_by_link(actor: Any, link: ActionLink, verdict: str, *, note: str | None = None) -> Run | None:
    """An action link's decision (sessions_app.action_links): Approve once or Deny,
    with a note, as `actor`. The link is spent in the decision's transaction, so a link
    decides once (a replay is LinkRefused "used") and a refused decision spends nothing."""
    if verdict not in LINK_VERDICTS:
        raise ValidationFailed("an action link approves once or denies", code="invalid_verdict")
    with transaction.atomic():
        try:
            with transaction.atomic():
                ActionLinkUse.objects.create(
                    digest=link.digest, ask_id=link.ask_id, used_by=(_username(actor) or "")[:150]
                )
        except IntegrityError:
            raise LinkRefused("used", "This link has been used already.") from None
        return do_decide(actor, link.ask_id, verdict, note=note)
