"""Paths, query strings, cookies and page forms refuse NUL and lone surrogates (400, as
the API does with its bodies) on every route; whole numbers from a query string, a form
or a websocket URL are ASCII digits only ("²" is a 400, not a 500)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import URLResolver, get_resolver
from django.urls.resolvers import RegexPattern

from sessions_app.actions.tokens import do_issue_token
from sessions_app.models import Envelope, Session
from tests.server.chat.test_consumers import connect, frames_until_ready

NUL_MESSAGE = "text must not contain NUL characters"


def test_a_nul_in_a_page_form_is_a_400_and_writes_nothing(owner_client: Client, session: Session) -> None:
    before = Envelope.objects.filter(session=session).count()
    for path, data in (
        (f"/sessions/{session.pk}/messages", {"content": "a\x00b"}),
        (f"/sessions/{session.pk}/rename", {"title": "t\x00"}),
        ("/sessions/new", {"title": "\x00"}),
        (f"/sessions/{session.pk}/steer", {"con\x00tent": "x"}),
    ):
        response = owner_client.post(path, data)
        assert response.status_code == 400 and b"NUL" in response.content, path
    assert Envelope.objects.filter(session=session).count() == before
    assert Session.objects.count() == 1


def test_a_nul_in_a_query_string_is_a_400(owner_client: Client) -> None:
    assert owner_client.get("/?page=%00").status_code == 400
    assert owner_client.get("/review/?owner=a%00").status_code == 400


def test_the_api_keeps_its_own_check(owner: Any) -> None:
    _, raw = do_issue_token(owner, "t")
    response = Client().post(
        "/api/v1/sessions", '{"title": "a\\u0000"}', content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {raw}"
    )
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_unicode"


@pytest.mark.parametrize("number", ["²", "٣", "1²", "１"])
def test_non_ascii_digits_are_a_400_not_a_500(owner_client: Client, session: Session, number: str) -> None:
    fork = owner_client.post(f"/sessions/{session.pk}/fork", {"at_seq": number}, HTTP_HX_REQUEST="true")
    assert fork.status_code == 400, fork.content
    _, raw = do_issue_token(session.owner, "t")
    listing = Client().get("/api/v1/sessions", {"limit": number}, HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert listing.status_code == 400 and listing.json()["error"]["code"] == "invalid_limit"
    assert owner_client.get("/", {"page": number}).status_code == 200  # the paginator's first page


def test_a_content_length_of_other_digits_is_a_400(owner: Any) -> None:
    _, raw = do_issue_token(owner, "t")
    response = Client().post(
        "/api/v1/sessions",
        b"{}",
        content_type="application/json",
        CONTENT_LENGTH="٢",
        HTTP_AUTHORIZATION=f"Bearer {raw}",
    )
    assert response.status_code == 400


@pytest.mark.django_db(transaction=True)
async def test_a_websocket_cursor_of_other_digits_counts_as_zero(owner: Any, session: Session, settings: Any) -> None:
    settings.SECTR_EMBEDDED_WORKER = False
    communicator, connected, _ = await connect(owner, f"/ws/sessions/{session.pk}/?after=%C2%B2")
    assert connected
    frames = await frames_until_ready(communicator)
    assert any(frame.get("first") == 1 for frame in frames), "the whole journal, from seq 1"
    await communicator.disconnect()


# ---- NUL in any path argument, query parameter or cookie, on every route ----

CONVERTER = re.compile(r"<(?:(\w+):)?(\w+)>")
REGEX_GROUP = re.compile(r"\(\?P<(\w+)>[^)]*\)")


def every_route(patterns: list[Any] | None = None, prefix: str = "") -> list[tuple[str, list[str]]]:
    """Each URL pattern of the site (includes followed) as (route, argument names), with
    every argument written `{name}`: Django's path() converters and the named groups of
    re_path() patterns (the admin's, the API's catch-all) alike."""
    found: list[tuple[str, list[str]]] = []
    for pattern in get_resolver().url_patterns if patterns is None else patterns:
        text = str(pattern.pattern)
        if isinstance(pattern.pattern, RegexPattern):
            text = REGEX_GROUP.sub(lambda match: "{" + match.group(1) + "}", text).lstrip("^").rstrip("$")
            text = text.replace("\\", "")
        else:
            text = CONVERTER.sub(lambda match: "{" + match.group(2) + "}", text)
        if isinstance(pattern, URLResolver):
            found += every_route(pattern.url_patterns, prefix + text)
        else:
            found.append((prefix + text, re.findall(r"\{(\w+)\}", prefix + text)))
    return found


def nul_urls() -> list[str]:
    """For every route: each path argument in turn given a NUL (the others a plain
    value), and the route with plain arguments and a NUL in a query parameter."""
    urls = []
    for route, names in every_route():
        plain = {name: "1" for name in names}
        for name in names:
            urls.append("/" + route.format(**{**plain, name: "a%00"}))
        urls.append("/" + route.format(**plain) + "?q=a%00")
    return urls


def api_query_urls() -> list[str]:
    """Every query parameter the API's operations document, given a NUL."""
    from sessions_app.api.urls import ROUTES

    urls = []
    for route in ROUTES:
        path = "/api/v1/" + CONVERTER.sub("1", route.path)
        for operation in route.operations.values():
            urls += [f"{path}?{name}=a%00" for name in operation.query]
    return urls


def test_the_route_list_covers_the_site() -> None:
    routes = dict(every_route())
    assert {"share/{token}/", "api/v1/teams/{name}/rules", "sessions/{session_id}/", "review/{session_id}/"} <= set(
        routes
    )
    assert any(route.startswith("admin/") for route in routes) and len(routes) > 80
    assert "/api/v1/asks?tool=a%00" in api_query_urls() and "/api/v1/audit?tool=a%00" in api_query_urls()


@pytest.mark.django_db
def test_a_nul_in_any_path_argument_or_query_parameter_is_a_400_on_every_route(owner: Any) -> None:
    staff = get_user_model().objects.create_user("operator", is_staff=True, is_superuser=True)
    _, raw = do_issue_token(staff, "t")
    signed_in = Client()
    signed_in.force_login(staff)
    clients = {"anonymous": Client(), "staff": signed_in}
    failures = []
    for url in nul_urls() + api_query_urls():
        for who, client in clients.items():
            for method in ("get", "post"):
                response = getattr(client, method)(url, HTTP_AUTHORIZATION=f"Bearer {raw}")
                api = url.startswith("/api/")
                well_formed = (
                    response.json() == {"error": {"code": "invalid_unicode", "message": NUL_MESSAGE}}
                    if api
                    else response["Content-Type"].startswith("text/plain") and response.content == NUL_MESSAGE.encode()
                )
                if response.status_code != 400 or not well_formed:
                    failures.append(f"{method.upper()} {url} as {who}: {response.status_code}")
    assert failures == []


def test_a_nul_in_a_cookie_is_a_400(owner_client: Client) -> None:
    owner_client.cookies["sessionid"] = "abcdefgh\x00"
    assert owner_client.get("/").status_code == 400
    owner_client.cookies["sessionid"] = "abcdefgh"
    assert owner_client.get("/", {"q": "ok"}).status_code == 302  # a stale session: the login page


@pytest.mark.django_db(transaction=True)
async def test_a_nul_in_a_websocket_session_id_closes_it_as_not_found(
    owner: Any, session: Session, settings: Any
) -> None:
    settings.SECTR_EMBEDDED_WORKER = False
    communicator, connected, code = await connect(owner, f"/ws/sessions/{session.pk}\x00/")
    assert (connected, code) == (False, 4404)
    await communicator.disconnect()
