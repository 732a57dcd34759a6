"""The moderation tests' team: owner a member of `ops` (their sessions moved in with
team_session), teammate its moderator; stranger moderates another team, `other`."""

from __future__ import annotations

from typing import Any

import pytest

from sessions_app.models import Membership, Team
from tests.server.conftest import make_user


@pytest.fixture
def ops(owner: Any, teammate: Any) -> Team:
    team = Team.objects.create(name="ops")
    Membership.objects.create(team=team, user=owner, role="member")
    Membership.objects.create(team=team, user=teammate, role="moderator")
    return team


@pytest.fixture
def stranger(db: None) -> Any:
    user = make_user("stranger")
    team = Team.objects.create(name="other")
    Membership.objects.create(team=team, user=user, role="moderator")
    return user
