"""Pairwise review (docs/experiments.md, "Pairwise review"): an experiment's pairs sent
to a review queue, judged blind there with per-side scores, counted per candidate; the
role matrix; the API and the Python SDK.

Standing users (tests/server/review/test_experiments.py): owner (member of crew),
reviewer, moderator of crew; outsider (moderator of another team); here also second, a
reviewer of crew.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import Client

from sectr.client import AsyncClient, InvalidRequestError, NotFoundError
from sectr.client import Client as SdkClient
from sectr.errors import Forbidden, NotFound, ValidationFailed
from sessions_app import actions
from sessions_app.actions.tokens import do_issue_token
from sessions_app.experiments import actions as experiments
from sessions_app.experiments import compare
from sessions_app.experiments import queue as pairs
from sessions_app.models import Experiment, PairVerdict, ReviewQueue, ReviewQueueItem, Session
from sessions_app.review import actions as review_actions
from sessions_app.review import scores
from tests.server.api.test_api_support import LiveApi, live_api
from tests.server.review.test_experiments import import_recorded, make_user, people, run_worker

__all__ = ["people"]  # the fixture, shared


@pytest.fixture
def crew(people: dict[str, Any]) -> dict[str, Any]:
    people["second"] = make_user("second")
    actions.do_set_membership("crew", "second", "reviewer")
    scores.do_create_score(
        people["moderator"], "crew", {"name": "clarity", "kind": "numeric", "minimum": 1, "maximum": 5}
    )
    scores.do_create_score(people["moderator"], "crew", {"name": "safe", "kind": "boolean"})
    return people


def experiment_of_two(people: dict[str, Any]) -> tuple[Experiment, list[Session]]:
    sources = [import_recorded(people, "a.txt"), import_recorded(people, "b.txt")]
    experiment = experiments.do_create_experiment(
        people["moderator"],
        "crew",
        name="Trial of v2",
        candidates=[{"agent": "crew/helper", "version": 2}],
        sessions=[s.pk for s in sources],
    )
    run_worker()
    return experiment, sources


def login(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def words_that_name_a_side(experiment: Experiment, sources: list[Session]) -> list[str]:
    """Whatever would tell a reviewer which side is which: the side names, the pages'
    labels for them, every session id of the pairs and the candidate's name."""
    ids = [s.pk for s in sources] + list(experiment.replays.values_list("session_id", flat=True))
    return ["baseline", "candidate", "recorded", "Replay of", "crew/helper", "helper v2", *ids]


