"""Sectr's Django settings: the one place that reads the environment.

Embedded defaults run with nothing installed: SQLite (WAL) under ./var/, the in-memory
channel layer and the offline demo model, DEBUG off, plain HTTP on the loopback.
Production sets DATABASE_URL (PostgreSQL), REDIS_URL, SECRET_KEY and ALLOWED_HOSTS; a
host name in ALLOWED_HOSTS turns on the HTTPS settings (SECTR_HTTPS overrides).

Every variable is parsed here, once, by the env_* functions below: a value they cannot
read stops the start-up with ImproperlyConfigured naming the variable and what it
accepts (a typo never silently reads as the default). The code reads these settings
through `django.conf.settings` where it uses them, so `override_settings` reaches it.
README.md's settings table lists every variable read here (tests/server/ops/test_settings.py).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent

# ---- parsing the environment ----

TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def env_raw(name: str) -> str | None:
    """The variable's value stripped, or None when it is unset or blank."""
    value = os.environ.get(name)
    if value is None or not value.strip():
        return None
    return value.strip()


def _bad(name: str, raw: str, accepts: str) -> ImproperlyConfigured:
    return ImproperlyConfigured(f"environment variable {name}={raw!r}: expected {accepts}")


def env_str(name: str, default: str) -> str:
    """The value as given (keys and passwords may carry spaces); unset or blank: `default`."""
    value = os.environ.get(name)
    return default if value is None or not value.strip() else value


def env_optional_bool(name: str) -> bool | None:
    """True or False when set, None when unset (the caller decides the default)."""
    raw = env_raw(name)
    if raw is None:
        return None
    word = raw.lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise _bad(name, raw, f"a boolean: one of {', '.join(TRUE_WORDS)} or {', '.join(FALSE_WORDS)}")


def env_bool(name: str, default: bool) -> bool:
    value = env_optional_bool(name)
    return default if value is None else value


def env_int(name: str, default: int, *, minimum: int | None = None) -> int:
    raw = env_raw(name)
    if raw is None:
        return default
    accepts = "a whole number" + (f" of at least {minimum}" if minimum is not None else "")
    try:
        value = int(raw)
    except ValueError:
        raise _bad(name, raw, accepts) from None
    if minimum is not None and value < minimum:
        raise _bad(name, raw, accepts)
    return value


def env_float(name: str, default: float, *, minimum: float = 0.0, above_minimum: bool = False) -> float:
    """A number (such as seconds): at least `minimum`, or more than it with above_minimum."""
    raw = env_raw(name)
    if raw is None:
        return default
    accepts = f"a number {'greater than' if above_minimum else 'of at least'} {minimum:g}"
    try:
        value = float(raw)
    except ValueError:
        raise _bad(name, raw, accepts) from None
    if value != value or value in (float("inf"), float("-inf")):  # nan, inf
        raise _bad(name, raw, accepts)
    if value < minimum or (above_minimum and value == minimum):
        raise _bad(name, raw, accepts)
    return value


def env_list(name: str, default: list[str]) -> list[str]:
    """Comma-separated values, blanks dropped."""
    raw = env_raw(name)
    if raw is None:
        return list(default)
    return [item.strip() for item in raw.split(",") if item.strip()]


def env_choice(name: str, default: str, choices: tuple[str, ...], *, upper: bool = False) -> str:
    raw = env_raw(name)
    if raw is None:
        return default
    value = raw.upper() if upper else raw.lower()
    if value not in choices:
        raise _bad(name, raw, f"one of {', '.join(choices)}")
    return value


def env_rate(name: str, default: str) -> str:
    """A budget "count/seconds" (such as 600/60; count 0 = no limit)."""
    raw = env_raw(name)
    if raw is None:
        return default
    count, slash, window = raw.partition("/")
    if not (count.isascii() and count.isdigit() and slash and window.isascii() and window.isdigit()):
        raise _bad(name, raw, "count/seconds, such as 600/60 (0/60: no limit)")
    if int(window) < 1:
        raise _bad(name, raw, "count/seconds with at least 1 second, such as 600/60")
    return raw


def env_dotted_path(name: str) -> str | None:
    """A Python dotted path (module.attribute); only its form is checked here."""
    raw = env_raw(name)
    if raw is not None and not _is_dotted_path(raw):
        raise _bad(name, raw, "a dotted path such as mypackage.agent.handler")
    return raw


