"""The Django admin: for operators looking at sessions, runs and tokens.

The journal is append-only and the Session columns are a cache of it, so those are
read-only here; state changes go through sessions_app.actions.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from sessions_app.accounts.login import ThrottledAdminAuthenticationForm
from sessions_app.actions.tokens import do_revoke_tokens
from sessions_app.models import ApiToken, Envelope, ReviewNote, Run, Session

# The admin's sign-in spends the same per-account and per-address budgets as the site's.
admin.site.login_form = ThrottledAdminAuthenticationForm


@admin.register(Session)
class SessionAdmin(admin.ModelAdmin):
    list_display = ("id", "owner", "title", "status", "model", "updated_at")
    list_filter = ("status", "mode")
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
