"""The Django admin: for operators looking at sessions, runs and tokens.

The journal is append-only and the Session columns are a cache of it, so those are
read-only here; state changes go through sessions_app.actions.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone

from sessions_app.accounts.login import ThrottledAdminAuthenticationForm
from sessions_app.actions.tokens import do_revoke_tokens
from sessions_app.models import (
    ApiToken,
    ApprovalRule,
    AskIndex,
    AuditEntry,
    Envelope,
    Membership,
    NotificationDelivery,
    ReviewNote,
    Run,
    Session,
    Team,
    TeamWebhook,
)

# The admin's sign-in spends the same per-account and per-address budgets as the site's.
admin.site.login_form = ThrottledAdminAuthenticationForm


@admin.register(Session)
class SessionAdmin(admin.ModelAdmin):
    list_display = ("id", "owner", "team", "title", "status", "model", "updated_at")
    list_filter = ("status", "mode", "team")
    search_fields = ("title", "id")
    list_select_related = ("owner",)
    date_hierarchy = "updated_at"
    readonly_fields = (
        "id",
        "title",
        "title_source",
        "mode",
        "model",
        "reasoning_effort",
        "limits",
        "status",
        "state",
        "last_seq",
        "compaction_seq",
        "token_total",
        "created_at",
        "updated_at",
        "closed_at",
    )
    actions = ("rebuild_projection",)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # a session starts with SESSION_CREATED: create it through the app

    @admin.action(description="Rebuild the cached projection from the journal")
    def rebuild_projection(self, request: HttpRequest, queryset: QuerySet[Session]) -> None:
        for session in queryset:
            session.rebuild_projection()
        self.message_user(request, f"Rebuilt {queryset.count()} session(s).", messages.SUCCESS)


@admin.register(Envelope)
class EnvelopeAdmin(admin.ModelAdmin):
    list_display = ("session", "seq", "type", "invocation_id", "created_at")
    list_filter = ("type",)
    search_fields = ("=session__id", "=invocation_id")
    ordering = ("session", "seq")
    readonly_fields = ("session", "seq", "invocation_id", "type", "payload", "created_at")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # the journal is append-only; delete the session instead


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    list_display = ("id", "session", "status", "stop_reason", "attempts", "lease_owner", "created_at", "finished_at")
    list_filter = ("status", "stop_reason")
    search_fields = ("=id", "=session__id", "=invocation_id")
    readonly_fields = ("id", "session", "invocation_id", "invocation_ids", "reason", "lease_token", "start_seq")


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


@admin.register(TeamWebhook)
class TeamWebhookAdmin(admin.ModelAdmin):
    """A team's webhook: the URL and the signing secret (shown to the operator, who gives
    it to the receiver). Its deliveries are listed below it."""

    list_display = ("team", "url", "active", "created_at")
    list_filter = ("active", "team")
    search_fields = ("url", "team__name")
    inlines = (WebhookDeliveryInline,)


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
    list_display = ("name", "ask_expires_after_s", "created_at")
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
