"""Images in an MCP tool's result (docs/mcp.md, "Results"): `server-everything`'s
`get-tiny-image`, run by the worker, is stored as the session's media; the journal holds
a reference (never the base64), the model reads it named, and people see it on the
chat and review pages and through the API, with the session's read access."""

from __future__ import annotations

import base64
import hashlib
import re
from pathlib import Path
from typing import Any

import pytest
from django.apps import apps
from django.core import serializers
from django.test import Client

from sectr.events import EventType
from sessions_app import actions
from sessions_app.actions import mcp_servers as mcp_actions
from sessions_app.actions.tokens import do_issue_token
from sessions_app.api.events import RunEvents
from sessions_app.journal import DatabaseJournal
from sessions_app.media import store_result_media
from sessions_app.models import Envelope, MediaBlob, Session, SessionMedia

from .conftest import ROOT
from .test_mcp_runs import git_session, of_type, run_worker

TINY_IMAGE_JS = ROOT / "var/mcp-npm/node_modules/@modelcontextprotocol/server-everything/dist/tools/get-tiny-image.js"


def tiny_image() -> tuple[str, bytes]:
    """The server's own image (its base64, and the bytes), read from its source."""
    match = re.search(r'MCP_TINY_IMAGE = "([A-Za-z0-9+/=]+)"', TINY_IMAGE_JS.read_text())
    assert match, "server-everything's tiny image moved"
    return match.group(1), base64.b64decode(match.group(1))


@pytest.fixture(autouse=True)
def media_root(settings: Any, tmp_path: Path) -> Path:
    settings.MEDIA_ROOT = str(tmp_path / "media-root")
    return tmp_path


def image_session(people: dict[str, Any], url: str, settings: Any) -> Session:
    settings.SECTR_MCP_ALLOWED_HOSTS = ["127.0.0.1"]
    server = mcp_actions.do_add_server(people["moderator"], "crew", {"name": "every", "url": url})
    assert server.health == "ok", server.last_error
    session = git_session(people, tools=["every__*"])
    actions.do_post_message(people["owner"], session.pk, "!tool every__get-tiny-image {}")
    run_worker()
    return session


def token_client(user: Any) -> Client:
    return Client(HTTP_AUTHORIZATION=f"Bearer {do_issue_token(user, 't')[1]}")


def logged_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.django_db(transaction=True)
def test_an_image_result_is_stored_as_media_and_shown_to_readers_only(
    people: dict[str, Any], everything_http: str, settings: Any
) -> None:
    encoded, png = tiny_image()
    digest = hashlib.sha256(png).hexdigest()
    session = image_session(people, everything_http, settings)

    (result,) = of_type(session, EventType.TOOL_RESULT)
    assert not result.get("is_error"), result
    assert result["media"] == [
        {"ref": f"sectr-media://{digest}", "kind": "image", "mime_type": "image/png", "bytes": len(png)}
    ]
    # What the model read names the image between the server's texts.
    assert re.search(r"Here's the image you requested:\n\[image image/png, \d+\.\d KB\]\nThe image", result["content"])
    # The bytes are the session's media, once; the journal holds none of them.
    assert SessionMedia.objects.filter(session=session, blob__sha256=digest).exists()
    assert MediaBlob.objects.get(sha256=digest).mime_type == "image/png"
    journal_rows = serializers.serialize("json", Envelope.objects.filter(session=session))
    assert encoded[:40] not in journal_rows and digest in journal_rows

    page_url = f"/sessions/{session.pk}/media/{digest}"
    api_url = f"/api/v1/sessions/{session.pk}/media/{digest}"
    # The owner and a team member read it; an outsider learns nothing (404), as for the session.
    for user in ("owner", "member"):
        response = logged_in(people[user]).get(page_url)
        assert response.status_code == 200 and response["Content-Type"] == "image/png"
        assert b"".join(response.streaming_content) == png
    assert logged_in(people["outsider"]).get(page_url).status_code == 404
    owner_api = token_client(people["owner"])
    response = owner_api.get(api_url)
    assert response.status_code == 200 and response.content == png and response["Content-Type"] == "image/png"
    assert response["X-Content-Type-Options"] == "nosniff"
    assert token_client(people["outsider"]).get(api_url).status_code == 404
    assert owner_api.get(f"/api/v1/sessions/{session.pk}/media/{'0' * 64}").status_code == 404
    assert Client().get(api_url).status_code == 401

    # The chat page shows it inline through the session's media view; so does the review page.
    chat = logged_in(people["owner"]).get(f"/sessions/{session.pk}/").content.decode()
    assert re.search(rf'<img src="{re.escape(page_url)}" alt="image image/png, [^"]+"', chat)
    review = logged_in(people["reviewer"]).get(f"/review/{session.pk}/").content.decode()
    assert f'<img src="{page_url}"' in review

    # The API: the transcript and the run's events list it with the URL a token fetches.
    transcript = owner_api.get(f"/api/v1/sessions/{session.pk}/transcript?view=history").json()
    (tool,) = [m for m in transcript["messages"] if m["role"] == "tool"]
    (listed,) = tool["tool_result"]["media"]
    assert listed["url"] == api_url and listed["ref"] == f"sectr-media://{digest}"
    envelopes = DatabaseJournal().load_sync(session.pk)
    (result_envelope,) = [e for e in envelopes if e.type is EventType.TOOL_RESULT]
    follower = RunEvents("run", {str(result_envelope.invocation_id)}, start_seq=1)
    (event,) = [e for e in follower.feed_all(envelopes) if e["kind"] == "tool.result"]
    assert event["payload"]["media"] == [listed]

    # The exports: the JSON holds the journal's references, the Markdown names them.
    export = owner_api.get(f"/api/v1/sessions/{session.pk}/export")
    assert f"sectr-media://{digest}" in export.content.decode() and encoded[:40] not in export.content.decode()
    markdown = owner_api.get(f"/api/v1/sessions/{session.pk}/export?format=markdown").content.decode()
    assert f"- image: image/png, {len(png) / 1024:.1f} KB <sectr-media://{digest}>" in markdown
    dump = "".join(serializers.serialize("json", model.objects.all()) for model in apps.get_models())
    assert encoded[:40] not in dump


