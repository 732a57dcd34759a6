"""The Python SDK against the contract both SDKs share (sdk/surface.json); the
TypeScript SDK is checked against the same file by sdk/typescript/test/surface.test.mjs."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

import pytest

from sectr.client import aio, errors, parts, protocol, sync
from sectr.client.models import EVENT_KINDS

ROOT = Path(__file__).resolve().parents[2]
SURFACE = json.loads((ROOT / "sdk" / "surface.json").read_text())
CLASSES = {
    "Sessions": (sync.Sessions, aio.AsyncSessions),
    "Session": (sync.Session, aio.AsyncSession),
    "Run": (sync.Run, aio.AsyncRun),
    "Runs": (sync.Runs, aio.AsyncRuns),
    "Asks": (sync.Asks, aio.AsyncAsks),
    "Teams": (sync.Teams, aio.AsyncTeams),
    "Scores": (sync.Scores, aio.AsyncScores),
    "Experiments": (sync.Experiments, aio.AsyncExperiments),
}
METHODS = [(cls, method, options) for cls, methods in SURFACE["methods"].items() for method, options in methods.items()]


def parameters(obj: Any) -> set[str]:
    return set(inspect.signature(inspect.unwrap(obj)).parameters)


@pytest.mark.parametrize(("cls", "method", "options"), METHODS, ids=[f"{c}.{m}" for c, m, _ in METHODS])
def test_every_method_and_option_of_the_contract_is_in_both_python_clients(
    cls: str, method: str, options: list[str]
) -> None:
    for implementation in CLASSES[cls]:
        function = getattr(implementation, method, None)
        assert function is not None, f"{implementation.__name__}.{method} is missing"
        missing = set(options) - parameters(function)
        assert not missing, f"{implementation.__name__}.{method} lacks {sorted(missing)}"


def test_the_request_controls_are_the_listed_ones() -> None:
    assert list(protocol.CONTROL_NAMES) == SURFACE["request_controls"]["python"]
    assert protocol.AFFINITY_HEADER == SURFACE["affinity_header"]


def test_the_event_kinds_are_the_listed_ones() -> None:
    # tests/server/api/test_sdk_contract.py checks the server's own list against the same file.
    assert list(EVENT_KINDS) == SURFACE["event_kinds"]


def test_the_error_classes_carry_the_listed_codes() -> None:
    for name, code in SURFACE["errors"].items():
        error_class = getattr(errors, name)
        assert issubclass(error_class, errors.SectrError)
        assert error_class.code == code, name


def test_the_snapshot_has_the_listed_fields() -> None:
    from sectr.client.models import Snapshot

    assert set(SURFACE["snapshot_fields"]) <= set(Snapshot.__dataclass_fields__)


def test_a_permission_ask_has_the_listed_fields() -> None:
    from sectr.client.models import PermissionAsk

    assert list(PermissionAsk.__dataclass_fields__) == SURFACE["ask_fields"]
    payload = {"ask_id": "ask_1", "name": "deploy", "arguments": {}, "tool_call_id": "c1", "may_have_run": True}
    assert PermissionAsk.from_payload(payload, "run_1").may_have_run is True
    assert PermissionAsk.from_payload({"ask_id": "ask_1", "name": "deploy"}, "run_1").may_have_run is False
    from sectr.client.records import AskInfo

    assert AskInfo.from_json({"ask_id": "ask_1", "status": "pending", "may_have_run": True}).may_have_run is True
    assert AskInfo.from_json({"ask_id": "ask_1", "status": "pending"}).may_have_run is False


def test_the_part_helpers_exist() -> None:
    for name in SURFACE["parts"]["common"] + SURFACE["parts"]["paths"]:
        assert callable(getattr(parts, name)), name
