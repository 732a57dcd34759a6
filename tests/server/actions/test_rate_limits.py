"""Budgets under concurrency: the per-token API rate limit, the login throttle and the
per-user session-creation bound. Counters live in Redis when REDIS_URL is set (both test
passes exercise their backend), else in the process."""

from __future__ import annotations

import secrets
import time
import uuid
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client, override_settings

from sessions_app.actions.tokens import do_issue_token
from sessions_app.models import Session
from tests.server.conftest import run_threads

LIMIT = 100
WINDOW = 3600


def bearer(raw: str) -> dict[str, str]:
    return {"HTTP_AUTHORIZATION": f"Bearer {raw}"}


@pytest.mark.django_db(transaction=True)
@override_settings(SECTR_API_RATE_LIMIT=f"{LIMIT}/{WINDOW}")
def test_the_token_budget_holds_under_concurrency(owner: Any) -> None:
    """1,000 requests from 32 threads in one window: exactly LIMIT get through."""
    for _attempt in range(2):  # once more if the fixed window turned over mid-test
        _, raw = do_issue_token(owner, "burst")
        window_before = int(time.time() // WINDOW)

        def burst(thread: int, raw: str = raw) -> list[int]:
            client = Client()
            count = 1000 // 32 + (1 if thread < 1000 % 32 else 0)
            return [client.get("/api/v1/sessions/none", **bearer(raw)).status_code for _ in range(count)]

        results, errors = run_threads(32, burst)
        if int(time.time() // WINDOW) == window_before:
            break
    assert not errors
    statuses = [status for thread in results for status in thread]
    assert len(statuses) == 1000
    assert statuses.count(429) == 1000 - LIMIT, {s: statuses.count(s) for s in set(statuses)}
    assert statuses.count(404) == LIMIT


# ---- login ----

PASSWORD = "pw-Secret-123"


def fresh_user(password: str = PASSWORD) -> Any:
    # Counters outlive a test database in Redis: every test signs in as somebody new.
    return get_user_model().objects.create_user(username=f"user-{uuid.uuid4().hex[:10]}", password=password)


def fresh_address() -> str:
    return f"10.{secrets.randbelow(256)}.{secrets.randbelow(256)}.{secrets.randbelow(256)}"


@override_settings(SECTR_LOGIN_LIMIT_PER_ACCOUNT="3/300", SECTR_LOGIN_LIMIT_PER_ADDRESS="0/300")
def test_login_is_throttled_per_account(db: None) -> None:
    user = fresh_user()
    statuses = [
        Client(REMOTE_ADDR=fresh_address())
        .post("/accounts/login/", {"username": user.username, "password": "wrong"})
        .status_code
        for _ in range(3)
    ]
    assert statuses == [200, 200, 200]  # the form again, with its error
    refused = Client(REMOTE_ADDR=fresh_address()).post(
        "/accounts/login/", {"username": user.username, "password": PASSWORD}
    )
    assert refused.status_code == 429 and "Too many sign-in attempts" in refused.content.decode()
    assert "_auth_user_id" not in refused.wsgi_request.session, "the right password must not get through either"
    other = fresh_user()
    assert Client().post("/accounts/login/", {"username": other.username, "password": PASSWORD}).status_code == 302


@override_settings(SECTR_LOGIN_LIMIT_PER_ACCOUNT="0/300", SECTR_LOGIN_LIMIT_PER_ADDRESS="4/300")
def test_login_is_throttled_per_address(db: None) -> None:
    address = fresh_address()
    client = Client(REMOTE_ADDR=address)
    statuses = [
        client.post("/accounts/login/", {"username": f"guess-{i}", "password": "wrong"}).status_code for i in range(4)
    ]
    assert statuses == [200] * 4
    user = fresh_user()
    assert client.post("/accounts/login/", {"username": user.username, "password": PASSWORD}).status_code == 429
    elsewhere = Client(REMOTE_ADDR=fresh_address())
    assert elsewhere.post("/accounts/login/", {"username": user.username, "password": PASSWORD}).status_code == 302


@override_settings(SECTR_LOGIN_LIMIT_PER_ACCOUNT="2/300", SECTR_LOGIN_LIMIT_PER_ADDRESS="0/300")
def test_the_admin_login_spends_the_same_budget(db: None) -> None:
    user = get_user_model().objects.create_superuser(f"admin-{uuid.uuid4().hex[:10]}", password=PASSWORD)
    for _ in range(2):
        Client().post("/admin/login/", {"username": user.username, "password": "wrong"})
    response = Client().post("/admin/login/?next=/admin/", {"username": user.username, "password": PASSWORD})
    assert response.status_code == 200 and "Too many sign-in attempts" in response.content.decode()


# ---- new sessions ----


@override_settings(SECTR_SESSION_CREATE_LIMIT="3/3600")
def test_new_sessions_per_user_are_bounded_on_the_page_and_the_api(db: None) -> None:
    user = fresh_user()
    page = Client()
    page.force_login(user)
    statuses = [page.post("/sessions/new", {"title": f"s{i}"}).status_code for i in range(3)]
    assert statuses == [302, 302, 302]
    refused = page.post("/sessions/new", {"title": "one too many"}, HTTP_HX_REQUEST="true")
    assert refused.status_code == 429 and "at most 3 new sessions" in refused.content.decode()
    _, raw = do_issue_token(user, "script")
    api = Client().post("/api/v1/sessions", {}, content_type="application/json", **bearer(raw))
    assert api.status_code == 429 and api.json()["error"]["code"] == "rate_limited"
    assert 1 <= int(api["Retry-After"]) <= 3601
    session = Session.objects.filter(owner=user).first()
    assert session is not None
    fork = Client().post(f"/api/v1/sessions/{session.pk}/fork", {}, content_type="application/json", **bearer(raw))
    assert fork.status_code == 429
    assert Session.objects.filter(owner=user).count() == 3
    other = fresh_user()
    page.force_login(other)
    assert page.post("/sessions/new", {}).status_code == 302, "the budget is per user"
