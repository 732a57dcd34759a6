"""Arguments a person edits on an MCP tool's ask are checked against the tool's input
JSON Schema when they decide (docs/mcp.md, Calls): the API answers 400
`invalid_arguments` naming what is wrong, the web answers 400 with the reason in #flash,
and neither records anything; arguments that fit run as edited."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from sectr.events import EventType
from sessions_app import actions
from sessions_app.actions.tokens import do_issue_token
from sessions_app.models import AskIndex, AuditEntry, Session

from .conftest import commits
from .test_mcp_runs import enable, git_session, journal, of_type, run_worker


def awaiting_add(people: dict[str, Any], repo: Path) -> tuple[Session, str]:
    """A session whose `git__git_add` of c.txt waits for a person."""
    (repo / "c.txt").write_text("three\n")
    enable(people, "git")
    session = git_session(people)
    add = "!tool git__git_add " + json.dumps({"repo_path": str(repo), "files": ["c.txt"]})
    actions.do_post_message(people["owner"], session.pk, add)
    run_worker()
    session.refresh_from_db()
    ask = session.state["pending_ask"]
    assert ask["name"] == "git__git_add"
    return session, ask["ask_id"]


def nothing_recorded(session: Session, ask_id: str, envelopes: int) -> None:
    session.refresh_from_db()
    assert len(journal(session)) == envelopes
    assert session.state["pending_ask"]["ask_id"] == ask_id
    assert AskIndex.objects.get(pk=ask_id).status == AskIndex.PENDING
    assert not AuditEntry.objects.filter(session=session, kind=AuditEntry.DECISION).exists()


@pytest.mark.django_db(transaction=True)
def test_the_api_refuses_edited_arguments_that_break_the_schema_and_records_nothing(
    people: dict[str, Any], installation: Path
) -> None:
    repo = installation
    session, ask_id = awaiting_add(people, repo)
    envelopes = len(journal(session))
    api = Client(HTTP_AUTHORIZATION=f"Bearer {do_issue_token(people['moderator'], 't')[1]}")
    for arguments, says in (
        # A nested type: only the whole schema sees it (files is an array of strings).
        ({"repo_path": str(repo), "files": [3]}, "$.files[0]: 3 is not of type 'string'"),
        ({"repo_path": str(repo), "files": "c.txt"}, "$.files: 'c.txt' is not of type 'array'"),
        ({"files": ["c.txt"]}, "$: 'repo_path' is a required property"),
    ):
        refused = api.post(
            f"/api/v1/asks/{ask_id}", {"verdict": "allow_once", "arguments": arguments}, content_type="application/json"
        )
        assert refused.status_code == 400, refused.content
        error = refused.json()["error"]
        assert error["code"] == "invalid_arguments" and "input schema" in error["message"]
        assert says in error["message"], error["message"]
        nothing_recorded(session, ask_id, envelopes)

    # Arguments that fit run as the person edited them.
    (repo / "d.txt").write_text("four\n")
    edited = {"repo_path": str(repo), "files": ["d.txt"]}
    decided = api.post(
        f"/api/v1/asks/{ask_id}", {"verdict": "allow_once", "arguments": edited}, content_type="application/json"
    )
    assert decided.status_code == 202, decided.content
    run_worker()
    (result,) = of_type(session, EventType.TOOL_RESULT)
    assert not result.get("is_error") and "d.txt" in result["content"], result
    decision = AuditEntry.objects.get(session=session, kind=AuditEntry.DECISION)
    assert decision.run_arguments == edited


@pytest.mark.django_db(transaction=True)
def test_the_web_refuses_edited_arguments_that_break_the_schema_with_a_flash_and_changes_nothing(
    people: dict[str, Any], installation: Path
) -> None:
    repo = installation
    session, ask_id = awaiting_add(people, repo)
    envelopes = len(journal(session))
    page = Client()
    page.force_login(people["moderator"])
    bad = json.dumps({"repo_path": str(repo), "files": [{"name": "c.txt"}]})
    for where in ("chat", "queue"):
        refused = page.post(
            f"/asks/{ask_id}/decide",
            {"verdict": "allow_once", "arguments": bad, "where": where},
            HTTP_HX_REQUEST="true",
        )
        assert refused.status_code == 400
        html = refused.content.decode()
        assert 'id="flash"' in html and "do not fit the tool&#x27;s input schema" in html, html
        assert "$.files[0]" in html and "is not of type &#x27;string&#x27;" in html
        assert ask_id in html  # the card, still pending, in place
        nothing_recorded(session, ask_id, envelopes)
    # Without htmx: back to the page, the reason as a message.
    plain = page.post(f"/asks/{ask_id}/decide", {"verdict": "allow_once", "arguments": bad}, follow=True)
    assert "do not fit the tool&#x27;s input schema" in plain.content.decode()
    nothing_recorded(session, ask_id, envelopes)

    good = json.dumps({"repo_path": str(repo), "files": ["c.txt"]})
    decided = page.post(f"/asks/{ask_id}/decide", {"verdict": "allow_once", "arguments": good}, HTTP_HX_REQUEST="true")
    assert decided.status_code == 200
    run_worker()
    (result,) = of_type(session, EventType.TOOL_RESULT)
    assert not result.get("is_error"), result
    assert commits(repo) == ["first"]  # staged, not committed: git_add ran
