"""The approval queue kept live: the `Approvals` badge on every page, the queue's socket
under every filter, and the queue's fixed number of queries.

Standing users (tests/server/moderation/conftest.py): owner (member of team ops, owns the
sessions), teammate (moderator of ops), outsider (no team), stranger (moderator of
another team, `other`).
"""

from __future__ import annotations

import json
import re
import time
from datetime import timedelta
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from sectr.events import EventType
from sectr.journal import NewEvent
from sessions_app import actions
from sessions_app.journal import get_journal
from sessions_app.models import Membership, Session, Team
from sessions_app.moderation.queue import AGE_CHOICES
from tests.server.chat.test_consumers import connect, frames_until_ready
from tests.server.chat.test_web import HTMX, append, completed, logged_in, started
from tests.server.conftest import SessionFactory, make_user
from tests.server.moderation.test_moderation_ui import pending, team_session

pytestmark = pytest.mark.django_db


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


def test_the_badge_is_the_same_fragment_on_every_page(make_session: SessionFactory, ops: Team, teammate: Any) -> None:
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


# ---- the queue's socket under the `Age` filter ----

AGE = timedelta(seconds=2)  # "older than 1 minute", made short for the test


async def ops_team(teammate: Any) -> Team:
    team = await database_sync_to_async(Team.objects.create)(name="ops")
    await database_sync_to_async(Membership.objects.create)(team=team, user=teammate, role="moderator")
    return team


async def pending_in_new_session(make_session: SessionFactory, team: Team, ask_id: str, **terms: Any) -> Session:
    session = await database_sync_to_async(team_session)(make_session, team, f"session of {ask_id}")
    await database_sync_to_async(pending)(session, ask_id, **terms)
    return session


async def appended_ask_ids(communicator: Any, timeout: float = 15) -> list[str]:
    frame = json.loads(await communicator.receive_from(timeout=timeout))
    assert 'hx-swap-oob="beforeend:#approval-queue"' in frame["html"], frame
    return re.findall(r'<article id="ask-([^"]+)"', frame["html"])


