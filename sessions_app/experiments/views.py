"""The experiment pages under /review/experiments/: the list, the form that creates one
(`Replay with…` on /review/ opens it with the search's sessions), an experiment's
progress and summary, the side-by-side comparison of one source, and blind judging.

Lookups that 404 strangers come first; every change goes through
sessions_app.experiments.actions.
"""

from __future__ import annotations

import re
from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.auth import get_user_model
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from sectr.errors import Forbidden, NotFound, SectrError
from sessions_app import access
from sessions_app.experiments import actions, compare
from sessions_app.experiments import queue as pairs
from sessions_app.models import AgentVersion, Experiment, Membership, Replay, ReviewQueue
from sessions_app.review import actions as review_actions
from sessions_app.review import scores, search
from sessions_app.review.navigation import item_address, queue_nav
from sessions_app.web import HtmxHttpRequest, page_refusals

refusals = page_refusals(back=lambda request, _kwargs: reverse("experiments"), htmx_flash=False)
_IDS = re.compile(r"[A-Za-z0-9_-]+")
DEFAULT_LAST = 20


def _version_choices(user: Any) -> list[tuple[str, str]]:
    teams = access.teams_for(user, "moderator")
    versions = (
        AgentVersion.objects.select_related("agent__team")
        .filter(agent__team__in=teams)
        .order_by("agent__team__name", "agent__slug", "-number")
    )
    choices = [("default", "default (built-in agent)")]
    choices += [(f"{v.agent_id}:{v.number}", f"{v.agent} v{v.number}: {v.name}") for v in versions]
    return choices


