"""Production settings pass Django's deployment checks."""

import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent


def test_it_passes_check_deploy_with_production_settings() -> None:
    env = {
        **os.environ,
        "DEBUG": "0",
        "SECRET_KEY": secrets.token_urlsafe(50),
        "ALLOWED_HOSTS": "sectr.example.com",
        "PYTHONPATH": str(ROOT),
    }
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


def test_it_warns_about_the_development_defaults() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("DEBUG", "SECRET_KEY")}
    env["PYTHONPATH"] = str(ROOT)
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0
    assert "DEBUG" in result.stdout + result.stderr


ENV_READ_RE = re.compile(
    r"""(?:environ(?:\.get)?|getenv|env_bool|_env_seconds)\(\s*(?:[a-z_]+,\s*)?["']([A-Z][A-Z0-9_]+)["']"""
    r"""|environ\[["']([A-Z][A-Z0-9_]+)["']\]"""
)
#: Names read from the environment that are not Sectr's settings.
NOT_SETTINGS = {"DJANGO_SETTINGS_MODULE"}


def test_readme_names_every_environment_variable_the_code_reads() -> None:
    root = Path(__file__).resolve().parents[2]
    read: set[str] = set()
    for package in ("sectr", "sectr_web", "sessions_app"):
        for path in (root / package).rglob("*.py"):
            for match in ENV_READ_RE.finditer(path.read_text()):
                read.add(match.group(1) or match.group(2))
    assert {"DATABASE_URL", "SECURE_SSL_REDIRECT"} <= read  # the pattern finds them
    readme = (root / "README.md").read_text()
    table = readme[readme.index("| setting | default | meaning |") :]
    missing = sorted(name for name in read - NOT_SETTINGS if f"`{name}`" not in table)
    assert missing == []
