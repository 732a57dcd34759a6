"""Journal content as people see it: HTML ids for journal ids, tool arguments as indented
JSON, a user message's text and media parts, and the media of a tool result."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

#: How the journal references stored media (sessions_app.media).
MEDIA_SCHEME = "sectr-media://"
_DOM_SAFE = re.compile(r"^[A-Za-z0-9_-]{1,80}$")


def dom_id(prefix: str, raw: Any) -> str:
    """An HTML id for a journal id (ids from a provider may hold any character)."""
    text = str(raw)
    if _DOM_SAFE.match(text):
        return f"{prefix}-{text}"
    return f"{prefix}-h{hashlib.sha256(text.encode()).hexdigest()[:24]}"


def pretty_json(value: Any) -> str:
    """Tool arguments for people: indented JSON when they parse, else as the model wrote them."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return value
    try:
        return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False)
    except (TypeError, ValueError):
        return str(value)


@dataclass
class Attachment:
    kind: str  # "image" or "audio"
    label: str
    url: str | None = None  # a same-origin URL the page may show, when there is one
    ref: str = ""  # its sectr-media:// reference, when Sectr stored it
    #: Referenced, but not readable here (an import that did not carry the bytes, a blob
    #: since gone): the page says so instead of showing a broken image.
    missing: bool = False


def _attachment(kind: str, label: str, url: str, session_id: str, missing: frozenset[str]) -> Attachment:
    sha256 = url[len(MEDIA_SCHEME) :] if url.startswith(MEDIA_SCHEME) else ""
    if sha256 and sha256 in missing:
        return Attachment(kind, label, None, ref=url, missing=True)
    return Attachment(kind, label, _local_media_url(url, session_id), ref=url if sha256 else "")


def content_text_and_attachments(
    content: Any, session_id: str = "", missing: frozenset[str] = frozenset()
) -> tuple[str, list[Attachment]]:
    """A user message's text and its media parts (OpenAI content parts); `missing` are
    the sha256 of stored media the viewer cannot read (sessions_app.media.missing_media)."""
    if isinstance(content, str):
        return content, []
    texts: list[str] = []
    attachments: list[Attachment] = []
    for part in content if isinstance(content, list) else []:
        if not isinstance(part, dict):
            continue
        kind = part.get("type")
        if kind == "text":
            texts.append(str(part.get("text", "")))
        elif kind == "image_url":
            image = part.get("image_url") if isinstance(part.get("image_url"), dict) else {}
            url = str(image.get("url", "")) if isinstance(image, dict) else ""
            attachments.append(_attachment("image", _media_label(part, url, "image"), url, session_id, missing))
        elif kind == "input_audio":
            audio = part.get("input_audio") if isinstance(part.get("input_audio"), dict) else {}
            url = str(audio.get("url", "")) if isinstance(audio, dict) else ""
            attachments.append(_attachment("audio", _media_label(part, url, "audio"), url, session_id, missing))
    return "\n".join(t for t in texts if t), attachments


def result_attachments(media: Any, session_id: str = "", missing: frozenset[str] = frozenset()) -> list[Attachment]:
    """A TOOL_RESULT's `media` (references to stored images and audio) as attachments:
    labelled "image/png, 2.5 KB", shown through the session's media view when
    `session_id` is given (a page that checks access), named only otherwise, and marked
    missing when their sha256 is in `missing`."""
    from sectr.mcp import size_words

    attachments: list[Attachment] = []
    for item in media if isinstance(media, list) else []:
        if not isinstance(item, dict) or item.get("kind") not in ("image", "audio"):
            continue
        size = item.get("bytes")
        label = str(item.get("mime_type") or item["kind"])[:100]
        if isinstance(size, int) and not isinstance(size, bool):
            label += f", {size_words(size)}"
        attachment = _attachment(str(item["kind"]), label, str(item.get("ref", "")), session_id, missing)
        attachment.ref = str(item.get("ref", ""))
        attachments.append(attachment)
    return attachments


def api_result_media(media: Any, session_id: str) -> list[dict[str, Any]]:
    """A TOOL_RESULT's `media` as the API shows them: each reference with the URL an API
    client fetches it from with its token (GET /api/v1/sessions/{id}/media/{sha256})."""
    shown: list[dict[str, Any]] = []
    for item in media if isinstance(media, list) else []:
        if not isinstance(item, dict):
            continue
        ref = str(item.get("ref", ""))
        sha256 = ref[len(MEDIA_SCHEME) :] if ref.startswith(MEDIA_SCHEME) else ""
        url = f"/api/v1/sessions/{session_id}/media/{sha256}" if re.fullmatch(r"[0-9a-f]{64}", sha256) else None
        shown.append({k: item.get(k) for k in ("ref", "kind", "mime_type", "bytes")} | {"url": url})
    return shown


def _media_label(part: dict[str, Any], url: str, kind: str) -> str:
    for key in ("name", "filename", "mime_type"):
        if isinstance(part.get(key), str) and part[key]:
            return str(part[key])
    media = part.get("media") if isinstance(part.get("media"), dict) else None
    if media:
        for key in ("name", "mime_type", "sha256"):
            if isinstance(media.get(key), str) and media[key]:
                return str(media[key])[:40]
    if url.startswith("data:"):
        return url[5 : url.find(";")] if ";" in url else kind
    if url.startswith(("http://", "https://")):
        return url[:80]
    return kind


def _local_media_url(url: str, session_id: str) -> str | None:
    # Only media Sectr stored are shown inline (through the session's media view, which
    # checks access); remote URLs stay text (no tracking pixels in a reviewer's
    # browser), and data: URLs are not echoed into the page.
    if url.startswith(MEDIA_SCHEME) and session_id:
        sha256 = url[len(MEDIA_SCHEME) :]
        if re.fullmatch(r"[0-9a-f]{64}", sha256):
            return f"/sessions/{session_id}/media/{sha256}"
    return None
