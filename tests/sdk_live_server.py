"""A live Sectr for the TypeScript SDK's tests (`node --test` in sdk/typescript).

    python -m tests.sdk_live_server

starts Daphne with an embedded worker on a scratch database (or, when DATABASE_URL names
PostgreSQL, a scratch PostgreSQL database with a separate worker process: the production
topology), with users and API tokens, prints one JSON line ``{"baseUrl", "tokens"}``,
and stops everything when its standard input closes.
"""

from __future__ import annotations

import json
import sys

from tests.server.api.test_api_support import live_api


def main() -> None:
    with live_api() as api:
        print(json.dumps({"baseUrl": api.base_url, "tokens": api.tokens}), flush=True)
        sys.stdin.read()  # until the test runner closes it (or exits)


if __name__ == "__main__":
    main()
