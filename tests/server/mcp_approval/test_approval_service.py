"""The approval service at /mcp, driven by the real `mcp` clients (2.x: the stateless
revision; 1.x in var/mcp1-venv: the session-based one) against a live Sectr (Daphne and
its worker; PostgreSQL and Redis when DATABASE_URL and REDIS_URL name them)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.liveserver import LiveSectr
from tests.server.mcp_approval.mcp_clients import (
    MCP1_PYTHON,
    Answer,
    call_v1,
    call_v2,
    finish_v1,
    list_tools_v2,
    start_v1,
)

pytestmark = [
    pytest.mark.skipif(not MCP1_PYTHON.exists(), reason="run scripts/ensure_mcp1_client.sh first"),
    pytest.mark.timeout(300),
]
USERS = ("alice", "bob", "carol", "dora", "eve")
#: alice: a member of ops; bob: of ops and dev; carol and dora: moderators of ops; eve: of none.
SETUP = f"""
import json
from django.contrib.auth import get_user_model
from sessions_app.actions.teams import do_create_team, do_set_membership
from sessions_app.models import ApiToken
users = {{name: get_user_model().objects.create_user(name, password="pw-Secret-123") for name in {USERS!r}}}
do_create_team("ops"); do_create_team("dev")
for team, name, role in [("ops", "alice", "member"), ("ops", "bob", "member"), ("dev", "bob", "member"),
                         ("ops", "carol", "moderator"), ("ops", "dora", "moderator")]:
    do_set_membership(team, name, role)
