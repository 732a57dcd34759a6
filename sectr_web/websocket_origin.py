"""The websocket origin check, with the port, as Django's CSRF check does it.

Channels' AllowedHostsOriginValidator compares only the Origin's host name with
ALLOWED_HOSTS, so a page served from another port of the same host (another app on
localhost:3000, say) could open Sectr's sockets with the visitor's cookies. Here, as in
CsrfViewMiddleware._origin_verified, the Origin must be the request's own origin
(scheme, host and port, the Host header being one of ALLOWED_HOSTS) or one of
CSRF_TRUSTED_ORIGINS (exact, or a ``*.`` subdomain wildcard, the port included).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.http.request import split_domain_port, validate_host
from django.utils.http import is_same_domain

DEFAULT_PORTS = {"http": 80, "https": 443}


def _header(scope: dict[str, Any], name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            try:
                return str(value.decode("latin-1"))
            except (AttributeError, UnicodeDecodeError):
                return None
    return None


def _normalized(scheme: str, netloc: str) -> tuple[str, str, int] | None:
    """(scheme, host, port) of an origin, the port filled in from the scheme."""
    try:
        parts = urlsplit(f"{scheme}://{netloc}")
        port = parts.port
    except ValueError:
        return None
    if parts.hostname is None or scheme not in DEFAULT_PORTS:
        return None
    return scheme, parts.hostname.lower(), port or DEFAULT_PORTS[scheme]


def _is_secure(scope: dict[str, Any]) -> bool:
    if scope.get("scheme") in ("wss", "https"):
        return True
    proxy = getattr(settings, "SECURE_PROXY_SSL_HEADER", None)
    if proxy:
        name, expected = proxy  # e.g. ("HTTP_X_FORWARDED_PROTO", "https")
        header = name.removeprefix("HTTP_").replace("_", "-").lower().encode()
        value = _header(scope, header)
        return value is not None and value.split(",")[0].strip() == expected
    return False


def origin_is_allowed(scope: dict[str, Any]) -> bool:
    origin = _header(scope, b"origin")
    if not origin or origin == "null":
        return False
    try:
        parsed = urlsplit(origin)
    except ValueError:
        return False
    claimed = _normalized(parsed.scheme.lower(), parsed.netloc)
    if claimed is None:
        return False
    host = _header(scope, b"host")
    if host:
        domain, _port = split_domain_port(host)
        if domain and validate_host(domain, settings.ALLOWED_HOSTS):
            own = _normalized("https" if _is_secure(scope) else "http", host)
            if own is not None and own == claimed:
                return True
    for trusted in getattr(settings, "CSRF_TRUSTED_ORIGINS", []):
        trusted_parts = urlsplit(trusted)
        if trusted_parts.scheme.lower() != claimed[0]:
            continue
        if "*" in trusted_parts.netloc:
            # Django's wildcard: "https://*.example.com" is any subdomain; the port,
            # when the entry names one, must match too (netlocs are compared whole).
            if is_same_domain(parsed.netloc.lower(), trusted_parts.netloc.lower().lstrip("*")):
                return True
        elif _normalized(trusted_parts.scheme.lower(), trusted_parts.netloc) == claimed:
            return True
    return False


class SameOriginValidator:
    """ASGI middleware: a websocket whose Origin is not the site's own is refused (403)."""

    def __init__(self, application: Any) -> None:
        self.application = application

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        if scope["type"] == "websocket" and not origin_is_allowed(scope):
            return await WebsocketDenier()(scope, receive, send)
        return await self.application(scope, receive, send)
