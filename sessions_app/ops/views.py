"""Operations endpoints (docs/operations.md): liveness, readiness, Prometheus metrics.

`/healthz` and `/readyz` answer without login (load balancers and orchestrators probe
them). `/metrics` answers a request bearing SECTR_METRICS_TOKEN (`Authorization: Bearer
...`) or one from loopback that did not come through a proxy (none of the headers a
proxy adds, PROXY_HEADERS: behind a proxy on the same machine every request is from
loopback). `/readyz` names a failing check, never its exception (that goes to the log).
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, InterfaceError, OperationalError, connections
from django.db.migrations.executor import MigrationExecutor
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.cache import never_cache
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest, multiprocess

import sectr
from sectr.plugins import PluginFailure
from sessions_app.dbthread import reset_connection
from sessions_app.ops.scrape import database_registry
from sessions_app.plugins import plugin_registry

log = logging.getLogger("sectr.ops")

#: Headers a reverse proxy adds to say whom it forwards for (REMOTE_ADDR is then the
#: proxy's): any of them makes a request proxied, whichever one this proxy uses.
PROXY_HEADERS = (
    "Forwarded",
    "X-Forwarded-For",
    "X-Forwarded-Host",
    "X-Forwarded-Proto",
    "X-Forwarded-Port",
    "X-Forwarded-Server",
    "X-Real-IP",
    "X-Client-IP",
    "X-Original-Forwarded-For",
    "True-Client-IP",
    "CF-Connecting-IP",
    "Fastly-Client-IP",
    "X-Cluster-Client-IP",
    "Via",
)
_migrated = False  # once all migrations are applied they stay applied: checked once


class NotReady(Exception):
    """A readiness check's own explanation, written to be shown to anyone."""


@never_cache
async def healthz(request: HttpRequest) -> JsonResponse:
    # Async: under ApiASGIHandler (sectr_web.middleware.PROBE_PATHS) the probe takes no
    # thread at all, and sends its request signals on the event loop.
    return JsonResponse({"ok": True, "version": sectr.__version__})


def check_database() -> None:
    try:
        with connections[DEFAULT_DB_ALIAS].cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    except (OperationalError, InterfaceError):
        # PostgreSQL restarted: this connection, and the pool's idle ones, are dead. The
        # broken one goes back to its pool (which drops it); the rest are tested now, so
        # the next probe (and the next request) gets a live one.
        reset_connection(DEFAULT_DB_ALIAS)
        raise


def check_migrations() -> None:
    global _migrated
    if _migrated:
        return
    executor = MigrationExecutor(connections[DEFAULT_DB_ALIAS])
    plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
    if plan:
        names = ", ".join(f"{migration.app_label}.{migration.name}" for migration, _backwards in plan[:5])
        log.warning("readiness: %s unapplied migration(s): %s", len(plan), names)
        raise NotReady(f"{len(plan)} unapplied migration(s)")
    _migrated = True


async def check_channel_layer() -> None:
    layer = get_channel_layer()
    if layer is None:
        raise NotReady("no channel layer configured")
    # A send to a channel nobody listens on: one round trip to Redis (a PUBLISH with the
    # pub/sub layer), nothing kept.
    await layer.send(f"sectr.readyz.{uuid.uuid4().hex}", {"type": "readyz.probe"})


async def _timed(name: str, check: Callable[[], Awaitable[None]]) -> tuple[str, str]:
    # Each check may take SECTR_READY_TIMEOUT before it counts as failed.
    timeout = float(settings.SECTR_READY_TIMEOUT)
    started = time.monotonic()
    try:
        await asyncio.wait_for(check(), timeout)
    except TimeoutError:
        log.warning("readiness check %s timed out after %gs", name, timeout)
        return name, f"timed out after {timeout:g}s"
    except NotReady as exc:
        return name, exc.args[0]
    except Exception:
        # Anyone may read /readyz: it names the check, the log keeps the exception (its
        # text can carry host names, ports, paths and versions).
        log.warning("readiness check %s failed", name, exc_info=True)
        return name, "failed"
    return name, f"ok ({(time.monotonic() - started) * 1000:.0f} ms)"


@never_cache
async def readyz(request: HttpRequest) -> JsonResponse:
    """200 when the database, the channel layer, the migrations and the configured tools
    and handler are ready; else 503 naming what is not. A plugin that failed to load is
    listed under `plugin_failures` without failing readiness (the others run)."""
    failures: list[PluginFailure] = []

    async def check_plugins() -> None:
        # Loaded once per process (imports): in a thread, off the event loop.
        failures.extend((await asyncio.to_thread(plugin_registry)).failures)

    results = await asyncio.gather(
        # database_sync_to_async closes the connection it used (CONN_MAX_AGE = 0).
        _timed("database", database_sync_to_async(check_database)),
        _timed("migrations", database_sync_to_async(check_migrations)),
        _timed("channel_layer", check_channel_layer),
        _timed("plugins", check_plugins),
    )
    checks = dict(results)
    failing = [name for name, outcome in results if not outcome.startswith("ok")]
    body: dict[str, Any] = {"ok": not failing, "checks": checks, "failing": failing}
    if failures:
        # Named, not explained: the exception is in the log and `manage.py sectr_plugins`.
        body["plugin_failures"] = [{"plugin": failure.source} for failure in failures]
    return JsonResponse(body, status=503 if failing else 200)


def may_read_metrics(request: HttpRequest) -> bool:
    token = getattr(settings, "SECTR_METRICS_TOKEN", "")
    header = request.headers.get("Authorization", "")
    if token and header.startswith("Bearer ") and hmac.compare_digest(header[7:].strip(), token):
        return True
    if any(name in request.headers for name in PROXY_HEADERS):
        return False  # proxied: REMOTE_ADDR is the proxy's, not the client's
    try:
        return ipaddress.ip_address(request.META.get("REMOTE_ADDR", "")).is_loopback
    except ValueError:
        return False


def process_metrics_text() -> bytes:
    """This process's metrics, or in multiprocess mode (PROMETHEUS_MULTIPROC_DIR) the sum
    over every process of the machine that writes to that directory."""
    if settings.PROMETHEUS_MULTIPROC_DIR:
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return generate_latest(registry)
    return generate_latest(REGISTRY)


def metrics_text() -> bytes:
    """The processes' metrics, then the database's (computed now)."""
    return process_metrics_text() + generate_latest(database_registry)


@never_cache
def metrics(request: HttpRequest) -> HttpResponse:
    if not may_read_metrics(request):
        return HttpResponse(
            "metrics need the metrics token or a loopback client\n", status=403, content_type="text/plain"
        )
    return HttpResponse(metrics_text(), content_type=CONTENT_TYPE_LATEST)
