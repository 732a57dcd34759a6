"""Secrets kept in the database encrypted: a team MCP server's HTTP headers.

`seal(mapping)` gives a Fernet token (AES-128-CBC and HMAC-SHA256, from the
`cryptography` package) of the mapping's JSON, under a key derived from Django's
SECRET_KEY; `unseal(token)` gives the mapping back. A database dump, an export or a
backup then holds no header value in the clear. Changing SECRET_KEY makes the stored
headers unreadable: `unseal` raises SealBroken, and the server's moderators enter the
headers again.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Mapping
from functools import cache

from cryptography.fernet import Fernet, InvalidToken
from django.conf import settings

_PURPOSE = b"sectr.sealed.v1:"


class SealBroken(Exception):
    """A sealed value that cannot be opened (SECRET_KEY changed, or the row was edited)."""


@cache
def _fernet(secret_key: str) -> Fernet:
    digest = hashlib.sha256(_PURPOSE + secret_key.encode()).digest()
    return Fernet(base64.urlsafe_b64encode(digest))


def seal(values: Mapping[str, str]) -> str:
    """The sealed form of `values` ("" for none)."""
    if not values:
        return ""
    return _fernet(settings.SECRET_KEY).encrypt(json.dumps(dict(values)).encode()).decode()


def unseal(token: str) -> dict[str, str]:
    if not token:
        return {}
    try:
        data = json.loads(_fernet(settings.SECRET_KEY).decrypt(token.encode()))
    except (InvalidToken, ValueError):
        raise SealBroken("the stored secrets cannot be read (was SECRET_KEY changed?); enter them again") from None
    return {str(k): str(v) for k, v in data.items()}
