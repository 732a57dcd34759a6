"""The server's one plugin registry: entry points, SECTR_PLUGINS, SECTR_TOOLS, SECTR_HANDLER,
reaching the runtime, /readyz and `manage.py sectr_plugins`."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.test import Client

from sessions_app.plugins import configured_handler, plugin_registry
from sessions_app.runtime import get_runtime
from tests.core.test_plugins import AGENTS_MODULE, TOOLS_MODULE, install

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(autouse=True)
def fresh_registry() -> Iterator[None]:
    plugin_registry.cache_clear()
    get_runtime.cache_clear()
    yield
    plugin_registry.cache_clear()
    get_runtime.cache_clear()


@pytest.fixture
def loose_modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "sectr_server_tools.py").write_text(TOOLS_MODULE)
    (tmp_path / "sectr_server_agents.py").write_text(AGENTS_MODULE)
    return tmp_path


def test_sectr_plugins_modules_reach_the_runtime(loose_modules: Path, settings: Any) -> None:
    settings.SECTR_PLUGINS = ["sectr_server_tools", "sectr_server_agents"]
    settings.SECTR_HANDLER = "triage"  # a registered handler's name
    runtime = get_runtime()
    assert {"shout", "whisper", "label", "calculator"} <= set(runtime.tools.names())
    assert runtime.handler is configured_handler() and runtime.handler.__name__ == "triage"


def test_sectr_tools_and_a_dotted_sectr_handler_register_too(loose_modules: Path, settings: Any) -> None:
    settings.SECTR_TOOLS = ["sectr_server_tools.shout"]
    settings.SECTR_HANDLER = "sectr_server_agents.plain"
    registry = plugin_registry()
    assert sorted(registry.tools) == ["shout"]
    assert registry.tools["shout"].source == "SECTR_TOOLS sectr_server_tools.shout"
    assert registry.handlers["sectr_server_agents.plain"].source == "SECTR_HANDLER sectr_server_agents.plain"
    assert get_runtime().handler.__name__ == "plain"


@pytest.mark.parametrize(
    ("setting", "value", "message"),
    [
        ("SECTR_TOOLS", ["sectr_server_tools.nothing"], "SECTR_TOOLS: sectr_server_tools.nothing is not an importable"),
        ("SECTR_TOOLS", ["sectr_server_agents.plain"], "is <function plain"),
        ("SECTR_HANDLER", "no_such_handler", "neither a registered handler's name nor an importable dotted path"),
    ],
)
def test_a_broken_sectr_tools_or_handler_is_an_error(
    loose_modules: Path, settings: Any, setting: str, value: Any, message: str
) -> None:
    setattr(settings, setting, value)
    with pytest.raises(ImproperlyConfigured, match=message.replace("(", r"\(")):
        get_runtime()


@pytest.mark.django_db(transaction=True)  # readyz's checks use database_sync_to_async
def test_readyz_names_a_plugin_that_failed_and_stays_ready(loose_modules: Path, settings: Any) -> None:
    (loose_modules / "sectr_server_broken.py").write_text("raise RuntimeError('half-installed')\n")
    settings.SECTR_PLUGINS = ["sectr_server_tools", "sectr_server_broken"]
    response = Client().get("/readyz")
    body = response.json()
    assert response.status_code == 200 and body["ok"] is True, body
    # Named, never explained: anyone may read /readyz (the log has the exception).
    assert body["plugin_failures"] == [{"plugin": "SECTR_PLUGINS sectr_server_broken"}]
    assert "half-installed" not in response.content.decode()
    assert "shout" in get_runtime().tools.names()  # the others run


@pytest.mark.django_db(transaction=True)
def test_readyz_is_503_when_sectr_tools_cannot_load(settings: Any) -> None:
    settings.SECTR_TOOLS = ["sectr.builtin_tools.nothing"]
    response = Client().get("/readyz")
    body = response.json()
    assert response.status_code == 503 and body["failing"] == ["plugins"]
    # Anyone may read /readyz: the check is named, the reason is in the log.
    assert body["checks"]["plugins"] == "failed"
    assert "sectr.builtin_tools.nothing" not in response.content.decode()


def test_the_command_lists_what_is_registered_and_from_where(loose_modules: Path, settings: Any) -> None:
    settings.SECTR_PLUGINS = ["sectr_server_agents", "sectr_server_missing"]
    settings.SECTR_TOOLS = ["sectr_server_tools.shout"]
    out = StringIO()
    call_command("sectr_plugins", stdout=out)
    lines = out.getvalue().splitlines()
    assert "built-in tools: calculator, delete_note, get_time, write_note" in lines
    assert "  label: SECTR_PLUGINS sectr_server_agents" in lines
    assert "  shout: SECTR_TOOLS sectr_server_tools.shout" in lines
    assert "  triage: SECTR_PLUGINS sectr_server_agents, sectr_server_agents.triage (@sectr.handler('triage'))" in lines
    assert "runs use: the default agent" in lines
    assert "  SECTR_PLUGINS sectr_server_missing: ModuleNotFoundError: No module named 'sectr_server_missing'" in lines


def test_an_installed_package_registers_through_its_entry_points(tmp_path: Path) -> None:
    """A real process: the package is found on its sys.path, as a pip-installed one is."""
    install(
        tmp_path,
        "sectr_entry_plugin",
        {"tools": TOOLS_MODULE, "agents": AGENTS_MODULE, "bad": "import no_such_dependency\n"},
        {
            "sectr.tools": ["shout = sectr_entry_plugin.tools:shout", "bad = sectr_entry_plugin.bad"],
            "sectr.handlers": ["plain = sectr_entry_plugin.agents:plain"],
        },
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)]), "SECTR_HANDLER": "plain"}
    env.pop("SECTR_PLUGINS", None)
    env.pop("SECTR_TOOLS", None)
    result = subprocess.run(  # noqa: S603 - our own manage.py
        [sys.executable, "manage.py", "sectr_plugins"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    source = "entry point sectr.tools: shout = sectr_entry_plugin.tools:shout (sectr_entry_plugin 1.2)"
    assert f"  shout: {source}" in lines
    handler = "entry point sectr.handlers: plain = sectr_entry_plugin.agents:plain (sectr_entry_plugin 1.2)"
    assert f"  plain: {handler}, sectr_entry_plugin.agents.plain" in lines
    assert "runs use: plain" in lines
    failure = "  entry point sectr.tools: bad = sectr_entry_plugin.bad (sectr_entry_plugin 1.2): "
    assert failure + "ModuleNotFoundError: No module named 'no_such_dependency'" in lines
    assert "no_such_dependency" in result.stderr  # and in the log
