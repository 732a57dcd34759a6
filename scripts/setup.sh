#!/usr/bin/env bash
# Creates .venv and installs requirements.txt into it. Idempotent: it reinstalls only
# when requirements.txt changed since the last successful install.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
stamp=.venv/.requirements.sha256
want=$(sha256sum requirements.txt | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -r requirements.txt
  echo "$want" > "$stamp"
fi
# The TypeScript reference MCP server the tests use (the session-based protocol revision,
# and Streamable HTTP): installed from npm into var/, never globally.
EVERYTHING_VERSION=2026.8.31
EVERYTHING_DIR=var/mcp-npm
if [ "$(cat "$EVERYTHING_DIR/.version" 2>/dev/null)" != "$EVERYTHING_VERSION" ]; then
  if command -v npm >/dev/null 2>&1; then
    mkdir -p "$EVERYTHING_DIR"
    npm install --silent --no-audit --no-fund --prefix "$EVERYTHING_DIR" \
      "@modelcontextprotocol/server-everything@$EVERYTHING_VERSION"
    echo "$EVERYTHING_VERSION" > "$EVERYTHING_DIR/.version"
  else
    echo "npm not found: tests/core/test_mcp.py needs it for @modelcontextprotocol/server-everything" >&2
  fi
fi
