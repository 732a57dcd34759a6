"""The server as `scripts/run.sh` starts it (no settings in the environment): Django's
debug pages stay off, and plain http on the loopback works (log in, pages, static files)."""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx
import pytest

from tests.liveserver import ROOT, LiveSectr

pytestmark = pytest.mark.slow

#: What run.sh leaves to the defaults (whatever the environment running the tests says).
DEFAULTED = ("DEBUG", "ALLOWED_HOSTS", "SECTR_HTTPS", "SECURE_SSL_REDIRECT", "SECRET_KEY", "CSRF_TRUSTED_ORIGINS")

REVOKED_SHARE = (
    "from django.utils import timezone; from django.contrib.auth import get_user_model; "
    "from sessions_app.models import Session, ShareLink; "
    "u = get_user_model().objects.create_user('sharer', password='pw-Secret-123'); "
    "s = Session.objects.create(owner=u); "
    "link = ShareLink.objects.create(session=s, seq=0, created_by=u, revoked_at=timezone.now()); "
    "print(link.token)"
)


@pytest.fixture(scope="module")
def live() -> Iterator[LiveSectr]:
    server = LiveSectr()
    for name in DEFAULTED:
        server.env.pop(name, None)
    with server:
        yield server


def test_a_revoked_share_link_is_a_plain_404_without_the_url_patterns(live: LiveSectr) -> None:
    token = live.manage("shell", "-c", REVOKED_SHARE).strip().splitlines()[-1]
    page = httpx.get(live.url(f"/share/{token}/"))
    assert page.status_code == 404
    # Django's technical 404 lists the URLconf's patterns and says DEBUG is on.
    for leak in ("URLconf", "sectr_web.urls", "DEBUG = True", "api/v1/", "admin/", "Traceback"):
        assert leak not in page.text, leak
    unknown = httpx.get(live.url("/no-such-page/"))
    assert unknown.status_code == 404 and "URLconf" not in unknown.text and "admin/" not in unknown.text


def test_the_static_files_are_served(live: LiveSectr) -> None:
    for name in ("sectr.css", "sectr.js"):
        response = httpx.get(live.url(f"/static/{name}"))
        assert response.status_code == 200, name
        assert response.content == (ROOT / "static" / name).read_bytes()
    assert httpx.get(live.url("/static/no-such-file.css")).status_code == 404


def test_one_logs_in_over_plain_http_on_the_loopback(live: LiveSectr) -> None:
    live.create_user("dev", "pw-Secret-123")
    with httpx.Client(base_url=live.base_url) as client:
        form = client.get("/accounts/login/")
        assert form.status_code == 200
        # No redirect to https and no Secure cookie: a browser sends these back over http.
        assert "secure" not in form.headers.get("set-cookie", "").lower()
        assert "strict-transport-security" not in form.headers
        match = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form.text)
        assert match
        signed_in = client.post(
            "/accounts/login/",
            data={"username": "dev", "password": "pw-Secret-123", "csrfmiddlewaretoken": match.group(1)},
        )
        assert signed_in.status_code == 302, signed_in.text[:500]
        assert "secure" not in signed_in.headers.get("set-cookie", "").lower()
        assert "sessionid" in client.cookies
        home = client.get("/")
        assert home.status_code == 200
        assert "/static/sectr.js" in home.text or "static/sectr.js" in home.text
