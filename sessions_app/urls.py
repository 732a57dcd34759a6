"""The pages, by capability: the chat, moderation, review, account settings, operations."""

from django.urls import path

from sessions_app.accounts import views as accounts
from sessions_app.chat import views as chat
from sessions_app.moderation import views as moderation
from sessions_app.ops import views as ops
from sessions_app.review import views as review

urlpatterns = [
    path("", chat.home, name="home"),
    path("healthz", ops.healthz, name="healthz"),
    path("favicon.ico", chat.favicon, name="favicon"),
    path("readyz", ops.readyz, name="readyz"),
    path("metrics", ops.metrics, name="metrics"),
    path("sessions/new", chat.create_session, name="create_session"),
    path("sessions/list", chat.session_list, name="session_list"),
    path("sessions/<str:session_id>/", chat.chat, name="chat"),
    path("sessions/<str:session_id>/messages", chat.post_message, name="post_message"),
    path("sessions/<str:session_id>/stop", chat.stop, name="stop"),
    path("sessions/<str:session_id>/steer", chat.steer, name="steer"),
    path("sessions/<str:session_id>/retry", chat.retry, name="retry"),
    path("sessions/<str:session_id>/fork", chat.fork, name="fork"),
    path("sessions/<str:session_id>/regenerate", chat.regenerate, name="regenerate"),
    path("sessions/<str:session_id>/edit", chat.edit_message, name="edit_message"),
    path("sessions/<str:session_id>/clear", chat.clear, name="clear"),
    path("sessions/<str:session_id>/compact", chat.compact, name="compact"),
    path("sessions/<str:session_id>/rename", chat.rename, name="rename"),
    path("sessions/<str:session_id>/mode", chat.set_mode, name="set_mode"),
    path("sessions/<str:session_id>/model", chat.set_model, name="set_model"),
    path("sessions/<str:session_id>/delete", chat.delete, name="delete"),
    path("sessions/<str:session_id>/media/<str:sha256>", chat.session_media, name="session_media"),
    path("asks/<str:ask_id>/decide", moderation.decide, name="decide"),
    path("approvals/", moderation.approvals, name="approvals"),
    path("approvals/badge", moderation.approvals_badge, name="approvals_badge"),
    path("approvals/audit/", moderation.audit_page, name="approval_audit"),
    path("approvals/audit.csv", moderation.audit_csv, name="approval_audit_csv"),
    path("approvals/rules/", moderation.rules_page, name="approval_rules"),
    path("approvals/rules/<str:team_name>/new", moderation.create_rule, name="approval_rule_create"),
    path("approvals/rules/<str:team_name>/preview", moderation.preview_rule, name="approval_rule_preview"),
    path("approvals/rules/<str:team_name>/<int:rule_id>/delete", moderation.delete_rule, name="approval_rule_delete"),
    path("review/", review.review, name="review"),
    path("review/export.jsonl", review.export_results, name="review_export_results"),
    path("review/usage/", review.usage_page, name="review_usage"),
    path("review/queues/", review.queues, name="review_queues"),
    path("review/queues/add", review.add_to_queue, name="review_add_to_queue"),
    path("review/queues/<int:queue_id>/", review.review_queue, name="review_queue"),
    path("review/queue-items/<int:item_id>/done", review.queue_item_done, name="review_item_done"),
    path("review/<str:session_id>/", review.review_session, name="review_session"),
    path("review/<str:session_id>/rate", review.rate, name="review_rate"),
    path("review/<str:session_id>/reviewed", review.set_reviewed, name="review_set_reviewed"),
    path("review/<str:session_id>/notes", review.add_note, name="review_note"),
    path("review/<str:session_id>/share", review.create_share, name="review_share"),
    path("review/<str:session_id>/export.<str:fmt>", review.export_session, name="review_export"),
    path(
        "sessions/<str:session_id>/messages/<str:message_id>/feedback",
        review.end_user_feedback,
        name="end_user_feedback",
    ),
    path("share/<str:token>/", review.shared, name="shared"),
    path("settings/shares/", accounts.shares, name="shares"),
    path("settings/shares/<int:share_id>/revoke", accounts.revoke_share, name="revoke_share"),
    path("settings/tokens/", accounts.tokens, name="tokens"),
    path("settings/tokens/<int:token_id>/revoke", accounts.revoke_token, name="revoke_token"),
]
