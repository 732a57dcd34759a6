"""Websocket routes (consumers arrive with the web chat)."""

from typing import Any

websocket_urlpatterns: list[Any] = []
