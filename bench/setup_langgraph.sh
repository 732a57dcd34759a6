#!/usr/bin/env bash
# The peer of bench/peers.py: LangGraph's local Agent Server (`langgraph dev`, in-memory)
# in a venv of its own under var/ (a benchmark dependency only: never in .venv or
# requirements.txt). Idempotent: does nothing once var/langgraph-venv/bin/langgraph runs.
#
#   bash bench/setup_langgraph.sh          # then: .venv/bin/python bench/peers.py ...
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${LANGGRAPH_VENV:-var/langgraph-venv}"
if [ -x "$VENV/bin/langgraph" ] && "$VENV/bin/langgraph" --help >/dev/null 2>&1; then
  exit 0
fi
python3 -m venv "$VENV"
"$VENV/bin/pip" install --quiet --upgrade pip
"$VENV/bin/pip" install --quiet "langgraph-cli[inmem]"
"$VENV/bin/langgraph" --version
