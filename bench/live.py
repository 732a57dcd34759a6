"""Live streaming, honestly timed: each chunk from the moment the model produced it to
its websocket frame at the page's side.

Run:
    .venv/bin/python bench/live.py [--sizes 10,100,500] [--ticks 30] [--tick-ms 100]
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/x REDIS_URL=redis://127.0.0.1:6379/0 \
        .venv/bin/python bench/live.py --topology cluster

Topologies: `embedded` (default) is tests/liveserver.LiveSectr: one Daphne with its
embedded worker on a scratch SQLite database and the in-memory layer (the zero-setup
default, whatever DATABASE_URL / REDIS_URL say); `embedded-env` is the same process on
the DATABASE_URL / REDIS_URL of the environment. `cluster` is tests/cluster.Cluster, the
production topology of scripts/cluster.sh: HAProxy in front of 2 Daphne and 2 workers
on PostgreSQL and Redis; the clients connect through HAProxy.

For each N it creates N sessions, connects one websocket per session (the page's socket:
/ws/sessions/<id>/?after=<seq>), then posts N `!slow <ticks>` messages at once: every
session streams one chunk every --tick-ms.

How a chunk is timed. The demo model, with SECTR_DEMO_STAMP_FILE set (the bench sets it),
appends `<session> <tick> <unix time>` to that file at the moment it yields each tick,
before anything of Sectr has seen it. A side file, so that the journal, the frames and
the code path measured are exactly the production ones. After the run the bench reads
which envelope (seq) carried which ticks from the journal, which frame carried which seq
from the client's log, and reports per chunk:

- lag: frame arrival - production stamp (covers the writer's coalescing wait, the
  append's transaction, the publication, the consumer's render and the socket);
- lag once all runs started: the same, for chunks produced after every run's first
  (the burst of N POSTs and N run starts is over): what a stream sees in steady state;
- admission: per run, first chunk's frame arrival - the moment its POST was sent;
- drift: how far the model's production fell behind its own 100 ms schedule (a worker
  whose event loop is starved produces late; that does not show in lag, so it is here);
- server CPU: user+system CPU of every server process (/proc/<pid>/stat, from just
  before the POSTs to the last chunk), in ms per chunk delivered.

Diagnostics (the bench's own environment): SECTR_BENCH_DUMP_CHUNKS=path writes every
chunk as a JSON line [session, tick, produced, appended, arrived] (unix times; appended
is its envelope's created_at), SECTR_BENCH_DUMP_DUPLICATES=path the journal of a session
with a tick journaled twice, if any.

Server and client share this machine's clock. All clients run in this one asyncio
process; on a small machine they are part of the load. The POSTs go through the lean
client of bench/lean_http.py (httpx cost ~10 ms of CPU a POST here: 1 s of the
machine's two cores for N=100, which delayed the very admissions it timed).

Aims (the issue): at N = 100, p50 < 20 ms and p99 < 100 ms; admission p99 < 200 ms.
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
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from autobahn.asyncio.websocket import WebSocketClientFactory, WebSocketClientProtocol  # noqa: E402
from lean_http import LeanClient, Response  # noqa: E402

from tests.cluster import Cluster  # noqa: E402
from tests.liveserver import LiveSectr  # noqa: E402

PASSWORD = "bench-Password-1"
BARE_PROBES = 20
TICK_RE = re.compile(r"tick (\d+)")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class Client:
    session_id: str
    frames: list[tuple[int, int, float]] = field(default_factory=list)  # (first seq, last seq, arrival)
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    posted: float = 0.0
    answered: float = 0.0  # when the POST's response arrived


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


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime


def cpu_seconds_exact(pid: int) -> float:
    """`cpu_seconds` to the nanosecond (the scheduler's own count, summed over the
    process's threads, /proc/<pid>/task/*/schedstat: /proc/<pid>/schedstat is the main
    thread's alone), where /proc/<pid>/stat counts in clock ticks (10 ms): a PostgreSQL
    burst spreads its CPU over some fifty backends, a few ticks each, and rounding each
    to a tick moved the sum by up to 0.1 ms per chunk; an idle process spends a few ms a
    second. A thread that ends takes its time with it (unlike /proc/<pid>/stat's count).
    `cpu_seconds` where the kernel keeps no schedstat."""
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    total = 0.0
    for task in tasks:
        try:
            total += int((task / "schedstat").read_text().split()[0]) / 1e9
        except (FileNotFoundError, ProcessLookupError):
            continue  # the thread ended meanwhile
        except OSError:
            return cpu_seconds(pid)
    return total


def server_pids(live: LiveSectr) -> dict[str, int]:
    if isinstance(live, Cluster):
        return live.pids()
    pids = {"daphne": live.server.pid} if live.server is not None else {}
    pids.update({f"worker{i}": p.pid for i, p in enumerate(live.workers) if p.poll() is None})
    return pids


@contextmanager
def cpu_meter(pids: dict[str, int]) -> Iterator[dict[str, float]]:
    """CPU seconds each process spent inside the block, by role."""
    used: dict[str, float] = {}
    before = {role: cpu_seconds(pid) for role, pid in pids.items()}
    yield used
    for role, pid in pids.items():
        used[role] = cpu_seconds(pid) - before[role]


def log_in(base_url: str, username: str) -> tuple[str, str]:
    """(sessionid, csrftoken) after logging in through the login form.

    Cookies are carried by hand: with DEBUG=0 they are Secure, which httpx's jar does not
    send over the loopback's plain http."""
    with httpx.Client(base_url=base_url) as http:
        csrf = http.get("/accounts/login/").cookies["csrftoken"]
        http.cookies.clear()
        response = http.post(
            "/accounts/login/",
            data={"username": username, "password": PASSWORD, "csrfmiddlewaretoken": csrf},
            headers={"Referer": base_url + "/accounts/login/", "Cookie": f"csrftoken={csrf}"},
        )
        if response.status_code != 302:
            raise RuntimeError(f"login failed: {response.status_code}")
        return response.cookies["sessionid"], response.cookies.get("csrftoken") or csrf


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


def delta_ticks(
    live: LiveSectr, session_ids: list[str]
) -> tuple[dict[tuple[str, int], list[int]], dict[tuple[str, int], float]]:
    """(session, seq) -> the ticks that MESSAGE_DELTA envelope carries, and -> its
    created_at (unix time: stamped in the append's transaction, before its commit)."""
    code = (
        "import json; from sessions_app.models import Envelope; "
        f"ids = {session_ids!r}; "
        "rows = Envelope.objects.filter(session_id__in=ids, type='MESSAGE_DELTA')"
        ".values_list('session_id', 'seq', 'payload', 'created_at'); "
        "print(json.dumps([[s, q, p.get('text', ''), c.timestamp()] for s, q, p, c in rows]))"
    )
    rows = json.loads(live.manage("shell", "-c", code).strip().splitlines()[-1])
    carried = {(sid, seq): [int(t) for t in TICK_RE.findall(text)] for sid, seq, text, _at in rows}
    return carried, {(sid, seq): at for sid, seq, _text, at in rows}


def recoveries(live: LiveSectr, session_ids: list[str]) -> int:
    """How many invocations of these sessions were recoveries (a lease lost or taken over)."""
    code = (
        "from sessions_app.models import Envelope; "
        f"ids = {session_ids!r}; "
        "rows = Envelope.objects.filter(session_id__in=ids, type='INVOCATION_STARTED')"
        ".values_list('payload', flat=True); "
        "print(sum(1 for p in rows if (p.get('reason') or {}).get('kind') == 'recover'))"
    )
    return int(live.manage("shell", "-c", code).strip().splitlines()[-1])


def doubled_ticks(carried: dict[tuple[str, int], list[int]]) -> dict[str, int]:
    """Per session, how many ticks its journal holds more than once (must be 0 each)."""
    per_session: dict[str, list[int]] = {}
    for (session_id, _seq), ticks in carried.items():
        per_session.setdefault(session_id, []).extend(ticks)
    return {session_id: len(ticks) - len(set(ticks)) for session_id, ticks in per_session.items()}


def dump_duplicated_session(live: LiveSectr, session_id: str, out: Path) -> None:
    """Write the journal of one session with a tick journaled twice (to see how)."""
    code = (
        "from sessions_app.models import Envelope; "
        f"rows = Envelope.objects.filter(session_id={session_id!r}).order_by('seq')"
        ".values_list('seq', 'type', 'invocation_id', 'payload', 'created_at'); "
        "[print(q, t, i, c.isoformat(), str(p)[:160]) for q, t, i, p, c in rows]"
    )
    out.write_text(live.manage("shell", "-c", code))


def read_stamps(path: Path) -> dict[tuple[str, int], float]:
    """(session, tick) -> when the demo model produced it (the last time, after a recovery)."""
    stamps: dict[tuple[str, int], float] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            session_id, tick, produced = line.split()
            stamps[(session_id, int(tick))] = float(produced)
    return stamps


def channel_layer() -> Any:
    redis_url = os.environ.get("REDIS_URL", "")
    if redis_url:
        from channels_redis.pubsub import RedisPubSubChannelLayer  # as sectr_web.settings

        return RedisPubSubChannelLayer(hosts=[redis_url], prefix=f"bench{os.getpid()}")
    from sectr_web.channel_layer import InMemoryChannelLayer  # as sectr_web.settings

    return InMemoryChannelLayer()


async def bare_group_send(n: int, duration: float, interval: float) -> list[float]:
    """Round trips of group_send -> receive on the configured layer (--bare)."""
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

    async def sender(index: int) -> None:
        await asyncio.sleep(interval * index / n)
        while time.monotonic() < stop:
            await layer.group_send(f"{prefix}{index}", {"type": "bench.ping", "t": time.time()})
            await asyncio.sleep(interval)

    receivers = [asyncio.ensure_future(receiver(channel)) for channel in channels]
    await asyncio.gather(*(sender(index) for index in range(n)))
    await asyncio.sleep(0.2)
    for task in receivers:
        task.cancel()
    return latencies


def bare_group_send_process(n: int, duration: float, interval: float) -> list[float]:
    return asyncio.run(bare_group_send(n, duration, interval))


def start_topology(topology: str, env: dict[str, str], n: int) -> LiveSectr:
    if topology == "cluster":
        return Cluster(daphnes=2, workers=2, worker_args=("--concurrency", str(max(16, n))), env=env)
    if topology == "embedded":
        # The zero-setup default whatever this shell's DATABASE_URL / REDIS_URL say.
        saved = {name: os.environ.pop(name) for name in ("DATABASE_URL", "REDIS_URL") if name in os.environ}
        try:
            return LiveSectr(env={**env, "REDIS_URL": ""}, embedded_worker=True)
        finally:
            os.environ.update(saved)
    # "embedded-env": one Daphne with its worker on whatever DATABASE_URL / REDIS_URL name.
    return LiveSectr(env=env, embedded_worker=True)


async def measure(n: int, ticks: int, tick_ms: int, topology: str = "embedded", bare: bool = False) -> dict[str, Any]:
    stamp_dir = Path(os.environ.get("TMPDIR", "/tmp"))
    stamp_file = stamp_dir / f"sectr-bench-stamps-{os.getpid()}-{n}-{time.time_ns()}.txt"
    env = {
        "SECTR_DEMO_SLOW_MS": str(tick_ms),
        "SECTR_DEMO_STAMP_FILE": str(stamp_file),
        "SECTR_WORKER_CONCURRENCY": str(max(16, n)),
        "SECTR_WS_RESYNC_SECONDS": "60",
        "LOG_LEVEL": "ERROR",
        "SECTR_LOG_LEVEL": "WARNING",
        # Production settings (DEBUG on records every query), over plain http on loopback.
        "DEBUG": "0",
        "SECRET_KEY": "bench-not-secret-" + "x" * 40,
        "SECURE_SSL_REDIRECT": "0",
    }
    with start_topology(topology, env, n) as live:
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
        bare_pool = bare_future = None
        if bare:
            bare_pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
            bare_future = loop.run_in_executor(
                bare_pool, bare_group_send_process, min(n, BARE_PROBES), run_seconds, tick_ms / 1000
            )
        headers = {"X-CSRFToken": csrftoken, "Cookie": cookie, "HX-Request": "true"}
        pids = server_pids(live)
        # The lean client (bench/lean_http.py): httpx spent ~10 ms of this machine's CPU
        # per POST, more than the servers it timed.
        http = LeanClient(live.base_url, headers=headers, connections=n)
        try:
            # One connection per client, opened before the clock starts (a browser tab has one).
            await asyncio.gather(*(http.get("/healthz") for _ in range(n)))

            async def post(client: Client) -> Response:
                client.posted = time.time()
                url = f"/sessions/{client.session_id}/messages"
                response = await http.post(url, data={"content": f"!slow {ticks}"})
                client.answered = time.time()
                return response

            with cpu_meter(pids) as cpu:
                started = time.monotonic()
                responses = await asyncio.gather(*(post(c) for c in clients))
                if any(r.status_code >= 400 for r in responses):
                    raise RuntimeError(f"could not start the runs: {[r.status_code for r in responses][:10]}")
                try:
                    await asyncio.wait_for(asyncio.gather(*(c.done.wait() for c in clients)), run_seconds * 4 + 60)
                except TimeoutError:
                    unfinished = sum(not c.done.is_set() for c in clients)
                    raise RuntimeError(f"{unfinished} of {n} runs did not finish:\n{live.log()}") from None
                wall = time.monotonic() - started
        finally:
            await http.aclose()
        bare_latencies = await bare_future if bare_future is not None else []
        if bare_pool is not None:
            bare_pool.shutdown()
        carried, appended_at = delta_ticks(live, [c.session_id for c in clients])
        recovered = recoveries(live, [c.session_id for c in clients])
        doubled = doubled_ticks(carried)
        if os.environ.get("SECTR_BENCH_DUMP_DUPLICATES") and any(doubled.values()):
            doubled_session = next(session_id for session_id, count in doubled.items() if count)
            dump_duplicated_session(live, doubled_session, Path(os.environ["SECTR_BENCH_DUMP_DUPLICATES"]))
        backend = ("postgresql" if live.postgres else "sqlite") + (
            " + redis" if live.env.get("REDIS_URL") else " + in-memory layer"
        )
    stamps = read_stamps(stamp_file)
    stamp_file.unlink(missing_ok=True)

    lags: list[float] = []
    # Chunks produced once every run had produced its first (the admission burst over).
    settled_at = max((stamps[(c.session_id, 1)] for c in clients if (c.session_id, 1) in stamps), default=0.0)
    settled_lags: list[float] = []
    timeline: list[tuple[str, int, float, float | None, float]] = []  # SECTR_BENCH_DUMP_CHUNKS
    to_append: list[float] = []  # production -> its envelope's created_at (in the worker)
    after_append: list[float] = []  # created_at -> frame (commit, publish, Daphne, socket)
    admissions: list[float] = []
    answers: list[float] = []  # POST sent -> its response (the view's queue and work)
    first_ticks: list[float] = []  # POST sent -> the model produced tick 1 (claim and start)
    drifts: list[float] = []
    chunks = 0
    for client in clients:
        first_arrival = None
        for first, last, arrived in client.frames:
            for seq in range(first, last + 1):
                for tick in carried.get((client.session_id, seq), []):
                    produced = stamps.get((client.session_id, tick))
                    if produced is None:
                        continue
                    chunks += 1
                    lags.append(arrived - produced)
                    if (at := appended_at.get((client.session_id, seq))) is not None:
                        to_append.append(at - produced)
                        after_append.append(arrived - at)
                    timeline.append((client.session_id, tick, produced, at, arrived))
                    if produced > settled_at:
                        settled_lags.append(arrived - produced)
                    if first_arrival is None:
                        first_arrival = arrived
        if first_arrival is not None:
            admissions.append(first_arrival - client.posted)
        answers.append(client.answered - client.posted)
        start = stamps.get((client.session_id, 1))
        if start is not None:
            first_ticks.append(start - client.posted)
            for tick in range(2, ticks + 1):
                if (produced := stamps.get((client.session_id, tick))) is not None:
                    drifts.append(produced - start - (tick - 1) * tick_ms / 1000)
    if os.environ.get("SECTR_BENCH_DUMP_CHUNKS"):  # every chunk: session, tick, produced, appended, arrived
        dump = Path(os.environ["SECTR_BENCH_DUMP_CHUNKS"])
        await asyncio.to_thread(dump.write_text, "\n".join(json.dumps(row) for row in timeline))
    total_cpu = sum(cpu.values())
    return {
        "system": "sectr",
        "n": n,
        "topology": topology,
        "backend": backend,
        "chunks": chunks,
        "expected": n * ticks,
        "frames": sum(len(c.frames) for c in clients),
        "wall": wall,
        "p50": percentile(lags, 0.50) * 1000,
        "p99": percentile(lags, 0.99) * 1000,
        "max": max(lags, default=float("nan")) * 1000,
        "settled_p50": percentile(settled_lags, 0.50) * 1000,
        "settled_p99": percentile(settled_lags, 0.99) * 1000,
        "settled_chunks": len(settled_lags),
        "to_append_p50": percentile(to_append, 0.50) * 1000,
        "to_append_p99": percentile(to_append, 0.99) * 1000,
        "after_append_p50": percentile(after_append, 0.50) * 1000,
        "after_append_p99": percentile(after_append, 0.99) * 1000,
        "admit_p50": percentile(admissions, 0.50) * 1000,
        "admit_p99": percentile(admissions, 0.99) * 1000,
        "recovered": recovered,
        "journal_duplicate_ticks": sum(doubled.values()),
        "answer_p50": percentile(answers, 0.50) * 1000,
        "answer_p99": percentile(answers, 0.99) * 1000,
        "first_tick_p50": percentile(first_ticks, 0.50) * 1000,
        "first_tick_p99": percentile(first_ticks, 0.99) * 1000,
        "drift_p99": percentile(drifts, 0.99) * 1000,
        "cpu_ms_per_chunk": total_cpu * 1000 / max(chunks, 1),
        "cpu_by_process": {role: used * 1000 / max(chunks, 1) for role, used in cpu.items()},
        "bare_p50": percentile(bare_latencies, 0.50) * 1000,
        "bare_p99": percentile(bare_latencies, 0.99) * 1000,
    }


HEADER = (
    f"{'system':<7} {'N':>4} {'chunks':>11} {'lag p50':>8} {'p99':>7} {'max':>7} "
    f"{'admit p50':>9} {'p99':>7} {'drift p99':>9} {'CPU ms/chunk':>12}  where"
)


def format_row(result: dict[str, Any]) -> str:
    processes = ", ".join(f"{role} {ms:.2f}" for role, ms in result["cpu_by_process"].items())
    where = f"{result['topology']}: {result['backend']} ({processes})"
    if "answer_p50" in result:  # where admission goes: the POST's answer, then the claim and start
        where += (
            f"; POST answered p50 {result['answer_p50']:.0f} p99 {result['answer_p99']:.0f},"
            f" tick 1 produced p50 {result['first_tick_p50']:.0f} p99 {result['first_tick_p99']:.0f};"
            f" runs recovered {result['recovered']}, ticks journaled twice {result['journal_duplicate_ticks']};"
            f" lag once all runs started ({result['settled_chunks']} chunks) p50 {result['settled_p50']:.1f}"
            f" p99 {result['settled_p99']:.1f}; produced to appended p50 {result['to_append_p50']:.1f}"
            f" p99 {result['to_append_p99']:.1f}, appended to frame p50 {result['after_append_p50']:.1f}"
            f" p99 {result['after_append_p99']:.1f}"
        )
    if result.get("bare_p50") == result.get("bare_p50"):  # not NaN: --bare ran
        where += f"; bare group_send p50 {result['bare_p50']:.1f} p99 {result['bare_p99']:.1f}"
    return (
        f"{result['system']:<7} {result['n']:>4} {result['chunks']:>5}/{result['expected']:<5} "
        f"{result['p50']:>8.1f} {result['p99']:>7.1f} {result['max']:>7.1f} "
        f"{result['admit_p50']:>9.1f} {result['admit_p99']:>7.1f} {result['drift_p99']:>9.1f} "
        f"{result['cpu_ms_per_chunk']:>12.2f}  {where}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--sizes", default="10,100,500", help="comma-separated session counts")
    parser.add_argument("--ticks", type=int, default=30, help="chunks per run (!slow N)")
    parser.add_argument("--tick-ms", type=int, default=100, help="milliseconds between a run's chunks")
    parser.add_argument("--topology", choices=["embedded", "embedded-env", "cluster"], default="embedded")
    parser.add_argument("--bare", action="store_true", help="also time a bare Channels group_send beside it")
    parser.add_argument("--json", default="", help="append each result as a JSON line to this file")
    args = parser.parse_args()
    sizes = [int(size) for size in re.split(r"[,\s]+", args.sizes) if size]
    print(HEADER + "   (times in ms)")
    for n in sizes:
        result = asyncio.run(measure(n, args.ticks, args.tick_ms, args.topology, args.bare))
        print(format_row(result), flush=True)
        if args.json:
            with open(args.json, "a") as out:
                out.write(json.dumps(result) + "\n")
    print(f"(each run: !slow {args.ticks}, one chunk every {args.tick_ms} ms per session; "
          "aims at N=100: lag p50 < 20, p99 < 100, admission p99 < 200)")  # fmt: skip


if __name__ == "__main__":
    main()
