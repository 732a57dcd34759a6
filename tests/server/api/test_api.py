"""The HTTP API against a real server: authentication, isolation between users, errors,
the OpenAPI document, and run event streams (replay, live, resume, heartbeats)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.server.api.test_api_support import LiveApi, live_api, sse_events

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def api() -> Iterator[LiveApi]:
    # Short heartbeats so a test can see them; 20 ms ticks keep `!slow` runs quick.
    with live_api(env={"SECTR_SSE_HEARTBEAT_SECONDS": "0.5", "SECTR_DEMO_SLOW_MS": "60"}) as live:
        yield live


def new_session(api: LiveApi, user: str = "alice", **body: Any) -> str:
    response = api.http(user).post("/sessions", json=body)
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def start_run(api: LiveApi, session_id: str, content: Any, user: str = "alice", **extra: Any) -> dict[str, Any]:
    response = api.http(user).post(f"/sessions/{session_id}/runs", json={"content": content, **extra})
    assert response.status_code == 202, response.text
    return dict(response.json())


def read_stream(
    api: LiveApi, run_id: str, user: str = "alice", headers: dict[str, str] | None = None, params: Any = None
) -> list[dict[str, Any]]:
    frames = []
    with api.http(user).stream("GET", f"/runs/{run_id}/events", headers=headers, params=params) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        for frame in sse_events(response):
            frames.append(frame)
    return frames


def events(frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [f for f in frames if "event" in f]


def wait_for_state(api: LiveApi, session_id: str, states: tuple[str, ...], user: str = "alice") -> dict[str, Any]:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        snapshot = api.http(user).get(f"/sessions/{session_id}").json()
        if snapshot["state"] in states:
            return dict(snapshot)
        time.sleep(0.05)
    raise AssertionError(f"session {session_id} never reached {states}")


def assert_error(response: httpx.Response, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    body = response.json()
    # ask_not_pending also names who decided (docs/moderation.md); every other error is just these two.
    extra = {"decided_by", "status", "verdict"} if code == "ask_not_pending" else set()
    assert set(body) == {"error"} and {"code", "message"} <= set(body["error"]) <= {"code", "message"} | extra
    assert body["error"]["code"] == code, body
    assert body["error"]["message"]


# ---- authentication ----


def test_it_refuses_a_request_without_a_token(api: LiveApi) -> None:
    response = httpx.get(api.base_url + "/api/v1/sessions")
    assert_error(response, 401, "unauthenticated")
    assert response.headers["WWW-Authenticate"].startswith("Bearer")


@pytest.mark.parametrize(
    "authorization",
    [
        "Bearer nope",
        "Bearer sectr_",
        "Bearer sectr_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
        "Bearer " + "sectr_" + "x" * 5000,
        "Token sectr_abc",
        "Bearer",
        "",
    ],
)
def test_it_refuses_bad_tokens(api: LiveApi, authorization: str) -> None:
    response = httpx.get(api.base_url + "/api/v1/sessions", headers={"Authorization": authorization})
    assert response.status_code == 401
    assert response.json()["error"]["code"] in ("unauthenticated", "invalid_token")


def test_it_accepts_a_token_from_the_command_and_refuses_it_once_revoked(api: LiveApi) -> None:
    token = api.live.token_for("alice")  # manage.py sectr_token alice: the last line
    assert token.startswith("sectr_")
    headers = {"Authorization": f"bearer {token}"}  # the scheme is case-insensitive
    assert httpx.get(api.base_url + "/api/v1/sessions", headers=headers).status_code == 200
    out = api.live.manage("sectr_token", "alice", "--revoke", token[:12])
    assert "revoked 1 token" in out
    assert_error(httpx.get(api.base_url + "/api/v1/sessions", headers=headers), 401, "invalid_token")
    assert (
        httpx.get(
            api.base_url + "/api/v1/sessions", headers={"Authorization": f"Bearer {api.tokens['alice']}"}
        ).status_code
        == 200
    )


# ---- isolation ----


def test_users_cannot_see_each_others_sessions(api: LiveApi) -> None:
    session_id = new_session(api, title="Alice's secret")
    run = start_run(api, session_id, '!tool write_note {"title": "t", "body": "b"}')
    read_stream(api, run["run_id"])
    ask_id = wait_for_state(api, session_id, ("awaiting",))["pending_ask"]["ask_id"]
    bob = api.http("bob")
    assert_error(bob.get(f"/sessions/{session_id}"), 404, "not_found")
    assert_error(bob.get(f"/sessions/{session_id}/transcript"), 404, "not_found")
    assert_error(bob.post(f"/sessions/{session_id}/runs", json={"content": "hi"}), 404, "not_found")
    assert_error(bob.post(f"/sessions/{session_id}/fork", json={}), 404, "not_found")
    assert_error(bob.post(f"/sessions/{session_id}/rename", json={"title": "mine"}), 404, "not_found")
    assert_error(bob.delete(f"/sessions/{session_id}"), 404, "not_found")
    assert_error(bob.get(f"/runs/{run['run_id']}"), 404, "not_found")
    assert_error(bob.get(f"/runs/{run['run_id']}/events"), 404, "not_found")
    assert_error(bob.post(f"/runs/{run['run_id']}/cancel"), 404, "not_found")
    assert_error(bob.post(f"/asks/{ask_id}", json={"verdict": "allow_once"}), 404, "not_found")
    assert session_id not in [s["id"] for s in bob.get("/sessions").json()["sessions"]]
    # A moderator reads every session and decides its asks, but runs nothing in it.
    moderator = api.http("mod")
    assert moderator.get(f"/sessions/{session_id}").status_code == 200
    assert_error(moderator.post(f"/sessions/{session_id}/runs", json={"content": "hi"}), 403, "forbidden")
    decided = moderator.post(f"/asks/{ask_id}", json={"verdict": "deny", "note": "not today"})
    assert decided.status_code == 202, decided.text
    late = api.http().post(f"/asks/{ask_id}", json={"verdict": "allow_once"})
    assert_error(late, 409, "ask_not_pending")
    assert late.json()["error"]["decided_by"] == "mod" and late.json()["error"]["verdict"] == "deny"
    frames = events(read_stream(api, decided.json()["run_id"]))
    assert frames[0]["event"] == "approval" and frames[0]["data"]["payload"]["approved"] is False
    assert frames[-1]["data"]["payload"]["text"] == "write_note was denied"
    assert api.http().get(f"/sessions/{session_id}").json()["title"] == "Alice's secret"


def test_approve_all_decides_the_turns_other_gated_calls_and_refuses_a_bad_scope(api: LiveApi) -> None:
    session_id = new_session(api)
    prompt = '!tools write_note {"title": "x", "body": "1"} ; write_note {"title": "y", "body": "2"}'
    read_stream(api, start_run(api, session_id, prompt)["run_id"])
    ask_id = wait_for_state(api, session_id, ("awaiting",))["pending_ask"]["ask_id"]
    http = api.http()
    for body in (
        {"verdict": "deny", "scope": "turn"},
        {"verdict": "allow_once", "scope": "session"},
        {"verdict": "allow_once", "scope": 1},
        {"verdict": "allow_once", "scope": ""},
    ):
        assert_error(http.post(f"/asks/{ask_id}", json=body), 400, "invalid_scope")
    assert http.get(f"/sessions/{session_id}").json()["pending_ask"]["ask_id"] == ask_id  # nothing changed
    decided = http.post(f"/asks/{ask_id}", json={"verdict": "allow_once", "scope": "turn"})
    assert decided.status_code == 202, decided.text
    frames = events(read_stream(api, decided.json()["run_id"]))
    approvals = [f["data"]["payload"] for f in frames if f["event"] == "approval"]
    assert [(a["approved"], a["approver"]) for a in approvals] == [(True, "alice"), (True, "alice")]
    assert approvals[1]["with_ask"] == ask_id
    assert frames[-1]["data"]["payload"]["text"].count("write_note returned:") == 2
    assert wait_for_state(api, session_id, ("completed",))["pending_ask"] is None


# ---- routing, errors and the OpenAPI document ----


def test_unknown_routes_and_methods_answer_json(api: LiveApi) -> None:
    http = api.http()
    assert_error(http.get("/nope"), 404, "not_found")
    assert_error(http.get("/sessions/x/y/z"), 404, "not_found")
    assert_error(http.post("/nope", json={}), 404, "not_found")  # JSON, not a CSRF page
    response = http.delete("/sessions")
    assert_error(response, 405, "method_not_allowed")
    assert response.headers["Allow"] == "GET, POST"
    assert_error(http.put(f"/sessions/{new_session(api)}", json={}), 405, "method_not_allowed")
    assert_error(http.get("/runs/run_x/cancel"), 405, "method_not_allowed")


def test_the_openapi_document_describes_every_route(api: LiveApi) -> None:
    response = httpx.get(api.base_url + "/api/v1/openapi.json")  # public: no token needed
    assert response.status_code == 200
    document = response.json()
    assert document["openapi"] == "3.1.0"
    paths = document["paths"]
    from django.urls import URLPattern

    from sessions_app.api import urls
    from sessions_app.api.openapi import openapi_path

    patterns = [p for p in urls.urlpatterns if isinstance(p, URLPattern) and p.name != "not-found"]
    routes = {openapi_path(str(p.pattern)) for p in patterns}
    assert routes == set(paths), "every URL pattern is in the document, and nothing else"
    for route in urls.ROUTES:
        assert set(paths[openapi_path(route.path)]) == {m.lower() for m in route.operations}
    schemas = document["components"]["schemas"]
    for path_item in paths.values():
        for operation in path_item.values():
            assert operation["operationId"] and operation["responses"]
            for response_doc in operation["responses"].values():
                for content in response_doc.get("content", {}).values():
                    # A stream (text/event-stream) describes its items, not one document.
                    schema = content["schema"] if "schema" in content else content["itemSchema"]
                    ref = schema.get("$ref", "")
                    assert not ref or ref.rsplit("/", 1)[-1] in schemas
    # Each documented path answers (not the catch-all 404) and the live server agrees.
    for path in paths:
        concrete = path.replace("{session_id}", "ses_x").replace("{run_id}", "run_x").replace("{ask_id}", "ask_x")
        answer = api.http().request("OPTIONS", api.base_url + concrete)
        assert answer.status_code == 405, (path, answer.text)


# ---- runs and their event streams ----


def test_a_run_streams_its_events_and_replays_them_the_same(api: LiveApi) -> None:
    session_id = new_session(api)
    run = start_run(api, session_id, "hello stream")
    assert run["status"] in ("queued", "running") and run["events_url"].endswith("/events")
    live = events(read_stream(api, run["run_id"]))
    kinds = [f["event"] for f in live]
    assert kinds[0] == "session.title" and kinds[1] == "turn.start"
    assert kinds[-2:] == ["turn.end", "result"]
    assert "".join(f["data"]["text"] for f in live if f["event"] == "message.delta") == "You said: hello stream"
    result = live[-1]["data"]
    assert result["payload"]["stop"] == "end_turn" and result["payload"]["text"] == "You said: hello stream"
    assert result["payload"]["usage"]["output_tokens"] == 4
    assert all(f["id"] == str(f["data"]["seq"]) for f in live)
    assert all(f["data"]["run_id"] == run["run_id"] for f in live)
    # A replay after the end is the same stream; ?after= and Last-Event-ID give its tail.
    assert events(read_stream(api, run["run_id"])) == live
    middle = int(live[2]["id"])
    assert events(read_stream(api, run["run_id"], params={"after": middle})) == [
        f for f in live if int(f["id"]) > middle
    ]
    tail = events(read_stream(api, run["run_id"], headers={"Last-Event-ID": str(middle)}, params={"after": 0}))
    assert tail == [f for f in live if int(f["id"]) > middle]
    info = api.http().get(f"/runs/{run['run_id']}").json()
    assert info["status"] == "completed" and info["result"] == result["payload"]


def test_a_stream_cut_mid_run_resumes_without_gap_or_duplicate(api: LiveApi) -> None:
    session_id = new_session(api, title="cut")
    run = start_run(api, session_id, "!slow 20")
    first: list[dict[str, Any]] = []
    with api.http().stream("GET", f"/runs/{run['run_id']}/events") as response:
        for frame in sse_events(response):
            if "event" in frame:
                first.append(frame)
            if frame.get("event") == "message.delta" and frame["data"]["text"] == "tick 5 ":
                break  # closes the connection mid-run
    assert wait_for_state(api, session_id, ("running", "completed"))["state"] == "running"
    rest = events(read_stream(api, run["run_id"], headers={"Last-Event-ID": first[-1]["id"]}))
    both = first + rest
    seqs = [int(f["id"]) for f in both]
    assert seqs == sorted(set(seqs)), "no event twice, in journal order"
    text = "".join(f["data"]["text"] for f in both if f["event"] == "message.delta")
    assert text == "".join(f"tick {i} " for i in range(1, 21))
    assert both[-1]["event"] == "result" and both[-1]["data"]["payload"]["text"] == text
    assert both == events(read_stream(api, run["run_id"])), "nothing lost: the same as a full replay"


def test_a_queued_message_waits_streams_heartbeats_and_runs_after(api: LiveApi) -> None:
    session_id = new_session(api, title="queue")
    first = start_run(api, session_id, "!slow 25")
    busy = api.http().post(f"/sessions/{session_id}/runs", json={"content": "second"})
    assert_error(busy, 409, "session_busy")
    queued = start_run(api, session_id, "second", queue=True)
    assert queued["status"] == "pending" and queued["start_seq"] is None
    frames = read_stream(api, queued["run_id"])  # waits while the first run goes on
    assert {"comment": "ping"} in frames, "heartbeats while the stream is idle"
    kinds = [f["event"] for f in events(frames)]
    assert kinds[0] == "turn.start" and kinds[-1] == "result"
    assert events(frames)[-1]["data"]["payload"]["text"] == "You said: second"
    assert api.http().get(f"/runs/{first['run_id']}").json()["result"]["stop"] == "end_turn"


def test_cancel_and_steer_control_a_running_run(api: LiveApi) -> None:
    session_id = new_session(api, title="controls")
    run = start_run(api, session_id, "!slow 40")
    wait_for_state(api, session_id, ("running",))
    with api.http().stream("GET", f"/runs/{run['run_id']}/events") as response:
        for frame in sse_events(response):
            if frame.get("event") == "message.delta":
                break
    steered = api.http().post(f"/runs/{run['run_id']}/steer", json={"text": "hurry"})
    assert steered.status_code == 202, steered.text
    cancelled = api.http().post(f"/runs/{run['run_id']}/cancel")
    assert cancelled.status_code == 202, cancelled.text
    last = events(read_stream(api, run["run_id"]))[-1]
    assert last["event"] == "result" and last["data"]["payload"]["stop"] == "cancelled"
    assert wait_for_state(api, session_id, ("cancelled",))["stop_reason"] == "cancelled"
    assert_error(api.http().post(f"/runs/{run['run_id']}/steer", json={"text": "late"}), 409, "stale_run_control")
    assert_error(api.http().post(f"/runs/{run['run_id']}/cancel"), 409, "stale_run_control")


def test_session_operations_answer_with_snapshots(api: LiveApi) -> None:
    http = api.http()
    created = http.post("/sessions", json={"title": "ops", "mode": "plan", "limits": {"max_turns": 7}}).json()
    session_id = created["id"]
    assert created["mode"] == "plan" and created["limits"]["max_turns"] == 7 and created["owner"] == "alice"
    assert created["resolved_model"]["model_id"] == "demo" and created["media"] == {"image": True, "audio": True}
    assert http.post(f"/sessions/{session_id}/rename", json={"title": "renamed"}).json()["title"] == "renamed"
    assert http.post(f"/sessions/{session_id}/mode", json={"mode": "accept_edits"}).json()["mode"] == "accept_edits"
    model = http.post(f"/sessions/{session_id}/model", json={"model": "gpt-4o", "reasoning_effort": "low"}).json()
    assert model["resolved_model"]["model_id"] == "gpt-4o" and model["resolved_model"]["reasoning_effort"] == "low"
    assert http.post(f"/sessions/{session_id}/close").json()["closed"] is True
    listed = http.get("/sessions", params={"limit": 1}).json()
    assert listed["limit"] == 1 and len(listed["sessions"]) == 1 and listed["count"] >= 1
    assert http.delete(f"/sessions/{session_id}").status_code == 204
    assert_error(http.get(f"/sessions/{session_id}"), 404, "not_found")
