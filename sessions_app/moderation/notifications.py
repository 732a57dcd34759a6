"""Sending the moderation notifications: team webhooks and emails to moderators.

The journal's append writes the outbox (NotificationDelivery rows) in the same
transaction as the ask or decision it announces (sessions_app.journal.moderation).
The worker loop sends them (`NotificationSender`, started by sessions_app.worker):

- Why the worker loop and not a thread started on commit: the outbox survives a
  restart (a thread dies with its process and forgets the call), retries with backoff
  need something that wakes later anyway, and any of several workers may send (each
  delivery is claimed by a conditional UPDATE, so only one sends it).
- Never blocking a run: the HTTP call and the email run in the sender's own thread
  (not the journal's thread pool, not the event loop), with a timeout.

A webhook call is a POST of the JSON payload with the headers ``X-Sectr-Event``,
``X-Sectr-Delivery`` (the delivery id), ``X-Sectr-Timestamp`` (Unix seconds) and
``X-Sectr-Signature: sha256=<hex>``, the HMAC-SHA256 of ``"<timestamp>.<body>"`` under
the webhook's secret. A 2xx answer delivers it; anything else (or no answer) is retried
after SECTR_WEBHOOK_BACKOFF_SECONDS, doubling, up to SECTR_WEBHOOK_MAX_ATTEMPTS, then
the delivery is `failed`. Each attempt's status code or error is kept on the row (the
delivery log, in the admin).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.mail import send_mail
from django.db import close_old_connections
from django.utils import timezone

from sessions_app.models import NotificationDelivery
from sessions_app.team_budgets import BUDGET_EVENT, budget_email

log = logging.getLogger("sectr.notifications")

WEBHOOK_TIMEOUT = 5.0
#: A claimed delivery is retried by anyone after this long (its sender died mid-call).
CLAIM_SECONDS = 60.0
BATCH = 20


def sign(secret: str, timestamp: str, body: bytes) -> str:
    """The X-Sectr-Signature value of a body sent at `timestamp`."""
    digest = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    return f"sha256={digest}"


def backoff(attempts: int) -> timedelta:
    base = float(getattr(settings, "SECTR_WEBHOOK_BACKOFF_SECONDS", 10.0))
    return timedelta(seconds=base * (2 ** max(attempts - 1, 0)))


def claim_due(limit: int = BATCH) -> list[NotificationDelivery]:
    """Deliveries due now, each claimed by pushing its next attempt CLAIM_SECONDS out
    with a conditional UPDATE: of several senders, exactly one gets each."""
    now = timezone.now()
    due = list(
        NotificationDelivery.objects.filter(status=NotificationDelivery.PENDING, next_attempt_at__lte=now)
        .order_by("next_attempt_at", "id")
        .values_list("id", "next_attempt_at")[:limit]
    )
    claimed_ids = []
    for delivery_id, seen in due:
        won = NotificationDelivery.objects.filter(
            pk=delivery_id, status=NotificationDelivery.PENDING, next_attempt_at=seen
        ).update(next_attempt_at=now + timedelta(seconds=CLAIM_SECONDS))
        if won:
            claimed_ids.append(delivery_id)
    return list(NotificationDelivery.objects.filter(pk__in=claimed_ids).select_related("webhook").order_by("id"))


def post_webhook(delivery: NotificationDelivery) -> int:
    """POST one webhook call; its HTTP status (raises OSError when there is no answer)."""
    assert delivery.webhook is not None
    body = json.dumps(delivery.payload, sort_keys=True, separators=(",", ":")).encode()
    timestamp = str(int(time.time()))
    request = urllib.request.Request(  # noqa: S310 - the URL is an operator's (admin), http(s) only
        delivery.webhook.url,
        data=body,
        method="POST",
        headers={
            "Content-Type": "application/json",
            "User-Agent": "Sectr-Webhook/1",
            "X-Sectr-Event": delivery.event,
            "X-Sectr-Delivery": str(delivery.pk),
            "X-Sectr-Timestamp": timestamp,
            "X-Sectr-Signature": sign(delivery.webhook.secret, timestamp, body),
        },
    )
    if not delivery.webhook.url.startswith(("http://", "https://")):
        raise OSError("webhook URLs must be http or https")
    try:
        with urllib.request.urlopen(request, timeout=WEBHOOK_TIMEOUT) as response:  # noqa: S310 - checked above
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def send_email(delivery: NotificationDelivery) -> None:
    payload: dict[str, Any] = delivery.payload
    if delivery.event == BUDGET_EVENT:
        send_mail(*budget_email(payload), None, list(delivery.recipients))
        return
    title = payload.get("session_title") or "an untitled session"
    subject = f"[Sectr] {payload.get('requester')} asks to run {payload.get('tool')} ({payload.get('team')})"
    arguments = json.dumps(payload.get("arguments"), indent=2, ensure_ascii=False)
    body = (
        f"{payload.get('requester')}'s agent in “{title}” (team {payload.get('team')}) asks to run "
        f"{payload.get('tool')} with:\n\n{arguments}\n\nDecide it here: {payload.get('url')}\n"
    )
    send_mail(subject, body, None, list(delivery.recipients))


def attempt(delivery: NotificationDelivery) -> bool:
    """Send one claimed delivery and record the outcome; True when delivered."""
    status_code: int | None = None
    error = ""
    try:
        if delivery.channel == NotificationDelivery.EMAIL:
            send_email(delivery)
            delivered = True
        else:
            status_code = post_webhook(delivery)
            delivered = 200 <= status_code < 300
            if not delivered:
                error = f"HTTP {status_code}"
    except Exception as exc:  # an unreachable host, a timeout, a refused mail server
        delivered = False
        error = f"{type(exc).__name__}: {exc}"[:500]
    attempts = delivery.attempts + 1
    now = timezone.now()
    fields: dict[str, Any] = {"attempts": attempts, "last_status_code": status_code, "last_error": error}
    if delivered:
        fields.update(status=NotificationDelivery.DELIVERED, delivered_at=now)
    elif attempts >= int(getattr(settings, "SECTR_WEBHOOK_MAX_ATTEMPTS", 6)):
        fields.update(status=NotificationDelivery.FAILED)
        log.warning("notification %s gave up after %s attempts: %s", delivery.pk, attempts, error)
    else:
        fields.update(next_attempt_at=now + backoff(attempts))
    NotificationDelivery.objects.filter(pk=delivery.pk).update(**fields)
    return delivered


def deliver_due(limit: int = BATCH) -> int:
    """Claim and send what is due; how many were attempted."""
    claimed = claim_due(limit)
    for delivery in claimed:
        attempt(delivery)
    return len(claimed)


def _deliver_in_thread(limit: int) -> int:
    # The sender's own thread: stale connections closed around the work, like
    # channels' database_sync_to_async.
    close_old_connections()
    try:
        return deliver_due(limit)
    finally:
        close_old_connections()


class NotificationSender:
    """The worker's notification loop: every `interval` seconds, send what is due, in
    one thread of its own (a slow webhook holds up neither runs nor journal writes)."""

    def __init__(self, interval: float = 1.0) -> None:
        self.interval = interval
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sectr-notify")

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                try:
                    sent = await loop.run_in_executor(self._executor, _deliver_in_thread, BATCH)
                except Exception:
                    log.warning("sending notifications failed", exc_info=True)
                    sent = 0
                if sent < BATCH:
                    await asyncio.sleep(self.interval)
        finally:
            self._executor.shutdown(wait=False)
