"""The team page's Notifications section (webhooks: list, add, delete; the switch `Links
decide without login`) and the webhooks API, for every standing: 404 for an outsider,
403 for members and reviewers (and nothing changes), the change for moderators and staff.
A webhook's secret is write-only: never on a page, never in an answer.

The webhook URLs are literal public addresses, judged without DNS and never called here
(no ask is made).
"""

from __future__ import annotations

import json
import re
import socket
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from sessions_app import actions
from sessions_app.actions.tokens import do_issue_token
from sessions_app.models import Team, TeamWebhook

pytestmark = pytest.mark.django_db

HOOK = "https://93.184.215.14/sectr-hook"
SLACK = "https://93.184.215.15/services/T000/B000/XXXX"
SECRET = "s3cret-never-shown-8f2a"
READERS = ("member", "reviewer")


@pytest.fixture
def people(db: None) -> dict[str, Any]:
    actions.do_create_team("crew")
    actions.do_create_team("other")
    users = {
        name: get_user_model().objects.create_user(username=name, email=f"{name}@example.org")
        for name in ("member", "reviewer", "moderator", "outsider")
    }
    users["staff"] = get_user_model().objects.create_user(username="staff", is_staff=True)
    for role in ("member", "reviewer", "moderator"):
        actions.do_set_membership("crew", role, role)
    actions.do_set_membership("other", "outsider", "moderator")
    return users


@pytest.fixture
def crew_hook(people: dict[str, Any]) -> TeamWebhook:
    return TeamWebhook.objects.create(team=Team.objects.get(name="crew"), url=HOOK, secret=SECRET)


def browser(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def api(user: Any) -> Client:
    return Client(HTTP_AUTHORIZATION=f"Bearer {do_issue_token(user, 't')[1]}")


def hooks() -> list[tuple[str, str, str, str]]:
    return sorted(TeamWebhook.objects.values_list("team__name", "url", "kind", "secret"))


def links_on() -> bool:
    return Team.objects.get(name="crew").links_decide_without_login


def notices(response: Any) -> list[str]:
    return [str(m) for m in response.context["messages"]] if response.context else []


# ---- the page ----


def test_a_moderator_sees_the_webhooks_the_form_and_the_switch_but_never_a_secret(
    people: dict[str, Any], crew_hook: TeamWebhook
) -> None:
    page = browser(people["moderator"]).get("/teams/crew/")
    html = page.content.decode()
    assert page.status_code == 200
    assert f'id="webhook-{crew_hook.pk}"' in html and HOOK in html
    assert 'aria-label="Add a webhook"' in html and 'name="secret"' in html and 'type="password"' in html
    assert 'name="links_decide_without_login"' in html and "Off: every link asks for a login first." in html
    assert SECRET not in html


@pytest.mark.parametrize("role", READERS)
def test_members_and_reviewers_see_only_how_many_webhooks_and_no_switch(
    people: dict[str, Any], crew_hook: TeamWebhook, role: str
) -> None:
    html = browser(people[role]).get("/teams/crew/").content.decode()
    assert "1 webhook; the team's moderators see and manage it." in html
    assert HOOK not in html and SECRET not in html
    assert "Add a webhook" not in html and 'name="links_decide_without_login"' not in html
    assert "Off: every link asks for a login first." in html


def test_a_moderator_adds_a_json_and_a_slack_webhook_from_the_page(people: dict[str, Any]) -> None:
    client = browser(people["moderator"])
    response = client.post("/teams/crew/webhooks/new", {"url": HOOK, "kind": "json", "secret": SECRET}, follow=True)
    assert response.redirect_chain[-1] == ("/teams/crew/#notifications", 302)
    assert any(n.startswith("Webhook ") and n.endswith(" added (json).") for n in notices(response))
    assert SECRET not in response.content.decode()
    client.post("/teams/crew/webhooks/new", {"url": SLACK, "kind": "slack", "secret": ""})
    stored = hooks()
    assert stored[0] == ("crew", HOOK, "json", SECRET)
    assert stored[1][:3] == ("crew", SLACK, "slack")
    assert len(stored[1][3]) >= 32  # no secret given: a random one, never shown


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"url": "http://127.0.0.1:8000/hook", "kind": "json"}, "webhooks may not call internal addresses"),
        ({"url": "http://169.254.169.254/latest", "kind": "json"}, "webhooks may not call internal addresses"),
        ({"url": "http://localhost/hook", "kind": "json"}, "names this machine or a metadata service"),
        ({"url": "ftp://93.184.215.14/x", "kind": "json"}, "webhook URLs must be absolute http or https URLs"),
        ({"url": HOOK, "kind": "teams"}, "Kind: Select a valid choice."),
        ({"url": HOOK, "kind": "json", "secret": "has space"}, "a secret must not contain spaces"),
        ({"kind": "json"}, "URL: This field is required."),
    ],
)
def test_a_refused_webhook_says_why_and_saves_nothing(
    people: dict[str, Any], fields: dict[str, str], says: str
) -> None:
    response = browser(people["moderator"]).post("/teams/crew/webhooks/new", fields, follow=True)
    assert response.status_code == 200
    assert any(says in n for n in notices(response)), notices(response)
    assert hooks() == []


