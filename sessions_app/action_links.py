"""Action links: the `/approvals/act/<token>/` link an email or webhook notice of a new
ask carries, to decide that ask from a phone.

A token is signed (django.core.signing under SECRET_KEY, salt `LINK_SALT`), not stored:
it names the ask, the channel (email or webhook) and, for an email, the moderator it
was sent to, and carries the time it was made. So the outbox and the mail hold nothing
that a database reader could turn into a live link of someone else's, an email's links
are made per recipient when the mail is sent, and a forged or altered token fails its
signature. A link expires after `LINK_MAX_AGE_S` (24 h) or as soon as its ask is no
longer pending (decided, expired, withdrawn). It decides once: the SHA-256 of a token
that decided is stored (`ActionLinkUse`) in the transaction of the decision.

Opening a link (GET) never decides, since mail scanners open links; its POST does.
It needs a login, unless the team turned `Links decide without login` on and the link
is an email's (bound to one moderator and one ask); a webhook's link goes to a channel
that many may read, so it always needs one.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core import signing

LINK_SALT = "sectr.approvals.action-link"
LINK_MAX_AGE_S = 24 * 3600
EMAIL = "email"
WEBHOOK = "webhook"
CHANNELS = (EMAIL, WEBHOOK)
TOKEN_MAX = 400


class LinkRefused(Exception):
    """Why a token decides nothing: `invalid` (forged, altered, not a token), `expired`."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class ActionLink:
    token: str
    ask_id: str
    channel: str
    user_id: int | None  # an email's: the moderator it was sent to

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.token.encode()).hexdigest()


def make_token(ask_id: str, channel: str, user_id: int | None = None) -> str:
    if channel not in CHANNELS or (channel == EMAIL) != (user_id is not None):
        raise ValueError("an email's link names its moderator, a webhook's none")
    # The nonce makes two links of one ask for one person distinct tokens (each single-use).
    value = {"a": ask_id, "c": channel, "u": user_id, "n": secrets.token_urlsafe(6)}
    return signing.dumps(value, salt=LINK_SALT, compress=False)


def action_url(token: str) -> str:
    base = str(getattr(settings, "SECTR_BASE_URL", "") or "").rstrip("/")
    return f"{base}/approvals/act/{token}/"


def link_url(ask_id: str, channel: str, user_id: int | None = None) -> str:
    return action_url(make_token(ask_id, channel, user_id))


def read_token(token: str) -> ActionLink:
    """The link a token stands for; LinkRefused when it is forged, altered or expired."""
    if not isinstance(token, str) or not token or len(token) > TOKEN_MAX:
        raise LinkRefused("invalid", "This link is not a valid Sectr link.")
    try:
        value: Any = signing.loads(token, salt=LINK_SALT, max_age=LINK_MAX_AGE_S)
    except signing.SignatureExpired:
        raise LinkRefused("expired", "This link has expired (links work for 24 hours).") from None
    except signing.BadSignature:
        raise LinkRefused("invalid", "This link is not a valid Sectr link.") from None
    if not isinstance(value, dict):
        raise LinkRefused("invalid", "This link is not a valid Sectr link.")
    ask_id, channel, user_id = value.get("a"), value.get("c"), value.get("u")
    if (
        not isinstance(ask_id, str)
        or not re.fullmatch(r"ask_[A-Za-z0-9_-]{1,60}", ask_id)
        or channel not in CHANNELS
        or (channel == EMAIL and (not isinstance(user_id, int) or isinstance(user_id, bool)))
        or (channel == WEBHOOK and user_id is not None)
    ):
        raise LinkRefused("invalid", "This link is not a valid Sectr link.")
    return ActionLink(token, ask_id, str(channel), user_id)
