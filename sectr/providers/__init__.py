"""Model providers: the offline demo model and any OpenAI-compatible server.

Which one Sectr uses is configured by the environment (docs/journal.md):
``SECTR_PROVIDER=openai`` with ``OPENAI_BASE_URL``, ``OPENAI_API_KEY`` and
``SECTR_MODEL`` selects :class:`OpenAIProvider`; anything else is the demo model.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from sectr.providers.base import (
    CompletionRequest,
    Finish,
    ModelInfo,
    Provider,
    ReasoningDelta,
    StreamEvent,
    TextDelta,
    ToolCallDelta,
)
from sectr.providers.demo import DemoProvider
from sectr.providers.openai_compat import OpenAIProvider
from sectr.providers.registry import DEMO_MODEL, known_models, lookup_model

__all__ = [
    "DEMO_MODEL",
    "CompletionRequest",
    "DemoProvider",
    "Finish",
    "ModelInfo",
    "OpenAIProvider",
    "Provider",
    "ReasoningDelta",
    "StreamEvent",
    "TextDelta",
    "ToolCallDelta",
    "default_model_from_env",
    "known_models",
    "lookup_model",
    "provider_from_env",
]


FALLBACK_OPENAI_MODEL = "gpt-4o-mini"


def _wants_openai(environ: Mapping[str, str]) -> bool:
    return environ.get("SECTR_PROVIDER", "").strip().lower() == "openai"


def provider_from_env(environ: Mapping[str, str] = os.environ) -> Provider:
    """The provider the environment configures; the demo model when none is."""
    if _wants_openai(environ):
        return OpenAIProvider(
            base_url=environ.get("OPENAI_BASE_URL") or None,
            api_key=environ.get("OPENAI_API_KEY") or "not-needed",
            default_model=default_model_from_env(environ),
        )
    return DemoProvider(environ=environ)


def default_model_from_env(environ: Mapping[str, str] = os.environ) -> str:
    """The model new sessions use: SECTR_MODEL for the OpenAI provider, else "demo".

    With the OpenAI provider and no SECTR_MODEL, ``gpt-4o-mini`` (right for the default
    base URL, api.openai.com; any other server needs SECTR_MODEL).
    """
    if _wants_openai(environ):
        return environ.get("SECTR_MODEL", "").strip() or FALLBACK_OPENAI_MODEL
    return "demo"
