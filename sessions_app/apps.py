from django.apps import AppConfig


class SessionsAppConfig(AppConfig):
    name = "sessions_app"
    label = "sessions_app"
    verbose_name = "Sectr sessions"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from sessions_app.telemetry.tracing import configure_tracing

        configure_tracing()  # OTLP traces when OTEL_EXPORTER_OTLP_ENDPOINT is set
        from django.contrib.auth import get_user_model
        from django.db.models.signals import post_save

        from sessions_app.actions.tokens import revoke_tokens_when_user_deactivated

        # A deactivated user's tokens are revoked, so reactivation does not revive them.
        post_save.connect(
            revoke_tokens_when_user_deactivated,
            sender=get_user_model(),
            dispatch_uid="sectr-revoke-tokens-on-deactivation",
        )

        from sessions_app.socket_access import connect_access_signals

        connect_access_signals()  # open sockets re-check at once when access may be gone

        from django.core import checks

        from sectr_web.middleware import check_security_middleware

        checks.register(check_security_middleware, checks.Tags.security, deploy=True)

        # Signal receivers register on import.
        from sessions_app.accounts import signals  # noqa: F401
