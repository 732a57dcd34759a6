"""Sectr's database: sessions and their journal, runs (the work queue), grants, media,
API tokens and review notes.

The journal (`Envelope` rows) is the truth. Everything on `Session` except `owner`,
`created_at` and `closed_at` is a cache of the projection (sectr.state) that
sessions_app.journal.DatabaseJournal keeps up to date in the same transaction as each
append; `Session.rebuild_projection()` recomputes it from the journal alone.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import uuid
from collections.abc import Iterable
from datetime import timedelta
from decimal import Decimal
from typing import Any, cast

from django.conf import settings
from django.db import models, transaction
from django.utils import timezone

from sectr.agents import AgentSpec
from sectr.events import Envelope as JournalEnvelope
from sectr.events import EventType
from sectr.rules import Policy, Rule, rules_from_dicts
from sectr.state import DEFAULT_LIMITS, SessionState, project


def new_session_id() -> str:
    return f"ses_{uuid.uuid4().hex}"


def new_run_id() -> str:
    return f"run_{uuid.uuid4().hex}"


def default_limits() -> dict[str, int]:
    return dict(DEFAULT_LIMITS)


def new_agent_id() -> str:
    return f"agt_{uuid.uuid4().hex[:16]}"


class Team(models.Model):
    """A group of people whose sessions are shared by role (docs/moderation.md).

    A session belongs to at most one team (`Session.team`); its members read it, its
    reviewers also rate, annotate, export and share it, its moderators also decide its
    asks and edit the team's approval rules. Who may do what: sessions_app.access.
    """

    name = models.SlugField(max_length=64, unique=True)
    #: Asks no rule gives an expiry to expire after this many seconds (None: never).
    ask_expires_after_s = models.PositiveIntegerField(null=True, blank=True)
    #: Sessions idle this many days are deleted by `manage.py sectr_retention` (None: the
    #: default, SECTR_RETENTION_DAYS; 0: kept for ever). sessions_app.ops.retention.
    retention_days = models.PositiveIntegerField(null=True, blank=True)
    #: An email's action link (bound to one moderator and one ask) decides without a
    #: login (sessions_app.action_links); a webhook's link always needs one.
    links_decide_without_login = models.BooleanField("Links decide without login", default=False)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class TeamBudget(models.Model):
    """A team's monthly budget (docs/agents.md, "Budgets"): tokens and/or money (priced with
    `ModelPrice`), and the shares of it at which the team is told (once a month each).
    Once spent, the team's new runs end at once with stop reason `budget`."""

    team = models.OneToOneField(Team, on_delete=models.CASCADE, primary_key=True, related_name="budget")
    monthly_tokens = models.BigIntegerField(null=True, blank=True)
    monthly_cost = models.DecimalField(max_digits=15, decimal_places=4, null=True, blank=True)
    alert_thresholds = models.JSONField(default=list, blank=True)  # e.g. [0.8, 1.0]
    updated_by = models.CharField(max_length=150, blank=True, default="")
    updated_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"budget of {self.team}"


class BudgetAlert(models.Model):
    """One alert sent: a threshold of a team's budget crossed in a month (never twice)."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="budget_alerts")
    month = models.DateField()  # the first day of the month (UTC)
    threshold = models.CharField(max_length=16)  # "0.8"
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["team", "month", "threshold"], name="budget_alert_once")]

    def __str__(self) -> str:
        return f"{self.team} {self.month:%Y-%m} {self.threshold}"


class Membership(models.Model):
    """One user's role in one team."""

    MEMBER = "member"
    REVIEWER = "reviewer"
    MODERATOR = "moderator"
    ROLES = (MEMBER, REVIEWER, MODERATOR)  # each role includes the ones before it
    ROLE_CHOICES = [(role, role) for role in ROLES]

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="sectr_memberships")
    role = models.CharField(max_length=16, choices=ROLE_CHOICES, default=MEMBER)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["team", "user"], name="membership_team_user_uniq")]
        indexes = [models.Index(fields=["user", "role"], name="membership_user_role")]

    def __str__(self) -> str:
        return f"{self.user_id} in {self.team_id} ({self.role})"


class Agent(models.Model):
    """A named, versioned configuration that sessions run with (docs/agents.md).

    The row holds the agent's identity; what it *is* lives in its versions, one per save,
    never edited. `team` None: an installation-wide agent, made by staff, that every user
    may pick.
    """

    id = models.CharField(primary_key=True, max_length=40, default=new_agent_id, editable=False)
    team = models.ForeignKey(Team, on_delete=models.CASCADE, null=True, blank=True, related_name="agents")
    slug = models.SlugField(max_length=63)
    latest_version = models.PositiveIntegerField(default=0)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["created_at", "id"]
        constraints = [
            models.UniqueConstraint(fields=["team", "slug"], name="agent_team_slug"),
            models.UniqueConstraint(fields=["slug"], condition=models.Q(team__isnull=True), name="agent_global_slug"),
        ]

    def __str__(self) -> str:
        team = self.team_name
        return f"{team}/{self.slug}" if team else self.slug

    @property
    def team_name(self) -> str | None:
        return self.team.name if self.team is not None else None


class AgentVersion(models.Model):
    """One saved version of an agent: immutable, with its author, time and change note.

    Never edited; never deleted while a session uses it (sessions pin versions, and the
    Session row's `agent` protects the agent)."""

    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="versions")
    number = models.PositiveIntegerField()
    name = models.CharField(max_length=120)
    description = models.TextField(blank=True, default="")
    instructions = models.TextField(blank=True, default="")
    model = models.CharField(max_length=200, blank=True, default="")
    params = models.JSONField(default=dict, blank=True)
    tools = models.JSONField(null=True, blank=True)  # names or globs; None: every tool
    mode = models.CharField(max_length=16, blank=True, default="")
    limits = models.JSONField(null=True, blank=True)
    handler = models.CharField(max_length=200, default="default")
    note = models.CharField(max_length=500, blank=True, default="")
    author = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    author_name = models.CharField(max_length=150, blank=True, default="")  # kept if the user goes
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["agent", "number"]
        constraints = [models.UniqueConstraint(fields=["agent", "number"], name="agent_version_number")]

    def __str__(self) -> str:
        return f"{self.agent} v{self.number}"

    def spec(self) -> AgentSpec:
        """The frozen value a session pinned to this version runs with."""
        agent = self.agent
        return AgentSpec(
            id=agent.id,
            slug=agent.slug,
            version=self.number,
            name=self.name,
            team=agent.team_name,
            description=self.description,
            instructions=self.instructions,
            model=self.model or None,
            params=dict(self.params or {}),
            tools=tuple(self.tools) if self.tools is not None else None,
            mode=self.mode or None,
            limits=dict(self.limits) if self.limits is not None else None,
            handler=self.handler or "default",
        )


