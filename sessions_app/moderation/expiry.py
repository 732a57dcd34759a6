"""Expiry: the worker's loop denies asks whose deadline has passed (docs/moderation.md).

The deadline is stored with the ask (AskIndex.deadline, written with its
APPROVAL_REQUESTED), so a restart of every process changes nothing: any worker, in
any process, sweeps the due asks. Each denial goes through actions.do_expire_ask,
under the session's row lock with the ask re-checked, so several workers racing on one
ask deny it exactly once (the others find it decided and move on).
"""

from __future__ import annotations

import logging
from datetime import datetime

from sessions_app.actions import do_expire_ask, due_ask_ids

log = logging.getLogger("sectr.expiry")


def expire_due_asks(now: datetime | None = None, limit: int = 100) -> int:
    """Deny the pending asks whose deadline has passed; how many this call denied."""
    denied = 0
    for ask_id in due_ask_ids(now, limit):
        try:
            if do_expire_ask(ask_id, now) is not None:
                denied += 1
        except Exception:
            # One bad ask must not stop the sweep (nor the worker's loop).
            log.exception("could not expire %s", ask_id)
    if denied:
        log.info("expired %d ask(s)", denied)
    return denied
