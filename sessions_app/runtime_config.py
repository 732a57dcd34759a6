"""The process's Runtime: the database journal, the configured handler, tools and provider.

Settings: SECTR_HANDLER (dotted path of `async def handler(ctx)`, default the default
agent), SECTR_TOOLS (dotted paths of extra `@sectr.tool` objects). The provider comes
from the environment (sectr.providers.provider_from_env).
"""

from __future__ import annotations

from functools import cache

from django.conf import settings
from django.utils.module_loading import import_string

from sectr.runtime import Runtime
from sessions_app.journal import DatabaseJournal


@cache
def get_runtime() -> Runtime:
    handler_path = getattr(settings, "SECTR_HANDLER", None)
    handler = import_string(handler_path) if handler_path else None
    tools = [import_string(path) for path in getattr(settings, "SECTR_TOOLS", [])]
    return Runtime(DatabaseJournal(), handler=handler, tools=tools)
