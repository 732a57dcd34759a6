"""The Django admin: for operators looking at sessions, runs and tokens.

The journal is append-only and the Session columns are a cache of it, so those are
read-only here; state changes go through sessions_app.actions.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.auth import get_user_model
from django.core.paginator import Paginator
from django.db.models import Q, QuerySet
from django.http import HttpRequest
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone
from django.utils.functional import cached_property
from django.utils.html import format_html

from sectr.errors import SectrError
from sessions_app import actions as session_actions
from sessions_app.accounts.login import ThrottledAdminAuthenticationForm
from sessions_app.actions.tokens import do_revoke_tokens
from sessions_app.models import (
    NOT_DELTA,
    ApiToken,
    ApprovalRule,
    AskIndex,
    AuditEntry,
    Envelope,
    InstallationMcpServer,
    Membership,
    ModelPrice,
    NotificationDelivery,
    Rating,
    ReviewMark,
    ReviewNote,
    ReviewQueue,
    ReviewQueueItem,
    Run,
    Session,
    ShareLink,
    Team,
    TeamWebhook,
    UsageDaily,
)
from sessions_app.review.export import load_envelopes
from sessions_app.review.panels import snapshot_fields
from sessions_app.review.search import matching_session_ids
from sessions_app.review.transcript import build_timeline
from sessions_app.teams.notifications import WebhookURLField


def _link(url: str, text: str) -> str:
    return format_html('<a href="{}">{}</a>', url, text)


# The admin's sign-in spends the same per-account and per-address budgets as the site's.
admin.site.login_form = ThrottledAdminAuthenticationForm


class CappedCountPaginator(Paginator):
    """A paginator that counts at most CAP rows (`SELECT COUNT(*) FROM (... LIMIT CAP+1)`):
    the changelist's "N sessions" and its page links need no exact count of 100,000
    rows, and counting them all costs more than the page. `capped`: there are more."""

    CAP = 10_000
    SEARCH_CAP = 1_000  # a word search: the count joins the index's matches to sessions
    capped = False

    def __init__(self, *args: Any, cap: int | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cap = self.CAP if cap is None else cap

    @cached_property
    def count(self) -> int:
        found = self.object_list[: self.cap + 1].count()  # type: ignore[attr-defined]  # a QuerySet
        self.capped = found > self.cap
        return min(found, self.cap)


class SessionAdmin(admin.ModelAdmin):
    """Sessions for operators: the snapshot, usage by model and the transcript rendered,
    with links to the chat and review pages. Nothing here edits a session (its columns
    cache the journal); deleting goes through `Delete sessions (journal and media)`,
    the app's own delete action, never the admin's cascade."""

    # "session_model", not "model": the admin looks list_display names up on the
    # ModelAdmin first, and ModelAdmin.model is the Session class (it would be called).
    list_display = ("id", "title", "owner", "team", "status", "session_model", "token_total", "updated_at")
    list_filter = ("status", "mode", "team")
    # The search box: an exact session id, else an exact username, else words through the
    # search index (get_search_results). Not the admin's own `icontains` on the title:
    # no index serves a LIKE '%word%', it reads all 100,000 rows.
    search_fields = ("id",)
    search_help_text = "A session id, a username, or words from the messages and tool names."
    list_select_related = ("owner", "team")
    # No COUNT(*) of the whole table beside the filtered one (100,000 sessions), and 50
    # rows a page: rendering a row (its action checkbox widget above all) costs more
    # than the query.
    show_full_result_count = False
    list_per_page = 50
    paginator = CappedCountPaginator
    ordering = ("-updated_at",)
    fields = (
        "links",
        "snapshot_panel",
        "usage_by_model",
        "transcript",
        "owner",
        "team",
        "id",
        "title",
        "status",
        "mode",
        "model",
        "last_seq",
        "token_total",
        "created_at",
        "updated_at",
        "closed_at",
    )
    readonly_fields = fields  # all of them: nothing here edits a session
    actions = ("rebuild_projection", "delete_sessions")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # a session starts with SESSION_CREATED: create it through the app

    def get_paginator(
        self, request: HttpRequest, queryset: QuerySet[Session], per_page: int, orphans: int = 0,
        allow_empty_first_page: bool = True,
    ) -> CappedCountPaginator:  # fmt: skip
        cap = CappedCountPaginator.SEARCH_CAP if request.GET.get("q", "").strip() else None
        return CappedCountPaginator(queryset, per_page, orphans, allow_empty_first_page, cap=cap)

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Session], search_term: str
    ) -> tuple[QuerySet[Session], bool]:
        term = search_term.strip()
        if not term:
            return queryset, False
        if Session.objects.filter(pk=term).exists():
            return queryset.filter(pk=term), False
        owner = get_user_model().objects.filter(username=term).values_list("pk", flat=True).first()
        if owner is not None:
            return queryset.filter(owner_id=owner), False
        return queryset.filter(pk__in=matching_session_ids(term)), False

    def get_queryset(self, request: HttpRequest) -> QuerySet[Session]:
        queryset = super().get_queryset(request)
        if request.resolver_match and str(request.resolver_match.url_name).endswith("_changelist"):
            # The list shows none of the cached projection's JSON: don't read it.
            queryset = queryset.defer("state", "limits")
        return queryset

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # the columns are a cache of the journal

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # the cascade would skip the media and the run checks: use the action

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return bool(request.user.is_active and request.user.is_staff)

    def get_actions(self, request: HttpRequest) -> Any:
        found = super().get_actions(request)
        found.pop("delete_selected", None)
        return found

    @admin.display(description="Model", ordering="model")
    def session_model(self, obj: Session) -> str:
        return obj.model

    @admin.display(description="Open")
    def links(self, obj: Session) -> str:
        return format_html(
            "{} · {} · {}",
            _link(reverse("chat", args=[obj.pk]), "Chat page"),
            _link(reverse("review_session", args=[obj.pk]), "Review page"),
            _link(reverse("review_export", args=[obj.pk, "json"]), "Export JSON"),
        )

    @admin.display(description="Snapshot")
    def snapshot_panel(self, obj: Session) -> str:
        return render_to_string("admin/sessions_app/_fields.html", {"rows": snapshot_fields(obj)})

    @admin.display(description="Usage by model")
    def usage_by_model(self, obj: Session) -> str:
        state = obj.projection()
        return render_to_string(
            "admin/sessions_app/_usage.html", {"rows": sorted(state.usage.items()), "total": state.total_usage}
        )

    @admin.display(description="Transcript")
    def transcript(self, obj: Session) -> str:
        timeline = build_timeline(load_envelopes(obj))
        return render_to_string("review/_timeline.html", {"timeline": timeline, "show_ratings": False})

    @admin.action(description="Rebuild the cached projection from the journal")
    def rebuild_projection(self, request: HttpRequest, queryset: QuerySet[Session]) -> None:
        for session in queryset:
            session.rebuild_projection()
        self.message_user(request, f"Rebuilt {queryset.count()} session(s).", messages.SUCCESS)

    @admin.action(description="Delete sessions (journal and media)")
    def delete_sessions(self, request: HttpRequest, queryset: QuerySet[Session]) -> None:
        deleted, refused = 0, []
        for session_id in queryset.values_list("pk", flat=True):
            try:
                session_actions.do_delete(request.user, session_id)
                deleted += 1
            except SectrError as exc:
                refused.append(f"{session_id}: {exc.message}")
        self.message_user(request, f"Deleted {deleted} session(s).", messages.SUCCESS)
        for line in refused:
            self.message_user(request, line, messages.ERROR)


admin.site.register(Session, SessionAdmin)


@admin.register(Envelope)
class EnvelopeAdmin(admin.ModelAdmin):
    """The journal, strictly read-only: no add, change or delete here, nor through
    deleting a session (SessionAdmin refuses that; the delete action removes both)."""

    list_display = ("session", "seq", "type", "invocation_id", "created_at")
    list_filter = ("type",)
    # A session id or an invocation id, matched exactly (get_search_results).
    search_fields = ("session__id",)
    search_help_text = "A session id or an invocation id."
    ordering = ("session", "seq")
    show_full_result_count = False
    readonly_fields = ("session", "seq", "invocation_id", "type", "payload", "created_at")

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Envelope], search_term: str
    ) -> tuple[QuerySet[Envelope], bool]:
        """The envelopes of the session, or of the invocation, with the id searched for,
        each read on an index (the admin's own `=field` search is a case-insensitive
        match, which no index serves). The envelope_invocation index leaves text deltas
        out, so an invocation's sessions are found among its other rows first (it has
        its INVOCATION_STARTED at least), and its rows on their (session, seq) index."""
        term = search_term.strip()
        if not term:
            return queryset, False
        sessions = list(
            Envelope.objects.filter(NOT_DELTA, invocation_id=term).values_list("session_id", flat=True).distinct()
        )
        return queryset.filter(Q(session_id=term) | Q(session_id__in=sessions, invocation_id=term)), False

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # the journal is append-only; delete the session with its action

    def get_actions(self, request: HttpRequest) -> Any:
        return {}


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    """Runs with their status, lease and worker; the Run state machine (sessions_app.runs)
    is the only code that changes them, so nothing is editable here."""

    list_display = (
        "id", "session", "status", "stop_reason", "attempts", "lease_owner", "lease_expires_at", "heartbeat_at",
        "created_at", "finished_at",
    )  # fmt: skip
    list_filter = ("status", "stop_reason")
    search_fields = ("=id", "=session__id", "=invocation_id", "=lease_owner")
    list_select_related = ("session",)
    show_full_result_count = False
    ordering = ("-created_at",)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return [field.name for field in Run._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ("name", "user", "prefix", "created_at", "last_used_at", "revoked_at")
    list_filter = ("revoked_at",)
    search_fields = ("name", "prefix", "user__username")
    # The hash is never shown: it identifies the secret and is useless to a person.
    exclude = ("token_hash",)
    readonly_fields = ("user", "prefix", "created_at", "last_used_at", "revoked_at")
    actions = ("revoke",)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # issued from the user's settings page, which shows the secret once

    @admin.action(description="Revoke the selected tokens")
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiToken]) -> None:
        count = do_revoke_tokens(queryset)
        self.message_user(request, f"Revoked {count} token(s).", messages.SUCCESS)


@admin.register(ReviewNote)
class ReviewNoteAdmin(admin.ModelAdmin):
    list_display = ("session", "author", "seq", "created_at")
    search_fields = ("=session__id", "body")
    list_select_related = ("session", "author")


# ---- moderation: notifications and the audit ----


class WebhookDeliveryInline(admin.TabularInline):
    model = NotificationDelivery
    fields = ("created_at", "event", "ask_id", "status", "attempts", "last_status_code", "last_error")
    readonly_fields = fields
    extra = 0
    max_num = 0
    ordering = ("-id",)
    show_change_link = True

    def get_queryset(self, request: HttpRequest) -> QuerySet[NotificationDelivery]:
        return super().get_queryset(request).order_by("-id")

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class TeamWebhookForm(forms.ModelForm):
    url = WebhookURLField()

    class Meta:
        model = TeamWebhook
        fields = ("team", "url", "kind", "secret", "active", "created_at")


@admin.register(TeamWebhook)
class TeamWebhookAdmin(admin.ModelAdmin):
    """A team's webhook: the URL and the signing secret (shown to the operator, who gives
    it to the receiver). Its deliveries are listed below it. The URL must pass the
    address guard (sessions_app.addresses.check_webhook_url)."""

    form = TeamWebhookForm
    list_display = ("team", "url", "kind", "active", "created_at")
    list_filter = ("active", "kind", "team")
    search_fields = ("url", "team__name")
    inlines = (WebhookDeliveryInline,)


@admin.register(InstallationMcpServer)
class InstallationMcpServerAdmin(admin.ModelAdmin):
    """The installation's stdio MCP servers staff define (beside the operator's
    SECTR_MCP_SERVERS file, which wins on a shared name): a command the workers run.
    A team's moderators enable one for their team on its page (docs/mcp.md)."""

    list_display = ("name", "command", "timeout_s", "created_at")
    search_fields = ("name", "command")


