"""Benchmark: CPU per streamed chunk, hop by hop, each in isolation in this one process.

    .venv/bin/python bench/chunk_hops.py [--streams 100] [--ticks 30] [--rounds 3]
        [--postgres URL] [--redis URL] [--hops append,layer,sse,chat]

bench/peers.py measures the whole path (POST, worker, journal, layer, SSE, sockets) on a
real topology, where the machine's load moves the figures; here each hop runs alone and
is timed by this process's CPU clock (time.process_time: every thread), so a before/after
of one hop is readable on a busy machine. `--streams` conversations each produce one
MESSAGE_DELTA per tick, all at once, `--ticks` times:

* append: `await DatabaseJournal.append(session, [delta], fence=(run, lease))` for every
  stream at once (the worker's appends: the group commit, its thread, the fence check),
  without publication; SQLite (a scratch file), and with --postgres PostgreSQL (a
  scratch database of that name on its server, dropped after) in a second process.
* layer: each append's publication (`queue_publication`: the ordered publisher, the
  layer's group_send_many) and its delivery to one receiver per session (a stream's
  channel in the session's group, `layer.receive`): the in-memory layer, and with
  --redis the Redis pub/sub layer (serialisation, PUBLISH, the subscriber's parse and
  decode; Redis's own CPU is not counted).
* sse: what an SSE stream does with each live message (sessions_app.api.sse.RunStream:
  the envelopes rebuilt, the cursor checked, the run's events mapped and encoded as
  frames), without the socket.
* chat: what a chat websocket does with each live message (ChatConsumer.send_envelopes:
  the view model applies the envelope, its changes rendered as OOB swaps, the frame's
  JSON), without the socket.

Each figure is the median over --rounds of microseconds of CPU per chunk.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from journal import create_scratch_postgres, postgres_admin_url  # noqa: E402


def make_session(alias: str) -> str:
    from django.contrib.auth import get_user_model

    from sessions_app.models import Session

    user, _ = get_user_model().objects.using(alias).get_or_create(username="bench")
    return str(Session.objects.using(alias).create(owner=user).pk)


def cpu_per_chunk(run: Callable[[], Coroutine[Any, Any, int]]) -> float:
    """Microseconds of this process's CPU per chunk that `run` reports handling."""
    started = time.process_time()
    chunks = asyncio.run(run())
    return (time.process_time() - started) * 1e6 / max(chunks, 1)


def delta(i: int) -> Any:
    from sectr.events import EventType
    from sectr.journal import NewEvent

    return NewEvent(EventType.MESSAGE_DELTA, {"message_id": "msg_bench", "text": f"tick {i} "}, "inv_bench")


def fenced_sessions(alias: str, count: int) -> list[tuple[str, tuple[str, str]]]:
    """(session id, fence) of `count` new sessions, each with a running Run holding the fence."""
    from sessions_app.models import Run

    found = []
    for _ in range(count):
        session_id = make_session(alias)
        run = Run.objects.using(alias).create(session_id=session_id, status=Run.RUNNING, lease_token="lease")
        found.append((session_id, (run.pk, "lease")))
    return found


def bench_append(alias: str, streams: int, ticks: int) -> float:
    from sessions_app.journal import DatabaseJournal

    sessions = fenced_sessions(alias, streams)

    async def run() -> int:
        journal = DatabaseJournal(publish=False, using=alias)
        for tick in range(ticks):
            await asyncio.gather(*(journal.append(sid, [delta(tick)], fence=fence) for sid, fence in sessions))
        return streams * ticks

    return cpu_per_chunk(run)


def envelopes_of(streams: int, tick: int) -> list[Any]:
    from sectr.events import Envelope, EventType

    now = datetime.now(UTC)
    payload = {"message_id": "msg_bench", "text": f"tick {tick} "}
    return [
        Envelope(f"ses_bench{i}", tick + 1, "inv_bench", EventType.MESSAGE_DELTA, payload, now) for i in range(streams)
    ]


