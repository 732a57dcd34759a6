"""The guarded HTTP transport of MCP servers (sectr.mcp.http) over TLS: the connection
goes to the address the guard returned, while TLS still names the host (SNI), checks the
certificate against it, and the Host header is the URL's; a certificate for another name
is refused, and so is a host the guard refuses."""

from __future__ import annotations

import asyncio
import datetime
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from sectr.mcp.http import GuardedTransport

NAME = "mcp.sectr-test.invalid"


def self_signed(tmp_path: Path, name: str) -> tuple[Path, Path, bytes]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    pem = cert.public_bytes(serialization.Encoding.PEM)
    cert_path, key_path = tmp_path / f"{name}.pem", tmp_path / f"{name}.key"
    cert_path.write_bytes(pem)
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path, pem


class TlsServer:
    """An HTTPS server on 127.0.0.1 that notes the SNI and Host of each request."""

    def __init__(self, cert: Path, key: Path) -> None:
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.load_cert_chain(cert, key)
        self.sni: list[str | None] = []
        self.hosts: list[str] = []
        self.context.sni_callback = lambda _sock, name, _ctx: self.sni.append(name)
        self.port = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode()
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            writer.close()
            return
        for line in head.split("\r\n")[1:]:
            if line.lower().startswith("host:"):
                self.hosts.append(line.split(":", 1)[1].strip())
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
        await writer.drain()
        writer.close()


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[tuple[TlsServer, bytes]]:
    cert, key, pem = self_signed(tmp_path, NAME)
    tls = TlsServer(cert, key)
    listening = await asyncio.start_server(tls.handle, "127.0.0.1", 0, ssl=tls.context)
    tls.port = listening.sockets[0].getsockname()[1]
    async with listening:
        yield tls, pem


def to_loopback(host: str, port: int) -> list[str]:
    return ["127.0.0.1"]


async def get(url: str, guard: Any, trusted: bytes) -> httpx2.Response:
    context = ssl.create_default_context(cadata=trusted.decode())
    async with httpx2.AsyncClient(transport=GuardedTransport(guard, ssl_context=context)) as client:
        return await client.get(url)


async def test_tls_names_the_host_while_the_connection_goes_to_the_checked_address(
    server: tuple[TlsServer, bytes],
) -> None:
    tls, pem = server
    response = await get(f"https://{NAME}:{tls.port}/mcp", to_loopback, pem)
    assert (response.status_code, response.text) == (200, "ok")
    assert tls.sni == [NAME] and tls.hosts == [f"{NAME}:{tls.port}"]


async def test_the_certificate_is_checked_against_the_urls_host_not_the_address(
    server: tuple[TlsServer, bytes],
) -> None:
    tls, pem = server
    # The same trusted certificate and address, another name in the URL: the name counts.
    with pytest.raises(httpx2.ConnectError, match="Hostname mismatch"):
        await get(f"https://other.sectr-test.invalid:{tls.port}/mcp", to_loopback, pem)
    assert tls.sni == ["other.sectr-test.invalid"] and tls.hosts == []


async def test_a_host_the_guard_refuses_is_never_connected_to(server: tuple[TlsServer, bytes]) -> None:
    tls, pem = server

    def refuse(host: str, port: int) -> list[str]:
        raise ValueError(f"{host} resolves to a loopback address")

    with pytest.raises(httpx2.ConnectError, match=f"connection to {NAME} refused: {NAME} resolves to a loopback"):
        await get(f"https://{NAME}:{tls.port}/mcp", refuse, pem)
    assert tls.sni == [] and tls.hosts == []
