"""Websocket routes: a session's live chat, and the live approval queue."""

from typing import Any

from django.urls import path

from sessions_app.chat.consumers import ChatConsumer
from sessions_app.moderation.consumers import ApprovalsConsumer

websocket_urlpatterns: list[Any] = [
    path("ws/sessions/<str:session_id>/", ChatConsumer.as_asgi()),
    path("ws/approvals/", ApprovalsConsumer.as_asgi()),
]
