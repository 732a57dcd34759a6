"""The SDK stands alone: `import sectr.client` needs httpx and nothing of the server
(no openai, no Django), so a program that only talks to a Sectr server installs one
package. `sectr`'s own names (`sectr.SessionContext`, `sectr.tool`, ...) still work.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: Importing any of these (or a module under them) fails in the blocked interpreter.
SERVER_PACKAGES = ("openai", "httpx2", "django", "channels", "daphne", "psycopg", "redis", "opentelemetry")

BLOCKER = """
import importlib.abc, sys
BLOCKED = {blocked!r}
class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"blocked: {{name}}")
        return None
sys.meta_path.insert(0, Refuse())
"""


def run_python(code: str, python: str = sys.executable) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PYTHON", "DJANGO"))}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run([python, "-c", code], cwd="/", env=env, capture_output=True, text=True, timeout=120)


def test_the_client_imports_with_every_server_package_blocked() -> None:
    code = BLOCKER.format(blocked=SERVER_PACKAGES) + (
        "import sectr.client\n"
        "from sectr.client import AsyncClient, Client, SectrError, image_part_from_path\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in BLOCKED or m.startswith('sectr.providers'))\n"
        "print('loaded:', loaded)\n"
    )
    done = run_python(code)
    assert done.returncode == 0, done.stderr
    assert "loaded: []" in done.stdout


def test_the_blocker_does_refuse_the_runtime() -> None:
    # The check above proves something only if the blocker bites: the runtime needs openai.
    done = run_python(BLOCKER.format(blocked=SERVER_PACKAGES) + "import sectr\nsectr.LocalRuntime\n")
    assert done.returncode != 0 and "ImportError: blocked: httpx2" in done.stderr


def test_the_core_names_still_load_from_the_package() -> None:
    import sectr
    from sectr.context import SessionContext
    from sectr.tools import tool

    assert sectr.SessionContext is SessionContext and sectr.tool is tool
    assert sectr.__all__ == sorted(sectr._EXPORTS) and set(sectr.__all__) <= set(dir(sectr))
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        sectr.nothing_here  # noqa: B018


def pinned(package: str) -> str:
    text = (ROOT / "requirements.txt").read_text()
    found = re.search(rf"^{re.escape(package)}==(\S+)$", text, re.MULTILINE)
    assert found, f"{package} is not pinned in requirements.txt"
    return found.group(1)


@pytest.mark.slow
def test_the_client_runs_in_a_venv_with_only_httpx(tmp_path: Path) -> None:
    # A real, separate environment (no system site-packages): pip installs the pinned
    # httpx and its own dependencies, nothing else.
    venv.EnvBuilder(with_pip=True, system_site_packages=False).create(tmp_path / "venv")
    python = str(tmp_path / "venv" / "bin" / "python")
    install = subprocess.run(
        [python, "-m", "pip", "install", "-q", "--disable-pip-version-check", f"httpx=={pinned('httpx')}"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert install.returncode == 0, install.stderr
    done = run_python(
        "import importlib.util, sectr.client\n"
        "from sectr.client import Client\n"
        "print([m for m in ('openai', 'django') if importlib.util.find_spec(m)])\n"
        "Client('http://127.0.0.1:9').close()\n",
        python,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"  # the venv really lacks them


def test_every_third_party_module_of_the_core_is_pinned() -> None:
    # httpx2 is imported by the OpenAI-compatible provider (it is the openai package's
    # transport); what the code imports is pinned, not left to a dependency's range.
    for package in ("httpx", "httpx2", "openai"):
        pinned(package)
