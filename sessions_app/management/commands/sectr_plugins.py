"""List the tools and handlers plugins registered: `python manage.py sectr_plugins`."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError

from sectr.builtin_tools import BUILTIN_TOOLS
from sessions_app.plugins import describe_handler, plugin_registry


class Command(BaseCommand):
    help = (
        "Lists the tools and handlers registered by installed packages (entry points sectr.tools and "
        "sectr.handlers), SECTR_PLUGINS, SECTR_TOOLS and SECTR_HANDLER, where each came from, and the "
        "plugins that failed to load."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            registry = plugin_registry()
        except ImproperlyConfigured as exc:
            raise CommandError(str(exc)) from exc
        write = self.stdout.write
        write("built-in tools: " + ", ".join(sorted(tool.name for tool in BUILTIN_TOOLS)))
        write("tools:" if registry.tools else "tools: none from plugins")
        for name, entry in sorted(registry.tools.items()):
            replaces = " (replaces the built-in one)" if name in {t.name for t in BUILTIN_TOOLS} else ""
            write(f"  {name}{replaces}: {entry.source}")
        write("handlers:" if registry.handlers else "handlers: none from plugins")
        for name, entry in sorted(registry.handlers.items()):
            write(f"  {name}: {entry.source}, {describe_handler(entry.obj)}")
        write(f"runs use: {settings.SECTR_HANDLER or 'the default agent'}")
        if registry.failures:
            write("failed to load:")
            for failure in registry.failures:
                write(f"  {failure.source}: {failure.error}")
