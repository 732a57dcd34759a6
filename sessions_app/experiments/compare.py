"""What an experiment's pages and API show: each replay's progress, the turn-by-turn
comparison of a source with its replays, and the summary per candidate.

Everything is read from the journals (the turns, texts, calls, tokens and latencies) and
the replays' runs (progress); nothing is stored twice.
"""

from __future__ import annotations

import difflib
import json
import re
from collections import Counter
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from django.db.models import Count

from sectr.events import Envelope, EventType
from sectr.fold import fold_messages
from sectr.replay import DIVERGED, is_user_turn
from sectr.state import prompt_text
from sessions_app import access
from sessions_app.display.content import Attachment, result_attachments
from sessions_app.journal import get_journal
from sessions_app.media import missing_media
from sessions_app.models import Experiment, ModelPrice, PairVerdict, Replay, Run, ScoreConfig, Session
from sessions_app.review import scores as team_scores

DONE, RUNNING, DIVERGED_STATE, FAILED = "done", "running", "diverged", "failed"


@dataclass
class TurnSide:
    """One side of one turn: what the agent answered and called, and what it cost."""

    text: str = ""
    calls: list[tuple[str, str]] = field(default_factory=list)  # (name, arguments as JSON text)
    input_tokens: int = 0
    output_tokens: int = 0
    seconds: float | None = None
    divergence: dict[str, Any] | None = None
    stopped: bool = False  # a turn after the divergence, or never given
    label: str = ""  # the column's name on the comparison page
    #: The images and audio its tool results stored (a replay's reused ones included).
    media: list[Attachment] = field(default_factory=list)
    diff_pieces: list[tuple[str, str]] = field(default_factory=list)  # against the recording's text

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens


@dataclass
class Turn:
    user: str
    sides: list[TurnSide]  # the baseline first, then each candidate


def _canonical(arguments: Any) -> str:
    try:
        value = json.loads(arguments) if isinstance(arguments, str) else arguments
    except ValueError:
        return str(arguments)
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def journal_turns(
    envelopes: list[Envelope], session_id: str = "", missing: frozenset[str] = frozenset()
) -> list[TurnSide]:
    """A journal split at its user messages: one TurnSide per user turn. With
    `session_id`, its results' media link to that session's media view."""
    sides: list[TurnSide] = []
    chunk: list[Envelope] = []
    started_at = None

    def close() -> None:
        if not sides:
            return
        side = sides[-1]
        messages = fold_messages(chunk)
        texts = [m.get("content") for m in messages if m.get("role") == "assistant" and m.get("content")]
        side.text = "\n\n".join(str(t) for t in texts)
        for message in messages:
            for call in message.get("tool_calls") or ():
                function = call.get("function") or {}
                side.calls.append((str(function.get("name", "")), _canonical(function.get("arguments", "{}"))))

    for envelope in envelopes:
        if is_user_turn(envelope):
            close()
            sides.append(TurnSide())
            chunk = [envelope]
            started_at = envelope.created_at
            continue
        if not sides:
            continue
        chunk.append(envelope)
        side = sides[-1]
        if envelope.type is EventType.MESSAGE_END:
            usage = envelope.payload.get("usage") or {}
            side.input_tokens += int(usage.get("input_tokens") or 0)
            side.output_tokens += int(usage.get("output_tokens") or 0)
        elif envelope.type is EventType.TOOL_RESULT and envelope.payload.get("media"):
            side.media += result_attachments(envelope.payload["media"], session_id, missing)
        elif envelope.type in (EventType.INVOCATION_COMPLETED, EventType.INVOCATION_FAILED) and started_at:
            side.seconds = (envelope.created_at - started_at).total_seconds()
            if envelope.payload.get("stop_reason") == DIVERGED:
                side.divergence = envelope.payload.get("divergence") or {}
            elif envelope.payload.get("stop_reason") == "replay_stopped":
                side.stopped = True
    close()
    return sides


_WORDS = re.compile(r"\S+|\s+")


def word_diff(before: str, after: str) -> list[tuple[str, str]]:
    """(op, text) pieces turning `before` into `after`: "=" kept, "-" removed, "+" added."""
    a, b = _WORDS.findall(before), _WORDS.findall(after)
    pieces: list[tuple[str, str]] = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if op == "equal":
            pieces.append(("=", "".join(a[i1:i2])))
            continue
        if i2 > i1:
            pieces.append(("-", "".join(a[i1:i2])))
        if j2 > j1:
            pieces.append(("+", "".join(b[j1:j2])))
    return pieces


def _user_texts(envelopes: list[Envelope]) -> list[str]:
    return [
        prompt_text((e.payload.get("reason") or {}).get("input", {}).get("content"))
        for e in envelopes
        if is_user_turn(e)
    ]


