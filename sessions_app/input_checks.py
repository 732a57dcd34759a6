"""Input no handler should ever see: text a database cannot store, numbers that are not
ASCII digits.

* Paths, query strings, cookies and page forms (RefuseUnstorableText middleware): a NUL
  character (which PostgreSQL refuses in text, a 500 deep in a query or a save) or a lone
  surrogate (which no UTF-8 encoder takes) anywhere in them is a 400 before a view runs,
  for every route, as the API's check_text does for JSON bodies.
* Whole numbers from a query string, a form or a websocket URL: `str.isdigit()` is true
  for "²" and "٣", which int() then refuses or reads as another digit; `is_whole_number`
  takes ASCII digits only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, JsonResponse

MAX_NUMBER_DIGITS = 12
API_PREFIX = "/api/"


def is_whole_number(text: str) -> bool:
    """ASCII digits only, at most MAX_NUMBER_DIGITS of them ("²" and "٣" are not numbers)."""
    return 0 < len(text) <= MAX_NUMBER_DIGITS and text.isascii() and text.isdigit()


def unstorable_text(text: str) -> str | None:
    """Why `text` cannot be stored, or None."""
    if "\x00" in text:
        return "text must not contain NUL characters"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "text must be valid Unicode (no lone surrogates)"
    return None


class RefuseUnstorableText:
    """400 for any request whose path, query string, cookies or page form carry
    unstorable text, before any view (or URL converter, or session lookup) sees it.

    Every route is covered, the API's included: a NUL in a path argument
    (``/share/<token>%00/``) or a query parameter (``/api/v1/asks?tool=a%00``) would
    otherwise reach a database query, which PostgreSQL refuses with an error deep in
    the view (a 500). The API's answer is its JSON error (``invalid_unicode``), the
    pages' a plain text one. The API's JSON bodies are not read here (the API reads its
    body itself, under its own size limits, and check_text checks it).
    """

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:  # Django then calls it as a coroutine function, with no thread hop
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> Any:
        if self.is_async:
            return self.__acall__(request)
        refused = self.refused(request)
        return refused if refused is not None else self.get_response(request)

    async def __acall__(self, request: HttpRequest) -> HttpResponse:
        if request.method == "POST" and not request.path_info.startswith(API_PREFIX):
            # A page form is parsed to be checked (uploads may be written to disk): in
            # a thread, as Django runs sync middleware. Anything else on the event loop.
            refused = await sync_to_async(self.refused)(request)
        else:
            refused = self.refused(request)
        return refused if refused is not None else await self.get_response(request)

    def refused(self, request: HttpRequest) -> HttpResponse | None:
        """The 400 for a request with unstorable text, or None."""
        reason = self.refusal(request)
        if reason is None:
            return None
        if request.path_info.startswith(API_PREFIX):
            return JsonResponse({"error": {"code": "invalid_unicode", "message": reason}}, status=400)
        return HttpResponseBadRequest(reason, content_type="text/plain; charset=utf-8")

    @staticmethod
    def refusal(request: HttpRequest) -> str | None:
        texts: list[str] = [request.path_info, request.path]
        fields = [request.GET]
        if request.method == "POST" and not request.path_info.startswith(API_PREFIX):
            fields.append(request.POST)
        for data in fields:
            for key, values in data.lists():
                texts.append(key)
                texts.extend(values)
        for name, value in request.COOKIES.items():
            texts += (name, value)
        for text in texts:
            reason = unstorable_text(text)
            if reason is not None:
                return reason
        return None