class ApprovalRule(models.Model):
    """One of a team's ordered approval rules (sectr.rules): data, edited by moderators only.

    Changed only through sessions_app.actions.rules (a moderator's action); the worker
    reads the session's team's rules when it builds an invocation's context.
    """

    ACTION_CHOICES = [(a, a) for a in ("allow", "deny", "ask")]

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="rules")
    position = models.PositiveIntegerField(default=0)  # 0 = first; renumbered on every change
    tool = models.CharField(max_length=100)  # a tool name or fnmatch glob
    arguments = models.JSONField(default=dict, blank=True)  # {argument name: glob}
    action = models.CharField(max_length=8, choices=ACTION_CHOICES)
    approvals_required = models.PositiveSmallIntegerField(default=1)
    expires_after_s = models.PositiveIntegerField(null=True, blank=True)
    created_by = models.CharField(max_length=150, blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["team", "position", "id"]
        indexes = [models.Index(fields=["team", "position"], name="approvalrule_team_position")]

    def __str__(self) -> str:
        return f"rule:{self.pk} {self.action} {self.tool}"

    def to_core(self) -> Rule:
        return rules_from_dicts([self.as_dict()])[0]

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": str(self.pk),
            "position": self.position,
            "tool": self.tool,
            "arguments": dict(self.arguments or {}),
            "action": self.action,
            "approvals_required": self.approvals_required,
            "expires_after_s": self.expires_after_s,
        }

    @classmethod
    def policy_for_session(cls, session_id: str) -> Policy:
        """The policy the runtime applies to a session: its team's rules in order, and the
        team's default expiry; a personal session has none. Two queries."""
        return cls.policy_and_team_for_session(session_id)[0]

    @classmethod
    def policy_and_team_for_session(cls, session_id: str) -> tuple[Policy, int | None]:
        """The session's policy and its team's id (None: a personal session)."""
        return cls._read_policy("s", session_id)

    @classmethod
    def policy_of_team(cls, team_id: int | None) -> Policy:
        """A team's policy (no query for None: a personal session has no rules)."""
        return Policy() if team_id is None else cls._read_policy("t", team_id)[0]

    @classmethod
    def _read_policy(cls, by: str, key: Any) -> tuple[Policy, int | None]:
        """The team's expiry and its rules in one plain statement (by "s": the session's
        id, "t": the team's): every run start reads them, and two compiled querysets cost
        ten times the indexed reads."""
        from django.db import connection

        from sessions_app.plain_sql import hot_cursor

        qn = connection.ops.quote_name
        team, rule, session = (qn(m._meta.db_table) for m in (Team, cls, Session))
        tail = f"FROM {team} t" if by == "t" else f"FROM {session} s JOIN {team} t ON t.id = s.team_id"
        with hot_cursor(connection) as cursor:
            cursor.execute(
                "SELECT t.id, t.ask_expires_after_s, r.id, r.tool, r.arguments, r.action,"  # noqa: S608 - quoted names
                f" r.approvals_required, r.expires_after_s {tail} LEFT JOIN {rule} r ON r.team_id = t.id"
                f" WHERE {by}.id = %s ORDER BY r.position, r.id",
                [key],
            )
            rows = cursor.fetchall()
        if not rows:
            return Policy(), None
        field = cast(models.JSONField, cls._meta.get_field("arguments"))

        def arguments(value: Any) -> Any:  # a JSON column's text (or value), as the ORM reads it
            return field.from_db_value(value, field.cached_col, connection)

        stored = [
            {"id": r[2], "tool": r[3], "arguments": arguments(r[4]), "action": r[5],
             "approvals_required": r[6], "expires_after_s": r[7]}
            for r in rows if r[2] is not None
        ]  # fmt: skip
        return Policy(rules_from_dicts(stored), rows[0][1] or None), rows[0][0]


class InstallationMcpServer(models.Model):
    """An installation-wide stdio MCP server that staff defined (in the admin): a command
    the workers run. A team's moderators may enable it for their team; only staff (or the
    operator's SECTR_MCP_SERVERS file, whose entries win on a shared name) define one."""

    name = models.SlugField(max_length=32, unique=True)
    command = models.CharField(max_length=500)
    args = models.JSONField(default=list, blank=True)
    env = models.JSONField(default=dict, blank=True)
    cwd = models.CharField(max_length=500, blank=True, default="")
    timeout_s = models.FloatField(default=60.0)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        verbose_name = "installation MCP server"

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        """The admin's check: the same rules as an entry of the operator's file."""
        from django.core.exceptions import ValidationError

        from sectr.mcp import server_configs_from_json

        entry = {"command": self.command, "args": self.args, "env": self.env or None, "timeout_s": self.timeout_s}
        if self.cwd:
            entry["cwd"] = self.cwd
        try:
            server_configs_from_json({self.name: entry})
        except ValueError as exc:
            raise ValidationError(str(exc)) from None


