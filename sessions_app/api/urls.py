"""The API's route table: URL patterns and the OpenAPI document are both made from ROUTES.

Each Route is a Django path (under ``/api/v1/``) with one Operation per HTTP method;
`api_view` dispatches among them (405 for any other method) and
sessions_app.api.openapi.build_document describes exactly these. Anything else under
``/api/v1/`` is a JSON 404.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from django.http import HttpResponse
from django.urls import URLPattern, path, re_path

from sessions_app.api import agents as agents_api
from sessions_app.api import audit as audit_api
from sessions_app.api import experiments as experiments_api
from sessions_app.api import export as session_export
from sessions_app.api import mcp_servers as mcp_api
from sessions_app.api import media as media_api
from sessions_app.api import scores as scores_api
from sessions_app.api import teams as teams_api
from sessions_app.api import views
from sessions_app.api.openapi import build_document
from sessions_app.api.views import RUN_BODY_LIMIT, Operation

app_name = "api"


@dataclass(frozen=True)
class Route:
    path: str  # Django path syntax, relative to /api/v1/
    name: str
    operations: dict[str, Operation]


async def openapi_document(call: views.ApiCall) -> HttpResponse:
    return views.json_response(_document())


@functools.cache
def _document() -> dict[str, Any]:
    return build_document(ROUTES)


def op(handler: views.Handler, summary: str, **options: Any) -> Operation:
    return Operation(handler, handler.__name__, summary, **options)


SESSION = "sessions/<str:session_id>"
RUN = "runs/<str:run_id>"

ROUTES: tuple[Route, ...] = (
    Route(
        "sessions",
        "sessions",
        {
            "GET": op(
                views.list_sessions,
                "The caller's sessions, newest first (paginated)",
                response="SessionList",
                query=("limit", "offset"),
                errors=(400,),
            ),
            "POST": op(
                views.create_session,
                "Create a session",
                status=201,
                request="CreateSession",
                response="Snapshot",
                errors=(400,),
            ),
        },
    ),
    Route(
        SESSION,
        "session",
        {
            "GET": op(views.get_session, "A session's snapshot", response="Snapshot", errors=(404,)),
            "DELETE": op(
                views.delete_session,
                "Delete a session, its journal and media (412 while a run is active)",
                status=204,
                errors=(403, 404, 412),
            ),
        },
    ),
    Route(
        f"{SESSION}/transcript",
        "session-transcript",
        {
            "GET": op(
                views.get_transcript,
                "A session's transcript: what the model sees (view=model, the default: from the newest"
                " compaction, its summary first) or the full history (view=history)",
                response="Transcript",
                query=("view",),
                errors=(400, 404),
            )
        },
    ),
    Route(
        f"{SESSION}/fork",
        "session-fork",
        {
            "POST": op(
                views.fork_session,
                "Fork a session (now, or at an earlier seq)",
                status=201,
                request="Fork",
                response="Snapshot",
                errors=(400, 404, 412),
            )
        },
    ),
    Route(
        f"{SESSION}/clear",
        "session-clear",
        {
            "POST": op(
                views.clear_session,
                "A new empty session with the same mode, model, limits and worktree selector",
                status=201,
                request="Clear",
                response="Snapshot",
                errors=(400, 403, 404),
            )
        },
    ),
    Route(
        f"{SESSION}/close",
        "session-close",
        {
            "POST": op(
                views.close_session,
                "Release the session's runtime resources (data is kept)",
                response="Snapshot",
                errors=(403, 404),
            )
        },
    ),
    Route(
        f"{SESSION}/compact",
        "session-compact",
        {
            "POST": op(
                views.compact_session,
                "Compact the history at a turn boundary",
                response="Compacted",
                errors=(403, 404, 412),
            )
        },
    ),
    Route(
        f"{SESSION}/retry",
        "session-retry",
        {
            "POST": op(
                views.retry_session,
                "Retry the failed step (a new run)",
                status=202,
                response="Run",
                errors=(403, 404, 409),
            )
        },
    ),
    Route(
        f"{SESSION}/rename",
        "session-rename",
        {
            "POST": op(
                views.rename_session,
                "Rename the session",
                request="Rename",
                response="Snapshot",
                errors=(400, 403, 404),
            )
        },
    ),
    Route(
        f"{SESSION}/mode",
        "session-mode",
        {
            "POST": op(
                views.set_session_mode,
                "Change the mode (not while a run is active)",
                request="SetMode",
                response="Snapshot",
                errors=(400, 403, 404, 409),
            )
        },
    ),
    Route(
        f"{SESSION}/model",
        "session-model",
        {
            "POST": op(
                views.set_session_model,
                "Change the model (not while a run is active)",
                request="SetModel",
                response="Snapshot",
                errors=(400, 403, 404, 409),
            )
        },
    ),
    Route(
        f"{SESSION}/runs",
        "session-runs",
        {
            "POST": op(
                views.start_run,
                "Start a run with a user message (409 while one is active unless queue);"
                " with Accept: text/event-stream the answer is the run's event stream",
                status=202,
                request="StartRun",
                response="Run",
                body_limit=RUN_BODY_LIMIT,
                streams_on_accept=True,
                admits_in_thread=True,
                errors=(400, 403, 404, 409, 413),
            )
        },
    ),
    Route(
        f"{SESSION}/events",
        "session-events",
        {
            "GET": op(
                views.session_events,
                "Every run's events of the session as Server-Sent Events (replay from ?after= or"
                " Last-Event-ID, then live; the stream does not end)",
                response="Event",
                streaming=True,
                stream_end="the stream stays open for the session's next runs",
                query=("after",),
                errors=(400, 404),
            )
        },
    ),
    Route(
        f"{SESSION}/export",
        "session-export",
        {
            "GET": op(
                session_export.export_session,
                "The session's journal exactly (format=json, default; media=1 adds the bytes of its images and"
                " audio) or its transcript as Markdown",
                response=None,
                query=("format", "media"),
                errors=(400, 403, 404),
            )
        },
    ),
    Route(
        f"{SESSION}/media/<str:sha256>",
        "session-media",
        {
            "GET": op(
                media_api.get_session_media,
                "A stored image or audio of the session (a prompt's part or a tool result's), by its sha256",
                response=None,
                errors=(404,),
            )
        },
    ),
    Route(RUN, "run", {"GET": op(views.get_run, "A run's status and result", response="Run", errors=(404,))}),
    Route(
        f"{RUN}/events",
        "run-events",
        {
            "GET": op(
                views.run_events,
                "The run's events as Server-Sent Events (replay, then live; resume with Last-Event-ID or ?after=)",
                response="Event",
                streaming=True,
                query=("after",),
                errors=(400, 404),
            )
        },
    ),
    Route(
        f"{RUN}/cancel",
        "run-cancel",
        {"POST": op(views.cancel_run, "Cancel the run", status=202, response="Run", errors=(403, 404, 409))},
    ),
    Route(
        f"{RUN}/steer",
        "run-steer",
        {
            "POST": op(
                views.steer_run,
                "Steer the active run",
                status=202,
                request="Steer",
                response="Run",
                errors=(400, 403, 404, 409),
            )
        },
    ),
    Route(
        "asks/<str:ask_id>",
        "ask",
        {
            "POST": op(
                views.decide_ask,
                "Decide (or vote on) an approval ask; the resumed session is a new run",
                status=202,
                request="Decide",
                response="Decision",
                errors=(400, 403, 404, 409),
            )
        },
    ),
    Route(
        "audit",
        "audit",
        {
            "GET": op(
                audit_api.list_audit,
                "The moderation audit the caller may read, newest first (paginated; ?format=csv streams it)",
                response="AuditPage",
                query=audit_api.AUDIT_QUERY,
                limit_max=audit_api.AUDIT_LIMIT_MAX,
                errors=(400,),
            )
        },
    ),
    Route(
        "asks",
        "asks",
        {
            "GET": op(
                views.list_asks,
                "The approval asks the caller may see, newest first (paginated; filters state, team, tool)",
                response="AskList",
                query=("state", "team", "tool", "limit", "offset"),
                errors=(400,),
            )
        },
    ),
    Route(
        "teams/<str:name>/rules",
        "team-rules",
        {
            "GET": op(views.list_rules, "A team's approval rules, in order", response="RuleList", errors=(404,)),
            "POST": op(
                views.create_rule,
                "Add an approval rule (moderators of the team)",
                status=201,
                request="RuleInput",
                response="Rule",
                errors=(400, 403, 404),
            ),
        },
    ),
    Route(
        "teams/<str:name>/rules/<str:rule_id>",
        "team-rule",
        {
            "PUT": op(
                views.update_rule,
                "Replace (and move) an approval rule (moderators of the team)",
                request="RuleInput",
                response="Rule",
                errors=(400, 403, 404),
            ),
            "DELETE": op(
                views.delete_rule, "Delete an approval rule (moderators of the team)", status=204, errors=(403, 404)
            ),
        },
    ),
    Route(
        "teams/<str:name>/scores",
        "team-scores",
        {
            "GET": op(
                scores_api.list_scores,
                "A team's scores: the built-in ones, then its own",
                response="ScoreList",
                errors=(404,),
            ),
            "POST": op(
                scores_api.create_score,
                "Define a score (moderators of the team)",
                status=201,
                request="ScoreInput",
                response="Score",
                errors=(400, 403, 404, 409),
            ),
        },
    ),
    Route(
        "teams/<str:name>/scores/<str:score>",
        "team-score",
        {
            "PUT": op(
                scores_api.update_score,
                "Change a score's description, labels or range (moderators; its name and kind stay)",
                request="ScoreUpdate",
                response="Score",
                errors=(400, 403, 404),
            ),
            "DELETE": op(
                scores_api.delete_score,
                "Delete a score (moderators; ratings keep the values given with it)",
                status=204,
                errors=(400, 403, 404),
            ),
        },
    ),
    Route(
        f"{SESSION}/ratings",
        "session-ratings",
        {
            "GET": op(
                scores_api.list_ratings,
                "Reviewers' ratings of the session and its messages, with the team's scores (reviewers)",
                response="RatingList",
                errors=(403, 404),
            ),
            "POST": op(
                scores_api.rate,
                "Rate the session or one message with the team's scores (reviewers; replaces the caller's"
                " earlier rating of it)",
                request="RatingInput",
                response="Rating",
                errors=(400, 403, 404),
            ),
        },
    ),
    Route(
        "teams/<str:name>/experiments",
        "team-experiments",
        {
            "GET": op(
                experiments_api.list_experiments,
                "A team's experiments, newest first (its reviewers and moderators)",
                response="ExperimentList",
                errors=(403, 404),
            ),
            "POST": op(
                experiments_api.create_experiment,
                "Replay sessions of the team on candidate agent versions (moderators of the team)",
                status=201,
                request="CreateExperiment",
                response="Experiment",
                errors=(400, 403, 404),
            ),
        },
    ),
    Route(
        "experiments/<str:experiment_id>",
        "experiment",
        {
            "GET": op(
                experiments_api.get_experiment,
                "An experiment, its replays and summary",
                response="Experiment",
                errors=(404,),
            )
        },
    ),
    Route(
        "experiments/<str:experiment_id>/verdicts",
        "experiment-verdicts",
        {
            "POST": op(
                experiments_api.judge_pair,
                "A reviewer's verdict on one pair (the recording against a candidate's replay)",
                status=201,
                request="PairVerdictInput",
                response="PairVerdict",
                errors=(400, 404),
            )
        },
    ),
    Route(
        "experiments/<str:experiment_id>/queue",
        "experiment-queue",
        {
            "POST": op(
                experiments_api.send_to_queue,
                "Send every pair of the experiment to a review queue of its team, for blind A/B verdicts"
                " (moderators of the team): an existing queue (`queue`) or a new one (`name`, `reviewers`)",
                status=201,
                request="SendToQueue",
                response="SentToQueue",
                errors=(400, 403, 404, 409),
            )
        },
    ),
    Route(
        "agents",
        "agents",
        {"GET": op(agents_api.list_all_agents, "The agents the caller may use", response="AgentList")},
    ),
    Route(
        "teams/<str:name>/agents",
        "team-agents",
        {
            "GET": op(agents_api.list_team_agents, "A team's agents", response="AgentList", errors=(404,)),
            "POST": op(
                agents_api.create_agent,
                "Create an agent with its version 1 (moderators of the team)",
                status=201,
                request="CreateAgent",
                response="Agent",
                errors=(400, 403, 404),
            ),
        },
    ),
    Route(
        "teams/<str:name>/agents/<str:slug>",
        "team-agent",
        {
            "GET": op(
                agents_api.get_team_agent,
                "A team's agent by its slug, with its latest version",
                response="Agent",
                errors=(404,),
            )
        },
    ),
    Route(
        "agents/<str:agent_id>",
        "agent",
        {
            "GET": op(agents_api.get_agent, "An agent and its latest version", response="Agent", errors=(404,)),
            "PUT": op(
                agents_api.save_agent,
                "Save the next version of an agent (the fields given replace the latest version's)",
                request="SaveAgent",
                response="AgentVersion",
                errors=(400, 403, 404),
            ),
        },
    ),
    Route(
        "agents/<str:agent_id>/versions",
        "agent-versions",
        {
            "GET": op(
                agents_api.list_versions,
                "An agent's versions, newest first",
                response="AgentVersionList",
                errors=(404,),
            )
        },
    ),
    Route(
        "agents/<str:agent_id>/versions/<str:number>",
        "agent-version",
        {
            "GET": op(
                agents_api.get_agent_version, "One version of an agent", response="AgentVersion", errors=(400, 404)
            )
        },
    ),
    Route(
        "teams/<str:name>/budget",
        "team-budget",
        {
            "GET": op(
                agents_api.get_budget,
                "A team's monthly budget and this month's spend",
                response="Budget",
                errors=(404,),
            ),
            "PUT": op(
                agents_api.set_budget,
                "Set a team's monthly budget (moderators of the team; fields left out stay)",
                request="BudgetInput",
                response="Budget",
                errors=(400, 403, 404),
            ),
        },
    ),
    Route(
        "teams",
        "teams",
        {
            "GET": op(
                teams_api.list_teams,
                "The caller's teams and their role in each (staff: every team)",
                response="TeamList",
            )
        },
    ),
    Route(
        "teams/<str:name>/members",
        "team-members",
        {
            "GET": op(teams_api.list_members, "A team's members and roles", response="MemberList", errors=(404,)),
            "POST": op(
                teams_api.add_member,
                "Add a person to a team by username or email (moderators of the team)",
                status=201,
                request="MemberInput",
                response="Member",
                errors=(400, 403, 404, 409),
            ),
        },
    ),
    Route(
        "teams/<str:name>/members/<str:username>",
        "team-member",
        {
            "PUT": op(
                teams_api.change_member,
                "Change a member's role (moderators; a team keeps at least one moderator)",
                request="MemberRole",
                response="Member",
                errors=(400, 403, 404, 409),
            ),
            "DELETE": op(
                teams_api.remove_member,
                "Remove a member (moderators; a team keeps at least one moderator)",
                status=204,
                errors=(403, 404, 409),
            ),
        },
    ),
    Route(
        "teams/<str:name>/webhooks",
        "team-webhooks",
        {
            "GET": op(
                teams_api.list_webhooks,
                "A team's webhooks, without their secrets (moderators of the team)",
                response="WebhookList",
                errors=(403, 404),
            ),
            "POST": op(
                teams_api.add_webhook,
                "Add a webhook (moderators; the URL must pass the address guard; the secret is write-only)",
                status=201,
                request="WebhookInput",
                response="Webhook",
                errors=(400, 403, 404),
            ),
        },
    ),
    Route(
        "teams/<str:name>/webhooks/<str:webhook_id>",
        "team-webhook",
        {
            "DELETE": op(
                teams_api.delete_webhook,
                "Delete a webhook and its delivery log (moderators of the team)",
                status=204,
                errors=(403, 404),
            ),
        },
    ),
    Route(
        "teams/<str:name>/mcp-servers",
        "team-mcp-servers",
        {
            "GET": op(
                mcp_api.list_servers,
                "A team's MCP servers (headers: names only) and the installation's stdio servers",
                response="McpServerList",
                errors=(404,),
            ),
            "POST": op(
                mcp_api.add_server,
                "Register a Streamable HTTP server (url), or enable an installation stdio server (name only);"
                " discovers its tools (moderators of the team)",
                status=201,
                request="McpServerInput",
                response="McpServer",
                errors=(400, 403, 404, 409),
            ),
        },
    ),
    Route(
        "teams/<str:name>/mcp-servers/<str:server>",
        "team-mcp-server",
        {
            "GET": op(mcp_api.get_server, "One of a team's MCP servers", response="McpServer", errors=(404,)),
            "PUT": op(
                mcp_api.update_server,
                "Change a server (headers given replace the stored set) and discover its tools again (moderators)",
                request="McpServerInput",
                response="McpServer",
                errors=(400, 403, 404),
            ),
            "DELETE": op(
                mcp_api.delete_server,
                "Delete a team's server, or disable an installation server for the team (moderators)",
                status=204,
                errors=(403, 404),
            ),
        },
    ),
    Route(
        "teams/<str:name>/mcp-servers/<str:server>/refresh",
        "team-mcp-server-refresh",
        {
            "POST": op(
                mcp_api.refresh_server,
                "Discover a server's tools again (moderators)",
                response="McpServer",
                errors=(403, 404),
            )
        },
    ),
    Route(
        f"{SESSION}/agent",
        "session-agent",
        {
            "POST": op(
                agents_api.move_session_agent,
                "Move a session to another version of its agent (between runs)",
                request="MoveAgent",
                response="Snapshot",
                errors=(400, 403, 404, 409),
            )
        },
    ),
    Route("openapi.json", "openapi", {"GET": op(openapi_document, "This document", response=None, auth=False)}),
)

urlpatterns: list[URLPattern] = [
    path(route.path, views.api_view(route.operations), name=route.name) for route in ROUTES
]
urlpatterns.append(re_path(r"^(?P<path>.*)$", views.not_found, name="not-found"))