@pytest.mark.django_db(transaction=True)
def test_a_moderator_sends_pairs_a_reviewer_judges_one_blind_and_the_verdict_is_counted(crew: dict[str, Any]) -> None:
    people = crew
    experiment, sources = experiment_of_two(people)
    moderator = login(people["moderator"])
    page = moderator.get(f"/review/experiments/{experiment.pk}/")
    assert b"Send to review queue" in page.content and b'value="second"' in page.content

    sent = moderator.post(
        f"/review/experiments/{experiment.pk}/queue", {"name": "pairs to judge", "reviewers": ["reviewer", "second"]}
    )
    queue = ReviewQueue.objects.get(name="pairs to judge")
    assert sent.status_code == 302 and sent["Location"] == f"/review/queues/{queue.pk}/"
    items = list(ReviewQueueItem.objects.filter(queue=queue).order_by("position"))
    # One item per pair, handed out in turn, each the pair's replay session.
    assert [i.assignee.username for i in items if i.assignee] == ["reviewer", "second"]
    assert {i.session_id for i in items} == set(experiment.replays.values_list("session_id", flat=True))

    reviewer = login(people["reviewer"])
    listing = reviewer.get(f"/review/queues/{queue.pk}/").content.decode()
    mine = items[0]
    assert f'href="/review/pairs/{mine.pk}/"' in listing and "Compare A/B" in listing
    assert f"/review/pairs/{items[1].pk}/" not in listing  # the other reviewer's

    blind = reviewer.get(f"/review/pairs/{mine.pk}/")
    assert blind.status_code == 200
    html = blind.content.decode()
    assert "A is better" in html and 'name="a.clarity"' in html and 'name="b.safe"' in html
    for word in words_that_name_a_side(experiment, sources):
        assert word not in html, word
    assert re.search(r"<title>Compare A/B · pairs to judge · Sectr</title>", html)

    # Bad scores: 400, nothing stored, the item still open.
    for bad in ({"a.clarity": "9"}, {"b.nope": "1"}, {"a.safe": "maybe"}):
        refused = reviewer.post(f"/review/pairs/{mine.pk}/", {"choice": "a", **bad})
        assert refused.status_code == 400, bad
        assert b'data-role="pair-error"' in refused.content
    assert reviewer.post(f"/review/pairs/{mine.pk}/", {"choice": "left"}).status_code == 400
    assert not PairVerdict.objects.exists()
    assert ReviewQueueItem.objects.get(pk=mine.pk).done_at is None

    chosen = reviewer.post(
        f"/review/pairs/{mine.pk}/",
        {"choice": "a", "a.clarity": "4", "b.clarity": "2", "b.safe": "no", "a.safe": "", "note": "A reads better"},
    )
    # The reviewer had one item: back to the queue.
    assert chosen.status_code == 302 and chosen["Location"] == f"/review/queues/{queue.pk}/"
    assert ReviewQueueItem.objects.get(pk=mine.pk).done_at is not None
    verdict = PairVerdict.objects.get(reviewer=people["reviewer"])
    replay = mine.pair
    assert replay is not None and (verdict.source_id, verdict.candidate) == (replay.source_id, replay.candidate)
    side_a, side_b = pairs.sides_of(experiment, replay, people["reviewer"])
    assert verdict.winner == side_a and verdict.note == "A reads better"
    assert verdict.scores == {side_a: {"clarity": 4}, side_b: {"clarity": 2, "safe": False}}

    # Counted per candidate, on the page and in the API's JSON.
    (summary,) = compare.summarize(experiment)
    won = side_a == PairVerdict.CANDIDATE
    assert (summary.wins, summary.losses, summary.ties) == ((1, 0, 0) if won else (0, 1, 0))
    clarity = next(s for s in summary.scores if s.name == "clarity")
    assert (clarity.baseline_mean, clarity.candidate_mean) == ((2.0, 4.0) if won else (4.0, 2.0))
    safe = next(s for s in summary.scores if s.name == "safe")
    assert (
        safe.mean(safe.baseline if won else safe.candidate),
        safe.mean(safe.candidate if won else safe.baseline),
    ) == (
        0.0,
        None,
    )
    token = do_issue_token(people["moderator"], "t")[1]
    api = Client(HTTP_AUTHORIZATION=f"Bearer {token}")
    data = api.get(f"/api/v1/experiments/{experiment.pk}").json()["summary"][0]
    baseline, candidate = (2, 4) if won else (4, 2)
    assert data["scores"]["clarity"] == {
        "kind": "numeric",
        "baseline": {"count": 1, "mean": baseline},
        "candidate": {"count": 1, "mean": candidate},
    }
    assert (data["wins"], data["losses"]) == ((1, 0) if won else (0, 1))
    shown = moderator.get(f"/review/experiments/{experiment.pk}/").content.decode()
    assert 'aria-label="Scores per side"' in shown and ("1 better" if won else "1 worse") in shown
    assert f"{float(baseline):.2f}" in shown and f"{float(candidate):.2f}" in shown

    # The second reviewer's submit moves on to the next open item they may judge.
    second = login(people["second"])
    theirs = items[1]
    following = second.post(f"/review/pairs/{theirs.pk}/", {"choice": "tie"})
    assert following.status_code == 302 and following["Location"] == f"/review/queues/{queue.pk}/"
    assert PairVerdict.objects.get(reviewer=people["second"]).winner == PairVerdict.TIE


@pytest.mark.django_db(transaction=True)
def test_submitting_opens_the_next_open_pair_of_the_queue(crew: dict[str, Any]) -> None:
    people = crew
    experiment, _ = experiment_of_two(people)
    sent = pairs.do_send_to_queue(people["moderator"], experiment.pk, name="mine", reviewers=["reviewer"])
    first, second = sent.items
    reviewer = login(people["reviewer"])
    moved = reviewer.post(f"/review/pairs/{first.pk}/", {"choice": "b"})
    assert moved["Location"] == f"/review/pairs/{second.pk}/"
    queue_page = reviewer.get(f"/review/queues/{sent.queue.pk}/").content.decode()
    assert f'href="/review/pairs/{second.pk}/">Start reviewing' in queue_page