@pytest.mark.django_db(transaction=True)
async def test_with_an_age_filter_a_new_ask_arrives_once_old_enough(
    teammate: Any, make_session: SessionFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(AGE_CHOICES, "1m", AGE)
    team = await ops_team(teammate)
    communicator, connected, _ = await connect(teammate, "/ws/approvals/?age=1m&tool=write_note&team=ops")
    assert connected and await frames_until_ready(communicator) == []
    started = time.monotonic()
    await pending_in_new_session(make_session, team, "ask_young")
    await pending_in_new_session(make_session, team, "ask_other_tool", name="delete_note")
    assert await communicator.receive_nothing(timeout=1.0)  # too young yet
    assert await appended_ask_ids(communicator) == ["ask_young"]  # then it comes of age
    assert time.monotonic() - started >= AGE.total_seconds() - 0.2
    assert await communicator.receive_nothing(timeout=2.5)  # never the other tool's
    await communicator.disconnect()


@pytest.mark.django_db(transaction=True)
async def test_with_an_age_filter_an_ask_decided_while_young_never_shows(
    teammate: Any, make_session: SessionFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(AGE_CHOICES, "1m", AGE)
    team = await ops_team(teammate)
    communicator, connected, _ = await connect(teammate, "/ws/approvals/?age=1m")
    assert connected and await frames_until_ready(communicator) == []
    session = await pending_in_new_session(make_session, team, "ask_quick", approvals_required=2)
    vote = NewEvent(EventType.APPROVAL_VOTED, {"ask_id": "ask_quick", "approver": "someone", "verdict": "allow_once"})
    await database_sync_to_async(append)(session, [vote])
    await database_sync_to_async(actions.do_decide)(teammate, "ask_quick", "deny")
    assert await communicator.receive_nothing(timeout=AGE.total_seconds() + 2.0)  # not on the page: nothing
    await communicator.disconnect()


@pytest.mark.django_db(transaction=True)
async def test_with_an_age_filter_an_ask_made_before_the_page_arrives_once_old_enough(
    teammate: Any, make_session: SessionFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(AGE_CHOICES, "1m", AGE)
    team = await ops_team(teammate)
    await pending_in_new_session(make_session, team, "ask_before")
    await pending_in_new_session(make_session, team, "ask_elsewhere", name="delete_note")
    communicator, connected, _ = await connect(teammate, "/ws/approvals/?age=1m&tool=write_note")
    assert connected and await frames_until_ready(communicator) == []
    assert await appended_ask_ids(communicator) == ["ask_before"]
    assert await communicator.receive_nothing(timeout=2.5)
    await communicator.disconnect()


@pytest.mark.django_db(transaction=True)
async def test_without_an_age_filter_new_asks_still_come_at_once_and_by_team(
    teammate: Any, make_session: SessionFactory, stranger: Any
) -> None:
    team = await ops_team(teammate)
    sockets = {}
    for name, path in (
        ("all", "/ws/approvals/"),
        ("ops", "/ws/approvals/?team=ops"),
        ("other", "/ws/approvals/?team=other"),
    ):
        communicator, connected, _ = await connect(teammate, path)
        assert connected and await frames_until_ready(communicator) == []
        sockets[name] = communicator
    await pending_in_new_session(make_session, team, "ask_now")
    assert await appended_ask_ids(sockets["all"], timeout=5) == ["ask_now"]
    assert await appended_ask_ids(sockets["ops"], timeout=5) == ["ask_now"]
    assert await sockets["other"].receive_nothing(timeout=0.5)
    await database_sync_to_async(actions.do_decide)(teammate, "ask_now", "deny")
    assert 'id="ask-ask_now"' in json.loads(await sockets["ops"].receive_from(timeout=5))["html"]
    assert await sockets["other"].receive_nothing(timeout=0.5)  # not its team: not even the decision
    for communicator in sockets.values():
        await communicator.disconnect()


# ---- catching up at connect: what changed between the page's read and the socket ----


def page_as_of(user: Any) -> str:
    client = Client()
    client.force_login(user)
    match = re.search(r'data-as-of="([^"]+)"', client.get("/approvals/").content.decode())
    assert match
    return match.group(1)


async def frame_after_ready(communicator: Any, timeout: float = 5) -> dict[str, Any]:
    return json.loads(await communicator.receive_from(timeout=timeout))


@pytest.mark.django_db(transaction=True)
async def test_an_ask_made_between_the_page_and_its_socket_makes_the_page_reload(
    teammate: Any, make_session: SessionFactory, stranger: Any
) -> None:
    team = await ops_team(teammate)
    as_of = await database_sync_to_async(page_as_of)(teammate)
    strangers_as_of = await database_sync_to_async(page_as_of)(stranger)
    await pending_in_new_session(make_session, team, "ask_between")  # before either socket
    since = "since=" + as_of.replace("+", "%2B")
    communicator, connected, _ = await connect(teammate, "/ws/approvals/?" + since)
    assert connected and await frames_until_ready(communicator) == []
    assert await frame_after_ready(communicator) == {"stale": True}
    await communicator.disconnect()
    # Not in the stranger's reach, another team's filter, another tool, a later page,
    # a malformed time: nothing to catch up.
    later = await database_sync_to_async(page_as_of)(teammate)
    for user, query in (
        (stranger, "since=" + strangers_as_of.replace("+", "%2B")),
        (teammate, "team=other&" + since),
        (teammate, "tool=delete_note&" + since),
        (teammate, "since=" + later.replace("+", "%2B")),
        (teammate, "since=yesterday"),
    ):
        communicator, connected, _ = await connect(user, "/ws/approvals/?" + query)
        assert connected and await frames_until_ready(communicator) == [], query
        assert await communicator.receive_nothing(timeout=0.5), query
        await communicator.disconnect()


@pytest.mark.django_db(transaction=True)
async def test_an_ask_decided_between_the_page_and_its_socket_makes_the_page_reload(
    teammate: Any, make_session: SessionFactory
) -> None:
    team = await ops_team(teammate)
    await pending_in_new_session(make_session, team, "ask_on_the_page")
    as_of = await database_sync_to_async(page_as_of)(teammate)
    await database_sync_to_async(actions.do_decide)(teammate, "ask_on_the_page", "deny")
    communicator, connected, _ = await connect(teammate, "/ws/approvals/?since=" + as_of.replace("+", "%2B"))
    assert connected and await frames_until_ready(communicator) == []
    assert await frame_after_ready(communicator) == {"stale": True}
    await communicator.disconnect()


# ---- the queue's queries ----


def test_the_queue_renders_in_a_fixed_number_of_queries(make_session: SessionFactory, ops: Team, teammate: Any) -> None:
    client = logged_in(teammate)
    made = 0

    def render(asks: int) -> tuple[int, str]:
        nonlocal made
        for number in range(made, made + asks):
            session = team_session(make_session, ops, f"queue {number}")
            append(session, [started(f"first message {number}", inv=f"inv_0_{number}"), completed(f"inv_0_{number}")])
            pending(session, f"ask_{number}", inv=f"inv_{number}")
        made += asks
        with CaptureQueriesContext(connection) as queries:
            html = client.get("/approvals/").content.decode()
        return len(queries), html

    few, _html = render(3)
    more, html = render(30)
    assert html.count('data-role="approval"') == 33
    # Every card has its own conversation (read in the one batched journal query).
    contexts = dict(re.findall(r'<article id="ask-(ask_\d+)".*?<ol class="ask-context"[^>]*>(.*?)</ol>', html, re.S))
    assert len(contexts) == 33
    for number in range(33):
        context = contexts[f"ask_{number}"]
        assert f"first message {number}<" in context and "note: buy milk" in context, (number, context)
        assert "first message" not in context.replace(f"first message {number}<", ""), context
    assert more == few <= 12, (few, more)


def test_load_ranges_reads_each_session_between_its_seqs(make_session: SessionFactory, ops: Team) -> None:
    first, second, third = (team_session(make_session, ops, name) for name in ("a", "b", "c"))
    pending(first)
    pending(second, "ask_2")
    last = second.envelopes.order_by("-seq").values_list("seq", flat=True).first()
    found = get_journal().load_ranges_sync([(first.pk, 2, 4), (second.pk, 1, 100), (third.pk, 1, 1)])
    assert [e.seq for e in found[first.pk]] == [2, 3] and {e.session_id for e in found[first.pk]} == {first.pk}
    assert [e.seq for e in found[second.pk]] == list(range(1, last + 1))
    assert found[third.pk] == []