@admin.register(NotificationDelivery)
class NotificationDeliveryAdmin(admin.ModelAdmin):
    """The delivery log: read-only (the worker loop writes it); retry a failed one with the action."""

    list_display = ("created_at", "channel", "team", "event", "ask_id", "status", "attempts", "last_status_code")
    list_filter = ("status", "channel", "event", "team")
    search_fields = ("=ask_id", "=session_id")
    date_hierarchy = "created_at"
    actions = ("retry_now",)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [field.name for field in NotificationDelivery._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.action(description="Send again now (failed or pending deliveries)")
    def retry_now(self, request: HttpRequest, queryset: QuerySet[NotificationDelivery]) -> None:
        count = queryset.exclude(status=NotificationDelivery.DELIVERED).update(
            status=NotificationDelivery.PENDING, next_attempt_at=timezone.now(), attempts=0
        )
        self.message_user(request, f"{count} delivery(ies) will be sent again.", messages.SUCCESS)


@admin.register(AuditEntry)
class AuditEntryAdmin(admin.ModelAdmin):
    """The audit is a projection of the journal: read-only (rebuild: manage.py sectr_rebuild_audit)."""

    list_display = ("at", "kind", "actor", "verdict", "tool", "ask_id", "session", "seconds_to_decide")
    list_filter = ("kind", "verdict")
    search_fields = ("=ask_id", "=session__id", "actor", "tool")
    date_hierarchy = "at"

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [field.name for field in AuditEntry._meta.fields]


# ---- teams (issue 9) ----


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 1
    autocomplete_fields = ("user",)


class ApprovalRuleInline(admin.TabularInline):
    """A team's rules, in order. Staff only; moderators edit them on the site and the API
    (sessions_app.actions.rules, which validates the same fields)."""

    model = ApprovalRule
    extra = 0
    fields = ("position", "tool", "arguments", "action", "approvals_required", "expires_after_s", "created_by")
    readonly_fields = ("created_by",)
    ordering = ("position", "id")


@admin.register(Team)
class TeamAdmin(admin.ModelAdmin):
    list_display = ("name", "ask_expires_after_s", "links_decide_without_login", "created_at")
    search_fields = ("name",)
    inlines = (MembershipInline, ApprovalRuleInline)


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ("team", "user", "role", "created_at")
    list_filter = ("role", "team")
    search_fields = ("team__name", "user__username")
    list_select_related = ("team", "user")
    autocomplete_fields = ("user",)


@admin.register(AskIndex)
class AskIndexAdmin(admin.ModelAdmin):
    """The ask index is a projection of the journal: read-only."""

    list_display = ("ask_id", "session", "tool", "status", "requested_at", "deadline", "decided_by")
    list_filter = ("status",)
    search_fields = ("ask_id", "session__id", "tool")
    list_select_related = ("session",)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


# ---- team review (issue 10) ----


@admin.register(ModelPrice)
class ModelPriceAdmin(admin.ModelAdmin):
    """What each model costs per million tokens: the costs on /review/usage/."""

    list_display = ("model", "input_per_million", "output_per_million", "currency")
    list_editable = ("input_per_million", "output_per_million", "currency")
    search_fields = ("model",)


@admin.register(Rating)
class RatingAdmin(admin.ModelAdmin):
    list_display = ("session", "seq", "source", "author", "thumbs", "score", "created_at")
    list_filter = ("source", "thumbs", "score")
    search_fields = ("=session__id", "comment", "=author__username")
    list_select_related = ("session", "author")
    raw_id_fields = ("session", "author")


@admin.register(ReviewMark)
class ReviewMarkAdmin(admin.ModelAdmin):
    list_display = ("session", "reviewed_by", "reviewed_at")
    list_select_related = ("session", "reviewed_by")
    raw_id_fields = ("session", "reviewed_by")


class ReviewQueueItemInline(admin.TabularInline):
    model = ReviewQueueItem
    extra = 0
    raw_id_fields = ("session", "assignee", "added_by")
    fields = ("position", "session", "assignee", "done_at")


@admin.register(ReviewQueue)
class ReviewQueueAdmin(admin.ModelAdmin):
    list_display = ("name", "team", "created_by", "created_at")
    list_filter = ("team",)
    search_fields = ("name",)
    filter_horizontal = ("reviewers",)
    raw_id_fields = ("created_by",)
    inlines = (ReviewQueueItemInline,)


@admin.register(ShareLink)
class ShareLinkAdmin(admin.ModelAdmin):
    list_display = ("session", "seq", "created_by", "created_at", "expires_at", "require_login", "revoked_at")
    list_filter = ("require_login", "revoked_at")
    search_fields = ("=session__id", "=created_by__username")
    list_select_related = ("session", "created_by")
    # The token is the credential: never shown here.
    exclude = ("token",)
    readonly_fields = ("session", "seq", "created_by", "created_at", "revoked_at")
    actions = ("revoke",)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # made from the review page, which fixes the seq

    @admin.action(description="Revoke the selected share links")
    def revoke(self, request: HttpRequest, queryset: QuerySet[ShareLink]) -> None:
        count = queryset.filter(revoked_at__isnull=True).update(revoked_at=timezone.now())
        self.message_user(request, f"Revoked {count} link(s).", messages.SUCCESS)


@admin.register(UsageDaily)
class UsageDailyAdmin(admin.ModelAdmin):
    """The usage rollup: a projection of the journal, read-only."""

    list_display = ("day", "user", "team_key", "api_token_key", "model", "input_tokens", "output_tokens", "messages")
    list_filter = ("model",)
    date_hierarchy = "day"
    list_select_related = ("user",)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
