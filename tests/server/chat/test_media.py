"""Media parts (docs/sessions.md): validation, URL rules (including DNS resolution),
content-addressed storage, journal references, and what providers receive."""

from __future__ import annotations

import base64
import hashlib
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from sectr.errors import SessionBusy, ValidationFailed
from sectr.events import EventType
from sectr.providers.base import CompletionRequest, Finish, ModelInfo, StreamEvent, TextDelta
from sectr.providers.registry import lookup_model
from sessions_app import actions
from sessions_app.media import (
    MEDIA_SCHEME,
    PART_MAX_BYTES,
    PROMPT_MAX_BYTES,
    MediaResolvingProvider,
    check_media_url,
    resolve_media_references,
    sniff_mime,
    store_parts,
    validate_parts,
)
from sessions_app.models import Envelope, MediaBlob, Session, SessionMedia
from sessions_app.runtime import session_model_info


def store_validated(session: Any, parts: Any) -> list[dict[str, Any]]:
    """Validate parts for the session's model and store their media (as the post action does)."""
    return store_parts(session, validate_parts(parts, session_model_info(session.model)))


PNG = b"\x89PNG\r\n\x1a\n" + b"png-body" * 8
JPEG = b"\xff\xd8\xff\xe0" + b"jpeg-body" * 8
GIF = b"GIF89a" + b"\x00" * 16
WEBP = b"RIFF\x10\x00\x00\x00WEBPVP8 " + b"\x00" * 16
WAV = b"RIFF\x24\x00\x00\x00WAVEfmt " + b"\x00" * 32
MP3 = b"ID3\x03\x00" + b"\x00" * 32
FLAC = b"fLaC" + b"\x00" * 32
OGG = b"OggS" + b"\x00" * 32
DEMO = lookup_model("demo")
TEXT_ONLY = lookup_model("llama3.1")


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def image_part(data: bytes, mime: str = "image/png") -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": f"data:{mime};base64,{b64(data)}"}}


def audio_part(data: bytes, fmt: str = "wav") -> dict[str, Any]:
    return {"type": "input_audio", "input_audio": {"data": b64(data), "format": fmt}}


def refused(reason: str, parts: Any, info: ModelInfo = DEMO) -> str:
    with pytest.raises(ValidationFailed) as caught:
        validate_parts(parts, info)
    assert caught.value.code == reason, caught.value.message
    assert caught.value.status == 400
    return caught.value.message


@pytest.fixture(autouse=True)
def media_root(settings: Any, tmp_path: Path) -> Path:
    settings.MEDIA_ROOT = str(tmp_path)
    return tmp_path


@pytest.fixture
def resolver(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[str]]:
    """Fake DNS: host -> addresses (a host not listed does not resolve). No network."""
    table: dict[str, list[str]] = {}

    def getaddrinfo(host: str, port: Any, *args: Any, **kwargs: Any) -> list[Any]:
        if host not in table:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [
            (socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port)) for a in table[host]
        ]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return table


# ---- sniffing and parts ----


@pytest.mark.parametrize(
    ("data", "mime"),
    [
        (PNG, "image/png"),
        (JPEG, "image/jpeg"),
        (GIF, "image/gif"),
        (WEBP, "image/webp"),
        (WAV, "audio/wav"),
        (MP3, "audio/mpeg"),
        (FLAC, "audio/flac"),
        (OGG, "audio/ogg"),
        (b"<svg/>", None),
        (b"", None),
    ],
)
def test_it_sniffs_media_types_from_magic_numbers(data: bytes, mime: str | None) -> None:
    assert sniff_mime(data) == mime


def test_it_accepts_text_images_and_audio_for_a_capable_model() -> None:
    checked = validate_parts(
        [
            {"type": "text", "text": "what is this?"},
            image_part(PNG),
            image_part(JPEG, "image/jpeg"),
            audio_part(MP3, "mp3"),
        ],
        DEMO,
    )
    assert [c.mime_type for c in checked] == [None, "image/png", "image/jpeg", "audio/mpeg"]
    assert checked[1].data == PNG and checked[3].kind == "audio"


def test_it_refuses_media_the_model_cannot_take() -> None:
    assert "does not accept images" in refused("capability", [image_part(PNG)], TEXT_ONLY)
    assert "does not accept audio" in refused("capability", [audio_part(WAV)], TEXT_ONLY)
    assert "does not accept audio" in refused("capability", [audio_part(WAV)], lookup_model("gpt-4o"))
    validate_parts([audio_part(WAV)], lookup_model("gpt-4o-audio-preview"))


