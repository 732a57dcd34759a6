"""Sectr's framework-free core: journal, fold, SessionContext, tools, runtime, providers.

The core never imports Django; the Django app (sessions_app) provides the durable
journal, the workers and the web on the same runtime.
"""

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
