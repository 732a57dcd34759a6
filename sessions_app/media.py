"""Image and audio parts of a prompt: validation, content-addressed storage, and the
references providers get (docs/sessions.md, "Media").

A prompt's content is a string or a list of OpenAI content parts:

* ``{"type": "text", "text": "..."}``
* ``{"type": "image_url", "image_url": {"url": "data:image/png;base64,...", "detail"?}}``
  (an upload) or ``{"type": "image_url", "image_url": {"url": "https://..."}, "mime_type"?}``
* ``{"type": "input_audio", "input_audio": {"data": "<base64>", "format": "wav"}}``
  (an upload; formats wav, mp3, flac, ogg)

Rules, each refusal a ValidationFailed (400) whose code names the reason:

* ``prompt``: not a list of parts, more than 16 parts, a malformed part (unknown type,
  missing fields, bad base64), text over 200,000 characters;
* ``capability``: an image for a model without image input, audio for one without
  audio input (the model registry, sectr.providers.registry, decides);
* ``mime_type``: the declared type is not an accepted image/audio type, or the bytes
  (sniffed from their magic numbers) are not what the part declares;
* ``size``: a part over 10 MiB, or the parts of one prompt over 20 MiB together;
* ``url``: a URL that is not absolute ``https``, carries credentials, or whose host is
  (or resolves, by DNS, to) a loopback, private, link-local, shared, reserved,
  multicast or cloud-metadata address. Audio must be uploaded (providers take audio
  inline only).

Validation writes nothing. Storing happens after every part passed: the bytes are
stored once per sha256 (MediaBlob, a file under MEDIA_ROOT) and linked to the session
(SessionMedia, so deleting the session deletes its media), and the journal holds a
reference, never the bytes::

    {"type": "image_url", "image_url": {"url": "sectr-media://<sha256>"}, "mime_type": "image/png", "size": 1234}
    {"type": "input_audio", "input_audio": {"url": "sectr-media://<sha256>", "format": "wav"},
     "mime_type": "audio/wav", "size": 5678}

URL parts are journaled as the URL and are never fetched by Sectr: the provider
receives the URL by reference and fetches it itself. The address checks are made when
the prompt is accepted (before anything is journaled).

Before a model call, `resolve_media_references(messages)` turns references back into
what OpenAI-compatible providers take (``data:`` URLs for images, base64 ``data`` for
audio) and strips Sectr's extra keys; `MediaResolvingProvider` wraps a provider so that
this happens inside its `stream` (see its docstring).
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import logging
import re
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from django.core.files.base import ContentFile
from django.core.files.storage import default_storage
from django.db import transaction

from sectr.errors import ValidationFailed
from sectr.providers.base import CompletionRequest, ModelInfo, Provider, StreamEvent
from sessions_app.addresses import BLOCKED_NAME, UNRESOLVABLE, AddressRefused, check_public_host
from sessions_app.dbthread import run_in_db_thread
from sessions_app.models import MediaBlob, Session, SessionMedia

log = logging.getLogger("sectr.media")

MEDIA_SCHEME = "sectr-media://"
MIB = 1024 * 1024
PART_MAX_BYTES = 10 * MIB
PROMPT_MAX_BYTES = 20 * MIB
PROMPT_MAX_PARTS = 16
TEXT_MAX_CHARS = 200_000
URL_MAX_LENGTH = 2048

IMAGE_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp")
AUDIO_FORMATS = {"wav": "audio/wav", "mp3": "audio/mpeg", "flac": "audio/flac", "ogg": "audio/ogg"}


def refuse(reason: str, message: str) -> ValidationFailed:
    return ValidationFailed(message, code=reason)


# ---- sniffing ----


def sniff_mime(data: bytes) -> str | None:
    """The media type the bytes' magic numbers announce (the accepted types only)."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if data.startswith((b"GIF87a", b"GIF89a")):
        return "image/gif"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    if data[:4] == b"RIFF" and data[8:12] == b"WAVE":
        return "audio/wav"
    if data.startswith(b"fLaC"):
        return "audio/flac"
    if data.startswith(b"OggS"):
        return "audio/ogg"
    if data.startswith(b"ID3") or (len(data) > 1 and data[0] == 0xFF and data[1] & 0xE0 == 0xE0):
        return "audio/mpeg"  # an ID3 tag, or an MPEG audio frame sync
    return None


# ---- URLs ----