@pytest.mark.django_db(transaction=True)
def test_an_image_over_the_media_limit_is_named_and_not_stored(
    people: dict[str, Any], everything_http: str, settings: Any
) -> None:
    settings.SECTR_MCP_MAX_MEDIA_BYTES = 1000
    session = image_session(people, everything_http, settings)
    (result,) = of_type(session, EventType.TOOL_RESULT)
    assert "media" not in result and not result.get("is_error")
    assert re.search(r"\[image image/png, \d+\.\d KB: not kept, over the 1000 bytes limit\]", result["content"])
    assert not MediaBlob.objects.exists()
    chat = logged_in(people["owner"]).get(f"/sessions/{session.pk}/").content.decode()
    assert "<img" not in chat.split('data-role="tool-call"', 1)[1]


@pytest.mark.django_db
def test_the_store_keeps_only_accepted_bytes_of_the_declared_type(people: dict[str, Any]) -> None:
    _, png = tiny_image()
    session = actions.do_create_session(people["owner"], team="crew")
    for kind, mime_type, data, why in (
        ("image", "image/jpeg", png, "its bytes are image/png, not image/jpeg"),
        ("audio", "audio/wav", png, "its bytes are not an accepted audio format"),
        ("image", "image/svg+xml", b"<svg onload='alert(1)'/>", "its bytes are not an accepted image format"),
    ):
        with pytest.raises(ValueError, match=re.escape(why)):
            store_result_media(session.pk, kind, mime_type, data)
    with pytest.raises(ValueError, match="the session is gone"):
        store_result_media("ses_" + "0" * 32, "image", "image/png", png)
    assert not MediaBlob.objects.exists()
    ref = store_result_media(session.pk, "image", "IMAGE/PNG", png)
    assert ref == "sectr-media://" + hashlib.sha256(png).hexdigest()
    assert store_result_media(session.pk, "image", "image/png", png) == ref  # once per sha256
    assert MediaBlob.objects.count() == 1 and SessionMedia.objects.filter(session=session).count() == 1


def test_audio_in_a_result_is_a_player_and_a_shared_page_only_names_media() -> None:
    from django.template.loader import render_to_string

    from sectr.events import Envelope as Env
    from sessions_app.chat.view_model import ChatViewModel
    from sessions_app.review.transcript import build_timeline

    sha = "ab" * 32
    media = [{"ref": f"sectr-media://{sha}", "kind": "audio", "mime_type": "audio/wav", "bytes": 44}]
    envelopes = [
        Env("ses_1", 1, "inv", EventType.MESSAGE_START, {"message_id": "m1", "model": "demo"}),
        Env("ses_1", 2, "inv", EventType.TOOL_CALL, {"message_id": "m1", "tool_call_id": "c1", "name": "s__t"}),
        Env("ses_1", 3, "inv", EventType.MESSAGE_END, {"message_id": "m1"}),
        Env(
            "ses_1",
            4,
            "inv",
            EventType.TOOL_RESULT,
            {"tool_call_id": "c1", "name": "s__t", "content": "x"} | {"media": media},
        ),
    ]
    call = ChatViewModel.from_envelopes("ses_1", envelopes).tool_calls["c1"]
    html = render_to_string("chat/_tool_call.html", {"call": call})
    assert f'<audio controls preload="none" src="/sessions/ses_1/media/{sha}"></audio>' in html
    assert "audio: audio/wav, 44 bytes" in html
    # Without a session to link to (a share link's page), the media are named, never fetched.
    (entry,) = [e for e in build_timeline(envelopes) if e.tool_calls]
    shared = render_to_string("review/_timeline.html", {"timeline": [entry]})
    assert "audio: audio/wav, 44 bytes" in shared and "<audio" not in shared and "/media/" not in shared