def env_dotted_paths(name: str) -> list[str]:
    paths = env_list(name, [])
    for path in paths:
        if not _is_dotted_path(path):
            raise _bad(name, path, "comma-separated dotted paths such as mypackage.tools.search")
    return paths


def _is_dotted_path(text: str) -> bool:
    return all(part.isidentifier() for part in text.split("."))


# ---- Django ----

VAR_DIR = Path(env_str("SECTR_VAR_DIR", str(BASE_DIR / "var")))

# Off unless set: a developer sets DEBUG=1 (Django's debug pages show the site's URL
# patterns and settings to whoever gets an error).
DEBUG = env_bool("DEBUG", False)
# Django's own deployment check (security.W009) recognises the "django-insecure-" prefix.
SECRET_KEY = env_str("SECRET_KEY", "django-insecure-sectr-development-key-change-me-in-production")
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "[::1]")
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", list(LOOPBACK_HOSTS))
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

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

# Django's Security, Common and XFrameOptions middleware as sectr_web.middleware runs them:
# on the event loop, not a thread hop each. The API has its own shorter chain there.
MIDDLEWARE = [
    "sectr_web.middleware.SecurityMiddleware",
    # Scripts from static/ only, no inline script (sectr_web/content_security_policy.py).
    "sectr_web.content_security_policy.ContentSecurityPolicy",
    # NUL and lone surrogates in a path, query string, cookie or page form: 400 before
    # anything (the session lookup, APPEND_SLASH, a view) reads them.
    "sessions_app.input_checks.RefuseUnstorableText",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "sectr_web.middleware.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "sectr_web.middleware.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    # A refused htmx action answers with its message for #flash, not an error page.
    "sessions_app.web.HtmxRefusals",
]
# Django's deploy checks W001/W002 look for its own Security and XFrameOptions middleware
# by name; the site runs subclasses of both (sectr_web.middleware, on the event loop), and
# sectr_web.middleware.check_security_middleware warns in their place when one is missing.
SILENCED_SYSTEM_CHECKS = ["security.W001", "security.W002"]
CSRF_FAILURE_VIEW = "sessions_app.web.csrf_failure"

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


SECTR_DB_POOL_MAX = env_int("SECTR_DB_POOL_MAX", 20, minimum=1)
#: What every PostgreSQL connection starts with: each prepared statement (the hot paths'
#: own, sessions_app.plain_sql.prepared_cursor, and the foreign keys' checks PostgreSQL
#: runs as cached plans) planned once per connection, generically, where PostgreSQL
#: would plan it for its parameters' values five times first, then once more generically
#: to compare. A pooled connection's first uses were mostly planning: at 100 streams
#: (bench/peers.py --pg-backends) planning went from 0.06-0.075 to 0.02 ms per chunk,
#: the backends' CPU from 0.40-0.42 to 0.30-0.33. Those statements are written for a
#: generic plan already (no partial index a parameter's value would have to imply); the
#: ORM's statements carry their values as literals, so the setting does not touch them.
POSTGRES_SESSION_OPTIONS = "-c plan_cache_mode=force_generic_plan"

# Test databases are per test process, so several test runs on one machine (or one
# PostgreSQL server) never destroy each other's database.
TEST_DB_SUFFIX = env_str("SECTR_TEST_DB_SUFFIX", str(os.getpid()))


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
        # libpq's PGOPTIONS kept in front: an explicit `options` replaces it.
        options = " ".join(filter(None, [env_raw("PGOPTIONS"), POSTGRES_SESSION_OPTIONS]))
        config["OPTIONS"] = {"pool": {"min_size": 1, "max_size": SECTR_DB_POOL_MAX}, "options": options}
        config["TEST"] = {"NAME": f"test_{config['NAME']}_{TEST_DB_SUFFIX}"}
    return config