@dataclass
class Comparison:
    source_id: str
    title: str
    turns: list[Turn]
    replays: list[Replay]


def candidate_name(experiment: Experiment, index: int) -> str:
    candidate = experiment.candidates[index] if index < len(experiment.candidates) else {}
    name = f"{candidate.get('label', '?')}: {candidate.get('slug', '?')} v{candidate.get('version', '?')}"
    return name + (f" ({candidate['model']})" if candidate.get("model") else "")


def compare_source(experiment: Experiment, source_id: str, viewer: Any = None) -> Comparison:
    """The source's turns beside each candidate's, with word differences. With `viewer`
    (who reads the page), each side's media link to its own session's media view (the
    recording's to the source, a candidate's to its replay); without, they are named."""
    replays = list(
        Replay.objects.filter(experiment=experiment, source_id=source_id).select_related("source", "session")
    )
    if not replays:
        raise LookupError(source_id)
    journal = get_journal()
    ranges = [(source_id, 0, 2**31 - 1)] + [(r.session_id, 0, 2**31 - 1) for r in replays]
    loaded = journal.load_ranges_sync(ranges)
    source_envelopes = loaded.get(source_id, [])
    source = replays[0].source

    def turns_of(session: Session, envelopes: list[Envelope]) -> list[TurnSide]:
        if viewer is None or not access.can_read(viewer, session):
            return journal_turns(envelopes)
        return journal_turns(envelopes, session.pk, missing_media(viewer, session, (e.payload for e in envelopes)))

    baseline = turns_of(source, source_envelopes)
    candidates = [turns_of(r.session, loaded.get(r.session_id, [])) for r in replays]
    users = _user_texts(source_envelopes)
    turns: list[Turn] = []
    for index, user in enumerate(users):
        base = baseline[index] if index < len(baseline) else TurnSide()
        base.label = "A: as recorded"
        sides = [base]
        for replay, replayed in zip(replays, candidates, strict=True):
            side = replayed[index] if index < len(replayed) else TurnSide(stopped=True)
            side.label = candidate_name(experiment, replay.candidate)
            if not side.stopped:
                side.diff_pieces = word_diff(base.text, side.text)
            sides.append(side)
        turns.append(Turn(user=user, sides=sides))
    return Comparison(source_id, replays[0].source.title or source_id, turns, replays)


# ---- progress and summary ----


@dataclass
class ReplayStatus:
    replay: Replay
    state: str
    turns_done: int
    tokens: int
    cost: Decimal | None
    divergence: dict[str, Any] | None
    label: str = ""


def replay_statuses(experiment: Experiment, only: Replay | None = None) -> list[ReplayStatus]:
    """Every replay's status (or only that of `only`, one replay of the experiment)."""
    replays = [only] if only is not None else list(experiment.replays.select_related("session", "source"))
    runs = Run.objects.filter(session__replay_entry__experiment=experiment)
    if only is not None:
        runs = runs.filter(session_id=only.session_id)
    run_counts: dict[str, Counter[str]] = {}
    for session_id, status in runs.values_list("session_id", "status"):
        run_counts.setdefault(session_id, Counter())[status] += 1
    prices = {p.model: p for p in ModelPrice.objects.all()}
    statuses = []
    for replay in replays:
        state = replay.session.projection()
        counts = run_counts.get(replay.session_id, Counter())
        finished = sum(counts[s] for s in (Run.COMPLETED, Run.FAILED, Run.CANCELLED))
        diverged = (state.replay or {}).get("diverged")
        if diverged:
            label = DIVERGED_STATE
        elif counts[Run.FAILED] or counts[Run.CANCELLED]:
            label = FAILED
        elif finished >= replay.turns:
            label = DONE
        else:
            label = RUNNING
        usage = state.usage
        tokens = sum(int(u.get("input_tokens", 0)) + int(u.get("output_tokens", 0)) for u in usage.values())
        cost: Decimal | None = Decimal(0)
        for model, u in usage.items():
            price = prices.get(model)
            if price is None:
                cost = None
                break
            assert cost is not None
            cost += (
                Decimal(int(u.get("input_tokens", 0))) * price.input_per_million
                + Decimal(int(u.get("output_tokens", 0))) * price.output_per_million
            ) / Decimal(1_000_000)
        name = candidate_name(experiment, replay.candidate)
        statuses.append(ReplayStatus(replay, label, min(finished, replay.turns), tokens, cost, diverged, name))
    return statuses


