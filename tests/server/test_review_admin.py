"""The Django admin for review: readable sessions, a read-only journal, pinned query counts."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from sessions_app.models import Envelope, Session
from tests.server.test_web import append, completed, logged_in, reply, started


@pytest.fixture
def admin_client_(db: None) -> Client:
    user = get_user_model().objects.create_superuser("root", "root@example.org", "x")
    return logged_in(user)


def test_session_change_page_shows_snapshot_usage_transcript_and_links(admin_client_: Client, session: Session) -> None:
    append(session, [started("hello admin"), *reply("You said: hello admin"), completed()], publish=False)
    page = admin_client_.get(f"/admin/sessions_app/session/{session.pk}/change/").content.decode()
    assert "Snapshot" in page and "Context window" in page
    assert "Usage by model" in page and "<td>demo</td>" in page
    assert "hello admin" in page and 'data-role="assistant"' in page
    assert f'href="/sessions/{session.pk}/"' in page and f'href="/review/{session.pk}/"' in page
    assert '"state":' not in page  # no raw projection JSON


def test_the_admin_refuses_to_add_change_or_delete_envelopes(admin_client_: Client, session: Session) -> None:
    envelope = Envelope.objects.get(session=session, seq=1)
    base = f"/admin/sessions_app/envelope/{envelope.pk}"
    assert admin_client_.get("/admin/sessions_app/envelope/add/").status_code == 403
    assert admin_client_.post(f"{base}/change/", {"type": "SESSION_ERROR", "payload": "{}"}).status_code == 403
    assert admin_client_.post(f"{base}/delete/", {"post": "yes"}).status_code == 403
    response = admin_client_.post(
        "/admin/sessions_app/envelope/", {"action": "delete_selected", "_selected_action": [envelope.pk]}
    )
    assert response.status_code in (200, 302)
    # Nor by deleting the session from the admin (the cascade would take the journal).
    assert admin_client_.post(f"/admin/sessions_app/session/{session.pk}/delete/", {"post": "yes"}).status_code == 403
    admin_client_.post(
        "/admin/sessions_app/session/", {"action": "delete_selected", "_selected_action": [session.pk], "post": "yes"}
    )
    assert Envelope.objects.get(pk=envelope.pk).payload == envelope.payload
    assert Session.objects.filter(pk=session.pk).exists()


def test_sessions_are_deleted_through_the_delete_action(admin_client_: Client, session: Session) -> None:
    admin_client_.post("/admin/sessions_app/session/", {"action": "delete_sessions", "_selected_action": [session.pk]})
    assert not Session.objects.filter(pk=session.pk).exists()
    assert not Envelope.objects.filter(session_id=session.pk).exists()


def test_session_changelist_query_count_does_not_grow(admin_client_: Client, make_session: Any) -> None:
    for i in range(3):
        make_session(title=f"a{i}")
    admin_client_.get("/admin/sessions_app/session/")
    with CaptureQueriesContext(connection) as few:
        assert admin_client_.get("/admin/sessions_app/session/", {"q": "a", "status__exact": "idle"}).status_code == 200
    for i in range(30):
        make_session(title=f"a{i}")
    with CaptureQueriesContext(connection) as more:
        admin_client_.get("/admin/sessions_app/session/", {"q": "a", "status__exact": "idle"})
    assert len(more) == len(few) <= 12


def test_run_and_review_admins_load(admin_client_: Client, session: Session) -> None:
    for model in ("run", "rating", "reviewqueue", "sharelink", "modelprice", "usagedaily", "reviewmark"):
        assert admin_client_.get(f"/admin/sessions_app/{model}/").status_code == 200, model