DATABASES = {"default": database_config(env_str("DATABASE_URL", ""))}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = env_str("REDIS_URL", "")
SECTR_CHANNEL_PREFIX = env_raw("SECTR_CHANNEL_PREFIX")
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
                "prefix": SECTR_CHANNEL_PREFIX or "asgi",
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
            "KEY_PREFIX": SECTR_CHANNEL_PREFIX or "sectr",
        }
        if REDIS_URL
        else {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}
    )
}
# Notifications of moderation (sessions_app.moderation.notifications): links in emails
# and webhook bodies start with SECTR_BASE_URL; email goes through Django's backend
# (the console by default: set EMAIL_BACKEND=django.core.mail.backends.smtp.EmailBackend
# and EMAIL_HOST etc. for real mail).
SECTR_BASE_URL = env_str("SECTR_BASE_URL", "http://localhost:8000")
EMAIL_BACKEND = env_str("EMAIL_BACKEND", "django.core.mail.backends.console.EmailBackend")
EMAIL_HOST = env_str("EMAIL_HOST", "localhost")
EMAIL_PORT = env_int("EMAIL_PORT", 25, minimum=1)
EMAIL_HOST_USER = env_str("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = env_str("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", False)
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "sectr@localhost")
#: First retry of a failed webhook after this many seconds, doubling each time.
SECTR_WEBHOOK_BACKOFF_SECONDS = env_float("SECTR_WEBHOOK_BACKOFF_SECONDS", 10.0)
SECTR_WEBHOOK_MAX_ATTEMPTS = env_int("SECTR_WEBHOOK_MAX_ATTEMPTS", 6, minimum=1)
#: Hosts a webhook may reach although they are internal (loopback, private, link-local):
#: comma-separated host names, addresses or CIDR networks (sessions_app.addresses). Empty:
#: webhooks reach public addresses only.
SECTR_WEBHOOK_ALLOWED_HOSTS = env_list("SECTR_WEBHOOK_ALLOWED_HOSTS", [])
#: How long an MCP client's `approval_prompt` call (the approval service at /mcp,
#: docs/approval-service.md) waits for a decision before it answers deny (an ask's own
#: expiry, when sooner, ends the wait first).
SECTR_MCP_APPROVAL_WAIT_S = env_float("SECTR_MCP_APPROVAL_WAIT_S", 600.0, above_minimum=True)

# MCP tool servers (docs/mcp.md). SECTR_MCP_SERVERS names a JSON file of the installation's
# stdio servers (name -> {command, args, env, cwd}), which a team's moderators may enable;
# nobody else makes a worker run a command. A team's HTTP server may reach an internal
# host only when it is listed in SECTR_MCP_ALLOWED_HOSTS (same forms as the webhooks').
SECTR_MCP_SERVERS = env_str("SECTR_MCP_SERVERS", "")
SECTR_MCP_ALLOWED_HOSTS = env_list("SECTR_MCP_ALLOWED_HOSTS", [])
SECTR_MCP_MAX_RESULT_BYTES = env_int("SECTR_MCP_MAX_RESULT_BYTES", 262144, minimum=1)
# An image or audio in an MCP tool's result over this many bytes is named, not stored.
SECTR_MCP_MAX_MEDIA_BYTES = env_int("SECTR_MCP_MAX_MEDIA_BYTES", 10 * 1024 * 1024, minimum=1)

# Budget counters (sessions_app.budgets) live in Redis under this prefix when there is one.
SECTR_COUNTER_PREFIX = SECTR_CHANNEL_PREFIX or "sectr"
# Request bodies over this many bytes are refused (413) before they are buffered
# (sectr_web.body_limits: Daphne and the ASGI app); the API's prompts carry up to 32 MiB.
SECTR_MAX_REQUEST_BYTES = env_int("SECTR_MAX_REQUEST_BYTES", 32 * 1024 * 1024, minimum=1)
SECTR_API_RATE_LIMIT = env_rate("SECTR_API_RATE_LIMIT", "600/60")  # requests/seconds per API token
# Sign-in attempts per account name and per client address (sessions_app.accounts.login).
SECTR_LOGIN_LIMIT_PER_ACCOUNT = env_rate("SECTR_LOGIN_LIMIT_PER_ACCOUNT", "10/300")
SECTR_LOGIN_LIMIT_PER_ADDRESS = env_rate("SECTR_LOGIN_LIMIT_PER_ADDRESS", "50/300")
SECTR_SESSION_CREATE_LIMIT = env_rate("SECTR_SESSION_CREATE_LIMIT", "30/60")  # new sessions per user
# `manage.py sectr_import` refuses a file larger than this many bytes (it reads the file
# piece by piece, but appends it in one transaction).
SECTR_IMPORT_MAX_BYTES = env_int("SECTR_IMPORT_MAX_BYTES", 64 * 1024 * 1024, minimum=1)
# An export made with media (`?media=1`) carries at most this many bytes of images and
# audio (the rest are listed as omitted); as base64 they grow by a third, so the default
# fits the default import limit.
SECTR_EXPORT_MEDIA_MAX_BYTES = env_int("SECTR_EXPORT_MEDIA_MAX_BYTES", 32 * 1024 * 1024, minimum=0)

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
STATIC_ROOT = Path(env_str("STATIC_ROOT", str(VAR_DIR / "staticfiles")))
MEDIA_ROOT = Path(env_str("MEDIA_ROOT", str(VAR_DIR / "media")))