def check_media_url(url: Any) -> str:
    """`url` if it may be handed to a provider; ValidationFailed(code="url") otherwise.

    The host goes through the address guard webhooks use too
    (sessions_app.addresses.check_public_host: resolved, and refused when any address
    it resolves to is not public). Nothing is fetched.
    """
    if not isinstance(url, str) or not url or len(url) > URL_MAX_LENGTH:
        raise refuse("url", f"a media URL is a string of at most {URL_MAX_LENGTH} characters")
    if any(ch.isspace() or ord(ch) < 32 for ch in url):
        raise refuse("url", "a media URL must not contain spaces or control characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise refuse("url", "the media URL is malformed") from None
    if parts.scheme.lower() != "https":
        raise refuse("url", "media URLs must be absolute https URLs")
    host = (parts.hostname or "").rstrip(".").lower()
    if not host:
        raise refuse("url", "the media URL has no host")
    if parts.username is not None or parts.password is not None:
        raise refuse("url", "media URLs must not carry credentials")
    try:
        check_public_host(host, port or 443)
    except AddressRefused as refused:
        if refused.kind == BLOCKED_NAME:
            raise refuse("url", f"media URLs must not point at {host}") from None
        if refused.kind == UNRESOLVABLE:
            raise refuse("url", f"the media URL's host {host} does not resolve") from None
        message = "media URLs must not point at loopback, private, link-local or metadata addresses"
        raise refuse("url", message) from None
    return url


# ---- validation ----


@dataclass(frozen=True)
class CheckedPart:
    """A part that passed validation: `part` as it will be journaled, or bytes to store."""

    part: dict[str, Any]
    data: bytes | None = None
    mime_type: str | None = None
    kind: str | None = None  # "image" or "audio" for stored media

    @property
    def size(self) -> int:
        return len(self.data) if self.data is not None else 0


def _decode_base64(text: Any, what: str) -> bytes:
    if not isinstance(text, str) or not text:
        raise refuse("prompt", f"{what} needs base64 data")
    if len(text) * 3 // 4 > PART_MAX_BYTES + 3:  # refuse before decoding megabytes
        raise refuse("size", f"{what} is larger than {PART_MAX_BYTES // MIB} MiB")
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise refuse("prompt", f"{what} is not valid base64") from None
    if not data:
        raise refuse("prompt", f"{what} is empty")
    if len(data) > PART_MAX_BYTES:
        raise refuse("size", f"{what} is larger than {PART_MAX_BYTES // MIB} MiB")
    return data


def _check_bytes(data: bytes, declared: str, what: str) -> None:
    sniffed = sniff_mime(data)
    if sniffed != declared:
        found = sniffed or "not a recognised image or audio format"
        raise refuse("mime_type", f"{what} is declared {declared} but its bytes are {found}")


def _check_image(part: dict[str, Any], info: ModelInfo, what: str) -> CheckedPart:
    if not info.image_input:
        raise refuse("capability", f"the model {info.model_id} does not accept images")
    image = part.get("image_url")
    if not isinstance(image, dict) or not isinstance(image.get("url"), str):
        raise refuse("prompt", f"{what} needs image_url.url (a data: URL or an https URL)")
    url: str = image["url"]
    detail = image.get("detail")
    if detail is not None and detail not in ("auto", "low", "high"):
        raise refuse("prompt", f"{what}: image_url.detail is auto, low or high")
    extra = {"detail": detail} if detail else {}
    if url[:5].lower() == "data:":
        header, sep, payload = url[5:].partition(",")
        media_type, _, encoding = header.partition(";")
        if not sep or encoding.lower() != "base64":
            raise refuse("prompt", f"{what}: a data: URL must be data:<type>;base64,<data>")
        declared = media_type.strip().lower()
        if declared not in IMAGE_TYPES:
            raise refuse("mime_type", f"{what}: images are {', '.join(IMAGE_TYPES)}, not {declared or 'untyped'}")
        data = _decode_base64(payload, what)
        _check_bytes(data, declared, what)
        return CheckedPart({"type": "image_url", "image_url": extra}, data, declared, "image")
    declared_type = part.get("mime_type")
    if declared_type is not None and declared_type not in IMAGE_TYPES:
        raise refuse("mime_type", f"{what}: images are {', '.join(IMAGE_TYPES)}")
    checked = {"type": "image_url", "image_url": {"url": check_media_url(url), **extra}}
    if declared_type:
        checked["mime_type"] = declared_type
    return CheckedPart(checked)


def _check_audio(part: dict[str, Any], info: ModelInfo, what: str) -> CheckedPart:
    if not info.audio_input:
        raise refuse("capability", f"the model {info.model_id} does not accept audio")
    audio = part.get("input_audio")
    if not isinstance(audio, dict):
        raise refuse("prompt", f"{what} needs input_audio: {{data, format}}")
    if "url" in audio and "data" not in audio:
        check_media_url(audio["url"])  # a bad address is named as such
        raise refuse("url", f"{what}: audio must be uploaded as data (providers take audio inline only)")
    audio_format = audio.get("format")
    if not isinstance(audio_format, str) or audio_format.lower() not in AUDIO_FORMATS:
        raise refuse("mime_type", f"{what}: audio formats are {', '.join(AUDIO_FORMATS)}")
    audio_format = audio_format.lower()
    declared = AUDIO_FORMATS[audio_format]
    data = _decode_base64(audio.get("data"), what)
    _check_bytes(data, declared, what)
    return CheckedPart({"type": "input_audio", "input_audio": {"format": audio_format}}, data, declared, "audio")


def validate_parts(parts: Any, info: ModelInfo) -> list[CheckedPart]:
    """Check a prompt's parts against the rules above for the model `info`; writes nothing."""
    if not isinstance(parts, list) or not parts:
        raise refuse("prompt", "content must be a string or a non-empty list of parts")
    if len(parts) > PROMPT_MAX_PARTS:
        raise refuse("prompt", f"a prompt has at most {PROMPT_MAX_PARTS} parts, not {len(parts)}")
    checked: list[CheckedPart] = []
    text_chars = 0
    for index, part in enumerate(parts):
        what = f"part {index}"
        if not isinstance(part, dict):
            raise refuse("prompt", f"{what} is not an object")
        kind = part.get("type")
        if kind == "text":
            text = part.get("text")
            if not isinstance(text, str):
                raise refuse("prompt", f"{what}: a text part needs a string text")
            text_chars += len(text)
            checked.append(CheckedPart({"type": "text", "text": text}))
        elif kind == "image_url":
            checked.append(_check_image(part, info, what))
        elif kind == "input_audio":
            checked.append(_check_audio(part, info, what))
        else:
            raise refuse("prompt", f"{what}: the type must be text, image_url or input_audio")
    if text_chars > TEXT_MAX_CHARS:
        raise refuse("prompt", f"the prompt's text is longer than {TEXT_MAX_CHARS:,} characters")
    if not any(p.data is not None or p.part["type"] != "text" or p.part["text"].strip() for p in checked):
        raise refuse("prompt", "the message is empty")
    total = sum(p.size for p in checked)
    if total > PROMPT_MAX_BYTES:
        raise refuse("size", f"the parts of a prompt are at most {PROMPT_MAX_BYTES // MIB} MiB together")
    return checked


# ---- storage ----


def blob_path(sha256: str) -> str:
    return f"media/{sha256[:2]}/{sha256}"


def media_reference(sha256: str) -> str:
    return MEDIA_SCHEME + sha256


def store_blob(data: bytes, mime_type: str, kind: str, created: list[str]) -> MediaBlob:
    digest = hashlib.sha256(data).hexdigest()
    blob = MediaBlob.objects.filter(sha256=digest).first()
    if blob is not None:
        return blob
    name = blob_path(digest)
    if not default_storage.exists(name):
        name = default_storage.save(name, ContentFile(data))
        created.append(name)
    blob, _ = MediaBlob.objects.get_or_create(
        sha256=digest, defaults={"mime_type": mime_type, "size": len(data), "kind": kind, "file": name}
    )
    return blob


def store_parts(
    session: Session, checked: Iterable[CheckedPart], created_files: list[str] | None = None
) -> list[dict[str, Any]]:
    """Store the uploaded bytes (once per sha256), link them to `session`, and return the
    parts as the journal holds them. Call inside the transaction that journals them."""
    created = created_files if created_files is not None else []
    parts: list[dict[str, Any]] = []
    for item in checked:
        if item.data is None or item.mime_type is None or item.kind is None:
            parts.append(item.part)
            continue
        blob = store_blob(item.data, item.mime_type, item.kind, created)
        SessionMedia.objects.get_or_create(session=session, blob=blob)
        reference = media_reference(blob.sha256)
        if item.kind == "image":
            part = {"type": "image_url", "image_url": {"url": reference, **item.part["image_url"]}}
        else:
            part = {"type": "input_audio", "input_audio": {"url": reference, **item.part["input_audio"]}}
        parts.append({**part, "mime_type": item.mime_type, "size": len(item.data)})
    return parts


def forget_files(names: list[str]) -> None:
    """Remove files written by a transaction that rolled back (unless another request's
    committed blob uses the same content)."""
    for name in names:
        digest = name.rsplit("/", 1)[-1]
        if not MediaBlob.objects.filter(sha256=digest).exists():
            try:
                default_storage.delete(name)
            except OSError:
                log.warning("could not remove orphaned media file %s", name, exc_info=True)


# ---- media of tool results ----

#: Other names MCP servers give the accepted types.
_MIME_ALIASES = {
    "image/jpg": "image/jpeg",
    "audio/x-wav": "audio/wav",
    "audio/wave": "audio/wav",
    "audio/mp3": "audio/mpeg",
}


def store_result_media(session_id: str, kind: str, mime_type: str, data: bytes) -> str:
    """Store an image or audio of a tool's result as `session_id`'s media (once per
    sha256, like an upload) and return its reference. ValueError, saying why, for bytes
    that are not an accepted image/audio type, or not the type they are declared as
    (what is stored is served with that type), or a session that is gone."""
    declared = _MIME_ALIASES.get(mime_type.lower(), mime_type.lower())
    sniffed = sniff_mime(data)
    if sniffed is None or not sniffed.startswith(f"{kind}/"):
        raise ValueError(f"its bytes are not an accepted {kind} format")
    if sniffed != declared:
        raise ValueError(f"its bytes are {sniffed}, not {mime_type}")
    created: list[str] = []
    try:
        with transaction.atomic():
            session = Session.objects.filter(pk=session_id).first()
            if session is None:
                raise ValueError("the session is gone")
            blob = store_blob(data, sniffed, kind, created)
            SessionMedia.objects.get_or_create(session=session, blob=blob)
    except OSError as exc:  # the media directory: the result names it as not kept
        forget_files(created)
        log.warning("could not store a tool result's %s for session %s", kind, session_id, exc_info=True)
        raise ValueError("it could not be stored") from exc
    except BaseException:
        forget_files(created)
        raise
    return media_reference(blob.sha256)


async def store_tool_media(session_id: str | None, media: Any) -> str:
    """The media-store hook of a worker's MCP connections (sectr.mcp.MediaStore): the
    bytes become the session's media, in a database thread."""
    if not session_id:
        raise ValueError("the call belongs to no session")
    return await run_in_db_thread(store_result_media, session_id, media.kind, media.mime_type, media.data)


# ---- serving ----

SHA256_TEXT = re.compile(r"[0-9a-f]{64}")


def readable_blob(user: Any, session: Session, sha256: str) -> MediaBlob | None:
    """The stored media `sha256` of `session`, for `user`, who may read the session: a
    prompt's part or a tool result's image. A fork's inherited messages reference media
    linked to the session it came from, so the fork chain is followed (while the user
    may read each session on it). None: not this session's (or not the user's to read)."""
    from sessions_app import access

    if not SHA256_TEXT.fullmatch(sha256):
        return None
    for _ in range(20):
        blob = MediaBlob.objects.filter(sha256=sha256, sessions__session=session).first()
        if blob is not None:
            return blob
        origin = session.projection().forked_from
        parent = Session.objects.filter(pk=origin.get("session_id")).first() if origin else None
        if parent is None or parent.pk == session.pk or not access.can_read(user, parent):
            return None
        session = parent
    return None


def media_digests(value: Any, found: set[str] | None = None) -> set[str]:
    """The sha256 of every ``sectr-media://`` reference in a journal value (a payload, a
    prompt's parts, a result's media), wherever it sits."""
    found = set() if found is None else found
    if isinstance(value, str):
        if value.startswith(MEDIA_SCHEME) and SHA256_TEXT.fullmatch(value[len(MEDIA_SCHEME) :]):
            found.add(value[len(MEDIA_SCHEME) :])
    elif isinstance(value, dict):
        for item in value.values():
            media_digests(item, found)
    elif isinstance(value, list | tuple):
        for item in value:
            media_digests(item, found)
    return found


def readable_digests(user: Any, session: Session, digests: Iterable[str]) -> set[str]:
    """Which of `digests` `readable_blob` would serve `user` through `session` (one query
    per session of the fork chain, not one per medium)."""
    from sessions_app import access

    wanted = {d for d in digests if SHA256_TEXT.fullmatch(d)}
    readable: set[str] = set()
    for _ in range(20):
        if not wanted - readable:
            break
        readable.update(
            MediaBlob.objects.filter(sha256__in=wanted - readable, sessions__session=session).values_list(
                "sha256", flat=True
            )
        )
        origin = session.projection().forked_from
        parent = Session.objects.filter(pk=origin.get("session_id")).first() if origin else None
        if parent is None or parent.pk == session.pk or not access.can_read(user, parent):
            break
        session = parent
    return readable


def missing_media(user: Any, session: Session, values: Iterable[Any]) -> frozenset[str]:
    """The media `values` (payloads) reference that `user` cannot read through `session`:
    an imported journal's media whose bytes its file did not carry, or a blob since
    gone. Pages show these as "not available in this installation", not as a broken
    image (sessions_app.display.content)."""
    digests: set[str] = set()
    for value in values:
        media_digests(value, digests)
    return frozenset(digests - readable_digests(user, session, digests)) if digests else frozenset()


def share_media(user: Any, source: Session, target: Session, digests: Iterable[str]) -> int:
    """Link to `target` the media among `digests` that `user` may read through `source`
    (as `store_parts` links an upload): a replay then serves its source's images to its
    own readers, and keeps them when the source is deleted. Returns how many it linked."""
    readable = readable_digests(user, source, digests)
    blobs = MediaBlob.objects.filter(sha256__in=readable)
    for blob in blobs:
        SessionMedia.objects.get_or_create(session=target, blob=blob)
    return len(readable)


# ---- references -> provider input ----


def _blob_data(sha256: str) -> tuple[str, bytes] | None:
    blob = MediaBlob.objects.filter(sha256=sha256).first()
    if blob is None:
        return None
    try:
        with blob.file.open("rb") as handle:
            return blob.mime_type, handle.read()
    except OSError:
        log.warning("media blob %s has no readable file", sha256)
        return None


def has_media_references(messages: Iterable[dict[str, Any]]) -> bool:
    return any(isinstance(m.get("content"), list) and any(_is_media(p) for p in m["content"]) for m in messages)


def _is_media(part: Any) -> bool:
    return isinstance(part, dict) and part.get("type") in ("image_url", "input_audio")


def resolve_media_references(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages as a provider takes them: `sectr-media://` references become inline
    data (``data:`` URLs for images, base64 ``data`` for audio) and parts lose Sectr's
    extra keys. A blob that no longer exists becomes a text part saying so.

    Sync (reads the database and files): call it from a thread, e.g. through
    sessions_app.dbthread.run_in_db_thread. Returns new lists; `messages` is unchanged.
    """
    cache: dict[str, tuple[str, bytes] | None] = {}

    def load(reference: str) -> tuple[str, bytes] | None:
        digest = reference[len(MEDIA_SCHEME) :]
        if digest not in cache:
            cache[digest] = _blob_data(digest)
        return cache[digest]

    def resolve(part: dict[str, Any]) -> dict[str, Any]:
        if part.get("type") == "image_url":
            image = dict(part.get("image_url") or {})
            url = str(image.get("url", ""))
            if url.startswith(MEDIA_SCHEME):
                found = load(url)
                if found is None:
                    return {"type": "text", "text": "[an image that is no longer available]"}
                image["url"] = f"data:{found[0]};base64,{base64.b64encode(found[1]).decode()}"
            return {"type": "image_url", "image_url": image}
        if part.get("type") == "input_audio":
            audio = dict(part.get("input_audio") or {})
            url = str(audio.pop("url", ""))
            if url.startswith(MEDIA_SCHEME):
                found = load(url)
                if found is None:
                    return {"type": "text", "text": "[an audio clip that is no longer available]"}
                audio["data"] = base64.b64encode(found[1]).decode()
            return {"type": "input_audio", "input_audio": audio}
        return part

    resolved = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list) and any(_is_media(p) for p in content):
            message = {**message, "content": [resolve(p) if _is_media(p) else p for p in content]}
        resolved.append(message)
    return resolved


class MediaResolvingProvider:
    """A provider that hands its inner provider inline media instead of references.

    Wire it where the process builds its Runtime (sessions_app.runtime)::

        Runtime(get_journal(), handler=..., tools=...,
                provider=MediaResolvingProvider(configured_provider()))

    Every model call (the agent's steps and compaction summaries alike) then goes
    through `stream`, which resolves references in a database thread first. Requests
    without media pass through untouched: `stream` hands back the inner provider's own
    stream, not a generator around it, which was a step of its own for every chunk.
    """

    def __init__(self, inner: Provider) -> None:
        self.inner = inner
        self.provider_id = inner.provider_id

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def model_info(self, model: str) -> ModelInfo:
        return self.inner.model_info(model)

    def stream(self, request: CompletionRequest) -> AsyncIterator[StreamEvent]:
        if has_media_references(request.messages):
            return self._resolved_stream(request)
        return self.inner.stream(request)

    async def _resolved_stream(self, request: CompletionRequest) -> AsyncIterator[StreamEvent]:
        messages = await run_in_db_thread(resolve_media_references, request.messages)
        stream = self.inner.stream(dataclasses.replace(request, messages=messages))
        try:
            async for event in stream:
                yield event
        finally:
            close = getattr(stream, "aclose", None)
            if close is not None:
                await close()
