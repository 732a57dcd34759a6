"""Plugins: tools and handlers that installed packages and named modules add.

Where they come from (in this order; a later tool or handler with a name replaces an
earlier one, as in a ToolRegistry):

- the entry-point group ``sectr.tools``: each entry point names a ``@sectr.tool`` object
  (``search = "mypkg.tools:search"``) or a module, whose every ``@sectr.tool`` object
  and ``@sectr.handler`` function is registered;
- the entry-point group ``sectr.handlers``: each names a handler, ``async def
  handler(ctx)``, registered under the entry point's name (``triage =
  "mypkg.agents:triage"``), or a module, scanned as above;
- module paths (the server's ``SECTR_PLUGINS``, comma-separated), scanned as above.

The server then adds the single objects its ``SECTR_TOOLS`` and ``SECTR_HANDLER`` name
(sessions_app.runtime.plugin_registry).

A plugin that fails to import (or names something that is not a tool or handler) is
logged and kept in `PluginRegistry.failures` with the error; everything else still
registers, so a server with one broken plugin starts and says which (its /readyz).

The core never reads settings: the caller passes the module paths.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, TypeVar

from sectr.tools import Tool

log = logging.getLogger("sectr.plugins")

TOOLS_GROUP = "sectr.tools"
HANDLERS_GROUP = "sectr.handlers"
#: The attribute `@sectr.handler("name")` sets on the function it decorates.
HANDLER_NAME_ATTRIBUTE = "__sectr_handler__"

F = TypeVar("F", bound=Callable[..., Any])


def handler(name: str) -> Callable[[F], F]:
    """Mark `async def fn(ctx)` as the handler `name` for plugin discovery.

    The function is returned unchanged (it can still be passed to a Runtime directly).
    """
    if not isinstance(name, str) or not name.strip():
        raise ValueError("a handler needs a name: @sectr.handler('triage')")

    def mark(fn: F) -> F:
        if not callable(fn):
            raise TypeError(f"@sectr.handler({name!r}) decorates a function, not {fn!r}")
        setattr(fn, HANDLER_NAME_ATTRIBUTE, name.strip())
        return fn

    return mark


def handler_name(obj: Any) -> str | None:
    """The name `@sectr.handler` gave `obj`, or None."""
    name = getattr(obj, HANDLER_NAME_ATTRIBUTE, None) if callable(obj) else None
    return name if isinstance(name, str) else None


@dataclass(frozen=True)
class Registered:
    kind: str  # "tool" or "handler"
    name: str
    source: str  # where it came from, for people: "entry point sectr.tools: search = mypkg.tools:search"
    obj: Any = field(repr=False, compare=False)


@dataclass(frozen=True)
class PluginFailure:
    source: str
    error: str


@dataclass
class PluginRegistry:
    """Every tool and handler plugins registered, by name, with where each came from."""

    tools: dict[str, Registered] = field(default_factory=dict)
    handlers: dict[str, Registered] = field(default_factory=dict)
    failures: list[PluginFailure] = field(default_factory=list)

    # ---- registering ----

    def add_tool(self, tool: Tool, source: str) -> None:
        if not isinstance(tool, Tool):
            raise TypeError(f"{tool!r} is not a Tool: decorate it with @sectr.tool")
        self.tools[tool.name] = Registered("tool", tool.name, source, tool)

    def add_handler(self, name: str, fn: Callable[..., Any], source: str) -> None:
        if not callable(fn):
            raise TypeError(f"{fn!r} is not a handler: an async def handler(ctx)")
        self.handlers[name] = Registered("handler", name, source, fn)

    def add_module(self, module: ModuleType, source: str) -> int:
        """Register every `@sectr.tool` object and `@sectr.handler` function `module`
        defines at its top level; how many. What it imports from elsewhere (such as a
        built-in tool) stays registered by where it was defined."""
        found = 0
        for _, value in inspect.getmembers(module):
            if getattr(value, "__module__", None) != module.__name__:
                continue
            if isinstance(value, Tool):
                self.add_tool(value, source)
                found += 1
            elif (name := handler_name(value)) is not None:
                self.add_handler(name, value, source)
                found += 1
        return found

    def fail(self, source: str, exc: BaseException) -> None:
        error = f"{type(exc).__name__}: {exc}"
        log.error("plugin %s failed to load: %s", source, error, exc_info=exc)
        self.failures.append(PluginFailure(source, error))

    # ---- loading ----

    def load_entry_points(self) -> None:
        for group in (TOOLS_GROUP, HANDLERS_GROUP):
            for entry_point in sorted(importlib.metadata.entry_points(group=group), key=_entry_point_order):
                source = f"entry point {group}: {entry_point.name} = {entry_point.value}"
                dist = getattr(entry_point, "dist", None)
                if dist is not None:
                    source += f" ({dist.name} {dist.version})"
                try:
                    self._add_entry_point(group, entry_point.name, entry_point.load(), source)
                except Exception as exc:
                    self.fail(source, exc)

    def _add_entry_point(self, group: str, name: str, obj: Any, source: str) -> None:
        if isinstance(obj, ModuleType):
            if not self.add_module(obj, source):
                raise LookupError(f"module {obj.__name__} has no @sectr.tool or @sectr.handler")
        elif group == TOOLS_GROUP:
            self.add_tool(obj, source)
        else:
            self.add_handler(name, obj, source)

    def load_modules(self, paths: Iterable[str], setting: str = "plugin module") -> None:
        for path in paths:
            source = f"{setting} {path}"
            try:
                module = importlib.import_module(path)
                if not self.add_module(module, source):
                    raise LookupError(f"module {path} has no @sectr.tool or @sectr.handler")
            except Exception as exc:
                self.fail(source, exc)

    # ---- reading ----

    def tool_list(self) -> list[Tool]:
        return [entry.obj for entry in self.tools.values()]

    def get_handler(self, name: str) -> Callable[..., Any] | None:
        entry = self.handlers.get(name)
        return None if entry is None else entry.obj

    def listing(self) -> list[Registered]:
        """Tools then handlers, each by name."""
        return sorted(self.tools.values(), key=lambda r: r.name) + sorted(self.handlers.values(), key=lambda r: r.name)


def _entry_point_order(entry_point: importlib.metadata.EntryPoint) -> tuple[str, str]:
    return entry_point.name, entry_point.value


def import_dotted(path: str) -> Any:
    """`pkg.module.attribute` (or `pkg.module:attribute`) imported."""
    module_path, sep, attribute = path.partition(":")
    if not sep:
        module_path, _, attribute = path.rpartition(".")
    if not module_path or not attribute:
        raise ImportError(f"{path!r} is not a dotted path to an attribute of a module")
    module = importlib.import_module(module_path)
    try:
        return getattr(module, attribute)
    except AttributeError:
        raise ImportError(f"module {module_path} has no attribute {attribute!r}") from None


def load_plugins(modules: Iterable[str] = (), *, entry_points: bool = True) -> PluginRegistry:
    """A registry of the installed entry points' plugins and those of `modules`."""
    registry = PluginRegistry()
    if entry_points:
        registry.load_entry_points()
    registry.load_modules(modules)
    return registry
