"""The audit's `from` and `to` filters (the page, its CSV and GET /api/v1/audit): a day
is a whole day at both ends, and a well-formed date that does not exist is a 400 that
says so, not a server error."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from django.test import Client

from sessions_app import actions
from sessions_app.models import ApiToken, AuditEntry, Session, Team
from tests.server.conftest import SessionFactory
from tests.server.moderation.test_moderation_ui import pending, team_session

pytestmark = pytest.mark.django_db


@pytest.fixture
def decided_on(make_session: SessionFactory, ops: Team, teammate: Any) -> dict[str, datetime]:
    """Three decisions, moved to the evening before, the afternoon of and just after 10 March."""
    session = team_session(make_session, ops)
    moments = {
        "ask_1": datetime(2026, 3, 9, 22, 0, tzinfo=UTC),
        "ask_2": datetime(2026, 3, 10, 23, 59, 30, tzinfo=UTC),
        "ask_3": datetime(2026, 3, 11, 0, 0, 30, tzinfo=UTC),
    }
    for number, ask_id in enumerate(moments, start=1):
        pending(session, ask_id, inv=f"inv_{number}")
        actions.do_decide(teammate, ask_id, "allow_once")
        Session.objects.filter(pk=session.pk).update(status="completed")
    for ask_id, at in moments.items():
        AuditEntry.objects.filter(ask_id=ask_id).update(at=at)
    return moments


def api_asks(client: Client, auth: dict[str, str], query: str) -> list[str]:
    response = client.get(f"/api/v1/audit?kind=decision&{query}", **auth)
    assert response.status_code == 200, response.content
    return sorted(entry["ask_id"] for entry in response.json()["entries"])


def bearer(user: Any) -> dict[str, str]:
    return {"HTTP_AUTHORIZATION": f"Bearer {ApiToken.issue(user, 'test')[1]}"}


def test_to_a_day_includes_the_whole_day_and_from_starts_at_its_beginning(
    decided_on: dict[str, datetime], teammate: Any
) -> None:
    client, auth = Client(), bearer(teammate)
    assert api_asks(client, auth, "to=2026-03-10") == ["ask_1", "ask_2"]
    assert api_asks(client, auth, "from=2026-03-10") == ["ask_2", "ask_3"]
    assert api_asks(client, auth, "from=2026-03-10&to=2026-03-10") == ["ask_2"]
    assert api_asks(client, auth, "to=2026-03-10T12:00:00Z") == ["ask_1"]  # a time is that moment
    page = Client()
    page.force_login(teammate)
    html = page.get("/approvals/audit/", {"kind": "decision", "to": "2026-03-10"}).content.decode()
    assert "ask_2" in html and "ask_3" not in html
    assert 'value="2026-03-10"' in html  # the form keeps the day


@pytest.mark.parametrize(
    ("query", "says"),
    [
        ("to=2026-13-01", "to is not a real date or time: 2026-13-01 (month must be in 1..12)"),
        ("from=2026-02-30", "from is not a real date or time: 2026-02-30 (day is out of range for month)"),
        ("to=2026-03-10T25:00", "to is not a real date or time: 2026-03-10T25:00 (hour must be in 0..23)"),
        ("to=20260310xx", "to must be a date (YYYY-MM-DD) or an ISO 8601 time"),
    ],
)
def test_a_date_that_does_not_exist_is_a_clear_400_everywhere(
    decided_on: dict[str, datetime], teammate: Any, query: str, says: str
) -> None:
    api = Client().get(f"/api/v1/audit?{query}", **bearer(teammate))
    assert api.status_code == 400
    error = api.json()["error"]
    assert (error["code"], error["message"]) == ("invalid_filter", says)
    page = Client()
    page.force_login(teammate)
    for path in ("/approvals/audit/", "/approvals/audit.csv"):
        response = page.get(f"{path}?{query}")
        assert response.status_code == 400, path
        assert says.replace("'", "&#x27;") in response.content.decode(), path
