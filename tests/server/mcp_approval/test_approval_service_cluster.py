"""The approval service's session-based revision behind the production topology's
balancer: every request of one MCP session reaches the Daphne that opened it.

That revision keeps an MCP session in one Daphne process; another process answers its
`Mcp-Session-Id` with 404. scripts/haproxy.cfg.in routes a request naming the id to the
process whose `initialize` answer issued it (a stick table), so a client of the
session-based revision works with two Daphnes behind round robin. Without that, every
other request would reach the other Daphne.

PostgreSQL only, like the other topology tests: the cluster runs in the PostgreSQL pass.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.cluster import HAPROXY, Cluster

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(300),
    pytest.mark.skipif(
        not os.environ.get("DATABASE_URL", "").startswith(("postgres://", "postgresql://")),
        reason="the production topology's tests run in the PostgreSQL pass (scripts/test.sh)",
    ),
    pytest.mark.skipif(not Path(HAPROXY).exists(), reason="needs Debian's haproxy (scripts/ensure_haproxy.sh)"),
]

SESSION_BASED = "2025-11-25"


def rpc(method: str, params: dict[str, Any] | None = None, ident: int | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
    if params is not None:
        message["params"] = params
    if ident is not None:
        message["id"] = ident
    return message


def answer_of(response: httpx.Response) -> dict[str, Any]:
    """The JSON-RPC answer of a POST, whether sent as JSON or as one SSE event."""
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        data = [line[5:].strip() for line in response.text.splitlines() if line.startswith("data:")]
        return dict(json.loads(data[-1]))
    return dict(response.json())


def test_an_mcp_session_stays_on_the_daphne_that_opened_it() -> None:
    with Cluster(daphnes=2, workers=0, name_backends=True, private_redis=True) as cluster:
        out = cluster.manage(
            "shell",
            "-c",
            "from django.contrib.auth import get_user_model\n"
            "from sessions_app.actions.teams import do_create_team, do_set_membership\n"
            "from sessions_app.models import ApiToken\n"
            "alice = get_user_model().objects.create_user('alice')\n"
            "do_create_team('crew'); do_set_membership('crew', 'alice', 'member')\n"
            "print(ApiToken.issue(alice, 'sticky')[1])\n",
        )
        token = out.strip().splitlines()[-1]
        headers = {
            "Authorization": f"Bearer {token}",
            "Accept": "application/json, text/event-stream",
            "Content-Type": "application/json",
        }
        url = cluster.url("/mcp") + "?team=crew"
        backends_seen: set[str] = set()
        with httpx.Client(headers=headers, timeout=30) as http:
            for attempt in range(3):  # three MCP sessions: round robin spreads their starts
                opened = http.post(
                    url,
                    json=rpc(
                        "initialize",
                        {
                            "protocolVersion": SESSION_BASED,
                            "capabilities": {},
                            "clientInfo": {"name": "sticky-test", "version": "1"},
                        },
                        ident=1,
                    ),
                )
                assert opened.status_code == 200, opened.text
                assert answer_of(opened)["result"]["protocolVersion"] == SESSION_BASED
                session_id = opened.headers["mcp-session-id"]
                home = opened.headers["x-sectr-backend"]
                backends_seen.add(home)
                session = {"Mcp-Session-Id": session_id, "MCP-Protocol-Version": SESSION_BASED}
                initialized = http.post(url, json=rpc("notifications/initialized"), headers=session)
                assert initialized.status_code == 202, initialized.text
                for n in range(6):
                    listed = http.post(url, json=rpc("tools/list", {}, ident=10 + n), headers=session)
                    assert listed.status_code == 200, (attempt, n, listed.status_code, listed.text)
                    assert listed.headers["x-sectr-backend"] == home
                    names = [tool["name"] for tool in answer_of(listed)["result"]["tools"]]
                    assert names == ["approval_prompt"]
        assert len(backends_seen) == 2, backends_seen  # both Daphnes opened sessions
