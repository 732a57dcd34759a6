"""The approval queue kept live: the `Approvals` badge on every page, the queue's socket
under every filter, and the queue's fixed number of queries.

Standing users (tests/server/test_moderation_ui.py): owner (member of team ops, owns the
sessions), teammate (moderator of ops), outsider (no team), stranger (moderator of
another team, `other`).
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.test import Client

from sessions_app import actions
from sessions_app.models import Membership, Team
from tests.server.conftest import SessionFactory, make_user
from tests.server.test_moderation_ui import ops, pending, stranger, team_session
from tests.server.test_web import HTMX, logged_in

pytestmark = pytest.mark.django_db
__all__ = ["ops", "stranger"]  # fixtures


def badge(client: Client) -> tuple[int, str]:
    response = client.get("/approvals/badge", **HTMX)
    return response.status_code, response.content.decode()


def badge_count(html: str) -> int:
    match = re.search(r'<span id="approvals-badge" class="badge" data-count="(\d+)"', html)
    assert match, html
    return int(match.group(1))


# ---- the `Approvals` badge ----


def test_the_badge_counts_only_the_asks_the_user_may_approve(
    make_session: SessionFactory, ops: Team, teammate: Any, owner: Any, outsider: Any, stranger: Any
) -> None:
    reader = make_user("reader")  # a member of ops: reads the team's sessions, decides nothing
    Membership.objects.create(team=ops, user=reader, role="member")
    session = team_session(make_session, ops)
    pending(session)
    pending(team_session(make_session, ops, "second"), "ask_2")
    status, html = badge(logged_in(teammate))
    assert status == 200 and badge_count(html) == 2 and "hidden" not in html
    assert 'hx-get="/approvals/badge"' in html and 'hx-trigger="every 5s, refresh-badge"' in html
    assert 'hx-swap="outerHTML"' in html
    _status, own = badge(logged_in(owner))  # their own sessions' asks: they may decide them
    assert badge_count(own) == 2 and "hx-get" not in own  # not a moderator: no polling
    for other in (reader, outsider, stranger):
        _status, html = badge(logged_in(other))
        assert badge_count(html) == 0 and " hidden>" in html, other
    assert "hx-get" in badge(logged_in(stranger))[1]  # a moderator elsewhere still polls
    actions.do_decide(teammate, "ask_1", "deny")
    assert badge_count(badge(logged_in(teammate))[1]) == 1
    assert badge_count(badge(logged_in(owner))[1]) == 1


def test_the_badge_is_the_same_fragment_on_every_page(
    make_session: SessionFactory, ops: Team, teammate: Any
) -> None:
    session = team_session(make_session, ops)
    pending(session)
    client = logged_in(teammate)
    fragment = badge(client)[1].strip()
    for url in ("/", f"/sessions/{session.pk}/", "/approvals/", "/approvals/audit/", "/settings/shares/", "/review/"):
        html = client.get(url).content.decode()
        assert fragment in html, url


def test_the_badge_of_a_logged_out_tab_swaps_nothing(make_session: SessionFactory, ops: Team) -> None:
    session = team_session(make_session, ops)
    pending(session)
    response = Client().get("/approvals/badge", **HTMX)
    assert response.status_code == 204 and response.content == b""
    assert "no-cache" in response.get("Cache-Control", "") or "max-age=0" in response.get("Cache-Control", "")
    assert Client().post("/approvals/badge").status_code == 405


def test_the_badge_is_one_count_query(ops: Team, teammate: Any, django_assert_num_queries: Any) -> None:
    from sessions_app.moderation.queue import pending_count

    with django_assert_num_queries(1):
        pending_count(teammate)
