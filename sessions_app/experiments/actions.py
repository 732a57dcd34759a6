"""Experiments (docs/experiments.md): a team's recorded sessions replayed on candidate
agent versions, compared with what was recorded, and judged blind by reviewers.

Creating an experiment makes, for each source session and candidate, a replay session
(owned by the moderator who created it, in the source's team, pinned to the candidate,
`replay` in its SESSION_CREATED; sectr.replay) and queues every user message of the
source on it at once: the first as a queued run, the others as pending runs, which the
ordinary workers start one after the other (so a replay survives restarts like any
run, and the team's budget applies to each). Nothing else drives a replay.

The media the replayed turns reference (a prompt's images, a recorded result's) are
linked to the replay session as it is made (sessions_app.media.share_media): the replay
journals the same references, and whoever may read the replay sees them.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models import QuerySet
from django.utils.crypto import salted_hmac

from sectr import operations
from sectr.errors import Forbidden, NotFound, ValidationFailed
from sectr.replay import recorded_turns
from sectr.state import clamp_title
from sessions_app import access, runs
from sessions_app.actions.agents import resolve_new_session_agent
from sessions_app.actions.teams import get_team_for_user
from sessions_app.journal import get_journal
from sessions_app.media import media_digests, share_media
from sessions_app.models import AgentVersion, Experiment, PairVerdict, Replay, ReviewQueue, Session, Team
from sessions_app.provider_config import default_model
from sessions_app.review import scores as team_scores

MAX_SOURCES = 100
MAX_CANDIDATES = 4
NAME_MAX = 120
NOTE_MAX = 2000
#: Candidates are labelled B, C, D, E (the recorded baseline is A).
LABELS = "BCDE"
#: What a pair's two sides are, whichever way round a reviewer saw them.
SIDES = (PairVerdict.BASELINE, PairVerdict.CANDIDATE)


def _check_name(name: Any) -> str:
    if not isinstance(name, str) or not name.strip() or len(name) > NAME_MAX or "\x00" in name:
        raise ValidationFailed(f"name must be text of 1 to {NAME_MAX} characters", code="invalid_name")
    return name.strip()


def _moderated_team(actor: Any, team_name: Any) -> Team:
    team = get_team_for_user(actor, team_name)  # NotFound for strangers
    if not access.can_moderate_team(actor, team):
        raise Forbidden("only the team's moderators can run experiments")
    return team


def _sources(actor: Any, team: Team, sessions: Any, queue: Any, last: Any) -> list[Session]:
    """The source sessions, by one of: a list of ids, a review queue of the team, or
    the team's `last` N sessions (newest activity first)."""
    given = [value for value in (sessions, queue, last) if value not in (None, "", [])]
    if len(given) != 1:
        raise ValidationFailed("name the sources with exactly one of sessions, queue or last", code="invalid_sources")
    team_sessions = access.reviewable_sessions(actor).filter(team=team, is_replay=False)
    if sessions not in (None, "", []):
        if not isinstance(sessions, list) or not all(isinstance(s, str) and len(s) <= 40 for s in sessions):
            raise ValidationFailed("sessions must be a list of session ids", code="invalid_sources")
        wanted = list(dict.fromkeys(sessions))
        if len(wanted) > MAX_SOURCES:
            raise ValidationFailed(f"at most {MAX_SOURCES} sessions", code="invalid_sources")
        found = {s.pk: s for s in team_sessions.filter(pk__in=wanted)}
        missing = [s for s in wanted if s not in found]
        if missing:
            raise ValidationFailed(
                f"not sessions of the team {team.name}: {', '.join(missing[:5])}", code="invalid_sources"
            )
        return [found[s] for s in wanted]
    if queue not in (None, ""):
        try:
            queue_id = int(queue)
        except (TypeError, ValueError):
            raise ValidationFailed("queue must be a review queue's id", code="invalid_sources") from None
        found_queue = ReviewQueue.objects.filter(pk=queue_id, team=team).first()
        if found_queue is None:
            raise ValidationFailed(f"the team {team.name} has no review queue {queue_id}", code="invalid_sources")
        ids = list(found_queue.items.order_by("position").values_list("session_id", flat=True)[:MAX_SOURCES])
        by_id = {s.pk: s for s in team_sessions.filter(pk__in=ids)}
        return [by_id[s] for s in ids if s in by_id]
    if isinstance(last, str) and last.isdigit():
        last = int(last)
    if not isinstance(last, int) or isinstance(last, bool) or not 1 <= last <= MAX_SOURCES:
        raise ValidationFailed(f"last must be a number from 1 to {MAX_SOURCES}", code="invalid_sources")
    return list(team_sessions.order_by("-updated_at", "-pk")[:last])


