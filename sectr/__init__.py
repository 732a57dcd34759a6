"""Sectr's framework-free core: journal, fold, SessionContext, tools, runtime, providers.

The core never imports Django; the Django app (sessions_app) provides the durable
journal, the workers and the web on the same runtime.

The names below load on first use (PEP 562), so `import sectr.client` (the SDK, which
needs only httpx) does not pull in the runtime and its model providers (openai).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sectr.context import MessageStream, ModelTurn, SessionContext, ToolResult
    from sectr.control import RunControl
    from sectr.errors import ApprovalDenied, ApprovalRequired, LeaseLost, ProviderError, SectrError
    from sectr.events import Envelope, EventType
    from sectr.fold import fold_messages
    from sectr.journal import Journal, MemoryJournal, NewEvent
    from sectr.local import LocalRuntime
    from sectr.plugins import handler
    from sectr.runtime import Runtime
    from sectr.tools import Tool, ToolContext, ToolRegistry, tool

__version__ = "0.1.0"

#: Each public name and the module that defines it.
_EXPORTS: dict[str, str] = {
    "ApprovalDenied": "sectr.errors",
    "ApprovalRequired": "sectr.errors",
    "Envelope": "sectr.events",
    "EventType": "sectr.events",
    "Journal": "sectr.journal",
    "LeaseLost": "sectr.errors",
    "LocalRuntime": "sectr.local",
    "MemoryJournal": "sectr.journal",
    "MessageStream": "sectr.context",
    "ModelTurn": "sectr.context",
    "NewEvent": "sectr.journal",
    "ProviderError": "sectr.errors",
    "RunControl": "sectr.control",
    "Runtime": "sectr.runtime",
    "SectrError": "sectr.errors",
    "SessionContext": "sectr.context",
    "Tool": "sectr.tools",
    "ToolContext": "sectr.tools",
    "ToolRegistry": "sectr.tools",
    "ToolResult": "sectr.context",
    "fold_messages": "sectr.fold",
    "handler": "sectr.plugins",
    "tool": "sectr.tools",
}

__all__ = [
    "ApprovalDenied",
    "ApprovalRequired",
    "Envelope",
    "EventType",
    "Journal",
    "LeaseLost",
    "LocalRuntime",
    "MemoryJournal",
    "MessageStream",
    "ModelTurn",
    "NewEvent",
    "ProviderError",
    "RunControl",
    "Runtime",
    "SectrError",
    "SessionContext",
    "Tool",
    "ToolContext",
    "ToolRegistry",
    "ToolResult",
    "fold_messages",
    "handler",
    "tool",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'sectr' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
