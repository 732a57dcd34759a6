"""The suite's parallel workers (pytest-xdist in scripts/test.sh) keep apart on one Redis.

Each worker has its own key prefix for the channel layer, the cache and the budget
counters (tests/conftest.py), and the processes its tests start with its environment
read the same prefix from SECTR_CHANNEL_PREFIX; run alone, the settings' defaults hold.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from channels.layers import get_channel_layer
from django.conf import settings
from django.core.cache import caches

from tests.liveserver import ROOT

CHILD = (
    "import json, django; django.setup(); from django.conf import settings as s; "
    "print(json.dumps([s.SECTR_COUNTER_PREFIX, s.CHANNEL_LAYERS['default'].get('CONFIG', {}).get('prefix'), "
    "s.CACHES['default'].get('KEY_PREFIX')]))"
)


def expected() -> tuple[str, str, str]:
    """(counters, channel layer, cache) prefixes this process should use."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:
        own = settings.SECTR_CHANNEL_PREFIX
        assert own and own.endswith(f"-{worker}"), own
        return own, own, own
    return (settings.SECTR_CHANNEL_PREFIX or "sectr", settings.SECTR_CHANNEL_PREFIX or "asgi",
            settings.SECTR_CHANNEL_PREFIX or "sectr")  # fmt: skip


async def test_this_process_uses_its_own_prefix_everywhere() -> None:  # the Redis layer lives on a loop
    counters, layer, cache = expected()
    assert settings.SECTR_COUNTER_PREFIX == counters
    if settings.REDIS_URL:
        assert get_channel_layer().prefix == layer  # type: ignore[union-attr]
        assert caches["default"].make_key("k") == f"{cache}:1:k"


def test_a_process_started_by_a_test_uses_the_same_prefixes() -> None:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "sectr_web.settings", "PYTHONPATH": str(ROOT)}
    out = subprocess.run(  # noqa: S603 - our own settings
        [sys.executable, "-c", CHILD], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=True
    )
    counters, layer, cache = json.loads(out.stdout.strip().splitlines()[-1])
    want_counters, want_layer, want_cache = expected()
    assert counters == want_counters
    if settings.REDIS_URL:
        assert (layer, cache) == (want_layer, want_cache)