class TeamMcpServer(models.Model):
    """An MCP server a team's agents may use (docs/mcp.md): a Streamable HTTP server the
    team's moderators registered (`url`), or an installation-wide stdio server they
    enabled for the team (`url` empty, `name` the installation server's).

    `headers_sealed` holds the HTTP headers (secrets) encrypted (sessions_app.sealed): no
    response, page, export or log shows them; only their names are listed. `tools` are
    globs of the server's tool names to offer (None: all); `discovered` is what its last
    `tools/list` answered (each tool's JSON as the server gave it: name, description,
    inputSchema, annotations), which the workers build the team's tools from.
    `refreshed_at` is when it was last discovered and `discovery_reason` why (saved,
    Refresh, the server said its tools changed, or its cache hint ran out);
    `tools_fresh_until` is when that hint runs out (None: the server gave none, so the
    tools stay until the next save, Refresh or change notification).
    """

    UNKNOWN = "unknown"
    OK = "ok"
    ERROR = "error"
    DISABLED = "disabled"
    HEALTH_CHOICES = [(h, h) for h in (UNKNOWN, OK, ERROR, DISABLED)]
    SAVED = "saved"
    REFRESH = "refresh"
    CHANGED = "changed"
    EXPIRED = "expired"
    REASON_CHOICES = [(r, r) for r in (SAVED, REFRESH, CHANGED, EXPIRED)]

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="mcp_servers")
    name = models.SlugField(max_length=32)
    url = models.CharField(max_length=2000, blank=True, default="")
    headers_sealed = models.TextField(blank=True, default="")
    header_names = models.JSONField(default=list, blank=True)
    enabled = models.BooleanField(default=True)
    timeout_s = models.FloatField(default=60.0)
    tools = models.JSONField(null=True, blank=True)
    discovered = models.JSONField(default=list, blank=True)
    health = models.CharField(max_length=16, choices=HEALTH_CHOICES, default=UNKNOWN)
    last_error = models.TextField(blank=True, default="")
    protocol_version = models.CharField(max_length=32, blank=True, default="")
    refreshed_at = models.DateTimeField(null=True, blank=True)
    discovery_reason = models.CharField(max_length=16, choices=REASON_CHOICES, blank=True, default="")
    tools_fresh_until = models.DateTimeField(null=True, blank=True)
    created_by = models.CharField(max_length=150, blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        verbose_name = "team MCP server"
        ordering = ["team", "name"]
        constraints = [models.UniqueConstraint(fields=["team", "name"], name="teammcpserver_team_name_uniq")]

    def __str__(self) -> str:
        return f"{self.team_id}/{self.name}"

    @property
    def kind(self) -> str:
        """``http`` (the team's own server) or ``stdio`` (an installation server enabled)."""
        return "http" if self.url else "stdio"


class Session(models.Model):
    STATUS_CHOICES = [(s, s) for s in ("idle", "running", "awaiting", "completed", "failed", "cancelled")]
    MODE_CHOICES = [(m, m) for m in ("default", "plan", "accept_edits")]

    id = models.CharField(primary_key=True, max_length=40, default=new_session_id, editable=False)
    # No index of its own for owner, team, agent or status: the Meta indexes lead with
    # each. Every append that changes the cached projection writes a new version of the
    # row into every index of the table, and planning its statements reads them all.
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="sectr_sessions", db_index=False
    )
    # Chosen at creation; None = a personal session (its owner's and staff's only).
    # Deleting a team makes its sessions personal rather than visible to anyone else.
    team = models.ForeignKey(
        Team, on_delete=models.SET_NULL, null=True, blank=True, related_name="sessions", db_index=False
    )
    title = models.CharField(max_length=120, blank=True, default="")
    # None until a title is set; "user" (created with one or renamed) or "prompt" (first message).
    title_source = models.CharField(max_length=16, null=True, blank=True)  # noqa: DJ001 - mirrors SessionState
    mode = models.CharField(max_length=16, choices=MODE_CHOICES, default="default")
    model = models.CharField(max_length=200, default="demo")
    reasoning_effort = models.CharField(max_length=16, null=True, blank=True)  # noqa: DJ001 - None = provider default
    limits = models.JSONField(default=default_limits)
    status = models.CharField(max_length=16, choices=STATUS_CHOICES, default="idle")
    # The cached projection: sectr.state.SessionState.to_dict() as of the last append that
    # changed it. A batch of MESSAGE_DELTA only bumps last_seq/updated_at (they change
    # nothing else), so `state["last_seq"]` may lag behind the `last_seq` column; it moves
    # updated_at only when that is a second behind (journal.database.UPDATED_AT_STEP),
    # and appended_at always.
    state = models.JSONField(default=dict, blank=True)
    last_seq = models.IntegerField(default=0)
    compaction_seq = models.IntegerField(default=0)  # seq of the newest TRANSCRIPT_COMPACTED, 0 = none
    token_total = models.BigIntegerField(default=0)  # input + output tokens, every model
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now, db_index=True)  # the last envelope's time
    # The last batch of deltas' time, exact where updated_at (indexed) lags behind it by
    # up to a second: the projection's updated_at while the state JSON lags last_seq.
    appended_at = models.DateTimeField(null=True, blank=True)
    closed_at = models.DateTimeField(null=True, blank=True)
    # The pinned agent and version (SESSION_CREATED.agent, moved by SESSION_UPDATED.agent),
    # cached like the rest; None: the built-in default agent. PROTECT: an agent is never
    # deleted while a session uses it. No database constraint: the journal is the truth,
    # and a pin of an imported session may name an agent this installation never had (the
    # append that caches it must not fail for that).
    agent = models.ForeignKey(
        Agent,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="sessions",
        db_constraint=False,
        db_index=False,
    )
    agent_version = models.PositiveIntegerField(null=True, blank=True)
    # A replay of another session for an experiment (SESSION_CREATED.replay): kept out of
    # people's lists, searches and usage; read through its experiment.
    is_replay = models.BooleanField(default=False)

    class Meta:
        indexes = [
            # /review/'s Agent and Version filters.
            models.Index(fields=["agent", "agent_version", "updated_at"], name="session_agent_updated"),
            # The /review/ filters (Team, User, Model, State, From/To) and the admin's changelist.
            models.Index(fields=["team", "updated_at"], name="session_team_updated"),
            models.Index(fields=["owner", "updated_at"], name="session_owner_updated"),
            models.Index(fields=["model", "updated_at"], name="session_model_updated"),
            models.Index(fields=["status", "updated_at"], name="session_status_updated"),
            models.Index(fields=["created_at"], name="session_created"),
        ]

    def __str__(self) -> str:
        return self.title or self.id

    def projection(self) -> SessionState:
        """The cached projection, with last_seq (and updated_at: appended_at) from the columns."""
        if self.state:
            state = SessionState.from_dict({**self.state, "session_id": self.id})
        else:
            state = SessionState(session_id=self.id)
        if state.last_seq != self.last_seq:
            # Deltas were appended since the state JSON was written (the fast path).
            state.last_seq = self.last_seq
            state.updated_at = self.appended_at or self.updated_at
        return state

    @staticmethod
    def cached_columns(state: SessionState) -> dict[str, Any]:
        """The Session columns that cache `state` (for an UPDATE)."""
        total = state.total_usage
        return {
            "state": state.to_dict(),
            "last_seq": state.last_seq,
            "status": state.status,
            "title": state.title or "",
            "title_source": state.title_source,
            "mode": state.mode,
            "model": state.model,
            "reasoning_effort": state.reasoning_effort,
            "limits": state.limits,
            "compaction_seq": state.compaction_seq,
            "agent_id": (state.agent or {}).get("id"),
            "agent_version": (state.agent or {}).get("version"),
            "token_total": total.get("input_tokens", 0) + total.get("output_tokens", 0),
            "is_replay": state.replay is not None,
        }

    def rebuild_projection(self) -> SessionState:
        """Recompute the cached projection from the journal alone and store it.

        Takes the Session row lock first, like an append, so no append slips in between
        the read of the journal and the write of the cache.
        """
        with transaction.atomic():
            locked = Session.objects.select_for_update(no_key=True).get(pk=self.pk)
            envelopes = [row.to_envelope() for row in locked.envelopes.order_by("seq")]
            state = project(envelopes, session_id=self.id)
            columns = self.cached_columns(state)
            if state.updated_at is not None:
                columns["updated_at"] = state.updated_at
            Session.objects.filter(pk=self.pk).update(**columns)
        for name, value in columns.items():
            setattr(self, name, value)
        return state


#: The rows of Envelope's partial indexes: every one but a text delta.
NOT_DELTA = ~models.Q(type=EventType.MESSAGE_DELTA.value)


