"""Agents: the frozen configuration a session runs with (docs/agents.md).

An agent is data: instructions (the system prompt), a model and its parameters, the
tools it may use (names or globs), the default mode and limits of its new sessions, and
the handler that runs it. A saved agent is versioned; a session pins one version when it
is created (`SESSION_CREATED.agent`), and every invocation of that session runs with that
version's `AgentSpec` until a journaled action moves the pin.

The core knows only the value (`AgentSpec`), how to check a definition
(`sectr.agent_definitions.check_agent_definition`) and which tools a spec selects (`AgentSpec.select_tools`).
Where specs are stored, and who may edit them, is the web app's business.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from sectr.tools import ToolRegistry

DEFAULT_SLUG = "default"
DEFAULT_HANDLER = "default"
#: The error result of a model's call to a tool its agent does not offer.
TOOL_NOT_AVAILABLE = "tool not available to this agent"


def _frozen(mapping: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return MappingProxyType(dict(mapping or {}))


@dataclass(frozen=True)
class AgentSpec:
    """One version of an agent, as every invocation of a session pinned to it sees it.

    `tools` None offers every tool the runtime knows except MCP servers' tools (the
    built-in `default` agent, and `LocalRuntime` without an agent); a tuple offers the
    tools whose names match one of its names or globs, in the runtime's order. An MCP
    tool is offered only by a glob or name that selects it (``git__*``, ``*``).
    """

    slug: str = DEFAULT_SLUG
    version: int = 1
    id: str | None = None  # the stored agent's id; None for the built-in and local agents
    name: str = "Default"
    team: str | None = None  # None: installation-wide
    description: str = ""
    instructions: str = ""
    model: str | None = None  # None: the installation's default model
    params: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    tools: tuple[str, ...] | None = None
    mode: str | None = None  # the default mode of its new sessions; None: "default"
    limits: Mapping[str, int] | None = None  # its new sessions' limits; None: the defaults
    handler: str = DEFAULT_HANDLER

    def __post_init__(self) -> None:
        # Frozen all the way down: no handler, tool or model output can edit what later
        # steps of the run (or other runs) see.
        object.__setattr__(self, "params", _frozen(self.params))
        if self.limits is not None:
            object.__setattr__(self, "limits", _frozen(self.limits))
        if self.tools is not None and not isinstance(self.tools, tuple):
            object.__setattr__(self, "tools", tuple(self.tools))

    @property
    def pin(self) -> dict[str, Any]:
        """What `SESSION_CREATED.agent` (and a move's `SESSION_UPDATED.agent`) records."""
        return {"id": self.id, "slug": self.slug, "team": self.team, "version": self.version}

    def offers(self, tool_name: str) -> bool:
        if self.tools is None:
            return True
        return any(fnmatch.fnmatchcase(tool_name, pattern) for pattern in self.tools)

    def select_tools(self, registry: ToolRegistry) -> ToolRegistry:
        """The tools of `registry` this agent offers to the model and lets run."""
        if self.tools is None:
            # A team's MCP servers reach real systems: only an agent that names them
            # gets them, never every session by default.
            if not any(t.mcp_server is not None for t in registry):
                return registry
            return ToolRegistry(t for t in registry if t.mcp_server is None)
        return ToolRegistry(t for t in registry if self.offers(t.name))

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "slug": self.slug,
            "version": self.version,
            "name": self.name,
            "team": self.team,
            "description": self.description,
            "instructions": self.instructions,
            "model": self.model,
            "params": dict(self.params),
            "tools": list(self.tools) if self.tools is not None else None,
            "mode": self.mode,
            "limits": dict(self.limits) if self.limits is not None else None,
            "handler": self.handler,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AgentSpec:
        tools = data.get("tools")
        return cls(
            slug=str(data.get("slug") or DEFAULT_SLUG),
            version=int(data.get("version") or 1),
            id=data.get("id"),
            name=str(data.get("name") or ""),
            team=data.get("team"),
            description=str(data.get("description") or ""),
            instructions=str(data.get("instructions") or ""),
            model=data.get("model") or None,
            params=dict(data.get("params") or {}),
            tools=tuple(tools) if tools is not None else None,
            mode=data.get("mode") or None,
            limits=dict(data["limits"]) if data.get("limits") is not None else None,
            handler=str(data.get("handler") or DEFAULT_HANDLER),
        )


#: The built-in agent: every tool the runtime has, no instructions. Sessions that name no
#: agent run with it, so an installation without agents behaves as it always did.
DEFAULT_AGENT = AgentSpec()
