"""Request bodies and the smaller answers (run status, session pages), shared by both clients."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sectr.client.errors import InvalidRequestError, ProtocolError
from sectr.client.models import RunResult, Snapshot


def session_body(
    title: str | None,
    mode: Any,
    model: str | None,
    limits: dict[str, int] | None,
    reasoning_effort: str | None,
    team: str | None = None,
    agent: str | None = None,
    agent_version: int | None = None,
) -> dict[str, Any]:
    """The create body; `team` None leaves the choice to the server (the owner's one team),
    "" asks for a personal session. `agent` (an id or `team/slug`) None: the team's first
    agent, else the built-in one."""
    body: dict[str, Any] = {}
    if team is not None:
        body["team"] = team or None
    for key, value in (
        ("title", title),
        ("mode", str(mode) if mode is not None else None),
        ("model", model),
        ("limits", limits),
        ("reasoning_effort", reasoning_effort),
        ("agent", agent),
        ("agent_version", agent_version),
    ):
        if value is not None:
            body[key] = value
    return body


def fork_body(
    title: str | None,
    reasoning_effort: str | None,
    model: str | None,
    at_seq: int | None,
    provider_id: str | None = None,
    model_id: str | None = None,
    worktree_selector: str | dict[str, Any] | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {}
    for key, value in (
        ("title", title),
        ("reasoning_effort", reasoning_effort),
        ("model", model),
        ("at_seq", at_seq),
        ("provider_id", provider_id),
        ("model_id", model_id),
        ("worktree_selector", worktree_selector),
    ):
        if value is not None:
            body[key] = value
    return body


def run_body(content: Any, queue: bool) -> dict[str, Any]:
    if not isinstance(content, str | list):
        raise InvalidRequestError("content is a string or a list of parts", code="prompt")
    body: dict[str, Any] = {"content": content}
    if queue:
        body["queue"] = True
    return body


@dataclass(frozen=True)
class RunInfo:
    """A run's status as the server reports it (``GET /runs/{id}``)."""

    run_id: str
    session_id: str
    status: str
    stop_reason: str | None
    usage: dict[str, int]
    error: str | None
    result: RunResult | None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def active(self) -> bool:
        return self.status in ("pending", "queued", "running")

    @classmethod
    def from_json(cls, data: Any) -> RunInfo:
        if not isinstance(data, dict) or "run_id" not in data or "status" not in data:
            raise ProtocolError("a run answer without run_id and status")
        result = None
        if isinstance(data.get("result"), dict):
            payload = data["result"]
            result = RunResult(
                run_id=data["run_id"],
                text=str(payload.get("text") or ""),
                stop_reason=str(payload.get("stop")),
                usage=dict(payload.get("usage") or {}),
                error=payload.get("error"),
                run_ids=(data["run_id"],),
            )
        return cls(
            run_id=data["run_id"],
            session_id=str(data.get("session_id", "")),
            status=data["status"],
            stop_reason=data.get("stop_reason"),
            usage=dict(data.get("usage") or {}),
            error=data.get("error"),
            result=result,
            raw=data,
        )


@dataclass(frozen=True)
class SessionPage:
    sessions: list[Snapshot]
    count: int
    next_offset: int | None

    @classmethod
    def from_json(cls, data: Any) -> SessionPage:
        if not isinstance(data, dict) or not isinstance(data.get("sessions"), list):
            raise ProtocolError("a session list without sessions")
        return cls(
            [Snapshot.from_json(s) for s in data["sessions"]], int(data.get("count", 0)), data.get("next_offset")
        )

    def __iter__(self) -> Any:
        return iter(self.sessions)

    def __len__(self) -> int:
        return len(self.sessions)


# ---- asks and rules (docs/moderation.md) ----


@dataclass(frozen=True)
class AskInfo:
    """One approval ask as ``GET /asks`` lists it."""

    ask_id: str
    session_id: str
    team: str | None
    owner: str
    tool: str
    arguments: dict[str, Any]
    state: str  # "pending" or "decided"
    status: str  # pending, approved, denied, withdrawn
    approvals_required: int
    votes: list[dict[str, Any]]
    rule_id: str | None
    decided_by: str | None
    verdict: str | None
    requested_at: str | None
    deadline: str | None
    #: a re-ask after a crash cut this call off once it had started: it may have run
    may_have_run: bool = False
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, data: Any) -> AskInfo:
        if not isinstance(data, dict) or "ask_id" not in data or "status" not in data:
            raise ProtocolError("an ask without ask_id and status")
        return cls(
            ask_id=str(data["ask_id"]),
            session_id=str(data.get("session_id", "")),
            team=data.get("team"),
            owner=str(data.get("owner", "")),
            tool=str(data.get("tool", "")),
            arguments=dict(data.get("arguments") or {}),
            state=str(data.get("state", "")),
            status=str(data["status"]),
            approvals_required=int(data.get("approvals_required") or 1),
            votes=list(data.get("votes") or []),
            rule_id=data.get("rule_id"),
            decided_by=data.get("decided_by"),
            verdict=data.get("verdict"),
            requested_at=data.get("requested_at"),
            deadline=data.get("deadline"),
            may_have_run=data.get("may_have_run") is True,
            raw=data,
        )


