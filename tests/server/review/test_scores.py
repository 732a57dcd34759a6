"""A team's own scores (docs/review.md, "Scores"): moderators define them (team page and
API), reviewers rate sessions and messages with them (review page and API), and they
show in exports, the review search and the dashboard. Bad input is a 400 that changes
nothing; outsiders get 404; members and reviewers may not define scores (403).

Standing users: owner (member of crew, owns the sessions), member, reviewer, moderator,
staff; outsider (moderator of another team).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from sectr.events import EventType
from sectr.journal import NewEvent
from sessions_app.actions.tokens import do_issue_token
from sessions_app.journal import DatabaseJournal
from sessions_app.models import Rating, ScoreConfig, Session, Team
from sessions_app.review import actions, export, scores
from tests.server.chat.test_web import append, completed, reply, started
from tests.server.conftest import crew_people

ROLES = ("outsider", "member", "reviewer", "moderator", "staff")
HELPFULNESS = {"name": "helpfulness", "kind": "categorical", "labels": ["good", "partly", "bad"]}
ACCURACY = {"name": "accuracy", "kind": "numeric", "minimum": 0, "maximum": 10, "description": "Facts right"}
POLITE = {"name": "polite", "kind": "boolean"}


@pytest.fixture
def people(db: None) -> dict[str, Any]:
    return crew_people()


@pytest.fixture
def crew_scores(people: dict[str, Any]) -> list[scores.ScoreDef]:
    return [scores.do_create_score(people["moderator"], "crew", d) for d in (HELPFULNESS, ACCURACY, POLITE)]


def new_session(owner: Any, title: str, answer: str = "hello there") -> Session:
    session = Session.objects.create(owner=owner, team=Team.objects.get(name="crew"), title=title)
    DatabaseJournal(publish=False).append_sync(session.pk, [NewEvent(EventType.SESSION_CREATED, {"title": title})])
    append(session, [started("hi"), *reply(answer, mid="msg_1"), completed()], publish=False)
    return session


@pytest.fixture
def session(people: dict[str, Any]) -> Session:
    return new_session(people["owner"], "first")


def web(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def api(user: Any) -> Client:
    return Client(HTTP_AUTHORIZATION=f"Bearer {do_issue_token(user, 't')[1]}")


def state() -> Any:
    return (
        sorted(ScoreConfig.objects.values_list("name", "kind", "labels", "minimum", "maximum", "description")),
        sorted(Rating.objects.values_list("author__username", "seq", "thumbs", "score", "values")),
    )


# ---- defining scores: the role matrix ----


@pytest.mark.parametrize("role", ROLES)
def test_only_moderators_define_scores_through_the_api(people: dict[str, Any], role: str) -> None:
    client = api(people[role])
    response = client.post("/api/v1/teams/crew/scores", HELPFULNESS, content_type="application/json")
    expected = {"outsider": 404, "member": 403, "reviewer": 403, "moderator": 201, "staff": 201}[role]
    assert response.status_code == expected, response.content
    if expected == 201:
        assert response.json() == {
            "name": "helpfulness",
            "kind": "categorical",
            "labels": ["good", "partly", "bad"],
            "description": "",
            "built_in": False,
        }
    else:
        assert not ScoreConfig.objects.exists()
    listed = client.get("/api/v1/teams/crew/scores")
    if role == "outsider":
        assert listed.status_code == 404
    else:
        names = [s["name"] for s in listed.json()["scores"]]
        assert names == ["thumbs", "score", *(["helpfulness"] if expected == 201 else [])]


@pytest.mark.parametrize("role", ROLES)
def test_only_moderators_change_and_delete_scores(
    people: dict[str, Any], crew_scores: list[scores.ScoreDef], role: str
) -> None:
    client = api(people[role])
    before = state()
    changed = client.put(
        "/api/v1/teams/crew/scores/accuracy", {"minimum": 1, "maximum": 5}, content_type="application/json"
    )
    deleted = client.delete("/api/v1/teams/crew/scores/polite")
    if role in ("moderator", "staff"):
        assert changed.status_code == 200 and changed.json()["maximum"] == 5
        assert deleted.status_code == 204
        assert sorted(ScoreConfig.objects.values_list("name", flat=True)) == ["accuracy", "helpfulness"]
    else:
        assert (changed.status_code, deleted.status_code) == ((404, 404) if role == "outsider" else (403, 403))
        assert state() == before


@pytest.mark.parametrize("role", ROLES)
def test_the_team_pages_scores_section_is_for_everyone_and_its_forms_for_moderators(
    people: dict[str, Any], crew_scores: list[scores.ScoreDef], role: str
) -> None:
    client = web(people[role])
    page = client.get("/teams/crew/")
    if role == "outsider":
        assert page.status_code == 404
    else:
        html = page.content.decode()
        assert '<h2 id="scores-title">Scores</h2>' in html and 'href="#scores"' in html
        assert "helpfulness" in html and "good, partly, bad" in html and "0 to 10" in html
        assert ("Add score" in html) is (role in ("moderator", "staff"))
    before = state()
    response = client.post("/teams/crew/scores/new", {"name": "tone", "kind": "categorical", "labels": "warm, cold"})
    if role in ("moderator", "staff"):
        assert response.status_code == 302
        assert ScoreConfig.objects.get(name="tone").labels == ["warm", "cold"]
    else:
        assert response.status_code == (404 if role == "outsider" else 403)
        assert state() == before


@pytest.mark.parametrize(
    "bad",
    [
        {"name": "thumbs", "kind": "boolean"},  # a built-in's name
        {"name": "Bad Name", "kind": "boolean"},
        {"name": "x", "kind": "stars"},
        {"name": "x", "kind": "categorical", "labels": ["only"]},
        {"name": "x", "kind": "categorical"},
        {"name": "x", "kind": "numeric", "minimum": 5, "maximum": 5},
        {"name": "x", "kind": "numeric", "minimum": 1},
        {"name": "x", "kind": "numeric", "minimum": "one", "maximum": 2},
        {"name": "x", "kind": "boolean", "labels": ["a", "b"]},
        {"name": "x", "kind": "boolean", "minimum": 1, "maximum": 2},
        {"name": "x", "kind": "boolean", "colour": "red"},
        {"name": "x", "kind": "boolean", "description": "d" * 501},
    ],
)
def test_a_bad_definition_is_a_400_and_changes_nothing(people: dict[str, Any], bad: dict[str, Any]) -> None:
    response = api(people["moderator"]).post("/api/v1/teams/crew/scores", bad, content_type="application/json")
    assert response.status_code == 400, response.content
    assert response.json()["error"]["code"] in ("invalid_score", "invalid_body")
    assert not ScoreConfig.objects.exists()


def test_a_second_score_of_the_same_name_is_a_409_and_name_and_kind_never_change(
    people: dict[str, Any], crew_scores: list[scores.ScoreDef]
) -> None:
    client = api(people["moderator"])
    before = state()
    again = client.post("/api/v1/teams/crew/scores", POLITE, content_type="application/json")
    assert again.status_code == 409 and again.json()["error"]["code"] == "score_exists"
    kind = client.put("/api/v1/teams/crew/scores/polite", {"kind": "numeric"}, content_type="application/json")
    assert kind.status_code == 400
    built_in = client.put("/api/v1/teams/crew/scores/thumbs", {"description": "x"}, content_type="application/json")
    assert built_in.status_code == 400
    assert client.delete("/api/v1/teams/crew/scores/nope").status_code == 404
    assert state() == before


# ---- rating ----


def test_reviewers_rate_a_session_and_a_message_with_the_teams_scores_through_the_api(
    people: dict[str, Any], crew_scores: list[scores.ScoreDef], session: Session
) -> None:
    client = api(people["reviewer"])
    url = f"/api/v1/sessions/{session.pk}/ratings"
    whole = client.post(
        url,
        {"scores": {"thumbs": True, "helpfulness": "good", "accuracy": 7}, "tags": ["clear"], "comment": "fine"},
        content_type="application/json",
    )
    assert whole.status_code == 200, whole.content
    assert whole.json()["scores"] == {"thumbs": True, "helpfulness": "good", "accuracy": 7}
    one = client.post(
        url, {"message_id": "msg_1", "scores": {"polite": False, "score": 2}}, content_type="application/json"
    )
    assert one.status_code == 200, one.content
    end_seq = session.envelopes.get(type="MESSAGE_END").seq
    assert (one.json()["seq"], one.json()["message_id"], one.json()["scores"]) == (
        end_seq,
        "msg_1",
        {"score": 2, "polite": False},
    )
    listed = client.get(url).json()
    assert [r["scores"] for r in listed["ratings"]] == [
        {"thumbs": True, "helpfulness": "good", "accuracy": 7},
        {"score": 2, "polite": False},
    ]
    assert [s["name"] for s in listed["scores"]] == ["thumbs", "score", "accuracy", "helpfulness", "polite"]
    # Rating again replaces the reviewer's rating of the same thing.
    client.post(url, {"scores": {"helpfulness": "bad"}}, content_type="application/json")
    assert Rating.objects.get(seq=0).values == {"helpfulness": "bad"}


@pytest.mark.parametrize(
    "bad",
    [
        {"scores": {"accuracy": 11}},  # out of range
        {"scores": {"accuracy": -1}},
        {"scores": {"accuracy": 2.5}},  # the range 0-10 is whole numbers
        {"scores": {"accuracy": "high"}},
        {"scores": {"helpfulness": "great"}},  # not one of its labels
        {"scores": {"polite": "maybe"}},
        {"scores": {"tone": "warm"}},  # no such score
        {"scores": {"thumbs": "sideways"}},
        {"scores": {"score": 6}},
        {"scores": {}},  # nothing rated
        {"scores": {"helpfulness": "good"}, "tags": ["x" * 41]},
        {"scores": {"helpfulness": "good"}, "stars": 5},
    ],
)
def test_a_bad_rating_is_a_400_and_changes_nothing(
    people: dict[str, Any], crew_scores: list[scores.ScoreDef], session: Session, bad: dict[str, Any]
) -> None:
    client = api(people["reviewer"])
    url = f"/api/v1/sessions/{session.pk}/ratings"
    client.post(url, {"scores": {"helpfulness": "partly"}}, content_type="application/json")
    before = state()
    response = client.post(url, bad, content_type="application/json")
    assert response.status_code == 400, response.content
    assert state() == before


@pytest.mark.parametrize("role", ROLES)
def test_only_reviewers_rate_and_outsiders_get_404(
    people: dict[str, Any], crew_scores: list[scores.ScoreDef], session: Session, role: str
) -> None:
    body = {"scores": {"helpfulness": "good"}}
    response = api(people[role]).post(f"/api/v1/sessions/{session.pk}/ratings", body, content_type="application/json")
    expected = {"outsider": 404, "member": 403, "reviewer": 200, "moderator": 200, "staff": 200}[role]
    assert response.status_code == expected, response.content
    assert Rating.objects.filter(author=people[role]).exists() is (expected == 200)
    page = web(people[role]).post(f"/review/{session.pk}/rate", {"s.helpfulness": "bad"}, HTTP_HX_REQUEST="true")
    assert page.status_code == {"outsider": 404, "member": 403}.get(role, 200)
    assert api(people[role]).get(f"/api/v1/sessions/{session.pk}/ratings").status_code == {
        "outsider": 404,
        "member": 403,
    }.get(role, 200)


def test_the_review_page_saves_a_rating_in_place_and_shows_a_refusal_in_the_form(
    people: dict[str, Any], crew_scores: list[scores.ScoreDef], session: Session
) -> None:
    client = web(people["reviewer"])
    page = client.get(f"/review/{session.pk}/").content.decode()
    for field in ('name="s.helpfulness"', 'name="s.accuracy"', 'name="s.polite"', 'hx-post="/review/'):
        assert field in page, field
    end_seq = session.envelopes.get(type="MESSAGE_END").seq
    saved = client.post(
        f"/review/{session.pk}/rate",
        {"message_id": "msg_1", "s.helpfulness": "good", "s.accuracy": "8", "thumbs": "up", "next": "/x"},
        HTTP_HX_REQUEST="true",
    )
    assert saved.status_code == 200  # the block itself, not a redirect to the top of the page
    html = saved.content.decode()
    assert html.lstrip().startswith("{#") is False and f'id="rating-{end_seq}"' in html
    assert "Rating saved." in html and "helpfulness <strong>good</strong>" in html
    assert "accuracy <strong>8</strong>" in html
    assert '<option value="good" selected>' in html  # the form keeps the reviewer's values
    before = state()
    refused = client.post(
        f"/review/{session.pk}/rate", {"message_id": "msg_1", "s.accuracy": "11"}, HTTP_HX_REQUEST="true"
    )
    assert refused.status_code == 400
    assert "accuracy is a number from 0 to 10" in refused.content.decode()
    assert 'value="11"' in refused.content.decode()  # what was sent stays in the form
    assert state() == before
    # Without htmx the form still works: a redirect back to the rating.
    plain = client.post(
        f"/review/{session.pk}/rate", {"s.polite": "yes", "next": f"/review/{session.pk}/#rating-session"}
    )
    assert plain.status_code == 302 and plain["Location"] == f"/review/{session.pk}/#rating-session"
    assert Rating.objects.get(seq=0).values == {"polite": True}


def test_ratings_of_before_team_scores_stay_readable(people: dict[str, Any], session: Session) -> None:
    """A rating saved as ratings were (thumbs, 1-5, tags) reads as the built-in scores."""
    Rating.objects.create(session=session, author=people["reviewer"], thumbs=-1, score=3, tags=["slow"])
    listed = api(people["reviewer"]).get(f"/api/v1/sessions/{session.pk}/ratings").json()
    assert listed["ratings"][0]["scores"] == {"thumbs": False, "score": 3}
    assert listed["ratings"][0]["tags"] == ["slow"]
    page = web(people["reviewer"]).get(f"/review/{session.pk}/").content.decode()
    assert "thumbs down" in page and "score <strong>3/5</strong>" in page


def test_a_deleted_score_leaves_the_values_given_with_it(
    people: dict[str, Any], crew_scores: list[scores.ScoreDef], session: Session
) -> None:
    rate(people["reviewer"], session, {"polite": "yes"})
    scores.do_delete_score(people["moderator"], "crew", "polite")
    assert Rating.objects.get().values == {"polite": True}
    assert "polite <strong>yes</strong>" in web(people["reviewer"]).get(f"/review/{session.pk}/").content.decode()


def rate(user: Any, session: Session, values: dict[str, Any], **extra: Any) -> Rating:
    return actions.do_rate(user, session.pk, thumbs=extra.pop("thumbs", None), values=values, **extra)


# ---- exports, search, dashboard ----


def test_exports_carry_the_scores_and_an_import_reads_past_them(
    people: dict[str, Any], crew_scores: list[scores.ScoreDef], session: Session
) -> None:
    rate(people["reviewer"], session, {"helpfulness": "good", "accuracy": 9}, thumbs="up", comment="ok")
    rate(people["moderator"], session, {"polite": "no"}, message_id="msg_1")
    client = web(people["reviewer"])
    document = json.loads(client.get(f"/review/{session.pk}/export.json").content)
    assert [s["name"] for s in document["scores"]] == ["thumbs", "score", "accuracy", "helpfulness", "polite"]
    assert [(r["author"], r["message_id"], r["scores"]) for r in document["ratings"]] == [
        ("reviewer", None, {"thumbs": True, "helpfulness": "good", "accuracy": 9}),
        ("moderator", "msg_1", {"polite": False}),
    ]
    assert document["envelopes"] == export.export_document(session)["envelopes"]
    imported = export.import_session(document, people["owner"])
    assert imported.pk != session.pk and not Rating.objects.filter(session=imported).exists()
    markdown = client.get(f"/review/{session.pk}/export.markdown").content.decode()
    end_seq = session.envelopes.get(type="MESSAGE_END").seq
    assert "## Ratings" in markdown
    assert "- reviewer on the session: thumbs up, accuracy 9, helpfulness good · ok" in markdown
    assert f"- moderator on message #{end_seq}: polite no" in markdown
    api_markdown = api(people["reviewer"]).get(f"/api/v1/sessions/{session.pk}/export?format=markdown")
    assert "polite no" in api_markdown.content.decode()


def test_the_review_search_filters_by_a_score_and_its_value(
    people: dict[str, Any], crew_scores: list[scores.ScoreDef]
) -> None:
    good = new_session(people["owner"], "good one")
    bad = new_session(people["owner"], "bad one")
    unrated = new_session(people["owner"], "unrated one")
    rate(people["reviewer"], good, {"helpfulness": "good", "accuracy": 9, "polite": "yes"}, thumbs="up")
    rate(people["reviewer"], bad, {"helpfulness": "bad", "accuracy": 2, "polite": "no"}, score=2)
    client = web(people["reviewer"])

    def found(**query: str) -> set[str]:
        page = client.get("/review/", query).content.decode()
        return {s.title for s in (good, bad, unrated) if f'data-session="{s.pk}"' in page}

    assert found() == {"good one", "bad one", "unrated one"}
    assert found(score="helpfulness") == {"good one", "bad one"}
    assert found(score="helpfulness", score_value="good") == {"good one"}
    assert found(score="accuracy", score_value=">=5") == {"good one"}
    assert found(score="accuracy", score_value="<5") == {"bad one"}
    assert found(score="accuracy", score_value="2") == {"bad one"}
    assert found(score="polite", score_value="no") == {"bad one"}
    assert found(score="polite", score_value="yes") == {"good one"}
    assert found(score="thumbs", score_value="up") == {"good one"}
    assert found(score="score", score_value="<=2") == {"bad one"}
    page = client.get("/review/", {"score": "Not A Name"}).content.decode()
    assert "is not a score&#x27;s name; ignored" in page and f'data-session="{unrated.pk}"' in page
    assert '<option value="helpfulness">helpfulness</option>' in client.get("/review/").content.decode()


def test_the_dashboard_counts_labels_and_averages_numbers_per_score(
    people: dict[str, Any], crew_scores: list[scores.ScoreDef]
) -> None:
    one = new_session(people["owner"], "one")
    two = new_session(people["owner"], "two")
    rate(people["reviewer"], one, {"helpfulness": "good", "accuracy": 9}, thumbs="up")
    rate(people["moderator"], one, {"helpfulness": "good", "accuracy": 6}, thumbs="down")
    rate(people["reviewer"], two, {"helpfulness": "bad", "polite": "yes"}, score=4)
    board = scores.dashboard(people["reviewer"], *_today_range())
    by_name = {s.name: s for s in board.summaries}
    assert board.ratings == 3
    assert by_name["helpfulness"].counts == {"good": 2, "partly": 0, "bad": 1}
    assert by_name["accuracy"].average == 7.5 and by_name["accuracy"].count == 2
    assert by_name["thumbs"].counts == {"up": 1, "down": 1}
    assert by_name["score"].average == 4
    assert by_name["polite"].counts == {"yes": 1, "no": 0}
    html = web(people["reviewer"]).get("/review/usage/").content.decode()
    assert "Review scores" in html and "average <strong>7.50</strong>" in html and "good: <strong>2</strong>" in html
    # An outsider's dashboard has none of crew's ratings.
    assert scores.dashboard(people["outsider"], *_today_range()).ratings == 0


def _today_range() -> tuple[Any, Any]:
    today = timezone.now().date()
    return today, today
