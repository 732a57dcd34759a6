"""The experiments API (docs/experiments.md): create a team's experiment, list them,
read one's progress and summary, record a reviewer's verdict on a pair, and send its
pairs to a review queue. Thin:
parse, call an action, shape the answer."""

from __future__ import annotations

from typing import Any

from asgiref.sync import sync_to_async
from django.http import HttpResponse

from sectr.errors import ValidationFailed
from sessions_app.api.views import ApiCall, check_fields, check_id, json_response
from sessions_app.experiments import actions, compare
from sessions_app.experiments import queue as pairs
from sessions_app.models import Experiment, PairVerdict


def experiment_dict(experiment: Experiment, *, detail: bool = False) -> dict[str, Any]:
    data: dict[str, Any] = {
        "id": experiment.pk,
        "team": experiment.team.name,
        "name": experiment.name,
        "created_by": experiment.created_by.get_username() if experiment.created_by else None,
        "created_at": experiment.created_at.isoformat(),
        "live_reads": experiment.live_reads,
        "candidates": experiment.candidates,
    }
    if not detail:
        return data
    statuses = compare.replay_statuses(experiment)
    data["replays"] = [
        {
            "source": s.replay.source_id,
            "candidate": s.replay.candidate,
            "session": s.replay.session_id,
            "state": s.state,
            "turns": s.replay.turns,
            "turns_done": s.turns_done,
            "tokens": s.tokens,
            "cost": None if s.cost is None else f"{s.cost:.4f}",
            "divergence": s.divergence,
        }
        for s in statuses
    ]
    data["summary"] = [
        {
            "candidate": index,
            "replays": summary.replays,
            "done": summary.done,
            "diverged": summary.diverged,
            "failed": summary.failed,
            "running": summary.running,
            "tokens": summary.tokens,
            "cost": None if summary.cost is None else f"{summary.cost:.4f}",
            "wins": summary.wins,
            "losses": summary.losses,
            "ties": summary.ties,
            "scores": {score.name: score.as_dict() for score in summary.scores},
        }
        for index, summary in enumerate(compare.summarize(experiment, statuses))
    ]
    return data


async def list_experiments(call: ApiCall, name: str) -> HttpResponse:
    def page() -> dict[str, Any]:
        return {"experiments": [experiment_dict(e) for e in actions.experiments_for(call.user, name)[:200]]}

    return json_response(await sync_to_async(page)())


async def create_experiment(call: ApiCall, name: str) -> HttpResponse:
    body = call.body
    check_fields(body, "name", "candidates", "sessions", "queue", "last", "live_reads")

    def create() -> dict[str, Any]:
        experiment = actions.do_create_experiment(
            call.user,
            name,
            name=body.get("name"),
            candidates=body.get("candidates"),
            sessions=body.get("sessions"),
            queue=body.get("queue"),
            last=body.get("last"),
            live_reads=body.get("live_reads") if body.get("live_reads") is not None else False,
        )
        return experiment_dict(experiment, detail=True)

    return json_response(await sync_to_async(create)(), status=201)


async def get_experiment(call: ApiCall, experiment_id: str) -> HttpResponse:
    check_id(experiment_id, "experiment")

    def read() -> dict[str, Any]:
        return experiment_dict(actions.get_experiment_for_user(call.user, experiment_id), detail=True)

    return json_response(await sync_to_async(read)())


async def judge_pair(call: ApiCall, experiment_id: str) -> HttpResponse:
    """A verdict given openly (the API is not blind): `winner` baseline, candidate or tie."""
    check_id(experiment_id, "experiment")
    body = call.body
    check_fields(body, "source", "candidate", "winner", "note", "scores")
    winner = body.get("winner")
    if winner not in (PairVerdict.BASELINE, PairVerdict.CANDIDATE, PairVerdict.TIE):
        raise ValidationFailed("winner must be baseline, candidate or tie", code="invalid_winner")

    def judge() -> dict[str, Any]:
        verdict = actions.do_record_verdict(
            call.user,
            experiment_id,
            body.get("source"),
            body.get("candidate"),
            winner,
            body.get("note") or "",
            body.get("scores"),
        )
        return {
            "source": verdict.source_id,
            "candidate": verdict.candidate,
            "winner": verdict.winner,
            "note": verdict.note,
            "reviewer": call.user.get_username(),
            "scores": verdict.scores,
        }

    return json_response(await sync_to_async(judge)(), status=201)


async def send_to_queue(call: ApiCall, experiment_id: str) -> HttpResponse:
    """Every pair of the experiment into a review queue: `queue` (id) or a new one."""
    check_id(experiment_id, "experiment")
    body = call.body
    check_fields(body, "queue", "name", "reviewers")
    for key in ("queue", "name", "reviewers"):
        if key in body and body[key] is None:
            raise ValidationFailed(f"{key} is given or left out, never null", code=key)

    def send() -> dict[str, Any]:
        sent = pairs.do_send_to_queue(
            call.user,
            experiment_id,
            queue=body.get("queue"),
            name=body.get("name"),
            reviewers=body.get("reviewers"),
        )
        assert sent.queue.team is not None
        return {
            "queue": {"id": sent.queue.pk, "name": sent.queue.name, "team": sent.queue.team.name},
            "added": sent.added,
            "items": [
                {
                    "id": item.pk,
                    "position": item.position,
                    "source": item.pair.source_id if item.pair else None,
                    "candidate": item.pair.candidate if item.pair else None,
                    "assignee": item.assignee.get_username() if item.assignee else None,
                    "done": item.done_at is not None,
                }
                for item in sent.items
            ],
        }

    return json_response(await sync_to_async(send)(), status=201)
