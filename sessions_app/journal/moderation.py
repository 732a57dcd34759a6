"""What the journal records alongside the envelopes of moderation: the audit rows and
the notifications (webhook calls, emails) they cause.

Every ask (APPROVAL_REQUESTED; one a rule decided at once carries its ``decision`` and
gives a second row, the rule's), vote (APPROVAL_VOTED), decision (INVOCATION_STARTED
whose reason is ``approval_decision``: a person's verdict, an approval rule's
``rule:<id>`` or the expiry policy's ``policy:expired``) and withdrawal
(INVOCATION_CANCELLED naming an ``ask_id``) becomes one `AuditEntry` row.

`record_moderation` runs inside DatabaseJournal's append, in the same transaction as
the envelopes (so the audit can never disagree with a committed journal, and a rolled
back append leaves no row); `rebuild_audit` recomputes every row from the journal alone
(``manage.py sectr_rebuild_audit``). Both go through `audit_rows`, so they agree.

`queue_notifications` writes the notification outbox (NotificationDelivery rows) in
the same transaction; the worker loop delivers them (sessions_app.moderation.notifications).

This module is part of the journal layer: it imports models and the core only.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, transaction

from sectr.asks import ASK_EVENT_TYPES, ask_changes
from sectr.events import IMPORTED_PREFIX, Envelope, EventType
from sectr.rules import EXPIRED_APPROVER
from sectr.state import SessionState
from sessions_app import models
from sessions_app.action_links import WEBHOOK, link_url

#: The envelope types an audit row can come from (rebuild_audit reads only these).
AUDITED_TYPES = ASK_EVENT_TYPES
RULE_APPROVER_PREFIX = "rule:"
NOTE_MAX = 2000

#: (payload, asked_at) of an ask, by ask id
AskLookup = Callable[[str], tuple[dict[str, Any], datetime | None] | None]


def is_audited(envelope: Envelope) -> bool:
    return bool(ask_changes(envelope))


def matched_rule(ask: dict[str, Any]) -> str:
    """How an ask names the approval rule that matched it ("" for none).

    The core records the rule with the ask (``rule``: the rule's id, or an object with an
    ``id``; or ``rule_id``).
    """
    rule = ask.get("rule", ask.get("rule_id"))
    if isinstance(rule, dict):
        rule = rule.get("id", rule.get("tool"))
    return "" if rule is None else str(rule)[:200]


def decision_kind(approver: str) -> str:
    # An imported decision (`imported:rule:<id>`, sectr.events.imported_name) keeps its
    # kind; its actor keeps the prefix, so it is never a live user's (or rule's) row.
    approver = approver.removeprefix(IMPORTED_PREFIX)
    if approver.startswith(RULE_APPROVER_PREFIX):
        return models.AuditEntry.RULE
    if approver == EXPIRED_APPROVER:
        return models.AuditEntry.EXPIRY
    return models.AuditEntry.DECISION


def audit_rows(
    session_id: str, requester: str, envelopes: Iterable[Envelope], find_ask: AskLookup
) -> list[models.AuditEntry]:
    """The audit rows of `envelopes` (one session's, seq ascending).

    `find_ask` gives the ask payload and time of an ask journaled before this batch;
    asks of the batch itself are found in it.
    """
    asks: dict[str, tuple[dict[str, Any], datetime | None]] = {}

    def ask_of(ask_id: str) -> tuple[dict[str, Any], datetime | None]:
        found = asks.get(ask_id) or find_ask(ask_id)
        return found if found is not None else ({}, None)

    rows: list[models.AuditEntry] = []

    def add(envelope: Envelope, ask_id: str, kind: str, actor: str, **fields: Any) -> None:
        ask, asked_at = ask_of(ask_id)
        row = models.AuditEntry(
            session_id=session_id,
            seq=envelope.seq,
            at=envelope.created_at,
            requester=requester[:150],
            kind=kind,
            actor=actor[:150],
            ask_id=ask_id[:64],
            tool=str(ask.get("name", ""))[:100],
            arguments=ask.get("arguments") if isinstance(ask.get("arguments"), dict) else {},
            rule=matched_rule(ask),
            asked_at=asked_at,
            **fields,
        )
        if not row.rule and kind == models.AuditEntry.RULE:
            row.rule = actor.removeprefix(IMPORTED_PREFIX).removeprefix(RULE_APPROVER_PREFIX)
        if asked_at is not None and kind != models.AuditEntry.ASK:
            row.seconds_to_decide = max(0.0, (envelope.created_at - asked_at).total_seconds())
        rows.append(row)

    def add_decision(envelope: Envelope, ask_id: str, decision: dict[str, Any]) -> None:
        approver = str(decision.get("approver") or "")
        approved = bool(decision.get("approved"))
        verdict = str(decision.get("verdict") or ("allow_once" if approved else "deny"))
        # A person's answer instead of the call is their words on it, as a deny's note is.
        note = str(decision.get("result") if verdict == "respond" else decision.get("note") or "")[:NOTE_MAX]
        edited = decision.get("arguments")
        run_arguments = edited if approved and isinstance(edited, dict) else None
        add(
            envelope, ask_id, decision_kind(approver), approver, verdict=verdict, note=note, run_arguments=run_arguments
        )
        if decision.get("with_ask"):
            # Approved with another ask of its turn ("Approve all"): the person's time is
            # that ask's, so this row does not count in the time to decision.
            rows[-1].note = rows[-1].note or f"Approve all, with {str(decision['with_ask'])[:64]}"
            rows[-1].seconds_to_decide = None

    for envelope in envelopes:
        payload = envelope.payload
        # A rule's ask is requested and decided (at once) by the same envelope, in that order.
        for change in ask_changes(envelope):
            if change.kind == "requested":
                asks[change.ask_id] = (payload, envelope.created_at)
                add(envelope, change.ask_id, models.AuditEntry.ASK, requester)
            elif change.kind == "withdrawn":
                add(envelope, change.ask_id, models.AuditEntry.WITHDRAWN, str(payload.get("by") or ""))
            elif change.kind == "voted":
                add(
                    envelope,
                    change.ask_id,
                    models.AuditEntry.VOTE,
                    str(payload.get("approver") or ""),
                    verdict=str(payload.get("verdict") or ""),
                    note=str(payload.get("note") or "")[:NOTE_MAX],
                )
            else:  # decided or expired
                add_decision(envelope, change.ask_id, change.decision)
    return rows


def _ask_from_audit(session_id: str, using: str, state: SessionState | None) -> AskLookup:
    def find(ask_id: str) -> tuple[dict[str, Any], datetime | None] | None:
        row = (
            models.AuditEntry.objects.using(using)
            .filter(session_id=session_id, ask_id=ask_id, kind=models.AuditEntry.ASK)
            .only("tool", "arguments", "rule", "asked_at", "at")
            .first()
        )
        if row is None:
            # An ask journaled before the audit existed (rebuild_audit fills in its time).
            ask = state.asks.get(ask_id) if state is not None else None
            return (ask, None) if ask is not None else None
        return {"name": row.tool, "arguments": row.arguments, "rule": row.rule or None}, row.at

    return find


def record_moderation(
    session: models.Session,
    envelopes: Sequence[Envelope],
    state: SessionState | None = None,
    *,
    using: str = DEFAULT_DB_ALIAS,
) -> list[models.AuditEntry]:
    """Write the audit rows of one append (inside its transaction, under its Session lock)."""
    if not any(is_audited(envelope) for envelope in envelopes):
        return []
    requester = (
        models.Session.objects.using(using).filter(pk=session.pk).values_list("owner__username", flat=True).first()
        or ""
    )
    rows = audit_rows(session.pk, requester, envelopes, _ask_from_audit(session.pk, using, state))
    models.AuditEntry.objects.using(using).bulk_create(rows)
    team_id = models.Session.objects.using(using).filter(pk=session.pk).values_list("team_id", flat=True).first()
    if team_id is not None:
        # A re-ask after a crash says the first attempt may have run (its APPROVAL_REQUESTED).
        may_have_run = {
            str(envelope.payload.get("ask_id"))
            for envelope in envelopes
            if envelope.type is EventType.APPROVAL_REQUESTED and envelope.payload.get("may_have_run")
        }
        queue_notifications(team_id, session, rows, using=using, may_have_run=may_have_run)
    return rows


EVENT_OF_KIND = {
    models.AuditEntry.ASK: "ask.requested",
    models.AuditEntry.VOTE: "ask.voted",
    models.AuditEntry.DECISION: "ask.decided",
    models.AuditEntry.RULE: "ask.decided",
    models.AuditEntry.EXPIRY: "ask.decided",
    models.AuditEntry.WITHDRAWN: "ask.withdrawn",
}


def card_url(ask_id: str) -> str:
    """Where a person decides the ask: its card in the queue."""
    base = str(getattr(settings, "SECTR_BASE_URL", "") or "").rstrip("/")
    # The card's HTML id (sessions_app.display.content.dom_id) for the ids Sectr makes.
    anchor = f"#ask-{ask_id}" if re.fullmatch(r"[A-Za-z0-9_-]{1,80}", ask_id) else ""
    return f"{base}/approvals/{anchor}"


def notification_payload(
    event: str, team: str, session: models.Session, row: models.AuditEntry, *, may_have_run: bool = False
) -> dict[str, Any]:
    """The JSON body of a webhook call (and the facts of an email). `may_have_run`: the
    ask is a re-ask after a crash cut the approved call off (it may have taken effect)."""
    return {
        "event": event,
        "team": team,
        "session_id": session.pk,
        "session_title": session.title,
        "ask_id": row.ask_id,
        "tool": row.tool,
        "arguments": row.arguments,
        "requester": row.requester,
        "actor": row.actor,
        "verdict": row.verdict or None,
        "note": row.note or None,
        "edited": row.edited,
        "run_arguments": row.run_arguments,
        "rule": row.rule or None,
        "at": row.at.isoformat(),
        "seconds_to_decide": row.seconds_to_decide,
        "may_have_run": may_have_run,
        "url": card_url(row.ask_id),
        # A new ask's notice links to its action page (sessions_app.action_links); a
        # webhook's link needs a login. An email's links are made per recipient when sent.
        "action_url": link_url(row.ask_id, WEBHOOK) if event == "ask.requested" else None,
    }


def queue_notifications(
    team_id: int,
    session: models.Session,
    rows: Sequence[models.AuditEntry],
    *,
    using: str = DEFAULT_DB_ALIAS,
    may_have_run: frozenset[str] | set[str] = frozenset(),
) -> list[models.NotificationDelivery]:
    """The outbox rows of one append: a webhook call per active webhook of the team for
    every row, and an email to the team's moderators for every ask that waits for people
    (not one decided at once: by a rule, or by a person's "Approve all" of its turn). The
    worker loop sends them (sessions_app.moderation.notifications)."""
    webhooks = list(models.TeamWebhook.objects.using(using).filter(team_id=team_id, active=True))
    # An ask decided at once has its decision row at its own seq (a person's decision of
    # a waiting ask is a later INVOCATION_STARTED, at another seq).
    decided_at_once = {row.seq for row in rows if row.kind in (models.AuditEntry.RULE, models.AuditEntry.DECISION)}
    waiting = [row for row in rows if row.kind == models.AuditEntry.ASK and row.seq not in decided_at_once]
    recipients: list[str] = []
    if waiting:
        recipients = sorted(
            {
                email
                for email in models.Membership.objects.using(using)
                .filter(team_id=team_id, role=models.Membership.MODERATOR, user__is_active=True)
                .values_list("user__email", flat=True)
                if email
            }
        )
    if not webhooks and not recipients:
        return []
    team = models.Team.objects.using(using).filter(pk=team_id).values_list("name", flat=True).first() or ""
    deliveries: list[models.NotificationDelivery] = []
    for row in rows:
        if row.kind == models.AuditEntry.ASK and row.seq in decided_at_once:
            continue  # announced once, by its decision row
        event = EVENT_OF_KIND[row.kind]
        payload = notification_payload(
            event, team, session, row, may_have_run=event == "ask.requested" and row.ask_id in may_have_run
        )
        common = {
            "team_id": team_id,
            "event": event,
            "ask_id": row.ask_id,
            "session_id": session.pk,
            "payload": payload,
        }
        deliveries += [
            models.NotificationDelivery(channel=models.NotificationDelivery.WEBHOOK, webhook=hook, **common)
            for hook in webhooks
        ]
        if row in waiting and recipients:
            email = {**common, "payload": {**payload, "action_url": None}}
            deliveries.append(
                models.NotificationDelivery(channel=models.NotificationDelivery.EMAIL, recipients=recipients, **email)
            )
    models.NotificationDelivery.objects.using(using).bulk_create(deliveries)
    return deliveries


def rebuild_audit(*, using: str = DEFAULT_DB_ALIAS, session_ids: Iterable[str] | None = None) -> int:
    """Recompute the audit from the journal alone (every session, or only `session_ids`).

    Each session is rebuilt in its own transaction under its Session row lock, like an
    append, so no decision slips in between the read of the journal and the write.
    Returns how many rows were written.
    """
    sessions = models.Session.objects.using(using).order_by("created_at")
    if session_ids is not None:
        sessions = sessions.filter(pk__in=list(session_ids))
    audited = [t.value for t in AUDITED_TYPES]
    written = 0
    for session_id in sessions.values_list("pk", flat=True).iterator():
        with transaction.atomic(using=using):
            locked = (
                models.Session.objects.using(using)
                .select_for_update(no_key=True)
                .select_related("owner")
                .filter(pk=session_id)
                .first()
            )
            if locked is None:
                continue  # deleted meanwhile
            envelopes = [
                row.to_envelope()
                for row in models.Envelope.objects.using(using)
                .filter(session_id=session_id, type__in=audited)
                .order_by("seq")
            ]
            models.AuditEntry.objects.using(using).filter(session_id=session_id).delete()
            rows = audit_rows(session_id, locked.owner.get_username(), envelopes, lambda _ask_id: None)
            models.AuditEntry.objects.using(using).bulk_create(rows)
            written += len(rows)
    return written