def bench_layer(layer_factory: Callable[[], Any], streams: int, ticks: int) -> float:
    from sessions_app.journal import publish

    async def run() -> int:
        layer = layer_factory()
        saved = publish.get_channel_layer
        publish.get_channel_layer = lambda: layer
        try:
            channels = []
            for i in range(streams):
                channel = await layer.new_channel("sectr.sse.")
                await layer.group_add(publish.session_group(f"ses_bench{i}"), channel)
                channels.append(channel)
            await asyncio.sleep(0.2)  # subscriptions settle
            received = 0

            async def receive(channel: str) -> None:
                nonlocal received
                message = await layer.receive(channel)
                received += len(message["envelopes"])

            for tick in range(ticks):
                receivers = [asyncio.ensure_future(receive(channel)) for channel in channels]
                for envelope in envelopes_of(streams, tick):  # one append per stream, as a group commit queues them
                    publish.queue_publication([envelope])
                await asyncio.wait_for(asyncio.gather(*receivers), 30)
            for i, channel in enumerate(channels):
                await layer.group_discard(publish.session_group(f"ses_bench{i}"), channel)
            return received
        finally:
            publish.get_channel_layer = saved
            if hasattr(layer, "flush"):
                await layer.flush()

    return cpu_per_chunk(run)


def bench_layer_listening(layer_factory: Callable[[], Any], streams: int, ticks: int) -> float:
    """bench_layer's publications, received as SSE streams receive them: on listening
    channels (`new_listening_channel`), no receive call per message."""
    from sessions_app.journal import publish

    async def run() -> int:
        layer = layer_factory()
        saved = publish.get_channel_layer
        publish.get_channel_layer = lambda: layer
        received = 0
        waiting: asyncio.Future[None] | None = None

        def deliver(message: dict[str, Any]) -> None:
            nonlocal received
            received += len(message["envelopes"])
            if waiting is not None and not waiting.done() and received % streams == 0:
                waiting.set_result(None)

        try:
            channels = []
            for i in range(streams):
                channel = await layer.new_listening_channel("sectr.sse.", deliver)
                await layer.group_add(publish.session_group(f"ses_bench{i}"), channel)
                channels.append(channel)
            await asyncio.sleep(0.2)  # subscriptions settle
            for tick in range(ticks):
                waiting = asyncio.get_running_loop().create_future()
                for envelope in envelopes_of(streams, tick):
                    publish.queue_publication([envelope])
                await asyncio.wait_for(waiting, 30)
            for i, channel in enumerate(channels):
                await layer.group_discard(publish.session_group(f"ses_bench{i}"), channel)
                layer.close_listening_channel(channel)
            return received
        finally:
            publish.get_channel_layer = saved
            await layer.flush()

    return cpu_per_chunk(run)


def bench_sse(streams: int, ticks: int) -> float:
    from sessions_app.api.sse import RunStream
    from sessions_app.journal.publish import envelope_messages

    async def run() -> int:
        runs = [
            SimpleNamespace(pk=f"run_bench{i}", session_id=f"ses_bench{i}", invocation_ids=["inv_bench"],
                            invocation_id="inv_bench", start_seq=1)
            for i in range(streams)
        ]  # fmt: skip
        sse = [RunStream(run, 0) for run in runs]  # type: ignore[arg-type]
        for stream in sse:
            stream.cursor = 0
        frames = 0
        for tick in range(ticks):
            for stream, (_group, message) in zip(sse, envelope_messages(envelopes_of(streams, tick)), strict=True):
                frames += bool(await stream._handle_live(message))
        return frames

    return cpu_per_chunk(run)


