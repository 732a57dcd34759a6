"""Login, throttled per account and per address.

Every login attempt (the site's and the admin's) spends one unit of two budgets: the
account it names (SECTR_LOGIN_LIMIT_PER_ACCOUNT, "10/300": ten tries in five minutes)
and the address it comes from (SECTR_LOGIN_LIMIT_PER_ADDRESS, "50/300"). Past either,
the attempt is refused before the password is checked, with 429 on the site's login page.
Counting attempts rather than failures keeps the check one atomic step (no read, check,
then write race between concurrent guesses); a person who signs in now and then never
comes near the budget.

Why not django-axes: it fits Django 5.2, but brings its own tables, authentication
backend and middleware, and writes a database row per failure (on SQLite, the journal's
one writer); the atomic counter that already holds the API's budget does this job.
"""

from __future__ import annotations

import hashlib
from typing import Any

from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.forms import AuthenticationForm
from django.contrib.auth.views import LoginView
from django.core.exceptions import ValidationError
from django.forms import Form
from django.http import HttpResponse

from sessions_app.budgets import setting_budget, spend

THROTTLED = "throttled"


def spend_login_attempt(username: str, address: str) -> int | None:
    """Count one attempt against the account and the address; seconds to wait when over."""
    account = hashlib.sha256(username.strip().casefold().encode("utf-8", "surrogatepass")).hexdigest()
    waits: list[int] = []
    for scope, key, (limit, window) in (
        ("login-account", account, setting_budget("SECTR_LOGIN_LIMIT_PER_ACCOUNT", "10/300")),
        ("login-address", address, setting_budget("SECTR_LOGIN_LIMIT_PER_ADDRESS", "50/300")),
    ):
        if not limit:
            continue
        spent = spend(scope, key, window)  # both are spent: guesses across accounts count too
        if spent.count > limit:
            waits.append(spent.retry_after)
    return max(waits) if waits else None


class ThrottledLoginMixin(Form):
    request: Any

    def clean(self) -> dict[str, Any]:
        username = str(self.data.get("username", ""))
        address = str(self.request.META.get("REMOTE_ADDR", "")) if self.request is not None else ""
        wait = spend_login_attempt(username, address)
        if wait is not None:
            raise ValidationError(
                "Too many sign-in attempts. Try again in %(seconds)d seconds.",
                code=THROTTLED,
                params={"seconds": wait},
            )
        cleaned: dict[str, Any] | None = super().clean()
        return cleaned if cleaned is not None else self.cleaned_data


class ThrottledAuthenticationForm(ThrottledLoginMixin, AuthenticationForm):
    pass


class ThrottledAdminAuthenticationForm(ThrottledLoginMixin, AdminAuthenticationForm):
    pass


class ThrottledLoginView(LoginView):
    form_class = ThrottledAuthenticationForm

    def form_invalid(self, form: Any) -> HttpResponse:
        throttled = form.has_error("__all__", THROTTLED)
        response = self.render_to_response(self.get_context_data(form=form, throttled=throttled))
        if throttled:
            response.status_code = 429
        return response
