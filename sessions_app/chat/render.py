"""The chat's HTML: one context for every partial, and a batch of changes as htmx OOB swaps.

The page (views.chat) renders templates/chat/chat.html, which includes the
partials under templates/chat/. The websocket consumer renders the very
same partials for what changed, each wrapped or marked as an out-of-band swap:

* a new item (message, card, notice): ``_append.html`` adds it at the end of #transcript;
* a tool call in a message already on screen: ``_tool_call_append.html``;
* an item that changed (a finished message now in Markdown, a tool call with its result,
  a decided approval card): the item's partial with ``hx-swap-oob="true"`` replaces it;
* streamed text: a ``<span hx-swap-oob="beforeend:#...">`` appends the escaped text to
  the open message (`delta_swap`);
* the state word, the token meter, the run controls, the title, the mode and model options, the
  header's agent (when the session moves to another version), the notes: their partials,
  replaced.

Everything goes through Django's auto-escaping templates, except the streamed text's one
span, built by django.utils.html.format_html, which escapes every value it inserts just
as the templates do: a template render per chunk per socket was most of a socket's CPU
per streamed chunk (bench/chunk_hops.py). Text from users and models cannot become
markup either way.
"""

from __future__ import annotations

import functools
from typing import Any

from django.template.loader import render_to_string
from django.urls import reverse
from django.utils.html import format_html

from sectr.events import MODES
from sectr.providers import known_models
from sessions_app import access
from sessions_app.chat.view_model import Changes, ChatViewModel, ToolCallView
from sessions_app.display.content import dom_id
from sessions_app.display.snapshots import agent_summary
from sessions_app.models import Team
from sessions_app.provider_config import default_model

MODE_LABELS = {"default": "Default (gated tools ask)", "plan": "Plan (read-only tools)", "accept_edits": "Accept edits"}


def model_choices(current: str | None = None) -> list[str]:
    """The models the selector offers: the current one, the configured default, the provider's known ones."""
    default = default_model()
    provider = "demo" if default == "demo" else "openai"
    names = [default] + [info.model_id for info in known_models(provider)]
    if current:
        names.insert(0, current)
    return list(dict.fromkeys(names))


def mode_choices() -> list[tuple[str, str]]:
    return [(mode, MODE_LABELS.get(mode, mode)) for mode in MODES]


def chat_context(
    vm: ChatViewModel, *, can_write: bool, can_approve: bool, can_fork: bool, **extra: Any
) -> dict[str, Any]:
    """What every chat partial needs, for the page and for the consumer alike."""
    return {
        "vm": vm,
        "session_id": vm.session_id,
        "can_write": can_write,
        "can_approve": can_approve,
        "can_fork": can_fork,
        # Callables, which templates call when a partial uses them: only the settings
        # partials do, so a frame of streamed text never builds the model list.
        "modes": mode_choices,
        "models": functools.partial(model_choices, vm.state.model),
        **extra,
    }


def session_agent_label(user: Any, pin: dict[str, Any] | None) -> dict[str, Any]:
    """What the chat header says about the session's agent: its name and version, and a
    link to its page on its team's settings for those with a role in that team."""
    summary = agent_summary(pin)
    name = summary.get("name") or summary.get("slug") or "default"
    label = f"{name} v{summary.get('version') or 1}" if summary.get("id") else name
    url = None
    team = summary.get("team")
    if team and summary.get("slug"):
        team_id = Team.objects.filter(name=team).values_list("pk", flat=True).first()
        if access.team_role(user, team_id) is not None:
            url = reverse("team_agent", args=[team, summary["slug"]])
    return {"label": label, "url": url}


def delta_swap(target: str, text: str) -> str:
    """Streamed text appended to the element #`target` (both escaped)."""
    return format_html('<span hx-swap-oob="beforeend:#{}">{}</span>\n', target, text)


def render_changes(changes: Changes, context: dict[str, Any]) -> str:
    """One batch of changes as a string of OOB swaps (empty when nothing shows)."""
    parts: list[str] = []
    if changes.appended:
        parts.append(render_to_string("chat/_append.html", {**context, "items": changes.appended}))
    for call in changes.tool_calls_added:
        parts.append(
            render_to_string(
                "chat/_tool_call_append.html",
                {**context, "call": call, "message_dom_id": dom_id("m", call.message_id), "oob": False},
            )
        )
    for item in changes.replaced:
        if isinstance(item, ToolCallView):
            parts.append(render_to_string("chat/_tool_call.html", {**context, "call": item, "oob": True}))
        else:
            parts.append(render_to_string("chat/_item.html", {**context, "item": item, "oob": True}))
    for target, texts in changes.text.items():
        parts.append(delta_swap(f"{target}-text", "".join(texts)))
    for target, texts in changes.reasoning.items():
        parts.append(delta_swap(f"{target}-reasoning", "".join(texts)))
    oob = {**context, "oob": True}
    if changes.status:
        for name in ("_state.html", "_usage.html", "_run_controls.html"):
            parts.append(render_to_string(f"chat/{name}", oob))
    if changes.settings:
        for name in ("_title.html", "_settings_oob.html"):
            parts.append(render_to_string(f"chat/{name}", oob))
    if changes.agent and "agent" in context:  # its label is read from the database by the caller
        parts.append(render_to_string("chat/_agent.html", oob))
    if changes.notes:
        parts.append(render_to_string("chat/_notes.html", oob))
    return "".join(parts)
