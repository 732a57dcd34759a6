"""The model registry: what Sectr knows about a model id (context window, reasoning, media).

Lookups are forgiving because the same model travels under many names: OpenAI ids
with a date suffix (``gpt-4o-2024-08-06``), Ollama tags (``llama3.1:8b``), OpenRouter
and Hugging Face ids with an organisation prefix (``openai/gpt-4o``,
``Qwen/Qwen2.5-7B-Instruct``). An id nobody knows gets a conservative default entry
(no media) rather than an error, so any OpenAI-compatible server works.

Environment:

- ``SECTR_CONTEXT_WINDOW``: the context window assumed for unknown model ids (32768).
- ``SECTR_MODEL_CONTEXT_WINDOW``: overrides the context window of every lookup, known
  models and the demo included (e.g. a local server started with a smaller ``num_ctx``,
  or a tiny window to exercise automatic compaction with the demo model).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import replace

from sectr.providers.base import ModelInfo

DEFAULT_CONTEXT_WINDOW = 32768

#: The offline demo model (docs/journal.md). It accepts images and audio so media
#: handling can be tested without a real model.
DEMO_MODEL = ModelInfo(
    model_id="demo", provider_id="demo", context_window=8192, reasoning=True, image_input=True, audio_input=True
)


def _openai_compatible(
    model_id: str, context_window: int, *, reasoning: bool = False, image: bool = False, audio: bool = False
) -> ModelInfo:
    return ModelInfo(
        model_id=model_id,
        provider_id="openai",
        context_window=context_window,
        reasoning=reasoning,
        image_input=image,
        audio_input=audio,
    )


_ENTRIES: tuple[ModelInfo, ...] = (
    DEMO_MODEL,
    # OpenAI (context windows as published by OpenAI)
    _openai_compatible("gpt-4o", 128_000, image=True),
    _openai_compatible("gpt-4o-mini", 128_000, image=True),
    _openai_compatible("gpt-4o-audio-preview", 128_000, audio=True),
    _openai_compatible("gpt-4o-mini-audio-preview", 128_000, audio=True),
    _openai_compatible("gpt-4.1", 1_047_576, image=True),
    _openai_compatible("gpt-4.1-mini", 1_047_576, image=True),
    _openai_compatible("gpt-4.1-nano", 1_047_576, image=True),
    _openai_compatible("gpt-5", 400_000, reasoning=True, image=True),
    _openai_compatible("gpt-5-mini", 400_000, reasoning=True, image=True),
    _openai_compatible("gpt-5-nano", 400_000, reasoning=True, image=True),
    _openai_compatible("o1", 200_000, reasoning=True, image=True),
    _openai_compatible("o3", 200_000, reasoning=True, image=True),
    _openai_compatible("o3-mini", 200_000, reasoning=True),
    _openai_compatible("o4-mini", 200_000, reasoning=True, image=True),
    # Open-weight models under their Ollama names (also matched as Hugging Face ids)
    _openai_compatible("llama3.1", 131_072),
    _openai_compatible("llama3.1:8b", 131_072),
    _openai_compatible("llama-3.1", 131_072),
    _openai_compatible("llama3.2", 131_072),
    _openai_compatible("llama3.2:3b", 131_072),
    _openai_compatible("llama3.2-vision", 131_072, image=True),
    _openai_compatible("qwen2.5", 32_768),
    _openai_compatible("qwen2.5:7b", 32_768),
    _openai_compatible("qwen2.5-coder", 32_768),
    _openai_compatible("qwen3", 40_960, reasoning=True),
    _openai_compatible("deepseek-r1", 131_072, reasoning=True),
    _openai_compatible("mistral", 32_768),
    _openai_compatible("gemma3", 131_072, image=True),
    _openai_compatible("phi4", 16_384),
)

#: Known models by lower-cased id.
MODELS: dict[str, ModelInfo] = {entry.model_id.lower(): entry for entry in _ENTRIES}


def _positive_int(environ: Mapping[str, str], name: str) -> int | None:
    raw = environ.get(name, "").strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        return None
    return value if value > 0 else None


def _find_entry(model_id: str) -> ModelInfo | None:
    key = model_id.strip().lower()
    candidates = [key]
    if "/" in key:  # "openai/gpt-4o", "Qwen/Qwen2.5-7B-Instruct"
        candidates.append(key.rsplit("/", 1)[1])
    for candidate in candidates:
        if candidate in MODELS:
            return MODELS[candidate]
    # The longest known id that the given one extends at a "-" or ":" boundary:
    # "gpt-4o-mini-2024-07-18" -> gpt-4o-mini, "llama3.1:70b" -> llama3.1.
    best: ModelInfo | None = None
    best_len = 0
    for candidate in candidates:
        for known, entry in MODELS.items():
            if (
                len(known) > best_len
                and candidate.startswith(known)
                and len(candidate) > len(known)
                and candidate[len(known)] in "-:"
            ):
                best, best_len = entry, len(known)
    return best


def lookup_model(
    model_id: str, provider_id: str | None = None, *, environ: Mapping[str, str] | None = None
) -> ModelInfo:
    """What Sectr knows about `model_id`, served by `provider_id` (when given).

    The returned entry carries the id as asked for (not the registry's canonical
    spelling), so it can be shown and sent to the provider as is.
    """
    env = os.environ if environ is None else environ
    entry = _find_entry(model_id) if model_id else None
    if entry is None:
        info = ModelInfo(
            model_id=model_id,
            provider_id=provider_id or "openai",
            context_window=_positive_int(env, "SECTR_CONTEXT_WINDOW") or DEFAULT_CONTEXT_WINDOW,
        )
    else:
        info = replace(entry, model_id=model_id, provider_id=provider_id or entry.provider_id)
    override = _positive_int(env, "SECTR_MODEL_CONTEXT_WINDOW")
    if override is not None:
        info = replace(info, context_window=override)
    return info


def known_models(provider_id: str | None = None) -> list[ModelInfo]:
    """The registry's entries (for a model picker), optionally only one provider's."""
    return [entry for entry in _ENTRIES if provider_id is None or entry.provider_id == provider_id]
