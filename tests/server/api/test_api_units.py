"""The API's pieces in-process: rate limits, token actions and the sectr_token command,
snapshots and transcripts, and resume cursors."""

from __future__ import annotations

from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.test import Client, override_settings

from sectr.errors import NotFound, ValidationFailed
from sectr.events import EventType
from sectr.journal import NewEvent
from sessions_app import actions
from sessions_app.actions.tokens import do_issue_token, do_revoke_token
from sessions_app.api.sse import parse_after
from sessions_app.display.snapshots import snapshot, transcript
from sessions_app.journal import DatabaseJournal
from sessions_app.models import ApiToken, Session

LOCAL_CACHE = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": "api-units"}}


def bearer(raw: str) -> dict[str, str]:
    return {"HTTP_AUTHORIZATION": f"Bearer {raw}"}


@override_settings(SECTR_API_RATE_LIMIT="3/60", CACHES=LOCAL_CACHE)
def test_it_limits_each_token_to_its_budget(owner: Any, teammate: Any) -> None:
    _, first = do_issue_token(owner, "a")
    _, second = do_issue_token(teammate, "b")
    client = Client()
    assert [client.get("/api/v1/sessions", **bearer(first)).status_code for _ in range(3)] == [200, 200, 200]
    refused = client.get("/api/v1/sessions", **bearer(first))
    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "rate_limited"
    assert 1 <= int(refused["Retry-After"]) <= 61
    assert client.get("/api/v1/sessions", **bearer(second)).status_code == 200, "budgets are per token"


@override_settings(SECTR_API_RATE_LIMIT="0/60", CACHES=LOCAL_CACHE)
def test_a_zero_budget_means_no_limit(owner: Any) -> None:
    _, raw = do_issue_token(owner, "a")
    client = Client()
    assert {client.get("/api/v1/sessions", **bearer(raw)).status_code for _ in range(5)} == {200}


# ---- tokens ----


def test_tokens_are_issued_hashed_and_revoked_by_prefix_or_whole(owner: Any, teammate: Any) -> None:
    token, raw = do_issue_token(owner, " laptop ")
    assert token.name == "laptop" and raw not in token.token_hash and raw.startswith("sectr_")
    _, other = do_issue_token(owner, "ci")
    _, theirs = do_issue_token(teammate, "theirs")
    with pytest.raises(ValidationFailed):
        do_revoke_token(owner, "sectr_")  # would revoke every token: refused
    with pytest.raises(ValidationFailed):
        do_issue_token(owner, "")
    assert do_revoke_token(owner, raw) == 1
    assert ApiToken.authenticate(raw) is None and ApiToken.authenticate(other) is not None
    with pytest.raises(NotFound):
        do_revoke_token(owner, theirs[:12])  # another user's token is not this user's to revoke
    assert do_revoke_token(owner, other[:12]) == 1
    assert ApiToken.authenticate(theirs) is not None


def test_the_command_prints_the_token_last_lists_and_revokes(owner: Any) -> None:
    out, err = StringIO(), StringIO()
    call_command("sectr_token", "owner", "--name", "script", stdout=out, stderr=err)
    raw = out.getvalue().strip().splitlines()[-1]
    assert ApiToken.authenticate(raw) is not None and "shown only once" in err.getvalue()
    listing = StringIO()
    call_command("sectr_token", "owner", "--list", stdout=listing)
    assert raw[:12] in listing.getvalue() and "script" in listing.getvalue() and raw not in listing.getvalue()
    revoked = StringIO()
    call_command("sectr_token", "owner", "--revoke", raw[:12], stdout=revoked)
    assert "revoked 1 token" in revoked.getvalue() and ApiToken.authenticate(raw) is None
    with pytest.raises(CommandError):
        call_command("sectr_token", "nobody")


# ---- snapshots and transcripts ----


