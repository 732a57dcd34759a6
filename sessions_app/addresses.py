"""Which hosts Sectr may send to: the one address guard for every URL someone else
chose (media URLs handed to a provider, team webhooks, and any later outbound call).

`check_public_host(host, port)` resolves the host (socket.getaddrinfo) and returns the
addresses it resolves to when every one of them is public; it raises AddressRefused when
the host is a name of this machine or of a metadata service (``localhost``,
``*.internal``, ...), does not resolve, or resolves to any loopback, private
(RFC 1918, ULA), link-local (169.254/16 where cloud metadata services answer,
fe80::/10), shared (100.64/10), unspecified (``0.0.0.0``, ``::``), reserved, multicast
or documentation address, including the IPv6 forms that embed such an IPv4 address
(``::ffff:127.0.0.1``, NAT64, 6to4, ...). Literal addresses are judged as they are;
legacy IPv4 spellings (``127.1``, ``2130706433``, ``0x7f000001``) go through the
resolver, which reads them as the address they spell.

A caller that connects should connect to the addresses this returns and never resolve
the name again: between a check and a second lookup, DNS can answer something else
(rebinding). sessions_app.moderation.notifications does so for webhooks, and every HTTP
connection to a team's MCP server goes through sessions_app.mcp_servers.connect_addresses
(sectr.mcp.http). Media URLs are only handed to a provider: Sectr fetches nothing there.

`check_webhook_url(url)` is the guard for a team webhook's URL (an absolute http(s) URL
whose host passes, or is in SECTR_WEBHOOK_ALLOWED_HOSTS): the team page, the API and the
admin check it when a webhook is saved, the sender before each delivery.

`allowed` lets an operator reach internal hosts on purpose (SECTR_WEBHOOK_ALLOWED_HOSTS):
entries are host names (matched exactly, case-insensitively: the name passes whatever it
resolves to), addresses, or networks in CIDR form (``10.0.0.0/8``: a resolved address in
one of them passes).
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings

from sectr.errors import ValidationFailed

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

#: Host names that name a metadata service or this machine whatever DNS says.
BLOCKED_HOSTNAMES = frozenset(
    {"localhost", "metadata", "metadata.google.internal", "instance-data", "metadata.azure.internal"}
)
BLOCKED_HOST_SUFFIXES = (".localhost", ".internal", ".local", ".localdomain")

# IPv6 ranges whose last 32 bits are an IPv4 address that a gateway or the host's own
# stack will reach: NAT64 (RFC 6052 well-known prefix), SIIT's IPv4-translated form
# (::ffff:0:a.b.c.d), and the deprecated IPv4-compatible form (::a.b.c.d). An address in
# one of them is as public as the IPv4 it embeds, whatever Python's tables say about the
# IPv6 range itself.
EMBEDDED_IPV4_NETWORKS = (
    ipaddress.IPv6Network("64:ff9b::/96"),
    ipaddress.IPv6Network("::ffff:0:0:0/96"),
    ipaddress.IPv6Network("::/96"),
)
# Ranges refused whole: local-use NAT64 (RFC 8215, where the IPv4 sits at a
# prefix-dependent offset) and Teredo (2001::/32, a tunnel to an arbitrary IPv4).
REFUSED_IPV6_NETWORKS = (
    ipaddress.IPv6Network("64:ff9b:1::/48"),
    ipaddress.IPv6Network("2001::/32"),
)

#: AddressRefused.kind values.
BLOCKED_NAME = "name"
UNRESOLVABLE = "unresolvable"
INTERNAL = "internal"


class AddressRefused(Exception):
    """A host Sectr must not send to; `kind` says why (BLOCKED_NAME, UNRESOLVABLE, INTERNAL)."""

    def __init__(self, host: str, kind: str) -> None:
        self.host = host
        self.kind = kind
        super().__init__(self.message)

    @property
    def message(self) -> str:
        if self.kind == BLOCKED_NAME:
            return f"{self.host} names this machine or a metadata service"
        if self.kind == UNRESOLVABLE:
            return f"{self.host} does not resolve to a usable address"
        return f"{self.host} is (or resolves to) a loopback, private, link-local or metadata address"


def embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address stands for (mapped, translated, compatible, NAT64, 6to4)."""
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if any(address in network for network in EMBEDDED_IPV4_NETWORKS):
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def is_public_address(address: IPAddress) -> bool:
    if isinstance(address, ipaddress.IPv6Address):
        if address.scope_id is not None or any(address in network for network in REFUSED_IPV6_NETWORKS):
            return False
        embedded = embedded_ipv4(address)
        if embedded is not None:
            # Judged by the IPv4 it reaches: [::ffff:0:7f00:1] is loopback, [64:ff9b::a9fe:a9fe]
            # the metadata service.
            return is_public_address(embedded)
    # is_global excludes loopback, private (RFC 1918, ULA), link-local (169.254/16, where
    # the cloud metadata services live, and fe80::/10), shared (100.64/10, Alibaba's
    # metadata), unspecified and documentation ranges; reserved (240/4, ...) and
    # multicast are refused explicitly, whatever the Python version's tables say.
    return address.is_global and not address.is_multicast and not address.is_reserved


