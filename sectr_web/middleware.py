"""Middleware without thread hops, and the API's own short chain.

Under ASGI Django runs a middleware's sync code in a thread: a `MiddlewareMixin` hops to
a thread and back for each of its process_request and process_response, and a plain sync
middleware (a `__call__` only) sends the rest of the chain through async_to_sync. With
the default chain that was about fourteen hops a request, most of a Daphne's CPU for the
API's requests (py-spy under bench/peers.py, production topology, N=100: "request
machinery" was 47% of both Daphnes, beside 17-25% for the streams themselves).

* `InlineMiddlewareMixin` runs a `MiddlewareMixin`'s hooks on the event loop, for hooks
  that do no I/O (headers, redirects): Django's SecurityMiddleware, CommonMiddleware and
  XFrameOptionsMiddleware below, in settings.MIDDLEWARE in place of Django's.
* `ApiASGIHandler` serves /api/ with `API_MIDDLEWARE`: the same headers and input checks
  as every response, without the cookie session, CSRF, login user, messages and htmx
  middleware, which a bearer-token API never reads (its views take the token's user).
  sectr_web.asgi sends /api/ paths to it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from contextvars import ContextVar
from functools import partial
from typing import Any

from asgiref.sync import SyncToAsync, ThreadSensitiveContext, sync_to_async
from django.core import signals
from django.core.exceptions import ImproperlyConfigured, RequestAborted
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.core.handlers.exception import convert_exception_to_response
from django.http import HttpRequest
from django.http.response import HttpResponseBase
from django.middleware.clickjacking import XFrameOptionsMiddleware as DjangoXFrameOptionsMiddleware
from django.middleware.common import CommonMiddleware as DjangoCommonMiddleware
from django.middleware.security import SecurityMiddleware as DjangoSecurityMiddleware
from django.urls import set_script_prefix
from django.utils.module_loading import import_string

from sessions_app.input_checks import API_PREFIX

#: The API's chain (outermost first): what every response gets, and nothing that reads
#: cookies. Each must be async-capable and have no process_view/_exception/_template_response.
API_MIDDLEWARE = [
    "sectr_web.middleware.SecurityMiddleware",
    "sectr_web.content_security_policy.ContentSecurityPolicy",
    "sessions_app.input_checks.RefuseUnstorableText",
    "sectr_web.middleware.CommonMiddleware",
    "sectr_web.middleware.XFrameOptionsMiddleware",
]


class InlineMiddlewareMixin:
    """A MiddlewareMixin whose process_request / process_response run on the event loop
    (Django's own __acall__ runs each in a thread): for hooks that never do I/O."""

    get_response: Any

    async def __acall__(self, request: HttpRequest) -> HttpResponseBase:
        response = None
        if hasattr(self, "process_request"):
            response = self.process_request(request)
        response = response or await self.get_response(request)
        if hasattr(self, "process_response"):
            response = self.process_response(request, response)
        return response


class SecurityMiddleware(InlineMiddlewareMixin, DjangoSecurityMiddleware):
    """Django's, on the event loop (headers and the https redirect: no I/O)."""


class CommonMiddleware(InlineMiddlewareMixin, DjangoCommonMiddleware):
    """Django's, on the event loop (the slash redirect resolves URLs: no I/O)."""


class XFrameOptionsMiddleware(InlineMiddlewareMixin, DjangoXFrameOptionsMiddleware):
    """Django's, on the event loop (one header)."""


class RequestThreads:
    """Single-thread executors lent to requests, one each, and kept after it for the next.

    Django gives each request its own thread for its thread-sensitive sync code (the
    request_started and request_finished signals at least): a new executor whose thread
    starts on the event loop, and another thread started to join it at the end. That
    was two thread starts on the loop per API request (bench/admission.py under py-spy).
    Here the executor is lent, still one request's at a time, and its thread reused.
    """

    def __init__(self, keep: int = 64) -> None:
        self.keep = keep
        self._idle: list[ThreadPoolExecutor] = []

    def lend(self) -> ThreadPoolExecutor:
        return self._idle.pop() if self._idle else ThreadPoolExecutor(1, thread_name_prefix="sectr-request")

    def take_back(self, executor: ThreadPoolExecutor) -> None:
        if len(self._idle) < self.keep:
            self._idle.append(executor)
        else:
            executor.shutdown(wait=False)


class RequestExecutor(Executor):
    """A request's thread-sensitive executor, as asgiref sees it: a thread lent by
    `RequestThreads` from the request's first thread-sensitive call until `release()`,
    lent again (perhaps another one) if the request has more such work after that.

    A streamed response releases it once its view has returned (`ApiASGIHandler`): a
    stream lasts as long as its run, and each open stream kept a thread of its own idle
    until it ended, so a burst of N streams started N threads on the event loop (a
    thread start in each streamed POST: 7% of a Daphne's CPU under bench/admission.py,
    py-spy). Its view has done its thread-sensitive work by then (the run's stream reads
    through the journal's threads); what is left is the request_finished signal, which
    borrows an idle thread for the moment it takes.
    """

    def __init__(self, threads: RequestThreads, first: Callable[[], None] | None = None) -> None:
        self.threads = threads
        self._lent: ThreadPoolExecutor | None = None
        #: run on the thread before the request's first thread-sensitive call, in its hop
        self._first = first
        #: the request has had thread-sensitive work
        self.used = False

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        if self._lent is None:
            self._lent = self.threads.lend()
        if not self.used:
            self.used = True
            if (first := self._first) is not None:
                self._first = None

                def after_first() -> Any:
                    first()
                    return fn(*args, **kwargs)

                return self._lent.submit(after_first)
        return self._lent.submit(fn, *args, **kwargs)

    def release(self) -> None:
        """Give the thread back. Work already submitted still runs on it, before any
        later borrower's: one call at a time, as on any request's thread."""
        lent, self._lent = self._lent, None
        if lent is not None:
            self.threads.take_back(lent)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self.release()


#: The current API request's executor (set by ApiASGIHandler for its request's tasks).
_request_executor: ContextVar[RequestExecutor | None] = ContextVar("sectr_request_executor", default=None)
#: The scope's key for the server's direct writer of a streamed response's chunks
#: (sectr_web.daphne_writes.chunk_writer: Daphne's), when it has one.
CHUNK_WRITER = "sectr.write_chunk"
#: The current API request's chunk writer (from its scope, for send_response).
_chunk_writer: ContextVar[Callable[[bytes], bool] | None] = ContextVar("sectr_chunk_writer", default=None)


def _header_bytes(text: str | bytes, encoding: str) -> bytes:
    """A response header's name or value as ASGI sends it (as Django's send_response)."""
    return text.encode(encoding) if isinstance(text, str) else bytes(text)


class ApiASGIHandler(ASGIHandler):
    """Django's ASGI handler with API_MIDDLEWARE instead of settings.MIDDLEWARE, a lent
    thread per request (RequestExecutor) instead of a new one, given back as soon as a
    streamed response starts, and Django's request signals without thread hops of their own.

    Django sends request_started and request_finished through sync_to_async: two hops to
    the request's thread per request, for receivers (closing stale database connections,
    resetting the query log) that only concern that thread's connections. Here
    request_started runs on the request's thread just before its first thread-sensitive
    call, in that call's hop, and not at all for a request that has none (a run's POST
    does its queries in the journal's threads, sessions_app.dbthread); request_finished
    runs in a hop only when the request had such work, and otherwise on the event loop,
    where no connection of the request's is.
    """

    threads = RequestThreads()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        async with ThreadSensitiveContext() as context:
            # The request's thread-sensitive calls run on a lent thread (as on the one
            # Django would make); the executor is removed before the context's exit, so
            # the exit has no thread to join. A task that outlives the request gets a
            # new one, as it would from Django.
            def started() -> None:
                signals.request_started.send(sender=self.__class__, scope=scope)

            executor = RequestExecutor(self.threads, started)
            SyncToAsync.context_to_thread_executor[context] = executor
            token = _request_executor.set(executor)
            writer_token = _chunk_writer.set(scope.get(CHUNK_WRITER))
            try:
                await self.handle(scope, receive, send)
            finally:
                _chunk_writer.reset(writer_token)
                _request_executor.reset(token)
                if SyncToAsync.context_to_thread_executor.get(context) is executor:
                    del SyncToAsync.context_to_thread_executor[context]
                executor.release()

    async def handle(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """Django 5.2's ASGIHandler.handle, with the request signals sent as the class
        docstring says."""
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        set_script_prefix(get_script_prefix(scope))
        request, error_response = self.create_request(scope, body_file)
        if request is None:
            body_file.close()
            assert error_response is not None  # noqa: S101 - Django makes one when there is no request
            await self.send_response(error_response, send)
            await self._finish(error_response.close)
            return

        async def process_request(request: HttpRequest, send: Any) -> HttpResponseBase:
            response = await self.run_get_response(request)
            with contextlib.suppress(asyncio.CancelledError):  # the client left while it was sent
                await self.send_response(response, send)
            return response

        # As Django: the disconnect listener first, so it cannot keep the request's
        # task from being cancelled.
        processing = asyncio.create_task(process_request(request, send))
        tasks = [asyncio.create_task(self.listen_for_disconnect(receive)), processing]
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            if task.done():
                try:
                    task.result()
                except RequestAborted:
                    pass
                except AssertionError:
                    body_file.close()
                    raise
            else:
                task.cancel()  # views may handle the cancellation
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        try:
            response = processing.result()
        except asyncio.CancelledError:
            await self._finish(partial(signals.request_finished.send, sender=self.__class__))
        else:
            await self._finish(response.close)  # sends request_finished
        body_file.close()

    async def _finish(self, close: Callable[[], Any]) -> None:
        """`close` (which sends request_finished) on the request's thread if it had one,
        else here: the event loop holds none of the request's connections."""
        executor = _request_executor.get()
        if executor is None or executor.used:
            await sync_to_async(close)()
        else:
            close()

    async def send_response(self, response: HttpResponseBase, send: Any) -> None:
        """Django 5.2's send_response, taking an async streaming response's parts straight
        from its iterator.

        Django's passes each part through two more async generators (the response's
        __aiter__, and streaming_content's wrapper, which makes it bytes) and a generator
        that cuts it into chunk_size pieces: a frame per streamed chunk per SSE client
        went through all of them (py-spy under bench/peers.py). Here a part is made bytes
        as that wrapper does and cut only when it is longer than chunk_size: the same
        messages, in the same order. Any other response goes through Django's."""
        iterator: Any = getattr(response, "_iterator", None)
        if not (response.streaming and getattr(response, "is_async", False) and hasattr(iterator, "aclose")):
            await super().send_response(response, send)
            return
        headers = [
            (_header_bytes(header, "ascii"), _header_bytes(value, "latin1")) for header, value in response.items()
        ]
        for cookie in response.cookies.values():
            headers.append((b"Set-Cookie", cookie.output(header="").encode("ascii").strip()))
        await send({"type": "http.response.start", "status": response.status_code, "headers": headers})
        make_bytes = response.make_bytes
        # The server's direct write of a chunk (Daphne's: sectr_web.daphne_writes), the
        # same bytes in the same order as the message would make; the message when it
        # cannot (the first chunk, which writes the headers; a closed connection; TLS).
        write = _chunk_writer.get()
        async with contextlib.aclosing(iterator) as parts:
            async for part in parts:
                data = make_bytes(part)
                if len(data) <= self.chunk_size:
                    if write is None or not write(data):
                        await send({"type": "http.response.body", "body": data, "more_body": True})
                    continue
                for chunk, _ in self.chunk_bytes(data):
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body"})

    async def run_get_response(self, request: HttpRequest) -> HttpResponseBase:
        response = await super().run_get_response(request)
        if response.streaming and (executor := _request_executor.get()) is not None:
            executor.release()  # the view is done with its thread; the stream needs none
        return response

    def load_middleware(self, is_async: bool = False) -> None:
        if not is_async:
            raise ImproperlyConfigured("ApiASGIHandler serves ASGI only")
        self._view_middleware: list[Any] = []
        self._template_response_middleware: list[Any] = []
        self._exception_middleware: list[Any] = []
        handler = convert_exception_to_response(self._get_response_async)  # type: ignore[attr-defined]
        for path in reversed(API_MIDDLEWARE):
            middleware = import_string(path)
            hooks = [name for name in ("process_view", "process_exception", "process_template_response")
                     if hasattr(middleware, name)]  # fmt: skip
            if not getattr(middleware, "async_capable", False) or hooks:
                raise ImproperlyConfigured(f"{path} cannot be in the API's chain (sync only, or {hooks})")
            handler = convert_exception_to_response(middleware(handler))
        self._middleware_chain = handler


#: Probes served by the API's chain too: they read no cookie, and the pages' chain cost a
#: balancer's once-a-second /healthz (HAProxy's, per Daphne) its cookie-session, CSRF,
#: auth, messages and htmx middleware and their thread hops, most of an idle Daphne's CPU
#: (py-spy on an idle cluster: 21 of 24 samples in /healthz).
PROBE_PATHS = frozenset(("/healthz", "/readyz"))


def is_api_request(scope: dict[str, Any]) -> bool:
    """Whether ApiASGIHandler serves the request: the API's paths, and the probes."""
    if scope.get("type") != "http":
        return False
    path = str(scope.get("path", ""))
    return path.startswith(API_PREFIX) or path in PROBE_PATHS


def check_security_middleware(app_configs: Any = None, **kwargs: Any) -> list[Any]:
    """Django's deploy checks W001 and W002 look for its own SecurityMiddleware and
    XFrameOptionsMiddleware by name, and are silenced in the settings: the site runs its
    subclasses above (the same classes, on the event loop). This check asks the same of
    them, so removing either still warns."""
    from django.conf import settings
    from django.core import checks

    middleware = list(getattr(settings, "MIDDLEWARE", []))
    warnings = []
    for name, code, what in (
        ("SecurityMiddleware", "sectr.W001", "HSTS, nosniff, the referrer policy and the https redirect"),
        ("XFrameOptionsMiddleware", "sectr.W002", "the X-Frame-Options header"),
    ):
        if not any(path.rsplit(".", 1)[-1] == name for path in middleware):
            warnings.append(checks.Warning(f"no {name} in MIDDLEWARE: {what} are not sent", id=code))
    return warnings