class Envelope(models.Model):
    """One journal row. Written only by sessions_app.journal.DatabaseJournal."""

    id = models.BigAutoField(primary_key=True)
    # No separate index on session: the (session, seq) unique index leads with it.
    # No database constraint: its check (a deferred trigger running a SELECT ... FOR KEY
    # SHARE of the Session row per inserted envelope, at COMMIT) was about a third of
    # PostgreSQL's CPU for a group of streamed deltas (66 -> 46 us per delta, groups of
    # 20). The journal inserts an envelope only under its Session row's lock, having
    # found the row (DatabaseJournal), and a session is deleted only under the same
    # lock, its envelopes with it (on_delete, in Django): no envelope can outlive it.
    session = models.ForeignKey(
        Session, on_delete=models.CASCADE, related_name="envelopes", db_index=False, db_constraint=False
    )
    seq = models.PositiveIntegerField()
    # Indexed by envelope_invocation, for the rows other than text deltas.
    invocation_id = models.CharField(max_length=40, null=True, blank=True)  # noqa: DJ001
    # No choices: adding an event type must not need a migration.
    type = models.CharField(max_length=32)
    payload = models.JSONField()
    created_at = models.DateTimeField()

    class Meta:
        db_table = "sessions_app_envelope"
        constraints = [models.UniqueConstraint(fields=["session", "seq"], name="envelope_session_seq_uniq")]
        # Text deltas are most of the journal's rows, one written per streamed chunk, and
        # nothing looks them up by type or invocation: the (session, seq) index serves
        # the reads of a message's deltas (between its MESSAGE_START and MESSAGE_END).
        # So these two indexes leave them out, and every chunk writes two index entries
        # fewer (of its four, the primary key's included). PostgreSQL uses a partial
        # index only for a query whose WHERE implies its predicate: `type = 'X'` does
        # while 'X' is in the statement's text (Django binds values on the client); SQL
        # run prepared, or that names no type, spells the predicate out as a literal
        # (ReviewProjection._message_text, the admin's search by invocation).
        indexes = [
            models.Index(fields=["session", "type", "seq"], condition=NOT_DELTA, name="envelope_session_type_seq"),
            models.Index(fields=["invocation_id"], condition=NOT_DELTA, name="envelope_invocation"),
            # /review/'s `Failed` filter (a session whose invocation failed once): a few
            # rows of the journal's millions, so the filter reads them, not the journal.
            models.Index(
                fields=["session"], condition=models.Q(type="INVOCATION_FAILED"), name="envelope_failed_session"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.session_id}#{self.seq} {self.type}"

    def to_envelope(self) -> JournalEnvelope:
        return JournalEnvelope(
            session_id=self.session_id,
            seq=self.seq,
            invocation_id=self.invocation_id,
            type=EventType(self.type),
            payload=self.payload,
            created_at=self.created_at,
        )


class Run(models.Model):
    """A run as a client sees it, and the work queue's row for it.

    pending: queued behind an active run, nothing journaled yet; queued: its
    INVOCATION_STARTED is journaled and it waits for a worker; running: a worker holds
    it under a lease; suspended: it ended on an approval ask; completed / failed /
    cancelled: finished. A recover invocation continues the same run, so a run may own
    several invocations (`invocation_ids`); `invocation_id` is the current one.

    A worker's journal writes are fenced by (id, lease_token): once the lease is taken
    over or the run is finished, DatabaseJournal refuses them (LeaseLost).
    """

    PENDING = "pending"
    QUEUED = "queued"
    RUNNING = "running"
    SUSPENDED = "suspended"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    STATUS_CHOICES = [(s, s) for s in (PENDING, QUEUED, RUNNING, SUSPENDED, COMPLETED, FAILED, CANCELLED)]
    #: A run in one of these states holds no lease and takes no more journal writes.
    FINISHED_STATUSES = frozenset({SUSPENDED, COMPLETED, FAILED, CANCELLED})

    id = models.CharField(primary_key=True, max_length=40, default=new_run_id, editable=False)
    # No index of its own for session or status: run_session_status and run_status_lease
    # lead with them (a run's claim, heartbeats and end update every index of the row).
    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="runs", db_index=False)
    invocation_id = models.CharField(max_length=40, unique=True, null=True, blank=True)  # noqa: DJ001 - unique
    invocation_ids = models.JSONField(default=list, blank=True)
    reason = models.JSONField(default=dict, blank=True)
    status = models.CharField(max_length=16, choices=STATUS_CHOICES, default=PENDING)
    lease_owner = models.CharField(max_length=200, null=True, blank=True)  # noqa: DJ001 - None = not leased
    lease_token = models.CharField(max_length=64, null=True, blank=True)  # noqa: DJ001 - None = not leased
    lease_expires_at = models.DateTimeField(null=True, blank=True, db_index=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    max_attempts = models.PositiveIntegerField(default=3)
    stop_reason = models.CharField(max_length=32, blank=True, default="")
    usage = models.JSONField(default=dict, blank=True)
    error = models.TextField(blank=True, default="")
    cancel_requested = models.BooleanField(default=False)
    # Who asked (journaled as INVOCATION_CANCELLED.by).
    cancel_requested_by = models.CharField(max_length=150, blank=True, default="")
    pending_steer = models.TextField(blank=True, default="")
    steer_author = models.CharField(max_length=150, blank=True, default="")
    start_seq = models.PositiveIntegerField(null=True, blank=True)  # seq of its INVOCATION_STARTED
    # The session's last seq when the current attempt was claimed: a lost attempt that
    # journaled nothing since made no progress (runs.fail_exhausted counts only those).
    claimed_seq = models.PositiveBigIntegerField(null=True, blank=True)
    # The ApiToken id it was started through (0: the web UI), for the usage rollup.
    api_token_key = models.BigIntegerField(default=0)
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["status", "lease_expires_at"], name="run_status_lease"),
            models.Index(fields=["session", "status"], name="run_session_status"),
        ]

    def __str__(self) -> str:
        return f"{self.id} ({self.status})"

    @property
    def is_finished(self) -> bool:
        return self.status in self.FINISHED_STATUSES or self.finished_at is not None


class AskIndex(models.Model):
    """Every approval ask, indexed: which session it belongs to (POST /asks/{ask_id} names
    only the ask), its tool, status and deadline (for GET /asks and the expiry sweep).

    A projection of the journal like the Session row's cache: DatabaseJournal writes it
    in the same transaction as the envelopes that ask, decide or withdraw
    (sessions_app.journal.ask_index), and `rebuild_ask_index` recomputes it.
    """

    PENDING = "pending"
    STATUS_CHOICES = [(s, s) for s in ("pending", "approved", "denied", "withdrawn")]

    ask_id = models.CharField(primary_key=True, max_length=64)
    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="ask_index")
    tool = models.CharField(max_length=100, blank=True, default="", db_index=True)
    status = models.CharField(max_length=16, choices=STATUS_CHOICES, default=PENDING)
    requested_at = models.DateTimeField(null=True, blank=True, db_index=True)
    # requested_at + expires_after_s: the expiry sweep denies the ask once it has passed.
    deadline = models.DateTimeField(null=True, blank=True)
    approvals_required = models.PositiveSmallIntegerField(default=1)
    rule_id = models.CharField(max_length=64, blank=True, default="")  # the rule that matched, if any
    decided_at = models.DateTimeField(null=True, blank=True)
    decided_by = models.CharField(max_length=150, blank=True, default="")  # approver (user, rule:<id>, policy:expired)
    verdict = models.CharField(max_length=16, blank=True, default="")

    class Meta:
        verbose_name_plural = "ask indexes"
        indexes = [models.Index(fields=["status", "deadline"], name="askindex_status_deadline")]

    def __str__(self) -> str:
        return f"{self.ask_id} in {self.session_id}"


