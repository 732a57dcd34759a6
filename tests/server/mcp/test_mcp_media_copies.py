"""Media follow the journal where it is copied (docs/experiments.md, docs/review.md): a
replay reuses a recorded MCP result's image and serves it to its own readers, and an
export made with media restores it on import; without the bytes an import names the
image as not available in this installation, never a broken image, and never lends it
bytes another session holds."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import re
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command

from sectr.errors import ValidationFailed
from sectr.events import EventType
from sessions_app import actions
from sessions_app.experiments import actions as experiments
from sessions_app.models import MediaBlob, Session, SessionMedia
from sessions_app.review import export
from tests.server.conftest import work_until_idle

from .test_mcp_media import image_session, logged_in, tiny_image, token_client
from .test_mcp_runs import RUNTIME, of_type

E = EventType


@pytest.fixture(autouse=True)
def media_root(settings: Any, tmp_path: Path) -> Path:
    settings.MEDIA_ROOT = str(tmp_path / "media-root")
    return tmp_path


def digest_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.mark.django_db(transaction=True)
def test_a_replay_reuses_the_recorded_image_and_serves_it_to_its_readers_only(
    people: dict[str, Any], everything_http: str, settings: Any
) -> None:
    _, png = tiny_image()
    digest = digest_of(png)
    source = image_session(people, everything_http, settings)
    (recorded,) = of_type(source, E.TOOL_RESULT)
    assert recorded["media"][0]["ref"] == f"sectr-media://{digest}"

    experiment = experiments.do_create_experiment(
        people["moderator"], "crew", name="image replay", candidates=[{"agent": "crew/gitbot"}], sessions=[source.pk]
    )
    work_until_idle(RUNTIME, timeout=60, pending=True)
    (replay,) = experiment.replays.select_related("session")
    (replayed,) = of_type(replay.session, E.TOOL_RESULT)
    # The recorded result, media and all: the same reference, no second copy of the bytes.
    assert replayed["content"] == recorded["content"] and replayed["media"] == recorded["media"]
    assert MediaBlob.objects.count() == 1
    assert SessionMedia.objects.filter(session=replay.session, blob__sha256=digest).exists()

    page_url = f"/sessions/{replay.session_id}/media/{digest}"
    api_url = f"/api/v1/sessions/{replay.session_id}/media/{digest}"
    for user in ("member", "reviewer", "moderator"):
        response = logged_in(people[user]).get(page_url)
        assert response.status_code == 200 and b"".join(response.streaming_content) == png
    assert logged_in(people["outsider"]).get(page_url).status_code == 404
    assert token_client(people["reviewer"]).get(api_url).content == png
    assert token_client(people["outsider"]).get(api_url).status_code == 404

    # The comparison page shows the image on both sides, each through its own session.
    page = logged_in(people["reviewer"]).get(f"/review/experiments/{experiment.pk}/sessions/{source.pk}/")
    assert page.status_code == 200, page.status_code
    html = page.content.decode()
    assert f'<img src="/sessions/{source.pk}/media/{digest}"' in html
    assert f'<img src="{page_url}"' in html

    # The replay keeps its media when the recording is deleted.
    actions.do_delete(people["owner"], source.pk)
    response = logged_in(people["member"]).get(page_url)
    assert response.status_code == 200 and b"".join(response.streaming_content) == png


def document_of(response: Any) -> dict[str, Any]:
    assert response.status_code == 200, response.content[:300]
    return json.loads(response.content)


@pytest.mark.django_db(transaction=True)
def test_an_export_with_media_brings_the_image_back_on_import(
    people: dict[str, Any], everything_http: str, settings: Any, tmp_path: Path
) -> None:
    encoded, png = tiny_image()
    digest = digest_of(png)
    session = image_session(people, everything_http, settings)
    owner_api = token_client(people["owner"])
    assert "media" not in document_of(owner_api.get(f"/api/v1/sessions/{session.pk}/export"))
    assert owner_api.get(f"/api/v1/sessions/{session.pk}/export?media=yes").status_code == 400
    document = document_of(owner_api.get(f"/api/v1/sessions/{session.pk}/export?media=1"))
    assert document["media"] == [
        {"sha256": digest, "kind": "image", "mime_type": "image/png", "bytes": len(png), "data": encoded}
    ]
    # The review page's link gives the same.
    web = logged_in(people["reviewer"]).get(f"/review/{session.pk}/export.json?media=1")
    assert json.loads(web.content)["media"] == document["media"]
    path = tmp_path / "with-media.json"
    path.write_text(json.dumps(document))

    # Gone from this installation (the session deleted, its blob with it) ...
    actions.do_delete(people["owner"], session.pk)
    assert not MediaBlob.objects.exists()
    # ... and back with the import, linked to the new session.
    out = io.StringIO()
    call_command("sectr_import", str(path), owner="member", stdout=out)
    imported = Session.objects.get(pk=out.getvalue().split()[-1], owner=people["member"])
    assert SessionMedia.objects.filter(session=imported, blob__sha256=digest).exists()
    page_url = f"/sessions/{imported.pk}/media/{digest}"
    response = logged_in(people["member"]).get(page_url)
    assert response.status_code == 200 and b"".join(response.streaming_content) == png
    assert logged_in(people["outsider"]).get(page_url).status_code == 404
    chat = logged_in(people["member"]).get(f"/sessions/{imported.pk}/").content.decode()
    assert f'<img src="{page_url}"' in chat and "not available in this installation" not in chat

    # An import of the same file again reuses the stored bytes (one blob, two links).
    again = export.import_session(json.loads(path.read_text()), people["member"])
    assert MediaBlob.objects.count() == 1
    assert SessionMedia.objects.filter(blob__sha256=digest).count() == 2 and again.pk != imported.pk


@pytest.mark.django_db(transaction=True)
def test_an_import_without_the_bytes_names_the_image_as_not_available(
    people: dict[str, Any], everything_http: str, settings: Any
) -> None:
    _, png = tiny_image()
    digest = digest_of(png)
    session = image_session(people, everything_http, settings)
    document = document_of(token_client(people["owner"]).get(f"/api/v1/sessions/{session.pk}/export"))

    # The bytes are still here (the original session's): the import is not lent them.
    imported = export.import_session(document, people["reviewer"])
    assert not SessionMedia.objects.filter(session=imported).exists()
    (result,) = of_type(imported, E.TOOL_RESULT)
    assert result["media"][0]["ref"] == f"sectr-media://{digest}"  # the reference is kept
    reader = logged_in(people["reviewer"])
    assert reader.get(f"/sessions/{imported.pk}/media/{digest}").status_code == 404
    chat = reader.get(f"/sessions/{imported.pk}/")
    assert chat.status_code == 200
    tool_card = chat.content.decode().split('data-role="tool-call"', 1)[1]
    assert "<img" not in tool_card and f"/media/{digest}" not in tool_card
    assert re.search(r"image: image/png, [^<]+</span> <span [^>]*>\(not available in this installation\)", tool_card)
    review = logged_in(people["reviewer"]).get(f"/review/{imported.pk}/")
    assert review.status_code == 200
    html = review.content.decode()
    assert "(not available in this installation)" in html and f"/media/{digest}" not in html

    # An export of the import carries nothing it cannot read.
    again = document_of(token_client(people["reviewer"]).get(f"/api/v1/sessions/{imported.pk}/export?media=1"))
    assert again["media"] == []


@pytest.mark.django_db
def test_carried_media_that_break_the_rules_refuse_the_whole_import(people: dict[str, Any], settings: Any) -> None:
    encoded, png = tiny_image()
    digest = digest_of(png)
    session = actions.do_create_session(people["owner"], team="crew")
    part = {"type": "text", "text": "see"}
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + encoded}}
    actions.do_post_message_with_media(people["owner"], session.pk, [part, image], queue=True)
    document = export.export_document(Session.objects.get(pk=session.pk), people["owner"])
    (item,) = document["media"]
    assert item["sha256"] == digest and item["data"] == encoded  # a prompt's upload is carried too
    sessions_before = Session.objects.count()
    other = base64.b64encode(png + b"\0").decode()
    for changed, why in (
        ({"data": other}, "the bytes' sha256 is not"),
        ({"data": "not base64!"}, "not valid base64"),
        ({"mime_type": "image/jpeg"}, "declared image image/jpeg, but the bytes are image/png"),
        ({"kind": "video"}, "kind is image or audio"),
        ({"sha256": "X" * 64}, "64 lowercase hexadecimal"),
        ({"extra": 1}, "unknown key"),
    ):
        with pytest.raises(ValidationFailed, match=re.escape(why)):
            export.import_session(document | {"media": [item | changed]}, people["member"])
    with pytest.raises(ValidationFailed, match="listed twice"):
        export.import_session(document | {"media": [item, item]}, people["member"])
    unreferenced = {"sha256": "0" * 64, "kind": "image", "mime_type": "image/png", "bytes": 1}
    with pytest.raises(ValidationFailed, match="does not reference"):
        export.import_session(document | {"media": [item, unreferenced]}, people["member"])
    assert Session.objects.count() == sessions_before
    assert SessionMedia.objects.filter(session__owner=people["member"]).count() == 0

    # Past the export's cap an item is listed without its bytes, and the import keeps
    # the reference only.
    settings.SECTR_EXPORT_MEDIA_MAX_BYTES = 10
    capped = export.export_document(Session.objects.get(pk=session.pk), people["owner"])
    (listed,) = capped["media"]
    assert "data" not in listed and "SECTR_EXPORT_MEDIA_MAX_BYTES" in listed["omitted"]
    imported = export.import_session(capped, people["member"])
    assert not SessionMedia.objects.filter(session=imported).exists()
    chat = logged_in(people["member"]).get(f"/sessions/{imported.pk}/").content.decode()
    assert "(not available in this installation)" in chat and f"/media/{digest}" not in chat
