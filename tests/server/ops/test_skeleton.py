import pytest
from django.test import Client


@pytest.mark.django_db
def test_healthz_answers_without_login(client: Client) -> None:
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json()["ok"] is True


@pytest.mark.django_db
def test_home_redirects_anonymous_to_login(client: Client) -> None:
    response = client.get("/")
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/")
