"""A team server's host is resolved once per connection, by the address guard, and the
connection goes to the address it checked (docs/mcp.md, Addresses): a name that answers
the check with a public address and the connection with 127.0.0.1 (DNS rebinding) never
reaches the loopback, on save (discovery) nor in a run; an allowed name still works.

The resolver is `socket.getaddrinfo`, which the guard and any HTTP client that resolves
by itself both use, replaced for the test's names only."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import Client

from sectr.events import EventType
from sessions_app import actions, mcp_servers
from sessions_app.actions.tokens import do_issue_token

from .test_mcp_runs import git_session, of_type, run_worker

URL = "/api/v1/teams/crew/mcp-servers"
PUBLIC = "93.184.215.14"


class Resolver:
    """Answers for `names`: the next of `answers` on each lookup (the last one for ever)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.answers: dict[str, list[str]] = {}
        self.lookups: list[str] = []
        real = socket.getaddrinfo

        def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> list[Any]:
            name = host.decode() if isinstance(host, bytes) else str(host)
            if name not in self.answers:
                return real(host, port, *args, **kwargs)
            answers = self.answers[name]
            address = answers.pop(0) if len(answers) > 1 else answers[0]
            self.lookups.append(address)
            return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (address, int(port or 0)))]

        monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


@pytest.fixture
def resolver(monkeypatch: pytest.MonkeyPatch) -> Iterator[Resolver]:
    mcp_servers._guarded.clear()
    yield Resolver(monkeypatch)
    mcp_servers._guarded.clear()


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A loopback port that accepts TCP connections and never answers: whatever reaches
    it is waiting in its backlog afterwards."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    sock.setblocking(False)
    try:
        yield sock
    finally:
        sock.close()


def api(user: Any) -> Client:
    return Client(HTTP_AUTHORIZATION=f"Bearer {do_issue_token(user, 't')[1]}")


@pytest.mark.django_db(transaction=True)
def test_a_name_that_rebinds_to_loopback_after_the_check_is_never_connected_to(
    people: dict[str, Any], resolver: Resolver, listener: socket.socket, settings: Any
) -> None:
    settings.SECTR_MCP_ALLOWED_HOSTS = []
    port = listener.getsockname()[1]
    resolver.answers["rebind.example.com"] = [PUBLIC, "127.0.0.1"]
    body = {"name": "rebind", "url": f"http://rebind.example.com:{port}/mcp"}
    response = api(people["moderator"]).post(URL, body, content_type="application/json")
    # The save's check saw a public address; discovery's connection asked again, got the
    # loopback, and was refused before any connection was made.
    assert response.status_code == 201, response.content
    server = response.json()
    assert server["health"] == "error" and server["discovered_tools"] == []
    assert "refused" in server["last_error"] and "loopback" in server["last_error"], server["last_error"]
    assert resolver.lookups == [PUBLIC, "127.0.0.1"]
    with pytest.raises(BlockingIOError):
        listener.accept()  # nothing reached the port


@pytest.mark.django_db(transaction=True)
def test_an_allowed_name_works_and_a_run_cannot_be_rebound_to_loopback(
    people: dict[str, Any], resolver: Resolver, everything_http: str, settings: Any
) -> None:
    # An operator allows a name that resolves to this machine: it works like any server.
    settings.SECTR_MCP_ALLOWED_HOSTS = ["mcp.example.com"]
    resolver.answers["mcp.example.com"] = ["127.0.0.1"]
    url = everything_http.replace("127.0.0.1", "mcp.example.com")
    response = api(people["moderator"]).post(URL, {"name": "every", "url": url}, content_type="application/json")
    assert response.status_code == 201 and response.json()["health"] == "ok", response.content
    session = git_session(people, tools=["every__*"])
    actions.do_post_message(people["owner"], session.pk, '!tool every__echo {"message": "by name"}')
    run_worker()
    (result,) = of_type(session, EventType.TOOL_RESULT)
    assert result["content"] == "Echo: by name" and not result.get("is_error")

    # Not allowed any more, and the name now answers the run's check with a public
    # address and the connection with the loopback: the call is refused, as an error result.
    settings.SECTR_MCP_ALLOWED_HOSTS = []
    mcp_servers._guarded.clear()
    resolver.answers["mcp.example.com"] = [PUBLIC, "127.0.0.1"]
    resolver.lookups.clear()
    actions.do_post_message(people["owner"], session.pk, '!tool every__echo {"message": "rebound"}')
    run_worker()
    results = of_type(session, EventType.TOOL_RESULT)
    assert len(results) == 2 and results[1]["is_error"] is True
    assert "MCP server every is unreachable" in results[1]["content"] and "refused" in results[1]["content"]
    assert resolver.lookups[:2] == [PUBLIC, "127.0.0.1"]
