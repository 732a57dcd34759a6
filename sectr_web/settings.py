"""Sectr's Django settings, driven by the environment.

Embedded defaults run with nothing installed: SQLite (WAL) under ./var/, the in-memory
channel layer and the offline demo model. Production sets DATABASE_URL (PostgreSQL),
REDIS_URL, SECRET_KEY, DEBUG=0 and ALLOWED_HOSTS.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import dj_database_url

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("SECTR_VAR_DIR", BASE_DIR / "var"))


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    return raw.strip().lower() in {"1", "true", "yes", "on"}


DEBUG = env_bool("DEBUG", True)
SECRET_KEY = os.environ.get("SECRET_KEY") or "sectr-insecure-development-key-change-me-in-production"
ALLOWED_HOSTS = [
    h.strip() for h in os.environ.get("ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]").split(",") if h.strip()
]
CSRF_TRUSTED_ORIGINS = [o.strip() for o in os.environ.get("CSRF_TRUSTED_ORIGINS", "").split(",") if o.strip()]

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "django_htmx",
    "sessions_app",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # Scripts from static/ only, no inline script (sectr_web/content_security_policy.py).
    "sectr_web.content_security_policy.ContentSecurityPolicy",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    # NUL and lone surrogates in a page's form or query string: 400 before any view.
    "sessions_app.input_checks.RefuseUnstorableText",
]

ROOT_URLCONF = "sectr_web.urls"
ASGI_APPLICATION = "sectr_web.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "sessions_app.web.team_roles",
            ],
        },
    },
]


# Test databases are per test process, so several test runs on one machine (or one
# PostgreSQL server) never destroy each other's database.
TEST_DB_SUFFIX = os.environ.get("SECTR_TEST_DB_SUFFIX") or str(os.getpid())


def database_config(url: str) -> dict[str, Any]:
    if not url:
        VAR_DIR.mkdir(parents=True, exist_ok=True)
        url = f"sqlite:///{VAR_DIR / 'sectr.sqlite3'}"
    # Under ASGI every request may run on another thread: persistent connections leak,
    # so CONN_MAX_AGE stays 0 and PostgreSQL uses psycopg's pool instead.
    config: dict[str, Any] = dict(dj_database_url.parse(url, conn_max_age=0))
    if config["ENGINE"] == "django.db.backends.sqlite3":
        # Django's, with the process's writers queued fairly at BEGIN (sectr_web/sqlite_backend).
        config["ENGINE"] = "sectr_web.sqlite_backend"
        config["OPTIONS"] = {
            # WAL lets readers run beside the one writer; IMMEDIATE takes the write lock
            # at BEGIN so two writers queue on busy_timeout instead of deadlocking.
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            "transaction_mode": "IMMEDIATE",
            "timeout": 20,
        }
        config["TEST"] = {"NAME": str(VAR_DIR / f"test-sectr-{TEST_DB_SUFFIX}.sqlite3")}
    elif config["ENGINE"] == "django.db.backends.postgresql":
        config["OPTIONS"] = {"pool": {"min_size": 1, "max_size": int(os.environ.get("SECTR_DB_POOL_MAX", "20"))}}
        config["TEST"] = {"NAME": f"test_{config['NAME']}_{TEST_DB_SUFFIX}"}
    return config


DATABASES = {"default": database_config(os.environ.get("DATABASE_URL", ""))}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = os.environ.get("REDIS_URL", "")
if REDIS_URL:
    # Redis pub/sub, not channels_redis' list-based RedisChannelLayer: that one receives
    # a process's messages one at a time, four Redis round trips each on the server's
    # event loop, so a Daphne process streaming to 100 sessions (~1000 appends/s) fell
    # seconds behind for as long as the runs lasted (bench/live.py). Pub/sub pushes them
    # down one connection, and a group_send is one PUBLISH. Both deliver at most once;
    # pub/sub keeps nothing for a subscriber that is not listening, which the readers
    # already handle (a gap in seq, or the periodic resync, reads the journal).
    CHANNEL_LAYERS = {
        "default": {
            # channels_redis' pub/sub layer with a batched send (sectr_web.channel_layer).
            "BACKEND": "sectr_web.channel_layer.RedisPubSubChannelLayer",
            "CONFIG": {
                "hosts": [REDIS_URL],
                # Distinct prefixes keep separate deployments (and test servers) apart on one Redis.
                "prefix": os.environ.get("SECTR_CHANNEL_PREFIX", "asgi"),
            },
        }
    }
else:
    # Channels' in-memory layer with its expiry sweep at most once a second (sectr_web.channel_layer).
    CHANNEL_LAYERS = {"default": {"BACKEND": "sectr_web.channel_layer.InMemoryChannelLayer"}}

# The cache: shared through Redis when there is one, else per process.
CACHES: dict[str, dict[str, Any]] = {
    "default": (
        {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": REDIS_URL,
            "KEY_PREFIX": os.environ.get("SECTR_CHANNEL_PREFIX", "sectr"),
        }
        if REDIS_URL
        else {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}
    )
}
# Notifications of moderation (sessions_app.moderation.notifications): links in emails
# and webhook bodies start with SECTR_BASE_URL; email goes through Django's backend
# (the console by default: set EMAIL_BACKEND=django.core.mail.backends.smtp.EmailBackend
# and EMAIL_HOST etc. for real mail).
SECTR_BASE_URL = os.environ.get("SECTR_BASE_URL", "http://localhost:8000")
EMAIL_BACKEND = os.environ.get("EMAIL_BACKEND", "django.core.mail.backends.console.EmailBackend")
EMAIL_HOST = os.environ.get("EMAIL_HOST", "localhost")
EMAIL_PORT = int(os.environ.get("EMAIL_PORT", "25"))
EMAIL_HOST_USER = os.environ.get("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = os.environ.get("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = os.environ.get("EMAIL_USE_TLS", "").lower() in {"1", "true", "yes", "on"}
DEFAULT_FROM_EMAIL = os.environ.get("DEFAULT_FROM_EMAIL", "sectr@localhost")
#: First retry of a failed webhook after this many seconds, doubling each time.
SECTR_WEBHOOK_BACKOFF_SECONDS = float(os.environ.get("SECTR_WEBHOOK_BACKOFF_SECONDS", "10"))
SECTR_WEBHOOK_MAX_ATTEMPTS = int(os.environ.get("SECTR_WEBHOOK_MAX_ATTEMPTS", "6"))

# Budget counters (sessions_app.budgets) live in Redis under this prefix when there is one.
SECTR_COUNTER_PREFIX = os.environ.get("SECTR_CHANNEL_PREFIX", "sectr")
# Request bodies over this many bytes are refused (413) before they are buffered
# (sectr_web.body_limits: Daphne and the ASGI app); the API's prompts carry up to 32 MiB.
SECTR_MAX_REQUEST_BYTES = int(os.environ.get("SECTR_MAX_REQUEST_BYTES") or 32 * 1024 * 1024)
SECTR_API_RATE_LIMIT = os.environ.get("SECTR_API_RATE_LIMIT", "600/60")  # requests/seconds per API token

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/accounts/login/"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = Path(os.environ.get("STATIC_ROOT", VAR_DIR / "staticfiles"))
MEDIA_ROOT = Path(os.environ.get("MEDIA_ROOT", VAR_DIR / "media"))

if not DEBUG:
    SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", True)
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_HSTS_SECONDS = int(os.environ.get("SECURE_HSTS_SECONDS", "31536000"))
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = True
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    # Probes and scrapers talk plain HTTP to a process directly: no redirect to https.
    SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$", r"^metrics$"]

# Operations (SPEC section 13, docs/operations.md).
SECTR_METRICS_TOKEN = os.environ.get("SECTR_METRICS_TOKEN", "")  # bearer token for /metrics; loopback needs none
SECTR_RETENTION_DAYS = int(os.environ.get("SECTR_RETENTION_DAYS", "0") or 0)  # 0 = keep sessions for ever
# "json": one JSON object a line with session_id, run_id, invocation_id, worker (sectr.telemetry).
SECTR_LOG_FORMAT = os.environ.get("SECTR_LOG_FORMAT", "text").strip().lower()

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"json": {"()": "sectr.telemetry.JsonLogFormatter"}},
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            **({"formatter": "json"} if SECTR_LOG_FORMAT == "json" else {}),
        }
    },
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "WARNING")},
    "loggers": {"sectr": {"level": os.environ.get("SECTR_LOG_LEVEL", "INFO")}},
}