@dataclass(frozen=True)
class AskPage:
    asks: list[AskInfo]
    count: int
    next_offset: int | None

    @classmethod
    def from_json(cls, data: Any) -> AskPage:
        if not isinstance(data, dict) or not isinstance(data.get("asks"), list):
            raise ProtocolError("an ask list without asks")
        return cls([AskInfo.from_json(a) for a in data["asks"]], int(data.get("count", 0)), data.get("next_offset"))

    def __iter__(self) -> Any:
        return iter(self.asks)

    def __len__(self) -> int:
        return len(self.asks)


def ask_query(
    state: str | None, team: str | None, tool: str | None, limit: int | None, offset: int | None
) -> dict[str, Any]:
    query = {"state": state, "team": team, "tool": tool, "limit": limit, "offset": offset}
    return {key: value for key, value in query.items() if value is not None}


def decide_body(
    verdict: str,
    note: str | None,
    scope: str | None = None,
    arguments: dict[str, Any] | None = None,
    result: str | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {"verdict": verdict}
    if note is not None:
        body["note"] = note
    if scope is not None:
        body["scope"] = scope
    if arguments is not None:
        body["arguments"] = arguments
    if result is not None:
        body["result"] = result
    return body


@dataclass(frozen=True)
class ApprovalRule:
    """One of a team's approval rules (sectr.rules), as the API serves it."""

    id: str
    position: int
    tool: str
    action: str
    arguments: dict[str, str]
    approvals_required: int
    expires_after_s: int | None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, data: Any) -> ApprovalRule:
        if not isinstance(data, dict) or "id" not in data or "action" not in data:
            raise ProtocolError("a rule without id and action")
        return cls(
            id=str(data["id"]),
            position=int(data.get("position", 0)),
            tool=str(data.get("tool", "")),
            action=str(data["action"]),
            arguments=dict(data.get("arguments") or {}),
            approvals_required=int(data.get("approvals_required") or 1),
            expires_after_s=data.get("expires_after_s"),
            raw=data,
        )


def rule_body(
    tool: str,
    action: str,
    arguments: dict[str, str] | None,
    approvals_required: int | None,
    expires_after_s: int | None,
    position: int | None,
) -> dict[str, Any]:
    body: dict[str, Any] = {"tool": tool, "action": action}
    for key, value in (
        ("arguments", arguments),
        ("approvals_required", approvals_required),
        ("expires_after_s", expires_after_s),
        ("position", position),
    ):
        if value is not None:
            body[key] = value
    return body


def rules_from_json(data: Any) -> list[ApprovalRule]:
    if not isinstance(data, dict) or not isinstance(data.get("rules"), list):
        raise ProtocolError("a rule list without rules")
    return [ApprovalRule.from_json(rule) for rule in data["rules"]]


# ---- a team's webhooks (docs/teams.md) ----


@dataclass(frozen=True)
class Webhook:
    """One of a team's webhooks, as its moderators see it: never its secret."""

    id: int
    url: str
    kind: str
    active: bool
    created_at: str
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, data: Any) -> Webhook:
        if not isinstance(data, dict) or "id" not in data or "url" not in data:
            raise ProtocolError("a webhook without id and url")
        return cls(
            id=int(data["id"]),
            url=str(data["url"]),
            kind=str(data.get("kind", "json")),
            active=bool(data.get("active", True)),
            created_at=str(data.get("created_at", "")),
            raw=data,
        )


# ---- MCP servers (docs/mcp.md) ----


