"""Every state change a person or program asks for (Zulip style): `check_*` validates,
`do_*` writes once, atomically, and notifies on commit.

- `sessions`: sessions and their runs (create, message, decide, steer, cancel, retry,
  fork, regenerate, edit, clear, close, delete, rename, mode, model, compact). Run rows change only
  through sessions_app.runs, which these call.
- `asks`: verdicts and votes on approval asks (quorum), the expiry of overdue asks.
- `teams`: teams and memberships, a new session's team.
- `rules`: a team's approval rules (moderators only).
- `tokens`: API tokens (issue, revoke).
- `agents`: agents and their versions (create, save a version), a new session's agent.

Views, the API, consumers and management commands call these; none of them saves a
model itself.
"""

from sessions_app.actions.agents import (
    do_create_agent,
    do_save_agent_version,
    get_agent_for_user,
    get_version,
    list_agents,
)
from sessions_app.actions.asks import (
    do_decide,
    do_decide_by_link,
    do_expire_ask,
    due_ask_ids,
    find_ask_session,
    visible_asks,
)
from sessions_app.actions.rules import do_create_rule, do_delete_rule, do_update_rule, list_rules
from sessions_app.actions.sessions import (
    DeletedSession,
    check_content,
    check_model_choice,
    check_new_session_budget,
    do_cancel,
    do_cancel_current,
    do_clear,
    do_close,
    do_compact,
    do_create_session,
    do_delete,
    do_delete_expired,
    do_edit_message,
    do_fork,
    do_move_agent,
    do_post_message,
    do_post_message_with_media,
    do_regenerate,
    do_rename,
    do_retry,
    do_set_mode,
    do_set_model,
    do_steer,
    do_steer_current,
)
from sessions_app.actions.teams import (
    DEFAULT_TEAM,
    do_create_team,
    do_remove_membership,
    do_set_membership,
    get_team_for_user,
)
from sessions_app.runs import promote_pending_run

__all__ = [
    "check_model_choice",
    "DEFAULT_TEAM",
    "do_create_agent",
    "do_create_rule",
    "do_create_team",
    "do_delete_rule",
    "do_expire_ask",
    "do_remove_membership",
    "do_set_membership",
    "do_update_rule",
    "due_ask_ids",
    "do_save_agent_version",
    "get_agent_for_user",
    "get_team_for_user",
    "get_version",
    "list_agents",
    "list_rules",
    "visible_asks",
    "check_content",
    "check_new_session_budget",
    "do_cancel",
    "do_cancel_current",
    "do_clear",
    "do_close",
    "do_compact",
    "do_create_session",
    "do_decide",
    "do_decide_by_link",
    "DeletedSession",
    "do_delete",
    "do_delete_expired",
    "do_edit_message",
    "do_fork",
    "do_move_agent",
    "do_post_message",
    "do_post_message_with_media",
    "do_regenerate",
    "do_rename",
    "do_retry",
    "do_set_mode",
    "do_set_model",
    "do_steer",
    "do_steer_current",
    "find_ask_session",
    "promote_pending_run",
]
