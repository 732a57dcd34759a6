"""Run a Sectr worker: `python manage.py sectr_worker --concurrency N`."""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from prometheus_client import start_http_server

from sessions_app.garbage_collection import tune_for_server
from sessions_app.worker import Worker


class Command(BaseCommand):
    help = "Claims queued runs and executes them (many at once, on asyncio). SIGTERM drains gracefully."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--concurrency",
            type=int,
            default=None,
            help="runs executed at once (default SECTR_WORKER_CONCURRENCY or 256)",
        )
        parser.add_argument(
            "--lease", type=float, default=None, help="lease seconds (default SECTR_LEASE_SECONDS or 6)"
        )
        parser.add_argument("--poll", type=float, default=1.0, help="poll interval when no wake-up arrives")
        parser.add_argument("--drain", type=float, default=30.0, help="seconds to let runs finish on SIGTERM")
        parser.add_argument("--worker-id", default=None)
        parser.add_argument(
            "--metrics-port",
            type=int,
            default=None,
            help="serve this process's Prometheus metrics on this port (not needed with PROMETHEUS_MULTIPROC_DIR)",
        )
        parser.add_argument("--metrics-addr", default="127.0.0.1", help="address of --metrics-port (default loopback)")

    def handle(self, *args: Any, **options: Any) -> None:
        logging.getLogger("sectr").setLevel(logging.INFO)
        if options["metrics_port"] is not None:
            start_http_server(options["metrics_port"], addr=options["metrics_addr"])
        tune_for_server()  # everything is imported: freeze the startup heap
        asyncio.run(self._main(options))

    async def _main(self, options: dict[str, Any]) -> None:
        concurrency = options["concurrency"]
        if concurrency is None:
            concurrency = settings.SECTR_WORKER_CONCURRENCY
        elif concurrency < 1:
            raise CommandError(f"--concurrency must be at least 1, not {concurrency}")
        worker = Worker(
            concurrency=concurrency,
            lease=options["lease"],
            poll_interval=options["poll"],
            worker_id=options["worker_id"],
        )
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, worker.stop)
        self.stdout.write(f"sectr worker {worker.worker_id} running (concurrency {worker.concurrency})")
        self.stdout.flush()
        await worker.run(drain_timeout=options["drain"])
        self.stdout.write("sectr worker stopped")