def test_a_moderator_deletes_a_webhook_but_not_another_teams(people: dict[str, Any], crew_hook: TeamWebhook) -> None:
    theirs = TeamWebhook.objects.create(team=Team.objects.get(name="other"), url=SLACK)
    client = browser(people["moderator"])
    assert client.post(f"/teams/crew/webhooks/{theirs.pk}/delete").status_code == 404
    response = client.post(f"/teams/crew/webhooks/{crew_hook.pk}/delete", follow=True)
    assert f"Webhook {crew_hook.pk} deleted." in notices(response)
    assert hooks() == [("other", SLACK, "json", theirs.secret)]


def test_a_moderator_turns_the_links_switch_on_and_off(people: dict[str, Any]) -> None:
    client = browser(people["moderator"])
    response = client.post("/teams/crew/links", {"links_decide_without_login": "on"}, follow=True)
    assert "Links in emails now decide without a login." in notices(response)
    assert links_on() is True
    assert "On: a link in an email" in response.content.decode()
    assert re.search(r'<input[^>]*name="links_decide_without_login"[^>]*checked', response.content.decode())
    response = client.post("/teams/crew/links", {}, follow=True)
    assert links_on() is False
    assert not re.search(r'<input[^>]*name="links_decide_without_login"[^>]*checked', response.content.decode())


@pytest.mark.parametrize(("role", "status"), [("member", 403), ("reviewer", 403), ("outsider", 404)])
def test_nobody_but_moderators_changes_notifications(
    people: dict[str, Any], crew_hook: TeamWebhook, role: str, status: int
) -> None:
    client = browser(people[role])
    before = (hooks(), links_on())
    assert client.post("/teams/crew/webhooks/new", {"url": SLACK, "kind": "slack"}).status_code == status
    assert client.post("/teams/crew/webhooks/new", {"url": "not a url"}).status_code == status
    assert client.post(f"/teams/crew/webhooks/{crew_hook.pk}/delete").status_code == status
    assert client.post("/teams/crew/links", {"links_decide_without_login": "on"}).status_code == status
    assert (hooks(), links_on()) == before


def test_staff_manage_any_teams_webhooks(people: dict[str, Any]) -> None:
    client = browser(people["staff"])
    client.post("/teams/crew/webhooks/new", {"url": HOOK, "kind": "slack"})
    client.post("/teams/crew/links", {"links_decide_without_login": "on"})
    assert [h[:3] for h in hooks()] == [("crew", HOOK, "slack")]
    assert links_on() is True


def test_the_outsider_gets_404_for_the_page(people: dict[str, Any]) -> None:
    assert browser(people["outsider"]).get("/teams/crew/").status_code == 404


# ---- the API ----


