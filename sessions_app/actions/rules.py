"""A team's approval rules: created, changed, reordered and deleted by its moderators.

These are the only writers of ApprovalRule rows (besides the Django admin, which only
staff reach). A rule is data (sectr.rules); the worker reads the session's team's rules
when an invocation starts, so nothing a run does can change them: a run has no actor
that is a moderator, and no door to these functions.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from sectr.errors import Forbidden, NotFound, ValidationFailed
from sectr.rules import check_rule
from sessions_app import access
from sessions_app.actions.teams import get_team_for_user
from sessions_app.models import ApprovalRule, Team

MAX_RULES_PER_TEAM = 200


def _moderated_team(actor: Any, team_name: str) -> Team:
    team = get_team_for_user(actor, team_name)  # 404 for strangers
    if not access.can_moderate_team(actor, team):
        raise Forbidden("only the team's moderators can change its approval rules")
    return team


def list_rules(actor: Any, team_name: str) -> list[ApprovalRule]:
    """The team's rules in order, for anyone with a role in the team."""
    team = get_team_for_user(actor, team_name)
    return list(team.rules.order_by("position", "id"))


def _position(value: Any, count: int) -> int:
    if value is None:
        return count
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # 5.0 is the whole number 5 in JSON
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValidationFailed("position must be a whole number from 0 (first)", code="invalid_rule")
    return min(value, count)


def _renumber(team: Team, ordered: list[ApprovalRule]) -> None:
    changed = []
    for index, rule in enumerate(ordered):
        if rule.position != index:
            rule.position = index
            changed.append(rule)
    if changed:
        ApprovalRule.objects.bulk_update(changed, ["position"])


def _locked_rules(team: Team) -> list[ApprovalRule]:
    # Lock the team row: two moderators reordering at once take turns.
    Team.objects.select_for_update().filter(pk=team.pk).first()
    return list(team.rules.order_by("position", "id"))


def do_create_rule(actor: Any, team_name: str, data: Any) -> ApprovalRule:
    """Add a rule (at `position`, default last)."""
    team = _moderated_team(actor, team_name)
    fields = check_rule(data)
    if isinstance(data, dict) and data.get("id") is not None:
        raise ValidationFailed("a new rule gets its id from the server", code="invalid_rule")
    with transaction.atomic():
        rules = _locked_rules(team)
        if len(rules) >= MAX_RULES_PER_TEAM:
            raise ValidationFailed(f"a team has at most {MAX_RULES_PER_TEAM} rules", code="invalid_rule")
        position = _position(data.get("position"), len(rules))
        rule = ApprovalRule.objects.create(team=team, position=position, created_by=actor.get_username(), **fields)
        rules.insert(position, rule)
        _renumber(team, rules)
    return rule


def _rule_of(team: Team, rule_id: Any) -> ApprovalRule:
    try:
        pk = int(rule_id)
    except (TypeError, ValueError):
        raise NotFound("no such rule") from None
    rule = team.rules.filter(pk=pk).first()
    if rule is None:
        raise NotFound("no such rule")
    return rule


def do_update_rule(actor: Any, team_name: str, rule_id: Any, data: Any) -> ApprovalRule:
    """Replace a rule's fields (and move it, with `position`)."""
    team = _moderated_team(actor, team_name)
    fields = check_rule(data)
    with transaction.atomic():
        rules = _locked_rules(team)
        rule = _rule_of(team, rule_id)
        for name, value in fields.items():
            setattr(rule, name, value)
        rule.updated_at = timezone.now()
        rule.save()
        rules = [r for r in rules if r.pk != rule.pk]
        # A null position, like a missing one, keeps the rule where it is.
        position = data.get("position")
        rules.insert(_position(rule.position if position is None else position, len(rules)), rule)
        _renumber(team, rules)
    rule.refresh_from_db()
    return rule


def do_delete_rule(actor: Any, team_name: str, rule_id: Any) -> None:
    team = _moderated_team(actor, team_name)
    with transaction.atomic():
        rules = _locked_rules(team)
        rule = _rule_of(team, rule_id)
        rule.delete()
        _renumber(team, [r for r in rules if r.pk != rule.pk])


def do_move_rule(actor: Any, team_name: str, rule_id: Any, offset: int) -> ApprovalRule:
    """Move a rule up (offset -1) or down (+1) in the order its team's rules are tried."""
    team = _moderated_team(actor, team_name)
    if offset not in (-1, 1):
        raise ValidationFailed("a rule moves one place up or down", code="invalid_rule")
    with transaction.atomic():
        rules = _locked_rules(team)
        rule = _rule_of(team, rule_id)
        index = next(i for i, r in enumerate(rules) if r.pk == rule.pk)
        target = min(max(index + offset, 0), len(rules) - 1)
        rules.insert(target, rules.pop(index))
        _renumber(team, rules)
    rule.refresh_from_db()
    return rule
