"""Production settings pass Django's deployment checks."""

import os
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
