"""A live Sectr for the TypeScript SDK's tests (`node --test` in sdk/typescript).

    python -m tests.sdk_live_server [SETTINGS_MODULE]

starts Daphne with an embedded worker on a scratch database (or, when DATABASE_URL names
PostgreSQL, a scratch PostgreSQL database with a separate worker process: the production
topology), with users and API tokens, prints one JSON line ``{"baseUrl", "tokens"}``,
and stops everything when its standard input closes. SETTINGS_MODULE (default
sectr_web.settings) is the server's Django settings, e.g. tests.server.layer_fault_settings.
"""

from __future__ import annotations

import json
import sys

from tests.server.api.test_api_support import live_api


def main() -> None:
    env = {"DJANGO_SETTINGS_MODULE": sys.argv[1]} if len(sys.argv) > 1 else None
    with live_api(env=env) as api:
        print(json.dumps({"baseUrl": api.base_url, "tokens": api.tokens}), flush=True)
        sys.stdin.read()  # until the test runner closes it (or exits)


if __name__ == "__main__":
    main()