def side_markup(html: str) -> list[tuple[str, str]]:
    """Each turn's two sides as markup with their letter and text taken out: what the page
    draws around what a side said, which must not differ by what the side is."""
    articles = re.findall(r'<article class="compare-side">(.*?)</article>', html, re.S)
    shapes = [re.sub(r">[^<]*<", "><", re.sub(r"<h3>[AB]</h3>", "", a)).strip() for a in articles]
    return list(zip(shapes[::2], shapes[1::2], strict=True))


@pytest.mark.django_db(transaction=True)
def test_a_diverged_pair_is_drawn_alike_on_both_sides(crew: dict[str, Any]) -> None:
    """Only a replay diverges and stops answering: neither may show on the blind pages
    (a queue's pair page, Judge pairs), whichever side the replay is."""
    people = crew
    # The first source's replay diverges at its first turn (the second's does not).
    experiment, sources = experiment_of_two(people)
    sent = pairs.do_send_to_queue(people["moderator"], experiment.pk, name="blind", reviewers=["reviewer"])
    diverged = next(i for i in sent.items if i.pair is not None and i.pair.source_id == sources[0].pk)
    assert compare.replay_statuses(experiment, diverged.pair)[0].state == compare.DIVERGED_STATE
    reviewer = login(people["reviewer"])
    judge = reviewer.get(f"/review/experiments/{experiment.pk}/judge").content.decode()
    assert f'name="source" value="{sources[0].pk}"' in judge  # the same pair, on Judge pairs
    for html in (reviewer.get(f"/review/pairs/{diverged.pk}/").content.decode(), judge):
        for word in ("divergence", "Stopped here", "would call", "diverged", "stopped"):
            assert word not in html, word
        # The diverged turn: each side's call, drawn the same way; the next turn, which
        # the replay never answered and the recording answered with nothing: alike.
        turns = side_markup(html)
        assert len(turns) == 2
        for a, b in turns:
            assert a == b, (a, b)
        assert html.count('<p class="empty">No answer.</p>') == 2


@pytest.mark.django_db
def test_the_order_of_the_sides_is_keyed_with_the_installations_secret(crew: dict[str, Any], settings: Any) -> None:
    """The ids the order is made from are on the judging form: without the secret, the
    order cannot be worked out from them."""
    experiment = Experiment(pk="exp_fixed")
    reviewer = crew["reviewer"]
    flips = [experiments.blind_flip(experiment, "ses_x", n, reviewer) for n in range(64)]
    assert flips == [experiments.blind_flip(experiment, "ses_x", n, reviewer) for n in range(64)]  # fixed
    assert 16 < sum(flips) < 48  # both orders, about as often
    settings.SECRET_KEY = "another installation's secret, at least fifty characters long......"
    assert flips != [experiments.blind_flip(experiment, "ses_x", n, reviewer) for n in range(64)]


@pytest.mark.django_db(transaction=True)
def test_previous_and_next_walk_sessions_and_pairs_in_the_queues_order(crew: dict[str, Any]) -> None:
    people = crew
    experiment, sources = experiment_of_two(people)
    moderator = people["moderator"]
    queue = review_actions.do_create_queue(moderator, "mixed", [people["reviewer"]], team="crew")
    review_actions.do_add_to_queue(moderator, queue.pk, [sources[0]])
    pairs.do_send_to_queue(moderator, experiment.pk, queue=queue.pk)
    review_actions.do_add_to_queue(moderator, queue.pk, [sources[1]])
    first, pair1, pair2, last = ReviewQueueItem.objects.filter(queue=queue).order_by("position")
    assert (first.pair_id, last.pair_id) == (None, None) and pair1.pair_id and pair2.pair_id
    addresses = [
        f"/review/{first.session_id}/?queue={queue.pk}",
        f"/review/pairs/{pair1.pk}/",
        f"/review/pairs/{pair2.pk}/",
        f"/review/{last.session_id}/?queue={queue.pk}",
    ]
    reviewer = login(people["reviewer"])

    def link(html: str, name: str) -> str | None:
        found = re.search(rf'<a href="([^"]+)">{name}</a>', html)
        return found.group(1).replace("&amp;", "&") if found else None

    for index, address in enumerate(addresses):
        html = reviewer.get(address).content.decode()
        assert f"item {index + 1} of 4" in html, address
        assert link(html, "Previous") == (addresses[index - 1] if index else None), address
        assert link(html, "Next") == (addresses[index + 1] if index < 3 else None), address
    # A pair's page names no session, not even its neighbours' by their place.
    pair_page = reviewer.get(addresses[1]).content.decode()
    assert pair1.session_id not in pair_page and pair2.session_id not in pair_page
    # Done on a session goes on to the next item, a pair.
    html = reviewer.get(addresses[0]).content.decode()
    assert f'name="then" value="{pair1.pk}"' in html
    done = reviewer.post(f"/review/queue-items/{first.pk}/done", {"then": str(pair1.pk)})
    assert done.status_code == 302 and done["Location"] == addresses[1]


