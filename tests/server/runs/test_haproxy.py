"""The balancer's configuration (scripts/haproxy.cfg.in), with Debian's HAProxy.

Clients never learn the internal servers' names: X-Sectr-Backend is stripped from every
response, even one whose backend sent it, unless HAProxy runs with
SECTR_HAPROXY_NAME_BACKEND in its environment (the fault tests' clusters, which kill the
Daphne that answered).
"""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.cluster import HAPROXY, render_haproxy_config, start_haproxy
from tests.liveserver import free_port


class LeakyHandler(http.server.BaseHTTPRequestHandler):
    """A backend that names itself (as a misconfigured app server might)."""

    def do_GET(self) -> None:
        body = b"ok"
        self.send_response(200)
        self.send_header("X-Sectr-Backend", "internal-host-7")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def backend_port() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), LeakyHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def response_through_haproxy(tmp_path: Path, backend: int, *, name_backends: bool) -> httpx.Response:
    port = free_port()
    config = tmp_path / "haproxy.cfg"
    config.write_text(render_haproxy_config(port, [backend]))
    with open(tmp_path / "haproxy.log", "ab") as log:
        proc = start_haproxy(config, log, name_backends=name_backends)
    try:
        deadline = time.monotonic() + 20
        while True:
            assert proc.poll() is None, (tmp_path / "haproxy.log").read_text()
            try:
                response = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2)
                if response.status_code == 200:
                    return response
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "HAProxy did not answer"
            time.sleep(0.1)
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.skipif(not Path(HAPROXY).exists(), reason="needs Debian's haproxy (scripts/ensure_haproxy.sh)")
def test_responses_never_name_the_internal_servers(tmp_path: Path, backend_port: int) -> None:
    response = response_through_haproxy(tmp_path, backend_port, name_backends=False)
    assert response.text == "ok"
    assert "x-sectr-backend" not in response.headers


@pytest.mark.skipif(not Path(HAPROXY).exists(), reason="needs Debian's haproxy (scripts/ensure_haproxy.sh)")
def test_a_test_cluster_can_ask_which_daphne_answered(tmp_path: Path, backend_port: int) -> None:
    response = response_through_haproxy(tmp_path, backend_port, name_backends=True)
    assert response.headers["x-sectr-backend"] == "daphne0"
