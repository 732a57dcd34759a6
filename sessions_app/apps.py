from django.apps import AppConfig


class SessionsAppConfig(AppConfig):
    name = "sessions_app"
    label = "sessions_app"
    verbose_name = "Sectr sessions"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Signal receivers register on import.
        from sessions_app.accounts import signals  # noqa: F401