# HTTPS: secure cookies, HSTS and the redirect to https. On by default when DEBUG is off
# and ALLOWED_HOSTS names a host other than the loopback's (a deployment); off for the
# loopback-only default, so `scripts/run.sh` works on http://127.0.0.1:8000 (cookies
# marked Secure are not sent back over plain HTTP). SECTR_HTTPS=1 or 0 decides outright.
_https = env_optional_bool("SECTR_HTTPS")
SECTR_HTTPS = (not DEBUG and any(host not in LOOPBACK_HOSTS for host in ALLOWED_HOSTS)) if _https is None else _https
_ssl_redirect = env_bool("SECURE_SSL_REDIRECT", True)
_hsts_seconds = env_int("SECURE_HSTS_SECONDS", 31536000, minimum=0)
if SECTR_HTTPS:
    SECURE_SSL_REDIRECT = _ssl_redirect
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_HSTS_SECONDS = _hsts_seconds
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = True
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    # Probes and scrapers talk plain HTTP to a process directly: no redirect to https.
    SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$", r"^metrics$"]

# ---- runs, workers, sockets ----

#: Run a worker inside the serving process (None: when the database is SQLite).
SECTR_EMBEDDED_WORKER = env_optional_bool("SECTR_EMBEDDED_WORKER")
#: Runs one worker executes at once (the embedded one, and `sectr_worker` without
#: --concurrency). A run waiting on its model holds no database connection and no thread
#: (its queries go through the SECTR_JOURNAL_THREADS threads, a moment each), so what
#: bounds it is memory: see docs/deployment.md "Scaling each tier".
SECTR_WORKER_CONCURRENCY = env_int("SECTR_WORKER_CONCURRENCY", 256, minimum=1)
#: A worker's lease on a run; a dead worker's run is recovered after it.
SECTR_LEASE_SECONDS = env_float("SECTR_LEASE_SECONDS", 6.0, above_minimum=True)
#: Threads the journal's async methods run in (keep at or below SECTR_DB_POOL_MAX). Each
#: busy one holds a pooled connection, and the pool opens one more whenever a thread finds
#: none idle: so this is also about how many PostgreSQL backends a burst opens per process.
#: A new backend is expensive where it is used least: its fork and start, cold catalog
#: caches, and every statement planned again (prepared statements are per connection, and
#: each is planned up to six times before PostgreSQL keeps a generic plan). At 16, the
#: production topology at 100 streams (bench/peers.py --pg-backends) opened ~46 backends
#: in the burst and PostgreSQL's CPU was 0.52-0.55 ms per chunk, a third of it planning;
#: at 4, 9 backends and 0.40, with admission and lag no worse (the database server's
#: cores, not these threads, bound how many statements run at once).
SECTR_JOURNAL_THREADS = env_int("SECTR_JOURNAL_THREADS", 4, minimum=1)
#: Milliseconds a group of streamed deltas waits, at most, for more deltas to write with
#: it (PostgreSQL): after a delta group of more than one append, the next starts at
#: least this long after it (a delta after a quiet moment or a group of one, and any
#: other append, goes at once; sessions_app.journal.database._GroupCommit). 0: no wait.
SECTR_JOURNAL_LINGER_MS = env_float("SECTR_JOURNAL_LINGER_MS", 20.0)
#: The cyclic garbage collector's young-generation threshold in Daphne and the workers,
#: whose startup heap is frozen too (sessions_app.garbage_collection); 0 keeps Python's.
SECTR_GC_THRESHOLD = env_int("SECTR_GC_THRESHOLD", 10_000, minimum=0)
SECTR_WS_RESYNC_SECONDS = env_float("SECTR_WS_RESYNC_SECONDS", 10.0, above_minimum=True)
SECTR_WS_ACCESS_SECONDS = env_float("SECTR_WS_ACCESS_SECONDS", 60.0, above_minimum=True)
# How long a process keeps a team's budget figure before reading it again (docs/agents.md).
SECTR_BUDGET_CHECK_SECONDS = env_float("SECTR_BUDGET_CHECK_SECONDS", 5.0)
SECTR_SSE_HEARTBEAT_SECONDS = env_float("SECTR_SSE_HEARTBEAT_SECONDS", 15.0, above_minimum=True)

