"""Plugins: tools and handlers from installed packages' entry points and from modules.

The installed package is real: a dist-info with entry_points.txt on sys.path, found by
importlib.metadata as pip-installed ones are.
"""

from __future__ import annotations

import logging
import textwrap
from pathlib import Path

import pytest

import sectr
from sectr.plugins import HANDLERS_GROUP, TOOLS_GROUP, PluginRegistry, handler_name, import_dotted, load_plugins
from sectr.tools import Tool

TOOLS_MODULE = '''
import sectr

@sectr.tool
def shout(text: str) -> str:
    """Shout the text."""
    return text.upper()

@sectr.tool(name="whisper")
def quiet(text: str) -> str:
    """Whisper the text."""
    return text.lower()
'''

AGENTS_MODULE = '''
import sectr
from sectr.builtin_tools import calculator  # imported, not defined here: not this plugin's

@sectr.handler("triage")
async def triage(ctx):
    await ctx.reply("triaged")

async def plain(ctx):
    await ctx.reply("plain")

@sectr.tool
def label(name: str) -> str:
    """Label a thing."""
    return name
'''


def install(root: Path, package: str, modules: dict[str, str], entry_points: dict[str, list[str]]) -> None:
    """A package `package` with `modules` and a dist-info declaring `entry_points`, under `root`."""
    (root / package).mkdir()
    (root / package / "__init__.py").write_text("")
    for name, source in modules.items():
        (root / package / f"{name}.py").write_text(textwrap.dedent(source))
    dist_info = root / f"{package}-1.2.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {package}\nVersion: 1.2\n")
    sections = [f"[{group}]\n" + "".join(f"{line}\n" for line in lines) for group, lines in entry_points.items()]
    (dist_info / "entry_points.txt").write_text("\n".join(sections))


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.syspath_prepend(str(tmp_path))  # also invalidates the import caches
    return tmp_path


def test_the_handler_decorator_names_the_function_and_returns_it() -> None:
    async def fn(ctx: object) -> None: ...

    assert sectr.handler("triage")(fn) is fn
    assert handler_name(fn) == "triage"
    with pytest.raises(ValueError, match="needs a name"):
        sectr.handler("  ")


def test_entry_points_register_tools_and_handlers_with_where_they_came_from(site: Path) -> None:
    install(
        site,
        "sectr_fixture_plugin",
        {"tools": TOOLS_MODULE, "agents": AGENTS_MODULE},
        {
            TOOLS_GROUP: ["shout = sectr_fixture_plugin.tools:shout", "agents = sectr_fixture_plugin.agents"],
            HANDLERS_GROUP: ["plain = sectr_fixture_plugin.agents:plain"],
        },
    )
    registry = load_plugins()
    assert registry.failures == []
    assert set(registry.tools) >= {"shout", "label"}
    assert "whisper" not in registry.tools  # only the entry point's one object of tools.py
    assert "calculator" not in registry.tools  # agents.py imports it; it is not the plugin's
    assert registry.tools["shout"].source == (
        "entry point sectr.tools: shout = sectr_fixture_plugin.tools:shout (sectr_fixture_plugin 1.2)"
    )
    assert registry.tools["label"].source.startswith("entry point sectr.tools: agents = sectr_fixture_plugin.agents")
    assert isinstance(registry.tools["shout"].obj, Tool) and registry.tools["shout"].obj("hi") == "HI"
    triage, plain = registry.get_handler("triage"), registry.get_handler("plain")
    assert triage is not None and triage.__name__ == "triage"
    assert plain is not None and plain.__name__ == "plain"  # named by its entry point
    assert "label" in [t.name for t in registry.tool_list()]


def test_a_plugin_that_fails_to_import_is_named_and_the_others_still_register(
    site: Path, caplog: pytest.LogCaptureFixture
) -> None:
    install(
        site,
        "sectr_broken_plugin",
        {"tools": TOOLS_MODULE, "bad": "import no_such_module_anywhere\n", "empty": "X = 1\n"},
        {
            TOOLS_GROUP: [
                "bad = sectr_broken_plugin.bad",
                "shout = sectr_broken_plugin.tools:shout",
                "missing = sectr_broken_plugin.tools:nothing_here",
                "notatool = sectr_broken_plugin.empty:X",
                "empty = sectr_broken_plugin.empty",
            ]
        },
    )
    with caplog.at_level(logging.ERROR, logger="sectr.plugins"):
        registry = load_plugins()
    assert "shout" in registry.tools
    failures = {failure.source.split(":")[1].split("=")[0].strip(): failure.error for failure in registry.failures}
    assert set(failures) == {"bad", "missing", "notatool", "empty"}
    assert failures["bad"] == "ModuleNotFoundError: No module named 'no_such_module_anywhere'"
    assert "nothing_here" in failures["missing"]
    assert failures["notatool"].startswith("TypeError: 1 is not a Tool")
    assert "has no @sectr.tool or @sectr.handler" in failures["empty"]
    assert "sectr_broken_plugin.bad" in caplog.text and "no_such_module_anywhere" in caplog.text


def test_modules_by_path_register_every_tool_and_handler_they_define(site: Path) -> None:
    (site / "sectr_loose_tools.py").write_text(TOOLS_MODULE)
    (site / "sectr_loose_agents.py").write_text(AGENTS_MODULE)
    registry = load_plugins(["sectr_loose_tools", "sectr_loose_agents", "sectr_no_such_plugin"], entry_points=False)
    assert sorted(registry.tools) == ["label", "shout", "whisper"]
    assert sorted(registry.handlers) == ["triage"]  # `plain` is not decorated
    assert registry.tools["whisper"].source == "plugin module sectr_loose_tools"
    assert [f.source for f in registry.failures] == ["plugin module sectr_no_such_plugin"]
    assert registry.failures[0].error.startswith("ModuleNotFoundError")
    assert [r.name for r in registry.listing()] == ["label", "shout", "whisper", "triage"]


def test_without_plugins_the_registry_is_empty() -> None:
    registry = PluginRegistry()
    registry.load_modules([])
    assert registry.tools == {} and registry.handlers == {} and registry.failures == []


def test_import_dotted_takes_dots_or_a_colon() -> None:
    from sectr.builtin_tools import calculator

    assert import_dotted("sectr.builtin_tools.calculator") is calculator
    assert import_dotted("sectr.builtin_tools:calculator") is calculator
    with pytest.raises(ImportError, match="no attribute 'nothing'"):
        import_dotted("sectr.builtin_tools.nothing")
    with pytest.raises(ImportError, match="not a dotted path"):
        import_dotted("calculator")
