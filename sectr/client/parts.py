"""Prompt parts, and the checks the SDK makes before it sends them.

The server checks every part again (it is the authority); checking here first means an
oversized image, a file whose bytes are not what it claims, an ``http:`` URL or an image
for a model without image input fails at once, with the same `PromptValidationError`
code the server would answer (``size``, ``mime_type``, ``url``, ``capability``,
``prompt``), before anything is uploaded.

Types are sniffed from the bytes' magic numbers, never guessed from a file's name.
Audio is uploaded (the server refuses audio by URL: providers take audio inline only);
to send audio you hold at a URL, download it and use `audio_part_from_bytes`.
"""

from __future__ import annotations

import base64
import ipaddress
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from sectr.client.errors import PromptValidationError

MIB = 1024 * 1024
PART_MAX_BYTES = 10 * MIB
PROMPT_MAX_BYTES = 20 * MIB
PROMPT_MAX_PARTS = 16
URL_MAX_LENGTH = 2048
IMAGE_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp")
AUDIO_FORMATS = {"wav": "audio/wav", "mp3": "audio/mpeg", "flac": "audio/flac", "ogg": "audio/ogg"}
BLOCKED_HOSTNAMES = frozenset({"localhost", "metadata", "metadata.google.internal", "instance-data"})
BLOCKED_HOST_SUFFIXES = (".localhost", ".internal", ".local", ".localdomain")


def refuse(code: str, message: str) -> PromptValidationError:
    return PromptValidationError(message, code=code)


def sniff_mime(data: bytes) -> str | None:
    """The media type the bytes' magic numbers announce (the types the server accepts)."""
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
        return "audio/mpeg"
    return None


def _check_size(size: int, what: str) -> None:
    if size > PART_MAX_BYTES:
        raise refuse("size", f"{what} is larger than {PART_MAX_BYTES // MIB} MiB")
    if size == 0:
        raise refuse("prompt", f"{what} is empty")


def _read(path: Path) -> bytes:
    _check_size(path.stat().st_size, path.name)  # before reading megabytes
    return path.read_bytes()


# ---- the helpers ----


