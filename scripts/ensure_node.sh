#!/usr/bin/env bash
# The TypeScript SDK's build and tests need Node 20+ and npm: Debian's nodejs and npm
# packages, installed when missing (a fresh machine or CI).
set -euo pipefail
major() { node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0; }
if ! command -v npm >/dev/null 2>&1 || [ "$(major)" -lt 20 ]; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq nodejs npm >/dev/null
fi
if [ "$(major)" -lt 20 ]; then
  echo "Node $(node --version) is too old for sdk/typescript (20+ needed)" >&2
  exit 1
fi
