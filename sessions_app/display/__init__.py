"""The read side: what the pages and the API show of a session, shared by the chat, the
moderation queue, the review pages, the admin and the API.

- `content`: HTML ids for journal ids, tool arguments for people, a user message's text
  and attachments.
- `approvals`: the approval card (`ApprovalView`) and the later gated calls of an ask's
  turn (`turn_calls_waiting`), which the chat and the queue both show.
- `markdown`: model and user text as sanitised HTML.
- `snapshots`: the API's snapshot and transcript projections of a session.

It sits below chat/, moderation/ and review/, which never import each other: what two of
them show alike lives here. Nothing here writes; `snapshots` reads the journal, and which tools are gated
comes from the process's runtime (sessions_app.runtime.is_gated_tool).
"""
