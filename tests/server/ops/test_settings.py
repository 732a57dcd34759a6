"""The settings: parsed from the environment with clear errors, Django's deployment
checks pass in production, and README.md lists every variable."""

import json
import os
import re
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]


#: Variables these tests decide for themselves (whatever the outer environment says).
DECIDED_HERE = ("DEBUG", "SECRET_KEY", "ALLOWED_HOSTS", "SECTR_HTTPS", "SECURE_SSL_REDIRECT")


def run_python(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k not in DECIDED_HERE}
    environ.update(PYTHONPATH=str(ROOT), DJANGO_SETTINGS_MODULE="sectr_web.settings", **env)
    return subprocess.run(  # noqa: S603 - our own manage.py
        [sys.executable, *args], cwd=ROOT, env=environ, capture_output=True, text=True, timeout=120
    )


def check_deploy(**env: str) -> subprocess.CompletedProcess[str]:
    return run_python("manage.py", "check", "--deploy", "--fail-level", "WARNING", **env)


SHOW_SETTINGS = (
    "import json, django; django.setup(); from django.conf import settings as s; "
    "print(json.dumps({name: getattr(s, name, None) for name in ("
    "'DEBUG', 'SECTR_HTTPS', 'SESSION_COOKIE_SECURE', 'CSRF_COOKIE_SECURE', 'SECURE_SSL_REDIRECT', "
    "'SECURE_HSTS_SECONDS', 'SECURE_PROXY_SSL_HEADER')}))"
)


def settings_under(**env: str) -> dict[str, Any]:
    result = run_python("-c", SHOW_SETTINGS, **env)
    assert result.returncode == 0, result.stderr
    shown: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return shown


def test_it_passes_check_deploy_with_production_settings() -> None:
    # No DEBUG: off by default; a host name in ALLOWED_HOSTS turns the HTTPS settings on.
    result = check_deploy(SECRET_KEY=secrets.token_urlsafe(50), ALLOWED_HOSTS="sectr.example.com")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


def test_it_warns_about_the_development_defaults() -> None:
    result = check_deploy()
    assert result.returncode != 0
    assert "SECRET_KEY" in result.stdout + result.stderr


def test_it_warns_about_debug_set_on() -> None:
    result = check_deploy(DEBUG="1", SECRET_KEY=secrets.token_urlsafe(50), ALLOWED_HOSTS="sectr.example.com")
    assert result.returncode != 0
    assert "DEBUG" in result.stdout + result.stderr


def test_debug_is_off_and_http_plain_on_the_loopback_by_default() -> None:
    shown = settings_under()
    assert shown["DEBUG"] is False
    # scripts/run.sh on http://127.0.0.1:8000: no redirect to https, cookies a browser
    # sends back over http, and no trust in a client's X-Forwarded-Proto.
    assert shown["SECTR_HTTPS"] is False
    assert not shown["SECURE_SSL_REDIRECT"] and not shown["SESSION_COOKIE_SECURE"]
    assert not shown["CSRF_COOKIE_SECURE"] and not shown["SECURE_HSTS_SECONDS"]
    assert shown["SECURE_PROXY_SSL_HEADER"] is None


def test_a_host_name_turns_https_on_and_sectr_https_decides_outright() -> None:
    deployed = settings_under(ALLOWED_HOSTS="localhost,sectr.example.com")
    assert deployed["SECTR_HTTPS"] is True
    assert deployed["SECURE_SSL_REDIRECT"] and deployed["SESSION_COOKIE_SECURE"] and deployed["CSRF_COOKIE_SECURE"]
    assert deployed["SECURE_HSTS_SECONDS"] == 31536000
    assert deployed["SECURE_PROXY_SSL_HEADER"] == ["HTTP_X_FORWARDED_PROTO", "https"]
    assert settings_under(ALLOWED_HOSTS="sectr.example.com", SECTR_HTTPS="0")["SESSION_COOKIE_SECURE"] is False
    assert settings_under(SECTR_HTTPS="yes")["SESSION_COOKIE_SECURE"] is True
    assert settings_under(ALLOWED_HOSTS="sectr.example.com", DEBUG="1")["SECTR_HTTPS"] is False
    redirectless = settings_under(ALLOWED_HOSTS="sectr.example.com", SECURE_SSL_REDIRECT="off")
    assert redirectless["SECURE_SSL_REDIRECT"] is False and redirectless["SESSION_COOKIE_SECURE"] is True


