"""The example plugin package (examples/plugin_package) declares entry points that name
its real tool and handler, and the registry loads them: what CONTRIBUTING.md shows works."""

from __future__ import annotations

import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from sectr import LocalRuntime
from sectr.agents import AgentSpec
from sectr.events import EventType
from sectr.plugins import HANDLERS_GROUP, TOOLS_GROUP, PluginRegistry, import_dotted
from sectr.providers.demo import DemoProvider

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "plugin_package"


@pytest.fixture
def example_on_path() -> Iterator[None]:
    sys.path.insert(0, str(EXAMPLE))
    try:
        yield
    finally:
        sys.path.remove(str(EXAMPLE))
        sys.modules.pop("sectr_release_tools", None)


def test_its_entry_points_name_its_tool_and_handler(example_on_path: None) -> None:
    entry_points = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())["project"]["entry-points"]
    tool = import_dotted(entry_points[TOOLS_GROUP]["release_notes"].replace(":", "."))
    handler = import_dotted(entry_points[HANDLERS_GROUP]["release"].replace(":", "."))
    assert tool.name == "release_notes" and tool.gated
    assert callable(handler)


async def test_the_registry_loads_it_and_an_agent_runs_its_handler_and_tool(example_on_path: None) -> None:
    registry = PluginRegistry()
    registry.load_modules(["sectr_release_tools"], "SECTR_PLUGINS")
    assert not registry.failures
    assert [t.name for t in registry.tool_list()] == ["release_notes"]
    handler = registry.get_handler("release")
    assert handler is not None
    agent = AgentSpec(slug="release", handler="release", tools=("release_notes",))
    rt = LocalRuntime(
        tools=registry.tool_list(), handlers={"release": handler}, agent=agent, provider=DemoProvider(delay=0)
    )
    sid = await rt.create_session()
    outcome = await rt.send(sid, '!tool release_notes {"version": "1.2", "summary": "faster"}')
    assert outcome.type is EventType.INVOCATION_SUSPENDED  # gated: a person approves the draft
    outcome = await rt.decide(sid, outcome.payload["ask_id"], "allow_once", approver="bob")
    [result] = [e for e in rt.journal.read(sid) if e.type is EventType.TOOL_RESULT]
    assert result.payload["content"] == "Release 1.2: faster"