class ExperimentForm(forms.Form):
    team = forms.ChoiceField()
    name = forms.CharField(max_length=actions.NAME_MAX)
    source = forms.ChoiceField(
        choices=[("last", "The team's last sessions"), ("queue", "A review queue"), ("sessions", "These sessions")],
        widget=forms.RadioSelect,
        initial="last",
    )
    last = forms.IntegerField(min_value=1, max_value=actions.MAX_SOURCES, initial=DEFAULT_LAST, required=False)
    queue = forms.ChoiceField(required=False)
    sessions = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3}), required=False, help_text="Session ids, one a line."
    )
    candidate = forms.ChoiceField(label="Candidate B")
    model = forms.CharField(label="Model for B", max_length=200, required=False, help_text="Empty: the agent's.")
    candidate2 = forms.ChoiceField(label="Candidate C (optional)", required=False)
    model2 = forms.CharField(label="Model for C", max_length=200, required=False)
    live_reads = forms.BooleanField(
        required=False,
        label="Let read-only tools run for real",
        help_text="Otherwise every call the recording cannot answer stops that replay.",
    )

    def __init__(self, user: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        teams = list(access.teams_for(user, "moderator").order_by("name"))
        self._choices("team", [(t.name, t.name) for t in teams])
        queues = ReviewQueue.objects.filter(team__in=teams).select_related("team").order_by("team__name", "name")
        self._choices("queue", [("", "—")] + [(str(q.pk), f"{q.team}: {q.name}") for q in queues])
        versions = _version_choices(user)
        self._choices("candidate", versions)
        self._choices("candidate2", [("", "—"), *versions])

    def _choices(self, name: str, choices: list[tuple[str, str]]) -> None:
        field = self.fields[name]
        assert isinstance(field, forms.ChoiceField)
        field.choices = choices

    def candidates(self) -> list[dict[str, Any]]:
        chosen = []
        for field, model_field in (("candidate", "model"), ("candidate2", "model2")):
            value = self.cleaned_data.get(field) or ""
            if not value:
                continue
            model = self.cleaned_data.get(model_field) or None
            if value == "default":
                chosen.append({"agent": "default", "model": model} if model else {"agent": "default"})
                continue
            agent, _, number = value.partition(":")
            candidate: dict[str, Any] = {"agent": agent, "version": int(number)}
            if model:
                candidate["model"] = model
            chosen.append(candidate)
        return chosen

    def sources(self) -> dict[str, Any]:
        kind = self.cleaned_data["source"]
        if kind == "last":
            return {"last": self.cleaned_data.get("last") or DEFAULT_LAST}
        if kind == "queue":
            return {"queue": self.cleaned_data.get("queue") or None}
        return {"sessions": _IDS.findall(self.cleaned_data.get("sessions") or "")}


def _score_widget(score: scores.ScoreDef, field_id: str) -> forms.Widget:
    """A team score's control, as the rating form has it (templates/review/_score_field.html)."""
    attrs = {"id": field_id}
    if score.description:
        attrs["aria-describedby"] = f"{field_id}-d"
    if score.kind == "categorical":
        return forms.Select(attrs=attrs, choices=[("", "—"), *((label, label) for label in score.labels)])
    if score.kind == "boolean":
        return forms.Select(attrs=attrs, choices=[("", "—"), ("yes", "yes"), ("no", "no")])
    return forms.NumberInput(attrs={**attrs, "step": score.step, "placeholder": score.range_text})


class PairVerdictForm(forms.Form):
    """A blind verdict's optional fields: each side's team scores (`a.<name>`,
    `b.<name>`) and a note; the choice is the button pressed. The values are checked by
    the action, by the API's rules (sessions_app.experiments.actions.check_pair_scores),
    so the form only carries them: a refused verdict comes back with what was typed."""

    note = forms.CharField(
        required=False,
        label="Note (optional)",
        strip=False,
        widget=forms.Textarea(attrs={"id": "judge-note", "rows": 2, "maxlength": 2000}),
    )

    def __init__(self, definitions: list[scores.ScoreDef], *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["note"].widget.attrs.pop("cols", None)  # its width is the stylesheet's
        #: ("A" or "B", [(score, bound field)]) for the template, in the form's order.
        self.sides: list[tuple[str, list[tuple[scores.ScoreDef, forms.BoundField]]]] = []
        for side in ("a", "b"):
            for score in definitions:
                self.fields[f"{side}.{score.name}"] = forms.CharField(
                    required=False, label=score.name, widget=_score_widget(score, f"{side}-{score.name}")
                )
            self.sides.append((side.upper(), [(score, self[f"{side}.{score.name}"]) for score in definitions]))


def _require_moderator(request: HtmxHttpRequest) -> None:
    if not access.has_any_role(request.user, "moderator"):
        raise Http404("experiments are created by a team's moderators")


@login_required
@require_GET
def experiment_list(request: HtmxHttpRequest) -> HttpResponse:
    if not access.has_any_role(request.user, "reviewer"):
        raise Http404("experiments are for a team's reviewers and moderators")
    experiments = list(actions.experiments_for(request.user)[:100])
    can_create = access.has_any_role(request.user, "moderator")
    return render(request, "review/experiments.html", {"experiments": experiments, "can_create": can_create})


@login_required
@require_http_methods(["GET", "POST"])
@refusals
def new_experiment(request: HtmxHttpRequest) -> HttpResponse:
    _require_moderator(request)
    if request.method == "POST":
        form = ExperimentForm(request.user, request.POST)
        if form.is_valid():
            try:
                experiment = actions.do_create_experiment(
                    request.user,
                    form.cleaned_data["team"],
                    name=form.cleaned_data["name"],
                    candidates=form.candidates(),
                    live_reads=form.cleaned_data["live_reads"],
                    **form.sources(),
                )
            except SectrError as exc:
                form.add_error(None, exc.message)
            else:
                messages.success(request, f"Replaying {experiment.replays.count()} sessions in the background.")
                return redirect("experiment", experiment.pk)
        return render(request, "review/experiment_new.html", {"form": form}, status=400)
    initial: dict[str, Any] = {}
    if request.GET:
        # `Replay with…` from /review/: the search's sessions (the first page of them).
        filters = search.Filters.from_query(request.GET)
        found = list(search.search_sessions(request.user, filters).values_list("pk", flat=True)[: actions.MAX_SOURCES])
        if found:
            initial = {"source": "sessions", "sessions": "\n".join(found)}
    return render(request, "review/experiment_new.html", {"form": ExperimentForm(request.user, initial=initial)})


@login_required
@require_GET
@refusals
def experiment_page(request: HtmxHttpRequest, experiment_id: str) -> HttpResponse:
    experiment = actions.get_experiment_for_user(request.user, experiment_id)
    statuses = compare.replay_statuses(experiment)
    summaries = compare.summarize(experiment, statuses)
    sources: dict[str, list[compare.ReplayStatus]] = {}
    for status in statuses:
        sources.setdefault(status.replay.source_id, []).append(status)
    context = {
        "experiment": experiment,
        "summaries": summaries,
        "sources": [(rows[0].replay.source, rows) for rows in sources.values()],
        "running": any(s.state == compare.RUNNING for s in statuses),
        "judged": actions.PairVerdict.objects.filter(experiment=experiment, reviewer_id=request.user.pk).count(),
        "pairs": len(statuses),
        "score_rows": [(s, score) for s in summaries for score in s.scores],
    }
    if not request.htmx and access.can_moderate_team(request.user, experiment.team):
        context["send"] = {
            "queues": list(review_actions.queues_for(request.user).filter(team=experiment.team).order_by("name")),
            "reviewers": list(
                get_user_model()
                .objects.filter(
                    sectr_memberships__team=experiment.team,
                    sectr_memberships__role__in=(Membership.REVIEWER, Membership.MODERATOR),
                )
                .order_by("username")
                .distinct()
            ),
        }
    template = "review/_experiment_progress.html" if request.htmx else "review/experiment.html"
    return render(request, template, context)


@login_required
@require_GET
@refusals
def comparison_page(request: HtmxHttpRequest, experiment_id: str, source_id: str) -> HttpResponse:
    experiment = actions.get_experiment_for_user(request.user, experiment_id)
    try:
        comparison = compare.compare_source(experiment, source_id, request.user)
    except LookupError:
        raise NotFound("no such session in this experiment") from None
    return render(request, "review/experiment_compare.html", {"experiment": experiment, "comparison": comparison})


def _blind_turns(experiment: Experiment, replay: Replay, reviewer: Any) -> list[tuple[str, tuple[Any, Any]]]:
    """The pair's turns as (user message, (A, B)), the sides in the order fixed for this
    reviewer and pair (templates/review/_blind_pair.html shows them)."""
    comparison = compare.compare_source(experiment, replay.source_id)
    column = next(i for i, r in enumerate(comparison.replays) if r.candidate == replay.candidate) + 1
    flipped = actions.blind_flip(experiment, replay.source_id, replay.candidate, reviewer)
    turns = []
    for turn in comparison.turns:
        baseline, candidate = turn.sides[0], turn.sides[column]
        turns.append((turn.user, (candidate, baseline) if flipped else (baseline, candidate)))
    return turns


@login_required
@require_http_methods(["GET", "POST"])
@refusals
def judge_page(request: HtmxHttpRequest, experiment_id: str) -> HttpResponse:
    """One pair at a time, blind: the recording and a replay as A and B in an order fixed
    per reviewer and pair; the next pair this reviewer has not judged."""
    experiment = actions.get_experiment_for_user(request.user, experiment_id)
    if request.method == "POST":
        actions.do_judge_pair(
            request.user,
            experiment.pk,
            request.POST.get("source"),
            request.POST.get("candidate"),
            request.POST.get("choice"),
            request.POST.get("note", ""),
        )
        return redirect("experiment_judge", experiment.pk)
    judged = set(
        actions.PairVerdict.objects.filter(experiment=experiment, reviewer_id=request.user.pk).values_list(
            "source_id", "candidate"
        )
    )
    statuses = [s for s in compare.replay_statuses(experiment) if s.state != compare.RUNNING]
    pending = [s for s in statuses if (s.replay.source_id, s.replay.candidate) not in judged]
    if not pending:
        return render(request, "review/experiment_judge.html", {"experiment": experiment, "done": True})
    replay: Replay = pending[0].replay
    context = {
        "experiment": experiment,
        "form": PairVerdictForm([]),
        "replay": replay,
        "turns": _blind_turns(experiment, replay, request.user),
        "left": len(pending),
        "done": False,
    }
    return render(request, "review/experiment_judge.html", context)


# ---- pairwise review in a queue ----


experiment_refusals = page_refusals(back=lambda request, kwargs: reverse("experiment", args=[kwargs["experiment_id"]]))


@login_required
@require_POST
@experiment_refusals
def send_to_queue(request: HtmxHttpRequest, experiment_id: str) -> HttpResponse:
    """`Send to review queue`: an existing queue of the team, or a new one."""
    queue = request.POST.get("queue") or None
    name = None if queue else (request.POST.get("name") or "")
    reviewers = request.POST.getlist("reviewers") if not queue else None
    sent = pairs.do_send_to_queue(request.user, experiment_id, queue=queue, name=name, reviewers=reviewers)
    plural = "" if sent.added == 1 else "s"
    messages.success(request, f"Sent {sent.added} pair{plural} to {sent.queue.name}.")
    return redirect("review_queue", queue_id=sent.queue.pk)


def _side_scores(post: Any, prefix: str) -> dict[str, str]:
    return {key[len(prefix) :]: value for key, value in post.items() if key.startswith(prefix) and value != ""}


@login_required
@require_http_methods(["GET", "POST"])
@refusals
def pair_page(request: HtmxHttpRequest, item_id: int) -> HttpResponse:
    """A pair item of a review queue, judged blind: addressed by the item's id alone, A
    and B in the order fixed for this reviewer, nothing on the page naming what they are.
    Submitting marks the item done and opens the reviewer's next open item."""
    item = pairs.get_pair_item_for_user(request.user, item_id)
    replay = item.pair
    assert replay is not None
    experiment = replay.experiment
    definitions = scores.custom_scores(experiment.team_id)
    form = PairVerdictForm(definitions, request.POST if request.method == "POST" else None)
    if request.method == "POST":
        try:
            pairs.do_judge_item(
                request.user,
                item.pk,
                request.POST.get("choice"),
                # Every `a.`/`b.` key, not only the form's: an unknown score is refused
                # by name, as the API refuses it.
                a_scores=_side_scores(request.POST, "a."),
                b_scores=_side_scores(request.POST, "b."),
                note=request.POST.get("note", ""),
            )
        except SectrError as exc:
            if isinstance(exc, NotFound | Forbidden):
                raise
            form.add_error(None, exc.message)
        else:
            following = pairs.next_open_item(request.user, item.queue, after=item.position)
            messages.success(request, "Verdict saved.")
            if following is None:
                return redirect("review_queue", queue_id=item.queue_id)
            return redirect(item_address(item.queue_id, following.pk, following.session_id, following.pair_id))
    running = compare.replay_statuses(experiment, replay)[0].state == compare.RUNNING
    context = {
        "item": item,
        "queue": item.queue,
        "queue_nav": queue_nav(request.user, item.queue, item_id=item.pk),
        "turns": [] if running else _blind_turns(experiment, replay, request.user),
        "running": running,
        "form": form,
    }
    return render(request, "review/pair.html", context, status=400 if form.errors else 200)