# ---- the agent: model provider, handler, tools ----

# The core (sectr.providers) reads these names from a mapping; the server hands it
# these settings (sessions_app.provider_config), never the process environment.
SECTR_PROVIDER = env_choice("SECTR_PROVIDER", "demo", ("demo", "openai"))
SECTR_MODEL = env_str("SECTR_MODEL", "")
OPENAI_BASE_URL = env_str("OPENAI_BASE_URL", "")
OPENAI_API_KEY = env_str("OPENAI_API_KEY", "")
SECTR_CONTEXT_WINDOW = env_int("SECTR_CONTEXT_WINDOW", 0, minimum=0)  # 0: the registry's default
SECTR_MODEL_CONTEXT_WINDOW = env_int("SECTR_MODEL_CONTEXT_WINDOW", 0, minimum=0)  # 0: no override
SECTR_DEMO_DELAY_MS = env_float("SECTR_DEMO_DELAY_MS", 5.0)
SECTR_DEMO_SLOW_MS = env_float("SECTR_DEMO_SLOW_MS", 100.0)
SECTR_DEMO_STAMP_FILE = env_str("SECTR_DEMO_STAMP_FILE", "")
#: The handler runs run: a registered handler's name or the dotted path of an
#: `async def handler(ctx)` (sessions_app.plugins); None: the default agent.
SECTR_HANDLER = env_dotted_path("SECTR_HANDLER")
#: Dotted paths of extra `@sectr.tool` objects, beside the built-in ones.
SECTR_TOOLS = env_dotted_paths("SECTR_TOOLS")
#: Modules whose every `@sectr.tool` and `@sectr.handler("name")` registers (beside the
#: installed packages' entry points, groups sectr.tools and sectr.handlers).
SECTR_PLUGINS = env_dotted_paths("SECTR_PLUGINS")

# ---- operations ----

SECTR_METRICS_TOKEN = env_str("SECTR_METRICS_TOKEN", "")  # bearer token for /metrics; loopback needs none
#: prometheus_client's multiprocess directory (the library reads the variable too).
PROMETHEUS_MULTIPROC_DIR = env_str("PROMETHEUS_MULTIPROC_DIR", "")
SECTR_READY_TIMEOUT = env_float("SECTR_READY_TIMEOUT", 2.0, above_minimum=True)  # per /readyz check
SECTR_RETENTION_DAYS = env_int("SECTR_RETENTION_DAYS", 0, minimum=0)  # 0 = keep sessions for ever
SECTR_RETENTION_INTERVAL_S = env_float("SECTR_RETENTION_INTERVAL_S", 3600.0)  # 0 = the workers never sweep
# OpenTelemetry traces over OTLP/HTTP when an endpoint is set (the exporter itself reads
# the other OTEL_EXPORTER_OTLP_* variables, such as headers).
OTEL_EXPORTER_OTLP_ENDPOINT = env_str("OTEL_EXPORTER_OTLP_ENDPOINT", "")
OTEL_EXPORTER_OTLP_TRACES_ENDPOINT = env_str("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
OTEL_SERVICE_NAME = env_str("OTEL_SERVICE_NAME", "sectr")
# "json": one JSON object a line with session_id, run_id, invocation_id, worker (sectr.telemetry).
SECTR_LOG_FORMAT = env_choice("SECTR_LOG_FORMAT", "text", ("text", "json"))

# `manage.py sectr_bootstrap`: the first admin, and the address it prints.
SECTR_ADMIN_USERNAME = env_str("SECTR_ADMIN_USERNAME", "admin")
SECTR_ADMIN_PASSWORD = env_str("SECTR_ADMIN_PASSWORD", "")  # empty: a random one
SECTR_SERVE_HOST = env_str("HOST", "127.0.0.1")
SECTR_SERVE_PORT = env_int("PORT", 8000, minimum=1)

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
    "root": {"handlers": ["console"], "level": env_choice("LOG_LEVEL", "WARNING", LOG_LEVELS, upper=True)},
    "loggers": {"sectr": {"level": env_choice("SECTR_LOG_LEVEL", "INFO", LOG_LEVELS, upper=True)}},
}
