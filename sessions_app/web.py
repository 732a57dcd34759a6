"""What every page view shares: the typed htmx request, the session lookup that turns
access refusals into 404/403, flash messages and refused actions as responses.

Views call actions for every change and render partials. An action checks the actor's
access itself (on the row it locks), so a view that changes something does not look the
session up first: it calls the action under `page_refusals`, the one place that turns
an action's refusal into a page's answer (the API has its own: sessions_app.api.errors).
A permission check never lives only in a template.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any, ParamSpec

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils.functional import SimpleLazyObject
from django.views.csrf import csrf_failure as django_csrf_failure
from django_htmx.http import HttpResponseClientRedirect, reswap, retarget
from django_htmx.middleware import HtmxDetails

from sectr.errors import Forbidden, NotFound, SectrError
from sessions_app import access
from sessions_app.models import Membership, Session

_P = ParamSpec("_P")


class HtmxHttpRequest(HttpRequest):
    """A request as django_htmx's middleware leaves it (`request.htmx` is always set)."""

    htmx: HtmxDetails


def http_refusal(exc: NotFound | Forbidden, *, not_found: str = "not found", conceal: bool = False) -> Exception:
    """The page's answer to an access refusal: 404 for strangers, 403 for a reader who may
    not act (404 too with `conceal`, where a reader must not learn what they cannot do)."""
    if isinstance(exc, Forbidden) and not conceal:
        return PermissionDenied(exc.message)
    return Http404(not_found)


def get_session_for_request(request: HttpRequest, session_id: str, need: access.Need = "read") -> Session:
    """The session if the signed-in user may `need` it: 404 for strangers, 403 for readers.
    For the pages that show a session; a view that changes one leaves the check to its action."""
    try:
        return access.get_session_for_user(request.user, session_id, need)
    except (NotFound, Forbidden) as exc:
        raise http_refusal(exc, not_found="no such session") from None


def flash(message: str, *, level: str = "info", status: int = 200) -> HttpResponse:
    """A message for the page's #flash (htmx retargets the answer there)."""
    html = render_to_string("chat/_flash.html", {"message": message, "level": level})
    response = HttpResponse(html, status=status)
    retarget(response, "#flash")
    reswap(response, "innerHTML")
    return response


def is_htmx(request: HttpRequest) -> bool:
    """An htmx request (read from the header: the CSRF check runs before django_htmx's
    middleware has marked the request)."""
    return request.headers.get("HX-Request") == "true"


class HtmxRefusals:
    """An htmx action refused by an exception (PermissionDenied: 403, Http404: 404) answers
    with its message for the page's #flash, not Django's error page: htmx would swap that
    page into the card or form that sent the request. Plain requests get the usual pages.
    (static/sectr.js shows any other refusal's message in #flash too.)

    Runs on the event loop under ASGI (no thread hop a request); only its
    process_exception, called when a view raised, is sync."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        self._is_async = iscoroutinefunction(get_response)
        if self._is_async:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> Any:
        if self._is_async:
            return self._acall(request)
        return self.get_response(request)

    async def _acall(self, request: HttpRequest) -> HttpResponse:
        response: HttpResponse = await self.get_response(request)
        return response

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not is_htmx(request):
            return None
        if isinstance(exception, PermissionDenied):
            return flash(str(exception) or "You may not do this.", level="error", status=403)
        if isinstance(exception, Http404):
            reason = str(exception) if exception.args and isinstance(exception.args[0], str) else ""
            return flash(f"Not found{': ' + reason if reason else ''}. Reload the page.", level="error", status=404)
        return None


def csrf_failure(request: HttpRequest, reason: str = "") -> HttpResponse:
    """A refused CSRF check (CSRF_FAILURE_VIEW): for htmx, a message for #flash (the page
    is out of date, most often after logging out and in again in another tab); otherwise
    Django's page."""
    if is_htmx(request):
        return flash(
            "This page is out of date (its security token was refused): reload the page and try again.",
            level="error",
            status=403,
        )
    return django_csrf_failure(request, reason)


#: Where a refused plain form post goes back to: (request, the view's URL kwargs) -> path.
Back = Callable[[HttpRequest, dict[str, Any]], str]


def back_to_chat_or_home(request: HttpRequest, kwargs: dict[str, Any]) -> str:
    session_id = kwargs.get("session_id")
    return reverse("chat", args=[session_id]) if session_id else reverse("home")


def page_refusals(
    *, back: Back = back_to_chat_or_home, htmx_flash: bool = True, conceal: bool = False, not_found: str = "not found"
) -> Callable[[Callable[_P, HttpResponse]], Callable[_P, HttpResponse]]:
    """Turn an action's refusal into the page's answer.

    NotFound is 404 and Forbidden 403 (404 with `conceal`); any other refusal (a
    sectr.errors.SectrError: bad input, busy, over budget...) is a flash message with
    the error's status for htmx (with `htmx_flash`), else a Django message on the page
    `back` names, after a redirect.
    """

    def decorate(view: Callable[_P, HttpResponse]) -> Callable[_P, HttpResponse]:
        @wraps(view)
        def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> HttpResponse:
            request = args[0]
            assert isinstance(request, HttpRequest)
            try:
                return view(*args, **kwargs)
            except (NotFound, Forbidden) as exc:
                raise http_refusal(exc, not_found=not_found, conceal=conceal) from None
            except SectrError as exc:
                if htmx_flash and request.htmx:  # type: ignore[attr-defined]
                    return flash(exc.message, level="error", status=exc.status)
                messages.error(request, exc.message)
                return redirect(back(request, kwargs))

        return wrapper

    return decorate


#: The chat's and the account pages' refusals: a flash for htmx, else back to the chat.
refusals_as_messages = page_refusals()


def go_to(request: HtmxHttpRequest, url: str) -> HttpResponse:
    """Navigate: a client-side redirect for htmx, a plain redirect otherwise."""
    if request.htmx:
        return HttpResponseClientRedirect(url)
    return redirect(url)


def team_roles(request: HttpRequest) -> dict[str, object]:
    """Template context: whether to show the menus of team roles (a query only when used)."""
    user: Any = getattr(request, "user", None)
    read: list[set[str]] = []

    def roles() -> set[str]:
        # One query for both menus (Review, Teams), and none on a page that uses neither.
        if not read:
            signed_in = user is not None and user.is_authenticated
            read.append(
                set(Membership.objects.filter(user_id=user.pk).values_list("role", flat=True)) if signed_in else set()
            )
        return read[0]

    staff = access.is_staff(user)
    return {
        "sectr_can_review": SimpleLazyObject(lambda: staff or bool(roles() & {"reviewer", "moderator"})),
        "sectr_has_team": SimpleLazyObject(lambda: staff or bool(roles())),
    }
