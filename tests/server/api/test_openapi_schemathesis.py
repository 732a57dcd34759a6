"""Schemathesis against a live Sectr: every operation of /api/v1/openapi.json, with
generated valid and invalid inputs, must answer as the document says (status codes,
content types, headers, response schemas, no 5xx, invalid input refused, valid input
accepted): `schemathesis run --checks all`, which must exit 0.

The server is a real Daphne (tests/liveserver.py) with an embedded worker, on SQLite
or PostgreSQL as DATABASE_URL names, with real objects behind every path parameter (a
team the prober moderates, a session with a pending ask, its run, rules): without them
most operations would only ever answer 404. Examples are bounded so the test stays under a
minute on an idle machine: SECTR_SCHEMATHESIS_EXAMPLES (default 5) per operation and phase, with a fixed
seed (the same cases every run; change the seed locally to explore).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.liveserver import LiveSectr

pytestmark = pytest.mark.slow

SCHEMATHESIS = str(Path(sys.executable).with_name("schemathesis"))
EXAMPLES = os.environ.get("SECTR_SCHEMATHESIS_EXAMPLES", "5")
SEED = os.environ.get("SECTR_SCHEMATHESIS_SEED", "12")
#: A 1x1 PNG, the image of the seeded session's prompt.
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)


def seed(live: LiveSectr, token: str) -> dict[str, str]:
    """Real objects for the path parameters, so the operations get past their 404s: a
    team the prober moderates (`crew`), a session of it with a pending ask, an image
    in its prompt and the run that asked, a rule, an agent, an experiment replaying that
    session, and a spare session and rule for the DELETEs to take."""
    api = httpx.Client(base_url=live.base_url, headers={"Authorization": f"Bearer {token}"}, timeout=20)

    def created(path: str, body: dict[str, Any]) -> dict[str, Any]:
        response = api.post(path, json=body)
        assert response.status_code in (201, 202), response.text
        data: dict[str, Any] = response.json()
        return data

    session = created("/api/v1/sessions", {"title": "probed", "team": "crew"})["id"]
    # The prompt carries an image: the session's media route has one to serve.
    image = {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{base64.b64encode(PNG).decode()}"}}
    prompt = [{"type": "text", "text": '!tool write_note {"title": "a", "body": "b"}'}, image]
    run = created(f"/api/v1/sessions/{session}/runs", {"content": prompt})
    deadline = time.monotonic() + 60
    while not (ask := api.get(f"/api/v1/sessions/{session}").json()["pending_ask"]):
        assert time.monotonic() < deadline, "the run never asked"
        time.sleep(0.1)
    agent = created("/api/v1/teams/crew/agents", {"slug": "probe", "name": "Probe", "instructions": "Probe."})
    # Two of the installation's MCP servers enabled for the team (MCP_SERVERS below).
    server = created("/api/v1/teams/crew/mcp-servers", {"name": "time"})["name"]
    spare_server = created("/api/v1/teams/crew/mcp-servers", {"name": "clock"})["name"]
    return {
        "agent_id": agent["id"],
        "number": "1",
        "slug": "probe",
        "session_id": session,
        "run_id": run["run_id"],
        "ask_id": ask["ask_id"],
        "name": "crew",
        "rule_id": created("/api/v1/teams/crew/rules", {"tool": "get_time", "action": "allow"})["id"],
        "spare_session_id": created("/api/v1/sessions", {"title": "to delete", "team": "crew"})["id"],
        "spare_rule_id": created("/api/v1/teams/crew/rules", {"tool": "calculator", "action": "allow"})["id"],
        # On the loopback's discard port (allowed for this server): a delivery of an ask
        # decided meanwhile goes nowhere.
        "spare_webhook_id": str(created("/api/v1/teams/crew/webhooks", {"url": "http://127.0.0.1:9/probe"})["id"]),
        "server": server,
        "spare_server": spare_server,
        "score": created("/api/v1/teams/crew/scores", {"name": "helpful", "kind": "boolean"})["name"],
        "spare_score": created("/api/v1/teams/crew/scores", {"name": "spare", "kind": "boolean"})["name"],
        "sha256": hashlib.sha256(PNG).hexdigest(),
        "experiment_id": created(
            "/api/v1/teams/crew/experiments",
            {"name": "probe", "candidates": [{"agent": "default"}], "sessions": [session]},
        )["id"],
    }


STATE_400 = 'checks.positive_data_acceptance.expected-statuses = ["2xx", "400", "401", "403", "404", "409", "429"]\n'


def config(ids: dict[str, str]) -> str:
    """schemathesis.toml: the seeded ids, and the 400s that depend on state, not on the
    schema (a schema-valid value the server must still refuse)."""
    parameters = "".join(f'"path.{name}" = "{value}"\n' for name, value in ids.items())
    operations = [
        # `team` names a team the caller belongs to: which names those are is state.
        "/api/v1/sessions",
        # `at_seq` must be a seq the session has reached.
        "/api/v1/sessions/{session_id}/fork",
        # Edited arguments are checked against the tool's own signature (which tool an ask
        # is for, and what it takes, is state), and a response needs an ask one person decides.
        "/api/v1/asks/{ask_id}",
        # A media part is checked against the session's model (capability) and by its
        # bytes (mime_type, size): documented 400s no schema can predict.
        "/api/v1/sessions/{session_id}/runs",
        # A webhook URL must pass the address guard: whether a host resolves, and to what,
        # is the network's state.
        "/api/v1/teams/{name}/webhooks",
        # An MCP server's URL must resolve to a public address (DNS), and a server named
        # without one must be one of the installation's.
        "/api/v1/teams/{name}/mcp-servers",
        # A rating names the team's own scores, and each value must fit its score's labels
        # or range; a numeric score's minimum must be below its maximum.
        "/api/v1/sessions/{session_id}/ratings",
        "/api/v1/teams/{name}/scores",
        # An experiment's sources must be sessions of the team with a user message, its
        # candidates agents the team may use; a queue's reviewers must review the team and
        # its name be new; a verdict's scores are the team's own.
        "/api/v1/teams/{name}/experiments",
        "/api/v1/experiments/{experiment_id}/queue",
        "/api/v1/experiments/{experiment_id}/verdicts",
    ]
    methods = [(path, "POST") for path in operations] + [
        ("/api/v1/teams/{name}/scores/{score}", "PUT"),
        ("/api/v1/teams/{name}/mcp-servers/{server}", "PUT"),
    ]
    return (
        "[parameters]\n"
        + parameters
        + "".join(
            f'[[operations]]\ninclude-path = "{path}"\ninclude-method = "{method}"\n{STATE_400}'
            for path, method in methods
        )
    )


def schemathesis(live: LiveSectr, token: str, workdir: Path, ids: dict[str, str], *only: str) -> str:
    """Run schemathesis (all checks) in `workdir` with `ids` behind the path parameters;
    its report, after asserting it found nothing."""
    workdir.mkdir()
    (workdir / "schemathesis.toml").write_text(config(ids))
    command = [
        SCHEMATHESIS,
        "run",
        live.url("/api/v1/openapi.json"),
        "--checks",
        "all",
        "--max-examples",
        EXAMPLES,
        "--seed",
        SEED,
        "--generation-deterministic",
        # The API refuses NUL and lone surrogates in every string (400 invalid_unicode,
        # documented); JSON Schema cannot say so field by field.
        "--generation-allow-x00",
        "false",
        "--generation-codec",
        "utf-8",
        "--header",
        f"Authorization: Bearer {token}",
        "--request-timeout",
        "20",
        "--workers",
        "1",
        "--no-color",
        # A session's event stream never ends (it waits for the session's next runs): a
        # prober reading it to its end would only time out. tests/server/api/test_api_streams.py
        # reads it.
        "--exclude-path",
        "/api/v1/sessions/{session_id}/events",
        *only,
    ]
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "", "NO_COLOR": "1"}
    done = subprocess.run(command, cwd=workdir, env=env, capture_output=True, text=True, timeout=300)
    log = Path(os.environ.get("SECTR_SCHEMATHESIS_LOG", workdir.parent / "schemathesis.log"))
    with log.open("a") as file:
        file.write(done.stdout)
    assert done.returncode == 0, done.stdout[-20000:] + done.stderr[-5000:]
    assert "No issues found" in done.stdout or "passed" in done.stdout, done.stdout[-5000:]
    return done.stdout


@pytest.mark.timeout(400)  # ~60 s idle; a loaded CI machine may take several times that
def test_the_api_answers_as_its_openapi_document_says(tmp_path: Path) -> None:
    # No rate limits: the run would otherwise exercise mostly the 429 path.
    env = {
        "SECTR_API_RATE_LIMIT": "0/60",
        "SECTR_SESSION_CREATE_LIMIT": "0/60",
        "SECTR_WEBHOOK_ALLOWED_HOSTS": "127.0.0.1",
    }
    servers = tmp_path / "mcp-servers.json"
    time_server = str(Path(sys.executable).with_name("mcp-server-time"))
    servers.write_text(json.dumps({"time": {"command": time_server}, "clock": {"command": time_server}}))
    env["SECTR_MCP_SERVERS"] = str(servers)
    with LiveSectr(embedded_worker=True, env=env) as live:
        live.create_user("prober")
        live.manage("sectr_team", "create", "crew")
        live.manage("sectr_team", "add", "crew", "prober", "--role", "moderator")
        token = live.token_for("prober")
        ids = seed(live, token)
        spare = {
            "session_id": ids.pop("spare_session_id"),
            "rule_id": ids.pop("spare_rule_id"),
            "webhook_id": ids.pop("spare_webhook_id"),
            "server": ids.pop("spare_server"),
            "score": ids.pop("spare_score"),
            "name": "crew",
        }
        # Everything but the DELETEs on the seeded objects, then the DELETEs on spare ones
        # (a per-operation override of an id would leak into the stateful phase's checks).
        report = schemathesis(live, token, tmp_path / "all", ids, "--exclude-method", "DELETE")
        # The seeded ids were used: the operations got past their 404s.
        assert "Missing test data" not in report, report[-5000:]
        schemathesis(live, token, tmp_path / "deletes", spare, "--include-method", "DELETE")