class ToolGrant(models.Model):
    """A cached allow_always grant (the journal's approval decisions are the truth)."""

    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="tool_grants")
    tool_name = models.CharField(max_length=100)
    granted_by = models.CharField(max_length=150, blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["session", "tool_name"], name="toolgrant_session_tool_uniq")]

    def __str__(self) -> str:
        return f"{self.tool_name} in {self.session_id}"


def media_upload_path(instance: MediaBlob, filename: str) -> str:
    # Content-addressed: the same bytes are stored once, whoever uploads them.
    return f"media/{instance.sha256[:2]}/{instance.sha256}"


class MediaBlob(models.Model):
    """Stored bytes of an image or audio part, referenced from the journal by sha256."""

    KIND_CHOICES = [("image", "image"), ("audio", "audio")]

    sha256 = models.CharField(max_length=64, unique=True)
    mime_type = models.CharField(max_length=100)
    size = models.PositiveIntegerField()
    kind = models.CharField(max_length=8, choices=KIND_CHOICES)
    file = models.FileField(upload_to=media_upload_path)
    created_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"{self.kind} {self.sha256[:12]} ({self.mime_type}, {self.size} bytes)"

    @classmethod
    def delete_orphans(cls, blob_ids: Iterable[int] | None = None) -> int:
        """Delete blobs no session links to (all of them, or only among `blob_ids`).

        The files are removed after the transaction commits, so a rollback never leaves
        a row pointing at a missing file. Returns how many blobs were deleted.
        """
        orphans = cls.objects.filter(sessions__isnull=True)
        if blob_ids is not None:
            orphans = orphans.filter(pk__in=list(blob_ids))
        doomed = list(orphans)
        files = [(blob.file.storage, blob.file.name) for blob in doomed if blob.file]
        cls.objects.filter(pk__in=[blob.pk for blob in doomed]).delete()
        if files:

            def remove_files() -> None:
                for storage, name in files:
                    storage.delete(name)

            transaction.on_commit(remove_files)
        return len(doomed)


class SessionMedia(models.Model):
    """Which session uses which blob, so deleting a session can delete its media."""

    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="media_links")
    blob = models.ForeignKey(MediaBlob, on_delete=models.PROTECT, related_name="sessions")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        verbose_name_plural = "session media"
        constraints = [models.UniqueConstraint(fields=["session", "blob"], name="sessionmedia_session_blob_uniq")]

    def __str__(self) -> str:
        return f"{self.blob_id} in {self.session_id}"


TOKEN_PREFIX = "sectr_"  # noqa: S105 - the public marker of a raw token, not a secret
TOKEN_PREFIX_LENGTH = 12  # "sectr_" and 6 random characters: shown in lists, used to look up
LAST_USED_RESOLUTION = timedelta(minutes=1)  # write last_used_at at most this often per token


def hash_token(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


class ApiToken(models.Model):
    """A bearer token for the HTTP API. Only the sha256 of the secret is stored."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=TOKEN_PREFIX_LENGTH, db_index=True)
    token_hash = models.CharField(max_length=64, unique=True, editable=False)
    created_at = models.DateTimeField(default=timezone.now)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = "API token"

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @classmethod
    def issue(cls, user: Any, name: str) -> tuple[ApiToken, str]:
        """Create a token; returns it with the raw secret, which is shown once and never stored."""
        raw = TOKEN_PREFIX + secrets.token_urlsafe(32)
        token = cls.objects.create(user=user, name=name, prefix=raw[:TOKEN_PREFIX_LENGTH], token_hash=hash_token(raw))
        return token, raw

    @classmethod
    def authenticate(cls, raw: str | None) -> ApiToken | None:
        """The live token whose secret is `raw`, or None (unknown, malformed or revoked)."""
        if not raw or not raw.startswith(TOKEN_PREFIX) or len(raw) > 200:
            return None
        digest = hash_token(raw)
        found: ApiToken | None = None
        # Look up by the non-secret prefix and compare the hashes in constant time, so
        # neither the database index nor the comparison leaks how much of a guess matched.
        for candidate in cls._with_users(raw[:TOKEN_PREFIX_LENGTH]):
            if hmac.compare_digest(candidate.token_hash, digest):
                found = candidate
        if found is None or found.revoked_at is not None or not found.user.is_active:
            return None
        now = timezone.now()
        if found.last_used_at is None or now - found.last_used_at > LAST_USED_RESOLUTION:
            # Throttled: one write per token per minute, not one per request (SQLite has
            # a single writer, and the journal needs it more).
            found.last_used_at = now
            found._write_last_used()
        return found

    @classmethod
    def _with_users(cls, prefix: str) -> list[ApiToken]:
        """`filter(prefix=prefix).select_related("user")` in plain SQL: every API request
        runs it, and compiling the queryset cost more than running it (a burst of a
        hundred streamed POSTs, py-spy). Each token's user is its cached relation, as
        select_related leaves it."""
        from django.db import connections

        from sessions_app.plain_sql import hot_cursor, model_columns, model_instances

        connection = connections[cls.objects.db]
        user_field: Any = cls._meta.get_field("user")
        user_model = user_field.related_model
        qn = connection.ops.quote_name
        columns = f"{model_columns(connection, cls, 't')}, {model_columns(connection, user_model, 'u')}"
        join = f"u.{qn(user_model._meta.pk.column)} = t.{qn(user_field.column)}"
        with hot_cursor(connection) as cursor:
            cursor.execute(
                f"SELECT {columns} FROM {qn(cls._meta.db_table)} t"  # noqa: S608 - quoted names
                f" INNER JOIN {qn(user_model._meta.db_table)} u ON {join}"
                f" WHERE t.{qn(cast(models.Field, cls._meta.get_field('prefix')).column)} = %s",
                [prefix],
            )
            rows = cursor.fetchall()
        tokens = model_instances(connection, cls, rows)
        users = model_instances(connection, user_model, rows, start=len(cls._meta.concrete_fields))
        for token, user in zip(tokens, users, strict=True):
            user_field.set_cached_value(token, user)
        return tokens

    def _write_last_used(self) -> None:
        """`filter(pk=...).update(last_used_at=...)` in plain SQL (compiling the UPDATE
        cost more than running it); no signal, as a queryset's update sends none."""
        from django.db import connections, router

        connection = connections[router.db_for_write(type(self), instance=self)]
        qn = connection.ops.quote_name
        field = cast(models.Field, self._meta.get_field("last_used_at"))
        with connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {qn(self._meta.db_table)} SET {qn(field.column)} = %s WHERE {qn(self._meta.pk.column)} = %s",  # noqa: S608 - quoted names
                [field.get_db_prep_save(self.last_used_at, connection), self.pk],
            )

    @property
    def is_revoked(self) -> bool:
        return self.revoked_at is not None

    def revoke(self) -> None:
        if self.revoked_at is None:
            self.revoked_at = timezone.now()
            self.save(update_fields=["revoked_at"])