def _candidates(actor: Any, team: Team, candidates: Any) -> list[tuple[dict[str, Any], AgentVersion | None]]:
    if not isinstance(candidates, list) or not 1 <= len(candidates) <= MAX_CANDIDATES:
        raise ValidationFailed(f"give 1 to {MAX_CANDIDATES} candidates", code="invalid_candidates")
    chosen: list[tuple[dict[str, Any], AgentVersion | None]] = []
    for index, candidate in enumerate(candidates):
        if not isinstance(candidate, dict) or not set(candidate) <= {"agent", "version", "model"}:
            raise ValidationFailed("a candidate is {agent, version?, model?}", code="invalid_candidates")
        agent, number, model = candidate.get("agent"), candidate.get("version"), candidate.get("model")
        if not isinstance(agent, str | None) or not isinstance(model, str | None):
            raise ValidationFailed("a candidate's agent and model are text", code="invalid_candidates")
        if number is not None and (not isinstance(number, int) or isinstance(number, bool)):
            raise ValidationFailed("a candidate's version is a whole number", code="invalid_candidates")
        version = resolve_new_session_agent(actor, team, agent or None, number)
        model = model or None
        if model is not None:
            model = operations.check_model_value(model)
        spec = version.spec() if version is not None else None
        shown = {
            "label": LABELS[index],
            "agent": spec.id if spec is not None else None,
            "slug": f"{version.agent}" if version is not None else "default",
            "version": version.number if version is not None else 1,
            "model": model or (spec.model if spec is not None and spec.model else "") or "",
        }
        chosen.append((shown, version))
    return chosen


def do_create_experiment(
    actor: Any,
    team_name: Any,
    *,
    name: Any,
    candidates: Any,
    sessions: Any = None,
    queue: Any = None,
    last: Any = None,
    live_reads: Any = False,
) -> Experiment:
    """Create an experiment and queue every replay's turns (see the module doc)."""
    team = _moderated_team(actor, team_name)
    name = _check_name(name)
    if not isinstance(live_reads, bool):
        raise ValidationFailed("live_reads must be true or false", code="invalid_live_reads")
    resolved = _candidates(actor, team, candidates)
    chosen = [shown for shown, _ in resolved]
    sources = _sources(actor, team, sessions, queue, last)
    journal = get_journal()
    recorded = {source.pk: recorded_turns(journal.load_sync(source.pk)) for source in sources}
    sources = [source for source in sources if recorded[source.pk]]
    if not sources:
        raise ValidationFailed("none of these sessions has a user message to replay", code="invalid_sources")
    with transaction.atomic():
        experiment = Experiment.objects.create(
            team=team, name=name, created_by=actor, live_reads=live_reads, candidates=chosen
        )
        for source in sources:
            for index, (candidate, version) in enumerate(resolved):
                _start_replay(actor, experiment, source, index, candidate, version, recorded[source.pk])
    return experiment


def _start_replay(
    actor: Any,
    experiment: Experiment,
    source: Session,
    index: int,
    candidate: dict[str, Any],
    version: AgentVersion | None,
    turns: list[Any],
) -> Replay:
    events = operations.create_events(
        title=clamp_title(f"Replay of {source.title or source.pk} ({candidate['label']})"),
        model=candidate["model"] or None,
        default_model=default_model(),
        agent=version.spec() if version is not None else None,
        replay={"source": source.pk, "live_reads": experiment.live_reads},
    )
    session = Session.objects.create(owner=actor, team=experiment.team, is_replay=True)
    journal = get_journal()
    journal.append_sync(session.pk, events)
    session.refresh_from_db()
    replay = Replay.objects.create(
        experiment=experiment, source=source, candidate=index, session=session, turns=len(turns)
    )
    digests: set[str] = set()
    for turn in turns:
        media_digests(turn.content, digests)
        for call in turn.calls:
            media_digests(list(call.media), digests)
    if digests:
        share_media(actor, source, session, digests)
    state = journal.state_sync(session.pk)
    invocation_id, start = operations.message_events(state, turns[0].content)
    runs.queue_run(session, invocation_id, start)
    for turn in turns[1:]:
        runs.queue_pending_run(session, {"kind": "user_message", "input": {"content": turn.content}})
    return replay


# ---- reading ----


def experiments_for(user: Any, team_name: Any = None) -> QuerySet[Experiment]:
    """The experiments of the teams where `user` reviews (staff: all). One team's, by
    name: NotFound without a role there, Forbidden for a member (reading one experiment
    needs the reviewer role too)."""
    experiments = Experiment.objects.select_related("team", "created_by")
    if team_name is not None:
        team = get_team_for_user(user, team_name)
        if not access.has_team_role(user, team.pk, "reviewer"):
            raise Forbidden("only the team's reviewers and moderators see its experiments")
        return experiments.filter(team=team)
    if access.is_staff(user):
        return experiments
    return experiments.filter(team__in=access.teams_for(user, "reviewer"))


