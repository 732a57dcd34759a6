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
the webhook's secret. A 2xx answer delivers it; anything else (a 3xx too: redirects
are never followed, or no answer) is retried after SECTR_WEBHOOK_BACKOFF_SECONDS,
doubling, up to SECTR_WEBHOOK_MAX_ATTEMPTS, then the delivery is `failed`. Each
attempt's status code or the class of its error ("connection refused", "timeout",
"refused: internal address", never the peer's words) is kept on the row (the delivery
log, in the admin).

Webhook URLs are someone's choice, so the sender must not become a way into the
internal network: the URL's host goes through the address guard
(sessions_app.addresses.check_webhook_url) when the webhook is saved (the team page, the
API, the admin) and again before every attempt, and the connection goes to an address
that check approved, so a DNS answer that changes between the check and the connection
(rebinding) is never used.
SECTR_WEBHOOK_ALLOWED_HOSTS lets the operator allow internal receivers.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import hmac
import http.client
import json
import logging
import smtplib
import socket
import ssl
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.mail import EmailMessage, get_connection, send_mail
from django.db import close_old_connections
from django.utils import timezone

from sectr.errors import ValidationFailed
from sessions_app.action_links import EMAIL, link_url
from sessions_app.addresses import UNRESOLVABLE, IPAddress, WebhookAddressRefused, WebhookTarget, check_webhook_url
from sessions_app.compiled import AtNow
from sessions_app.models import Membership, NotificationDelivery, TeamWebhook
from sessions_app.moderation.slack import MAY_HAVE_RUN, slack_message
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


#: Whether anything is due: every worker's sender asks once a second, and nearly always
#: nothing is. Compiled once (sessions_app.compiled): building the due rows' queryset
#: each time was most of an idle worker's notification loop (py-spy).
_anything_due = AtNow(
    lambda now: NotificationDelivery.objects.filter(
        status=NotificationDelivery.PENDING, next_attempt_at__lte=now
    ).values_list("id")[:1],
    NotificationDelivery._meta.get_field("next_attempt_at"),
)


def anything_due() -> bool:
    """Whether a delivery is due now (one statement; `claim_due` asks it first too)."""
    return bool(_anything_due.rows(timezone.now()))


def claim_due(limit: int = BATCH) -> list[NotificationDelivery]:
    """Deliveries due now, each claimed by pushing its next attempt CLAIM_SECONDS out
    with a conditional UPDATE: of several senders, exactly one gets each."""
    now = timezone.now()
    if not _anything_due.rows(now):
        return []
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
    if not claimed_ids:
        # Nothing due, nearly always: no query, but Django would still build and compile
        # the one below before finding `pk__in` empty (a third of an idle worker's
        # notification loop under py-spy, which runs once a second in every worker).
        return []
    return list(NotificationDelivery.objects.filter(pk__in=claimed_ids).select_related("webhook").order_by("id"))


class _PinnedHTTPConnection(http.client.HTTPConnection):
    """An HTTP connection to one checked address; the Host header still names the host."""

    def __init__(self, host: str, port: int, address: IPAddress, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout)
        self.address = address

    def connect(self) -> None:
        self.sock = socket.create_connection((str(self.address), self.port), self.timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class _PinnedHTTPSConnection(http.client.HTTPSConnection):
    """As _PinnedHTTPConnection, over TLS: the certificate is checked against the host name (SNI)."""

    def __init__(self, host: str, port: int, address: IPAddress, timeout: float) -> None:
        self.tls = ssl.create_default_context()
        super().__init__(host, port, timeout=timeout, context=self.tls)
        self.address = address

    def connect(self) -> None:
        sock = socket.create_connection((str(self.address), self.port), self.timeout)
        self.sock = self.tls.wrap_socket(sock, server_hostname=self.host)


def _connect(target: WebhookTarget) -> http.client.HTTPConnection:
    """A connection to the first of the target's checked addresses that answers."""
    kind = _PinnedHTTPSConnection if target.scheme == "https" else _PinnedHTTPConnection
    failure: OSError | None = None
    for address in target.addresses:
        connection = kind(target.host, target.port, address, WEBHOOK_TIMEOUT)
        try:
            connection.connect()
            return connection
        except OSError as exc:
            connection.close()
            failure = exc
    assert failure is not None  # check_public_host returns at least one address
    raise failure


def webhook_body(delivery: NotificationDelivery) -> bytes:
    """The body of a webhook call: the payload as JSON, or, for a `slack` webhook, a
    Slack incoming-webhook message (sessions_app.moderation.slack). Signed alike."""
    assert delivery.webhook is not None
    body = slack_message(delivery.payload) if delivery.webhook.kind == TeamWebhook.SLACK else delivery.payload
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def post_webhook(delivery: NotificationDelivery) -> int:
    """POST one webhook call; its HTTP status (raises when there is no answer).

    The URL is checked again now (ValidationFailed when its host is or now resolves to
    an internal address) and the call goes to an address that check returned, never to
    a second lookup of the name (DNS rebinding). Redirects are not followed: a 3xx is
    the answer, and not a 2xx.
    """
    assert delivery.webhook is not None
    target = check_webhook_url(delivery.webhook.url)
    body = webhook_body(delivery)
    timestamp = str(int(time.time()))
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "Sectr-Webhook/1",
        "X-Sectr-Event": delivery.event,
        "X-Sectr-Delivery": str(delivery.pk),
        "X-Sectr-Timestamp": timestamp,
        "X-Sectr-Signature": sign(delivery.webhook.secret, timestamp, body),
    }
    connection = _connect(target)
    try:
        connection.request("POST", target.request_target, body=body, headers=headers)
        # Only the status line and headers are read: the body of the answer is never
        # looked at (nor kept), whatever the peer sends.
        return int(connection.getresponse().status)
    finally:
        connection.close()


