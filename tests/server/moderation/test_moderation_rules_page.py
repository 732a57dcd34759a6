# ruff: noqa: F811  (pytest fixtures imported from test_moderation_ui are parameters here)
"""/approvals/rules/: a team's moderators list, add and delete its approval rules on a
page, and "Test this rule" lists which of the team's past asks a rule would have
matched; everyone else gets 404 for the team's rules."""

from __future__ import annotations

from typing import Any

import pytest

from sessions_app.models import ApprovalRule, Session, Team
from tests.server.chat.test_web import logged_in
from tests.server.conftest import SessionFactory
from tests.server.moderation.test_moderation_ui import pending, team_session

pytestmark = pytest.mark.django_db


def test_a_moderator_adds_a_rule_on_the_page_and_it_is_listed_in_order(teammate: Any, ops: Team) -> None:
    moderator = logged_in(teammate)
    response = moderator.post(
        "/approvals/rules/ops/new",
        {"tool": "write_note", "arguments": "title=draft*\n", "action": "allow", "approvals_required": "1"},
    )
    assert response.status_code == 302
    moderator.post(
        "/approvals/rules/ops/new", {"tool": "*", "action": "ask", "approvals_required": "2", "position": "0"}
    )
    rules = list(ops.rules.order_by("position"))
    assert [(r.tool, r.action, r.approvals_required) for r in rules] == [("*", "ask", 2), ("write_note", "allow", 1)]
    assert rules[1].arguments == {"title": "draft*"}
    html = moderator.get("/approvals/rules/").content.decode()
    assert html.index(f'id="rule-{rules[0].pk}"') < html.index(f'id="rule-{rules[1].pk}"')
    assert "<code>title=draft*</code>" in html and "Test this rule" in html


def test_a_bad_rule_is_refused_with_a_message_and_nothing_is_saved(teammate: Any, ops: Team) -> None:
    moderator = logged_in(teammate)
    response = moderator.post("/approvals/rules/ops/new", {"tool": "x", "action": "launch"}, follow=True)
    assert response.status_code == 200 and not ops.rules.exists()
    response = moderator.post("/approvals/rules/ops/new", {"tool": "x", "arguments": "no equals sign"}, follow=True)
    assert "name=glob" in response.content.decode() and not ops.rules.exists()
    response = moderator.post("/approvals/rules/ops/new", {"tool": "x", "approvals_required": "²"}, follow=True)
    assert response.status_code == 200 and not ops.rules.exists()


def test_it_deletes_a_rule(teammate: Any, ops: Team) -> None:
    rule = ApprovalRule.objects.create(team=ops, tool="write_note", action="deny")
    response = logged_in(teammate).post(f"/approvals/rules/ops/{rule.pk}/delete")
    assert response.status_code == 302 and not ops.rules.exists()


def test_test_this_rule_lists_the_past_asks_it_would_have_matched(
    teammate: Any,
    ops: Team,
    make_session: SessionFactory,
) -> None:
    session = team_session(make_session, ops, title="Groceries")
    pending(session)  # write_note {"title": "buy milk", "body": "buy milk"}
    moderator = logged_in(teammate)
    hit = moderator.get("/approvals/rules/ops/preview", {"tool": "write_*", "arguments": "title=buy*"})
    html = hit.content.decode()
    assert hit.status_code == 200 and "would have matched <strong>1</strong>" in html
    assert f"/review/{session.pk}/" in html and "Groceries" in html
    miss = moderator.get("/approvals/rules/ops/preview", {"tool": "write_note", "arguments": "title=sell*"}).content
    assert b"would have matched <strong>0</strong>" in miss and b"would never have decided anything" in miss
    bad = moderator.get("/approvals/rules/ops/preview", {"tool": "", "action": "ask"})
    assert bad.status_code == 400
    assert not ops.rules.exists()  # testing saves nothing


def test_it_returns_404_for_teams_the_user_does_not_moderate(
    owner: Any,
    stranger: Any,
    ops: Team,
    make_session: SessionFactory,
) -> None:
    rule = ApprovalRule.objects.create(team=ops, tool="write_note", action="deny")
    pending(team_session(make_session, ops))
    for user in (owner, stranger):  # a plain member of ops, and another team's moderator
        client = logged_in(user)
        assert client.post("/approvals/rules/ops/new", {"tool": "write_note", "action": "allow"}).status_code == 404
        assert client.post(f"/approvals/rules/ops/{rule.pk}/delete").status_code == 404
        assert client.get("/approvals/rules/ops/preview", {"tool": "*"}).status_code == 404
        assert f'id="rule-{rule.pk}"' not in client.get("/approvals/rules/").content.decode()
    assert list(ops.rules.values_list("pk", flat=True)) == [rule.pk]
    assert Session.objects.filter(team=ops).count() == 1


def test_the_rules_page_needs_a_login(client: Any) -> None:
    assert client.get("/approvals/rules/").status_code == 302
