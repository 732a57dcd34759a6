"""Sectr beside LangGraph's local Agent Server: the same streaming workload, one run.

Run (LangGraph is a benchmark dependency only, in a venv of its own under var/, never in
.venv or requirements.txt; bench/setup_langgraph.sh makes it):
    bash bench/setup_langgraph.sh
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/x .venv/bin/python bench/peers.py \
        --sizes 10,100 --rounds 2 [--targets langgraph,embedded,cluster] [--json out.jsonl]
    # before/after in one run: the same targets on another checkout (e.g. a worktree of main)
    ... --targets langgraph,embedded,embedded=../base,cluster,cluster=../base

The workload: N conversations at once, each streaming --ticks chunks --tick-ms apart,
through each system's public HTTP API, read by a plain HTTP/SSE client (bench/lean_http.py,
the same for every target, in this process):

- langgraph: `langgraph dev` (in-memory runtime, --n-jobs-per-worker N so no run queues)
  serving bench/langgraph_peer/ticker.py, a graph that writes one custom stream chunk per
  tick carrying the moment it was produced. N threads, then N
  `POST /threads/<id>/runs/stream` (SSE, stream_mode custom) at once.
- embedded: Sectr as `scripts/run.sh` serves it: one Daphne with its embedded worker, on a
  scratch SQLite database and the in-memory channel layer, every setting at its default.
- cluster: the production topology of `scripts/cluster.sh` (tests/cluster.Cluster): HAProxy
  in front of 2 Daphne and 2 workers (cluster.sh's --concurrency), a scratch PostgreSQL
  database of DATABASE_URL's server, and a Redis of its own; clients go through HAProxy.

  On both Sectr targets each conversation is a session with its own API token, N
  `POST /api/v1/sessions/<id>/runs` `{"content": "!slow <ticks>"}` at once, each followed
  by `GET /api/v1/runs/<run>/events` (or, where the POST answers with the stream itself
  for `Accept: text/event-stream`, that stream). The demo model appends `<session> <tick>
  <time>` to a side file (SECTR_DEMO_STAMP_FILE) the moment it yields each tick.

Every target gets one warm-up conversation first (a run of one tick: LangGraph loads its
graph, Sectr its views and worker), then the clock starts. The columns, per target:

- lag p50 / p99: a chunk's arrival at the client - the moment it was produced;
- admission p50 / p99: per conversation, its first chunk's arrival - its POST being sent;
- CPU ms per chunk: user + system CPU (/proc/<pid>/stat) of every server process from just
  before the POSTs to the last chunk, per chunk delivered: LangGraph's whole process tree;
  Sectr's Daphnes, workers, HAProxy, Redis and PostgreSQL's backends connected to the
  scratch database (sampled twice a second, so a backend that comes and goes is counted);
- once: chunks delivered exactly once / expected, with how many were lost or repeated.

Targets alternate: round r runs them in turn starting from the r-th, so drift of the
machine's load spreads over all of them. Each row names the 1-minute load average taken
just before it: the machine is shared, so compare rows taken at similar load.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from lean_http import LeanClient  # noqa: E402
from live import cpu_seconds, percentile, server_pids  # noqa: E402
from pg_backends import PostgresBackends, StatementLedger, report  # noqa: E402

import tests.cluster  # noqa: E402
import tests.liveserver  # noqa: E402
from tests.cluster import Cluster  # noqa: E402
from tests.liveserver import LiveSectr, free_port  # noqa: E402

PEER_DIR = ROOT / "bench" / "langgraph_peer"
TARGETS = ("langgraph", "embedded", "cluster")
TICK_RE = re.compile(r"tick (\d+)")


def load_average() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def process_tree(pid: int) -> list[int]:
    """pid and all its descendants (langgraph dev may run the server in a child)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    tree, todo = [], [pid]
    while todo:
        current = todo.pop()
        tree.append(current)
        todo.extend(children.get(current, []))
    return tree


