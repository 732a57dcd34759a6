"""Input no handler should ever see: text a database cannot store, numbers that are not
ASCII digits.

* Page forms and query strings (RefuseUnstorableText middleware): a NUL character (which
  PostgreSQL refuses in text, a 500 deep in a save) or a lone surrogate (which no UTF-8
  encoder takes) in any field name or value is a 400 before a view runs, as the API's
  check_text does for JSON bodies (the API is left to that check).
* Whole numbers from a query string, a form or a websocket URL: `str.isdigit()` is true
  for "²" and "٣", which int() then refuses or reads as another digit; `is_whole_number`
  takes ASCII digits only.
"""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest

MAX_NUMBER_DIGITS = 12


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
    """400 for a page request whose query string or form carries unstorable text."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if not request.path.startswith("/api/"):  # the API reads its body itself and checks it
            fields = [request.GET]
            if request.method == "POST":
                fields.append(request.POST)
            for data in fields:
                for key, values in data.lists():
                    for text in (key, *values):
                        reason = unstorable_text(text)
                        if reason is not None:
                            return HttpResponseBadRequest(reason, content_type="text/plain; charset=utf-8")
        return self.get_response(request)