def normalise_host(host: str) -> str:
    """A URL's host as the guard compares it: lower case, no brackets, no trailing dot."""
    return host.strip().strip("[]").rstrip(".").lower()


def _allowed(entries: Iterable[str]) -> tuple[frozenset[str], tuple[IPNetwork, ...]]:
    names: set[str] = set()
    networks: list[IPNetwork] = []
    for entry in entries:
        text = normalise_host(entry)
        if not text:
            continue
        try:
            networks.append(ipaddress.ip_network(text, strict=False))
        except ValueError:
            names.add(text)
    return frozenset(names), tuple(networks)


def _resolve(host: str, port: int) -> list[IPAddress]:
    try:
        literal: IPAddress | None = ipaddress.ip_address(host)
    except ValueError:
        literal = None
    if literal is not None:
        return [literal]
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        raise AddressRefused(host, UNRESOLVABLE) from None
    addresses: list[IPAddress] = []
    for info in infos:
        try:
            address = ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])
        except ValueError:
            raise AddressRefused(host, UNRESOLVABLE) from None
        if address not in addresses:
            addresses.append(address)
    if not addresses:
        raise AddressRefused(host, UNRESOLVABLE)
    return addresses


def check_public_host(host: str, port: int, allowed: Iterable[str] = ()) -> list[IPAddress]:
    """The addresses `host` resolves to (a literal address: itself), every one of them
    public or allowed; AddressRefused otherwise. See the module's docstring."""
    host = normalise_host(host)
    if not host:
        raise AddressRefused(host, UNRESOLVABLE)
    allowed_names, allowed_networks = _allowed(allowed)
    if host in allowed_names:
        return _resolve(host, port)
    if host in BLOCKED_HOSTNAMES or host.endswith(BLOCKED_HOST_SUFFIXES):
        raise AddressRefused(host, BLOCKED_NAME)
    addresses = _resolve(host, port)
    for address in addresses:
        if not is_public_address(address) and not any(
            address.version == network.version and address in network for network in allowed_networks
        ):
            raise AddressRefused(host, INTERNAL)
    return addresses


# ---- team webhooks ----

WEBHOOK_SCHEMES = {"http": 80, "https": 443}
WEBHOOK_URL_MAX_LENGTH = 500  # TeamWebhook.url's max_length


class WebhookAddressRefused(ValidationFailed):
    """A webhook URL whose host the address guard refuses; `kind` as AddressRefused's."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message, code="url")
        self.kind = kind


@dataclass(frozen=True)
class WebhookTarget:
    """A webhook URL taken apart, with the addresses its host resolved to (each checked)."""

    scheme: str
    host: str
    port: int
    request_target: str  # path and query: what the request line asks for
    addresses: tuple[IPAddress, ...]


def check_webhook_url(url: Any) -> WebhookTarget:
    """The target of a webhook URL if Sectr may call it; ValidationFailed(code="url") otherwise.

    An absolute http(s) URL whose host passes the address guard
    (sessions_app.addresses.check_public_host) or is listed in
    SECTR_WEBHOOK_ALLOWED_HOSTS. Checked when a webhook is saved and again before each
    delivery: DNS may answer differently by then.
    """
    if not isinstance(url, str) or not url or len(url) > WEBHOOK_URL_MAX_LENGTH:
        raise ValidationFailed(f"a webhook URL is at most {WEBHOOK_URL_MAX_LENGTH} characters", code="url")
    if any(ch.isspace() or ord(ch) < 32 or ord(ch) == 127 for ch in url):
        raise ValidationFailed("a webhook URL must not contain spaces or control characters", code="url")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise ValidationFailed("the webhook URL is malformed", code="url") from None
    scheme = parts.scheme.lower()
    if scheme not in WEBHOOK_SCHEMES:
        raise ValidationFailed("webhook URLs must be absolute http or https URLs", code="url")
    host = normalise_host(parts.hostname or "")
    if not host:
        raise ValidationFailed("the webhook URL has no host", code="url")
    port = port or WEBHOOK_SCHEMES[scheme]
    try:
        addresses = check_public_host(host, port, settings.SECTR_WEBHOOK_ALLOWED_HOSTS)
    except AddressRefused as refused:
        if refused.kind == UNRESOLVABLE:
            raise WebhookAddressRefused(f"the webhook URL's host {host} does not resolve", refused.kind) from None
        raise WebhookAddressRefused(
            f"webhooks may not call internal addresses: {refused.message} (an operator can allow it"
            " in SECTR_WEBHOOK_ALLOWED_HOSTS)",
            refused.kind,
        ) from None
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return WebhookTarget(scheme, host, port, target, tuple(addresses))
