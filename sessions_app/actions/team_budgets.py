"""A team's monthly budget, set by its moderators (docs/agents.md, "Budgets")."""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any

from django.db import transaction
from django.utils import timezone

from sectr.errors import Forbidden, ValidationFailed
from sessions_app import access
from sessions_app.actions.teams import get_team_for_user
from sessions_app.models import TeamBudget
from sessions_app.team_budgets import forget_team

BUDGET_FIELDS = ("monthly_tokens", "monthly_cost", "alert_thresholds")
#: Up to 11 digits and 4 decimals, as the budget's column holds.
COST_RE = re.compile(r"[0-9]{1,11}(\.[0-9]{1,4})?")


def check_budget(data: Any) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ValidationFailed("a budget must be an object", code="invalid_budget")
    unknown = set(data) - set(BUDGET_FIELDS)
    if unknown:
        raise ValidationFailed(f"unknown fields: {', '.join(sorted(unknown))}", code="invalid_budget")
    checked: dict[str, Any] = {}
    if "monthly_tokens" in data:
        tokens = data["monthly_tokens"]
        if isinstance(tokens, float) and tokens.is_integer():
            tokens = int(tokens)  # JSON's 1e15 is a whole number, as JSON Schema's "integer" says
        if tokens is not None and (
            isinstance(tokens, bool) or not isinstance(tokens, int) or not 0 <= tokens <= 10**15
        ):
            raise ValidationFailed("monthly_tokens must be a whole number from 0, or null", code="invalid_budget")
        checked["monthly_tokens"] = tokens
    if "monthly_cost" in data:
        cost = data["monthly_cost"]
        if cost is not None:
            # A string, as the API writes amounts: no float rounding on the way in.
            if not isinstance(cost, str) or not COST_RE.fullmatch(cost.strip()):
                raise ValidationFailed(
                    'monthly_cost must be an amount as a string ("100", "12.50"), or null', code="invalid_budget"
                )
            cost = Decimal(cost.strip()).quantize(Decimal("0.0001"))
        checked["monthly_cost"] = cost
    if "alert_thresholds" in data:
        thresholds = data["alert_thresholds"]
        if not isinstance(thresholds, list) or len(thresholds) > 10:
            raise ValidationFailed("alert_thresholds must be a list of at most 10 shares", code="invalid_budget")
        shares = []
        for share in thresholds:
            if isinstance(share, bool) or not isinstance(share, int | float) or not 0 < share <= 10:
                raise ValidationFailed(
                    "each alert threshold is a share of the budget above 0 (0.8 = 80 %)", code="invalid_budget"
                )
            shares.append(float(share))
        checked["alert_thresholds"] = sorted(set(shares))
    return checked


def do_set_budget(actor: Any, team_name: str, data: Any) -> TeamBudget:
    """Set (or raise, or remove with nulls) a team's budget; the fields left out stay."""
    team = get_team_for_user(actor, team_name)  # 404 for strangers
    if not access.can_moderate_team(actor, team):
        raise Forbidden("only the team's moderators can change its budget")
    fields = check_budget(data)
    with transaction.atomic():
        budget, _ = TeamBudget.objects.select_for_update().get_or_create(
            team=team, defaults={"alert_thresholds": [0.8, 1.0]}
        )
        for key, value in fields.items():
            setattr(budget, key, value)
        budget.updated_by = actor.get_username()
        budget.updated_at = timezone.now()
        budget.save()
    forget_team(team.pk)
    return budget
