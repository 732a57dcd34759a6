"""Idle page websockets on one Daphne: memory per socket.

Run: .venv/bin/python bench/sockets.py [--sockets 5000] [--sessions 50]

Starts one Daphne (tests/liveserver.LiveSectr, its embedded worker off: nothing runs),
logs in, then opens --sockets page websockets (/ws/sessions/<id>/?after=<seq>, spread
over --sessions sessions), each waiting for its `ready` frame, and leaves them idle.
Memory per socket = (Daphne's resident set with every socket open - before the first)
/ sockets. The clients run in this process (autobahn on asyncio), so their memory is not
counted. Aim (the issue): under 30 KiB a socket at 5,000.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from autobahn.asyncio.websocket import WebSocketClientFactory, WebSocketClientProtocol  # noqa: E402
from live import PASSWORD, create_sessions, log_in  # noqa: E402

from tests.liveserver import LiveSectr  # noqa: E402

#: Production settings (DEBUG on keeps every query of every connection), plain http on loopback.
SERVER_ENV = {
    "LOG_LEVEL": "ERROR",
    "SECTR_LOG_LEVEL": "WARNING",
    "DEBUG": "0",
    "SECRET_KEY": "bench-not-secret-" + "x" * 40,
    "SECURE_SSL_REDIRECT": "0",
}


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


async def open_sockets(live: LiveSectr, sessions: list[tuple[str, int]], count: int, cookie: str) -> list[object]:
    loop = asyncio.get_running_loop()
    ready = 0
    done = asyncio.Event()
    transports: list[object] = []

    class Protocol(WebSocketClientProtocol):
        def __init__(self) -> None:
            super().__init__()
            self.is_ready = asyncio.Event()

        def onMessage(self, payload: bytes, is_binary: bool) -> None:  # noqa: N802 - autobahn's name
            nonlocal ready
            if json.loads(payload).get("ready"):
                ready += 1
                self.is_ready.set()
                if ready == count:
                    done.set()

    # Sockets opening at once, counted until each one's `ready` frame (its handshake, the
    # access check and the catch-up read): a crowd, not a stampede of half-open handshakes.
    gate = asyncio.Semaphore(50)

    async def connect(index: int) -> None:
        session_id, last_seq = sessions[index % len(sessions)]
        url = f"ws://127.0.0.1:{live.port}/ws/sessions/{session_id}/?after={last_seq}"
        factory = WebSocketClientFactory(url, origin=live.base_url, headers={"Cookie": cookie})
        factory.protocol = Protocol
        async with gate:
            transport, protocol = await loop.create_connection(factory, "127.0.0.1", live.port)
            transports.append(transport)
            await asyncio.wait_for(protocol.is_ready.wait(), 120)

    await asyncio.gather(*(connect(index) for index in range(count)))
    await asyncio.wait_for(done.wait(), 600)
    return transports


async def measure(count: int, session_count: int) -> None:
    with LiveSectr(env=SERVER_ENV, embedded_worker=False) as live:
        live.create_user("bench", password=PASSWORD)
        sessions = create_sessions(live, session_count)
        sessionid, csrftoken = log_in(live.base_url, "bench")
        cookie = f"sessionid={sessionid}; csrftoken={csrftoken}"
        assert live.server is not None
        pid = live.server.pid
        # Warm up: one socket per session first (imports, caches, the first connections of the pool).
        warm = await open_sockets(live, sessions, session_count, cookie)
        await asyncio.sleep(1)
        before = rss_kib(pid)
        started = time.monotonic()
        transports = await open_sockets(live, sessions, count, cookie)
        opened = time.monotonic() - started
        await asyncio.sleep(2)  # idle: whatever a socket holds once settled
        after = rss_kib(pid)
        per_socket = (after - before) / count
        print(
            f"{count} idle websockets on one Daphne: RSS {before / 1024:.1f} MiB -> {after / 1024:.1f} MiB, "
            f"{per_socket:.1f} KiB a socket (aim < 30); opened in {opened:.1f} s"
        )
        for transport in transports + warm:
            transport.close()  # type: ignore[attr-defined]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--sockets", type=int, default=5000)
    parser.add_argument("--sessions", type=int, default=50)
    args = parser.parse_args()
    asyncio.run(measure(args.sockets, args.sessions))


if __name__ == "__main__":
    main()