def delivery_error(exc: BaseException) -> str:
    """What the delivery log says about a failed attempt: the class of failure only.

    Never the peer's words (a banner, a status line, a body) nor the exception's text:
    the log is shown to people who chose the URL, and must not make the sender a probe
    of what answers where.
    """
    if isinstance(exc, WebhookAddressRefused):
        return "host does not resolve" if exc.kind == UNRESOLVABLE else "refused: internal address"
    if isinstance(exc, ValidationFailed):  # a URL saved before it was checked
        return "refused: not a valid webhook URL"
    if isinstance(exc, (TimeoutError, socket.timeout)):
        return "timeout"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, socket.gaierror):
        return "host does not resolve"
    if isinstance(exc, ssl.SSLCertVerificationError):
        return "TLS certificate not valid for the host"
    if isinstance(exc, ssl.SSLError):
        return "TLS error"
    if isinstance(exc, http.client.RemoteDisconnected):
        return "connection closed without an answer"
    if isinstance(exc, http.client.HTTPException):
        return "not an HTTP answer"
    if isinstance(exc, (ConnectionResetError, BrokenPipeError)):
        return "connection reset"
    if isinstance(exc, smtplib.SMTPException):
        return f"mail not accepted ({type(exc).__name__})"
    if isinstance(exc, OSError):
        if exc.errno in (errno.ENETUNREACH, errno.EHOSTUNREACH):
            return "host unreachable"
        return "connection failed"
    return "delivery failed"


def status_error(status_code: int) -> str:
    if 300 <= status_code < 400:
        return f"HTTP {status_code} (redirects are not followed)"
    return f"HTTP {status_code}"


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
        f"{payload.get('tool')} with:\n\n{arguments}\n\n"
    )
    if payload.get("may_have_run"):
        body += f"{MAY_HAVE_RUN}\n\n"
    # One message per moderator: each carries an action link bound to its recipient
    # (sessions_app.action_links), made now so the outbox never holds one.
    moderators = moderators_by_email(delivery.team_id, list(delivery.recipients))
    messages = []
    for address in delivery.recipients:
        user_id = moderators.get(address)
        link = ""
        if user_id is not None:
            url = link_url(delivery.ask_id, EMAIL, user_id)
            link = f"Decide it on one screen (this link works once, for 24 hours): {url}\n"
        text = f"{body}{link}Or in the approval queue: {payload.get('url')}\n"
        messages.append(EmailMessage(subject, text, None, [address]))
    get_connection().send_messages(messages)


def moderators_by_email(team_id: int, addresses: list[str]) -> dict[str, int]:
    """The active moderator of the team behind each address (the first, if several share one)."""
    found: dict[str, int] = {}
    rows = (
        Membership.objects.filter(
            team_id=team_id, role=Membership.MODERATOR, user__is_active=True, user__email__in=addresses
        )
        .order_by("user_id")
        .values_list("user__email", "user_id")
    )
    for address, user_id in rows:
        found.setdefault(address, user_id)
    return found


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
                error = status_error(status_code)
    except Exception as exc:  # an internal address, an unreachable host, a timeout, a refused mail server
        delivered = False
        error = delivery_error(exc)
        if error == "delivery failed":
            log.warning("notification %s: unexpected failure", delivery.pk, exc_info=True)
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
    one thread of its own (a slow webhook holds up neither runs nor journal writes).

    With `told`, the loop does not look every interval itself: whoever made it looks
    (`anything_due`, in a thread hop it makes anyway: the worker's expiry sweep, every
    second) and calls `due()`; the loop then claims and sends. It still looks on its own
    every `fallback` seconds. Its own look each second was a timer, a thread hop and a
    statement of every idle worker: 0.9 ms of CPU a second, worker and PostgreSQL
    (bench/idle.py)."""

    def __init__(self, interval: float = 1.0, *, told: bool = False, fallback: float = 30.0) -> None:
        self.interval = interval
        self.told = told
        self.fallback = fallback
        self._due: asyncio.Event | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sectr-notify")

    def due(self) -> None:
        """Something is due: the loop claims and sends it now (with `told`)."""
        if self._due is not None:
            self._due.set()

    def look_yourself(self) -> None:
        """Nobody will call `due()` any more (the worker's sweep stopped while it drains):
        look every interval again, starting now."""
        self.told = False
        self.due()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        self._due = asyncio.Event()
        try:
            while True:
                self._due.clear()  # before the look: a due() during it makes the next one
                try:
                    sent = await loop.run_in_executor(self._executor, _deliver_in_thread, BATCH)
                except Exception:
                    log.warning("sending notifications failed", exc_info=True)
                    sent = 0
                if sent >= BATCH:
                    continue
                if not self.told:
                    await asyncio.sleep(self.interval)
                    continue
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._due.wait(), self.fallback)
        finally:
            self._executor.shutdown(wait=False)
