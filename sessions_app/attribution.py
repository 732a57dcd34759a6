"""Which API token a request acts through, for the usage rollup's per-token rows.

The API sets `current_api_token_key` after authenticating a call; sessions_app.runs
stores it on the Run it queues, and the journal's usage rollup reads it from there when
the run's MESSAGE_END arrives (long after the request). 0 means the web UI. A
contextvar, not an argument: asgiref's sync_to_async carries it into the action's
thread, so no action signature has to grow a parameter that only the rollup needs.
"""

from __future__ import annotations

from contextvars import ContextVar

current_api_token_key: ContextVar[int] = ContextVar("sectr_api_token_key", default=0)