print(json.dumps({{name: ApiToken.issue(user, "mcp tests")[1] for name, user in users.items()}}))
"""

POOL = ThreadPoolExecutor(max_workers=4)


def start_server(env: dict[str, str] | None = None) -> LiveSectr:
    live = LiveSectr(env={"SECTR_API_RATE_LIMIT": "0/60", **(env or {})})
    live.__enter__()
    try:
        # One process for the whole set-up (each manage.py costs a Django start-up).
        out = live.manage("shell", "-c", SETUP)
        live.tokens = json.loads(out.strip().splitlines()[-1])  # type: ignore[attr-defined]
        if live.postgres and live.env.get("SECTR_EMBEDDED_WORKER") != "1":  # workers of their own
            live.start_worker()
    except BaseException:
        live.close()
        raise
    return live


@pytest.fixture(scope="module")
def live() -> Iterator[LiveSectr]:
    server = start_server()
    try:
        yield server
    finally:
        server.close()


def token(live: LiveSectr, user: str) -> str:
    return str(live.tokens[user])  # type: ignore[attr-defined]


def api(live: LiveSectr, user: str, method: str, path: str, **kwargs: Any) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token(live, user)}"}
    return httpx.request(method, live.url(f"/api/v1{path}"), headers=headers, timeout=30, **kwargs)


def asks(live: LiveSectr, tool: str, state: str | None = None) -> list[dict[str, Any]]:
    params = {"tool": tool, **({"state": state} if state else {})}
    response = api(live, "carol", "GET", "/asks", params=params)
    assert response.status_code == 200, response.text
    return list(response.json()["asks"])


def pending_ask(live: LiveSectr, tool: str, timeout: float = 30.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = asks(live, tool, "pending")
        if found:
            return found[0]
        time.sleep(0.1)
    raise AssertionError(f"no pending ask for {tool}:\n{live.log()}")


def decide(live: LiveSectr, user: str, ask_id: str, **body: Any) -> httpx.Response:
    response = api(live, user, "POST", f"/asks/{ask_id}", json=body)
    assert response.status_code == 202, response.text
    return response


def audit(live: LiveSectr, **params: str) -> list[dict[str, Any]]:
    response = api(live, "carol", "GET", "/audit", params={"limit": 500, **params})
    assert response.status_code == 200, response.text
    return list(response.json()["entries"])


def in_thread(coro: Any) -> Future[Answer]:
    return POOL.submit(asyncio.run, coro)


def mcp_url(live: LiveSectr, team: str | None = None) -> str:
    return live.url("/mcp") + (f"?team={team}" if team else "")


# ---- the endpoint ---------------------------------------------------------------------


def test_without_a_valid_token_401_and_without_a_team_400(live: LiveSectr) -> None:
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    none = httpx.post(mcp_url(live), json=body)
    assert none.status_code == 401 and none.headers["WWW-Authenticate"].startswith("Bearer")
    forged = httpx.post(mcp_url(live), json=body, headers={"Authorization": "Bearer sectr_nope"})
    assert forged.status_code == 401
    two_teams = httpx.post(mcp_url(live), json=body, headers={"Authorization": f"Bearer {token(live, 'bob')}"})
    assert two_teams.status_code == 400 and two_teams.json()["error"]["code"] == "team_required"
    not_member = httpx.post(
        mcp_url(live, "dev"), json=body, headers={"Authorization": f"Bearer {token(live, 'alice')}"}
    )
    assert not_member.status_code == 400 and not_member.json()["error"]["code"] == "invalid_team"
    tools = asyncio.run(list_tools_v2(mcp_url(live), token(live, "alice")))
    assert [t.name for t in tools] == ["approval_prompt"]
    assert tools[0].input_schema["required"] == ["tool_name", "input"]


def test_bad_arguments_are_a_tool_error_and_ask_nothing(live: LiveSectr) -> None:
    answer = asyncio.run(call_v2(mcp_url(live), token(live, "alice"), {"tool_name": "", "input": {}}))
    assert answer.is_error and "tool_name" in answer.data["error"]
    answer = asyncio.run(call_v2(mcp_url(live), token(live, "alice"), {"tool_name": "Odd", "input": [1]}))
    assert answer.is_error and "input" in answer.data["error"]
    assert asks(live, "Odd") == []


# ---- decisions ------------------------------------------------------------------------


def test_an_edited_approval_answers_allow_with_the_edited_input(live: LiveSectr) -> None:
    call = in_thread(
        call_v2(
            mcp_url(live),
            token(live, "alice"),
            {"tool_name": "Write", "input": {"path": "notes.txt", "text": "hi"}, "tool_use_id": "tu-edit"},
        )
    )
    ask = pending_ask(live, "Write")
    assert ask["arguments"] == {"path": "notes.txt", "text": "hi"} and ask["owner"] == "alice"
    assert ask["team"] == "ops"
    decide(live, "carol", ask["ask_id"], verdict="allow_once", arguments={"path": "safe/notes.txt", "text": "hi"})
    answer = call.result(60)
    assert answer.protocol_version == "2026-07-28"
    assert answer.data == {"behavior": "allow", "updatedInput": {"path": "safe/notes.txt", "text": "hi"}}
    session = api(live, "alice", "GET", f"/sessions/{ask['session_id']}").json()
    assert session["title"].startswith("claude-code 2.0.0")
    rows = [r for r in audit(live, session=ask["session_id"]) if r.get("ask_id") == ask["ask_id"]]
    decision = next(r for r in rows if r["kind"] == "decision")
    assert decision["actor"] == "carol" and decision["run_arguments"] == {"path": "safe/notes.txt", "text": "hi"}
    # Asked again for the same tool use: the same ask's decision, at once, no second ask.
    again = asyncio.run(
        call_v2(mcp_url(live), token(live, "alice"), {"tool_name": "Write", "input": {}, "tool_use_id": "tu-edit"})
    )
    assert again.data == answer.data
    assert len(asks(live, "Write")) == 1


def test_a_denial_with_a_note_answers_deny_with_the_note(live: LiveSectr) -> None:
    proc = start_v1(mcp_url(live), token(live, "alice"), [{"tool_name": "Bash", "input": {"command": "make deploy"}}])
    ask = pending_ask(live, "Bash")
    decide(live, "dora", ask["ask_id"], verdict="deny", note="not on a Friday")
    (answer,) = finish_v1(proc)
    assert answer.protocol_version == "2025-11-25"
    assert answer.data["behavior"] == "deny"
    assert "not on a Friday" in answer.data["message"] and "dora" in answer.data["message"]
    kinds = {r["kind"] for r in audit(live, session=ask["session_id"], kind="ask")} | {
        r["kind"] for r in audit(live, session=ask["session_id"]) if r["ask_id"] == ask["ask_id"]
    }
    assert {"ask", "decision"} <= kinds


def test_a_response_answers_deny_with_the_persons_text(live: LiveSectr) -> None:
    call = in_thread(call_v2(mcp_url(live), token(live, "alice"), {"tool_name": "Fetch", "input": {"url": "x"}}))
    ask = pending_ask(live, "Fetch")
    decide(live, "carol", ask["ask_id"], verdict="respond", result="use the cached copy in /tmp/x")
    answer = call.result(60)
    assert answer.data["behavior"] == "deny" and "use the cached copy in /tmp/x" in answer.data["message"]


def test_a_deny_rule_answers_at_once_in_both_revisions(live: LiveSectr) -> None:
    rule = api(live, "carol", "POST", "/teams/ops/rules", json={"tool": "Rm*", "action": "deny"})
    assert rule.status_code == 201, rule.text
    try:
        started = time.monotonic()
        v2 = asyncio.run(call_v2(mcp_url(live), token(live, "alice"), {"tool_name": "RmRf", "input": {"p": "/"}}))
        v1 = call_v1(mcp_url(live), token(live, "alice"), {"tool_name": "RmDir", "input": {"p": "/"}})[0]
        assert time.monotonic() - started < 20  # two client start-ups, no wait for anyone
        for answer in (v2, v1):
            assert answer.data["behavior"] == "deny" and "rule" in answer.data["message"]
        assert asks(live, "RmRf", "pending") == [] and asks(live, "RmRf")[0]["decided_by"].startswith("rule:")
        assert any(r["kind"] == "rule" for r in audit(live, tool="RmRf"))
    finally:
        api(live, "carol", "DELETE", f"/teams/ops/rules/{rule.json()['id']}")


def test_a_quorum_of_two_is_honoured(live: LiveSectr) -> None:
    rule = api(
        live, "carol", "POST", "/teams/ops/rules", json={"tool": "Deploy", "action": "ask", "approvals_required": 2}
    )
    assert rule.status_code == 201, rule.text
    try:
        proc = start_v1(mcp_url(live), token(live, "alice"), [{"tool_name": "Deploy", "input": {"env": "prod"}}])
        ask = pending_ask(live, "Deploy")
        assert ask["approvals_required"] == 2
        decide(live, "carol", ask["ask_id"], verdict="allow_once")
        time.sleep(1.5)
        assert proc.poll() is None, "one approval of two answered the call"
        assert asks(live, "Deploy", "pending")[0]["votes"][0]["approver"] == "carol"
        decide(live, "dora", ask["ask_id"], verdict="allow_once")
        (answer,) = finish_v1(proc)
        assert answer.data == {"behavior": "allow", "updatedInput": {"env": "prod"}}
    finally:
        api(live, "carol", "DELETE", f"/teams/ops/rules/{rule.json()['id']}")


# ---- grouping -------------------------------------------------------------------------


def test_calls_are_grouped_by_client_per_day_by_mcp_session_or_into_a_named_session(live: LiveSectr) -> None:
    allow = api(live, "carol", "POST", "/teams/ops/rules", json={"tool": "Read", "action": "allow"})
    assert allow.status_code == 201, allow.text
    try:
        url, alice = mcp_url(live), token(live, "alice")
        for _ in range(2):
            answer = asyncio.run(call_v2(url, alice, {"tool_name": "Read", "input": {"f": "a"}}, client_name="grouper"))
            assert answer.data == {"behavior": "allow", "updatedInput": {"f": "a"}}
        v1 = call_v1(url, alice, {"tool_name": "Read", "input": {"f": "b"}}, {"tool_name": "Read", "input": {"f": "c"}})
        assert [a.data["behavior"] for a in v1] == ["allow", "allow"]
        sessions = api(live, "alice", "GET", "/sessions", params={"limit": 100}).json()["sessions"]
        titles = [s["title"] for s in sessions]
        assert sum(1 for t in titles if t.startswith("grouper 2.0.0 · ")) == 1
        assert sum(1 for t in titles if t == "claude-code-v1 1.30.0") >= 1
        grouper = next(s for s in sessions if s["title"].startswith("grouper"))
        assert sum(1 for r in audit(live, session=grouper["id"]) if r["kind"] == "rule") == 2
        # A session the caller may write to, named in _meta: the ask goes there.
        mine = api(live, "alice", "POST", "/sessions", json={"title": "my agent", "team": "ops"}).json()
        mine_id = mine["id"]
        named = asyncio.run(
            call_v2(url, alice, {"tool_name": "Read", "input": {"f": "d"}}, meta={"sectr/session": mine_id})
        )
        assert named.data["behavior"] == "allow"
        assert any(r["kind"] == "rule" for r in audit(live, session=mine_id))
        # ...and one they may not write to is an error, asking nothing.
        theirs = asyncio.run(
            call_v2(
                mcp_url(live, "ops"),
                token(live, "bob"),
                {"tool_name": "Read", "input": {"f": "e"}},
                meta={"sectr/session": mine_id},
            )
        )
        assert theirs.is_error and "session" in theirs.data["error"]
        assert sum(1 for r in audit(live, session=mine_id) if r["kind"] == "rule") == 1
    finally:
        api(live, "carol", "DELETE", f"/teams/ops/rules/{allow.json()['id']}")


# ---- restarts, limits, load -----------------------------------------------------------


def test_a_restart_while_a_call_waits_loses_nothing(live: LiveSectr) -> None:
    arguments = {"tool_name": "Migrate", "input": {"db": "main"}, "tool_use_id": "tu-restart"}
    proc = start_v1(mcp_url(live), token(live, "alice"), [arguments])
    ask = pending_ask(live, "Migrate")
    live.restart()
    proc.kill()
    proc.wait(10)
    # The client calls again for the same tool use: the same ask, still pending.
    retry = in_thread(call_v2(mcp_url(live), token(live, "alice"), arguments))
    time.sleep(1.0)
    assert not retry.done()
    assert [a["ask_id"] for a in asks(live, "Migrate")] == [ask["ask_id"]]
    decide(live, "carol", ask["ask_id"], verdict="allow_once")
    assert retry.result(60).data == {"behavior": "allow", "updatedInput": {"db": "main"}}
    # ...and once more after the decision, from the other revision: the same decision.
    (again,) = call_v1(mcp_url(live), token(live, "alice"), arguments)
    assert again.data == {"behavior": "allow", "updatedInput": {"db": "main"}}
    assert len(asks(live, "Migrate")) == 1


def test_two_calls_at_once_for_one_tool_use_make_one_ask(live: LiveSectr) -> None:
    arguments = {"tool_name": "Twice", "input": {"n": 1}, "tool_use_id": "tu-twice"}

    async def both() -> tuple[Answer, Answer]:
        url, alice = mcp_url(live), token(live, "alice")
        return await asyncio.gather(call_v2(url, alice, arguments), call_v2(url, alice, arguments))

    calls = POOL.submit(asyncio.run, both())
    ask = pending_ask(live, "Twice")
    time.sleep(1.0)
    assert [a["ask_id"] for a in asks(live, "Twice")] == [ask["ask_id"]]
    decide(live, "carol", ask["ask_id"], verdict="allow_once")
    assert [a.data["behavior"] for a in calls.result(60)] == ["allow", "allow"]
    assert len(asks(live, "Twice")) == 1


def _threads_and_rss(pid: int) -> tuple[int, int]:
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return int(fields["Threads"]), int(fields["VmRSS"].split()[0]) * 1024


def test_fifty_waiting_calls_hold_without_a_thread_each(live: LiveSectr) -> None:
    assert live.server is not None
    pid = live.server.pid
    # Warm the process up (the MCP manager, the database threads' pool at its size) with
    # calls a rule answers, so that what grows below is what the waiting calls hold.
    rule = api(live, "carol", "POST", "/teams/ops/rules", json={"tool": "Ping", "action": "allow"})

    async def warm_up() -> list[Answer]:
        url, alice = mcp_url(live), token(live, "alice")
        return await asyncio.gather(*(call_v2(url, alice, {"tool_name": "Ping", "input": {}}) for _ in range(25)))

    assert all(a.data["behavior"] == "allow" for a in asyncio.run(warm_up()))
    api(live, "carol", "DELETE", f"/teams/ops/rules/{rule.json()['id']}")
    before_threads, before_rss = _threads_and_rss(pid)
    count = 50

    async def many() -> list[Answer]:
        url, alice = mcp_url(live), token(live, "alice")
        return await asyncio.gather(
            *(
                call_v2(
                    url,
                    alice,
                    {"tool_name": "Load", "input": {"n": i}, "tool_use_id": f"load-{i}"},
                    client_name="load",
                    timeout=280,
                )
                for i in range(count)
            )
        )

    calls = POOL.submit(asyncio.run, many())
    deadline = time.monotonic() + 90
    while len(asks(live, "Load", "pending")) < count and time.monotonic() < deadline:
        time.sleep(0.5)
    pending = asks(live, "Load", "pending")
    assert len(pending) == count
    time.sleep(2.0)  # every call is now waiting
    during_threads, during_rss = _threads_and_rss(pid)
    print(
        f"\n50 waiting calls: threads {before_threads} -> {during_threads}, "
        f"RSS {before_rss / 1e6:.1f} -> {during_rss / 1e6:.1f} MB "
        f"({(during_rss - before_rss) / count / 1024:.0f} KiB a call)"
    )
    assert during_threads - before_threads < 10, (before_threads, during_threads)
    assert not calls.done()
    with ThreadPoolExecutor(max_workers=8) as deciders:
        list(deciders.map(lambda ask: decide(live, "carol", ask["ask_id"], verdict="deny", note="load test"), pending))
    answers = calls.result(200)
    assert all(a.data["behavior"] == "deny" and "load test" in a.data["message"] for a in answers)


def test_the_wait_limit_answers_deny_with_progress_meanwhile() -> None:
    server = start_server({"SECTR_MCP_APPROVAL_WAIT_S": "7"})
    try:
        url, alice = mcp_url(server), token(server, "alice")
        v2 = in_thread(call_v2(url, alice, {"tool_name": "Slow", "input": {}}, progress=True))
        (v1,) = call_v1(url, alice, {"tool_name": "Slow", "input": {"v": 1}}, progress=True)
        answers = [v2.result(60), v1]
        for answer in answers:
            assert answer.data["behavior"] == "deny"
            assert "No decision within 7 s" in answer.data["message"], answer.data
            assert answer.progress, "no progress notification while waiting"
        statuses = {a["status"] for a in asks(server, "Slow")}
        assert statuses == {"withdrawn"}
        assert any(r["kind"] == "withdrawn" for r in audit(server, tool="Slow"))
    finally:
        server.close()
