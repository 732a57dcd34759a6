"""A team's MCP tools in runs the worker executes (docs/mcp.md): offered only to an agent
whose `tools` select them, gated from their annotations under the team's approvals,
errors as results, a crashed stdio server started again, and header secrets nowhere."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from django.apps import apps
from django.core import serializers
from django.test import Client

from sectr.events import EventType
from sectr.fold import fold_messages, last_assistant_text
from sectr.providers import DemoProvider
from sectr.runtime import Runtime
from sessions_app import actions
from sessions_app.actions import mcp_servers as mcp_actions
from sessions_app.actions.tokens import do_issue_token
from sessions_app.dbthread import run_in_db_thread
from sessions_app.journal import DatabaseJournal
from sessions_app.models import AuditEntry, Run, Session, TeamMcpServer
from sessions_app.runtime import session_agent, session_mcp_tools, session_policy
from sessions_app.team_budgets import session_budget_spent
from sessions_app.worker import Worker
from tests.server.conftest import until_idle

from .conftest import commits, start_everything

E = EventType
RUNTIME = Runtime(
    DatabaseJournal(),
    provider=DemoProvider(delay=0.0005),
    rules=session_policy,
    agent=session_agent,
    budget=session_budget_spent,
    extra_tools=session_mcp_tools,
)


def with_worker(body: Callable[[Callable[[], Awaitable[None]]], Awaitable[None]], timeout: float = 60.0) -> None:
    """Run `body(idle)` beside one worker (one MCP pool: its connections last across runs);
    `idle()` waits until no run is queued or running."""

    async def main() -> None:
        worker = Worker(concurrency=4, poll_interval=0.05, lease=5.0, runtime=RUNTIME, listen=False)
        task = asyncio.ensure_future(worker.run(drain_timeout=5))
        try:
            await body(lambda: until_idle(worker, timeout=timeout))
        finally:
            worker.stop()
            await task

    asyncio.run(main())


def run_worker() -> None:
    async def body(idle: Callable[[], Awaitable[None]]) -> None:
        await idle()

    with_worker(body)


def journal(session: Session) -> list[Any]:
    return DatabaseJournal().load_sync(session.pk)


def of_type(session: Session, kind: EventType) -> list[dict[str, Any]]:
    return [dict(e.payload) for e in journal(session) if e.type is kind]


def enable(people: dict[str, Any], *names: str) -> None:
    for name in names:
        server = mcp_actions.do_add_server(people["moderator"], "crew", {"name": name})
        assert server.health == "ok", server.last_error


def git_session(people: dict[str, Any], tools: list[str] | None = None) -> Session:
    definition = {"name": "Git bot", "tools": ["time__*", "git__*"] if tools is None else tools}
    actions.do_create_agent(people["moderator"], "crew", "gitbot", definition)
    return actions.do_create_session(people["owner"], team="crew", agent="crew/gitbot")


def commit_message(repo: Path, message: str) -> str:
    return "!tool git__git_commit " + json.dumps({"repo_path": str(repo), "message": message})


@pytest.mark.django_db(transaction=True)
def test_a_read_only_tool_runs_without_asking(people: dict[str, Any], installation: Path) -> None:
    enable(people, "time", "git")
    session = git_session(people)
    actions.do_post_message(people["owner"], session.pk, '!tool time__get_current_time {"timezone": "UTC"}')
    run_worker()
    (result,) = of_type(session, E.TOOL_RESULT)
    assert not result.get("is_error") and json.loads(result["content"])["timezone"] == "UTC"
    assert of_type(session, E.APPROVAL_REQUESTED) == []
    assert Run.objects.get(session=session).status == Run.COMPLETED


@pytest.mark.django_db(transaction=True)
def test_git_commit_asks_and_commits_only_after_approval(people: dict[str, Any], installation: Path) -> None:
    repo = installation
    enable(people, "git")
    session = git_session(people)
    actions.do_post_message(people["owner"], session.pk, commit_message(repo, "from sectr"))
    run_worker()
    session.refresh_from_db()
    ask = session.state["pending_ask"]
    assert session.state["status"] == "awaiting" and ask["name"] == "git__git_commit"
    assert commits(repo) == ["first"]  # nothing ran yet

    actions.do_decide(people["moderator"], ask["ask_id"], "allow_once")
    run_worker()
    assert commits(repo) == ["from sectr", "first"]
    (result,) = of_type(session, E.TOOL_RESULT)
    assert not result.get("is_error") and "Changes committed successfully" in result["content"]
    # Not idempotent: journaled as started before it ran.
    assert [p["name"] for p in of_type(session, E.TOOL_STARTED)] == ["git__git_commit"]
    decision = AuditEntry.objects.get(session=session, kind=AuditEntry.DECISION)
    assert (decision.tool, decision.actor, decision.verdict) == ("git__git_commit", "moderator", "allow_once")
    assert decision.arguments == {"repo_path": str(repo), "message": "from sectr"}
    page = Client()
    page.force_login(people["moderator"])
    audit = page.get("/approvals/audit/").content.decode()
    assert "MCP server <code>git</code>, tool <code>git_commit</code>" in audit and "from sectr" in audit


@pytest.mark.django_db(transaction=True)
def test_a_denied_commit_never_runs(people: dict[str, Any], installation: Path) -> None:
    repo = installation
    enable(people, "git")
    session = git_session(people)
    actions.do_post_message(people["owner"], session.pk, commit_message(repo, "nope"))
    run_worker()
    session.refresh_from_db()
    actions.do_decide(people["moderator"], session.state["pending_ask"]["ask_id"], "deny")
    run_worker()
    assert commits(repo) == ["first"]
    (result,) = of_type(session, E.TOOL_RESULT)
    assert result["is_error"] and of_type(session, E.TOOL_STARTED) == []


@pytest.mark.django_db(transaction=True)
def test_a_team_rule_decides_an_mcp_tool_by_name_and_argument_glob(people: dict[str, Any], installation: Path) -> None:
    repo = installation
    enable(people, "git")
    actions.do_create_rule(
        people["moderator"], "crew", {"tool": "git__*", "arguments": {"message": "wip*"}, "action": "allow"}
    )
    session = git_session(people)
    actions.do_post_message(people["owner"], session.pk, commit_message(repo, "wip: by rule"))
    run_worker()
    assert commits(repo) == ["wip: by rule", "first"]
    (rule,) = AuditEntry.objects.filter(session=session, kind=AuditEntry.RULE)
    assert rule.tool == "git__git_commit" and rule.verdict == "allow_once"


@pytest.mark.django_db(transaction=True)
def test_only_an_agent_that_selects_them_is_offered_mcp_tools(people: dict[str, Any], installation: Path) -> None:
    enable(people, "time", "git")
    plain = actions.do_create_session(people["owner"], team="crew")  # no agent: the built-in one
    actions.do_post_message(people["owner"], plain.pk, "!offered")
    run_worker()
    offered = last_assistant_text(fold_messages(journal(plain)))
    assert offered.startswith("tools: ") and "__" not in offered
    picky = git_session(people, tools=["time__get_*"])
    actions.do_post_message(people["owner"], picky.pk, "!offered")
    run_worker()
    assert last_assistant_text(fold_messages(journal(picky))) == "tools: time__get_current_time"


@pytest.mark.django_db(transaction=True)
def test_a_disabled_server_offers_nothing(people: dict[str, Any], installation: Path) -> None:
    enable(people, "time")
    mcp_actions.do_update_server(people["moderator"], "crew", "time", {"enabled": False})
    session = git_session(people)
    actions.do_post_message(people["owner"], session.pk, "!offered")
    run_worker()
    assert "time__" not in last_assistant_text(fold_messages(journal(session)))


@pytest.mark.django_db(transaction=True)
def test_a_tool_error_is_an_error_result_and_the_run_ends_normally(people: dict[str, Any], installation: Path) -> None:
    enable(people, "time")
    session = git_session(people)
    actions.do_post_message(people["owner"], session.pk, '!tool time__get_current_time {"timezone": "Nowhere/Never"}')
    run_worker()
    (result,) = of_type(session, E.TOOL_RESULT)
    assert result["is_error"] and "MCP server time: get_current_time reported an error" in result["content"]
    assert Run.objects.get(session=session).status == Run.COMPLETED


def _children(command: str) -> list[int]:
    """This process's children running `command` (the worker's stdio servers)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == os.getpid() and command in cmdline:
            found.append(int(entry))
    return found


