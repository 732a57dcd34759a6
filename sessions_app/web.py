"""What every page view shares: the typed htmx request, the session lookup that turns
access refusals into 404/403, flash messages and refused actions as messages.

Views call actions for every change and render partials; a permission check never lives
only in a template (the lookups here, or the action's own check, come first).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import ParamSpec

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils.functional import SimpleLazyObject
from django_htmx.http import HttpResponseClientRedirect, reswap, retarget
from django_htmx.middleware import HtmxDetails

from sectr.errors import Forbidden, NotFound, SectrError
from sessions_app import access
from sessions_app.models import Session

_P = ParamSpec("_P")


class HtmxHttpRequest(HttpRequest):
    """A request as django_htmx's middleware leaves it (`request.htmx` is always set)."""

    htmx: HtmxDetails


def get_session_for_request(request: HttpRequest, session_id: str, need: access.Need = "read") -> Session:
    """The session if the signed-in user may `need` it: 404 for strangers, 403 for readers."""
    try:
        return access.get_session_for_user(request.user, session_id, need)
    except NotFound:
        raise Http404("no such session") from None
    except Forbidden as exc:
        raise PermissionDenied(exc.message) from None


def flash(message: str, *, level: str = "info", status: int = 200) -> HttpResponse:
    """A message for the page's #flash (htmx retargets the answer there)."""
    html = render_to_string("chat/_flash.html", {"message": message, "level": level})
    response = HttpResponse(html, status=status)
    retarget(response, "#flash")
    reswap(response, "innerHTML")
    return response


def refusals_as_messages(view: Callable[_P, HttpResponse]) -> Callable[_P, HttpResponse]:
    """Turn a refused action into a flash message (htmx) or a Django message + redirect."""

    @wraps(view)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> HttpResponse:
        request = args[0]
        assert isinstance(request, HttpRequest)
        try:
            return view(*args, **kwargs)
        except NotFound:
            raise Http404("not found") from None
        except Forbidden as exc:
            raise PermissionDenied(exc.message) from None
        except SectrError as exc:
            if request.htmx:  # type: ignore[attr-defined]
                return flash(exc.message, level="error", status=exc.status)
            messages.error(request, exc.message)
            session_id = kwargs.get("session_id")
            return redirect(reverse("chat", args=[session_id]) if session_id else reverse("home"))

    return wrapper


def go_to(request: HtmxHttpRequest, url: str) -> HttpResponse:
    """Navigate: a client-side redirect for htmx, a plain redirect otherwise."""
    if request.htmx:
        return HttpResponseClientRedirect(url)
    return redirect(url)


def team_roles(request: HttpRequest) -> dict[str, object]:
    """Template context: whether to show the menus of team roles (a query only when used)."""
    user = getattr(request, "user", None)
    return {"sectr_can_review": SimpleLazyObject(lambda: access.has_any_role(user, "reviewer"))}
