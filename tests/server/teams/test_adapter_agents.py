"""Adapted agents on the server: a team agent whose `handler` names a PydanticAI or an
OpenAI Agents SDK agent that a plugin module (examples/) registers runs in a session
through the worker, pauses for a moderator's approval, and resumes in a new runtime (as
after a restart) from the journal. The model is the local OpenAI-compatible server."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from sectr.events import EventType
from sectr.fold import fold_messages, last_assistant_text
from sectr.runtime import Runtime
from sessions_app import actions
from sessions_app.actions.tokens import do_issue_token
from sessions_app.journal import DatabaseJournal
from sessions_app.models import Run, Session
from sessions_app.plugins import plugin_registry
from sessions_app.runtime import _AGENT_VERSIONS, get_runtime
from tests.openai_stub_server import STUB_MODEL, OpenAIStubServer, SSEStream, text_stream, tool_call_stream
from tests.server.conftest import work_until_idle

E = EventType
EXAMPLES = {
    "pydantic-ai-release": "examples.pydantic_ai_agent",
    "openai-agents-release": "examples.openai_agents_agent",
}


def scripted(body: dict[str, Any]) -> SSEStream:
    last = body["messages"][-1]
    if last["role"] == "tool":
        return text_stream("Done: ", str(last["content"]))
    if "publish" in str(last.get("content")):
        return tool_call_stream([("call_publish", "publish_release", '{"version": "1.4.0"}')])
    return text_stream("Hello from ", "the release agent")


@pytest.fixture
def stub(settings: Any) -> Iterator[OpenAIStubServer]:
    with OpenAIStubServer(fallback=scripted) as server:
        settings.SECTR_PLUGINS = list(EXAMPLES.values())
        settings.OPENAI_BASE_URL = server.base_url
        settings.OPENAI_API_KEY = "test-key"
        settings.SECTR_MODEL = STUB_MODEL
        restart()
        yield server
    restart()


def restart() -> None:
    """What a new process has: a new registry and runtime (new handler and agent objects)."""
    plugin_registry.cache_clear()
    get_runtime.cache_clear()
    _AGENT_VERSIONS.clear()


@pytest.fixture
def people(db: None) -> dict[str, Any]:
    actions.do_create_team("crew")
    users = {}
    for name, role in (("owner", "member"), ("moderator", "moderator")):
        users[name] = get_user_model().objects.create_user(username=name, email=f"{name}@example.org")
        actions.do_set_membership("crew", name, role)
    return users


def run_worker(runtime: Runtime, timeout: float = 30.0) -> None:
    work_until_idle(runtime, timeout=timeout, concurrency=2)


@pytest.mark.parametrize("handler", sorted(EXAMPLES))
@pytest.mark.django_db(transaction=True)
def test_an_adapted_team_agent_pauses_for_a_moderator_and_resumes_after_a_restart(
    people: dict[str, Any], stub: OpenAIStubServer, handler: str
) -> None:
    example = importlib.import_module(EXAMPLES[handler])
    example.PUBLISHED.clear()
    assert plugin_registry().handlers[handler].source == f"SECTR_PLUGINS {EXAMPLES[handler]}"
    definition = {"name": "Release", "handler": handler, "instructions": "Team rules: be careful."}
    actions.do_create_agent(people["moderator"], "crew", "release", definition)
    session = actions.do_create_session(people["owner"])

    actions.do_post_message(people["owner"], session.pk, "hello")
    run_worker(get_runtime())
    journal = DatabaseJournal()
    assert last_assistant_text(fold_messages(journal.load_sync(session.pk))) == "Hello from the release agent"
    first = stub.requests[0]["messages"]
    assert {"role": "system", "content": "Team rules: be careful."} in first
    assert "You prepare and publish releases." in str(first)

    actions.do_post_message(people["owner"], session.pk, "publish 1.4.0 please")
    run_worker(get_runtime())
    envelopes = journal.load_sync(session.pk)
    (ask,) = [e for e in envelopes if e.type is E.APPROVAL_REQUESTED]
    assert envelopes[-1].type is E.INVOCATION_SUSPENDED
    assert (ask.payload["name"], ask.payload["arguments"]) == ("publish_release", {"version": "1.4.0"})
    assert example.PUBLISHED == []
    assert not Run.objects.filter(status__in=[Run.QUEUED, Run.RUNNING]).exists(), "no worker is held"

    restart()  # every process between the ask and the decision is new
    moderator = Client(HTTP_AUTHORIZATION=f"Bearer {do_issue_token(people['moderator'], 't')[1]}")
    pending = moderator.get("/api/v1/asks?state=pending").json()["asks"]
    ask_id = ask.payload["ask_id"]
    assert [(a["ask_id"], a["tool"], a["team"]) for a in pending] == [(ask_id, "publish_release", "crew")]
    response = moderator.post(
        f"/api/v1/asks/{ask.payload['ask_id']}", {"verdict": "allow_once"}, content_type="application/json"
    )
    assert response.status_code == 202, response.content
    run_worker(get_runtime())
    envelopes = journal.load_sync(session.pk)
    assert envelopes[-1].type is E.INVOCATION_COMPLETED
    (started,) = [e for e in envelopes if e.type is E.INVOCATION_STARTED][-1:]
    assert started.payload["reason"]["decision"]["approver"] == "moderator"
    assert example.PUBLISHED == ["1.4.0"]
    (result,) = [e for e in envelopes if e.type is E.TOOL_RESULT]
    assert result.payload["content"] == "published 1.4.0"
    assert last_assistant_text(fold_messages(envelopes)) == "Done: published 1.4.0"
    assert Session.objects.get(pk=session.pk).agent_id is not None

    # In review like any session: found by its tool's name, the reply on its page.
    reviewer = Client()
    reviewer.force_login(people["moderator"])
    page = reviewer.get("/review/", {"q": "publish_release"}).content.decode()
    assert str(session.pk) in page
    assert reviewer.get("/review/", {"q": "nothing-like-this"}).content.decode().count(str(session.pk)) == 0
