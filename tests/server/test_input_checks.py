"""Page forms refuse NUL and lone surrogates (400, as the API does); whole numbers from a
query string, a form or a websocket URL are ASCII digits only ("²" is a 400, not a 500)."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from sessions_app.actions.tokens import do_issue_token
from sessions_app.models import Envelope, Session
from tests.server.test_consumers import connect, frames_until_ready


def test_a_nul_in_a_page_form_is_a_400_and_writes_nothing(owner_client: Client, session: Session) -> None:
    before = Envelope.objects.filter(session=session).count()
    for path, data in (
        (f"/sessions/{session.pk}/messages", {"content": "a\x00b"}),
        (f"/sessions/{session.pk}/rename", {"title": "t\x00"}),
        ("/sessions/new", {"title": "\x00"}),
        (f"/sessions/{session.pk}/steer", {"con\x00tent": "x"}),
    ):
        response = owner_client.post(path, data)
        assert response.status_code == 400 and b"NUL" in response.content, path
    assert Envelope.objects.filter(session=session).count() == before
    assert Session.objects.count() == 1


def test_a_nul_in_a_query_string_is_a_400(owner_client: Client) -> None:
    assert owner_client.get("/?page=%00").status_code == 400
    assert owner_client.get("/review/?owner=a%00").status_code == 400


def test_the_api_keeps_its_own_check(owner: Any) -> None:
    _, raw = do_issue_token(owner, "t")
    response = Client().post(
        "/api/v1/sessions", '{"title": "a\\u0000"}', content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {raw}"
    )
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_unicode"


@pytest.mark.parametrize("number", ["²", "٣", "1²", "１"])
def test_non_ascii_digits_are_a_400_not_a_500(owner_client: Client, session: Session, number: str) -> None:
    fork = owner_client.post(f"/sessions/{session.pk}/fork", {"at_seq": number}, HTTP_HX_REQUEST="true")
    assert fork.status_code == 400, fork.content
    _, raw = do_issue_token(session.owner, "t")
    listing = Client().get("/api/v1/sessions", {"limit": number}, HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert listing.status_code == 400 and listing.json()["error"]["code"] == "invalid_limit"
    assert owner_client.get("/", {"page": number}).status_code == 200  # the paginator's first page


def test_a_content_length_of_other_digits_is_a_400(owner: Any) -> None:
    _, raw = do_issue_token(owner, "t")
    response = Client().post(
        "/api/v1/sessions",
        b"{}",
        content_type="application/json",
        CONTENT_LENGTH="٢",
        HTTP_AUTHORIZATION=f"Bearer {raw}",
    )
    assert response.status_code == 400


@pytest.mark.django_db(transaction=True)
async def test_a_websocket_cursor_of_other_digits_counts_as_zero(
    owner: Any, session: Session, settings: Any
) -> None:
    settings.SECTR_EMBEDDED_WORKER = False
    communicator, connected, _ = await connect(owner, f"/ws/sessions/{session.pk}/?after=%C2%B2")
    assert connected
    frames = await frames_until_ready(communicator)
    assert any(frame.get("first") == 1 for frame in frames), "the whole journal, from seq 1"
    await communicator.disconnect()