@dataclass
class PairScore:
    """One of the team's scores as reviewers gave it to each side of a candidate's pairs."""

    name: str
    kind: str
    baseline: team_scores.ScoreSummary
    candidate: team_scores.ScoreSummary

    @staticmethod
    def mean(summary: team_scores.ScoreSummary) -> float | None:
        """The numbers' mean; for a yes/no score the share of yes; none for labels."""
        if not summary.count:
            return None
        if summary.kind == ScoreConfig.BOOLEAN:
            return summary.counts.get("yes", 0) / summary.count
        return summary.average

    @property
    def baseline_mean(self) -> float | None:
        return self.mean(self.baseline)

    @property
    def candidate_mean(self) -> float | None:
        return self.mean(self.candidate)

    def side_dict(self, side: str) -> dict[str, Any]:
        summary = self.baseline if side == PairVerdict.BASELINE else self.candidate
        data: dict[str, Any] = {"count": summary.count, "mean": self.mean(summary)}
        if summary.kind != ScoreConfig.NUMERIC:
            data["counts"] = dict(summary.counts)
        return data

    @property
    def sides_shown(self) -> list[dict[str, Any]]:
        """The recorded side, then the candidate's (for the page's table)."""
        return [self.side_dict(PairVerdict.BASELINE), self.side_dict(PairVerdict.CANDIDATE)]

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            **{side: self.side_dict(side) for side in (PairVerdict.BASELINE, PairVerdict.CANDIDATE)},
        }


@dataclass
class CandidateSummary:
    candidate: dict[str, Any]
    replays: int = 0
    done: int = 0
    diverged: int = 0
    failed: int = 0
    running: int = 0
    tokens: int = 0
    cost: Decimal | None = Decimal(0)
    wins: int = 0
    losses: int = 0
    ties: int = 0
    scores: list[PairScore] = field(default_factory=list)

    @property
    def average_tokens(self) -> float:
        return self.tokens / self.replays if self.replays else 0.0

    @property
    def average_cost(self) -> Decimal | None:
        return self.cost / self.replays if self.cost is not None and self.replays else None

    @property
    def finished(self) -> bool:
        return self.running == 0


def summarize(experiment: Experiment, statuses: list[ReplayStatus] | None = None) -> list[CandidateSummary]:
    statuses = replay_statuses(experiment) if statuses is None else statuses
    summaries = [CandidateSummary(candidate) for candidate in experiment.candidates]
    for status in statuses:
        summary = summaries[status.replay.candidate]
        summary.replays += 1
        setattr(summary, status.state, getattr(summary, status.state) + 1)
        summary.tokens += status.tokens
        if status.cost is None or summary.cost is None:
            summary.cost = None
        else:
            summary.cost += status.cost
    for candidate, winner, count in (
        PairVerdict.objects.filter(experiment=experiment).values_list("candidate", "winner").annotate(n=Count("pk"))
    ):
        if candidate >= len(summaries):
            continue
        if winner == PairVerdict.CANDIDATE:
            summaries[candidate].wins += count
        elif winner == PairVerdict.BASELINE:
            summaries[candidate].losses += count
        else:
            summaries[candidate].ties += count
    _score_pairs(experiment, summaries)
    return summaries


def _score_pairs(experiment: Experiment, summaries: list[CandidateSummary]) -> None:
    """Each candidate's scores per side: the team's own scores (every one, given or
    not, in order), then any other name found in the verdicts (a definition deleted
    since: its values read as stored)."""
    definitions = team_scores.custom_scores(experiment.team_id)
    per_candidate: list[dict[str, PairScore]] = []
    for _ in summaries:
        found: dict[str, PairScore] = {}
        for d in definitions:
            labels = ("yes", "no") if d.kind == ScoreConfig.BOOLEAN else d.labels
            made = [team_scores.ScoreSummary(d.name, d.kind, counts=dict.fromkeys(labels, 0)) for _ in range(2)]
            found[d.name] = PairScore(d.name, d.kind, *made)
        per_candidate.append(found)
    rows = PairVerdict.objects.filter(experiment=experiment).exclude(scores={}).values_list("candidate", "scores")
    for candidate, given in rows:
        if candidate >= len(summaries) or not isinstance(given, dict):
            continue
        for side in (PairVerdict.BASELINE, PairVerdict.CANDIDATE):
            for name, value in (given.get(side) or {}).items():
                if name not in per_candidate[candidate]:
                    number = isinstance(value, int | float) and not isinstance(value, bool)
                    kind = ScoreConfig.NUMERIC if number else ScoreConfig.CATEGORICAL
                    made = [team_scores.ScoreSummary(name, kind) for _ in range(2)]
                    per_candidate[candidate][name] = PairScore(name, kind, *made)
                score = per_candidate[candidate][name]
                (score.baseline if side == PairVerdict.BASELINE else score.candidate).add(value)
    for summary, found in zip(summaries, per_candidate, strict=True):
        summary.scores = list(found.values())
