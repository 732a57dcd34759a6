"""A Content-Security-Policy on every response Django makes (pages, the admin, the API).

Django 5.2 has no CSP of its own. django-csp would do, but the policy here is one
constant with no per-view exceptions and no nonces (no page has an inline script: htmx
and sectr.js come from static/, and htmx runs with allowEval off), so a ten-line
middleware is all it takes and adds no dependency.

* Scripts: from this origin only; no inline script, no eval.
* Styles: style sheets from this origin; inline style *attributes* are allowed, for
  markdown tables' column alignment (markdown-it writes ``style="text-align:..."``, nh3
  keeps it on td/th only) and the admin's few; no <style> element runs.
* Images and audio: this origin, data: URLs (uploads shown inline) and https: (media
  referenced by URL, which the media filter already checked is public).
* Sockets and fetches: this origin ('self' covers ws:/wss: to the same host and port).
* No plugins, no <base>, forms post here only, no framing.
"""

from __future__ import annotations

from django.http import HttpRequest
from django.http.response import HttpResponseBase
from django.utils.deprecation import MiddlewareMixin

from sectr_web.middleware import InlineMiddlewareMixin

POLICY = "; ".join(
    [
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "style-src-attr 'unsafe-inline'",
        "img-src 'self' data: https:",
        "media-src 'self' data: https:",
        "connect-src 'self'",
        "font-src 'self'",
        "object-src 'none'",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    ]
)


class ContentSecurityPolicy(InlineMiddlewareMixin, MiddlewareMixin):
    """Sets the policy on every response; on the event loop under ASGI (no thread hop)."""

    def process_response(self, request: HttpRequest, response: HttpResponseBase) -> HttpResponseBase:
        response.headers.setdefault("Content-Security-Policy", POLICY)
        return response
