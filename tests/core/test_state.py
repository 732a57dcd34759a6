"""SessionState's copy and dict form: deep, and the same shape as the dataclass's fields."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import Any

from sectr.state import SessionState


def _state() -> SessionState:
    state = SessionState(session_id="ses_1", created_at=datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC))
    state.usage = {"demo": {"input_tokens": 3, "output_tokens": 4}}
    state.asks = {"ask_1": {"ask_id": "ask_1", "arguments": {"paths": ["a", {"b": 1}]}}}
    state.grants = ["deploy"]
    state.last_reason = {"kind": "user_message", "input": {"content": [{"type": "text", "text": "hi"}]}}
    return state


def test_a_copy_equals_the_state_and_shares_no_container_with_it() -> None:
    state = _state()
    copied = state.copy()
    assert copied == state
    copied.usage["demo"]["input_tokens"] += 1
    copied.asks["ask_1"]["arguments"]["paths"][1]["b"] = 2
    copied.grants.append("rm")
    copied.last_reason["input"]["content"][0]["text"] = "changed"  # type: ignore[index]
    assert state == _state()  # the original is untouched


def test_to_dict_is_every_field_with_iso_times_and_round_trips() -> None:
    state = _state()
    data = state.to_dict()
    assert set(data) == {f.name for f in dataclasses.fields(SessionState)}
    assert data["created_at"] == "2026-01-02T03:04:05+00:00" and data["updated_at"] is None
    data["asks"]["ask_1"]["arguments"]["paths"].append("c")
    assert state.asks["ask_1"]["arguments"]["paths"] == ["a", {"b": 1}]  # a deep copy
    assert SessionState.from_dict(state.to_dict()) == state


def test_a_worktree_selector_is_folded_from_the_journal_and_inherited() -> None:
    import pytest

    from sectr import operations
    from sectr.errors import ValidationFailed
    from sectr.events import Envelope
    from sectr.state import project

    def fold(events: list[Any], session_id: str) -> SessionState:
        return project(
            Envelope(session_id, seq, None, event.type, event.payload) for seq, event in enumerate(events, 1)
        )

    selector = {"repo": "app", "branch": "x"}
    source = fold(operations.clear_events(SessionState("ses_a"), worktree_selector=selector), "ses_a")
    assert source.worktree_selector == selector
    assert SessionState.from_dict(source.to_dict()).worktree_selector == selector  # the cached projection
    assert fold(operations.clear_events(source), "ses_b").worktree_selector == selector
    forked = fold(operations.fork_events(source, [], at_seq=None, worktree_selector="wt-2"), "ses_c")
    assert forked.worktree_selector == "wt-2"
    for bad in ("", 5, ["x"], "x" * 2049, {"k": "v" * 2048}):
        with pytest.raises(ValidationFailed):
            operations.clear_events(source, worktree_selector=bad)
