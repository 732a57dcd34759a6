"""Share links follow access: a link works only while the person who made it may still
review (and so share) the session, and a team's moderators list and revoke every link of
their team's sessions, whoever made it; nobody else can.

Team "alpha": the owner (a member), a reviewer who makes the link, a moderator; team
"beta": a moderator; staff; an outsider.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from django.test import Client

from sectr.errors import NotFound
from sessions_app.models import Membership, Session, ShareLink, Team
from sessions_app.review import actions
from tests.server.chat.test_web import logged_in
from tests.server.conftest import make_user

pytestmark = pytest.mark.django_db


@dataclass
class Cast:
    people: dict[str, Any]
    session: Session
    share: ShareLink

    def link(self) -> str:
        return f"/share/{self.share.token}/"


def _in_team(team: Team, user: Any, role: str) -> Any:
    Membership.objects.update_or_create(team=team, user=user, defaults={"role": role})
    return type(user).objects.get(pk=user.pk)


@pytest.fixture
def cast(db: None) -> Cast:
    alpha, beta = Team.objects.create(name="alpha"), Team.objects.create(name="beta")
    people = {
        "owner": _in_team(alpha, make_user("owner"), "member"),
        "creator": _in_team(alpha, make_user("sharer"), "reviewer"),
        "alpha reviewer": _in_team(alpha, make_user("arev"), "reviewer"),
        "alpha moderator": _in_team(alpha, make_user("amod"), "moderator"),
        "beta moderator": _in_team(beta, make_user("bmod"), "moderator"),
        "outsider": make_user("nobody"),
        "staff": make_user("boss"),
    }
    people["staff"].is_staff = True
    people["staff"].save(update_fields=["is_staff"])
    session = Session.objects.create(owner=people["owner"], team=alpha, title="alpha transcript")
    share = actions.do_create_share(people["creator"], session.pk)
    return Cast(people, session, share)


def test_the_link_works_while_its_creator_reviews_the_session(cast: Cast) -> None:
    assert Client().get(cast.link()).status_code == 200


def test_the_link_stops_when_its_creator_leaves_the_team(cast: Cast) -> None:
    Membership.objects.filter(user=cast.people["creator"]).delete()
    assert Client().get(cast.link()).status_code == 404
    with pytest.raises(NotFound):
        actions.live_share(cast.share.token, cast.people["owner"])


def test_the_link_stops_when_its_creator_is_demoted_below_reviewer(cast: Cast) -> None:
    Membership.objects.filter(user=cast.people["creator"]).update(role="member")
    assert Client().get(cast.link()).status_code == 404
    # Anyone logged in, even staff, gets the same 404: the link is what stopped.
    assert logged_in(cast.people["staff"]).get(cast.link()).status_code == 404


def test_the_link_stops_when_its_creator_is_deactivated(cast: Cast) -> None:
    creator = cast.people["creator"]
    creator.is_active = False
    creator.save(update_fields=["is_active"])
    assert Client().get(cast.link()).status_code == 404


def test_the_link_stops_when_the_session_moves_out_of_the_creators_reach(cast: Cast) -> None:
    Session.objects.filter(pk=cast.session.pk).update(team=Team.objects.get(name="beta"))
    assert Client().get(cast.link()).status_code == 404


def test_the_creators_page_shows_a_stopped_link_as_stopped(cast: Cast) -> None:
    client = logged_in(cast.people["creator"])
    assert '<span class="state state-completed">active</span>' in client.get("/settings/shares/").content.decode()
    Membership.objects.filter(user=cast.people["creator"]).update(role="member")
    page = client.get("/settings/shares/").content.decode()
    assert ">stopped</span>" in page and ">active</span>" not in page


@pytest.mark.parametrize("who", ["alpha moderator", "staff"])
def test_alphas_moderators_and_staff_list_and_revoke_every_link_of_alphas_sessions(cast: Cast, who: str) -> None:
    client = logged_in(cast.people[who])
    page = client.get("/settings/shares/").content.decode()
    assert "Share links of your teams' sessions" in page
    team_part = page.split('id="team-shares"')[1]
    assert f'data-team-share="{cast.share.pk}"' in team_part
    assert "alpha transcript" in team_part and "sharer" in team_part and "Revoke" in team_part
    assert cast.share.token not in page  # the token is the credential: never shown to them
    response = client.post(f"/settings/shares/{cast.share.pk}/revoke")
    assert response.status_code == 302
    assert ShareLink.objects.get(pk=cast.share.pk).revoked_at is not None
    assert Client().get(cast.link()).status_code == 404


@pytest.mark.parametrize("who", ["beta moderator", "alpha reviewer", "owner", "outsider"])
def test_nobody_else_lists_or_revokes_the_link(cast: Cast, who: str) -> None:
    client = logged_in(cast.people[who])
    page = client.get("/settings/shares/").content.decode()
    assert f'data-team-share="{cast.share.pk}"' not in page and "alpha transcript" not in page
    assert client.post(f"/settings/shares/{cast.share.pk}/revoke").status_code == 404
    assert ShareLink.objects.get(pk=cast.share.pk).revoked_at is None
    assert Client().get(cast.link()).status_code == 200


def test_the_creator_still_revokes_their_own_link_after_leaving_the_team(cast: Cast) -> None:
    Membership.objects.filter(user=cast.people["creator"]).delete()
    assert logged_in(cast.people["creator"]).post(f"/settings/shares/{cast.share.pk}/revoke").status_code == 302
    assert ShareLink.objects.get(pk=cast.share.pk).revoked_at is not None