@pytest.mark.django_db(transaction=True)
def test_a_refused_verdict_keeps_what_the_reviewer_typed(crew: dict[str, Any]) -> None:
    people = crew
    experiment, sources = experiment_of_two(people)
    sent = pairs.do_send_to_queue(people["moderator"], experiment.pk, name="typed", reviewers=["reviewer"])
    item = sent.items[0]
    reviewer = login(people["reviewer"])
    typed = {"choice": "a", "a.clarity": "9", "a.safe": "yes", "b.clarity": "2", "b.safe": "no", "note": "A, surely"}
    refused = reviewer.post(f"/review/pairs/{item.pk}/", typed)
    assert refused.status_code == 400
    html = refused.content.decode()
    assert re.search(r'data-role="pair-error">Scores for A: clarity is a number from 1 to 5<', html)
    assert re.search(r'<input type="number" name="a.clarity" value="9" id="a-clarity"', html)
    assert re.search(r'<input type="number" name="b.clarity" value="2" id="b-clarity"', html)
    assert re.search(r'<select name="a.safe" id="a-safe">.*?<option value="yes" selected>', html, re.S)
    assert re.search(r'<select name="b.safe" id="b-safe">.*?<option value="no" selected>', html, re.S)
    assert re.search(r'<textarea name="note"[^>]*>\s*A, surely</textarea>', html)
    for word in words_that_name_a_side(experiment, sources):
        assert word not in html, word
    assert not PairVerdict.objects.exists()
    # Fixed and sent again: stored as typed.
    assert reviewer.post(f"/review/pairs/{item.pk}/", {**typed, "a.clarity": "5"}).status_code == 302
    verdict = PairVerdict.objects.get()
    side_a, side_b = pairs.sides_of(experiment, item.pair, people["reviewer"])
    assert verdict.scores == {side_a: {"clarity": 5, "safe": True}, side_b: {"clarity": 2, "safe": False}}
    assert verdict.note == "A, surely"


@pytest.mark.django_db(transaction=True)
def test_the_role_matrix(crew: dict[str, Any]) -> None:
    people = crew
    experiment, _ = experiment_of_two(people)
    with pytest.raises(Forbidden):
        pairs.do_send_to_queue(people["reviewer"], experiment.pk, name="x")
    for who in ("owner", "outsider"):
        with pytest.raises(NotFound):
            pairs.do_send_to_queue(people[who], experiment.pk, name="x")
    for who, status in (("reviewer", 404), ("owner", 404), ("outsider", 404)):
        response = login(people[who]).post(f"/review/experiments/{experiment.pk}/queue", {"name": "x"})
        assert response.status_code == (403 if who == "reviewer" else status), who
    assert not ReviewQueue.objects.exists()

    sent = pairs.do_send_to_queue(people["moderator"], experiment.pk, name="pairs", reviewers=["reviewer"])
    item = sent.items[0]
    # Its reviewer and the team's moderators judge; the team's other reviewers (not named
    # by the queue), its members and outsiders get 404, on the page and in the action.
    for who, status in (("reviewer", 200), ("moderator", 200), ("second", 404), ("owner", 404), ("outsider", 404)):
        client = login(people[who])
        assert client.get(f"/review/pairs/{item.pk}/").status_code == status, who
        if status == 404:
            assert client.post(f"/review/pairs/{item.pk}/", {"choice": "a"}).status_code == 404, who
            with pytest.raises(NotFound):
                pairs.do_judge_item(people[who], item.pk, "a")
    assert login(people["reviewer"]).get("/review/pairs/999999/").status_code == 404
    # A session item is no pair.
    plain = ReviewQueueItem.objects.create(
        queue=sent.queue, session=import_recorded(people, "c.txt"), position=99, added_by=people["moderator"]
    )
    assert login(people["moderator"]).get(f"/review/pairs/{plain.pk}/").status_code == 404
    assert not PairVerdict.objects.exists()
    # The moderator judges an item assigned to someone else.
    assert login(people["moderator"]).post(f"/review/pairs/{item.pk}/", {"choice": "tie"}).status_code == 302


