"""An example Sectr plugin (see pyproject.toml beside it and CONTRIBUTING.md, "A plugin
package"): one tool and one handler, found through the entry points `sectr.tools` and
`sectr.handlers` once the package is installed."""

from __future__ import annotations

import sectr
from sectr.agent import default_handler
from sectr.context import SessionContext


@sectr.tool(gated=True, mutating=True)
def release_notes(version: str, summary: str) -> str:
    """Draft the release notes of a version (gated: a person approves each draft)."""
    return f"Release {version}: {summary}"


@sectr.handler("release")
async def release(ctx: SessionContext) -> None:
    """The default tool-calling loop; an agent whose `handler` is "release" runs it."""
    await default_handler(ctx)