@dataclass(frozen=True)
class McpServerInfo:
    """One of a team's MCP servers, as the API serves it: its headers by name only (their
    values are write-only), its health and the tools its last discovery found."""

    name: str
    kind: str  # "http" (the team's) or "stdio" (an installation server enabled for the team)
    url: str | None
    header_names: list[str]
    enabled: bool
    timeout_s: float
    tools: list[str] | None
    health: str
    last_error: str | None
    discovered_tools: list[dict[str, Any]]
    #: When the tools were last discovered (ISO 8601), and why: "saved", "refresh",
    #: "changed" (the server said so) or "expired" (its cache hint ran out).
    refreshed_at: str | None = None
    discovery_reason: str | None = None
    #: When the server's cache hint for its tools runs out (None: it gave none).
    tools_fresh_until: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, data: Any) -> McpServerInfo:
        if not isinstance(data, dict) or "name" not in data or "kind" not in data:
            raise ProtocolError("an MCP server without name and kind")
        return cls(
            name=str(data["name"]),
            kind=str(data["kind"]),
            url=data.get("url"),
            header_names=list(data.get("header_names") or []),
            enabled=bool(data.get("enabled")),
            timeout_s=float(data.get("timeout_s") or 60),
            tools=data.get("tools"),
            health=str(data.get("health") or "unknown"),
            last_error=data.get("last_error"),
            discovered_tools=list(data.get("discovered_tools") or []),
            refreshed_at=data.get("refreshed_at"),
            discovery_reason=data.get("discovery_reason"),
            tools_fresh_until=data.get("tools_fresh_until"),
            raw=data,
        )


def webhook_body(url: str, kind: str | None, secret: str | None) -> dict[str, Any]:
    body: dict[str, Any] = {"url": url}
    if kind is not None:
        body["kind"] = kind
    if secret is not None:
        body["secret"] = secret
    return body


def webhooks_from_json(data: Any) -> list[Webhook]:
    if not isinstance(data, dict) or not isinstance(data.get("webhooks"), list):
        raise ProtocolError("a webhook list without webhooks")
    return [Webhook.from_json(hook) for hook in data["webhooks"]]


def mcp_servers_from_json(data: Any) -> list[McpServerInfo]:
    if not isinstance(data, dict) or not isinstance(data.get("servers"), list):
        raise ProtocolError("an MCP server list without servers")
    return [McpServerInfo.from_json(server) for server in data["servers"]]


def mcp_server_body(
    name: str | None,
    url: str | None,
    headers: dict[str, str] | None,
    enabled: bool | None,
    timeout_s: float | None,
    tools: list[str] | None,
) -> dict[str, Any]:
    """A register/update body: only what was given (an update keeps the rest)."""
    given = {"name": name, "url": url, "headers": headers, "enabled": enabled, "timeout_s": timeout_s, "tools": tools}
    return {key: value for key, value in given.items() if value is not None}


# ---- agents and budgets (docs/agents.md) ----

AGENT_FIELDS = ("name", "description", "instructions", "model", "params", "tools", "mode", "limits", "handler")


@dataclass(frozen=True)
class AgentVersion:
    """One saved version of an agent: what sessions pinned to it run with."""

    agent_id: str
    version: int
    name: str
    instructions: str
    model: str | None
    params: dict[str, Any]
    tools: list[str] | None
    mode: str | None
    limits: dict[str, int] | None
    handler: str
    note: str
    author: str | None
    created_at: str | None
    description: str = ""
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, data: Any) -> AgentVersion:
        if not isinstance(data, dict) or "agent_id" not in data or "version" not in data:
            raise ProtocolError("an agent version without agent_id and version")
        return cls(
            agent_id=str(data["agent_id"]),
            version=int(data["version"]),
            name=str(data.get("name", "")),
            instructions=str(data.get("instructions", "")),
            model=data.get("model"),
            params=dict(data.get("params") or {}),
            tools=list(data["tools"]) if isinstance(data.get("tools"), list) else None,
            mode=data.get("mode"),
            limits=dict(data["limits"]) if isinstance(data.get("limits"), dict) else None,
            handler=str(data.get("handler") or "default"),
            note=str(data.get("note") or ""),
            author=data.get("author"),
            created_at=data.get("created_at"),
            description=str(data.get("description") or ""),
            raw=data,
        )