@pytest.mark.django_db(transaction=True)
def test_bad_sends_are_refused_and_change_nothing(crew: dict[str, Any]) -> None:
    people = crew
    experiment, _ = experiment_of_two(people)
    moderator = people["moderator"]
    elsewhere = ReviewQueue.objects.create(team=actions.do_create_team("fourth"), name="far", created_by=moderator)
    cases: list[dict[str, Any]] = [
        {},  # neither
        {"queue": 1, "name": "both"},
        {"name": ""},
        {"name": ["x"]},
        {"name": "x", "reviewers": ["owner"]},  # a member, not a reviewer
        {"name": "x", "reviewers": ["outsider"]},
        {"name": "x", "reviewers": ["nobody"]},
        {"name": "x", "reviewers": "reviewer,nobody"},
        {"name": "x", "reviewers": [1]},
        {"queue": "abc"},
        {"queue": elsewhere.pk},  # staff-less moderator: not theirs (NotFound)
        {"queue": True},
    ]
    for case in cases:
        with pytest.raises((ValidationFailed, NotFound)):
            pairs.do_send_to_queue(moderator, experiment.pk, **case)
    assert list(ReviewQueue.objects.values_list("name", flat=True)) == ["far"]
    assert not ReviewQueueItem.objects.exists()
    # A queue of the team gets the pairs once; sending again adds none.
    existing = review_actions.do_create_queue(moderator, "existing", [people["second"]], team="crew")
    assert pairs.do_send_to_queue(moderator, experiment.pk, queue=existing.pk).added == 2
    again = pairs.do_send_to_queue(moderator, experiment.pk, queue=str(existing.pk))
    assert (again.added, len(again.items)) == (0, 2)
    with pytest.raises(ValidationFailed):
        pairs.do_send_to_queue(moderator, experiment.pk, queue=existing.pk, reviewers=["reviewer"])


@pytest.mark.django_db(transaction=True)
def test_the_api_sends_and_judges_with_scores(crew: dict[str, Any]) -> None:
    people = crew
    experiment, sources = experiment_of_two(people)
    api = Client(HTTP_AUTHORIZATION=f"Bearer {do_issue_token(people['moderator'], 't')[1]}")
    url = f"/api/v1/experiments/{experiment.pk}/queue"
    sent = api.post(url, {"name": "api pairs", "reviewers": ["second"]}, content_type="application/json")
    assert sent.status_code == 201, sent.content
    body = sent.json()
    assert (body["queue"]["name"], body["queue"]["team"], body["added"]) == ("api pairs", "crew", 2)
    assert [(i["source"], i["candidate"], i["assignee"], i["done"]) for i in body["items"]] == [
        (s.pk, 0, "second", False) for s in sources
    ]
    for bad in (
        {"queue": body["queue"]["id"], "name": "x"},
        {"name": "x", "extra": 1},
        {"name": "y", "reviewers": ["owner"]},
    ):
        assert api.post(url, bad, content_type="application/json").status_code == 400, bad
    assert api.post(url, {"name": "api pairs"}, content_type="application/json").status_code == 409
    reviewer = Client(HTTP_AUTHORIZATION=f"Bearer {do_issue_token(people['reviewer'], 't')[1]}")
    assert reviewer.post(url, {"name": "z"}, content_type="application/json").status_code == 403
    outsider = Client(HTTP_AUTHORIZATION=f"Bearer {do_issue_token(people['outsider'], 't')[1]}")
    assert outsider.post(url, {"name": "z"}, content_type="application/json").status_code == 404
    assert ReviewQueue.objects.count() == 1

    verdicts = f"/api/v1/experiments/{experiment.pk}/verdicts"
    pair = {"source": sources[0].pk, "candidate": 0, "winner": "candidate"}
    for bad in (
        {"baseline": {"clarity": 6}},
        {"candidate": {"unknown": 1}},
        {"left": {"clarity": 1}},
        {"candidate": {"score": 3}},  # a built-in score is not a pair score
        {"candidate": "4"},
    ):
        refused = reviewer.post(verdicts, {**pair, "scores": bad}, content_type="application/json")
        assert refused.status_code == 400, bad
    assert not PairVerdict.objects.exists()
    given = {"baseline": {"clarity": 3, "safe": True}, "candidate": {"clarity": 5}}
    judged = reviewer.post(verdicts, {**pair, "scores": given}, content_type="application/json")
    assert judged.status_code == 201 and judged.json()["scores"] == given
    summary = api.get(f"/api/v1/experiments/{experiment.pk}").json()["summary"][0]
    assert summary["wins"] == 1
    assert summary["scores"]["safe"] == {
        "kind": "boolean",
        "baseline": {"count": 1, "mean": 1.0, "counts": {"yes": 1, "no": 0}},
        "candidate": {"count": 0, "mean": None, "counts": {"yes": 0, "no": 0}},
    }


