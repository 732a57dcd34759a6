"""A review queue worked by two reviewers: items handed out in turn across adds, every
item with its assignee and state for the queue's creator and the team's moderators,
each reviewer's part and when it is done, and reassigning (creator and moderators only).
And the review timeline keeps a tool result after its ask.

Team "crew": carol and dave review, mona moderates, rita (a reviewer) creates the queue
and is not one of its reviewers; an outsider.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.test import Client

from sectr.events import EventType
from sectr.journal import NewEvent
from sessions_app import actions as team_actions
from sessions_app.journal import DatabaseJournal
from sessions_app.models import ReviewQueue, ReviewQueueItem, Session, Team
from sessions_app.review import actions
from tests.server.chat.test_web import append, asked, completed, reply, started
from tests.server.conftest import make_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def people(db: None) -> dict[str, Any]:
    team_actions.do_create_team("crew")
    users = {name: make_user(name) for name in ("carol", "dave", "mona", "rita", "owner", "outsider")}
    for name, role in (("carol", "reviewer"), ("dave", "reviewer"), ("mona", "moderator"), ("rita", "reviewer")):
        team_actions.do_set_membership("crew", name, role)
    team_actions.do_set_membership("crew", "owner", "member")
    return users


def new_session(owner: Any, title: str) -> Session:
    session = Session.objects.create(owner=owner, team=Team.objects.get(name="crew"), title=title)
    DatabaseJournal(publish=False).append_sync(session.pk, [NewEvent(EventType.SESSION_CREATED, {"title": title})])
    return session


@pytest.fixture
def sessions(people: dict[str, Any]) -> list[Session]:
    return [new_session(people["owner"], f"s{i}") for i in range(5)]


@pytest.fixture
def queue(people: dict[str, Any]) -> ReviewQueue:
    client = web(people["rita"])
    response = client.post("/review/queues/", {"team": "crew", "name": "Weekly", "reviewers": "dave, carol"})
    assert response.status_code == 302
    return ReviewQueue.objects.get(name="Weekly")


def web(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def add_one(user: Any, queue: ReviewQueue, session: Session) -> str:
    """Add one session from its review page, as a person does; the message shown."""
    client = web(user)
    here = f"/review/{session.pk}/"
    response = client.post("/review/queues/add", {"queue": queue.pk, "session_id": session.pk, "next": here})
    assert response.status_code == 302
    page = client.get(response["Location"]).content.decode()
    found = re.search(r'<li class="flash flash-success">(.*?)</li>', page)
    assert found is not None, page
    return found.group(1)


def assignees(queue: ReviewQueue) -> list[str]:
    items = ReviewQueueItem.objects.filter(queue=queue).select_related("assignee").order_by("position")
    return [item.assignee.get_username() if item.assignee else "" for item in items]


def test_sessions_added_one_at_a_time_go_to_each_reviewer_in_turn(
    people: dict[str, Any], queue: ReviewQueue, sessions: list[Session]
) -> None:
    first = people["carol"] if people["carol"].pk < people["dave"].pk else people["dave"]
    second = people["dave"] if first is people["carol"] else people["carol"]
    messages = [add_one(people["rita"], queue, s) for s in sessions[:3]]
    names = [first.get_username(), second.get_username(), first.get_username()]
    assert assignees(queue) == names
    assert messages == [f"Added 1 session to Weekly, assigned to {name} (1)." for name in names]
    # A batch goes on from the cursor, too, and says who got how many.
    result = actions.do_add_to_queue(people["mona"], queue.pk, sessions[3:])
    assert result.assigned == {second.get_username(): 1, first.get_username(): 1}
    assert assignees(queue) == [*names, second.get_username(), first.get_username()]
    queue.refresh_from_db()
    assert queue.last_assignee_id == first.pk


def test_the_round_robin_goes_on_after_a_reviewer_leaves_the_queue(
    people: dict[str, Any], queue: ReviewQueue, sessions: list[Session]
) -> None:
    actions.do_add_to_queue(people["rita"], queue.pk, sessions[:1])
    last = queue.reviewers.order_by("pk").first()
    assert last is not None
    queue.reviewers.remove(last)
    actions.do_add_to_queue(people["rita"], queue.pk, sessions[1:3])
    remaining = queue.reviewers.get().get_username()
    assert assignees(queue) == [last.get_username(), remaining, remaining]


@pytest.mark.parametrize("who", ["rita", "mona"])
def test_the_creator_and_moderators_see_every_item_with_its_assignee_and_state(
    people: dict[str, Any], queue: ReviewQueue, sessions: list[Session], who: str
) -> None:
    actions.do_add_to_queue(people["rita"], queue.pk, sessions[:4])
    carols = ReviewQueueItem.objects.filter(queue=queue, assignee=people["carol"]).order_by("position")
    for item in carols:
        actions.do_mark_item_done(people["carol"], item.pk)
    html = web(people[who]).get(f"/review/queues/{queue.pk}/").content.decode()
    rows = re.findall(r'<tr data-item="\d+" data-assignee="(\w*)">', html)
    assert sorted(rows) == ["carol", "carol", "dave", "dave"]
    assert html.count(">done</span>") == 2 and html.count(">open</span>") == 2
    assert "2 of 4 done." in html and "2 left for dave." in html
    assert "Created by</dt><dd>rita" in html
    assert html.count("Reassign</button>") == 4


def test_a_reviewer_sees_their_items_and_when_their_part_is_done(
    people: dict[str, Any], queue: ReviewQueue, sessions: list[Session]
) -> None:
    actions.do_add_to_queue(people["rita"], queue.pk, sessions[:5])
    client = web(people["carol"])
    mine = list(ReviewQueueItem.objects.filter(queue=queue, assignee=people["carol"]).order_by("position"))
    dave_count = ReviewQueueItem.objects.filter(queue=queue, assignee=people["dave"]).count()
    html = client.get(f"/review/queues/{queue.pk}/").content.decode()
    assert len(re.findall(r"<tr data-item=", html)) == len(mine)
    assert "Reassign" not in html
    for item in mine:
        response = client.post(f"/review/queue-items/{item.pk}/done", {"next": f"/review/queues/{queue.pk}/"})
    page = client.get(response["Location"]).content.decode()
    noun = "items are" if len(mine) != 1 else "item is"
    expected = f"Your {len(mine)} {noun} done; {dave_count} left for dave."
    assert expected in page  # in the flash after the last one, and on the queue page
    assert page.count(expected) == 2
    review_page = client.get(f"/review/{mine[0].session_id}/?queue={queue.pk}").content.decode()
    assert expected in review_page


def test_the_creator_and_moderators_reassign_and_nobody_else(
    people: dict[str, Any], queue: ReviewQueue, sessions: list[Session]
) -> None:
    actions.do_add_to_queue(people["rita"], queue.pk, sessions[:2])
    item = ReviewQueueItem.objects.filter(queue=queue).order_by("position").first()
    assert item is not None
    other = "dave" if item.assignee == people["carol"] else "carol"
    before = assignees(queue)
    here = f"/review/queues/{queue.pk}/"
    assert web(people["carol"]).post(f"/review/queue-items/{item.pk}/assign", {"assignee": other}).status_code == 403
    assert web(people["dave"]).post(f"/review/queue-items/{item.pk}/assign", {"assignee": other}).status_code == 403
    assert web(people["outsider"]).post(f"/review/queue-items/{item.pk}/assign", {"assignee": other}).status_code in (
        403,
        404,
    )
    # Someone who does not review the team cannot be given an item.
    rita = web(people["rita"])
    refused = rita.post(f"/review/queue-items/{item.pk}/assign", {"assignee": "owner", "next": here})
    assert refused.status_code == 302
    assert "owner is not a reviewer of team crew" in rita.get(refused["Location"]).content.decode()
    assert assignees(queue) == before
    for who, to in (("rita", other), ("mona", "")):
        response = web(people[who]).post(f"/review/queue-items/{item.pk}/assign", {"assignee": to, "next": here})
        assert response.status_code == 302
        item.refresh_from_db()
        assert (item.assignee.get_username() if item.assignee else "") == to


def test_the_outsider_gets_404_for_the_queue_and_its_items(
    people: dict[str, Any], queue: ReviewQueue, sessions: list[Session]
) -> None:
    actions.do_add_to_queue(people["rita"], queue.pk, sessions[:1])
    item = ReviewQueueItem.objects.get(queue=queue)
    outsider = web(people["outsider"])
    assert outsider.get(f"/review/queues/{queue.pk}/").status_code in (403, 404)
    assert outsider.post(f"/review/queue-items/{item.pk}/done").status_code in (403, 404)
    assert ReviewQueueItem.objects.get(pk=item.pk).done_at is None


# ---- the timeline's order ----


def test_a_tool_result_stands_after_its_ask_and_decision_on_the_review_page(people: dict[str, Any]) -> None:
    session = new_session(people["owner"], "gated")
    append(session, [started("note it"), *asked(inv="inv_1", mid="m1")], publish=False)
    decision = {
        "kind": "approval_decision",
        "ask_id": "ask_1",
        "decision": {"approved": True, "approver": "mona", "verdict": "allow_once"},
    }
    append(
        session,
        [
            NewEvent(EventType.INVOCATION_STARTED, {"reason": decision}, "inv_2"),
            NewEvent(
                EventType.TOOL_RESULT,
                {"tool_call_id": "call_1", "name": "write_note", "content": "saved note 7", "is_error": False},
                "inv_2",
            ),
            *reply("Done.", inv="inv_2", mid="m2"),
            completed("inv_2"),
        ],
        publish=False,
    )
    html = web(people["carol"]).get(f"/review/{session.pk}/").content.decode()
    seqs = [int(s) for s in re.findall(r'<li id="seq-\d+" class="tl[^"]*"[^>]*data-seq="(\d+)"', html)]
    assert seqs == sorted(seqs)
    ask = html.index("Approval asked")
    decided = html.index("Decision: <strong>allow_once</strong>")
    result = html.index("saved note 7")
    assert ask < decided < result
    result_seq = session.envelopes.get(type="TOOL_RESULT").seq
    assert f'<a href="#seq-{result_seq}">Result at #{result_seq}</a>' in html
    markdown = web(people["carol"]).get(f"/review/{session.pk}/export.markdown").content.decode()
    assert markdown.index("Approval asked") < markdown.index("saved note 7")