def test_it_checks_declared_types_against_the_bytes() -> None:
    refused("mime_type", [image_part(JPEG, "image/png")])
    refused("mime_type", [image_part(WAV, "image/png")])
    refused("mime_type", [image_part(b"<svg onload=x>", "image/svg+xml")])
    refused("mime_type", [audio_part(PNG, "wav")])
    refused("mime_type", [audio_part(WAV, "mp3")])
    refused("mime_type", [audio_part(WAV, "aiff")])


def test_it_enforces_the_size_and_count_limits() -> None:
    validate_parts([image_part(PNG + b"\x00" * (PART_MAX_BYTES - len(PNG)))], DEMO)  # exactly 10 MiB
    refused("size", [image_part(PNG + b"\x00" * (PART_MAX_BYTES - len(PNG) + 1))])
    half = PNG + b"\x01" * (PROMPT_MAX_BYTES // 2 - len(PNG))
    validate_parts([image_part(half), image_part(half)], DEMO)  # exactly 20 MiB
    refused("size", [image_part(half), image_part(half), image_part(PNG)])
    validate_parts([{"type": "text", "text": "x"}] * 16, DEMO)
    assert "at most 16 parts" in refused("prompt", [{"type": "text", "text": "x"}] * 17)
    refused("prompt", [])
    refused("prompt", "not a list")
    refused("prompt", [{"type": "text", "text": "   "}])
    refused("prompt", [{"type": "text", "text": "x" * 200_001}])


# ---- URLs ----


def test_public_https_urls_pass_by_reference(resolver: dict[str, list[str]]) -> None:
    resolver["images.example"] = ["93.184.215.14", "2606:2800:21f:cb07:6820:80da:af6b:8b2c"]
    assert check_media_url("https://images.example/cat.png") == "https://images.example/cat.png"
    assert check_media_url("https://93.184.215.14:8443/cat.png?x=1")
    # A NAT64 address is as public as the IPv4 it embeds (93.184.215.14).
    assert check_media_url("https://[64:ff9b::5db8:d70e]/cat.png")
    (checked,) = validate_parts([{"type": "image_url", "image_url": {"url": "https://images.example/a.png"}}], DEMO)
    assert checked.data is None and checked.part == {
        "type": "image_url",
        "image_url": {"url": "https://images.example/a.png"},
    }


@pytest.mark.parametrize(
    "url",
    [
        "http://93.184.215.14/cat.png",
        "HTTP://93.184.215.14/cat.png",
        "//93.184.215.14/cat.png",
        "/cat.png",
        "ftp://93.184.215.14/cat.png",
        "gopher://93.184.215.14/",
        "https://127.0.0.1/",
        "https://127.0.0.2/",
        "https://127.1/",
        "https://2130706433/",
        "https://0x7f000001/",
        "https://0.0.0.0/",
        "https://10.0.0.1/",
        "https://172.16.5.4/",
        "https://192.168.0.10/",
        "https://100.64.0.1/",
        "https://169.254.169.254/latest/meta-data/",
        "https://[::1]/",
        "https://[::]/",
        "https://[fe80::1]/",
        "https://[fd00:ec2::254]/",
        "https://[::ffff:127.0.0.1]/",
        "https://[::ffff:169.254.169.254]/",
        "https://[2002:7f00:1::]/",
        # IPv6 forms that embed an IPv4 address: NAT64, IPv4-compatible, SIIT-translated.
        "https://[64:ff9b::a9fe:a9fe]/",
        "https://[64:ff9b::7f00:1]/",
        "https://[64:ff9b:1::a00:1]/",
        "https://[::a9fe:a9fe]/",
        "https://[::127.0.0.1]/",
        "https://[::ffff:0:7f00:1]/",
        "https://[::ffff:0:a9fe:a9fe]/",
        "https://[2001::1]/",
        "https://[2001:db8::1]/",
        "https://[100::1]/",
        "https://240.0.0.1/",
        "https://255.255.255.255/",
        "https://198.18.0.1/",
        "https://[ff02::1]/",
        "https://224.0.0.1/",
        "https://localhost/",
        "https://LOCALHOST./",
        "https://api.localhost/",
        "https://metadata.google.internal/computeMetadata/v1/",
        "https://printer.local/",
        "https://user:secret@93.184.215.14/",
        "https://93.184.215.14:99999/",
        "https:///nohost",
        "https://exa mple.com/",
        "https://example.com/\r\nHost: evil",
        "",
        "https://" + "a" * 3000 + ".com/",
    ],
)
def test_it_refuses_urls_that_are_not_public_https(url: str, resolver: dict[str, list[str]]) -> None:
    with pytest.raises(ValidationFailed) as caught:
        check_media_url(url)
    assert caught.value.code == "url"


def test_it_refuses_host_names_that_resolve_to_private_addresses(resolver: dict[str, list[str]]) -> None:
    resolver["rebind.example"] = ["127.0.0.1"]
    resolver["internal.example"] = ["10.1.2.3"]
    resolver["metadata.example"] = ["169.254.169.254"]
    resolver["v6.example"] = ["::1"]
    resolver["mixed.example"] = ["93.184.215.14", "192.168.1.1"]  # one bad address is enough
    resolver["nat64.example"] = ["64:ff9b::a9fe:a9fe"]  # a AAAA answer embedding 169.254.169.254
    hosts = ("rebind.example", "internal.example", "metadata.example", "v6.example", "mixed.example", "nat64.example")
    for host in (*hosts, "nx.example"):
        with pytest.raises(ValidationFailed) as caught:
            check_media_url(f"https://{host}/cat.png")
        assert caught.value.code == "url", host
    refused("url", [{"type": "image_url", "image_url": {"url": "https://rebind.example/a.png"}}])


def test_localhost_is_refused_by_resolution_too(monkeypatch: pytest.MonkeyPatch) -> None:
    # Without the name list, the real resolver (/etc/hosts) still maps localhost to loopback.
    monkeypatch.setattr("sessions_app.addresses.BLOCKED_HOSTNAMES", frozenset())
    monkeypatch.setattr("sessions_app.addresses.BLOCKED_HOST_SUFFIXES", ())
    with pytest.raises(ValidationFailed) as caught:
        check_media_url("https://localhost/cat.png")
    assert caught.value.code == "url" and "loopback" in caught.value.message


def test_audio_must_be_uploaded() -> None:
    part = {"type": "input_audio", "input_audio": {"url": "https://93.184.215.14/a.wav", "format": "wav"}}
    assert "uploaded" in refused("url", [part])
    bad = {"type": "input_audio", "input_audio": {"url": "https://127.0.0.1/a.wav", "format": "wav"}}
    assert "loopback" in refused("url", [bad])


# ---- storage and the journal ----


def test_it_stores_each_blob_once_and_links_it_to_every_session(make_session: Any, media_root: Path) -> None:
    first, second = make_session(title="one"), make_session(title="two")
    parts = [{"type": "text", "text": "hi"}, image_part(PNG), audio_part(WAV)]
    stored = store_validated(first, parts)
    again = store_validated(second, parts)
    digest = hashlib.sha256(PNG).hexdigest()
    assert stored == again
    assert stored[1] == {
        "type": "image_url",
        "image_url": {"url": f"{MEDIA_SCHEME}{digest}"},
        "mime_type": "image/png",
        "size": len(PNG),
    }
    assert stored[2]["input_audio"] == {"url": MEDIA_SCHEME + hashlib.sha256(WAV).hexdigest(), "format": "wav"}
    assert MediaBlob.objects.count() == 2
    assert SessionMedia.objects.filter(blob__sha256=digest).count() == 2
    assert (media_root / "media" / digest[:2] / digest).read_bytes() == PNG
    assert sum(1 for p in media_root.rglob("*") if p.is_file()) == 2


@pytest.mark.django_db(transaction=True)
def test_a_prompt_with_media_journals_references_and_delete_removes_them(
    make_session: Any, owner: Any, media_root: Path
) -> None:
    session = make_session(title="pics")
    run = actions.do_post_message_with_media(owner, session.pk, [{"type": "text", "text": "see"}, image_part(PNG)])
    start = Envelope.objects.get(session=session, type=EventType.INVOCATION_STARTED.value)
    content = start.payload["reason"]["input"]["content"]
    assert run.invocation_id == start.invocation_id
    assert content[1]["image_url"]["url"].startswith(MEDIA_SCHEME)
    assert b64(PNG) not in str(start.payload), "the journal holds a reference, never the bytes"
    # A second prompt while the run is active is refused (409) and stores nothing new.
    with pytest.raises(SessionBusy):
        actions.do_post_message_with_media(owner, session.pk, [image_part(JPEG, "image/jpeg")])
    assert MediaBlob.objects.count() == 1 and sum(1 for p in media_root.rglob("*") if p.is_file()) == 1
    actions.do_cancel(owner, run.pk)
    actions.do_delete(owner, session.pk)
    assert not Session.objects.filter(pk=session.pk).exists()
    assert MediaBlob.objects.count() == 0 and SessionMedia.objects.count() == 0
    assert not any(p.is_file() for p in media_root.rglob("*")), "deleting the session deleted its media"


def test_a_refused_part_stores_and_journals_nothing(make_session: Any, owner: Any, media_root: Path) -> None:
    session = make_session(title="nothing")
    before = Envelope.objects.filter(session=session).count()
    for parts in (
        [image_part(PNG), image_part(JPEG, "image/png")],
        [image_part(PNG), {"type": "image_url", "image_url": {"url": "https://10.0.0.1/x"}}],
    ):
        with pytest.raises(ValidationFailed):
            actions.do_post_message_with_media(owner, session.pk, parts)
    assert Envelope.objects.filter(session=session).count() == before
    assert MediaBlob.objects.count() == 0 and not any(media_root.rglob("*"))


# ---- what providers receive ----


def test_references_become_inline_data_for_providers(make_session: Any) -> None:
    session = make_session(title="resolve")
    stored = store_validated(session, [{"type": "text", "text": "hi"}, image_part(PNG), audio_part(WAV)])
    url_part = {"type": "image_url", "image_url": {"url": "https://93.184.215.14/a.png"}, "mime_type": "image/png"}
    missing = {"type": "image_url", "image_url": {"url": MEDIA_SCHEME + "0" * 64}, "mime_type": "image/png", "size": 1}
    messages = [{"role": "user", "content": [*stored, url_part, missing]}, {"role": "assistant", "content": "ok"}]
    resolved = resolve_media_references(messages)
    parts = resolved[0]["content"]
    assert parts[0] == {"type": "text", "text": "hi"}
    assert parts[1] == {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{b64(PNG)}"}}
    assert parts[2] == {"type": "input_audio", "input_audio": {"format": "wav", "data": b64(WAV)}}
    assert parts[3] == {"type": "image_url", "image_url": {"url": "https://93.184.215.14/a.png"}}, (
        "URLs pass by reference"
    )
    assert parts[4]["type"] == "text" and "no longer available" in parts[4]["text"]
    assert resolved[1] == messages[1]
    assert messages[0]["content"][1]["image_url"]["url"].startswith(MEDIA_SCHEME), "the input is not changed"


class RecordingProvider:
    provider_id = "recording"

    def __init__(self) -> None:
        self.requests: list[CompletionRequest] = []

    def model_info(self, model: str) -> ModelInfo:
        return ModelInfo(model, self.provider_id, 1000, image_input=True)

    async def stream(self, request: CompletionRequest) -> AsyncIterator[StreamEvent]:
        self.requests.append(request)
        yield TextDelta("seen")
        yield Finish("stop", {"input_tokens": 1, "output_tokens": 1})


@pytest.fixture
def stored_image(make_session: Any) -> list[dict[str, Any]]:
    return store_validated(make_session(title="wrapped"), [image_part(PNG)])


@pytest.mark.django_db(transaction=True)
async def test_the_provider_wrapper_hands_inline_media_to_the_model(stored_image: list[dict[str, Any]]) -> None:
    stored = stored_image
    inner = RecordingProvider()
    provider = MediaResolvingProvider(inner)
    assert provider.provider_id == "recording" and provider.model_info("m").image_input
    request = CompletionRequest(model="m", messages=[{"role": "user", "content": stored}])
    events = [event async for event in provider.stream(request)]
    assert events[0] == TextDelta("seen")
    (sent,) = inner.requests
    assert sent.messages[0]["content"][0]["image_url"]["url"] == f"data:image/png;base64,{b64(PNG)}"
    plain = CompletionRequest(model="m", messages=[{"role": "user", "content": "no media"}])
    _ = [event async for event in provider.stream(plain)]
    assert inner.requests[-1] is plain, "requests without media pass through untouched"


def test_the_process_runtime_hands_providers_resolved_media() -> None:
    from sessions_app.runtime import get_runtime

    assert isinstance(get_runtime().provider, MediaResolvingProvider)
