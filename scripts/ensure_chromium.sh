#!/usr/bin/env bash
# Browser tests drive Debian's Chromium (never a browser downloaded by Playwright), with
# a text font and an emoji font (the chat's feedback buttons and the screenshots).
set -euo pipefail
need=()
[ -x /usr/bin/chromium ] || need+=(chromium fonts-dejavu-core)
dpkg -s fonts-noto-color-emoji >/dev/null 2>&1 || need+=(fonts-noto-color-emoji)
if [ "${#need[@]}" -gt 0 ]; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi
