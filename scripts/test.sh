#!/usr/bin/env bash
# Sets everything up and runs every check: ruff (lint and format), mypy, makemigrations
# --check, the test suite on SQLite with the in-memory channel layer, and again on
# PostgreSQL with the Redis channel layer when those are reachable (SECTR_TEST_POSTGRES_URL
# / SECTR_TEST_REDIS_URL, defaulting to the local servers), then the browser tests in
# their own pytest run.
#
# Each suite pass runs in two parts: the tests not marked `serial` in parallel
# (pytest-xdist, `--dist loadfile`: a file stays on one worker; tests/conftest.py hands
# the slowest files out first and gives each worker its own Redis prefix), then the
# `serial` ones (they kill processes, restart PostgreSQL, or measure capacity and timing)
# alone, in one process; the `one_pass` ones (crash handling whose point does not depend
# on the database) in the PostgreSQL pass only when it runs. The slow installs (npm, the
# MCP 1.x venv, the TypeScript build) run in the background during ruff and mypy; the run
# waits for them, and fails with them.
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

# ---- slow installs, in the background while ruff and mypy run ----
bg_dir=$(mktemp -d)
declare -A bg_pid=()
bg_start() {  # bg_start NAME COMMAND...: its output goes to a log, shown when it is waited for
  local name=$1; shift
  ("$@") >"$bg_dir/$name.log" 2>&1 &
  bg_pid[$name]=$!
}
bg_wait() {  # bg_wait NAME TITLE: the job's log, and its failure fails the run
  local name=$1 status=0
  wait "${bg_pid[$name]}" || status=$?
  unset "bg_pid[$name]"
  echo "== $2"; cat "$bg_dir/$name.log"
  if [ "$status" -ne 0 ]; then
    echo "== $2: failed (exit $status)" >&2
    exit "$status"
  fi
}
bg_stop() {  # on any exit: no job outlives the run
  local pid
  for pid in "${bg_pid[@]}"; do kill "$pid" 2>/dev/null || true; done
  rm -rf "$bg_dir"
}
trap bg_stop EXIT
# One job for everything that may call apt-get (one dpkg lock) or npm, in order.
apt_and_npm() {
  set -e
  bash scripts/ensure_node.sh
  echo "-- MCP test servers (npm, var/mcp-npm)"; bash scripts/ensure_mcp_test_servers.sh
  echo "-- TypeScript SDK (sdk/typescript): npm ci, build"
  (cd sdk/typescript && npm ci --no-audit --no-fund && npm run build)
  echo "-- HAProxy (the PostgreSQL pass's cluster tests)"; bash scripts/ensure_haproxy.sh
  if [ -d tests/browser ]; then echo "-- Chromium (the browser tests)"; bash scripts/ensure_chromium.sh; fi
}
bg_start tools apt_and_npm
bg_start mcp1 bash scripts/ensure_mcp1_client.sh

echo "== ruff"; .venv/bin/ruff check .; .venv/bin/ruff format --check .
echo "== mypy"; .venv/bin/mypy
# Fails when a model change has no migration. An in-memory database: the check must not
# depend on (or create) the developer's var/sectr.sqlite3.
echo "== migrations"; DATABASE_URL=sqlite://:memory: REDIS_URL= "$PY" manage.py makemigrations --check --dry-run

bg_wait mcp1 "MCP 1.x client (var/mcp1-venv)"
bg_wait tools "Node and npm, MCP test servers, TypeScript SDK build, HAProxy, Chromium"

pytest_run() {  # pytest's exit 5 (nothing collected) fails the run too: set -e sees it
  "$PY" -m pytest "$@"
}
# A pass: the tests not marked `serial` on N xdist workers (a whole file per worker, in
# the order tests/conftest.py gives: its SLOW_FIRST files first; --no-loadscope-reorder
# stops xdist from ordering the files by their number of tests instead), then the
# `serial` ones alone (those of SERIAL-MARKS). The slowest tests are listed to keep
# SLOW_FIRST true.
suite_pass() {  # suite_pass WORKERS SERIAL-MARKS PYTEST-ARGS...
  local workers=$1 serial=$2; shift 2
  local started=$SECONDS
  pytest_run -q -n "$workers" --dist loadfile --no-loadscope-reorder -m "not serial" --durations=15 "$@"
  echo "-- parallel part: $((SECONDS - started)) s; the serial tests alone:"
  started=$SECONDS
  pytest_run -q -m "$serial" --durations=5 "$@"
  echo "-- serial part: $((SECONDS - started)) s"
}
# The PostgreSQL pass runs the `one_pass` serial tests (crash handling whose point does not
# depend on the database) and the TypeScript SDK's suite (a client of the HTTP API, which
# both passes' Python tests cover) through the production topology; without PostgreSQL
# and Redis the SQLite pass runs them instead.
postgres=0
"$PY" scripts/reachable.py "$PG_URL" "$REDIS_URL_T" && postgres=1
ts_sdk() {  # ts_sdk: the TypeScript SDK's node tests against a live Sectr (this environment's)
  (cd sdk/typescript && SECTR_PYTHON="$PWD/../../$PY" node --test --test-concurrency=1 test/)
}

echo "== tests: SQLite + in-memory channel layer"
if [ "$postgres" = 1 ]; then sqlite_serial="serial and not one_pass"; else sqlite_serial=serial; fi
DATABASE_URL= REDIS_URL= suite_pass 3 "$sqlite_serial" tests/core tests/server

if [ "$postgres" = 1 ]; then
  echo "== tests: PostgreSQL + Redis channel layer (the fault tests run a cluster behind HAProxy)"
  # Two workers, each a test process plus the servers its tests start, each with its own
  # connection pool: 10 connections a pool keeps them well under PostgreSQL's
  # max_connections (100 by default), beside whatever else uses that server.
  SECTR_DB_POOL_MAX=10 DATABASE_URL="$PG_URL" REDIS_URL="$REDIS_URL_T" suite_pass 2 serial tests/server
  echo "== TypeScript SDK (sdk/typescript) through the production topology (PostgreSQL, Redis, a separate worker)"
  DATABASE_URL="$PG_URL" REDIS_URL="$REDIS_URL_T" ts_sdk
else
  echo "== PostgreSQL/Redis not reachable at $PG_URL / $REDIS_URL_T: skipped that pass"
  echo "== TypeScript SDK (sdk/typescript): node --test against a live Sectr (the embedded defaults)"
  DATABASE_URL= REDIS_URL= ts_sdk
fi

if [ -d tests/browser ] && ls tests/browser/test_*.py >/dev/null 2>&1; then
  echo "== browser tests (Debian's headless Chromium), on two xdist workers (each its own live server)"
  started=$SECONDS
  DATABASE_URL= REDIS_URL= pytest_run -q -n 2 --dist loadfile -p no:asyncio -W ignore::pytest.PytestConfigWarning \
    tests/browser
  echo "-- browser tests: $((SECONDS - started)) s"
fi