def test_the_api_lists_adds_and_deletes_webhooks_without_secrets(people: dict[str, Any]) -> None:
    client = api(people["moderator"])
    created = client.post(
        "/api/v1/teams/crew/webhooks",
        json.dumps({"url": SLACK, "kind": "slack", "secret": SECRET}),
        content_type="application/json",
    )
    assert created.status_code == 201, created.content
    body = created.json()
    assert set(body) == {"id", "url", "kind", "active", "created_at"}
    assert (body["url"], body["kind"], body["active"]) == (SLACK, "slack", True)
    plain = client.post("/api/v1/teams/crew/webhooks", {"url": HOOK}, content_type="application/json")
    assert plain.status_code == 201 and plain.json()["kind"] == "json"
    listed = client.get("/api/v1/teams/crew/webhooks")
    assert listed.status_code == 200
    assert [(h["id"], h["url"], h["kind"]) for h in listed.json()["webhooks"]] == [
        (body["id"], SLACK, "slack"),
        (plain.json()["id"], HOOK, "json"),
    ]
    assert SECRET not in listed.content.decode() and "secret" not in listed.content.decode()
    assert TeamWebhook.objects.get(pk=body["id"]).secret == SECRET
    assert client.delete(f"/api/v1/teams/crew/webhooks/{body['id']}").status_code == 204
    assert client.delete(f"/api/v1/teams/crew/webhooks/{body['id']}").status_code == 404
    for odd in ("abc", "-1", "١", "9" * 40):
        refused = client.delete(f"/api/v1/teams/crew/webhooks/{odd}")
        assert (refused.status_code, refused.json()["error"]["code"]) == (404, "not_found"), odd
    assert [h[1] for h in hooks()] == [HOOK]


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"url": "http://10.1.2.3/hook"}, "url"),
        ({"url": "http://[::ffff:127.0.0.1]/hook"}, "url"),
        ({"url": "javascript:alert(1)"}, "url"),
        ({"url": HOOK, "kind": "teams"}, "invalid_kind"),
        ({"url": HOOK, "kind": ""}, "invalid_kind"),
        ({"url": HOOK, "secret": 5}, "invalid_secret"),
        ({"url": HOOK, "secret": "x" * 201}, "invalid_secret"),
        ({"url": HOOK, "active": False}, "invalid_body"),
        ({"kind": "json"}, "url"),
        ({"url": 7}, "url"),
    ],
)
def test_the_api_refuses_a_bad_webhook_with_400_and_saves_nothing(
    people: dict[str, Any], body: dict[str, Any], code: str
) -> None:
    response = api(people["moderator"]).post("/api/v1/teams/crew/webhooks", body, content_type="application/json")
    assert response.status_code == 400, response.content
    assert response.json()["error"]["code"] == code
    assert hooks() == []


@pytest.mark.parametrize(("role", "status"), [("member", 403), ("reviewer", 403), ("outsider", 404)])
def test_the_webhooks_api_is_for_moderators_only(
    people: dict[str, Any], crew_hook: TeamWebhook, role: str, status: int
) -> None:
    client = api(people[role])
    before = hooks()
    assert client.get("/api/v1/teams/crew/webhooks").status_code == status
    response = client.post("/api/v1/teams/crew/webhooks", {"url": SLACK}, content_type="application/json")
    assert response.status_code == status
    assert client.delete(f"/api/v1/teams/crew/webhooks/{crew_hook.pk}").status_code == status
    assert hooks() == before
    assert api(people["outsider"]).get("/api/v1/teams/nope/webhooks").status_code == 404


def test_the_openapi_document_names_the_webhook_routes(people: dict[str, Any]) -> None:
    paths = api(people["member"]).get("/api/v1/openapi.json").json()["paths"]
    assert set(paths["/api/v1/teams/{name}/webhooks"]) == {"get", "post"}
    assert set(paths["/api/v1/teams/{name}/webhooks/{webhook_id}"]) == {"delete"}


@pytest.mark.parametrize("role", ["member", "outsider"])
def test_a_refused_poster_makes_the_server_resolve_nothing(
    people: dict[str, Any], role: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    looked_up: list[str] = []

    def recording(host: str, *args: Any, **kwargs: Any) -> Any:
        looked_up.append(host)
        raise socket.gaierror("no lookups in this test")

    monkeypatch.setattr(socket, "getaddrinfo", recording)
    response = browser(people[role]).post("/teams/crew/webhooks/new", {"url": "https://probe.example/x"})
    assert response.status_code in (403, 404)
    assert looked_up == []
    moderator = browser(people["moderator"]).post(
        "/teams/crew/webhooks/new", {"url": "https://probe.example/x", "kind": "json"}, follow=True
    )
    assert looked_up == ["probe.example"]  # the check itself does resolve, for a moderator
    assert any("does not resolve" in n for n in notices(moderator))