def bench_chat(streams: int, ticks: int) -> float:
    from sectr.events import Envelope, EventType
    from sessions_app.chat.render import chat_context, render_changes
    from sessions_app.chat.view_model import ChatViewModel
    from sessions_app.journal.publish import envelope_messages

    permissions: dict[str, Any] = {
        "can_write": True,
        "can_approve": True,
        "can_fork": True,
        "viewer": "a",
        "session_owner": "a",
    }

    async def run() -> int:
        models = []
        for i in range(streams):
            vm = ChatViewModel(f"ses_bench{i}")
            start = {"message_id": "msg_bench", "role": "assistant", "model": "demo"}
            vm.apply(Envelope(f"ses_bench{i}", 1, "inv_bench", EventType.MESSAGE_START, start, datetime.now(UTC)))
            vm.take_changes()
            models.append(vm)
        frames = 0
        for tick in range(ticks):
            for vm, (_group, message) in zip(models, envelope_messages(envelopes_of(streams, tick)), strict=True):
                batch = [Envelope.from_dict(data) for data in message["envelopes"]]
                for envelope in batch:
                    vm.apply(envelope)
                html = render_changes(vm.take_changes(), chat_context(vm, **permissions))
                frames += bool(json.dumps({"first": batch[0].seq, "seq": batch[-1].seq, "html": html}))
        return frames

    return cpu_per_chunk(run)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=100)
    parser.add_argument("--ticks", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--postgres", default="", help="scratch PostgreSQL database URL for the append hop")
    parser.add_argument("--redis", default="", help="Redis URL for the layer hop on the Redis pub/sub layer")
    parser.add_argument("--hops", default="append,layer,sse,chat")
    parser.add_argument("--database", default="", help=argparse.SUPPRESS)  # the PostgreSQL child
    args = parser.parse_args()
    hops = set(args.hops.split(","))
    if args.database:  # the child: the append hop on PostgreSQL only
        hops = {"append"}

    scratch = Path(tempfile.mkdtemp(prefix="sectr-hops-"))
    os.environ["DATABASE_URL"] = args.database or f"sqlite:///{scratch}/hops-{uuid.uuid4().hex[:8]}.sqlite3"
    os.environ["REDIS_URL"] = ""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "sectr_web.settings")
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connections

    from sectr_web.channel_layer import InMemoryChannelLayer, RedisPubSubChannelLayer

    label = "PostgreSQL" if args.database else "SQLite"
    benches: dict[str, Callable[[], float]] = {}
    if "append" in hops:
        call_command("migrate", verbosity=0)
        benches[f"append ({label}, group commit, fenced)"] = lambda: bench_append("default", args.streams, args.ticks)
    if "layer" in hops:
        benches["layer (in-memory): publish + receive"] = lambda: bench_layer(
            InMemoryChannelLayer, args.streams, args.ticks
        )
        benches["layer (in-memory): publish + listening"] = lambda: bench_layer_listening(
            InMemoryChannelLayer, args.streams, args.ticks
        )
        if args.redis:
            prefix = f"hops{uuid.uuid4().hex[:6]}"
            benches["layer (Redis pub/sub): publish + receive"] = lambda: bench_layer(
                lambda: RedisPubSubChannelLayer(hosts=[args.redis], prefix=prefix), args.streams, args.ticks
            )
            benches["layer (Redis pub/sub): publish + listening"] = lambda: bench_layer_listening(
                lambda: RedisPubSubChannelLayer(hosts=[args.redis], prefix=prefix), args.streams, args.ticks
            )
    if "sse" in hops:
        benches["sse: live message -> frames"] = lambda: bench_sse(args.streams, args.ticks)
    if "chat" in hops:
        benches["chat: live message -> websocket frame"] = lambda: bench_chat(args.streams, args.ticks)

    import redis.utils

    if not args.database:
        hiredis = "hiredis" if redis.utils.HIREDIS_AVAILABLE else "no hiredis"
        print(f"{args.streams} streams x {args.ticks} ticks, median of {args.rounds} rounds; redis-py: {hiredis}")
    figures: dict[str, list[float]] = {name: [] for name in benches}
    for _ in range(args.rounds):
        for name, bench in benches.items():
            figures[name].append(bench())
    for name, values in figures.items():
        spread = ", ".join(f"{v:.0f}" for v in values)
        print(f"  {name:<48} {statistics.median(values):8.1f} us CPU/chunk  ({spread})", flush=True)
    connections["default"].close()
    if args.postgres and "append" in hops and not args.database and create_scratch_postgres(args.postgres):
        argv = [a for a in sys.argv[1:] if not a.startswith("--database")]
        try:
            subprocess.run([sys.executable, __file__, *argv, "--database", args.postgres], check=True)
        finally:
            import psycopg

            admin_url, name = postgres_admin_url(args.postgres)
            with psycopg.connect(admin_url, autocommit=True) as db:
                db.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


if __name__ == "__main__":
    main()