class Conversation:
    """One client's view of one conversation: which tick arrived when, how often."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.posted = 0.0
        self.first: float | None = None
        self.arrivals: list[tuple[int, float]] = []  # (tick, arrival), in arrival order
        self.backend = ""  # the Daphne that answered (X-Sectr-Backend), when HAProxy names it

    def arrived(self, tick: int, at: float) -> None:
        self.arrivals.append((tick, at))
        if self.first is None:
            self.first = at


def summarise(conversations: list[Conversation], produced: dict[tuple[str, int], float], ticks: int) -> dict[str, Any]:
    """The columns every target reports, from what the clients saw and when each chunk was produced."""
    lags: list[float] = []
    admissions: list[float] = []
    once = lost = repeated = 0
    for conversation in conversations:
        counts = Counter(tick for tick, _at in conversation.arrivals)
        once += sum(1 for tick in range(1, ticks + 1) if counts[tick] == 1)
        lost += sum(1 for tick in range(1, ticks + 1) if counts[tick] == 0)
        repeated += sum(count - 1 for count in counts.values() if count > 1)
        for tick, at in conversation.arrivals:
            if (stamp := produced.get((conversation.key, tick))) is not None:
                lags.append(at - stamp)
        if conversation.first is not None:
            admissions.append(conversation.first - conversation.posted)
    return {
        "chunks": sum(len(c.arrivals) for c in conversations),
        "expected": len(conversations) * ticks,
        "once": once,
        "lost": lost,
        "repeated": repeated,
        "p50": percentile(lags, 0.50) * 1000,
        "p99": percentile(lags, 0.99) * 1000,
        "max": max(lags, default=float("nan")) * 1000,
        "admit_p50": percentile(admissions, 0.50) * 1000,
        "admit_p99": percentile(admissions, 0.99) * 1000,
    }


# ---- LangGraph ----


def start_langgraph(langgraph: str, n: int) -> tuple[subprocess.Popen[bytes], str]:
    """`langgraph dev` on a free port, once it answers /ok."""
    if not Path(langgraph).exists():
        raise SystemExit(f"{langgraph} is missing: run bash bench/setup_langgraph.sh first")
    port = free_port()
    env = {**os.environ, "LANGSMITH_TRACING": "false", "LANGGRAPH_CLI_NO_ANALYTICS": "1", "LOG_LEVEL": "WARNING"}
    log = open(Path(os.environ.get("TMPDIR", "/tmp")) / f"langgraph-peer-{port}.log", "wb")  # noqa: SIM115
    server = subprocess.Popen(
        [langgraph, "dev", "--no-browser", "--no-reload", "--port", str(port), "--n-jobs-per-worker", str(max(10, n))],
        cwd=PEER_DIR, env=env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 240  # a loaded machine: it imports a lot
    while True:
        try:
            if httpx.get(base + "/ok", timeout=1).status_code == 200:
                return server, base
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline or server.poll() is not None:
            server.kill()
            raise RuntimeError(f"langgraph dev did not start (see {log.name})")
        time.sleep(0.2)


async def measure_langgraph(langgraph: str, n: int, ticks: int, tick_ms: int) -> dict[str, Any]:
    server, base = start_langgraph(langgraph, n)
    http = LeanClient(base, connections=n)
    produced: dict[tuple[str, int], float] = {}

    async def run(conversation: Conversation, thread_id: str, count: int) -> None:
        request = {"assistant_id": "ticker", "input": {"ticks": count, "tick_ms": tick_ms}, "stream_mode": ["custom"]}
        conversation.posted = time.time()
        async with http.stream("POST", f"/threads/{thread_id}/runs/stream", json_body=request) as (_s, _h, body):
            event = ""
            async for line in http.sse_lines(body):
                if line.startswith("event:"):
                    event = line[6:].strip()
                elif line.startswith("data:") and event == "custom":
                    arrived = time.time()
                    chunk = json.loads(line[5:])
                    produced[(conversation.key, chunk["tick"])] = chunk["t"]
                    conversation.arrived(chunk["tick"], arrived)

    try:
        threads = [(await http.post("/threads", json_body={})).json()["thread_id"] for _ in range(n + 1)]  # type: ignore[index]
        await run(Conversation("warm-up"), threads.pop(), 1)
        conversations = [Conversation(thread_id) for thread_id in threads]
        pids = process_tree(server.pid)
        # One connection per stream, opened before the clock starts.
        await asyncio.gather(*(http.get("/ok") for _ in range(n)))
        before = {pid: cpu_seconds(pid) for pid in pids}
        started = time.monotonic()
        await asyncio.gather(*(run(c, c.key, ticks) for c in conversations))
        wall = time.monotonic() - started
        cpu = sum(cpu_seconds(pid) - before[pid] for pid in pids)
    finally:
        await http.aclose()
        server.terminate()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
    result = summarise(conversations, produced, ticks)
    result.update(
        target="langgraph", setup="langgraph dev (in-memory runtime)", wall=wall, cpu_by_process={"server": cpu}
    )
    return result


# ---- Sectr ----


def cluster_concurrency() -> str | None:
    """The worker concurrency scripts/cluster.sh passes (its default), if it names one."""
    script = tests.cluster.ROOT / "scripts" / "cluster.sh"
    found = re.search(r"SECTR_WORKER_CONCURRENCY:-(\d+)", script.read_text())
    return found.group(1) if found else None


@contextmanager
def checkout(root: Path | None) -> Iterator[None]:
    """Run the servers of the block from another checkout of Sectr (its manage.py, its
    code, its scripts/haproxy.cfg.in): a before/after comparison in one run."""
    if root is None:
        yield
        return
    saved = (tests.liveserver.ROOT, tests.cluster.ROOT, tests.cluster.HAPROXY_TEMPLATE)
    tests.liveserver.ROOT = tests.cluster.ROOT = root
    tests.cluster.HAPROXY_TEMPLATE = root / "scripts" / "haproxy.cfg.in"
    try:
        yield
    finally:
        tests.liveserver.ROOT, tests.cluster.ROOT, tests.cluster.HAPROXY_TEMPLATE = saved


def start_sectr(target: str, stamp_file: Path) -> LiveSectr:
    env = {"SECTR_DEMO_STAMP_FILE": str(stamp_file)}
    if target == "cluster":
        concurrency = cluster_concurrency()
        return Cluster(
            daphnes=2,
            workers=2,
            worker_args=("--concurrency", concurrency) if concurrency else (),
            env=env,
            private_redis=True,  # its CPU is the cluster's, and nobody else's load is on it
            name_backends=bool(DUMP["path"]),  # one response header: which Daphne streamed it
        )
    # scripts/run.sh: SQLite, the in-memory layer, the embedded worker, every default.
    saved = {name: os.environ.pop(name) for name in ("DATABASE_URL", "REDIS_URL") if name in os.environ}
    try:
        return LiveSectr(env={**env, "REDIS_URL": ""}, embedded_worker=True)
    finally:
        os.environ.update(saved)


def create_conversations(live: LiveSectr, n: int) -> list[tuple[str, str]]:
    """(session id, raw API token) for n sessions, each of its own user (a team's members)."""
    code = (
        "from django.contrib.auth import get_user_model; from sessions_app import actions; "
        "from sessions_app.actions.tokens import do_issue_token; U = get_user_model(); "
        f"us = [U.objects.create_user('bench{{}}'.format(i)) for i in range({n})]; "
        "print('\\n'.join('{} {}'.format(actions.do_create_session(u, title='bench').pk, do_issue_token(u)[1])"
        " for u in us))"
    )
    found = re.findall(r"^(ses_[0-9a-f]+) (\S+)$", live.manage("shell", "-c", code), re.MULTILINE)
    if len(found) != n:
        raise RuntimeError(f"created {len(found)} of {n} sessions")
    return found


#: `--pg-backends`: account for PostgreSQL's CPU per backend and per statement
#: (bench/pg_backends.py), printed after each cluster row and kept in its JSON as `pg`.
PG_DETAIL: dict[str, Any] = {"on": False, "last": None}


#: `--dump-chunks PATH`: every chunk as a JSON line (target, n, round, session, tick, its
#: conversation's POST, produced, arrived, lag_ms, and on the cluster the Daphne that
#: streamed it), to find which chunks are late (by tick, by Daphne); "" writes nothing.
DUMP: dict[str, Any] = {"path": "", "round": 0}


def dump_chunks(target: str, n: int, conversations: list[Conversation], produced: dict[tuple[str, int], float]) -> None:
    """`--dump-chunks`: append one JSON line per chunk delivered to DUMP's file."""
    with open(DUMP["path"], "a") as out:
        for conversation in conversations:
            for tick, at in conversation.arrivals:
                if (stamp := produced.get((conversation.key, tick))) is None:
                    continue
                row = {
                    "target": target, "n": n, "round": DUMP["round"], "session": conversation.key, "tick": tick,
                    "posted": conversation.posted, "produced": stamp, "arrived": at, "lag_ms": (at - stamp) * 1000,
                    "daphne": conversation.backend,
                }  # fmt: skip
                out.write(json.dumps(row) + "\n")


#: `--py-spy PATH`: record each Sectr server process with this py-spy during the measured
#: block, into --py-spy-dir (raw collapsed stacks, one file per process); "" records nothing.
PY_SPY: dict[str, str] = {"path": "", "dir": ""}


@contextmanager
def py_spy(target: str, pids: dict[str, int]) -> Iterator[None]:
    """py-spy record (raw format, --gil: only what holds the GIL, so idle waits are left
    out) of each process while the block runs; the files are named
    <target>-<role>.txt. Each line is a ;-joined stack and its sample count."""
    if not PY_SPY["path"]:
        yield
        return
    out = Path(PY_SPY["dir"])
    out.mkdir(parents=True, exist_ok=True)
    label = target.replace("=", "@").replace("/", "_")
    recorders = [
        subprocess.Popen(
            [
                PY_SPY["path"],
                "record",
                "--gil",
                "-r",
                "200",
                "-f",
                "raw",
                "-p",
                str(pid),
                "-o",
                str(out / f"{label}-{role}.txt"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for role, pid in pids.items()
        if role not in ("haproxy", "redis")
    ]
    time.sleep(0.5)  # attached before the clock starts
    try:
        yield
    finally:
        for recorder in recorders:
            recorder.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
        for recorder in recorders:
            try:
                recorder.wait(30)
            except subprocess.TimeoutExpired:
                recorder.kill()


@contextmanager
def sectr_cpu(live: LiveSectr, target: str = "") -> Iterator[dict[str, float]]:
    """CPU seconds each process of the topology spent inside the block, by role."""
    pids = server_pids(live)
    spying = py_spy(target, pids)
    spying.__enter__()
    used: dict[str, float] = {}
    backends = ledger = None
    PG_DETAIL["last"] = None
    if live.postgres:
        admin = live.database_url.rsplit("/", 1)[0] + "/postgres"
        backends = PostgresBackends(admin, live.db_name, pids if PG_DETAIL["on"] else None)
        if PG_DETAIL["on"]:
            ledger = StatementLedger(os.environ["DATABASE_URL"], live.db_name, live.database_url)
    before = {role: cpu_seconds(pid) for role, pid in pids.items()}
    if backends is not None:
        backends.__enter__()
    if ledger is not None:
        ledger.__enter__()
    try:
        yield used
    finally:
        if backends is not None:
            backends.__exit__()
        spying.__exit__(None, None, None)
    for role, pid in pids.items():
        used[role] = cpu_seconds(pid) - before[role]
    if backends is not None:
        used["postgres"] = backends.used()
    if ledger is not None and backends is not None:
        ledger.__exit__()
        PG_DETAIL["last"] = {"backends": backends.accounting(), "ledger": ledger.difference()}


async def measure_sectr(
    target: str, n: int, ticks: int, tick_ms: int, root: Path | None, spec: str = ""
) -> dict[str, Any]:
    stamp_file = Path(os.environ.get("TMPDIR", "/tmp")) / f"sectr-peers-{os.getpid()}-{time.time_ns()}.txt"
    stream_posts = 0
    with checkout(root), start_sectr(target, stamp_file) as live:
        pairs = create_conversations(live, n + 1)
        http = LeanClient(live.base_url, connections=n + 1)

        async def run(conversation: Conversation, token: str, count: int) -> None:
            nonlocal stream_posts
            auth = f"Bearer {token}"
            conversation.posted = time.time()
            body = {"content": f"!slow {count}"}
            async with http.stream(
                "POST",
                f"/api/v1/sessions/{conversation.key}/runs",
                json_body=body,
                headers={"Authorization": auth, "Accept": "text/event-stream, application/json"},
            ) as (status, headers, chunks):
                if status >= 400:
                    raise RuntimeError(f"POST runs: {status} {b''.join([c async for c in chunks])[:300]!r}")
                conversation.backend = headers.get("x-sectr-backend", "")
                if headers.get("content-type", "").startswith("text/event-stream"):
                    stream_posts += 1
                    await read_events(conversation, chunks)
                    return
                answer = json.loads(b"".join([c async for c in chunks]))
            events_path = answer["events_url"]
            async with http.stream("GET", events_path, headers={"Authorization": auth}) as (status, headers, chunks):
                if status >= 400:
                    raise RuntimeError(f"GET events: {status}")
                conversation.backend = headers.get("x-sectr-backend", "")
                await read_events(conversation, chunks)

        async def read_events(conversation: Conversation, chunks: Any) -> None:
            event = ""
            async for line in http.sse_lines(chunks):
                if line.startswith("event:"):
                    event = line[6:].strip()
                elif line.startswith("data:") and event == "message.delta":
                    arrived = time.time()
                    for tick in TICK_RE.findall(json.loads(line[5:])["text"] or ""):
                        conversation.arrived(int(tick), arrived)
                elif line.startswith("data:") and event == "result":
                    return

        try:
            warm_session, warm_token = pairs.pop()
            await asyncio.wait_for(run(Conversation(warm_session), warm_token, 1), 120)
            conversations = [Conversation(session_id) for session_id, _token in pairs]
            tokens = {session_id: token for session_id, token in pairs}
            await asyncio.gather(*(http.get("/healthz") for _ in range(n)))
            with sectr_cpu(live, spec) as cpu:
                clock = [time.time()]
                started = time.monotonic()
                outcomes = await asyncio.wait_for(
                    asyncio.gather(*(run(c, tokens[c.key], ticks) for c in conversations), return_exceptions=True),
                    ticks * tick_ms / 1000 * 4 + 120,
                )
                wall = time.monotonic() - started
                clock.append(time.time())
        finally:
            await http.aclose()
        setup = ("PostgreSQL" if live.postgres else "SQLite") + (
            ", Redis" if live.env.get("REDIS_URL") else ", in-memory layer"
        )
    produced: dict[tuple[str, int], float] = {}
    for line in stamp_file.read_text().splitlines() if stamp_file.exists() else []:
        session_id, tick, at = line.split()
        produced[(session_id, int(tick))] = float(at)  # the last time, after a recovery
    stamp_file.unlink(missing_ok=True)
    result = summarise(conversations, produced, ticks)
    if DUMP["path"]:
        dump_chunks(spec or target, n, conversations, produced)
    how = "POST answered with the stream" if stream_posts else "POST then GET events"
    # A conversation refused on the way (a 503 under load, say) is counted, not fatal: its
    # chunks count as lost, and the row says how many failed and the first error.
    errors = [repr(outcome) for outcome in outcomes if isinstance(outcome, BaseException)]
    if errors:
        how += f"; {len(errors)} conversation(s) failed, e.g. {errors[0][:120]}"
    # clock: the measured block's wall-clock start and end (bench/pg_statements.py's window)
    result.update(
        target=target, setup=f"{setup}; {how}", wall=wall, clock=clock, cpu_by_process=cpu, failed=len(errors)
    )
    if PG_DETAIL["last"] is not None:
        result["pg"] = PG_DETAIL["last"]
    return result


# ---- the table ----

HEADER = (
    f"{'target':<18} {'N':>4} {'rnd':>3} {'load':>5} {'lag p50':>8} {'p99':>7} "
    f"{'admit p50':>9} {'p99':>7} {'CPU ms/chunk':>12} {'once':>11} {'lost':>4} {'twice':>5}  where"
)


def format_row(result: dict[str, Any]) -> str:
    delivered = max(result["chunks"] - result["repeated"], 1)
    per_chunk = {role: used * 1000 / delivered for role, used in result["cpu_by_process"].items()}
    processes = ", ".join(f"{role} {ms:.2f}" for role, ms in per_chunk.items())
    return (
        f"{result['target']:<18} {result['n']:>4} {result['round']:>3} {result['load']:>5.2f} "
        f"{result['p50']:>8.1f} {result['p99']:>7.1f} {result['admit_p50']:>9.1f} {result['admit_p99']:>7.1f} "
        f"{result['cpu_ms_per_chunk']:>12.2f} {result['once']:>5}/{result['expected']:<5} "
        f"{result['lost']:>4} {result['repeated']:>5}  {result['setup']} ({processes})"
    )


def measure(spec: str, n: int, ticks: int, tick_ms: int, langgraph: str) -> dict[str, Any]:
    """One row: `spec` is a target, or `embedded=PATH` / `cluster=PATH` for Sectr's code in
    another checkout (its row is labelled with the checkout's folder name)."""
    target, _, root = spec.partition("=")
    load = load_average()
    if target == "langgraph":
        result = asyncio.run(measure_langgraph(langgraph, n, ticks, tick_ms))
    else:
        result = asyncio.run(measure_sectr(target, n, ticks, tick_ms, Path(root).resolve() if root else None, spec))
        if root:
            result["target"] = f"{target}@{Path(root).resolve().name}"
    delivered = max(result["chunks"] - result["repeated"], 1)
    result.update(n=n, load=load, cpu_ms_per_chunk=sum(result["cpu_by_process"].values()) * 1000 / delivered)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--sizes", default="10,100", help="conversations at once, comma-separated")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of every target, alternating")
    parser.add_argument(
        "--targets",
        default=",".join(TARGETS),
        help=f"any of: {', '.join(TARGETS)}; embedded=PATH or cluster=PATH run the Sectr checkout at PATH",
    )
    parser.add_argument("--ticks", type=int, default=30)
    parser.add_argument("--tick-ms", type=int, default=100)
    parser.add_argument("--langgraph", default=str(ROOT / "var" / "langgraph-venv" / "bin" / "langgraph"))
    parser.add_argument("--json", default="", help="append each result as a JSON line to this file")
    parser.add_argument(
        "--py-spy",
        default="",
        help="path of a py-spy binary: record every Sectr server process during the measured block "
        "(raw collapsed stacks in --py-spy-dir; the recording costs the servers CPU too)",
    )
    parser.add_argument(
        "--pg-backends",
        action="store_true",
        help="after each cluster row, PostgreSQL's CPU per backend owner and per statement (bench/pg_backends.py; "
        'statements need PGOPTIONS="-c pg_stat_statements.track=top -c pg_stat_statements.track_planning=on")',
    )
    parser.add_argument(
        "--dump-chunks",
        default="",
        help="append every chunk (session, tick, produced, arrived, lag, Daphne) as a JSON line to this file",
    )
    parser.add_argument("--py-spy-dir", default="var/py-spy", help="where --py-spy writes <target>-<role>.txt")
    args = parser.parse_args()
    PY_SPY.update(path=args.py_spy, dir=args.py_spy_dir)
    DUMP["path"] = args.dump_chunks
    PG_DETAIL["on"] = args.pg_backends
    sizes = [int(size) for size in re.split(r"[,\s]+", args.sizes) if size]
    targets = [t for t in args.targets.split(",") if t]
    if unknown := {t.partition("=")[0] for t in targets} - set(TARGETS):
        parser.error(f"unknown targets: {', '.join(sorted(unknown))}")
    postgres = os.environ.get("DATABASE_URL", "").startswith(("postgres://", "postgresql://"))
    if any(t.startswith("cluster") for t in targets) and not postgres:
        parser.error("the cluster target needs DATABASE_URL on a PostgreSQL server (a scratch database is made there)")
    print(HEADER + "   (times in ms; CPU per chunk delivered; load = 1-minute load average before the row)")
    for n in sizes:
        for index in range(args.rounds):
            for target in targets[index % len(targets) :] + targets[: index % len(targets)]:
                DUMP["round"] = index + 1
                result = measure(target, n, args.ticks, args.tick_ms, args.langgraph)
                result["round"] = index + 1
                print(format_row(result), flush=True)
                if "pg" in result:
                    delivered = max(result["chunks"] - result["repeated"], 1)
                    print(report(result["pg"], delivered, n), flush=True)
                if args.json:
                    with open(args.json, "a") as out:
                        out.write(json.dumps(result) + "\n")
    print(f"(each conversation: {args.ticks} chunks {args.tick_ms} ms apart; lag = arrival - production)")


if __name__ == "__main__":
    main()
