"""Team webhooks never reach internal addresses: the address guard when a webhook is saved
(the admin's form) and again at each delivery (DNS can change), connections to the
checked address only (DNS rebinding), no redirects, and a delivery log that keeps the
class of a failure, never the peer's words.

Receivers are real servers on loopback (HTTP, or raw TCP for a banner); names that are
not IP addresses go through a fake resolver (socket.getaddrinfo patched), so nothing
leaves the machine.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from sectr.errors import ValidationFailed
from sessions_app.addresses import check_webhook_url
from sessions_app.models import NotificationDelivery, Team, TeamWebhook
from sessions_app.moderation import notifications
from sessions_app.moderation.notifications import deliver_due
from tests.server.conftest import SessionFactory
from tests.server.moderation.test_moderation_notifications import SECRET, Receiver
from tests.server.moderation.test_moderation_ui import pending, team_session

pytestmark = pytest.mark.django_db
PUBLIC = "93.184.215.14"
REAL_GETADDRINFO = socket.getaddrinfo


class FakeDNS:
    """Answers for the names in `answers` (every address of a name at once); a name in
    `later` answers that instead from its second lookup on (DNS rebinding). Other names
    (and numeric forms such as 127.1) go to the real resolver, which needs no network
    for them."""

    def __init__(self) -> None:
        self.answers: dict[str, list[str]] = {}
        self.later: dict[str, list[str]] = {}
        self.looked_up: list[str] = []

    def getaddrinfo(self, host: str, port: Any, *args: Any, **kwargs: Any) -> list[Any]:
        if host not in self.answers:
            return REAL_GETADDRINFO(host, port, *args, **kwargs)
        addresses = self.later[host] if host in self.later and host in self.looked_up else self.answers[host]
        self.looked_up.append(host)
        return [
            (socket.AF_INET6 if ":" in address else socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port))
            for address in addresses
        ]


@pytest.fixture
def dns(monkeypatch: pytest.MonkeyPatch) -> FakeDNS:
    fake = FakeDNS()
    monkeypatch.setattr(socket, "getaddrinfo", fake.getaddrinfo)
    return fake


@pytest.fixture
def ops(db: None) -> Team:
    return Team.objects.create(name="ops")


@pytest.fixture
def staff_client(db: None) -> Client:
    staff = get_user_model().objects.create_user("operator", is_staff=True, is_superuser=True)
    client = Client()
    client.force_login(staff)
    return client


def save_in_admin(client: Client, team: Team, url: str) -> Any:
    return client.post(
        "/admin/sessions_app/teamwebhook/add/",
        {
            "team": team.pk,
            "url": url,
            "kind": "json",
            "secret": SECRET,
            "active": "on",
            "created_at_0": "2026-01-01",
            "created_at_1": "00:00:00",
            "deliveries-TOTAL_FORMS": "0",
            "deliveries-INITIAL_FORMS": "0",
            "deliveries-MIN_NUM_FORMS": "0",
            "deliveries-MAX_NUM_FORMS": "0",
        },
    )


def delivery_log(make_session: SessionFactory, team: Team) -> NotificationDelivery:
    """Make an ask in the team, send what is due, and return its webhook delivery."""
    pending(team_session(make_session, team))
    deliver_due()
    return NotificationDelivery.objects.get(channel="webhook")


INTERNAL_URLS = [
    "http://127.0.0.1/hook",
    "http://127.0.0.1:8000/hook",
    "http://localhost/hook",
    "http://LOCALHOST./hook",
    "http://[::1]/hook",
    "http://[::ffff:127.0.0.1]/hook",
    "http://[::ffff:7f00:1]/hook",
    "http://[::]/hook",
    "http://0.0.0.0/hook",
    "http://169.254.169.254/latest/meta-data/",
    "http://[fd00:ec2::254]/",
    "http://[64:ff9b::a9fe:a9fe]/",
    "http://metadata.google.internal/computeMetadata/v1/",
    "http://10.0.0.1/hook",
    "http://172.16.0.1/hook",
    "http://192.168.1.1/hook",
    "http://100.64.0.1/hook",
    "http://[fe80::1]/hook",
    "http://127.1/hook",  # legacy spellings the resolver reads as 127.0.0.1
    "http://2130706433/hook",
    "http://rebind.example/hook",  # a name that resolves to loopback
    "http://mixed.example/hook",  # one internal address among public ones is enough
]


@pytest.mark.parametrize("url", INTERNAL_URLS)
def test_the_admin_refuses_a_webhook_url_that_is_or_resolves_to_an_internal_address(
    url: str, staff_client: Client, dns: FakeDNS
) -> None:
    dns.answers["rebind.example"] = ["127.0.0.1"]
    dns.answers["mixed.example"] = [PUBLIC, "10.1.2.3"]
    team = Team.objects.create(name="ops")
    response = staff_client.post("/admin/sessions_app/teamwebhook/add/", {})  # the form renders
    assert response.status_code == 200
    response = save_in_admin(staff_client, team, url)
    assert response.status_code == 200  # the form again, with the error
    page = response.content.decode()
    # Django's URL field refuses some legacy spellings (127.1) before the guard sees them.
    assert "webhooks may not call internal addresses" in page or "Enter a valid URL" in page
    assert not TeamWebhook.objects.exists()
    with pytest.raises(ValidationFailed) as caught:
        check_webhook_url(url)
    assert caught.value.code == "url"


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("ftp://93.184.215.14/hook", "http or https"),
        ("http://nx.example/hook", "does not resolve"),
        ("http:///hook", "no host"),
        ("http://93.184.215.14:99999/hook", "malformed"),
        ("http://93.184.215.14/a b", "spaces"),
    ],
)
def test_other_unusable_webhook_urls_are_refused_with_their_reason(url: str, reason: str, dns: FakeDNS) -> None:
    with pytest.raises(ValidationFailed) as caught:
        check_webhook_url(url)
    assert reason in caught.value.message


def test_a_public_host_and_an_allowed_internal_one_can_be_saved(
    staff_client: Client, dns: FakeDNS, settings: Any
) -> None:
    dns.answers["hooks.example"] = [PUBLIC]
    team = Team.objects.create(name="ops")
    response = save_in_admin(staff_client, team, "https://hooks.example/sectr")
    assert response.status_code == 302, response.content.decode()[-2000:]
    settings.SECTR_WEBHOOK_ALLOWED_HOSTS = ["localhost", "10.0.0.0/8"]
    assert save_in_admin(staff_client, team, "http://localhost:9000/hook").status_code == 302
    assert save_in_admin(staff_client, team, "http://10.20.30.40/hook").status_code == 302
    assert save_in_admin(staff_client, team, "http://192.168.1.1/hook").status_code == 200  # not listed
    assert sorted(TeamWebhook.objects.values_list("url", flat=True)) == [
        "http://10.20.30.40/hook",
        "http://localhost:9000/hook",
        "https://hooks.example/sectr",
    ]


def test_a_webhook_whose_host_resolves_to_loopback_at_delivery_is_not_called(
    make_session: SessionFactory,
    ops: Team,
    dns: FakeDNS,
) -> None:
    receiver = Receiver()
    try:
        port = receiver.server.server_address[1]
        dns.answers["hooks.example"] = [PUBLIC]  # when it is saved
        url = f"http://hooks.example:{port}/hook"
        check_webhook_url(url)
        TeamWebhook.objects.create(team=ops, url=url, secret=SECRET)
        dns.answers["hooks.example"] = ["127.0.0.1"]  # by the time it is called
        delivery = delivery_log(make_session, ops)
        assert (delivery.status, delivery.last_status_code) == ("pending", None)
        assert delivery.last_error == "refused: internal address"
        assert receiver.calls == []
    finally:
        receiver.close()


def test_a_loopback_webhook_saved_without_the_form_is_refused_at_delivery(
    make_session: SessionFactory,
    ops: Team,
    receiver: Receiver,
) -> None:
    TeamWebhook.objects.create(team=ops, url=receiver.url, secret=SECRET)  # no form, no check
    delivery = delivery_log(make_session, ops)
    assert delivery.last_error == "refused: internal address" and receiver.calls == []


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    yield server
    server.close()


def test_the_connection_goes_to_the_address_that_was_checked(
    make_session: SessionFactory,
    ops: Team,
    dns: FakeDNS,
    settings: Any,
) -> None:
    # DNS rebinding: the name answers an allowed address to the check, another one to any
    # later lookup. The call must reach the checked address (127.0.0.1), never a second
    # answer (127.0.0.2, where an "internal service" listens on the same port).
    receiver = Receiver()
    port = receiver.server.server_address[1]
    hits: list[str] = []
    internal = ThreadingHTTPServer(("127.0.0.2", port), recording_handler(hits))
    threading.Thread(target=internal.serve_forever, daemon=True).start()
    try:
        settings.SECTR_WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]
        TeamWebhook.objects.create(team=ops, url=f"http://rebind.example:{port}/hook", secret=SECRET)
        dns.answers["rebind.example"] = ["127.0.0.1"]
        dns.later["rebind.example"] = ["127.0.0.2"]
        delivery = delivery_log(make_session, ops)
        assert (delivery.status, delivery.last_status_code) == ("delivered", 204)
        assert len(receiver.calls) == 1 and receiver.calls[0]["signed"] and hits == []
        assert dns.looked_up == ["rebind.example"]  # one lookup: the checked answer is the one used
    finally:
        receiver.close()
        internal.shutdown()
        internal.server_close()


def recording_handler(hits: list[str], status: int = 204, headers: dict[str, str] | None = None) -> type:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self.answer()

        def do_POST(self) -> None:  # noqa: N802
            self.answer()

        def answer(self) -> None:
            hits.append(f"{self.command} {self.path} {self.headers.get('X-Sectr-Event')}")
            body = b"internal banner: db password is hunter2"
            self.send_response(status)
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    return Handler


def serve(handler: type) -> tuple[ThreadingHTTPServer, int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, server.server_address[1]


def test_a_redirect_to_loopback_is_not_followed(
    make_session: SessionFactory,
    ops: Team,
    settings: Any,
) -> None:
    settings.SECTR_WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]  # the receiver; the redirect's target too
    stolen: list[str] = []
    target, target_port = serve(recording_handler(stolen))
    redirects: list[str] = []
    location = {"Location": f"http://127.0.0.1:{target_port}/admin/steal"}
    redirector, port = serve(recording_handler(redirects, status=302, headers=location))
    try:
        TeamWebhook.objects.create(team=ops, url=f"http://127.0.0.1:{port}/hook", secret=SECRET)
        delivery = delivery_log(make_session, ops)
        assert redirects == ["POST /hook ask.requested"] and stolen == []
        assert (delivery.status, delivery.last_status_code) == ("pending", 302)
        assert delivery.last_error == "HTTP 302 (redirects are not followed)"
    finally:
        for server in (redirector, target):
            server.shutdown()
            server.server_close()


def raw_server(answer: Callable[[socket.socket], None]) -> tuple[socket.socket, int]:
    """A TCP server on loopback that answers each connection with `answer`."""
    listener = socket.create_server(("127.0.0.1", 0))

    def accept() -> None:
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            with connection:
                answer(connection)

    threading.Thread(target=accept, daemon=True).start()
    return listener, listener.getsockname()[1]


def test_the_delivery_log_keeps_the_class_of_a_failure_never_the_peers_words(
    make_session: SessionFactory,
    ops: Team,
    settings: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings.SECTR_WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]
    monkeypatch.setattr(notifications, "WEBHOOK_TIMEOUT", 0.5)
    released = threading.Event()

    def banner(connection: socket.socket) -> None:
        connection.recv(65536)  # the request, then an SSH server's answer to it
        connection.sendall(b"SSH-2.0-OpenSSH_9.6p1 Ubuntu-3ubuntu13.5\r\nInvalid SSH identification string.\r\n")

    def silence(connection: socket.socket) -> None:
        released.wait(5)

    ssh, ssh_port = raw_server(banner)
    mute, mute_port = raw_server(silence)
    failing, failing_port = serve(recording_handler([], status=500))
    closed_port = socket.create_server(("127.0.0.1", 0)).getsockname()[1]  # closed again at once
    expected = {
        ssh_port: "not an HTTP answer",
        mute_port: "timeout",
        failing_port: "HTTP 500",
        closed_port: "connection refused",
    }
    try:
        for port in expected:
            TeamWebhook.objects.create(team=ops, url=f"http://127.0.0.1:{port}/hook", secret=SECRET)
        pending(team_session(make_session, ops))
        deliver_due()
        log = {
            int(url.rsplit(":", 1)[1].split("/")[0]): error
            for url, error in NotificationDelivery.objects.filter(channel="webhook").values_list(
                "webhook__url", "last_error"
            )
        }
        assert log == expected
        assert not any(word in error for error in log.values() for word in ("SSH", "hunter2", "Ubuntu"))
    finally:
        released.set()
        for listener in (ssh, mute):
            listener.close()
        failing.shutdown()
        failing.server_close()