def get_experiment_for_user(user: Any, experiment_id: Any) -> Experiment:
    """An experiment its team's reviewers (and moderators, staff) may read; NotFound
    for everyone else."""
    if not isinstance(experiment_id, str) or len(experiment_id) > 40:
        raise NotFound("no such experiment")
    experiment = Experiment.objects.select_related("team", "created_by").filter(pk=experiment_id).first()
    if experiment is None or not access.has_team_role(user, experiment.team_id, "reviewer"):
        raise NotFound("no such experiment")
    return experiment


# ---- pairwise judgments ----


def blind_flip(experiment: Experiment, source_id: str, candidate: int, reviewer: Any) -> bool:
    """Whether the candidate is shown on the left (as A) to this reviewer for this pair:
    fixed per reviewer and pair (a reload shows the same sides), unguessable across pairs.
    Keyed with the installation's secret: a plain hash of the ids would let a reviewer who
    knows them (the judging form carries the source and candidate) work the order out."""
    value = f"{experiment.pk}:{source_id}:{candidate}:{reviewer.pk}"
    digest = salted_hmac("sectr.experiments.blind_flip", value, algorithm="sha256").digest()
    return digest[0] % 2 == 1


def do_judge_pair(
    actor: Any, experiment_id: Any, source_id: Any, candidate: Any, choice: Any, note: Any = ""
) -> PairVerdict:
    """A blind verdict, given as the side the reviewer saw (`a`, `b` or `tie`) and stored
    as what won (baseline, candidate, tie). Again: replaces their earlier one."""
    if choice not in ("a", "b", "tie"):
        raise ValidationFailed("choose a, b or tie", code="invalid_choice")
    experiment = get_experiment_for_user(actor, experiment_id)
    replay = _pair(experiment, source_id, candidate)
    if choice == "tie":
        winner = PairVerdict.TIE
    else:
        candidate_side = "a" if blind_flip(experiment, replay.source_id, replay.candidate, actor) else "b"
        winner = PairVerdict.CANDIDATE if choice == candidate_side else PairVerdict.BASELINE
    return save_verdict(actor, experiment, replay, winner, note)


def do_record_verdict(
    actor: Any,
    experiment_id: Any,
    source_id: Any,
    candidate: Any,
    winner: Any,
    note: Any = "",
    scores: Any = None,
) -> PairVerdict:
    """A verdict given openly (the API): `winner` is baseline, candidate or tie, and
    `scores` each side's values of the team's own scores ({"baseline": {...},
    "candidate": {...}}, checked like a rating's)."""
    if winner not in (PairVerdict.BASELINE, PairVerdict.CANDIDATE, PairVerdict.TIE):
        raise ValidationFailed("winner must be baseline, candidate or tie", code="invalid_winner")
    experiment = get_experiment_for_user(actor, experiment_id)
    replay = _pair(experiment, source_id, candidate)
    checked = check_pair_scores(experiment.team_id, scores)
    return save_verdict(actor, experiment, replay, winner, note, checked)


def _pair(experiment: Experiment, source_id: Any, candidate: Any) -> Replay:
    if isinstance(candidate, str) and candidate.isdigit():
        candidate = int(candidate)
    replay = None
    if isinstance(candidate, int) and not isinstance(candidate, bool) and isinstance(source_id, str):
        replay = Replay.objects.filter(experiment=experiment, source_id=source_id, candidate=candidate).first()
    if replay is None:
        raise NotFound("no such pair in this experiment")
    return replay


def check_pair_scores(team_id: int | None, given: Any) -> dict[str, dict[str, Any]]:
    """{"baseline": {...}, "candidate": {...}}: each side's values of the team's own
    scores, checked as a rating's are; empty sides left out."""
    if given in (None, ""):
        return {}
    if not isinstance(given, dict) or not set(given) <= set(SIDES):
        raise ValidationFailed("scores is an object with baseline and/or candidate", code="invalid_value")
    checked = {side: team_scores.check_values(team_id, given.get(side)) for side in SIDES}
    return {side: values for side, values in checked.items() if values}


def save_verdict(
    actor: Any, experiment: Experiment, replay: Replay, winner: str, note: Any, scores: dict[str, Any] | None = None
) -> PairVerdict:
    """Store a checked verdict (with `scores` already checked), replacing the reviewer's
    earlier one on the pair."""
    if not isinstance(note, str) or len(note) > NOTE_MAX or "\x00" in note:
        raise ValidationFailed(f"note must be text of at most {NOTE_MAX} characters", code="invalid_note")
    verdict, _ = PairVerdict.objects.update_or_create(
        experiment=experiment,
        source_id=replay.source_id,
        candidate=replay.candidate,
        reviewer=actor,
        defaults={"winner": winner, "note": note.strip(), "scores": scores or {}},
    )
    return verdict