@dataclass(frozen=True)
class Agent:
    """An agent: its identity and its latest version (`current`)."""

    id: str
    slug: str
    team: str | None
    name: str
    latest_version: int
    editable: bool
    current: AgentVersion
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, data: Any) -> Agent:
        if not isinstance(data, dict) or "id" not in data or "current" not in data:
            raise ProtocolError("an agent without id and current version")
        return cls(
            id=str(data["id"]),
            slug=str(data.get("slug", "")),
            team=data.get("team"),
            name=str(data.get("name", "")),
            latest_version=int(data.get("latest_version") or 1),
            editable=bool(data.get("editable")),
            current=AgentVersion.from_json(data["current"]),
            raw=data,
        )


def agents_from_json(data: Any) -> list[Agent]:
    if not isinstance(data, dict) or not isinstance(data.get("agents"), list):
        raise ProtocolError("an agent list without agents")
    return [Agent.from_json(item) for item in data["agents"]]


def versions_from_json(data: Any) -> list[AgentVersion]:
    if not isinstance(data, dict) or not isinstance(data.get("versions"), list):
        raise ProtocolError("a version list without versions")
    return [AgentVersion.from_json(item) for item in data["versions"]]


def agent_body(fields: dict[str, Any], note: str | None) -> dict[str, Any]:
    """A create or save body: the definition fields given (None: left out) and the note."""
    unknown = set(fields) - set(AGENT_FIELDS)
    if unknown:
        raise TypeError(f"unknown agent fields: {', '.join(sorted(unknown))} (known: {', '.join(AGENT_FIELDS)})")
    body = {key: value for key, value in fields.items() if value is not None}
    if note is not None:
        body["note"] = note
    return body


# ---- scores and ratings (docs/review.md, "Scores") ----


@dataclass(frozen=True)
class ScoreDefinition:
    """One of a team's scores: built in (thumbs, score) or its own (categorical with
    `labels`, numeric from `minimum` to `maximum`, or boolean)."""

    name: str
    kind: str
    description: str = ""
    labels: list[str] = field(default_factory=list)
    minimum: float | None = None
    maximum: float | None = None
    built_in: bool = False

    @classmethod
    def from_json(cls, data: Any) -> ScoreDefinition:
        if not isinstance(data, dict) or "name" not in data or "kind" not in data:
            raise ProtocolError("a score without name and kind")
        return cls(
            name=str(data["name"]),
            kind=str(data["kind"]),
            description=str(data.get("description") or ""),
            labels=[str(label) for label in data.get("labels") or []],
            minimum=data.get("minimum"),
            maximum=data.get("maximum"),
            built_in=bool(data.get("built_in")),
        )


def scores_from_json(data: Any) -> list[ScoreDefinition]:
    if not isinstance(data, dict) or not isinstance(data.get("scores"), list):
        raise ProtocolError("a score list without scores")
    return [ScoreDefinition.from_json(score) for score in data["scores"]]


def score_body(
    labels: list[str] | None, minimum: float | None, maximum: float | None, description: str | None
) -> dict[str, Any]:
    pairs = (("labels", labels), ("minimum", minimum), ("maximum", maximum), ("description", description))
    return {key: value for key, value in pairs if value is not None}


@dataclass(frozen=True)
class Rating:
    """A reviewer's rating of a session (seq 0) or one message: `scores` by name
    (`thumbs`: True is up; `score`: 1-5; the team's own)."""

    id: int
    seq: int
    message_id: str | None
    author: str
    scores: dict[str, Any]
    tags: list[str]
    comment: str
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, data: Any) -> Rating:
        if not isinstance(data, dict) or "id" not in data or not isinstance(data.get("scores"), dict):
            raise ProtocolError("a rating without id and scores")
        return cls(
            id=int(data["id"]),
            seq=int(data.get("seq") or 0),
            message_id=data.get("message_id"),
            author=str(data.get("author", "")),
            scores=dict(data["scores"]),
            tags=[str(tag) for tag in data.get("tags") or []],
            comment=str(data.get("comment") or ""),
            raw=data,
        )


@dataclass(frozen=True)
class Ratings:
    """A session's reviewer ratings and the scores its team rates with."""

    scores: list[ScoreDefinition]
    ratings: list[Rating]

    @classmethod
    def from_json(cls, data: Any) -> Ratings:
        if not isinstance(data, dict) or not isinstance(data.get("ratings"), list):
            raise ProtocolError("a rating list without ratings")
        return cls(scores_from_json(data), [Rating.from_json(r) for r in data["ratings"]])


