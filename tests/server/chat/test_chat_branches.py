"""Regenerate and Edit (forks at the seq before a user message, with a run in the fork),
the sessions search, highlighting, the favicon, and the account pages (issue 13).

No worker runs here: a queued Run row and its INVOCATION_STARTED are what the actions
promise; the browser tests (tests/browser/test_chat_ui.py) watch the answers arrive.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.test import Client

from sectr.errors import NotAtTurnBoundary, ValidationFailed
from sectr.events import EventType
from sessions_app import actions
from sessions_app.models import Envelope, Run, Session
from tests.server.chat.test_web import HTMX, append, chat_url, completed, logged_in, reply, started
from tests.server.conftest import join_team

pytestmark = pytest.mark.django_db


def two_turns(session: Session) -> tuple[int, int]:
    """Journal two answered turns; the seqs of the two user messages."""
    first = append(session, [started("one"), *reply("You said: one"), completed()])[0].seq
    second = append(
        session, [started("two", inv="inv_2"), *reply("You said: two", inv="inv_2", mid="msg_2"), completed("inv_2")]
    )[0].seq
    return first, second


def user_messages(session: Session) -> list[Any]:
    rows = Envelope.objects.filter(session=session, type=EventType.INVOCATION_STARTED.value).order_by("seq")
    return [row.payload["reason"]["input"]["content"] for row in rows]


def test_regenerate_forks_before_the_last_message_and_sends_it_again(session: Session, owner: Any) -> None:
    _first, second = two_turns(session)
    before = Envelope.objects.filter(session=session).count()
    branch = actions.do_regenerate(owner, session.pk)
    assert branch.pk != session.pk and branch.owner == owner
    assert branch.projection().forked_from == {"session_id": session.pk, "seq": second - 1, "reason": "regenerate"}
    # The fork holds the first turn only, then the same last message starts a new run.
    compacted = Envelope.objects.get(session=branch, type=EventType.TRANSCRIPT_COMPACTED.value)
    assert [m.get("content") for m in compacted.payload["messages"]] == ["one", "You said: one"]
    assert user_messages(branch) == ["two"]
    run = Run.objects.get(session=branch)
    assert run.status == Run.QUEUED and run.reason["input"]["content"] == "two"
    assert branch.title == session.title
    # The source is untouched (append-only): the earlier answer stays where it was.
    assert Envelope.objects.filter(session=session).count() == before


def test_regenerate_is_refused_mid_run_and_without_a_message(session: Session, owner: Any) -> None:
    with pytest.raises(ValidationFailed):
        actions.do_regenerate(owner, session.pk)
    append(session, [started("!slow 5"), *reply("tick 1 ", end=False)])
    with pytest.raises(NotAtTurnBoundary):
        actions.do_regenerate(owner, session.pk)
    assert Session.objects.count() == 1


def test_edit_forks_at_that_message_and_sends_the_edited_text(session: Session, owner: Any) -> None:
    first, _second = two_turns(session)
    branch = actions.do_edit_message(owner, session.pk, first, "uno")
    assert branch.projection().forked_from == {"session_id": session.pk, "seq": first - 1, "reason": "edit"}
    compacted = Envelope.objects.get(session=branch, type=EventType.TRANSCRIPT_COMPACTED.value)
    assert compacted.payload["messages"] == []  # nothing before the first message
    assert user_messages(branch) == ["uno"]
    assert user_messages(session) == ["one", "two"]


def test_edit_refuses_a_seq_that_is_not_a_user_message_and_an_empty_text(session: Session, owner: Any) -> None:
    first, _second = two_turns(session)
    for seq, text in ((first + 1, "x"), (1, "x"), (10_000, "x"), (first, "  ")):
        with pytest.raises(ValidationFailed):
            actions.do_edit_message(owner, session.pk, seq, text)
    assert Session.objects.count() == 1


def test_regenerate_and_edit_views_open_the_branch_and_the_pages_link_both_ways(
    owner_client: Client, session: Session, owner: Any
) -> None:
    first, second = two_turns(session)
    html = owner_client.get(chat_url(session)).content.decode()
    assert re.search(r"<button[^>]*>Regenerate</button>", html)
    assert html.count(">Edit</button>") == 2 and html.count(">Copy</button>") == 4
    response = owner_client.post(f"/sessions/{session.pk}/regenerate", **HTMX)
    regenerated = Session.objects.exclude(pk=session.pk).get()
    assert response["HX-Redirect"] == chat_url(regenerated)
    response = owner_client.post(f"/sessions/{session.pk}/edit", {"seq": first, "content": "uno"}, **HTMX)
    edited = Session.objects.exclude(pk__in=[session.pk, regenerated.pk]).get()
    assert response["HX-Redirect"] == chat_url(edited)

    page = owner_client.get(chat_url(regenerated)).content.decode()
    assert "Regenerated reply" in page and f'href="{chat_url(session)}"' in page
    assert "Branched from" in page
    page = owner_client.get(chat_url(edited)).content.decode()
    assert "Edited message" in page and f'href="{chat_url(session)}"' in page
    # The source lists its branches, and each on the message it branched at.
    source = owner_client.get(chat_url(session)).content.decode()
    assert f'href="{chat_url(regenerated)}">regenerated #1</a>' in source
    assert f'href="{chat_url(edited)}">edited #1</a>' in source
    assert "Branches" in source
    assert source.index(f"ev-{first}") < source.index("edited #1") < source.index(f"ev-{second}")
    # The sessions list tells branches apart.
    home = owner_client.get("/").content.decode()
    assert home.count("badge-fork") == 2


def test_regenerate_and_edit_refuse_outsiders_and_readers(
    outsider_client: Client, teammate: Any, session: Session
) -> None:
    first, _ = two_turns(session)
    assert outsider_client.post(f"/sessions/{session.pk}/regenerate").status_code == 404
    assert outsider_client.post(f"/sessions/{session.pk}/edit", {"seq": first, "content": "x"}).status_code == 404
    reviewer = logged_in(join_team(teammate, "reviewer", session))
    assert reviewer.post(f"/sessions/{session.pk}/regenerate").status_code == 403
    html = reviewer.get(chat_url(session)).content.decode()
    assert ">Regenerate</button>" not in html and ">Edit</button>" not in html and ">Copy</button>" in html
    assert Session.objects.count() == 1


def test_edit_view_refuses_a_bad_seq(owner_client: Client, session: Session) -> None:
    two_turns(session)
    response = owner_client.post(f"/sessions/{session.pk}/edit", {"seq": "x", "content": "a"}, **HTMX)
    assert response.status_code == 400 and response["HX-Retarget"] == "#flash"
    assert Session.objects.count() == 1


def test_search_finds_titles_and_message_text_of_my_sessions_only(
    owner_client: Client, make_session: Any, outsider: Any
) -> None:
    groceries = make_session(title="Groceries")
    other = make_session(title="Taxes")
    append(other, [started("what about the Quarterly VAT return?"), *reply("ok"), completed()])
    hidden = make_session(outsider, title="Quarterly secrets")
    html = owner_client.get("/sessions/list", {"q": "quarterly"}).content.decode()
    assert chat_url(other) in html and chat_url(groceries) not in html and chat_url(hidden) not in html
    html = owner_client.get("/", {"q": "grocer"}).content.decode()
    assert chat_url(groceries) in html and chat_url(other) not in html
    html = owner_client.get("/sessions/list", {"q": "nothing like it"}).content.decode()
    assert "No session matches" in html


def test_the_chat_page_has_the_sidebar_one_header_and_a_menu(owner_client: Client, session: Session) -> None:
    html = owner_client.get(chat_url(session)).content.decode()
    assert 'id="sidebar"' in html and 'type="search"' in html
    assert '<details class="menu session-menu"' in html and "<summary>Session</summary>" in html
    assert re.search(r"<script(?![^>]*\bsrc=)", html) is None  # no inline script (CSP)
    assert not re.search(r"<[a-z][^>]*\son\w+\s*=", html)  # nor inline handlers


def test_code_is_highlighted_on_the_server_and_stays_sanitised(owner_client: Client, session: Session) -> None:
    text = '```python\ndef f():\n    return "<b>"\n```\n\n<span class="k" onclick="x">no</span>'
    append(session, [started("code please"), *reply(text), completed()])
    html = owner_client.get(chat_url(session)).content.decode()
    assert '<code class="language-python"><span class="k">def</span>' in html
    assert '<span class="s2">"&lt;b&gt;"</span>' in html
    assert '<span class="k" onclick' not in html and "&lt;span" in html


def test_favicon_is_served_without_login(client: Client) -> None:
    response = client.get("/favicon.ico")
    assert response.status_code == 200 and response["Content-Type"] == "image/x-icon"
    assert response.content[:4] == b"\x00\x00\x01\x00"


def test_login_page_names_the_product_and_logout_says_so(client: Client, owner: Any) -> None:
    html = client.get("/accounts/login/").content.decode()
    assert '<p class="product">Sectr</p>' in html and "<h1>Log in</h1>" in html
    client.force_login(owner)
    response = client.post("/accounts/logout/", follow=True)
    assert "You are logged out." in response.content.decode()


def test_password_change_is_linked_and_works(owner: Any) -> None:
    owner.set_password("Old-Secret-1")
    owner.save()
    client = logged_in(owner)
    html = client.get("/").content.decode()
    assert 'href="/accounts/password_change/"' in html
    page = client.get("/accounts/password_change/").content.decode()
    assert "Change password" in page and "site-name" not in page  # ours, not the admin's
    response = client.post(
        "/accounts/password_change/",
        {"old_password": "Old-Secret-1", "new_password1": "An0ther-Secret!", "new_password2": "An0ther-Secret!"},
        follow=True,
    )
    assert "Your password was changed." in response.content.decode()
    owner.refresh_from_db()
    assert owner.check_password("An0ther-Secret!")