# ---- the Python SDK against a live server ----


@pytest.fixture(scope="module")
def live() -> Iterator[LiveApi]:
    with live_api() as api:
        yield api


def test_the_python_sdk_sends_to_a_queue_and_judges_sync_and_async(live: LiveApi) -> None:
    with SdkClient(live.base_url, token=live.tokens["mod"]) as mod:
        mod.scores.create("crew", "depth", "numeric", minimum=1, maximum=3)
        session = mod.sessions.create(title="to replay", team="crew")
        session.run("hello").result()
        experiment = mod.experiments.create("crew", "sdk trial", [{"agent": "default"}], sessions=[session.id])
        for _ in range(300):
            if all(r["state"] != "running" for r in experiment.replays):
                break
            time.sleep(0.1)
            experiment = mod.experiments.get(experiment.id)
        assert [r["state"] for r in experiment.replays] == ["done"]
        sent = mod.experiments.send_to_queue(experiment.id, name="sdk pairs", reviewers=["mod"])
        assert (sent.queue_name, sent.added) == ("sdk pairs", 1)
        assert [(i["source"], i["assignee"]) for i in sent.items] == [(session.id, "mod")]
        with pytest.raises(InvalidRequestError):
            mod.experiments.send_to_queue(experiment.id, name="sdk other", reviewers=["alice"])
        with pytest.raises(InvalidRequestError):
            mod.experiments.send_to_queue(experiment.id)
        with pytest.raises(InvalidRequestError):
            mod.experiments.judge(experiment.id, session.id, 0, "tie", scores={"baseline": {"depth": 4}})
        verdict = mod.experiments.judge(
            experiment.id, session.id, 0, "baseline", note="kept", scores={"baseline": {"depth": 3}}
        )
        assert (verdict.winner, verdict.note, verdict.scores) == ("baseline", "kept", {"baseline": {"depth": 3}})
        (summary,) = mod.experiments.get(experiment.id).summary
        assert (summary["losses"], summary["scores"]["depth"]["baseline"]) == (1, {"count": 1, "mean": 3})
    with SdkClient(live.base_url, token=live.tokens["alice"]) as alice:
        with pytest.raises(NotFoundError):
            alice.experiments.get(experiment.id)
        with pytest.raises(NotFoundError):
            alice.experiments.send_to_queue(experiment.id, queue=sent.queue_id)

    async def go() -> tuple[int, int]:
        async with AsyncClient(live.base_url, token=live.tokens["mod"]) as amod:
            again = await amod.experiments.send_to_queue(experiment.id, queue=sent.queue_id)
            listed = await amod.experiments.list("crew")
            assert experiment.id in [e.id for e in listed]
            await amod.experiments.judge(experiment.id, session.id, 0, "tie")
            return again.added, (await amod.experiments.get(experiment.id)).summary[0]["ties"]

    assert asyncio.run(go()) == (0, 1)
    with SdkClient(live.base_url, token=live.tokens["bob"]) as bob, pytest.raises(NotFoundError):
        bob.experiments.send_to_queue(experiment.id, name="x")