@pytest.mark.parametrize(
    ("name", "value", "accepts"),
    [
        ("SECTR_LEASE_SECONDS", "abc", "a number greater than 0"),
        ("SECTR_LEASE_SECONDS", "0", "a number greater than 0"),
        ("DEBUG", "maybe", "a boolean"),
        ("EMAIL_USE_TLS", "ture", "a boolean"),
        ("SECTR_EMBEDDED_WORKER", "of", "a boolean"),
        ("SECTR_RETENTION_INTERVAL_S", "hourly", "a number of at least 0"),
        ("SECTR_RETENTION_INTERVAL_S", "-5", "a number of at least 0"),
        ("SECTR_WORKER_CONCURRENCY", "1.5", "a whole number of at least 1"),
        ("SECTR_DB_POOL_MAX", "0", "a whole number of at least 1"),
        ("EMAIL_PORT", "smtp", "a whole number of at least 1"),
        ("SECTR_WS_RESYNC_SECONDS", "nan", "a number greater than 0"),
        ("SECTR_API_RATE_LIMIT", "lots", "count/seconds"),
        ("SECTR_LOGIN_LIMIT_PER_ACCOUNT", "10/0", "count/seconds"),
        ("SECTR_LOG_FORMAT", "xml", "one of text, json"),
        ("LOG_LEVEL", "LOUD", "one of DEBUG, INFO, WARNING, ERROR, CRITICAL"),
        ("SECTR_PROVIDER", "anthropic", "one of demo, openai"),
        ("SECTR_HANDLER", "my-agent.handler", "a dotted path"),
        ("SECTR_TOOLS", "tools.search, tools/fetch", "comma-separated dotted paths"),
    ],
)
def test_a_bad_value_stops_the_start_up_naming_the_variable(name: str, value: str, accepts: str) -> None:
    result = run_python("manage.py", "check", **{name: value})
    assert result.returncode != 0
    last_line = result.stderr.strip().splitlines()[-1]
    assert last_line.startswith("django.core.exceptions.ImproperlyConfigured: "), result.stderr[-2000:]
    assert f"environment variable {name}=" in last_line
    assert accepts in last_line


def test_good_values_of_every_kind_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    from sectr_web import settings as module

    monkeypatch.setenv("X_BOOL", " Yes ")
    monkeypatch.setenv("X_INT", "12")
    monkeypatch.setenv("X_FLOAT", "0.25")
    monkeypatch.setenv("X_LIST", "a, b,,c ")
    monkeypatch.setenv("X_RATE", "0/60")
    monkeypatch.setenv("X_BLANK", "  ")
    assert module.env_bool("X_BOOL", False) is True
    assert module.env_int("X_INT", 1, minimum=1) == 12
    assert module.env_float("X_FLOAT", 1.0, above_minimum=True) == 0.25
    assert module.env_list("X_LIST", []) == ["a", "b", "c"]
    assert module.env_rate("X_RATE", "600/60") == "0/60"
    # Blank counts as unset: the default.
    assert module.env_bool("X_BLANK", True) is True and module.env_int("X_BLANK", 7) == 7
    assert module.env_optional_bool("X_BLANK") is None


#: How settings.py reads a variable: env_str("NAME", ...), env_bool("NAME", ...), ...
SETTINGS_READ_RE = re.compile(r"""\benv_[a-z_]+\(\s*["']([A-Z][A-Z0-9_]+)["']""")
#: How the core (sectr/, no Django) reads its own: environ.get("NAME"), _env_seconds(env, "NAME", ...).
CORE_READ_RE = re.compile(
    r"""(?:environ(?:\.get)?|getenv|_env_seconds|_positive_int)\(\s*(?:[a-z_]+,\s*)?["']([A-Z][A-Z0-9_]+)["']"""
    r"""|environ\[["']([A-Z][A-Z0-9_]+)["']\]"""
)
#: Any read of the process environment.
ANY_ENV_READ_RE = re.compile(r"os\.environ|os\.getenv|getenv\(")


