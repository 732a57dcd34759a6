"""The server processes' garbage collector: the startup heap frozen and a larger young
generation, unless SECTR_GC_THRESHOLD=0 (in a fresh interpreter each: the test process's
own collector stays as it is)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

PROBE = """
import gc, json, django
django.setup()
from sessions_app.garbage_collection import tune_for_server
before = gc.get_threshold()
tuned = tune_for_server()
again = tune_for_server()
print(json.dumps({"tuned": tuned, "again": again, "before": before, "after": gc.get_threshold(),
                  "frozen": gc.get_freeze_count()}))
"""


def probe(**env: str) -> dict[str, object]:
    environ = {**os.environ, "DJANGO_SETTINGS_MODULE": "sectr_web.settings", **env}
    out = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, env=environ, capture_output=True, text=True, timeout=120, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_startup_heap_is_frozen_and_the_young_generation_larger() -> None:
    result = probe(SECTR_GC_THRESHOLD="10000")
    assert result["tuned"] is True and result["again"] is True
    assert result["after"] == [10000, *result["before"][1:]]
    assert result["frozen"] > 10_000  # Django and the apps: no collection walks them again


def test_zero_leaves_pythons_collector_alone() -> None:
    result = probe(SECTR_GC_THRESHOLD="0")
    assert result["tuned"] is False and result["after"] == result["before"] and result["frozen"] == 0
