#!/usr/bin/env bash
# The production topology on one machine, on loopback ports: HAProxy in front of
# 2 Daphne processes, 2 workers (`manage.py sectr_worker`), PostgreSQL and Redis.
#
#   scripts/cluster.sh                      # http://127.0.0.1:8080/ until Ctrl-C
#   PORT=9000 DAPHNES=3 WORKERS=4 scripts/cluster.sh
#
# DATABASE_URL (default postgres://postgres@127.0.0.1:5432/sectr_cluster, created if
# missing) and REDIS_URL (default redis://127.0.0.1:6379/0) name the machine's servers.
# Daphne i listens on PORT+1+i. Everything started here is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/.."

PORT="${PORT:-8080}"
DAPHNES="${DAPHNES:-2}"
WORKERS="${WORKERS:-2}"
export DATABASE_URL="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/sectr_cluster}"
export REDIS_URL="${REDIS_URL:-redis://127.0.0.1:6379/0}"
export DJANGO_SETTINGS_MODULE=sectr_web.settings
export SECTR_EMBEDDED_WORKER=0
export PYTHONUNBUFFERED=1
# CSRF checks the Origin of a POST against the host the browser used: the balancer's.
export CSRF_TRUSTED_ORIGINS="${CSRF_TRUSTED_ORIGINS:-http://127.0.0.1:$PORT,http://localhost:$PORT}"

bash scripts/ensure_haproxy.sh
HAPROXY="$(command -v haproxy || echo /usr/sbin/haproxy)"

[ -x .venv/bin/python ] || bash scripts/setup.sh
PY=.venv/bin/python
RUN_DIR="$(mktemp -d "${TMPDIR:-/tmp}/sectr-cluster.XXXXXX")"
PIDS=()

stop_all() {
  trap - EXIT INT TERM
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  done
  echo "cluster stopped (logs kept in $RUN_DIR)"
}
trap stop_all EXIT
trap 'exit 130' INT TERM

# The database must exist before migrate can run (PostgreSQL only).
case "$DATABASE_URL" in
  postgres://*|postgresql://*)
    $PY - <<'PY'
import os
from urllib.parse import urlsplit, urlunsplit
import psycopg
url = urlsplit(os.environ["DATABASE_URL"])
name = url.path.lstrip("/")
with psycopg.connect(urlunsplit(url._replace(path="/postgres")), autocommit=True) as conn:
    if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
        conn.execute(f'CREATE DATABASE "{name}"')
PY
    ;;
esac
$PY manage.py migrate --noinput >/dev/null
$PY manage.py sectr_bootstrap

SERVERS=""
for i in $(seq 1 "$DAPHNES"); do
  port=$((PORT + i))
  .venv/bin/daphne -b 127.0.0.1 -p "$port" sectr_web.asgi:application >"$RUN_DIR/daphne-$i.log" 2>&1 &
  PIDS+=($!)
  SERVERS+="    server daphne$i 127.0.0.1:$port check"$'\n'
done
for i in $(seq 1 "$WORKERS"); do
  $PY manage.py sectr_worker >"$RUN_DIR/worker-$i.log" 2>&1 &
  PIDS+=($!)
done
awk -v port="$PORT" -v servers="$SERVERS" '{ gsub("@PORT@", port); if ($0 ~ /^@SERVERS@$/) printf "%s", servers; else print }' \
  scripts/haproxy.cfg.in >"$RUN_DIR/haproxy.cfg"
# Without SECTR_HAPROXY_NAME_BACKEND (test clusters only): responses name no internal server.
env -u SECTR_HAPROXY_NAME_BACKEND "$HAPROXY" -db -f "$RUN_DIR/haproxy.cfg" >"$RUN_DIR/haproxy.log" 2>&1 &
PIDS+=($!)

for _ in $(seq 100); do
  if curl -fsS -o /dev/null "http://127.0.0.1:$PORT/healthz" 2>/dev/null; then break; fi
  sleep 0.2
done
echo "Sectr cluster on http://127.0.0.1:$PORT/ (HAProxy -> $DAPHNES Daphne on ports $((PORT + 1))-$((PORT + DAPHNES)), $WORKERS workers)"
echo "database $DATABASE_URL, channel layer $REDIS_URL, logs in $RUN_DIR; Ctrl-C stops everything"
# Any process of the topology dying ends the script (and the trap stops the rest).
wait -n "${PIDS[@]}" || true
echo "a cluster process exited; stopping" >&2
exit 1
