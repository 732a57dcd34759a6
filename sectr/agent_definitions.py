"""Checking an agent's definition before it is saved as a version (docs/agents.md).

Pure functions: each returns the normalised value or raises `ValidationFailed` naming
the field, so the API, the web form and a plugin's own code refuse the same things with
the same words.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from sectr.agents import DEFAULT_HANDLER
from sectr.errors import ValidationFailed
from sectr.operations import check_limits, check_mode_value, check_model_value, check_reasoning_effort

SLUG_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
#: A tool name or a glob over tool names (`git__*`, `get_?ime`, `[a-c]*`).
TOOL_PATTERN_RE = re.compile(r"^[A-Za-z0-9_\-*?\[\]!]{1,128}$")
HANDLER_RE = re.compile(r"^[A-Za-z0-9_.:\-]{1,200}$")
NAME_MAX = 120
DESCRIPTION_MAX = 2_000
INSTRUCTIONS_MAX = 100_000
MAX_TOOL_PATTERNS = 200
PARAM_KEYS = ("temperature", "reasoning_effort", "max_output_tokens")


def _check_text(data: Mapping[str, Any], key: str, limit: int, *, required: bool = False) -> str:
    value = data.get(key, "")
    if value is None:
        value = ""
    if not isinstance(value, str):
        raise ValidationFailed(f"{key} must be text", code=f"invalid_{key}")
    value = value.strip() if key != "instructions" else value
    if required and not value.strip():
        raise ValidationFailed(f"{key} is required", code=f"invalid_{key}")
    if len(value) > limit:
        raise ValidationFailed(f"{key} is longer than {limit} characters", code=f"invalid_{key}")
    if "\x00" in value:
        raise ValidationFailed(f"{key} must not contain NUL characters", code=f"invalid_{key}")
    return value


def check_slug(slug: Any) -> str:
    if not isinstance(slug, str) or not SLUG_RE.fullmatch(slug):
        raise ValidationFailed(
            "slug must be 1-63 lowercase letters, digits and dashes, starting with a letter or digit",
            code="invalid_slug",
        )
    return slug


def check_params(params: Any) -> dict[str, Any]:
    if params is None:
        return {}
    if not isinstance(params, Mapping):
        raise ValidationFailed("params must be an object", code="invalid_params")
    unknown = set(params) - set(PARAM_KEYS)
    if unknown:
        raise ValidationFailed(
            f"unknown params: {', '.join(sorted(map(str, unknown)))} (known: {', '.join(PARAM_KEYS)})",
            code="invalid_params",
        )
    checked: dict[str, Any] = {}
    temperature = params.get("temperature")
    if temperature is not None:
        if isinstance(temperature, bool) or not isinstance(temperature, int | float) or not 0 <= temperature <= 2:
            raise ValidationFailed("params.temperature must be a number from 0 to 2", code="invalid_params")
        checked["temperature"] = float(temperature)
    effort = check_reasoning_effort(params.get("reasoning_effort"))
    if effort is not None:
        checked["reasoning_effort"] = effort
    max_output = params.get("max_output_tokens")
    if isinstance(max_output, float) and max_output.is_integer():
        max_output = int(max_output)  # 5.0 is the whole number 5 in JSON (and in JSON Schema)
    if max_output is not None:
        if isinstance(max_output, bool) or not isinstance(max_output, int) or not 1 <= max_output <= 10**7:
            raise ValidationFailed(
                "params.max_output_tokens must be a whole number from 1 to 10000000", code="invalid_params"
            )
        checked["max_output_tokens"] = max_output
    return checked


def check_tool_patterns(tools: Any) -> tuple[str, ...] | None:
    """A list of tool names or globs (None: every tool the runtime has)."""
    if tools is None:
        return None
    if not isinstance(tools, list | tuple):  # a string, a dict or a set is not a list of names
        raise ValidationFailed("tools must be a list of tool names or globs", code="invalid_tools")
    patterns: list[str] = []
    for pattern in tools:
        if not isinstance(pattern, str) or not TOOL_PATTERN_RE.fullmatch(pattern):
            raise ValidationFailed(
                f"tools: {pattern!r} is not a tool name or glob (letters, digits, _ - * ? [ ] !)",
                code="invalid_tools",
            )
        if pattern not in patterns:
            patterns.append(pattern)
    if len(patterns) > MAX_TOOL_PATTERNS:
        raise ValidationFailed(f"at most {MAX_TOOL_PATTERNS} tool names or globs", code="invalid_tools")
    return tuple(patterns)


def check_handler_name(handler: Any) -> str:
    if handler in (None, ""):
        return DEFAULT_HANDLER
    if not isinstance(handler, str) or not HANDLER_RE.fullmatch(handler):
        raise ValidationFailed("handler must be the name of a registered handler", code="invalid_handler")
    return handler


def check_agent_definition(data: Mapping[str, Any]) -> dict[str, Any]:
    """Validate the editable fields of an agent (everything but its identity and version).

    Returns the normalised fields; raises ValidationFailed naming the first bad one.
    Which handlers and tools exist is the caller's to check against its registries.
    """
    if not isinstance(data, Mapping):
        raise ValidationFailed("an agent must be an object", code="invalid_agent")
    model = data.get("model")
    mode = data.get("mode")
    limits = data.get("limits")
    return {
        "name": _check_text(data, "name", NAME_MAX, required=True),
        "description": _check_text(data, "description", DESCRIPTION_MAX),
        "instructions": _check_text(data, "instructions", INSTRUCTIONS_MAX),
        "model": check_model_value(model) if model not in (None, "") else None,
        "params": check_params(data.get("params")),
        "tools": check_tool_patterns(data.get("tools", None)),
        "mode": check_mode_value(mode) if mode not in (None, "") else None,
        "limits": check_limits(limits) if limits is not None else None,
        "handler": check_handler_name(data.get("handler")),
    }
