"""The moderation pages: the approval queue (/approvals/), deciding an ask, the audit
(/approvals/audit/ and its CSV), and the teams' approval rules (/approvals/rules/, with
"Test this rule").

Deciding goes through actions.do_decide, which checks the user's right to approve under
the session lock; the card rendered afterwards shows the ask as it is now (decided by
this request, or by someone faster, whose name and verdict it then shows).
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlencode

from django.contrib import messages
from django.contrib.auth import get_user_model
from django.contrib.auth.decorators import login_required
from django.contrib.auth.views import redirect_to_login
from django.core.paginator import Paginator
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse
from django.http.response import HttpResponseBase
from django.shortcuts import redirect, render
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from sectr.errors import Forbidden, NotFound, SectrError, ValidationFailed
from sessions_app import access, actions
from sessions_app import action_links as links
from sessions_app.display.approvals import ApprovalView, turn_calls_waiting
from sessions_app.display.content import pretty_json
from sessions_app.journal import get_journal
from sessions_app.models import ActionLinkUse, ApprovalRule, Session, Team
from sessions_app.moderation import audit, queue, rules
from sessions_app.moderation.rules import rule_data_from_form
from sessions_app.web import HtmxHttpRequest, flash, page_refusals, refusals_as_messages


@login_required
@require_GET
def approvals(request: HtmxHttpRequest) -> HttpResponse:
    filters = queue.QueueFilters.from_query(request.GET)
    as_of = timezone.now()  # before the read: what changes after it, the socket catches up
    context = {
        "as_of": as_of.isoformat(),
        "cards": queue.pending_cards(request.user, filters),
        "filters": filters,
        "filter_query": urlencode(filters.as_query()),
        "choices": queue.filter_choices(request.user),
        "age_labels": list(queue.AGE_LABELS.items()),
        "viewer": request.user.get_username(),
    }
    if request.htmx and request.GET.get("partial") == "queue":
        return render(request, "moderation/_approval_queue.html", context)
    return render(request, "moderation/approvals.html", context)


@never_cache
@require_GET
def approvals_badge(request: HtmxHttpRequest) -> HttpResponse:
    """The `Approvals` count badge alone, which moderators' pages poll (base.html).

    Not login_required: a logged-out tab would follow the redirect and swap the login
    page into the menu. Anonymous: 204 (htmx swaps nothing; nothing is learned)."""
    if not request.user.is_authenticated:
        return HttpResponse(status=204)
    return render(request, "moderation/_badge.html", queue.badge_context(request.user))


def edited_arguments(text: str | None) -> dict[str, Any] | None:
    """The `Edit arguments` field: None when not sent, else a JSON object (400 otherwise)."""
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ValidationFailed(f"the edited arguments are not JSON: {exc}", code="invalid_arguments") from None
    if not isinstance(value, dict):
        raise ValidationFailed("the edited arguments must be a JSON object", code="invalid_arguments")
    return value


@login_required
@require_POST
@refusals_as_messages
def decide(request: HtmxHttpRequest, ask_id: str) -> HttpResponse:
    scope = request.POST.get("scope") or None
    # "Approve all" is the button `scope=turn`: an approval once, for the ask's whole turn.
    verdict = request.POST.get("verdict", "") or ("allow_once" if scope else "")
    note = request.POST.get("note", "").strip() or None
    # `Respond` sends its text as `result`; `Edit arguments` the edited JSON as `arguments`.
    result = request.POST.get("result") if verdict == "respond" else None
    try:
        arguments = edited_arguments(request.POST.get("arguments"))
        actions.do_decide(request.user, ask_id, verdict, note=note, scope=scope, arguments=arguments, result=result)
    except SectrError as exc:
        if isinstance(exc, NotFound):
            raise
        # Refused (your own approval on a two-person ask, a second vote, someone was
        # faster...): the card as it is now, and the server's reason in #flash.
        refused: SectrError | None = exc
    else:
        refused = None
    # The card as it is now (decided by this request or by someone faster).
    session = actions.find_ask_session(ask_id)
    access.check_access(request.user, session, "read")
    where_queue = request.POST.get("where") == "queue"
    if not request.htmx:
        if refused is not None:
            messages.error(request, refused.message)
        return redirect("approvals") if where_queue else redirect("chat", session_id=session.pk)
    ask = session.projection().asks.get(ask_id, {})
    html: str
    viewer = request.user.get_username()
    if where_queue:
        html = render_to_string(
            "moderation/_card.html", {"item": queue.build_card(session, ask), "viewer": viewer}, request=request
        )
    else:
        card = ApprovalView.from_ask(ask, session.pk)
        if card.is_pending:  # refused: the card stays as it was, "Approve all" included
            card.turn_calls = turn_calls_waiting(
                get_journal().load_since_compaction_sync(session.pk), ask.get("tool_call_id")
            )
        html = render_to_string(
            "chat/_approval.html",
            {
                "item": card,
                "can_approve": access.can_approve(request.user, session),
                "show_session": False,
                "viewer": viewer,
                "session_owner": session.owner.get_username(),
            },
            request=request,
        )
    if refused is not None:
        message = refused.message
        if card_decider := ask.get("approver"):
            message = f"{message} (decided by {card_decider})"
        notice = render_to_string("chat/_flash.html", {"message": message, "level": "error"})
        html += f'<div id="flash" hx-swap-oob="innerHTML">{notice}</div>'
    # A refusal of this person (403) or of what they sent (400: edited arguments that do not
    # fit the tool, say) keeps its status; htmx swaps a 4xx too (base.html).
    kept = isinstance(refused, Forbidden | ValidationFailed)
    return HttpResponse(html, status=refused.status if refused is not None and kept else 200)


AUDIT_PAGE_SIZE = 50


@login_required
@require_GET
def audit_page(request: HtmxHttpRequest) -> HttpResponse:
    try:
        filters = audit.AuditFilters.from_query(request.GET)
    except ValidationFailed as exc:
        return flash(exc.message, level="error", status=400)
    entries = audit.audit_entries(request.user, filters)
    page = Paginator(entries, AUDIT_PAGE_SIZE).get_page(request.GET.get("page"))
    visible = audit.auditable_sessions(request.user)
    context = {
        "page": page,
        "rows": [
            audit.entry_dict(entry)
            | {
                "kind_label": audit.KIND_LABELS[entry.kind],
                "at_time": entry.at,
                "arguments_json": pretty_json(entry.arguments),
                "run_arguments_json": pretty_json(entry.run_arguments) if entry.edited else "",
            }
            for entry in page
        ],
        "filters": filters,
        "filter_query": urlencode(filters.as_query()),
        "timings": audit.time_to_decision(entries),
        "kinds": [(k, audit.KIND_LABELS[k]) for k in (*audit.DEFAULT_KINDS, "ask")],
        "verdicts": audit.VERDICTS,
        "teams": audit_team_names(request.user, visible),
    }
    return render(request, "moderation/audit.html", context)


def audit_team_names(user: Any, sessions: QuerySet[Session]) -> list[str]:
    teams = set(access.teams_for(user, "reviewer").values_list("name", flat=True))
    return sorted(teams | set(sessions.exclude(team__isnull=True).values_list("team__name", flat=True)))


@login_required
@require_GET
def audit_csv(request: HtmxHttpRequest) -> HttpResponseBase:
    try:
        filters = audit.AuditFilters.from_query(request.GET)
    except ValidationFailed as exc:
        return flash(exc.message, level="error", status=400)
    return audit.csv_response(audit.audit_entries(request.user, filters))


# ---- approval rules (/approvals/rules/) ----


def _rules_page(request: HtmxHttpRequest, *, preview: dict[str, Any] | None = None, status: int = 200) -> HttpResponse:
    teams = list(access.teams_for(request.user, "moderator").order_by("name").prefetch_related("rules"))
    context = {
        "teams": [(team, sorted(team.rules.all(), key=lambda r: (r.position, r.pk))) for team in teams],
        "actions": [value for value, _label in ApprovalRule.ACTION_CHOICES],
        "preview": preview,
    }
    return render(request, "moderation/rules.html", context, status=status)


def _moderated_team_or_404(request: HtmxHttpRequest, team_name: str) -> Team:
    team = access.teams_for(request.user, "moderator").filter(name=team_name).first()
    if team is None:
        raise Http404("no such team")
    return team


@login_required
@require_GET
def rules_page(request: HtmxHttpRequest) -> HttpResponse:
    """The approval rules of every team the user moderates, in the order they are tried."""
    return _rules_page(request)


#: A refused rule change: 404 for who does not moderate the team (a member does not learn
#: what they cannot change), anything else a message on the rules page.
rule_refusals = page_refusals(back=lambda _request, _kwargs: reverse("approval_rules"), htmx_flash=False, conceal=True)


@login_required
@require_POST
@rule_refusals
def create_rule(request: HtmxHttpRequest, team_name: str) -> HttpResponse:
    # The action checks that the user moderates the team (under the team's lock's transaction).
    rule = actions.do_create_rule(request.user, team_name, rule_data_from_form(request.POST))
    messages.info(request, f"Rule {rule.pk} added to {rule.team.name}.")
    return redirect("approval_rules")


@login_required
@require_POST
@rule_refusals
def delete_rule(request: HtmxHttpRequest, team_name: str, rule_id: int) -> HttpResponse:
    actions.do_delete_rule(request.user, team_name, rule_id)
    messages.info(request, f"Rule {rule_id} deleted from {team_name}.")
    return redirect("approval_rules")


@login_required
@require_GET
def preview_rule(request: HtmxHttpRequest, team_name: str) -> HttpResponse:
    """Test this rule: the team's past asks it would have matched, before it is saved."""
    team = _moderated_team_or_404(request, team_name)
    try:
        data = rule_data_from_form(request.GET)
        result = rules.preview_rule(team, data)
    except ValidationFailed as exc:
        return _rules_page(request, preview={"team": team.name, "error": exc.message}, status=400)
    return _rules_page(request, preview={"team": team.name, "rule": data, "result": result})


