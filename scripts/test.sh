#!/usr/bin/env bash
# Sets everything up and runs every check: ruff, mypy, makemigrations --check, the test
# suite on SQLite with the in-memory channel layer, and again on PostgreSQL with the Redis
# channel layer when those are reachable (SECTR_TEST_POSTGRES_URL / SECTR_TEST_REDIS_URL,
# defaulting to the local servers), then the browser tests in their own pytest run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
PY=.venv/bin/python
# The framework adapters' packages (optional for running Sectr, needed by their tests and mypy).
adapters_stamp=.venv/.requirements-adapters.sha256
adapters_want=$(sha256sum requirements-adapters.txt | cut -d' ' -f1)
if [ ! -f "$adapters_stamp" ] || [ "$(cat "$adapters_stamp")" != "$adapters_want" ]; then
  "$PY" -m pip install --quiet -r requirements-adapters.txt
  echo "$adapters_want" > "$adapters_stamp"
fi
PG_URL="${SECTR_TEST_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/sectr}"
REDIS_URL_T="${SECTR_TEST_REDIS_URL:-redis://127.0.0.1:6379/0}"

echo "== ruff"; .venv/bin/ruff check .
echo "== mypy"; .venv/bin/mypy
# Fails when a model change has no migration. An in-memory database: the check must not
# depend on (or create) the developer's var/sectr.sqlite3.
echo "== migrations"; DATABASE_URL=sqlite://:memory: REDIS_URL= "$PY" manage.py makemigrations --check --dry-run

pytest_run() {  # pytest's exit 5 (nothing collected) fails the run too: set -e sees it
  "$PY" -m pytest "$@"
}

echo "== MCP test servers (npm)"; bash scripts/ensure_mcp_test_servers.sh
echo "== MCP 1.x client (var/mcp1-venv)"; bash scripts/ensure_mcp1_client.sh

echo "== tests: SQLite + in-memory channel layer"
DATABASE_URL= REDIS_URL= pytest_run -q tests/core tests/server

echo "== TypeScript SDK (sdk/typescript): build, then node --test against a live Sectr"
bash scripts/ensure_node.sh
(cd sdk/typescript && npm ci --no-audit --no-fund && npm run build)
(cd sdk/typescript && DATABASE_URL= REDIS_URL= SECTR_PYTHON="$PWD/../../$PY" node --test --test-concurrency=1 test/)

if "$PY" scripts/reachable.py "$PG_URL" "$REDIS_URL_T"; then
  echo "== tests: PostgreSQL + Redis channel layer (the fault tests run a cluster behind HAProxy)"
  bash scripts/ensure_haproxy.sh
  DATABASE_URL="$PG_URL" REDIS_URL="$REDIS_URL_T" pytest_run -q tests/server
  echo "== TypeScript SDK through the production topology (PostgreSQL, Redis, a separate worker)"
  (cd sdk/typescript && DATABASE_URL="$PG_URL" REDIS_URL="$REDIS_URL_T" SECTR_PYTHON="$PWD/../../$PY" \
    node --test --test-concurrency=1 test/)
else
  echo "== PostgreSQL/Redis not reachable at $PG_URL / $REDIS_URL_T: skipped that pass"
fi

if [ -d tests/browser ] && ls tests/browser/test_*.py >/dev/null 2>&1; then
  echo "== browser tests (Debian's headless Chromium)"
  bash scripts/ensure_chromium.sh
  DATABASE_URL= REDIS_URL= pytest_run -q -p no:asyncio -W ignore::pytest.PytestConfigWarning tests/browser
fi
