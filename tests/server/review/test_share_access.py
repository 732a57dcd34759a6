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


# ---- what a link that shows nothing says ----


def _gone(client: Client, link: str) -> str:
    page = client.get(link)
    assert page.status_code == 404
    assert page["Cache-Control"] == "no-store"
    text = page.content.decode()
    assert "alpha transcript" not in text
    return text


def test_a_revoked_link_says_it_was_revoked(cast: Cast) -> None:
    actions.do_revoke_share(cast.people["creator"], cast.share.pk)
    assert "This share link was revoked" in _gone(Client(), cast.link())


def test_an_expired_link_says_it_expired_and_when(cast: Cast) -> None:
    ShareLink.objects.filter(pk=cast.share.pk).update(expires_at="2026-01-02T03:04:00Z")
    text = _gone(Client(), cast.link())
    assert "This share link has expired" in text and "2026-01-02 03:04" in text


def test_a_link_whose_maker_left_says_it_no_longer_works(cast: Cast) -> None:
    Membership.objects.filter(user=cast.people["creator"]).delete()
    assert "This share link no longer works" in _gone(Client(), cast.link())


def test_a_link_for_signed_in_readers_offers_a_log_in_that_comes_back(cast: Cast) -> None:
    ShareLink.objects.filter(pk=cast.share.pk).update(require_login=True)
    text = _gone(Client(), cast.link())
    assert "Log in to read this shared conversation" in text
    assert f'href="/accounts/login/?next=/share/{cast.share.token}/"' in text.replace("%2F", "/")
    assert logged_in(cast.people["outsider"]).get(cast.link()).status_code == 200


@pytest.mark.parametrize("token", ["x" * 32, "short", "y" * 65])
def test_an_unknown_link_says_there_is_no_such_link(cast: Cast, token: str) -> None:
    assert "No such share link" in _gone(Client(), f"/share/{token}/")


def test_refusals_are_pages_of_the_site_with_their_reason(cast: Cast) -> None:
    outsider = logged_in(cast.people["outsider"])
    refused = outsider.get("/review/")
    assert refused.status_code == 403
    text = refused.content.decode()
    assert "Not allowed" in text and "Team review is for reviewers and moderators of a team" in text
    assert 'aria-label="Main"' in text  # the site's menu, not a bare error
    missing = outsider.get(f"/sessions/{cast.session.pk}/")
    assert missing.status_code == 404 and "Nothing here" in missing.content.decode()
    assert "alpha transcript" not in missing.content.decode()
