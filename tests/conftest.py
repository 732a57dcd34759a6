"""The whole suite's test-process setup: parallel workers kept apart, slow files first.

scripts/test.sh runs the suite with pytest-xdist (`-n N --dist loadfile`: every file on
one worker). Each worker is its own process with its own test database (pytest-django
names it per worker; the settings add the process id), but they share one Redis: each
worker gets its own key prefix for the channel layer, the cache and the budget counters
(SECTR_CHANNEL_PREFIX, inherited by the processes the tests start), so one worker's
group messages, rate-limit counters and budgets never reach another's tests.

Tests that must run alone (they kill processes, restart or terminate PostgreSQL, or
measure capacity and timing) carry the `serial` marker: scripts/test.sh runs them after
the parallel pass, without xdist (`-m serial`).
"""

from __future__ import annotations

import os

import pytest

#: The slowest files (the sum of their tests' times in scripts/test.sh's parallel passes,
#: slowest first; each starts servers or subprocesses), handed out first so that no worker
#: starts a long file when the others are nearly done. Files not listed keep pytest's
#: order after these.
SLOW_FIRST = (
    "tests/server/mcp_approval/test_approval_service.py",
    "tests/server/api/test_openapi_schemathesis.py",
    "tests/server/ops/test_settings.py",
    "tests/server/api/test_sse_access_live.py",
    "tests/core/test_fold_properties.py",
    "tests/server/mcp/test_mcp_runs.py",
    "tests/server/api/test_sdk.py",
    "tests/server/api/test_api_hostile.py",
    "tests/core/test_mcp.py",
    "tests/server/ops/test_dev_server.py",
    "tests/server/ops/test_ops.py",
    "tests/server/moderation/test_decisions.py",
    "tests/server/api/test_sdk_contract.py",
    "tests/server/actions/test_actions.py",
    "tests/server/review/test_review.py",
)


def _own_redis_namespace(worker: str) -> None:
    """Give this xdist worker (gw0, gw1, …) its own Redis key prefix.

    The settings are imported before any conftest (pytest-django sets Django up first),
    so the three values derived from SECTR_CHANNEL_PREFIX are set here as the settings
    would have set them; the environment variable carries the prefix to the processes
    the tests start with this process's environment."""
    from django.conf import settings

    prefix = f"{os.environ.get('SECTR_CHANNEL_PREFIX') or 'sectr'}-{worker}"
    os.environ["SECTR_CHANNEL_PREFIX"] = prefix
    settings.SECTR_CHANNEL_PREFIX = prefix
    settings.SECTR_COUNTER_PREFIX = prefix
    layer = settings.CHANNEL_LAYERS["default"]
    if "prefix" in layer.get("CONFIG", {}):
        layer["CONFIG"]["prefix"] = prefix
    cache = settings.CACHES["default"]
    if "KEY_PREFIX" in cache:
        cache["KEY_PREFIX"] = prefix


def pytest_configure(config: pytest.Config) -> None:
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:
        _own_redis_namespace(worker)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {path: index for index, path in enumerate(SLOW_FIRST)}

    def slowness(item: pytest.Item) -> int:
        return rank.get(item.nodeid.split("::", 1)[0], len(rank))

    items.sort(key=slowness)  # stable: within a file, and for the rest, pytest's order
