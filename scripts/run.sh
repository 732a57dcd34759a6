#!/usr/bin/env bash
# Sets everything up and runs Sectr on http://127.0.0.1:${PORT:-8000}/ (SQLite, in-memory
# channel layer, the offline demo model and a worker inside the server process).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export DJANGO_SETTINGS_MODULE=sectr_web.settings
.venv/bin/python manage.py migrate --noinput >/dev/null
.venv/bin/python manage.py sectr_bootstrap
exec .venv/bin/daphne -b "${HOST:-127.0.0.1}" -p "${PORT:-8000}" sectr_web.asgi:application