def test_a_snapshot_has_every_field_of_the_spec(make_session: Any, owner: Any) -> None:
    session = make_session(title="Snap")
    run = actions.do_post_message(owner, session.pk, "hello")
    data = snapshot(Session.objects.get(pk=session.pk))
    spec_fields = {
        "id", "state", "mode", "title", "resolved_model", "limits", "turns", "tool_calls", "token_usage",
        "media", "placement", "pending_ask", "created_at", "updated_at", "owner",
    }  # fmt: skip
    assert spec_fields <= set(data)
    assert set(data["resolved_model"]) == {"provider_id", "model_id", "context_window", "reasoning_effort"}
    assert set(data["token_usage"]["total"]) == {
        "input_tokens",
        "output_tokens",
        "reasoning_tokens",
        "cached_input_tokens",
    }
    assert data["state"] == "running" and data["owner"] == "owner"
    assert data["placement"]["run_id"] == run.pk and data["placement"]["run_status"] == "queued"


def _compacted_session(make_session: Any) -> Session:
    session = make_session(title="History")
    journal = DatabaseJournal()
    start = NewEvent(
        EventType.INVOCATION_STARTED, {"reason": {"kind": "user_message", "input": {"content": "one"}}}, "inv_1"
    )
    done = NewEvent(EventType.INVOCATION_COMPLETED, {"stop_reason": "end_turn", "usage": {}}, "inv_1")
    summary = {
        "messages": [{"role": "system", "content": "Summary: one"}, {"role": "user", "content": "kept"}],
        "through_seq": 3,
        "summary": "one",
    }
    again = NewEvent(
        EventType.INVOCATION_STARTED, {"reason": {"kind": "user_message", "input": {"content": "two"}}}, "inv_2"
    )
    finished = NewEvent(EventType.INVOCATION_COMPLETED, {"stop_reason": "end_turn", "usage": {}}, "inv_2")
    compacted = NewEvent(EventType.TRANSCRIPT_COMPACTED, summary)
    journal.append_sync(session.pk, [start, done, compacted, again, finished])
    return Session.objects.get(pk=session.pk)


def test_the_transcript_is_what_the_model_sees_from_the_newest_compaction(make_session: Any, owner: Any) -> None:
    session = _compacted_session(make_session)
    data = transcript(session)
    assert data["view"] == "model" and data["complete"] is True and data["last_seq"] == 6
    assert [(m["role"], m["text"]) for m in data["messages"]] == [
        ("system", "Summary: one"),
        ("user", "kept"),
        ("user", "two"),
    ]
    fork = actions.do_fork(owner, session.pk, title="Fork")
    forked = transcript(Session.objects.get(pk=fork.pk))
    assert [m["text"] for m in forked["messages"]] == ["Summary: one", "kept", "two"], "a fork starts from its fold"


def test_the_history_view_keeps_what_a_compaction_summarised(make_session: Any, owner: Any) -> None:
    session = _compacted_session(make_session)
    data = transcript(session, "history")
    assert data["view"] == "history" and data["complete"] is True and data["last_seq"] == 6
    assert [(m["role"], m["text"]) for m in data["messages"]] == [("user", "one"), ("user", "two")]
    fork = actions.do_fork(owner, session.pk, title="Fork")
    forked = transcript(Session.objects.get(pk=fork.pk), "history")
    assert [m["text"] for m in forked["messages"]] == ["Summary: one", "kept", "two"], (
        "a fork's history starts from its source's fold"
    )
    with pytest.raises(ValueError, match="view"):
        transcript(session, "everything")


