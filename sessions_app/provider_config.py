"""The model provider's configuration, from Django's settings.

The core (sectr.providers) reads its configuration from a mapping of the variable names
it documents; standalone, `LocalRuntime` passes it the process environment. The server
passes these settings instead (parsed once in sectr_web/settings.py), so the provider,
the default model and the model registry's context windows follow `override_settings`.
"""

from __future__ import annotations

from django.conf import settings

from sectr.providers import Provider, default_model_from_env, provider_from_env
from sectr.providers.base import ModelInfo
from sectr.providers.registry import lookup_model


def provider_settings() -> dict[str, str]:
    """The provider's settings under the names the core reads (unset ones left out)."""
    values = {
        "SECTR_PROVIDER": settings.SECTR_PROVIDER,
        "SECTR_MODEL": settings.SECTR_MODEL,
        "OPENAI_BASE_URL": settings.OPENAI_BASE_URL,
        "OPENAI_API_KEY": settings.OPENAI_API_KEY,
        "SECTR_DEMO_DELAY_MS": f"{settings.SECTR_DEMO_DELAY_MS:g}",
        "SECTR_DEMO_SLOW_MS": f"{settings.SECTR_DEMO_SLOW_MS:g}",
        "SECTR_DEMO_STAMP_FILE": settings.SECTR_DEMO_STAMP_FILE,
        "SECTR_CONTEXT_WINDOW": str(settings.SECTR_CONTEXT_WINDOW or ""),
        "SECTR_MODEL_CONTEXT_WINDOW": str(settings.SECTR_MODEL_CONTEXT_WINDOW or ""),
    }
    return {name: str(value) for name, value in values.items() if value}


def configured_provider() -> Provider:
    return provider_from_env(provider_settings())


def default_model() -> str:
    """The model new sessions use."""
    return default_model_from_env(provider_settings())


def model_info(model_id: str, provider_id: str | None = None) -> ModelInfo:
    """What the model registry knows of `model_id` (context window overrides applied)."""
    return lookup_model(model_id, provider_id, environ=provider_settings())
