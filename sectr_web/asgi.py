"""ASGI entry point: HTTP through Django, websockets through Channels.

With SQLite (the embedded default) a worker runs inside this process, on the server's
event loop, so `daphne sectr_web.asgi:application` is all Sectr needs. Set
SECTR_EMBEDDED_WORKER=0 when separate `manage.py sectr_worker` processes run the queue.
"""

import os
from typing import Any

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "sectr_web.settings")
# Django must be set up before anything imports models (consumers, routing).
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.layers import get_channel_layer  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402

from sectr_web.body_limits import RequestBodyLimit, cap_daphne_request_bodies  # noqa: E402
from sectr_web.daphne_writes import chunk_writer, send_chunks_at_once  # noqa: E402
from sectr_web.middleware import CHUNK_WRITER, ApiASGIHandler, is_api_request  # noqa: E402
from sectr_web.routing import websocket_urlpatterns  # noqa: E402
from sectr_web.websocket_origin import SameOriginValidator  # noqa: E402
from sessions_app.approval_service.server import ENDPOINT as MCP_ENDPOINT  # noqa: E402
from sessions_app.garbage_collection import tune_for_server  # noqa: E402
from sessions_app.journal.publish import adopt_server_loop  # noqa: E402
from sessions_app.worker import start_embedded_worker  # noqa: E402

pages_app = ASGIStaticFilesHandler(django_asgi_app)
api_app = ApiASGIHandler()  # the API's short middleware chain (sectr_web.middleware)


async def http_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    await (api_app if is_api_request(scope) else pages_app)(scope, receive, send)


router = ProtocolTypeRouter(
    {
        # The embedded default serves its own static files (no web server in front).
        # Bodies over SECTR_MAX_REQUEST_BYTES get 413 before Django spools them.
        "http": RequestBodyLimit(http_app),
        # The Origin must be the site's own, port included (as CSRF checks it).
        "websocket": SameOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)

# /mcp: the approval service of other agents (an MCP server; docs/approval-service.md).
# Its own ASGI app (the `mcp` package's transport), not a Django view: its answers
# stream (SSE) while a call waits for a decision, and it authenticates by API token.
mcp_app = RequestBodyLimit(MCP_ENDPOINT)
MCP_PATHS = ("/mcp", "/mcp/")

# Streamed chunks (SSE frames) go out as they are written, not on the loop's next pass.
send_chunks_at_once()
# ...and bodies over the limit are refused before Daphne itself buffers them (it reads a
# whole body before calling us); this subclasses the request class installed above.
cap_daphne_request_bodies()


async def application(scope: dict[str, Any], receive: Any, send: Any) -> None:
    # Before anything starts a task: the request's direct writer of streamed chunks
    # (Daphne's; ApiASGIHandler.send_response uses it), which no other task should keep.
    # (A websocket's upgrade request is taken out too, and not kept.)
    if (write_chunk := chunk_writer()) is not None and scope["type"] == "http":
        scope[CHUNK_WRITER] = write_chunk
    # The first connection (or the reactor's start, below) starts the embedded worker
    # on the server's own loop, so its publications reach this process's consumers.
    start_embedded_worker()
    adopt_server_loop()  # sync views' publications queue on this loop (publish._send_sync)
    if scope["type"] == "http" and scope.get("path") in MCP_PATHS:
        await mcp_app(scope, receive, send)
        return
    await router(scope, receive, send)


def warm_up() -> None:
    """What the first requests would otherwise build on the event loop: the channel layer
    (its backend's import pulls in the Redis client, a few hundred ms of CPU that a burst
    of first POSTs waited behind: bench/admission.py under py-spy)."""
    get_channel_layer()


def _start_when_reactor_runs() -> None:
    try:
        from twisted.internet import reactor
    except ImportError:  # not under Daphne
        return

    def schedule() -> None:
        warm_up()
        # Started: every module is imported, so the heap to freeze is the startup's.
        tune_for_server()
        # callWhenRunning fires before the asyncio loop itself runs: queue the start on
        # that loop, where get_running_loop() works.
        loop = getattr(reactor, "_asyncioEventloop", None)
        if loop is not None:
            loop.call_soon(start_embedded_worker)

    reactor.callWhenRunning(schedule)


_start_when_reactor_runs()
