#!/usr/bin/env bash
# The cluster (scripts/cluster.sh) and the fault tests (tests/server/runs/test_faults.py) put
# Debian's HAProxy in front of the Daphne processes.
set -euo pipefail
if ! command -v haproxy >/dev/null 2>&1 && [ ! -x /usr/sbin/haproxy ]; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq haproxy >/dev/null
fi
