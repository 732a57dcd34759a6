"""Schemathesis against a live Sectr: every operation of /api/v1/openapi.json, with
generated valid and invalid inputs, must answer as the document says (status codes,
content types, headers, response schemas, no 5xx, invalid input refused, valid input
accepted): `schemathesis run --checks all`, which must exit 0.

The server is a real Daphne (tests/liveserver.py) with an embedded worker, on SQLite
or PostgreSQL as DATABASE_URL names. Examples are bounded so the test stays under a
minute on an idle machine: SECTR_SCHEMATHESIS_EXAMPLES (default 5) per operation and phase, with a fixed
seed (the same cases every run; change the seed locally to explore).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.liveserver import LiveSectr

pytestmark = pytest.mark.slow

SCHEMATHESIS = str(Path(sys.executable).with_name("schemathesis"))
EXAMPLES = os.environ.get("SECTR_SCHEMATHESIS_EXAMPLES", "5")
SEED = os.environ.get("SECTR_SCHEMATHESIS_SEED", "12")


@pytest.mark.timeout(400)  # ~40 s idle; a loaded CI machine may take several times that
def test_the_api_answers_as_its_openapi_document_says(tmp_path: Path) -> None:
    # No rate limit: the run would otherwise exercise mostly the 429 path.
    with LiveSectr(embedded_worker=True, env={"SECTR_API_RATE_LIMIT": "0/60"}) as live:
        live.create_user("prober")
        token = live.token_for("prober")
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
        ]
        # `team` names a team the caller belongs to: which names those are is state, not
        # schema, so a schema-valid name of no team of the prober's is a 400 invalid_team.
        (tmp_path / "schemathesis.toml").write_text(
            "[[operations]]\n"
            'include-path = "/api/v1/sessions"\n'
            'include-method = "POST"\n'
            'checks.positive_data_acceptance.expected-statuses = ["2xx", "400", "401", "403", "404", "409", "429"]\n'
        )
        env = {**os.environ, "SCHEMATHESIS_HOOKS": "", "NO_COLOR": "1"}
        done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        (Path(os.environ.get("SECTR_SCHEMATHESIS_LOG", tmp_path / "schemathesis.log"))).write_text(done.stdout)
        assert done.returncode == 0, done.stdout[-20000:] + done.stderr[-5000:]
        assert "No issues found" in done.stdout or "passed" in done.stdout, done.stdout[-5000:]
