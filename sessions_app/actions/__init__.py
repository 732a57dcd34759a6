"""Every state change a person or program asks for (Zulip style): `check_*` validates,
`do_*` writes once, atomically, and notifies on commit.

- `sessions`: sessions and their runs (create, message, decide, steer, cancel, retry,
  fork, regenerate, edit, clear, close, delete, rename, mode, model, compact). Run rows change only
  through sessions_app.runs, which these call.
- `tokens`: API tokens (issue, revoke).

Views, the API, consumers and management commands call these; none of them saves a
model itself.
"""

from sessions_app.actions.sessions import (
    check_content,
    do_cancel,
    do_clear,
    do_close,
    do_compact,
    do_create_session,
    do_decide,
    do_delete,
    do_edit_message,
    do_fork,
    do_post_message,
    do_post_message_with_media,
    do_regenerate,
    do_rename,
    do_retry,
    do_set_mode,
    do_set_model,
    do_steer,
    find_ask_session,
)
from sessions_app.runs import promote_pending_run

__all__ = [
    "check_content",
    "do_cancel",
    "do_clear",
    "do_close",
    "do_compact",
    "do_create_session",
    "do_decide",
    "do_delete",
    "do_edit_message",
    "do_fork",
    "do_post_message",
    "do_post_message_with_media",
    "do_regenerate",
    "do_rename",
    "do_retry",
    "do_set_mode",
    "do_set_model",
    "do_steer",
    "find_ask_session",
    "promote_pending_run",
]
