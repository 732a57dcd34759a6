"""The approval queue's view model: the pending asks a user may decide, as cards.

A card is the ask (from the session's projection) with what a moderator needs to decide
it without opening the session: who asked, in which team, the conversation just before
the ask, its age, the approval rule that matched and the votes so far (all from the
session's projection of its journal). Which asks are pending comes from AskIndex (also
a projection, written with the journal). Oldest first. Filters: `team` (a team name),
`tool` (a tool name) and `age` (only asks older than that).

Nothing here writes; deciding goes through sessions_app.actions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django import forms
from django.db.models import Exists, OuterRef, QuerySet
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from sectr.events import Envelope
from sectr.fold import fold_messages
from sessions_app import access
from sessions_app.display.approvals import ApprovalView, turn_calls_waiting
from sessions_app.filter_forms import ChoiceOrNothing, CutText
from sessions_app.journal import get_journal
from sessions_app.journal.moderation import matched_rule
from sessions_app.models import AskIndex, AuditEntry, Session

#: The `Age` filter: only asks older than this.
AGE_CHOICES: dict[str, timedelta] = {
    "1m": timedelta(minutes=1),
    "10m": timedelta(minutes=10),
    "1h": timedelta(hours=1),
    "1d": timedelta(days=1),
}
AGE_LABELS = {
    "": "Any age",
    "1m": "Older than 1 minute",
    "10m": "Older than 10 minutes",
    "1h": "Older than 1 hour",
    "1d": "Older than 1 day",
}
CONTEXT_MESSAGES = 4  # the conversation shown before the ask
CONTEXT_CHARS = 400


class QueueFilterForm(forms.Form):
    """The queue's `Team`, `Tool` and `Age` filters (the page's form and the socket's
    query string). Nothing here is an error: an unknown age means any age."""

    team = CutText(150, strip=False)
    tool = CutText(100, strip=False)
    age = ChoiceOrNothing(AGE_CHOICES, strip=False)


@dataclass
class QueueFilters:
    team: str = ""
    tool: str = ""
    age: str = ""

    @classmethod
    def from_query(cls, query: Any) -> QueueFilters:
        form = QueueFilterForm(data=query)
        form.is_valid()  # always: every field falls back to "no filter"
        return cls(**form.cleaned_data)

    def as_query(self) -> dict[str, str]:
        return {name: value for name, value in (("team", self.team), ("tool", self.tool), ("age", self.age)) if value}

    def matches(self, card: QueueCard) -> bool:
        """The `Team` and `Tool` filters (which never change for an ask)."""
        if self.team and card.team != self.team:
            return False
        return not (self.tool and card.name != self.tool)

    def seconds_until_old_enough(self, card: QueueCard, now: datetime | None = None) -> float | None:
        """When the `Age` filter admits the card: 0 (now), seconds from now, None (never:
        no time of asking)."""
        if not self.age:
            return 0.0
        if card.asked_at is None:
            return None
        due = card.asked_at + AGE_CHOICES[self.age] - (now or timezone.now())
        return max(0.0, due.total_seconds())

    def admits(self, card: QueueCard, now: datetime | None = None) -> bool:
        return self.matches(card) and self.seconds_until_old_enough(card, now) == 0.0


@dataclass
class ContextLine:
    role: str
    text: str


@dataclass
class QueueCard(ApprovalView):
    team: str = ""
    asked_at: datetime | None = None
    rule: str = ""
    context: list[ContextLine] = field(default_factory=list)

    @property
    def asked_at_iso(self) -> str:
        return self.asked_at.isoformat() if self.asked_at else ""


def session_team_name(session: Session) -> str:
    return session.team.name if session.team_id is not None and session.team is not None else ""


def _message_text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):
        text = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type") == "text")
    else:
        text = ""
    if not text and message.get("tool_calls"):
        names = ", ".join(str((c.get("function") or {}).get("name", "")) for c in message["tool_calls"])
        text = f"(calls {names})"
    text = " ".join(text.split())
    return text if len(text) <= CONTEXT_CHARS else text[: CONTEXT_CHARS - 1] + "…"


def conversation_from(envelopes: list[Envelope], ask_seq: int) -> list[ContextLine]:
    """The last few user/assistant messages before the ask (tool results left out)."""
    lines = [
        ContextLine(str(m.get("role")), _message_text(m))
        for m in fold_messages(e for e in envelopes if e.seq < ask_seq)
        if m.get("role") in ("user", "assistant")
    ]
    return [line for line in lines if line.text][-CONTEXT_MESSAGES:]


def journals_before(asks: list[tuple[Session, int]]) -> dict[str, list[Envelope]]:
    """For asks given as (session, ask seq): each session's envelopes from its newest
    compaction (`Session.compaction_seq`) up to its latest ask there, in one journal read
    for them all (load_ranges_sync). The conversation before an ask and the later calls
    of its turn (all journaled before the ask) are both in it."""
    before: dict[str, int] = {}
    start: dict[str, int] = {}
    for session, seq in asks:
        before[session.pk] = max(before.get(session.pk, 0), seq)
        start[session.pk] = max(session.compaction_seq, 1)
    return get_journal().load_ranges_sync([(sid, start[sid], hi) for sid, hi in before.items()])


def conversations_before(asks: list[tuple[Session, int]]) -> dict[tuple[str, int], list[ContextLine]]:
    """conversation_from for each (session, ask seq), keyed by (session id, ask seq)."""
    journal = journals_before(asks)
    return {(session.pk, seq): conversation_from(journal[session.pk], seq) for session, seq in asks}


def conversation_before(session: Session, ask_seq: int) -> list[ContextLine]:
    """The last few user/assistant messages before the ask (tool results left out)."""
    return conversations_before([(session, ask_seq)])[(session.pk, ask_seq)]


def build_card(session: Session, ask: dict[str, Any], *, with_context: bool = True) -> QueueCard:
    """The queue's card of one ask (`ask`: its entry in the session's projection)."""
    base = ApprovalView.from_ask(ask, session.pk)
    card = QueueCard(**{name: getattr(base, name) for name in ApprovalView.__dataclass_fields__})
    card.session_title = session.title
    card.owner = session.owner.get_username()
    card.team = session_team_name(session)
    card.approvals_required = int(ask.get("approvals_required") or 1)
    card.rule = matched_rule(ask)
    card.asked_at = parse_datetime(str(ask.get("requested_at") or "")) if ask.get("requested_at") else None
    if with_context and card.is_pending:
        envelopes = journals_before([(session, card.seq)])[session.pk]
        card.context = conversation_from(envelopes, card.seq)
        card.turn_calls = turn_calls_waiting(envelopes, ask.get("tool_call_id"))
    if not card.is_pending and card.note is None:
        # The projection keeps who decided and how; the note is in the decision (audited).
        card.note = (
            AuditEntry.objects.filter(session_id=session.pk, ask_id=card.ask_id, kind__in=AuditEntry.VERDICT_KINDS)
            .values_list("note", flat=True)
            .first()
        ) or None
    return card


def asks_in_reach(user: Any, filters: QueueFilters) -> QuerySet[AskIndex]:
    """Every ask (in any state) of the sessions `user` may decide, narrowed by the `Team`
    and `Tool` filters."""
    asks = AskIndex.objects.all()
    if not access.is_staff(user):  # staff may decide every ask
        if user is None or not user.is_authenticated:
            return asks.none()
        asks = asks.filter(session_id__in=access.session_ids_with_role(user, "moderator"))
    if filters.team:
        asks = asks.filter(session__team__name=filters.team)
    if filters.tool:
        asks = asks.filter(tool=filters.tool)
    return asks


def pending_asks(user: Any, filters: QueueFilters | None = None) -> QuerySet[AskIndex]:
    """The pending asks `user` may decide, oldest first, narrowed by `filters` (one query)."""
    filters = filters or QueueFilters()
    asks = asks_in_reach(user, filters).filter(status=AskIndex.PENDING)
    if filters.age:
        asks = asks.filter(requested_at__lte=timezone.now() - AGE_CHOICES[filters.age])
    return asks.order_by("requested_at", "ask_id")


def pending_cards(user: Any, filters: QueueFilters | None = None) -> list[QueueCard]:
    """Every pending ask `user` may decide, as cards, oldest first.

    A fixed number of queries however many cards: the asks with their sessions (whose
    cached projection holds each ask), then one journal read for every card's
    conversation (conversations_before)."""
    cards = []
    for index in pending_asks(user, filters).select_related("session__owner", "session__team"):
        ask = index.session.projection().asks.get(index.ask_id)
        if ask is not None and ask.get("status") == "pending":
            card = build_card(index.session, ask, with_context=False)
            cards.append((index.session, card, ask.get("tool_call_id")))
    journal = journals_before([(session, card.seq) for session, card, _call in cards])
    for session, card, tool_call_id in cards:
        card.context = conversation_from(journal[session.pk], card.seq)
        card.turn_calls = turn_calls_waiting(journal[session.pk], tool_call_id)
    return [card for _session, card, _call in cards]


def waiting_for(user: Any) -> QuerySet[AskIndex]:
    """The pending asks that wait for `user` themselves: those they may decide, less the
    ones where their approval would not count (their own ask needing several approvals)
    and the ones they voted on already (their vote's audit row)."""
    voted = AuditEntry.objects.filter(ask_id=OuterRef("ask_id"), kind=AuditEntry.VOTE, actor=user.get_username())
    return pending_asks(user).exclude(approvals_required__gt=1, session__owner_id=user.pk).exclude(Exists(voted))


def pending_count(user: Any) -> int:
    """How many asks wait for `user`'s decision (the `Approvals` badge)."""
    if user is None or not user.is_authenticated:
        return 0
    return waiting_for(user).count()


#: How often the `Approvals` badge of a moderator's page asks for its count.
BADGE_POLL_SECONDS = 5


def badge_context(user: Any) -> dict[str, Any]:
    """What templates/moderation/_badge.html needs: the count, and whether it polls (only
    for users who moderate a team or are staff; everyone else's asks are their own,
    shown live in their chat)."""
    return {
        "waiting": pending_count(user),
        "poll_badge": access.has_any_role(user, "moderator"),
        "badge_seconds": BADGE_POLL_SECONDS,
    }


def filter_choices(user: Any) -> dict[str, list[str]]:
    """The values the `Team` and `Tool` filters offer: the teams the user moderates (and
    any with a pending ask of theirs) and the tools of their pending asks."""
    pending = pending_asks(user)
    teams = set(access.teams_for(user, "moderator").values_list("name", flat=True))
    teams |= {name for name in pending.values_list("session__team__name", flat=True) if name}
    tools = set(pending.values_list("tool", flat=True))
    return {"teams": sorted(teams), "tools": sorted(t for t in tools if t)}
