"""The filter forms of the queue, the audit and the review search: what a query string
becomes (cut, dropped, or refused), the same from a page, a socket's URL or the API."""

from __future__ import annotations

from datetime import date

import pytest
from django.http import QueryDict

from sectr.errors import ValidationFailed
from sessions_app.models import Membership, Session, Team
from sessions_app.moderation.audit import AuditFilters
from sessions_app.moderation.queue import QueueFilters
from sessions_app.review.search import Filters, SearchFilterForm
from tests.server.conftest import make_user


def test_the_queue_cuts_long_names_and_drops_an_unknown_age() -> None:
    filters = QueueFilters.from_query(QueryDict(f"team={'t' * 200}&tool=%20shell&age=2y"))
    assert (len(filters.team), filters.tool, filters.age) == (150, " shell", "")
    assert QueueFilters.from_query({"age": "10m", "team": "ops"}) == QueueFilters(team="ops", age="10m")
    assert QueueFilters.from_query(QueryDict("age=10m&age=1h")).age == "1h"  # the last value, as a QueryDict gives it


def test_the_audit_refuses_a_value_that_cannot_be_a_filter() -> None:
    with pytest.raises(ValidationFailed, match="verdict must be one of allow_once") as refused:
        AuditFilters.from_query(QueryDict("kind=nonsense&verdict=maybe&from=yesterday"))
    assert refused.value.code == "invalid_filter"  # the first bad field, in the form's order
    with pytest.raises(ValidationFailed, match="kind must be one of"):
        AuditFilters.from_query(QueryDict("kind=nonsense&from=yesterday"))
    with pytest.raises(ValidationFailed, match=r"^from must be a date \(YYYY-MM-DD\) or an ISO 8601 time$"):
        AuditFilters.from_query(QueryDict("from=yesterday"))
    with pytest.raises(ValidationFailed, match="^to must be a date"):
        AuditFilters.from_query(QueryDict("to=the%20end"))


def test_the_audit_reads_days_as_whole_days_and_cuts_text() -> None:
    filters = AuditFilters.from_query(QueryDict(f"from=2026-01-02&to=2026-01-03&actor=%20bob%20&session={'s' * 60}"))
    assert filters.since is not None and filters.until is not None
    assert filters.since.date() == date(2026, 1, 2) and filters.until.date() == date(2026, 1, 3)
    assert filters.since.tzinfo is not None and filters.until.tzinfo is not None
    assert (filters.actor, len(filters.session)) == ("bob", 40)
    assert filters.as_query()["from"] == "2026-01-02"


def test_the_search_ignores_what_it_cannot_read_and_says_so() -> None:
    filters = Filters.from_query(QueryDict("q=%20alpha%20&from=soon&to=later&state=nonsense&has_asks=on&failed=yes"))
    assert (filters.q, filters.state, filters.date_from, filters.date_to) == ("alpha", "", None, None)
    assert (filters.has_asks, filters.failed) == (True, False)
    assert filters.errors == ["From is not a date (YYYY-MM-DD); ignored", "To is not a date (YYYY-MM-DD); ignored"]
    good = Filters.from_query({"from": "2026-01-02", "state": "failed", "q": "x" * 300})
    assert (good.date_from, good.state, len(good.q), good.errors) == (date(2026, 1, 2), "failed", 200, [])


@pytest.mark.django_db
def test_the_search_offers_as_team_and_user_only_what_the_viewer_may_review() -> None:
    ours, theirs = Team.objects.create(name="ours"), Team.objects.create(name="theirs")
    reviewer, colleague, stranger = make_user("rev"), make_user("colleague"), make_user("stranger")
    Membership.objects.create(team=ours, user=reviewer, role="reviewer")
    Membership.objects.create(team=ours, user=colleague, role="member")
    Membership.objects.create(team=theirs, user=stranger, role="member")
    Session.objects.create(owner=colleague, team=ours)
    Session.objects.create(owner=stranger, team=theirs)

    form = SearchFilterForm(data=QueryDict("team=theirs&user=stranger&state=failed"), viewer=reviewer)
    html = str(form["team"]) + str(form["user"])
    assert '<select name="team" id="f-team">' in html and '<option value="ours">ours</option>' in html
    assert 'value="theirs"' not in html
    assert '<option value="colleague">colleague</option>' in html and "stranger</option>" not in html
    # A team or person the viewer may not see is no filter at all.
    filters = Filters.from_form(form)
    assert (filters.team, filters.user, filters.state) == ("", "", "failed")
    picked = Filters.from_form(SearchFilterForm(data=QueryDict("team=ours&user=colleague"), viewer=reviewer))
    assert (picked.team, picked.user) == ("ours", "colleague")