def test_a_long_history_is_one_consistent_read_and_complete(make_session: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from sessions_app.display import snapshots

    monkeypatch.setattr(snapshots, "HISTORY_CHUNK_ROWS", 100)  # many fetches from one SELECT
    session = make_session(title="Long")
    journal = DatabaseJournal()
    events = []
    for i in range(1, 601):
        reason = {"kind": "user_message", "input": {"content": f"m{i}"}}
        events.append(NewEvent(EventType.INVOCATION_STARTED, {"reason": reason}, f"inv_{i}"))
        events.append(NewEvent(EventType.INVOCATION_COMPLETED, {"stop_reason": "end_turn", "usage": {}}, f"inv_{i}"))
    journal.append_sync(session.pk, events)
    session = Session.objects.get(pk=session.pk)
    data = transcript(session, "history")
    assert data["complete"] is True and data["last_seq"] == 1201
    assert [m["text"] for m in data["messages"]] == [f"m{i}" for i in range(1, 601)]
    model = transcript(session)
    assert model["complete"] is True and len(model["messages"]) == 600


def test_the_transcript_route_takes_a_view_and_refuses_an_unknown_one(make_session: Any, owner: Any) -> None:
    session = _compacted_session(make_session)
    _, raw = do_issue_token(owner, "views")
    client = Client()
    url = f"/api/v1/sessions/{session.pk}/transcript"
    default = client.get(url, **bearer(raw)).json()
    model = client.get(url + "?view=model", **bearer(raw)).json()
    history = client.get(url + "?view=history", **bearer(raw)).json()
    assert default == model and model["messages"][0]["text"] == "Summary: one"
    assert [m["text"] for m in history["messages"]] == ["one", "two"]
    refused = client.get(url + "?view=all", **bearer(raw))
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "invalid_view"


@pytest.mark.parametrize(
    ("header", "query", "after"),
    [(None, None, 0), ("12", None, 12), (None, "7", 7), ("12", "7", 12), ("", "3", 3), (" 5 ", None, 5)],
)
def test_the_resume_cursor_comes_from_last_event_id_or_after(header: str | None, query: str | None, after: int) -> None:
    assert parse_after(header, query) == after


@pytest.mark.parametrize("bad", ["-1", "abc", "1.5", "1e3", "9" * 13, "１２"])
def test_a_malformed_resume_cursor_is_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_after(bad, None)


# ---- the OpenAPI document says what the server does ----


def test_a_cancelled_queued_run_reports_usage_with_zeros_not_an_empty_object(make_session: Any, owner: Any) -> None:
    session = make_session(title="Queue")
    actions.do_post_message(owner, session.pk, "first")
    waiting = actions.do_post_message(owner, session.pk, "second", queue=True)
    actions.do_cancel(owner, waiting.pk)
    _, raw = do_issue_token(owner, "usage")
    run = Client().get(f"/api/v1/runs/{waiting.pk}", **bearer(raw)).json()
    assert run["status"] == "cancelled"
    assert run["usage"] == {"input_tokens": 0, "output_tokens": 0}
    assert run["result"]["usage"] == {"input_tokens": 0, "output_tokens": 0}


def test_the_openapi_document_describes_usage_views_query_errors_and_the_event_stream() -> None:
    from sessions_app.api.openapi import build_document
    from sessions_app.api.urls import ROUTES

    document = build_document(ROUTES)
    schemas = document["components"]["schemas"]
    assert schemas["Run"]["properties"]["usage"] == {"$ref": "#/components/schemas/Usage"}
    assert schemas["Usage"]["required"] == ["input_tokens", "output_tokens"]
    paths = document["paths"]
    transcript_get = paths["/api/v1/sessions/{session_id}/transcript"]["get"]
    (view,) = [p for p in transcript_get["parameters"] if p["in"] == "query"]
    named, empty = view["schema"]["anyOf"]  # ?view= is the default view
    assert view["name"] == "view" and named["enum"] == ["model", "history"] and empty["maxLength"] == 0
    assert "400" in transcript_get["responses"]
    listing = paths["/api/v1/sessions"]["get"]
    limits = {p["name"]: p["schema"] for p in listing["parameters"]}
    assert (limits["limit"]["minimum"], limits["limit"]["maximum"]) == (1, 100)
    assert "400" in listing["responses"]
    stream = paths["/api/v1/runs/{run_id}/events"]["get"]["responses"]["200"]["content"]["text/event-stream"]
    assert "schema" not in stream  # the body is a stream of events, not one document
    assert stream["itemSchema"] == {"$ref": "#/components/schemas/ServerSentEvent"}
    event = schemas["ServerSentEvent"]
    assert event["required"] == ["event", "data"]
    assert event["properties"]["data"] == {
        "type": "string",
        "contentMediaType": "application/json",
        "contentSchema": {"$ref": "#/components/schemas/Event"},
    }
    assert "400" in paths["/api/v1/runs/{run_id}/events"]["get"]["responses"]
    assert paths["/api/v1/sessions"]["post"]["requestBody"]["required"] is False  # {} creates a session
    assert paths["/api/v1/sessions/{session_id}/rename"]["post"]["requestBody"]["required"] is True


def test_a_deactivated_users_tokens_stay_dead_after_reactivation(owner: Any) -> None:
    _, raw = do_issue_token(owner, "laptop")
    client = Client()
    assert client.get("/api/v1/sessions", **bearer(raw)).status_code == 200
    owner.is_active = False
    owner.save()
    assert client.get("/api/v1/sessions", **bearer(raw)).status_code == 401
    owner.is_active = True
    owner.save()
    assert client.get("/api/v1/sessions", **bearer(raw)).status_code == 401, "reactivation revived a token"
    assert ApiToken.objects.get(user=owner).revoked_at is not None
    _, fresh = do_issue_token(owner, "reissued")
    assert client.get("/api/v1/sessions", **bearer(fresh)).status_code == 200


def test_deactivating_through_the_admin_revokes_the_tokens(owner: Any, admin_client: Client) -> None:
    _, raw = do_issue_token(owner, "laptop")
    # The user change form with "Active" unticked (an unticked checkbox is simply absent).
    data = {
        "username": owner.username,
        "email": owner.email,
        "date_joined_0": "2024-01-01",
        "date_joined_1": "00:00:00",
    }
    response = admin_client.post(f"/admin/auth/user/{owner.pk}/change/", data)
    assert response.status_code == 302, response.content.decode()[:2000]
    owner.refresh_from_db()
    assert not owner.is_active and ApiToken.objects.get(user=owner).revoked_at is not None
    owner.is_active = True
    owner.save()
    assert ApiToken.authenticate(raw) is None


def test_the_admin_revokes_tokens_through_the_token_action(owner: Any, admin_client: Client) -> None:
    token, raw = do_issue_token(owner, "laptop")
    response = admin_client.post(
        "/admin/sessions_app/apitoken/", {"action": "revoke", "_selected_action": [str(token.pk)]}
    )
    assert response.status_code == 302
    assert ApiToken.authenticate(raw) is None


# ---- the document says what the server does ----


def _schema_accepts(name: str, body: Any) -> bool:
    import jsonschema_rs  # schemathesis's validator

    from sessions_app.api.openapi import build_document
    from sessions_app.api.urls import ROUTES

    document = build_document(ROUTES)
    root = {"$ref": f"#/components/schemas/{name}", "components": document["components"]}
    return bool(jsonschema_rs.Draft202012Validator(root).is_valid(body))


def _server_accepts(check: Any, *args: Any) -> bool:
    try:
        check(*args)
    except ValidationFailed:
        return False
    return True


@pytest.mark.parametrize(
    "body",
    [
        {"verdict": "deny", "scope": "turn"},
        {"verdict": "deny", "scope": None, "note": "no"},
        {"verdict": "deny"},
        {"verdict": "allow_once", "scope": "turn"},
        {"verdict": "allow_always", "scope": "turn"},
        {"verdict": "allow_once", "scope": "session"},
    ],
)
def test_the_decide_schema_and_the_server_agree_on_scope(body: dict[str, Any]) -> None:
    from sectr.operations import check_scope_value

    server = _server_accepts(check_scope_value, body["verdict"], body.get("scope"))
    assert _schema_accepts("Decide", body) is server, body


@pytest.mark.parametrize(
    "body",
    [
        {"tool": "x", "action": "allow", "approvals_required": 7},
        {"tool": "x", "action": "deny", "expires_after_s": 60},
        {"tool": "x", "action": "allow", "approvals_required": 1, "expires_after_s": None},
        {"tool": "x", "action": "ask", "approvals_required": 7, "expires_after_s": 60},
        {"tool": "x", "action": "ask", "expires_after_s": 365 * 24 * 3600 + 1},
        {"tool": "x", "action": "ask", "arguments": []},
        {"tool": "x", "action": "ask", "arguments": None, "position": None},
        {"tool": "x", "action": "ask", "arguments": {"": "*"}},
        {"tool": "x", "action": "ask", "arguments": {f"a{n}": "*" for n in range(21)}},
        {"tool": " ", "action": "allow"},
        {"tool": "\ufeff", "action": "allow"},
        {"tool": "\x1c", "action": "allow"},
        {"tool": " get_time ", "action": "allow"},
        {"tool": "x", "action": "ask", "approvals_required": 2.0},
    ],
)
def test_the_rule_schema_and_the_server_agree(body: dict[str, Any]) -> None:
    from sectr.rules import check_rule

    assert _schema_accepts("RuleInput", body) is _server_accepts(check_rule, body), body


@pytest.mark.django_db
def test_the_audit_checks_limit_and_offset_for_csv_too(owner: Any) -> None:
    _, raw = do_issue_token(owner, "t")
    client = Client(HTTP_AUTHORIZATION=f"Bearer {raw}")
    for query in ("format=csv&limit=null", "format=csv&offset=-1", "limit=null"):
        response = client.get(f"/api/v1/audit?{query}")
        assert response.status_code == 400 and response.json()["error"]["code"].startswith("invalid_"), query
    assert client.get("/api/v1/audit?format=csv&limit=5").status_code == 200


@pytest.mark.django_db
def test_an_empty_query_parameter_is_one_not_given(owner: Any, session: Session) -> None:
    _, raw = do_issue_token(owner, "t")
    client = Client(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert client.get(f"/api/v1/sessions/{session.pk}/transcript?view=").json()["view"] == "model"
    assert client.get("/api/v1/asks?state=").status_code == 200
    assert client.get("/api/v1/audit?verdict=&kind=").status_code == 200
    from sessions_app.api.openapi import build_document
    from sessions_app.api.urls import ROUTES

    # ... and the document says so for each of them.
    for path, method in (
        ("/api/v1/sessions/{session_id}/transcript", "get"),
        ("/api/v1/asks", "get"),
        ("/api/v1/audit", "get"),
    ):
        parameters = build_document(ROUTES)["paths"][path][method]["parameters"]
        for parameter in parameters:
            if parameter["name"] in ("view", "state", "verdict", "kind"):
                assert {"type": "string", "maxLength": 0} in parameter["schema"]["anyOf"], parameter


@pytest.mark.django_db(transaction=True)
@override_settings(SECTR_API_RATE_LIMIT="2/60")
def test_a_run_post_admits_its_request_in_its_database_hop_and_refuses_in_order(owner: Any) -> None:
    """POST /sessions/{id}/runs authenticates, counts the rate limit and posts in one
    database-thread hop: 401 before 400 (a bad body with a bad token), 429 past the
    budget, and nothing is queued by a refused request."""
    from sessions_app.models import Run

    token, raw = do_issue_token(owner, "runs")
    session = actions.do_create_session(owner)
    url = f"/api/v1/sessions/{session.pk}/runs"
    client = Client()

    def post(body: bytes, **headers: str) -> Any:
        return client.post(url, data=body, content_type="application/json", **headers)

    assert post(b'{"content": "hi"}').json()["error"]["code"] == "unauthenticated"
    refused = post(b"not json", **bearer("sectr_" + "x" * 40))
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_token"
    assert post(b'{"content": "hi"}', **bearer("sectr_" + "x" * 40)).status_code == 401
    assert not Run.objects.exists()

    bad = post(b'{"content": "hi", "surprise": 1}', **bearer(raw))  # the budget's first request
    assert bad.status_code == 400 and not Run.objects.exists()
    accepted = post(b'{"content": "hi"}', **bearer(raw))
    assert accepted.status_code == 202
    run = Run.objects.get(pk=accepted.json()["run_id"])
    assert run.session_id == session.pk and run.api_token_key == token.pk  # attributed to its token
    limited = post(b'{"content": "again", "queue": true}', **bearer(raw))
    assert limited.status_code == 429 and limited.json()["error"]["code"] == "rate_limited"
    assert list(Run.objects.values_list("pk", flat=True)) == [run.pk]
