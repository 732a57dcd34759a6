"""Account events the pages answer: logging out says so on the page it lands on.

Django flushes the session right after `user_logged_out`, but the message goes to the
messages framework's cookie storage first (FallbackStorage), so it survives the flush
and shows on the login page (LOGOUT_REDIRECT_URL).
"""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.signals import user_logged_out
from django.dispatch import receiver
from django.http import HttpRequest


@receiver(user_logged_out, dispatch_uid="sectr-logged-out-message")
def say_logged_out(sender: Any, request: HttpRequest | None, **kwargs: Any) -> None:
    if request is not None and hasattr(request, "_messages"):
        messages.info(request, "You are logged out.")
