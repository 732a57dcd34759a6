#!/usr/bin/env bash
# The TypeScript reference MCP server the tests use (the session-based protocol revision,
# and Streamable HTTP): installed from npm into var/, never globally. Needs Node and npm
# (scripts/ensure_node.sh installs them); idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/ensure_node.sh
EVERYTHING_VERSION=2026.8.31
EVERYTHING_DIR=var/mcp-npm
if [ "$(cat "$EVERYTHING_DIR/.version" 2>/dev/null)" != "$EVERYTHING_VERSION" ]; then
  mkdir -p "$EVERYTHING_DIR"
  npm install --silent --no-audit --no-fund --prefix "$EVERYTHING_DIR" \
    "@modelcontextprotocol/server-everything@$EVERYTHING_VERSION"
  echo "$EVERYTHING_VERSION" > "$EVERYTHING_DIR/.version"
fi
