"""The snapshot of a session as labelled rows, for people (the review page, the admin)."""

from __future__ import annotations

from typing import Any

from sessions_app.display import snapshots
from sessions_app.models import Session


def _when(iso: str | None) -> str:
    return f"{iso[:19].replace('T', ' ')} UTC" if iso else "—"


def snapshot_fields(session: Session) -> list[tuple[str, Any]]:
    """The snapshot of docs/sessions.md (as the API serves it) as labelled rows."""
    snap = snapshots.snapshot(session)
    model = snap["resolved_model"]
    ask = snap["pending_ask"]
    media = [kind for kind, accepted in snap["media"].items() if accepted]
    placement = snap.get("placement")
    agent = snap.get("agent") or {}
    pinned = f"{agent.get('name') or agent.get('slug')} ({agent.get('slug')}, version {agent.get('version')})"
    if agent.get("team"):
        pinned = f"{agent['team']}/{pinned}"
    return [
        ("State", snap["state"]),
        ("Owner", snap["owner"]),
        ("Agent", pinned if agent.get("id") else "built-in default agent"),
        ("Mode", snap["mode"]),
        ("Model", f"{model['provider_id']} / {model['model_id']}"),
        ("Context window", f"{model['context_window']:,} tokens" if model["context_window"] else "—"),
        ("Reasoning effort", model["reasoning_effort"] or "provider default"),
        ("Limits", ", ".join(f"{key.replace('_', ' ')} {value or 'off'}" for key, value in snap["limits"].items())),
        ("Turns", snap["turns"]),
        ("Tool calls", snap["tool_calls"]),
        ("Accepts media", ", ".join(media) or "none"),
        ("Pending ask", f"{ask['name']}" if ask else "none"),
        ("Worker", (placement.get("worker") or "not yet claimed") if placement else "—"),
        ("Stop reason", snap.get("stop_reason") or "—"),
        ("Last error", (snap.get("last_error") or {}).get("error") if snap.get("last_error") else "—"),
        ("Created", _when(snap["created_at"])),
        ("Updated", _when(snap["updated_at"])),
        ("Events", snap.get("last_seq")),
    ]
