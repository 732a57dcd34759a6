"""The body of a `slack` team webhook: a Slack incoming-webhook message with Block Kit
blocks, which Slack (and Mattermost, from its `text`) show in a channel without an app.

A new ask shows who asks to run what in which session, its arguments, and URL buttons
to the ask's action page (sessions_app.action_links: it needs a login, and its GET
never decides) and to the queue. Buttons are links, not interactive actions: Sectr
receives nothing from Slack, so no Slack app, signing secret or public endpoint is
needed. Other events (a vote, a decision, a withdrawal) are one line.

Slack's documented limits are kept: a header's text at most 150 characters, a
section's at most 3,000, a button's text at most 75 and its URL at most 3,000, at most
50 blocks; `text` is the fallback shown in notifications.
"""

from __future__ import annotations

import json
from typing import Any

HEADER_MAX = 150
SECTION_MAX = 3000
BUTTON_TEXT_MAX = 75
URL_MAX = 3000
ARGUMENTS_SHOWN_MAX = 2500

VERDICT_WORDS = {
    "allow_once": "approved once",
    "allow_always": "always allowed",
    "deny": "denied",
    "respond": "answered instead of running",
}


def escape(text: Any) -> str:
    """Text for mrkdwn: Slack reads &, < and > as markup (links, mentions)."""
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _linkable(url: str) -> bool:
    """Slack refuses a whole message whose button URL is not absolute (SECTR_BASE_URL unset)."""
    return url.startswith(("https://", "http://")) and len(url) <= URL_MAX


def _button(text: str, url: str, action_id: str, style: str | None = None) -> dict[str, Any]:
    button: dict[str, Any] = {
        "type": "button",
        "text": {"type": "plain_text", "text": _cut(text, BUTTON_TEXT_MAX), "emoji": False},
        "url": url,
        "action_id": action_id,
    }
    if style:
        button["style"] = style
    return button


#: What a re-ask after a crash says (its first approved attempt was cut off mid-call),
#: in a Slack message and an email alike.
MAY_HAVE_RUN = (
    "Asked again after a crash: the first approved attempt was cut off while it ran and may "
    "have taken effect. Check before approving it again."
)


def slack_message(payload: dict[str, Any]) -> dict[str, Any]:
    """The incoming-webhook body of one notification (`payload`: its JSON body,
    sessions_app.journal.moderation.notification_payload)."""
    event = str(payload.get("event") or "")
    tool = str(payload.get("tool") or "")
    title = str(payload.get("session_title") or "an untitled session")
    team = str(payload.get("team") or "")
    requester = str(payload.get("requester") or "")
    where = f"in “{escape(title)}” (team {escape(team)})"
    if event != "ask.requested":
        actor = str(payload.get("actor") or "someone")
        what = {
            "ask.voted": f"voted {VERDICT_WORDS.get(str(payload.get('verdict')), escape(payload.get('verdict')))} on",
            "ask.decided": VERDICT_WORDS.get(str(payload.get("verdict")), "decided"),
            "ask.withdrawn": "withdrew",
        }.get(event, escape(event))
        line = _cut(f"{escape(actor)} {what} `{escape(tool)}` {where}", SECTION_MAX)
        return {"text": line, "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": line}}]}
    arguments = json.dumps(payload.get("arguments") or {}, indent=2, ensure_ascii=False, sort_keys=True)
    arguments = _cut(arguments, ARGUMENTS_SHOWN_MAX).replace("```", "'''")
    asks = f"{escape(requester)}'s agent asks to run `{escape(tool)}` {where}"
    text = f"{requester}'s agent asks to run {tool} in “{title}” ({team})"
    buttons = []
    action_url = str(payload.get("action_url") or "")
    if _linkable(action_url):
        buttons.append(_button("Approve or deny", action_url, "sectr_decide", "primary"))
    queue_url = str(payload.get("url") or "")
    if _linkable(queue_url):
        buttons.append(_button("Open the queue", queue_url, "sectr_queue"))
    blocks: list[dict[str, Any]] = [
        {
            "type": "header",
            "text": {"type": "plain_text", "text": _cut(f"Approval needed: {tool}", HEADER_MAX), "emoji": False},
        },
        {"type": "section", "text": {"type": "mrkdwn", "text": _cut(asks, SECTION_MAX)}},
        {"type": "section", "text": {"type": "mrkdwn", "text": f"```{arguments}```"}},
    ]
    if payload.get("may_have_run"):
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": f":warning: {escape(MAY_HAVE_RUN)}"}})
    if buttons:
        blocks.append({"type": "actions", "elements": buttons})
        text = f"{text}: {buttons[0]['url']}"
    return {"text": text, "blocks": blocks}
