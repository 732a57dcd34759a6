"""Exit 0 when every URL given (postgres://, redis://) accepts a TCP connection."""

import socket
import sys
from urllib.parse import urlsplit

DEFAULT_PORTS = {"postgres": 5432, "postgresql": 5432, "redis": 6379}


def reachable(url: str) -> bool:
    parts = urlsplit(url)
    port = parts.port or DEFAULT_PORTS.get(parts.scheme, 0)
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", port), timeout=2):
            return True
    except OSError:
        return False


if __name__ == "__main__":
    sys.exit(0 if all(reachable(u) for u in sys.argv[1:]) else 1)
