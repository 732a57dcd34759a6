"""A refused htmx action answers with the server's reason for the page (the card and
#flash), never Django's error page, and the badge counts only what waits for the user.

Standing users as in test_moderation_ui: owner (member of ops), teammate (moderator)."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from sessions_app.models import Envelope, Team
from tests.server.chat.test_web import HTMX, logged_in
from tests.server.conftest import SessionFactory, make_user
from tests.server.moderation.test_moderation_live import badge, badge_count
from tests.server.moderation.test_moderation_ui import pending, team_session

pytestmark = pytest.mark.django_db


def test_the_requesters_own_approval_on_a_two_person_ask_is_refused_with_the_reason(
    make_session: SessionFactory,
    ops: Team,
    owner: Any,
) -> None:
    session = team_session(make_session, ops)
    pending(session, approvals_required=2)
    before = Envelope.objects.filter(session=session).count()
    client = logged_in(owner)
    queue = client.get("/approvals/").content.decode()
    assert 'data-waits="others"' in queue and "Waiting for others" in queue
    assert 'value="allow_once"' not in queue and 'value="deny"' in queue
    refused = client.post("/asks/ask_1/decide", {"verdict": "allow_once", "where": "queue"}, **HTMX)
    html = refused.content.decode()
    assert refused.status_code == 403
    assert 'data-status="pending"' in html and "<html" not in html
    assert 'hx-swap-oob="innerHTML"' in html and "your own approval does not count" in html
    assert Envelope.objects.filter(session=session).count() == before


def test_the_badge_leaves_out_own_two_person_asks_and_asks_voted_on(
    make_session: SessionFactory,
    ops: Team,
    owner: Any,
    teammate: Any,
) -> None:
    session = team_session(make_session, ops)
    pending(session, approvals_required=2)
    assert badge_count(badge(logged_in(owner))[1]) == 0
    moderator = logged_in(teammate)
    assert badge_count(badge(moderator)[1]) == 1
    voted = moderator.post("/asks/ask_1/decide", {"verdict": "allow_once", "where": "queue"}, **HTMX)
    assert "You voted: waiting for 1 more" in voted.content.decode()
    assert badge_count(badge(moderator)[1]) == 0


def test_a_permission_refusal_of_an_htmx_request_is_a_message_for_flash(
    make_session: SessionFactory,
    ops: Team,
) -> None:
    session = team_session(make_session, ops)
    reader = make_user("reader")
    ops.memberships.create(user=reader, role="reviewer")
    # Renaming is the owner's: a reader's htmx request gets the reason, retargeted to #flash.
    response = logged_in(reader).post(f"/sessions/{session.pk}/rename", {"title": "mine now"}, **HTMX)
    assert response.status_code == 403
    assert response["HX-Retarget"] == "#flash" and "<html" not in response.content.decode()
    assert "only the session&#x27;s owner can do this" in response.content.decode()
    plain = logged_in(reader).post(f"/sessions/{session.pk}/rename", {"title": "mine now"})
    assert plain.status_code == 403 and "HX-Retarget" not in plain


def test_a_refused_csrf_check_of_an_htmx_request_says_to_reload(make_session: SessionFactory, owner: Any) -> None:
    session = make_session()
    client = Client(enforce_csrf_checks=True)
    client.force_login(owner)
    response = client.post(f"/sessions/{session.pk}/rename", {"title": "x"}, **HTMX)
    assert response.status_code == 403 and response["HX-Retarget"] == "#flash"
    assert "reload the page and try again" in response.content.decode()
    plain = client.post(f"/sessions/{session.pk}/rename", {"title": "x"})
    assert plain.status_code == 403 and "CSRF verification failed" in plain.content.decode()
