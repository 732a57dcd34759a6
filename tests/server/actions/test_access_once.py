"""Access is checked once per change, by the action, on the session row it has locked.

A page that changes a session does not look the session up first: the action checks
who is asking inside the transaction that holds the row lock, so the check and the
write see the same row (a role removed in between cannot slip through a check made
before the lock) and the row is read once.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.db import transaction
from django.test import Client

from sessions_app import access
from sessions_app.actions import sessions as session_actions
from sessions_app.models import Session
from tests.server.chat.test_web import HTMX, append, asked, started

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def access_checks(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, bool]]]:
    """Every access.check_access call as (need, whether a transaction was open)."""
    calls: list[tuple[str, bool]] = []
    real = access.check_access

    def recording(user: Any, session: Session, need: access.Need) -> Session:
        calls.append((need, transaction.get_connection().in_atomic_block))
        return real(user, session, need)

    monkeypatch.setattr(access, "check_access", recording)
    monkeypatch.setattr(session_actions, "check_access", recording)
    yield calls


@pytest.mark.parametrize(
    ("action", "data"),
    [
        ("rename", {"title": "Renamed"}),
        ("mode", {"mode": "plan"}),
        ("model", {"model": "demo"}),
        ("retry", {}),
        ("stop", {}),
        ("steer", {"content": "shorter please"}),
        ("messages", {"content": "hello"}),
        ("delete", {}),
    ],
)
def test_it_checks_the_owner_once_under_the_lock(
    owner_client: Client, session: Session, access_checks: list[tuple[str, bool]], action: str, data: dict[str, str]
) -> None:
    owner_client.post(f"/sessions/{session.pk}/{action}", data, **HTMX)
    assert access_checks == [("write", True)], action


def test_a_decision_checks_the_approver_once_under_the_lock(
    owner_client: Client, session: Session, access_checks: list[tuple[str, bool]]
) -> None:
    append(session, [started("note it"), *asked()])
    response = owner_client.post("/asks/ask_1/decide", {"verdict": "allow_once"}, **HTMX)
    assert response.status_code == 200
    # The card shown afterwards is read with a read check of its own.
    assert [call for call in access_checks if call[0] != "read"] == [("approve", True)]


@pytest.mark.parametrize("action", ["rename", "mode", "stop", "steer", "delete"])
def test_it_returns_404_for_outsider_before_writing(
    outsider_client: Client, session: Session, access_checks: list[tuple[str, bool]], action: str
) -> None:
    before = Session.objects.get(pk=session.pk).last_seq
    response = outsider_client.post(f"/sessions/{session.pk}/{action}", {"title": "x", "mode": "plan"}, **HTMX)
    assert response.status_code == 404
    assert access_checks == [("write", True)]
    assert Session.objects.get(pk=session.pk).last_seq == before