@pytest.mark.django_db(transaction=True)
def test_a_stdio_server_that_crashed_is_started_again_for_the_next_call(
    people: dict[str, Any], installation: Path
) -> None:
    enable(people, "time")
    session = git_session(people)
    ask = '!tool time__get_current_time {"timezone": "UTC"}'
    pids: dict[str, list[int]] = {}

    async def body(idle: Callable[[], Awaitable[None]]) -> None:
        await run_in_db_thread(actions.do_post_message, people["owner"], session.pk, ask)
        await idle()
        pids["before"] = _children("mcp-server-time")
        assert len(pids["before"]) == 1  # one connection, kept after the run
        os.kill(pids["before"][0], signal.SIGKILL)
        for _ in range(100):
            if not _children("mcp-server-time"):
                break
            await asyncio.sleep(0.05)
        await run_in_db_thread(actions.do_post_message, people["owner"], session.pk, ask)
        await idle()
        pids["after"] = _children("mcp-server-time")

    with_worker(body)
    assert len(pids["after"]) == 1 and pids["after"] != pids["before"]
    results = of_type(session, E.TOOL_RESULT)
    assert [bool(r.get("is_error")) for r in results] == [False, False], results


@pytest.mark.django_db(transaction=True)
def test_the_worker_keeps_one_connection_per_server_and_counts_its_calls(
    people: dict[str, Any], installation: Path
) -> None:
    from prometheus_client import REGISTRY

    enable(people, "time")
    session = git_session(people)
    before = REGISTRY.get_sample_value("sectr_mcp_calls_total", {"server": "time"}) or 0.0

    async def body(idle: Callable[[], Awaitable[None]]) -> None:
        for _ in range(3):
            await run_in_db_thread(
                actions.do_post_message, people["owner"], session.pk, '!tool time__get_current_time {"timezone": "UTC"}'
            )
            await idle()
            assert len(_children("mcp-server-time")) == 1

    with_worker(body)
    assert _children("mcp-server-time") == []  # closed when the worker drained
    assert REGISTRY.get_sample_value("sectr_mcp_calls_total", {"server": "time"}) == before + 3
    assert (REGISTRY.get_sample_value("sectr_mcp_call_seconds_count", {"server": "time"}) or 0) >= 3