class ReviewNote(models.Model):
    """A teammate's note on a session (optionally pinned to one envelope's seq)."""

    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="review_notes")
    author = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="sectr_review_notes")
    seq = models.PositiveIntegerField(null=True, blank=True)
    body = models.TextField()
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"note by {self.author_id} on {self.session_id}"


# ---- team review (issue 10): search index, usage rollup, forks, ratings, queues, shares ----
#
# SearchEntry, UsageDaily and ForkLink are projections of the journal: DatabaseJournal
# writes them in the same transaction as the envelopes they reflect
# (sessions_app.journal.projections), and `manage.py sectr_reindex` rebuilds them.


class SearchEntry(models.Model):
    """One searchable text of a session: a user message, an assistant message, a steer,
    or a tool call's name. PostgreSQL searches it through a GIN index on its tsvector;
    SQLite through the FTS5 table sessions_app_searchentry_fts, kept by triggers
    (both made by migration 0001_initial)."""

    KIND_CHOICES = [(k, k) for k in ("user", "assistant", "steer", "tool")]

    id = models.BigAutoField(primary_key=True)
    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="search_entries", db_index=False)
    seq = models.PositiveIntegerField()
    kind = models.CharField(max_length=16, choices=KIND_CHOICES)
    text = models.TextField()

    class Meta:
        verbose_name_plural = "search entries"
        indexes = [models.Index(fields=["session", "seq"], name="searchentry_session_seq")]

    def __str__(self) -> str:
        return f"{self.kind} at {self.session_id}#{self.seq}"


class UsageDaily(models.Model):
    """Tokens per (UTC day, session owner, session team, API token, model, agent version), summed from
    MESSAGE_END usage as the journal writes it. `team_key` is the session's Team id and
    `api_token_key` the ApiToken's id, 0 for none (a personal session; the web UI): 0,
    not NULL, because a unique constraint treats NULLs as distinct and the upsert needs
    one row per key. Plain integers, not foreign keys: usage outlives a deleted token."""

    day = models.DateField()
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    team_key = models.BigIntegerField(default=0)
    api_token_key = models.BigIntegerField(default=0)
    model = models.CharField(max_length=200)
    #: The pinned agent and version, "<agent id>:<version>" ("" for the built-in agent).
    agent_key = models.CharField(max_length=60, default="", db_default="")
    input_tokens = models.BigIntegerField(default=0)
    output_tokens = models.BigIntegerField(default=0)
    reasoning_tokens = models.BigIntegerField(default=0)
    cached_input_tokens = models.BigIntegerField(default=0)
    messages = models.BigIntegerField(default=0)

    class Meta:
        verbose_name = "daily usage"
        verbose_name_plural = "daily usage"
        constraints = [
            models.UniqueConstraint(
                fields=["day", "user", "team_key", "api_token_key", "model", "agent_key"], name="usagedaily_key_uniq"
            )
        ]
        indexes = [
            models.Index(fields=["user", "day"], name="usagedaily_user_day"),
            models.Index(fields=["team_key", "day"], name="usagedaily_team_day"),
        ]

    def __str__(self) -> str:
        return f"{self.day} {self.user_id} {self.model}"


class ForkLink(models.Model):
    """A fork's source (SESSION_CREATED.forked_from), indexed both ways for the review page."""

    child = models.OneToOneField(Session, on_delete=models.CASCADE, primary_key=True, related_name="fork_source")
    source = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="fork_children")
    seq = models.PositiveIntegerField(default=0)

    def __str__(self) -> str:
        return f"{self.child_id} forked from {self.source_id}#{self.seq}"


class ModelPrice(models.Model):
    """What a model costs, per million tokens, set in the admin (the usage page's cost)."""

    model = models.CharField(max_length=200, unique=True)
    input_per_million = models.DecimalField(max_digits=12, decimal_places=4, default=0)
    output_per_million = models.DecimalField(max_digits=12, decimal_places=4, default=0)
    currency = models.CharField(max_length=8, default="USD")

    def __str__(self) -> str:
        return f"{self.model}: {self.input_per_million}/{self.output_per_million} {self.currency} per 1M"

    def cost_of(self, input_tokens: int, output_tokens: int) -> Decimal:
        spent = Decimal(input_tokens) * self.input_per_million + Decimal(output_tokens) * self.output_per_million
        return spent / Decimal(1_000_000)


class Rating(models.Model):
    """Feedback on a session (seq 0) or one assistant message (its MESSAGE_END seq).

    `source` keeps reviewers' ratings apart from end users' own thumbs on the chat page:
    the two are never mixed in one count. One rating per (session, seq, author, source):
    rating again replaces it.
    """

    REVIEWER = "reviewer"
    END_USER = "end_user"
    SOURCE_CHOICES = [(REVIEWER, "reviewer"), (END_USER, "end user")]

    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="ratings")
    seq = models.PositiveIntegerField(default=0)  # 0: the whole session
    message_id = models.CharField(max_length=64, blank=True, default="")
    author = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="sectr_ratings")
    source = models.CharField(max_length=16, choices=SOURCE_CHOICES, default=REVIEWER)
    thumbs = models.SmallIntegerField(null=True, blank=True)  # +1 up, -1 down, None: not given
    score = models.PositiveSmallIntegerField(null=True, blank=True)  # optional 1-5
    tags = models.JSONField(default=list, blank=True)
    #: The team's own scores (`ScoreConfig`), by name: a label, a number or true/false.
    #: Thumbs and the 1-5 score are the built-in ones (sessions_app.review.scores).
    values = models.JSONField(default=dict, blank=True)
    comment = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["session", "seq", "author", "source"], name="rating_one_per_author")
        ]
        indexes = [models.Index(fields=["source", "created_at"], name="rating_source_created")]

    def __str__(self) -> str:
        target = f"#{self.seq}" if self.seq else "session"
        thumbs = {1: "+", -1: "-"}.get(self.thumbs or 0, "")
        return f"{thumbs}{self.values or ''} by {self.author_id} on {self.session_id} {target}".strip()


