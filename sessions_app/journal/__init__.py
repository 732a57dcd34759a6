"""The journal and its projections.

- `database`: DatabaseJournal, the one write door for envelopes (atomic, gapless, fenced
  appends; publication after commit). `get_journal()` is the process's instance.
- `publish`: the channel-layer side of a commit (session groups, the moderation group,
  worker wake-ups).
- `moderation`: the audit rows of asks, votes, decisions and withdrawals, written in
  the append's transaction (and rebuilt from the journal by `rebuild_audit`).

Its async methods run in sessions_app.dbthread's thread pool. What the API and the pages
show of a session (snapshots, transcripts, cards) lives in sessions_app.display.
"""

from sessions_app.journal.database import DatabaseJournal, Fence, get_journal

__all__ = ["DatabaseJournal", "Fence", "get_journal"]
