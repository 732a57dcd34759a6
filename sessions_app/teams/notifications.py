"""The team page's `Notifications` section: the forms of the team's webhooks (moderators
add one with its URL, kind and write-only secret) and of the switch `Links decide without
login`, and what its partials show. The views are sessions_app.teams.views'; the actions
(sessions_app.actions.webhooks) check who may and validate again.
"""

from __future__ import annotations

from typing import Any

from django import forms

from sectr.errors import ValidationFailed
from sessions_app.actions import webhooks as webhook_actions
from sessions_app.addresses import WEBHOOK_URL_MAX_LENGTH, check_webhook_url
from sessions_app.models import Team, TeamWebhook


class WebhookURLField(forms.URLField):
    """A webhook URL: an absolute http(s) URL whose host passes the address guard
    (check_webhook_url). The team page's form and the admin's use it."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("max_length", WEBHOOK_URL_MAX_LENGTH)
        kwargs.setdefault("assume_scheme", "https")
        super().__init__(**kwargs)

    def validate(self, value: Any) -> None:
        super().validate(value)
        if value in self.empty_values:
            return
        try:
            check_webhook_url(value)
        except ValidationFailed as exc:
            raise forms.ValidationError(exc.message, code=exc.code) from None


class WebhookForm(forms.Form):
    url = WebhookURLField(label="URL")
    kind = forms.ChoiceField(label="Kind", choices=TeamWebhook.KIND_CHOICES, initial=TeamWebhook.JSON)
    secret = forms.CharField(
        label="Secret",
        required=False,
        max_length=webhook_actions.SECRET_MAX_LENGTH,
        strip=False,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
        help_text="signs each JSON delivery (X-Sectr-Signature); never shown again. Empty: a random one",
    )


class LinksForm(forms.Form):
    links_decide_without_login = forms.BooleanField(label="Links decide without login", required=False)


def notifications_context(team: Team, can_edit: bool) -> dict[str, Any]:
    """What the section's partials (teams/_webhooks.html, teams/_links.html) show: the
    webhooks themselves only to moderators (a URL may be a credential), a count to others."""
    hooks = team.webhooks.order_by("created_at", "id")
    return {
        "webhooks": list(hooks) if can_edit else [],
        "webhook_count": hooks.count(),
        "webhook_form": WebhookForm(),
        "links_form": LinksForm(initial={"links_decide_without_login": team.links_decide_without_login}),
    }
