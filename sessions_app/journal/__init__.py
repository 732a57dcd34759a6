"""The journal and its projections.

- `database`: DatabaseJournal, the one write door for envelopes (atomic, gapless, fenced
  appends; publication after commit). `get_journal()` is the process's instance.
- `publish`: the channel-layer side of a commit (session groups, the moderation group,
  worker wake-ups).
- `moderation`: the audit rows of asks, votes, decisions and withdrawals, written in
  the append's transaction (and rebuilt from the journal by `rebuild_audit`).
- `snapshots`: the API's snapshot and transcript projections of a session.
"""

from sessions_app.journal.database import DatabaseJournal, Fence, get_journal, run_in_db_thread

__all__ = ["DatabaseJournal", "Fence", "get_journal", "run_in_db_thread"]
