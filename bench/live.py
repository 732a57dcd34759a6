"""Live-update latency: a delta's journal time to its websocket frame at the browser's side.

Run: .venv/bin/python bench/live.py [--sizes 10,100,500] [--ticks 30] [--tick-ms 100]

For each N it starts a real Sectr (tests/liveserver.LiveSectr: Daphne with its embedded
worker, a scratch database; SQLite and the in-memory channel layer by default, or
PostgreSQL + Redis when DATABASE_URL / REDIS_URL say so, in which case add
--workers K for K separate worker processes), creates N sessions, connects one
websocket client per session (the page's socket: /ws/sessions/<id>/?after=<seq>), then
starts N `!slow <ticks>` runs of the demo model at once: every session streams one
delta every --tick-ms for the run.

Latency of a delta = the arrival time of the frame that carries it (time.time() when the
client's socket hands it over) - the envelope's created_at (stamped by DatabaseJournal
inside the append's transaction, before the commit). So it covers the commit, the
publication through the channel layer, the consumer's render of the OOB partial and
the socket. Server and client share this machine's clock.

Beside it, in the same run: a bare Channels group_send round trip (up to 20 groups with
one receiving channel each, one message per group every --tick-ms, on the same channel
layer configuration, in a process of its own) - what the layer alone costs on this
machine while the server is under that load. With the in-memory layer that is the
layer inside the probe's process; with Redis it crosses the same Redis as the server.

All clients run in this one asyncio process; on a small machine (this one has 2 cores,
shared with the server) they are part of what is measured at N = 500.

Aim (the issue): p50 < 20 ms and p99 < 100 ms at N = 100.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import re
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autobahn.asyncio.websocket import WebSocketClientFactory, WebSocketClientProtocol  # noqa: E402

from tests.liveserver import LiveSectr  # noqa: E402

PASSWORD = "bench-Password-1"
#: Groups the bare round trip probes at once (each at the sessions' delta rate): enough
#: samples, without the probe becoming a load of its own on a small machine.
BARE_PROBES = 20


@dataclass
class Client:
    session_id: str
    frames: list[tuple[int, int, float]] = field(default_factory=list)  # (first seq, last seq, arrival)
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    done: asyncio.Event = field(default_factory=asyncio.Event)


def client_protocol(client: Client) -> type[WebSocketClientProtocol]:
    class Protocol(WebSocketClientProtocol):
        def onMessage(self, payload: bytes, is_binary: bool) -> None:  # noqa: N802 - autobahn's name
            arrived = time.time()
            frame = json.loads(payload)
            if frame.get("ready"):
                client.ready.set()
                return
            if "seq" in frame and "first" in frame:
                client.frames.append((frame["first"], frame["seq"], arrived))
                html = frame.get("html", "")
                if 'data-role="state"' in html and (">completed<" in html or ">failed<" in html):
                    client.done.set()

    return Protocol


def percentile(values: list[float], fraction: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))
    return ordered[index]


def log_in(base_url: str, username: str) -> tuple[str, str]:
    """(sessionid, csrftoken) after logging in through the login form."""
    with httpx.Client(base_url=base_url) as http:
        http.get("/accounts/login/")
        csrf = http.cookies["csrftoken"]
        response = http.post(
            "/accounts/login/",
            data={"username": username, "password": PASSWORD, "csrfmiddlewaretoken": csrf},
            headers={"Referer": base_url + "/accounts/login/"},
        )
        if response.status_code != 302:
            raise RuntimeError(f"login failed: {response.status_code}")
        return http.cookies["sessionid"], http.cookies["csrftoken"]


def create_sessions(live: LiveSectr, n: int) -> list[tuple[str, int]]:
    code = (
        "from django.contrib.auth import get_user_model; from sessions_app import actions; "
        "u = get_user_model().objects.get(username='bench'); "
        f"ss = [actions.do_create_session(u, title='bench {{}}'.format(i)) for i in range({n})]; "
        "print('\\n'.join(f'{s.pk} {s.last_seq}' for s in ss))"
    )
    found = re.findall(r"^(ses_[0-9a-f]+) (\d+)$", live.manage("shell", "-c", code), re.MULTILINE)
    if len(found) != n:
        raise RuntimeError(f"created {len(found)} of {n} sessions")
    return [(session_id, int(seq)) for session_id, seq in found]


def delta_times(live: LiveSectr, session_ids: list[str]) -> dict[tuple[str, int], str]:
    code = (
        "import json, sys; from sessions_app.models import Envelope; "
        f"ids = {session_ids!r}; "
        "rows = Envelope.objects.filter(session_id__in=ids, type='MESSAGE_DELTA')"
        ".values_list('session_id', 'seq', 'created_at'); "
        "print(json.dumps([[s, q, c.isoformat()] for s, q, c in rows]))"
    )
    output = live.manage("shell", "-c", code).strip().splitlines()[-1]
    return {(sid, seq): created for sid, seq, created in json.loads(output)}


def channel_layer() -> Any:
    """The layer the server is configured with (built here without Django: importing the
    daphne app would pull in Twisted's autobahn, and this process uses asyncio's)."""
    redis_url = os.environ.get("REDIS_URL", "")
    if redis_url:
        from channels_redis.pubsub import RedisPubSubChannelLayer  # as sectr_web.settings

        return RedisPubSubChannelLayer(hosts=[redis_url], prefix=f"bench{os.getpid()}")
    from channels.layers import InMemoryChannelLayer

    return InMemoryChannelLayer()


async def bare_group_send(n: int, duration: float, interval: float) -> list[float]:
    """Round trips of group_send -> receive on the configured layer: n groups, one message
    per group every `interval` seconds, for `duration` seconds."""
    layer = channel_layer()
    channels = [await layer.new_channel("bench.") for _ in range(n)]
    prefix = f"bench{os.getpid()}x"
    for index, channel in enumerate(channels):
        await layer.group_add(f"{prefix}{index}", channel)
    latencies: list[float] = []
    stop = time.monotonic() + duration

    async def receiver(channel: str) -> None:
        while True:
            message = await layer.receive(channel)
            latencies.append(time.time() - message["t"])

    gate = asyncio.Semaphore(32)  # a bounded connection pool, like a server's

    async def sender(index: int) -> None:
        await asyncio.sleep(interval * index / n)  # spread the senders over one interval
        while time.monotonic() < stop:
            async with gate:
                await layer.group_send(f"{prefix}{index}", {"type": "bench.ping", "t": time.time()})
            await asyncio.sleep(interval)

    receivers = [asyncio.ensure_future(receiver(channel)) for channel in channels]
    await asyncio.gather(*(sender(index) for index in range(n)))
    await asyncio.sleep(0.2)
    for task in receivers:
        task.cancel()
    for index, channel in enumerate(channels):
        await layer.group_discard(f"{prefix}{index}", channel)
    return latencies


def bare_group_send_process(n: int, duration: float, interval: float) -> list[float]:
    return asyncio.run(bare_group_send(n, duration, interval))


async def measure(n: int, ticks: int, tick_ms: int, workers: int) -> dict[str, Any]:
    env = {
        "SECTR_DEMO_SLOW_MS": str(tick_ms),
        "SECTR_WORKER_CONCURRENCY": str(max(16, n)),
        "SECTR_WS_RESYNC_SECONDS": "60",
        "LOG_LEVEL": "ERROR",
        "SECTR_LOG_LEVEL": "WARNING",
    }
    embedded = workers == 0  # the server's own worker, on any database, unless workers are asked for
    with LiveSectr(env=env, embedded_worker=embedded) as live:
        for _ in range(workers):
            # Each worker process could run every session's run: N runs stream at once
            # (sectr_worker's own default, 8, would queue most of them).
            live.start_worker("--concurrency", str(max(16, n)))
        live.create_user("bench", password=PASSWORD)
        sessions = create_sessions(live, n)
        sessionid, csrftoken = log_in(live.base_url, "bench")
        cookie = f"sessionid={sessionid}; csrftoken={csrftoken}"
        loop = asyncio.get_running_loop()
        clients = [Client(session_id) for session_id, _ in sessions]
        for client, (session_id, last_seq) in zip(clients, sessions, strict=True):
            url = f"ws://127.0.0.1:{live.port}/ws/sessions/{session_id}/?after={last_seq}"
            factory = WebSocketClientFactory(url, origin=live.base_url, headers={"Cookie": cookie})
            factory.protocol = client_protocol(client)
            await loop.create_connection(factory, "127.0.0.1", live.port)
        await asyncio.wait_for(asyncio.gather(*(c.ready.wait() for c in clients)), 60)

        run_seconds = ticks * tick_ms / 1000
        # The bare round trips run in their own process, so the websocket clients'
        # work here does not count against the channel layer (nor the other way round).
        bare_pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
        probes = min(n, BARE_PROBES)
        bare = loop.run_in_executor(bare_pool, bare_group_send_process, probes, run_seconds, tick_ms / 1000)
        headers = {"X-CSRFToken": csrftoken, "Cookie": cookie, "HX-Request": "true"}
        started = time.monotonic()
        async with httpx.AsyncClient(base_url=live.base_url, headers=headers, timeout=60) as http:
            responses = await asyncio.gather(
                *(http.post(f"/sessions/{c.session_id}/messages", data={"content": f"!slow {ticks}"}) for c in clients)
            )
        if any(r.status_code >= 400 for r in responses):
            raise RuntimeError(f"could not start the runs: {[r.status_code for r in responses][:10]}")
        try:
            await asyncio.wait_for(asyncio.gather(*(c.done.wait() for c in clients)), run_seconds * 4 + 60)
        except TimeoutError:
            unfinished = sum(not c.done.is_set() for c in clients)
            raise RuntimeError(f"{unfinished} of {n} runs did not finish:\n{live.log()}") from None
        wall = time.monotonic() - started
        bare_latencies = await bare
        bare_pool.shutdown()

        created = delta_times(live, [c.session_id for c in clients])
        latencies: list[float] = []
        raw: list[tuple[str, int, float, float]] = []
        frames = 0
        for client in clients:
            frames += len(client.frames)
            for first, last, arrived in client.frames:
                for seq in range(first, last + 1):
                    stamp = created.get((client.session_id, seq))
                    if stamp is not None:
                        created_at = datetime.fromisoformat(stamp).timestamp()
                        latencies.append(arrived - created_at)
                        raw.append((client.session_id, seq, created_at, arrived))
        backend = "postgresql" if live.postgres else "sqlite"
    layer = "redis" if os.environ.get("REDIS_URL") else "in-memory"
    return {
        "n": n,
        "backend": f"{backend} + {layer} layer"
        + (f" + {workers} worker processes" if workers else " (embedded worker)"),
        "deltas": len(latencies),
        "frames": frames,
        "wall": wall,
        "p50": percentile(latencies, 0.50) * 1000,
        "p99": percentile(latencies, 0.99) * 1000,
        "max": max(latencies, default=float("nan")) * 1000,
        "bare_p50": percentile(bare_latencies, 0.50) * 1000,
        "bare_p99": percentile(bare_latencies, 0.99) * 1000,
        "bare_count": len(bare_latencies),
        "raw": raw,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--sizes", default="10,100,500", help="comma-separated session counts")
    parser.add_argument("--ticks", type=int, default=30, help="deltas per run (!slow N)")
    parser.add_argument("--tick-ms", type=int, default=100, help="milliseconds between a run's deltas")
    parser.add_argument("--workers", type=int, default=0, help="separate worker processes (needs Redis)")
    parser.add_argument(
        "--dump", default="", help="write [session, seq, created, arrived] per delta to this JSON file ({n}: N)"
    )
    args = parser.parse_args()
    sizes = [int(size) for size in re.split(r"[,\s]+", args.sizes) if size]
    print(f"{'N':>5} {'deltas':>7} {'frames':>7} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}   "
          f"{'bare p50':>8} {'bare p99':>8}  backend")  # fmt: skip
    for n in sizes:
        result = asyncio.run(measure(n, args.ticks, args.tick_ms, args.workers))
        if args.dump:
            Path(args.dump.format(n=n)).write_text(json.dumps(result["raw"]))
        print(
            f"{result['n']:>5} {result['deltas']:>7} {result['frames']:>7} {result['p50']:>8.1f} "
            f"{result['p99']:>8.1f} {result['max']:>8.1f}   {result['bare_p50']:>8.2f} {result['bare_p99']:>8.2f}  "
            f"{result['backend']}",
            flush=True,
        )
    print(
        f"(each run: !slow {args.ticks}, one delta every {args.tick_ms} ms per session; "
        "aim at N=100: p50 < 20, p99 < 100)"
    )


if __name__ == "__main__":
    main()
