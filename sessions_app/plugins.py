"""Where the server's tools and handlers come from: one registry per process.

In order (a later tool with a name replaces an earlier one):

1. installed packages' entry points, groups ``sectr.tools`` and ``sectr.handlers``;
2. the modules ``SECTR_PLUGINS`` names (every ``@sectr.tool`` and ``@sectr.handler``
   they define);
3. the tools ``SECTR_TOOLS`` names by dotted path;
4. ``SECTR_HANDLER``: the handler the runtime runs, a registered handler's name or a
   dotted path (unset: the default agent).

A plugin of 1. or 2. that fails to import is logged and listed by `/readyz` and
`manage.py sectr_plugins`; the server runs with the others. SECTR_TOOLS and
SECTR_HANDLER are this installation's own explicit choice: one that cannot be loaded
is an ImproperlyConfigured error. The built-in tools are the runtime's own
(sectr.runtime.builtin_registry), beside these.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from sectr.plugins import PluginRegistry, handler_name, import_dotted
from sectr.runtime import Handler
from sectr.tools import Tool


@cache
def plugin_registry() -> PluginRegistry:
    registry = PluginRegistry()
    registry.load_entry_points()
    registry.load_modules(settings.SECTR_PLUGINS, "SECTR_PLUGINS")
    for path in settings.SECTR_TOOLS:
        tool = _load("SECTR_TOOLS", path)
        if not isinstance(tool, Tool):
            raise ImproperlyConfigured(f"SECTR_TOOLS: {path} is {tool!r}, not a tool (decorate it with @sectr.tool)")
        registry.add_tool(tool, f"SECTR_TOOLS {path}")
    name = settings.SECTR_HANDLER
    if name and name not in registry.handlers:
        handler = _load("SECTR_HANDLER", name, "neither a registered handler's name nor")
        if not callable(handler):
            raise ImproperlyConfigured(f"SECTR_HANDLER: {name} is {handler!r}, not an async def handler(ctx)")
        registry.add_handler(name, handler, f"SECTR_HANDLER {name}")
    return registry


def _load(setting: str, path: str, what: str = "not") -> Any:
    try:
        return import_dotted(path)
    except Exception as exc:
        raise ImproperlyConfigured(
            f"{setting}: {path} is {what} an importable dotted path ({type(exc).__name__}: {exc})"
        ) from exc


def configured_handler() -> Handler | None:
    """The handler SECTR_HANDLER names; None: the default agent."""
    name = settings.SECTR_HANDLER
    return plugin_registry().get_handler(name) if name else None


def configured_handlers() -> dict[str, Handler]:
    """Every registered handler by name: what an agent's `handler` may name."""
    registry = plugin_registry()
    return {name: entry.obj for name, entry in registry.handlers.items()}


def configured_tools() -> list[Tool]:
    """The tools plugins and SECTR_TOOLS add to the built-in ones."""
    return plugin_registry().tool_list()


def describe_handler(handler: Any) -> str:
    """How `manage.py sectr_plugins` names a handler's function."""
    name = handler_name(handler)
    where = f"{getattr(handler, '__module__', '?')}.{getattr(handler, '__qualname__', '?')}"
    return f"{where} (@sectr.handler({name!r}))" if name else where
