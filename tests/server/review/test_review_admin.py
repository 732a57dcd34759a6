"""The Django admin for review: readable sessions, a read-only journal, pinned query counts."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib.admin.utils import quote
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from sessions_app.admin import CappedCountPaginator
from sessions_app.models import Envelope, Session
from tests.server.chat.test_web import append, completed, logged_in, reply, started


@pytest.fixture
def admin_client_(db: None) -> Client:
    user = get_user_model().objects.create_superuser("root", "root@example.org", "x")
    return logged_in(user)


def test_session_change_page_shows_snapshot_usage_transcript_and_links(admin_client_: Client, session: Session) -> None:
    append(session, [started("hello admin"), *reply("You said: hello admin"), completed()], publish=False)
    response = admin_client_.get(f"/admin/sessions_app/session/{quote(session.pk)}/change/")
    assert response.status_code == 200, (response.status_code, response.get("Location"))
    page = response.content.decode()
    assert "Snapshot" in page and "Context window" in page
    assert "Usage by model" in page and "<td>demo</td>" in page
    assert "hello admin" in page and 'data-role="assistant"' in page
    assert f'href="/sessions/{session.pk}/"' in page and f'href="/review/{session.pk}/"' in page
    assert '"state":' not in page  # no raw projection JSON


def test_the_admin_refuses_to_add_change_or_delete_envelopes(admin_client_: Client, session: Session) -> None:
    envelope = Envelope.objects.get(session=session, seq=1)
    base = f"/admin/sessions_app/envelope/{quote(envelope.pk)}"
    assert admin_client_.get("/admin/sessions_app/envelope/add/").status_code == 403
    assert admin_client_.post(f"{base}/change/", {"type": "SESSION_ERROR", "payload": "{}"}).status_code == 403
    assert admin_client_.post(f"{base}/delete/", {"post": "yes"}).status_code == 403
    response = admin_client_.post(
        "/admin/sessions_app/envelope/", {"action": "delete_selected", "_selected_action": [envelope.pk]}
    )
    assert response.status_code in (200, 302)
    # Nor by deleting the session from the admin (the cascade would take the journal).
    delete_url = f"/admin/sessions_app/session/{quote(session.pk)}/delete/"
    assert admin_client_.post(delete_url, {"post": "yes"}).status_code == 403
    admin_client_.post(
        "/admin/sessions_app/session/", {"action": "delete_selected", "_selected_action": [session.pk], "post": "yes"}
    )
    assert Envelope.objects.get(pk=envelope.pk).payload == envelope.payload
    assert Session.objects.filter(pk=session.pk).exists()


def test_sessions_are_deleted_through_the_delete_action(admin_client_: Client, session: Session) -> None:
    admin_client_.post("/admin/sessions_app/session/", {"action": "delete_sessions", "_selected_action": [session.pk]})
    assert not Session.objects.filter(pk=session.pk).exists()
    assert not Envelope.objects.filter(session_id=session.pk).exists()


def _listed(page: str) -> list[str]:
    return re.findall(r'name="_selected_action" value="(ses_\w+)"', page)


def test_session_changelist_query_count_does_not_grow(admin_client_: Client, make_session: Any) -> None:
    def fill(count: int) -> None:
        for _ in range(count):
            s = make_session()
            append(s, [started("penguin facts"), *reply("they swim"), completed()], publish=False)

    fill(3)
    admin_client_.get("/admin/sessions_app/session/")
    # django_session, user, the team filter's teams, the capped count, the page; a search
    # adds its two lookups (an exact session id? a username?). No per-row query.
    for params, queries in (({}, 5), ({"q": "penguin", "status__exact": "completed"}, 7)):
        with CaptureQueriesContext(connection) as few:
            page = admin_client_.get("/admin/sessions_app/session/", params).content.decode()
        assert len(_listed(page)) == 3
        fill(30)
        with CaptureQueriesContext(connection) as more:
            page = admin_client_.get("/admin/sessions_app/session/", params).content.decode()
        assert len(_listed(page)) == 33
        assert len(more) == len(few) == queries, [q["sql"][:80] for q in more.captured_queries]
        Session.objects.all().delete()
        fill(3)


def test_session_changelist_search_is_an_id_a_username_or_words(
    admin_client_: Client, session: Session, make_session: Any, outsider: Any
) -> None:
    append(session, [started("how do penguins swim"), *reply("with flippers"), completed()], publish=False)
    other = make_session(title="penguin in the title only")
    theirs = Session.objects.create(owner=outsider, title="x")

    def search(term: str) -> set[str]:
        response = admin_client_.get("/admin/sessions_app/session/", {"q": term})
        assert response.status_code == 200
        return set(_listed(response.content.decode()))

    assert search(session.pk) == {session.pk}
    assert search(outsider.username) == {theirs.pk}
    assert search("penguin") == {session.pk}  # words: the messages (the default title is the first)
    assert search("flippers") == {session.pk}
    assert search("nothing-matches") == set()
    assert other.pk in search("")


def test_the_changelist_counts_at_most_a_cap(admin_client_: Client, make_session: Any, monkeypatch: Any) -> None:
    monkeypatch.setattr(CappedCountPaginator, "CAP", 4)
    for _ in range(7):
        make_session()
    monkeypatch.setattr(CappedCountPaginator, "SEARCH_CAP", 2)
    for _ in range(7):
        append(make_session(), [started("penguin facts"), *reply("they swim"), completed()], publish=False)
    page = admin_client_.get("/admin/sessions_app/session/", {"p": 2}).content.decode()
    assert re.search(r"4\+\s+sessions", page)
    page = admin_client_.get("/admin/sessions_app/session/", {"q": "penguin"}).content.decode()
    assert re.search(r"2\+\s+sessions", page)
    assert admin_client_.get("/admin/sessions_app/session/", {"p": 5}).status_code in (200, 302)


def test_run_and_review_admins_load(admin_client_: Client, session: Session) -> None:
    for model in ("run", "rating", "reviewqueue", "sharelink", "modelprice", "usagedaily", "reviewmark"):
        assert admin_client_.get(f"/admin/sessions_app/{model}/").status_code == 200, model
