"""Review queues belong to a team: seeing, listing, counting, filling, working and creating
a queue follow that team's roles, and everyone else gets 404 for it.

The standing cast: team "alpha" (a moderator, a reviewer named in the queue, a member),
team "beta" (a moderator), an outsider with no team, and staff. The queue "Weekly" is
alpha's, made by alpha's moderator with alpha's reviewer, holding two of alpha's sessions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from sectr.errors import NotFound, ValidationFailed
from sessions_app.models import Membership, ReviewQueue, ReviewQueueItem, Session, Team
from sessions_app.review import actions
from tests.server.chat.test_web import logged_in
from tests.server.conftest import make_user

pytestmark = pytest.mark.django_db


@dataclass
class Cast:
    people: dict[str, Any]
    alpha_sessions: list[Session]
    beta_session: Session
    queue: ReviewQueue

    def items(self) -> list[ReviewQueueItem]:
        return list(ReviewQueueItem.objects.filter(queue=self.queue).order_by("position"))


def _in_team(team: Team, user: Any, role: str) -> Any:
    Membership.objects.update_or_create(team=team, user=user, defaults={"role": role})
    return type(user).objects.get(pk=user.pk)


@pytest.fixture
def cast(db: None) -> Cast:
    alpha, beta = Team.objects.create(name="alpha"), Team.objects.create(name="beta")
    people = {
        "alpha moderator": _in_team(alpha, make_user("amod"), "moderator"),
        "alpha reviewer": _in_team(alpha, make_user("arev"), "reviewer"),
        "alpha member": _in_team(alpha, make_user("amem"), "member"),
        "beta moderator": _in_team(beta, make_user("bmod"), "moderator"),
        "outsider": make_user("nobody"),
        "staff": make_user("boss"),
    }
    people["staff"].is_staff = True
    people["staff"].save(update_fields=["is_staff"])
    owner = people["alpha member"]
    alpha_sessions = [Session.objects.create(owner=owner, team=alpha, title=f"alpha secret {i}") for i in range(3)]
    beta_session = Session.objects.create(owner=people["beta moderator"], team=beta, title="beta secret")
    queue = actions.do_create_queue(people["alpha moderator"], "Weekly", [people["alpha reviewer"]])
    actions.do_add_to_queue(people["alpha moderator"], queue.pk, alpha_sessions[:2])
    return Cast(people, alpha_sessions, beta_session, queue)


#: who may work alpha's queue (everyone else gets 404 for it)
WORKERS = ("alpha moderator", "alpha reviewer", "staff")
STRANGERS = ("alpha member", "beta moderator", "outsider")


def test_the_queue_is_alphas(cast: Cast) -> None:
    assert cast.queue.team is not None and cast.queue.team.name == "alpha"
    assert len(cast.items()) == 2


@pytest.mark.parametrize("who", WORKERS)
def test_alphas_reviewers_moderators_and_staff_open_list_and_count_the_queue(cast: Cast, who: str) -> None:
    client = logged_in(cast.people[who])
    page = client.get(f"/review/queues/{cast.queue.pk}/")
    assert page.status_code == 200
    assert "alpha secret 0" in page.content.decode() and "alpha secret 1" in page.content.decode()
    listing = client.get("/review/queues/").content.decode()
    assert ">Weekly</a>" in listing
    assert '<td class="num">2</td><td class="num">0</td>' in listing
    assert f'<option value="{cast.queue.pk}">alpha: Weekly</option>' in client.get("/review/").content.decode()


@pytest.mark.parametrize("who", STRANGERS)
def test_the_queue_is_404_to_anyone_without_a_review_role_in_alpha(cast: Cast, who: str) -> None:
    client = logged_in(cast.people[who])
    response = client.get(f"/review/queues/{cast.queue.pk}/")
    assert response.status_code == 404
    assert "alpha secret" not in response.content.decode()
    with pytest.raises(NotFound):
        actions.get_queue_for_user(cast.people[who], cast.queue.pk)


@pytest.mark.parametrize("who", STRANGERS)
def test_the_queue_list_and_the_search_page_never_show_alphas_queue_to_strangers(cast: Cast, who: str) -> None:
    client = logged_in(cast.people[who])
    listing = client.get("/review/queues/")
    search = client.get("/review/")
    if who == "beta moderator":  # a reviewer somewhere: the pages open, without alpha's queue
        assert listing.status_code == 200 and search.status_code == 200
    else:  # no review role anywhere: the review pages are refused altogether
        assert listing.status_code == 403 and search.status_code == 403
    for response in (listing, search):
        assert "Weekly" not in response.content.decode()
    assert cast.queue not in actions.queues_for(cast.people[who])
    # Nor does a session page of beta offer alpha's queue (staff read both teams).
    staff_page = logged_in(cast.people["staff"]).get(f"/review/{cast.beta_session.pk}/").content.decode()
    assert "Weekly" not in staff_page and 'name="queue"' not in staff_page


@pytest.mark.parametrize("who", STRANGERS)
def test_strangers_cannot_mark_alphas_items_done(cast: Cast, who: str) -> None:
    item = cast.items()[0]
    response = logged_in(cast.people[who]).post(f"/review/queue-items/{item.pk}/done", {"done": "1"})
    assert response.status_code == 404
    assert ReviewQueueItem.objects.get(pk=item.pk).done_at is None


@pytest.mark.parametrize("who", WORKERS)
def test_alphas_workers_mark_items_done(cast: Cast, who: str) -> None:
    item = cast.items()[0]
    response = logged_in(cast.people[who]).post(f"/review/queue-items/{item.pk}/done", {"done": "1"})
    assert response.status_code == 302
    assert ReviewQueueItem.objects.get(pk=item.pk).done_at is not None


def test_an_item_assigned_to_someone_else_is_only_for_alphas_moderators(cast: Cast) -> None:
    second = _in_team(cast.queue.team, make_user("arev2"), "reviewer")
    queue = actions.do_create_queue(cast.people["alpha moderator"], "Pairs", [cast.people["alpha reviewer"], second])
    actions.do_add_to_queue(cast.people["alpha moderator"], queue.pk, cast.alpha_sessions[:2])
    theirs = ReviewQueueItem.objects.get(queue=queue, assignee=cast.people["alpha reviewer"])
    # A moderator of another team who is also a reviewer of alpha is no moderator here.
    _in_team(Team.objects.get(name="beta"), second, "moderator")
    assert logged_in(second).post(f"/review/queue-items/{theirs.pk}/done").status_code == 403
    assert logged_in(cast.people["alpha moderator"]).post(f"/review/queue-items/{theirs.pk}/done").status_code == 302


@pytest.mark.parametrize("who", STRANGERS)
def test_strangers_cannot_add_to_alphas_queue(cast: Cast, who: str) -> None:
    client = logged_in(cast.people[who])
    response = client.post("/review/queues/add", {"queue": cast.queue.pk, "session_id": cast.beta_session.pk})
    assert response.status_code == 404
    assert len(cast.items()) == 2


def test_only_alphas_sessions_go_in_alphas_queue(cast: Cast) -> None:
    staff = cast.people["staff"]  # reads every session, beta's too
    assert actions.do_add_to_queue(staff, cast.queue.pk, [cast.beta_session, cast.alpha_sessions[2]])[:2] == (1, 0)
    assert {i.session_id for i in cast.items()} == {s.pk for s in cast.alpha_sessions}


def test_a_queue_is_made_for_a_team_where_its_maker_reviews(cast: Cast) -> None:
    client = logged_in(cast.people["beta moderator"])
    client.post("/review/queues/", {"name": "Sneaky", "team": "alpha"})
    assert not ReviewQueue.objects.filter(name="Sneaky").exists()
    with pytest.raises(ValidationFailed):
        actions.do_create_queue(cast.people["beta moderator"], "Sneaky", team="alpha")
    client.post("/review/queues/", {"name": "Own", "team": "beta"})
    assert ReviewQueue.objects.get(name="Own").team == Team.objects.get(name="beta")
    # staff have several teams: they name one
    with pytest.raises(ValidationFailed):
        actions.do_create_queue(cast.people["staff"], "Which")
    assert actions.do_create_queue(cast.people["staff"], "Which", team="beta").team.name == "beta"


def test_a_queues_reviewers_are_reviewers_of_its_team(cast: Cast) -> None:
    client = logged_in(cast.people["alpha moderator"])
    for who in ("beta moderator", "alpha member", "outsider"):
        username = cast.people[who].get_username()
        page = client.post("/review/queues/", {"name": f"With {username}", "reviewers": username}, follow=True)
        assert f"{username} is not a reviewer of team alpha" in page.content.decode()
        assert not ReviewQueue.objects.filter(name=f"With {username}").exists()
    with pytest.raises(ValidationFailed):
        actions.do_assign(cast.people["alpha moderator"], cast.items()[0].pk, cast.people["beta moderator"])
    assert cast.items()[0].assignee == cast.people["alpha reviewer"]


def test_two_teams_may_each_have_a_queue_of_the_same_name(cast: Cast) -> None:
    # (A clash across teams would also tell beta that alpha has a queue of that name.)
    queue = actions.do_create_queue(cast.people["beta moderator"], "Weekly")
    assert queue.team is not None and queue.team.name == "beta"
    page = logged_in(cast.people["alpha moderator"]).post("/review/queues/", {"name": "Weekly"}, follow=True)
    assert "team alpha has a queue named &#x27;Weekly&#x27; already" in page.content.decode()


def test_losing_the_review_role_in_alpha_loses_the_queue(cast: Cast) -> None:
    reviewer = cast.people["alpha reviewer"]
    _in_team(cast.queue.team, reviewer, "member")
    assert logged_in(reviewer).get(f"/review/queues/{cast.queue.pk}/").status_code == 404
    Membership.objects.filter(user=reviewer).delete()
    _in_team(Team.objects.get(name="beta"), reviewer, "moderator")
    assert logged_in(reviewer).get(f"/review/queues/{cast.queue.pk}/").status_code == 404


# ---- where "Done" leads next ----


def test_then_leads_to_the_next_item_of_the_queue(cast: Cast) -> None:
    first, second = cast.items()
    client = logged_in(cast.people["alpha reviewer"])
    response = client.post(f"/review/queue-items/{first.pk}/done", {"then": str(second.pk)})
    assert response.status_code == 302
    assert response["Location"] == f"/review/{second.session_id}/?queue={cast.queue.pk}"


@pytest.mark.parametrize(
    "then",
    ["a/b", "../../admin", "//evil.example/", "https://evil.example/", "x" * 500, "9" * 500, "-1", "999999", "beta"],
)
def test_then_anywhere_else_goes_back_to_the_review_page(cast: Cast, then: str) -> None:
    if then == "beta":
        # A real item, of another team's queue.
        elsewhere = actions.do_create_queue(cast.people["beta moderator"], "Beta's")
        actions.do_add_to_queue(cast.people["beta moderator"], elsewhere.pk, [cast.beta_session])
        then = str(ReviewQueueItem.objects.get(queue=elsewhere).pk)
    first = cast.items()[0]
    client = logged_in(cast.people["alpha reviewer"])
    response = client.post(f"/review/queue-items/{first.pk}/done", {"then": then})
    assert response.status_code == 302
    assert response["Location"] == "/review/"
    assert ReviewQueueItem.objects.get(pk=first.pk).done_at is not None
