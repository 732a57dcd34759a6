#!/usr/bin/env bash
# The `mcp` package's 1.x client (the session-based protocol revision), for the tests of
# the approval service (/mcp): installed into a venv of its own under var/, since the
# project's venv has 2.x. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
MCP1_VERSION=1.30.0
VENV=var/mcp1-venv
if [ "$(cat "$VENV/.version" 2>/dev/null)" != "$MCP1_VERSION" ]; then
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check "mcp==$MCP1_VERSION"
  echo "$MCP1_VERSION" > "$VENV/.version"
fi