class ScoreConfig(models.Model):
    """One of a team's own scores (docs/review.md, "Scores"): what its reviewers rate
    sessions and messages with, defined by its moderators. A categorical score takes one
    of its `labels`, a numeric one a number from `minimum` to `maximum`, a boolean one
    true or false. The built-in thumbs and 1-5 score every team has are code
    (sessions_app.review.scores.BUILT_IN), not rows."""

    CATEGORICAL = "categorical"
    NUMERIC = "numeric"
    BOOLEAN = "boolean"
    KIND_CHOICES = [(CATEGORICAL, "categorical"), (NUMERIC, "numeric"), (BOOLEAN, "boolean")]

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="scores")
    name = models.SlugField(max_length=40)
    kind = models.CharField(max_length=12, choices=KIND_CHOICES)
    labels = models.JSONField(default=list, blank=True)
    minimum = models.FloatField(null=True, blank=True)
    maximum = models.FloatField(null=True, blank=True)
    description = models.CharField(max_length=500, blank=True, default="")
    created_by = models.CharField(max_length=150, blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["team", "name"]
        constraints = [models.UniqueConstraint(fields=["team", "name"], name="scoreconfig_team_name_uniq")]

    def __str__(self) -> str:
        return f"{self.team_id}:{self.name} ({self.kind})"


class ReviewMark(models.Model):
    """A session marked reviewed (no row: unreviewed)."""

    session = models.OneToOneField(Session, on_delete=models.CASCADE, primary_key=True, related_name="review_mark")
    reviewed_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    reviewed_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"{self.session_id} reviewed by {self.reviewed_by_id}"


class ReviewQueue(models.Model):
    """A named list of one team's sessions to review, worked through by its assigned reviewers.

    Everything about a queue follows its team's roles (sessions_app.review.actions): who
    sees it, lists it, fills it, works it and may be assigned to it. A queue without a
    team (made before queues had one, and not attributable to one) is staff's alone."""

    team = models.ForeignKey(Team, null=True, blank=True, on_delete=models.CASCADE, related_name="review_queues")
    name = models.CharField(max_length=100)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    reviewers = models.ManyToManyField(settings.AUTH_USER_MODEL, blank=True, related_name="sectr_review_queues")
    #: Who was handed the last item: the next add goes on with the reviewer after them
    #: (the round robin's cursor, kept across adds).
    last_assignee = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["team", "name"], name="reviewqueue_team_name_uniq")]

    def __str__(self) -> str:
        return self.name


class ReviewQueueItem(models.Model):
    """One session in a queue; a session is in a queue at most once (duplicates refused).

    A pair item (`pair` set) asks for a blind A/B verdict on one experiment pair: its
    session is that pair's replay session (one per source and candidate, so the "once
    per queue" rule holds for pairs too), and its reviewer judges it on the pair page,
    never on the session's own review page (sessions_app.experiments.queue)."""

    queue = models.ForeignKey(ReviewQueue, on_delete=models.CASCADE, related_name="items")
    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="queue_items")
    position = models.PositiveIntegerField()
    assignee = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    added_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    added_at = models.DateTimeField(default=timezone.now)
    done_at = models.DateTimeField(null=True, blank=True)
    pair = models.ForeignKey("Replay", null=True, blank=True, on_delete=models.CASCADE, related_name="queue_items")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["queue", "session"], name="queueitem_once_per_queue")]
        indexes = [models.Index(fields=["queue", "assignee", "position"], name="queueitem_assignee_pos")]
        ordering = ["position"]

    def __str__(self) -> str:
        return f"{self.session_id} in {self.queue_id}"


def new_share_token() -> str:
    return secrets.token_urlsafe(24)


SHARE_DEFAULT_LIFETIME = timedelta(days=7)


def default_share_expiry() -> Any:
    return timezone.now() + SHARE_DEFAULT_LIFETIME


class ShareLink(models.Model):
    """A read-only link to a session's transcript as of `seq` (fixed when it was made)."""

    token = models.CharField(max_length=64, unique=True, default=new_share_token, editable=False)
    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="share_links")
    seq = models.PositiveIntegerField()
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="sectr_shares")
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField(default=default_share_expiry)
    require_login = models.BooleanField(default=False)
    revoked_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"share of {self.session_id} at #{self.seq}"

    def is_live(self, now: Any = None) -> bool:
        return self.revoked_at is None and self.expires_at > (now or timezone.now())


class AuditEntry(models.Model):
    """One row of the moderation audit: an ask, a vote, a decision (a person's, a rule's
    or the expiry policy's) or a withdrawal, as the journal recorded it.

    A projection of the journal, never a second truth: sessions_app.journal.moderation
    writes these in the same transaction as the envelopes they reflect, and
    `manage.py sectr_rebuild_audit` recomputes the whole table from the journal alone.
    `seq` is the seq of the envelope the row comes from (an ask a rule decided at once
    gives two rows of one envelope: the ask and the rule's decision).
    """

    ASK = "ask"
    VOTE = "vote"
    DECISION = "decision"  # a person's verdict that resumed the run
    RULE = "rule"  # an approval rule decided at once (approver "rule:<id>")
    EXPIRY = "expiry"  # denied by the expiry policy (approver "policy:expired")
    WITHDRAWN = "withdrawn"  # the paused run was cancelled
    KIND_CHOICES = [(k, k) for k in (ASK, VOTE, DECISION, RULE, EXPIRY, WITHDRAWN)]
    #: the kinds that end an ask with a verdict (time-to-decision counts these)
    VERDICT_KINDS = (DECISION, RULE, EXPIRY)

    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="audit_entries")
    seq = models.PositiveIntegerField()
    kind = models.CharField(max_length=16, choices=KIND_CHOICES)
    ask_id = models.CharField(max_length=64, db_index=True)
    actor = models.CharField(max_length=150, blank=True, default="")  # username, "rule:<id>", "policy:expired"
    verdict = models.CharField(max_length=16, blank=True, default="")
    note = models.TextField(blank=True, default="")
    tool = models.CharField(max_length=100, blank=True, default="")
    arguments = models.JSONField(default=dict, blank=True)
    # A decision that ran the call with arguments a person edited: those that ran
    # (`arguments` stays what was asked). Null: as asked, or not a decision.
    run_arguments = models.JSONField(null=True, blank=True)
    requester = models.CharField(max_length=150, blank=True, default="")  # the session's owner
    rule = models.CharField(max_length=200, blank=True, default="")  # the approval rule that matched, if any
    asked_at = models.DateTimeField(null=True, blank=True)
    at = models.DateTimeField(db_index=True)  # the envelope's time
    seconds_to_decide = models.FloatField(null=True, blank=True)

    class Meta:
        verbose_name_plural = "audit entries"
        ordering = ["-at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["session", "seq", "kind"], name="auditentry_session_seq_kind_uniq")
        ]
        indexes = [models.Index(fields=["kind", "at"], name="auditentry_kind_at")]

    def __str__(self) -> str:
        return f"{self.kind} {self.verdict} on {self.ask_id} by {self.actor}"

    @property
    def edited(self) -> bool:
        """Whether the call ran with arguments a person edited."""
        return self.run_arguments is not None


def new_webhook_secret() -> str:
    return secrets.token_urlsafe(32)