def readme_settings_table() -> str:
    readme = (ROOT / "README.md").read_text()
    return readme[readme.index("| setting | default | meaning |") :]


def test_readme_names_every_variable_settings_py_reads() -> None:
    read = set(SETTINGS_READ_RE.findall((ROOT / "sectr_web" / "settings.py").read_text()))
    assert {"DATABASE_URL", "DEBUG", "SECURE_SSL_REDIRECT", "SECTR_LEASE_SECONDS", "SECTR_TOOLS"} <= read
    table = readme_settings_table()
    assert sorted(name for name in read if f"`{name}`" not in table) == []


def test_readme_names_every_variable_the_core_reads() -> None:
    read: set[str] = set()
    for path in (ROOT / "sectr").rglob("*.py"):
        for match in CORE_READ_RE.finditer(path.read_text()):
            read.add(match.group(1) or match.group(2))
    assert {"SECTR_PROVIDER", "SECTR_DEMO_DELAY_MS", "SECTR_MODEL_CONTEXT_WINDOW", "SECTR_URL"} <= read
    table = readme_settings_table()
    assert sorted(name for name in read if f"`{name}`" not in table) == []


def test_only_the_settings_module_reads_the_environment() -> None:
    readers = sorted(
        str(path.relative_to(ROOT))
        for package in ("sectr_web", "sessions_app")
        for path in (ROOT / package).rglob("*.py")
        if ANY_ENV_READ_RE.search(path.read_text())
    )
    # The entry points only default DJANGO_SETTINGS_MODULE (os.environ.setdefault).
    assert readers == ["sectr_web/asgi.py", "sectr_web/settings.py", "sectr_web/wsgi.py"]
    for entry in ("asgi.py", "wsgi.py"):
        text = (ROOT / "sectr_web" / entry).read_text()
        assert len(ANY_ENV_READ_RE.findall(text)) == 1
        assert 'os.environ.setdefault("DJANGO_SETTINGS_MODULE"' in text


def test_the_deploy_check_warns_when_the_security_middleware_is_missing() -> None:
    from django.conf import settings
    from django.test import override_settings

    from sectr_web.middleware import check_security_middleware

    assert check_security_middleware() == []
    kept = [m for m in settings.MIDDLEWARE if not m.endswith((".SecurityMiddleware", ".XFrameOptionsMiddleware"))]
    with override_settings(MIDDLEWARE=kept):
        assert [w.id for w in check_security_middleware()] == ["sectr.W001", "sectr.W002"]


def test_postgres_connections_plan_generically_and_keep_pgoptions(monkeypatch: pytest.MonkeyPatch) -> None:
    from sectr_web import settings as module

    monkeypatch.delenv("PGOPTIONS", raising=False)
    config = module.database_config("postgres://u@127.0.0.1:5432/db")
    assert config["OPTIONS"]["options"] == "-c plan_cache_mode=force_generic_plan"
    # libpq reads PGOPTIONS only when no `options` is given: it must not be lost.
    monkeypatch.setenv("PGOPTIONS", "-c work_mem=8MB")
    config = module.database_config("postgres://u@127.0.0.1:5432/db")
    assert config["OPTIONS"]["options"] == "-c work_mem=8MB -c plan_cache_mode=force_generic_plan"
    assert "options" not in module.database_config("sqlite:///x.sqlite3")["OPTIONS"]


@pytest.mark.django_db
def test_a_pooled_postgres_connection_plans_prepared_statements_generically() -> None:
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL only")
    with connection.cursor() as cursor:
        cursor.execute("SHOW plan_cache_mode")
        assert cursor.fetchone() == ("force_generic_plan",)