@pytest.mark.django_db(transaction=True)
def test_header_secrets_are_in_no_response_export_journal_row_or_log(
    people: dict[str, Any], everything_http: str, settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    settings.SECTR_MCP_ALLOWED_HOSTS = ["127.0.0.1"]
    secret = "hdr-secret-9f8e7d6c5b4a"
    client = Client(HTTP_AUTHORIZATION=f"Bearer {do_issue_token(people['moderator'], 't')[1]}")
    body = {"name": "every", "url": everything_http, "headers": {"X-Api-Key": secret}}
    responses = [client.post("/api/v1/teams/crew/mcp-servers", body, content_type="application/json")]
    assert responses[0].status_code == 201 and responses[0].json()["health"] == "ok", responses[0].content
    session = git_session(people, tools=["every__*"])
    actions.do_post_message(people["owner"], session.pk, '!tool every__echo {"message": "hello over http"}')
    run_worker()
    (result,) = of_type(session, E.TOOL_RESULT)
    assert result["content"] == "Echo: hello over http"
    owner = Client(HTTP_AUTHORIZATION=f"Bearer {do_issue_token(people['owner'], 't')[1]}")
    responses += [
        client.get("/api/v1/teams/crew/mcp-servers"),
        client.get("/api/v1/teams/crew/mcp-servers/every"),
        client.post("/api/v1/teams/crew/mcp-servers/every/refresh", content_type="application/json"),
        owner.get(f"/api/v1/sessions/{session.pk}/export"),
        owner.get(f"/api/v1/sessions/{session.pk}/export?format=markdown"),
        owner.get(f"/api/v1/sessions/{session.pk}/transcript?view=history"),
    ]
    for response in responses:
        assert response.status_code in (200, 201) and secret not in response.content.decode()
    dump = "".join(serializers.serialize("json", model.objects.all()) for model in apps.get_models())
    assert "X-Api-Key" in dump and secret not in dump  # the name is kept, the value only sealed
    assert secret not in caplog.text and "every" in caplog.text  # the log did talk about the server


@pytest.mark.django_db(transaction=True)
def test_a_server_that_went_away_is_an_error_result_and_shows_on_its_health(
    people: dict[str, Any], settings: Any
) -> None:
    settings.SECTR_MCP_ALLOWED_HOSTS = ["127.0.0.1"]
    proc, url = start_everything()
    try:
        server = mcp_actions.do_add_server(people["moderator"], "crew", {"name": "every", "url": url, "timeout_s": 5})
        assert server.health == "ok"
    finally:
        proc.kill()
        proc.wait()
    session = git_session(people, tools=["every__*"])
    actions.do_post_message(people["owner"], session.pk, '!tool every__echo {"message": "anyone?"}')
    run_worker()
    (result,) = of_type(session, E.TOOL_RESULT)
    assert result["is_error"] and "MCP server every is unreachable" in result["content"]
    assert Run.objects.get(session=session).status == Run.COMPLETED
    row = TeamMcpServer.objects.get(name="every")
    assert row.health == "error" and "MCP server every is unreachable" in row.last_error


@pytest.mark.django_db(transaction=True)
def test_always_allow_grants_that_mcp_tool_for_the_session(people: dict[str, Any], installation: Path) -> None:
    repo = installation
    (repo / "c.txt").write_text("three\n")
    enable(people, "git")
    session = git_session(people)
    actions.do_post_message(people["owner"], session.pk, commit_message(repo, "first by sectr"))
    run_worker()
    session.refresh_from_db()
    actions.do_decide(people["moderator"], session.state["pending_ask"]["ask_id"], "allow_always")
    run_worker()
    add = "!tool git__git_add " + json.dumps({"repo_path": str(repo), "files": ["c.txt"]})
    actions.do_post_message(people["owner"], session.pk, add)  # another tool: it asks
    run_worker()
    session.refresh_from_db()
    assert session.state["pending_ask"]["name"] == "git__git_add"
    actions.do_decide(people["moderator"], session.state["pending_ask"]["ask_id"], "allow_once")
    run_worker()
    actions.do_post_message(people["owner"], session.pk, commit_message(repo, "second by sectr"))
    run_worker()  # the grant: no ask this time
    session.refresh_from_db()
    assert session.state["status"] == "completed" and session.state["pending_ask"] is None
    assert commits(repo) == ["second by sectr", "first by sectr", "first"]