class TeamWebhook(models.Model):
    """A team's webhook: called (JSON, HMAC-SHA256 signed with `secret`) on every new ask
    and every vote, decision and withdrawal of the team's sessions. Managed in the admin;
    deliveries are NotificationDelivery rows (sessions_app.moderation.notifications)."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="webhooks")
    JSON = "json"
    SLACK = "slack"
    KIND_CHOICES = [(JSON, "JSON (signed, Sectr's own body)"), (SLACK, "Slack-style (incoming webhook, Block Kit)")]

    url = models.URLField(max_length=500)
    secret = models.CharField(max_length=200, default=new_webhook_secret)
    #: the body's shape: Sectr's JSON, or a Slack incoming-webhook message
    #: (sessions_app.moderation.slack), which Slack and Mattermost channels show
    kind = models.CharField(max_length=8, choices=KIND_CHOICES, default=JSON)
    active = models.BooleanField(default=True)
    created_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"{self.team} → {self.url}"


class NotificationDelivery(models.Model):
    """One notification to send (an outbox row) and its delivery log.

    Written in the same transaction as the envelope it announces (so a rolled back
    decision notifies nobody, and a committed one is never forgotten, even across a
    restart); sent later by the worker loop with retries and backoff.
    """

    WEBHOOK = "webhook"
    EMAIL = "email"
    CHANNEL_CHOICES = [(WEBHOOK, WEBHOOK), (EMAIL, EMAIL)]
    PENDING = "pending"
    DELIVERED = "delivered"
    FAILED = "failed"  # gave up after the last retry
    STATUS_CHOICES = [(s, s) for s in (PENDING, DELIVERED, FAILED)]

    channel = models.CharField(max_length=8, choices=CHANNEL_CHOICES)
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="notifications")
    webhook = models.ForeignKey(TeamWebhook, on_delete=models.CASCADE, null=True, blank=True, related_name="deliveries")
    event = models.CharField(max_length=32)  # ask.requested, ask.voted, ask.decided, ask.withdrawn
    ask_id = models.CharField(max_length=64, db_index=True)
    session_id = models.CharField(max_length=40)  # not a key: the log outlives a deleted session
    payload = models.JSONField(default=dict)
    recipients = models.JSONField(default=list, blank=True)  # email addresses (channel email)
    status = models.CharField(max_length=12, choices=STATUS_CHOICES, default=PENDING)
    attempts = models.PositiveSmallIntegerField(default=0)
    next_attempt_at = models.DateTimeField(default=timezone.now)
    last_status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name_plural = "notification deliveries"
        indexes = [models.Index(fields=["status", "next_attempt_at"], name="delivery_status_next")]

    def __str__(self) -> str:
        return f"{self.channel} {self.event} {self.ask_id} ({self.status})"


class PeriodicJob(models.Model):
    """A job the workers share, done by one of them at a time every `interval`
    (the retention sweep): the worker whose conditional UPDATE moves `due_at` on from a
    past value does it (sessions_app.ops.retention.claim_periodic_job); the others see
    it done until then. Its last run (who, when, a summary) is kept for operators."""

    name = models.CharField(primary_key=True, max_length=40)
    due_at = models.DateTimeField(default=timezone.now)
    holder = models.CharField(max_length=200, blank=True, default="")  # the worker of its last run
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    summary = models.JSONField(default=dict, blank=True)

    def __str__(self) -> str:
        return self.name


class ActionLinkUse(models.Model):
    """An action link that has decided (sessions_app.action_links): its token's
    SHA-256, so a link decides once. Written in the transaction of its decision."""

    digest = models.CharField(primary_key=True, max_length=64)
    ask_id = models.CharField(max_length=64, db_index=True)
    used_by = models.CharField(max_length=150)
    used_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"link for {self.ask_id} used by {self.used_by}"


class McpApproval(models.Model):
    """One `approval_prompt` call of an MCP client (sessions_app.approval_service): the
    ask it made, in which session of which group. `tool_use_id` (the client's id of the
    call it asks about) is unique per owner, so a client that calls again for the same
    tool use (a retry after a dropped connection or a restart) finds this ask and its
    decision, never a second one; the unique index settles two calls at once.
    `group` names the sessions the owner's calls go to (one MCP session, or one token
    and client per UTC day, or a session the caller named)."""

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    tool_use_id = models.CharField(max_length=200, blank=True, default="")  # "" when the client gave none
    group = models.CharField(max_length=300)
    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="mcp_approvals")
    ask_id = models.CharField(max_length=64, unique=True)
    client = models.CharField(max_length=200, blank=True, default="")  # clientInfo name and version
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["owner", "tool_use_id"],
                condition=~models.Q(tool_use_id=""),
                name="mcpapproval_owner_tool_use_uniq",
            )
        ]
        indexes = [models.Index(fields=["owner", "group", "created_at"], name="mcpapproval_group")]

    def __str__(self) -> str:
        return f"{self.ask_id} ({self.client or 'MCP client'})"


def new_experiment_id() -> str:
    return f"exp_{uuid.uuid4().hex[:16]}"


class Experiment(models.Model):
    """A set of a team's sessions replayed on one or more candidates (agent versions,
    or a model change) to compare with what was recorded (sessions_app.experiments)."""

    id = models.CharField(primary_key=True, max_length=40, default=new_experiment_id, editable=False)
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="experiments")
    name = models.CharField(max_length=120)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)
    live_reads = models.BooleanField(default=False)
    # [{"label", "agent" (id or None), "slug", "version", "model"}], in the order shown.
    candidates = models.JSONField(default=list)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return self.name


class Replay(models.Model):
    """One source session replayed for one candidate of an experiment: the replay
    session, its turns (the source's user messages) and where it stands."""

    experiment = models.ForeignKey(Experiment, on_delete=models.CASCADE, related_name="replays")
    source = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="+")
    candidate = models.PositiveSmallIntegerField()
    session = models.OneToOneField(Session, on_delete=models.CASCADE, related_name="replay_entry")
    turns = models.PositiveIntegerField()

    class Meta:
        ordering = ["pk"]
        constraints = [
            models.UniqueConstraint(fields=["experiment", "source", "candidate"], name="replay_unique_pair"),
        ]

    def __str__(self) -> str:
        return f"{self.source_id} on candidate {self.candidate}"


class PairVerdict(models.Model):
    """A reviewer's blind judgment of one source session: the recorded baseline against
    one candidate's replay. Stored as what won (baseline, candidate or tie), whichever
    side the reviewer saw it on."""

    BASELINE, CANDIDATE, TIE = "baseline", "candidate", "tie"
    CHOICES = [(BASELINE, "Baseline"), (CANDIDATE, "Candidate"), (TIE, "Tie")]

    experiment = models.ForeignKey(Experiment, on_delete=models.CASCADE, related_name="verdicts")
    source = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="+")
    candidate = models.PositiveSmallIntegerField()
    reviewer = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    winner = models.CharField(max_length=16, choices=CHOICES)
    note = models.TextField(blank=True, default="")
    #: The reviewer's scores of each side, by the team's score names, stored by what the
    #: side is (never by where it was shown): {"baseline": {...}, "candidate": {...}}.
    scores = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["experiment", "source", "candidate", "reviewer"], name="pair_verdict_once_per_reviewer"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.winner} by {self.reviewer_id}"