def _link_refused(request: HttpRequest, message: str, status: int) -> HttpResponse:
    """The plain page of a link that decides nothing (used, expired, foreign, invalid)."""
    return render(request, "moderation/action_link_refused.html", {"message": message}, status=status)


@never_cache
@require_http_methods(["GET", "POST"])
def act_by_link(request: HttpRequest, token: str) -> HttpResponse:
    """An action link (sessions_app.action_links): GET shows the ask on one phone-sized
    screen and decides nothing; POST (CSRF-protected) approves once or denies, once."""
    try:
        link = links.read_token(token)
    except links.LinkRefused as exc:
        return _link_refused(request, exc.message, 410 if exc.reason == "expired" else 404)
    try:
        session = actions.find_ask_session(link.ask_id)
    except NotFound:
        return _link_refused(request, "This link's ask no longer exists.", 404)
    actor: Any = request.user if request.user.is_authenticated else None
    if actor is None:
        team = session.team
        if link.user_id is not None and team is not None and team.links_decide_without_login:
            actor = get_user_model().objects.filter(pk=link.user_id, is_active=True).first()
        if actor is None:
            return redirect_to_login(request.get_full_path())
    if link.user_id is not None and actor.pk != link.user_id:
        return _link_refused(request, "This link was sent to someone else: it decides nothing for you.", 403)
    if not access.can_approve(actor, session):
        return _link_refused(request, "You may not decide this ask.", 403)
    if ActionLinkUse.objects.filter(digest=link.digest).exists():
        return _link_refused(request, "This link has been used already.", 410)
    ask = session.projection().asks.get(link.ask_id) or {}
    if ask.get("status") != "pending":
        decided = f" by {ask['approver']}" if ask.get("approver") else ""
        return _link_refused(
            request, f"This ask is no longer waiting: it was {ask.get('status', 'closed')}{decided}.", 410
        )
    error = ""
    if request.method == "POST":
        note = request.POST.get("note", "").strip() or None
        try:
            actions.do_decide_by_link(actor, link, request.POST.get("verdict", ""), note=note)
        except links.LinkRefused as exc:
            return _link_refused(request, exc.message, 410)
        except SectrError as exc:
            if isinstance(exc, NotFound | Forbidden):
                return _link_refused(request, exc.message, exc.status)
            error = exc.message
        else:
            session.refresh_from_db()  # its cached projection is the one from before the decision
            decided_ask = session.projection().asks.get(link.ask_id) or {}
            card = queue.build_card(session, decided_ask, with_context=False)
            return render(request, "moderation/action_link_done.html", {"item": card})
    card = queue.build_card(session, ask)
    return render(
        request,
        "moderation/action_link.html",
        {"item": card, "error": error, "acting_as": actor.get_username()},
        status=400 if error else 200,
    )
