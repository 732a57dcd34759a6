from django.apps import AppConfig


class SessionsAppConfig(AppConfig):
    name = "sessions_app"
    label = "sessions_app"
    verbose_name = "Sectr sessions"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from sessions_app.ops.tracing import configure_tracing

        configure_tracing()  # OTLP traces when OTEL_EXPORTER_OTLP_ENDPOINT is set
