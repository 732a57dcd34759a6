"""The setup bench/run_start.py and bench/run_lifecycle.py share: a bench team whose owner
(`<team>-owner`, a member) queues runs and whose moderator (`<team>-mod`) gives it an
agent and a budget, where this version of Sectr has them; then fresh sessions with a
queued run each.

Import it after django.setup(). Like the benches, it runs on older versions of Sectr too
(copy it beside them), so the same scripts compare before and after.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management import call_command

from sessions_app import actions
from sessions_app.models import Run, Session, Team


def migrate_and_users(team: str) -> tuple[Any, Any]:
    """Migrate the database; the team's owner and moderator users (made if missing)."""
    call_command("migrate", verbosity=0)
    User = get_user_model()  # noqa: N806
    owner, _ = User.objects.get_or_create(username=f"{team}-owner")
    moderator, _ = User.objects.get_or_create(username=f"{team}-mod")
    return owner, moderator


def team_extras(team: str, owner: Any, moderator: Any, agent_slug: str, agent_name: str) -> dict[str, object]:
    """The team (made if missing), its agent `agent_slug` and a budget no bench exhausts
    where this version has them: do_create_session's extra arguments for its sessions."""
    if not Team.objects.filter(name=team).exists():
        actions.do_create_team(team)
        actions.do_set_membership(team, owner.username, "member")
        actions.do_set_membership(team, moderator.username, "moderator")
    extras: dict[str, object] = {"team": team}
    if hasattr(actions, "do_create_agent"):  # agents (and team budgets) exist in this version
        from sessions_app.actions.team_budgets import do_set_budget
        from sessions_app.models import Agent

        if not Agent.objects.filter(team__name=team, slug=agent_slug).exists():
            actions.do_create_agent(
                moderator,
                team,
                agent_slug,
                {"name": agent_name, "instructions": "Be brief.", "tools": ["get_time"]},
            )
        extras["agent"] = f"{team}/{agent_slug}"
        do_set_budget(moderator, team, {"monthly_tokens": 10**12})
    return extras


def queue_runs(owner: Any, count: int, extras: dict[str, object], text: str) -> list[Run]:
    """`count` fresh sessions of the owner's (the previous ones deleted, with their runs),
    each with `text` posted: their runs, queued."""
    Run.objects.filter(session__owner=owner).delete()
    Session.objects.filter(owner=owner).delete()
    runs = []
    for _ in range(count):
        session = actions.do_create_session(owner, **extras)  # type: ignore[arg-type]
        runs.append(actions.do_post_message(owner, session.pk, text))
    return runs