def text_part(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def image_part_from_bytes(data: bytes, mime_type: str | None = None, *, detail: str | None = None) -> dict[str, Any]:
    """An image upload part. The type is sniffed from the bytes; a `mime_type` that
    says otherwise is refused (code ``mime_type``)."""
    _check_size(len(data), "the image")
    sniffed = sniff_mime(data)
    if sniffed not in IMAGE_TYPES:
        raise refuse("mime_type", f"the bytes are not an image the server accepts ({', '.join(IMAGE_TYPES)})")
    if mime_type is not None and mime_type.lower() != sniffed:
        raise refuse("mime_type", f"the image is declared {mime_type} but its bytes are {sniffed}")
    image: dict[str, Any] = {"url": f"data:{sniffed};base64,{base64.b64encode(data).decode()}"}
    if detail:
        image["detail"] = detail
    return {"type": "image_url", "image_url": image}


def image_part_from_path(
    path: str | Path, *, mime_type: str | None = None, detail: str | None = None
) -> dict[str, Any]:
    """An image upload part from a file (png, jpeg, gif, webp, told apart by its bytes)."""
    return image_part_from_bytes(_read(Path(path)), mime_type, detail=detail)


def image_part_from_url(url: str, *, detail: str | None = None) -> dict[str, Any]:
    """An image by absolute https URL (the provider fetches it; Sectr never does)."""
    check_url(url)
    image: dict[str, Any] = {"url": url}
    if detail:
        image["detail"] = detail
    return {"type": "image_url", "image_url": image}


def audio_part_from_bytes(data: bytes, audio_format: str | None = None) -> dict[str, Any]:
    """An audio upload part (wav, mp3, flac, ogg, told apart by the bytes)."""
    _check_size(len(data), "the audio")
    sniffed = sniff_mime(data)
    found = next((fmt for fmt, mime in AUDIO_FORMATS.items() if mime == sniffed), None)
    if found is None:
        raise refuse("mime_type", f"the bytes are not audio the server accepts ({', '.join(AUDIO_FORMATS)})")
    if audio_format is not None and audio_format.lower() != found:
        raise refuse("mime_type", f"the audio is declared {audio_format} but its bytes are {found}")
    return {"type": "input_audio", "input_audio": {"data": base64.b64encode(data).decode(), "format": found}}


def audio_part_from_path(path: str | Path, *, audio_format: str | None = None) -> dict[str, Any]:
    """An audio upload part from a file."""
    return audio_part_from_bytes(_read(Path(path)), audio_format)


# ---- checks of a whole prompt ----


def check_url(url: Any) -> None:
    """Absolute https, no credentials, and no host that is plainly not public (a name
    like localhost, or a literal loopback/private/link-local address). The server also
    resolves the name; the SDK does not."""
    if not isinstance(url, str) or not url or len(url) > URL_MAX_LENGTH:
        raise refuse("url", f"a media URL is a string of at most {URL_MAX_LENGTH} characters")
    try:
        parts = urlsplit(url)
    except ValueError:
        raise refuse("url", "the media URL is malformed") from None
    if parts.scheme.lower() != "https":
        raise refuse("url", "media URLs must be absolute https URLs")
    host = (parts.hostname or "").rstrip(".").lower()
    if not host:
        raise refuse("url", "the media URL has no host")
    if parts.username is not None or parts.password is not None:
        raise refuse("url", "media URLs must not carry credentials")
    if host in BLOCKED_HOSTNAMES or host.endswith(BLOCKED_HOST_SUFFIXES):
        raise refuse("url", f"media URLs must not point at {host}")
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return
    if not address.is_global:
        raise refuse("url", "media URLs must not point at loopback, private, link-local or metadata addresses")


def _decoded_size(text: Any, what: str) -> tuple[int, bytes]:
    if not isinstance(text, str) or not text:
        raise refuse("prompt", f"{what} needs base64 data")
    if len(text) * 3 // 4 > PART_MAX_BYTES + 3:
        raise refuse("size", f"{what} is larger than {PART_MAX_BYTES // MIB} MiB")
    try:
        data = base64.b64decode(text, validate=True)
    except ValueError:
        raise refuse("prompt", f"{what} is not valid base64") from None
    _check_size(len(data), what)
    return len(data), data


def check_parts(content: Any, media: Mapping[str, Any] | None) -> None:
    """Check a prompt before it is sent: the part count, each part's source, type (by its
    bytes), size, the total size, and `media` (the session snapshot's ``media``: which
    kinds its model accepts; None when unknown). Raises PromptValidationError."""
    if isinstance(content, str):
        return
    if not isinstance(content, list) or not content:
        raise refuse("prompt", "content must be a string or a non-empty list of parts")
    if len(content) > PROMPT_MAX_PARTS:
        raise refuse("prompt", f"a prompt has at most {PROMPT_MAX_PARTS} parts, not {len(content)}")
    total = 0
    for index, part in enumerate(content):
        what = f"part {index}"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text":
            if not isinstance(part.get("text"), str):
                raise refuse("prompt", f"{what}: a text part needs a string text")
            continue
        if kind not in ("image_url", "input_audio"):
            raise refuse("prompt", f"{what}: the type must be text, image_url or input_audio")
        media_kind = "image" if kind == "image_url" else "audio"
        if media is not None and media.get(media_kind) is False:
            raise refuse("capability", f"the session's model does not accept {media_kind} input")
        total += _check_media_part(part, kind, what)
    if total > PROMPT_MAX_BYTES:
        raise refuse("size", f"the parts of a prompt are at most {PROMPT_MAX_BYTES // MIB} MiB together")


def _check_media_part(part: dict[str, Any], kind: str, what: str) -> int:
    if kind == "image_url":
        image = part.get("image_url")
        if not isinstance(image, dict) or not isinstance(image.get("url"), str):
            raise refuse("prompt", f"{what} needs image_url.url (a data: URL or an https URL)")
        url: str = image["url"]
        if url[:5].lower() != "data:":
            check_url(url)
            return 0
        header, _, payload = url[5:].partition(",")
        declared = header.partition(";")[0].strip().lower()
        if declared not in IMAGE_TYPES:
            raise refuse("mime_type", f"{what}: images are {', '.join(IMAGE_TYPES)}, not {declared or 'untyped'}")
        size, data = _decoded_size(payload, what)
        if sniff_mime(data) != declared:
            raise refuse("mime_type", f"{what} is declared {declared} but its bytes are not")
        return size
    audio = part.get("input_audio")
    if not isinstance(audio, dict):
        raise refuse("prompt", f"{what} needs input_audio: {{data, format}}")
    if "url" in audio and "data" not in audio:
        raise refuse("url", f"{what}: audio must be uploaded as data (providers take audio inline only)")
    audio_format = str(audio.get("format") or "").lower()
    if audio_format not in AUDIO_FORMATS:
        raise refuse("mime_type", f"{what}: audio formats are {', '.join(AUDIO_FORMATS)}")
    size, data = _decoded_size(audio.get("data"), what)
    if sniff_mime(data) != AUDIO_FORMATS[audio_format]:
        raise refuse("mime_type", f"{what} is declared {audio_format} but its bytes are not")
    return size
