"""In-process loop of streamed run POSTs: the CPU a Daphne spends from a
`POST /api/v1/sessions/{id}/runs` (`Accept: text/event-stream`) to its stream's first
frame, through the real ASGI application, with no server, balancer or worker around it.

    DATABASE_URL=postgres://postgres@127.0.0.1/x REDIS_URL=redis://127.0.0.1:6379/9 \\
        .venv/bin/python bench/post_loop.py --posts 200 [--profile out.prof]
    valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.out --instr-atstart=no \\
        .venv/bin/python bench/post_loop.py --posts 100 --callgrind

Migrates the database, makes one user with a token and N fresh sessions, warms up with a
few posts, then posts one prompt per session, one after the other, reading each answer up
to its first body frame and then leaving (a client gone): the printed figure is the
process's CPU (event loop and database threads) per POST. `--callgrind` has callgrind
(started with --instr-atstart=no) count only the timed block's instructions: the loop
turns collection on and off around it with `callgrind_control -i`. Instruction counts
vary by about 1.5% between runs of the same code (the I/O's timing changes how many
loop passes it takes); the CPU figure, on a shared machine, by far more."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "sectr_web.settings")
os.environ.setdefault("SECTR_EMBEDDED_WORKER", "0")
os.environ.setdefault("SECTR_API_RATE_LIMIT", "0/60")


def scope_for(raw_token: str, session_id: str) -> dict[str, Any]:
    path = f"/api/v1/sessions/{session_id}/runs"
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"127.0.0.1"),
            (b"authorization", f"Bearer {raw_token}".encode()),
            (b"accept", b"text/event-stream"),
            (b"content-type", b"application/json"),
            (b"content-length", b"21"),
        ],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 80),
    }


async def post_once(application: Any, raw_token: str, session_id: str) -> int:
    """One POST up to its first body frame; then the client leaves. Its status."""
    body = json.dumps({"content": "hello there"}).encode()
    first = asyncio.get_running_loop().create_future()
    gone = asyncio.Event()
    status = 0
    sent_body = False

    async def receive() -> dict[str, Any]:
        nonlocal sent_body
        if not sent_body:
            sent_body = True
            return {"type": "http.request", "body": body, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif not first.done():
            first.set_result(message)

    scope = scope_for(raw_token, session_id)
    scope["headers"][-1] = (b"content-length", str(len(body)).encode())
    task = asyncio.ensure_future(application(scope, receive, send))
    await first
    gone.set()
    await task
    return status


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--posts", type=int, default=200)
    parser.add_argument("--warm", type=int, default=20)
    parser.add_argument("--profile", help="cProfile output file of the timed block")
    parser.add_argument("--callgrind", action="store_true", help="toggle callgrind collection around the timed block")
    args = parser.parse_args()

    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from django.contrib.auth import get_user_model

    from sessions_app import actions
    from sessions_app.models import ApiToken

    user = get_user_model().objects.create_user(f"loop{time.time_ns()}")
    raw = ApiToken.issue(user, "loop")[1]
    sessions = [actions.do_create_session(user, title=f"loop {i}").pk for i in range(args.warm + args.posts)]

    from django.db import connections

    connections.close_all()
    from sectr_web.asgi import application

    async def run() -> None:
        for session_id in sessions[: args.warm]:
            assert await post_once(application, raw, session_id) == 200
        timed = sessions[args.warm :]
        profiler = None
        if args.profile:
            import cProfile

            profiler = cProfile.Profile()
            profiler.enable()
        if args.callgrind:
            os.system(f"callgrind_control -i on {os.getpid()} >/dev/null")  # noqa: S605, ASYNC221 - nothing else runs
        cpu, wall = time.process_time(), time.perf_counter()
        for session_id in timed:
            assert await post_once(application, raw, session_id) == 200
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        if args.callgrind:
            os.system(f"callgrind_control -i off {os.getpid()} >/dev/null")  # noqa: S605, ASYNC221 - nothing else runs
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(args.profile)
        n = len(timed)
        print(f"posts={n} cpu_ms_per_post={cpu * 1000 / n:.3f} wall_ms_per_post={wall * 1000 / n:.3f}")

    asyncio.run(run())


if __name__ == "__main__":
    main()