def rating_body(
    scores: dict[str, Any], message_id: str | None, tags: list[str] | None, comment: str | None
) -> dict[str, Any]:
    if not isinstance(scores, dict):
        raise InvalidRequestError("scores is a dict of score name to value", code="invalid_value")
    body: dict[str, Any] = {"scores": scores}
    for key, value in (("message_id", message_id), ("tags", tags), ("comment", comment)):
        if value is not None:
            body[key] = value
    return body


# ---- experiments (docs/experiments.md) ----


@dataclass(frozen=True)
class Experiment:
    """A team's sessions replayed on candidates: `candidates` as created, and (from
    `get` and `create`) each replay's progress and the `summary` per candidate, with
    reviewers' verdicts (wins, losses, ties) and their scores per side (`scores`)."""

    id: str
    team: str
    name: str
    candidates: list[dict[str, Any]]
    replays: list[dict[str, Any]] = field(default_factory=list)
    summary: list[dict[str, Any]] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, data: Any) -> Experiment:
        if not isinstance(data, dict) or "id" not in data or not isinstance(data.get("candidates"), list):
            raise ProtocolError("an experiment without id and candidates")
        return cls(
            id=str(data["id"]),
            team=str(data.get("team", "")),
            name=str(data.get("name", "")),
            candidates=list(data["candidates"]),
            replays=list(data.get("replays") or []),
            summary=list(data.get("summary") or []),
            raw=data,
        )


def experiments_from_json(data: Any) -> list[Experiment]:
    if not isinstance(data, dict) or not isinstance(data.get("experiments"), list):
        raise ProtocolError("an experiment list without experiments")
    return [Experiment.from_json(e) for e in data["experiments"]]


def experiment_body(
    name: str, candidates: list[dict[str, Any]], sessions: Any, queue: Any, last: Any, live_reads: Any
) -> dict[str, Any]:
    body: dict[str, Any] = {"name": name, "candidates": candidates}
    for key, value in (("sessions", sessions), ("queue", queue), ("last", last), ("live_reads", live_reads)):
        if value is not None:
            body[key] = value
    return body


@dataclass(frozen=True)
class PairVerdict:
    """A reviewer's verdict on one pair: what won (baseline, candidate or tie) and each
    side's scores ({"baseline": {...}, "candidate": {...}})."""

    source: str
    candidate: int
    winner: str
    note: str
    reviewer: str
    scores: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: Any) -> PairVerdict:
        if not isinstance(data, dict) or "winner" not in data or "source" not in data:
            raise ProtocolError("a verdict without source and winner")
        return cls(
            source=str(data["source"]),
            candidate=int(data.get("candidate") or 0),
            winner=str(data["winner"]),
            note=str(data.get("note") or ""),
            reviewer=str(data.get("reviewer") or ""),
            scores=dict(data.get("scores") or {}),
        )


def verdict_body(
    source: str, candidate: int, winner: str, note: str | None, scores: dict[str, Any] | None
) -> dict[str, Any]:
    body: dict[str, Any] = {"source": source, "candidate": candidate, "winner": winner}
    if note is not None:
        body["note"] = note
    if scores is not None:
        body["scores"] = scores
    return body


@dataclass(frozen=True)
class QueuedPairs:
    """An experiment sent to a review queue: the queue (`queue_id`, `queue_name`), how
    many pairs went in now (`added`), and every pair item of it in that queue (`items`:
    id, position, source, candidate, assignee, done)."""

    queue_id: int
    queue_name: str
    added: int
    items: list[dict[str, Any]]

    @classmethod
    def from_json(cls, data: Any) -> QueuedPairs:
        queue = data.get("queue") if isinstance(data, dict) else None
        if not isinstance(queue, dict) or not isinstance(data.get("items"), list):
            raise ProtocolError("a queued answer without queue and items")
        return cls(int(queue["id"]), str(queue.get("name", "")), int(data.get("added") or 0), list(data["items"]))


def send_to_queue_body(queue: int | None, name: str | None, reviewers: list[str] | None) -> dict[str, Any]:
    if (queue is None) == (name is None):
        raise InvalidRequestError("give either a queue's id or a new queue's name", code="queue")
    if queue is not None:
        return {"queue": queue}
    body: dict[str, Any] = {"name": name}
    if reviewers is not None:
        body["reviewers"] = reviewers
    return body
