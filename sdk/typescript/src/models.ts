/** What the SDK hands back: snapshots, transcripts, run events and results, in camelCase. */

import { ProtocolError } from "./errors.js";
import type { MediaCapabilities } from "./parts.js";

/** The kinds of a run's events, in the order they can come (`result` always last). */
export const EVENT_KINDS = [
  "turn.start",
  "message.delta",
  "reasoning.delta",
  "tool.call",
  "tool.result",
  "permission.ask",
  "approval",
  "steer",
  "compaction",
  "session.title",
  "recover_notice",
  "turn.end",
  "result",
] as const;
export type RunEventKind = (typeof EVENT_KINDS)[number];

export enum SessionMode {
  Default = "default",
  Plan = "plan",
  AcceptEdits = "accept_edits",
}

export enum Verdict {
  AllowOnce = "allow_once",
  AllowAlways = "allow_always",
  Deny = "deny",
  Respond = "respond",
}

/** A responder's (or `resolveAsk`'s) answer: run the asked call once, with these
 * arguments instead of the model's (verdict allow_once with `arguments`). */
export class Edit {
  readonly arguments: Record<string, unknown>;
  constructor(args: Record<string, unknown>) {
    this.arguments = args;
  }
}

/** A responder's answer: the model gets `result` as the call's result, attributed to the
 * token's owner; the tool does not run (verdict respond). */
export class Respond {
  constructor(readonly result: string) {}
}

/** What a responder may return: a verdict, an edit, a response, or nothing (leave the ask). */
export type Answer = Verdict | string | Edit | Respond | undefined | null;

/** A verdict and its options for the API: what `Edit` and `Respond` stand for. */
export function answerOf(answer: Verdict | string | Edit | Respond): {
  verdict: string;
  options: { arguments?: Record<string, unknown>; result?: string };
} {
  if (answer instanceof Edit) return { verdict: Verdict.AllowOnce, options: { arguments: answer.arguments } };
  if (answer instanceof Respond) return { verdict: Verdict.Respond, options: { result: answer.result } };
  return { verdict: String(answer), options: {} };
}

export interface Usage {
  inputTokens: number;
  outputTokens: number;
  reasoningTokens: number;
  cachedInputTokens: number;
}

export interface ResolvedModel {
  providerId: string;
  modelId: string;
  contextWindow: number;
  reasoningEffort: string | null;
}

export interface Placement {
  /** As the fork or clear that made the session gave it; Sectr never interprets it. */
  worktreeSelector?: string | Record<string, unknown>;
  runId?: string;
  runStatus?: string;
  worker?: string | null;
  leaseExpiresAt?: string | null;
  heartbeatAt?: string | null;
}

export interface PendingAsk {
  askId: string;
  name: string;
  arguments: Record<string, unknown>;
  toolCallId: string | null;
  seq: number;
  invocationId: string;
  /** A re-ask after a crash cut this call off once it had started: it may have run. */
  mayHaveRun: boolean;
}

export interface Snapshot {
  id: string;
  state: "idle" | "running" | "awaiting" | "completed" | "failed" | "cancelled";
  mode: string;
  title?: { value: string };
  resolvedModel?: ResolvedModel;
  limits: Record<string, number>;
  turns: number;
  toolCalls: number;
  tokenUsage: { total: Usage; byModel: Record<string, Usage> };
  media: MediaCapabilities;
  placement?: Placement;
  pendingAsk?: PendingAsk;
  createdAt: string | null;
  updatedAt: string | null;
  owner: string;
  team: string | null;
  lastSeq: number;
  /** The whole answer, as the server sent it. */
  raw: Record<string, unknown>;
}

export interface TranscriptMessage {
  role: string;
  text: string | null;
  toolCalls: Record<string, unknown>[];
  toolResult: Record<string, unknown> | null;
  parts: Record<string, unknown>[] | null;
}

export interface Transcript {
  messages: TranscriptMessage[];
  complete: boolean;
  lastSeq: number;
  view: string;
}

/** One event of a run: `kind`, `text` for deltas, `payload` (as the server sent it). */
export interface RunEvent {
  kind: RunEventKind | (string & {});
  runId: string;
  seq: number | null;
  text: string | null;
  payload: Record<string, unknown>;
}

export interface PermissionAsk {
  askId: string;
  name: string;
  arguments: Record<string, unknown>;
  toolCallId: string | null;
  runId: string;
  /** A re-ask after a crash cut this call off once it had started: it may have run. */
  mayHaveRun: boolean;
}

/** How a run ended: a stop is a result, not an error (cancelled, limits, budget...). */
export interface RunResult {
  runId: string;
  runIds: string[];
  text: string;
  stopReason: string;
  usage: Record<string, number>;
  error: string | null;
  ask: PermissionAsk | null;
}

export interface RunInfo {
  runId: string;
  sessionId: string;
  status: string;
  stopReason: string | null;
  usage: Record<string, number>;
  error: string | null;
  active: boolean;
  raw: Record<string, unknown>;
}

type Json = Record<string, unknown>;

function object(value: unknown, what: string): Json {
  if (typeof value !== "object" || value === null || Array.isArray(value)) throw new ProtocolError(`malformed ${what}`);
  return value as Json;
}

function require(data: Json, what: string, ...keys: string[]): Json {
  const missing = keys.filter((key) => !(key in data));
  if (missing.length) throw new ProtocolError(`the server's ${what} lacks ${missing.join(", ")}`);
  return data;
}

const num = (value: unknown): number => (typeof value === "number" ? value : Number(value ?? 0) || 0);
const strOrNull = (value: unknown): string | null => (value == null ? null : String(value));

function usage(value: unknown): Usage {
  const data = (value ?? {}) as Json;
  return {
    inputTokens: num(data["input_tokens"]),
    outputTokens: num(data["output_tokens"]),
    reasoningTokens: num(data["reasoning_tokens"]),
    cachedInputTokens: num(data["cached_input_tokens"]),
  };
}

function camel(key: string): string {
  return key.replace(/_([a-z])/g, (_, ch: string) => ch.toUpperCase());
}

function placement(value: unknown): Placement | undefined {
  if (value == null) return undefined;
  const data = object(value, "placement");
  const out: Record<string, unknown> = {};
  for (const [key, item] of Object.entries(data)) out[camel(key)] = item; // the selector's own keys stay
  return out as Placement;
}

export function snapshotFromJson(value: unknown): Snapshot {
  const data = require(object(value, "snapshot"), "snapshot", "id", "state", "mode", "token_usage", "owner");
  const model = data["resolved_model"] as Json | undefined;
  const tokens = object(data["token_usage"], "token_usage");
  const ask = data["pending_ask"] as Json | null | undefined;
  const media = (data["media"] ?? {}) as Json;
  return {
    id: String(data["id"]),
    state: data["state"] as Snapshot["state"],
    mode: String(data["mode"]),
    title: typeof data["title"] === "string" ? { value: data["title"] } : undefined,
    resolvedModel: model
      ? {
          providerId: String(model["provider_id"]),
          modelId: String(model["model_id"]),
          contextWindow: num(model["context_window"]),
          reasoningEffort: strOrNull(model["reasoning_effort"]),
        }
      : undefined,
    limits: Object.fromEntries(Object.entries((data["limits"] ?? {}) as Json).map(([k, v]) => [camel(k), num(v)])),
    turns: num(data["turns"]),
    toolCalls: num(data["tool_calls"]),
    tokenUsage: {
      total: usage(tokens["total"]),
      byModel: Object.fromEntries(Object.entries((tokens["by_model"] ?? {}) as Json).map(([k, v]) => [k, usage(v)])),
    },
    media: { image: media["image"] === true, audio: media["audio"] === true },
    placement: placement(data["placement"]),
    pendingAsk: ask
      ? {
          askId: String(ask["ask_id"]),
          name: String(ask["name"]),
          arguments: (ask["arguments"] ?? {}) as Json,
          toolCallId: strOrNull(ask["tool_call_id"]),
          seq: num(ask["seq"]),
          invocationId: String(ask["invocation_id"] ?? ""),
          mayHaveRun: ask["may_have_run"] === true,
        }
      : undefined,
    createdAt: strOrNull(data["created_at"]),
    updatedAt: strOrNull(data["updated_at"]),
    owner: String(data["owner"]),
    team: strOrNull(data["team"]),
    lastSeq: num(data["last_seq"]),
    raw: data,
  };
}

export function transcriptFromJson(value: unknown): Transcript {
  const data = require(object(value, "transcript"), "transcript", "messages", "complete");
  if (!Array.isArray(data["messages"])) throw new ProtocolError("malformed transcript");
  return {
    messages: (data["messages"] as Json[]).map((m) => ({
      role: String(m["role"]),
      text: strOrNull(m["text"]),
      toolCalls: (m["tool_calls"] ?? []) as Json[],
      toolResult: (m["tool_result"] ?? null) as Json | null,
      parts: (m["parts"] ?? null) as Json[] | null,
    })),
    complete: data["complete"] === true,
    lastSeq: num(data["last_seq"]),
    view: String(data["view"] ?? "model"),
  };
}

export function runEventFromJson(value: unknown): RunEvent {
  const data = require(object(value, "event"), "event", "kind", "run_id", "payload");
  return {
    kind: String(data["kind"]),
    runId: String(data["run_id"]),
    seq: data["seq"] == null ? null : num(data["seq"]),
    text: strOrNull(data["text"]),
    payload: object(data["payload"], "event payload"),
  };
}

export function permissionAskFromPayload(payload: Json, runId: string): PermissionAsk {
  require(payload, "permission.ask payload", "ask_id", "name");
  return {
    askId: String(payload["ask_id"]),
    name: String(payload["name"]),
    arguments: (payload["arguments"] ?? {}) as Json,
    toolCallId: strOrNull(payload["tool_call_id"]),
    runId,
    mayHaveRun: payload["may_have_run"] === true,
  };
}

export function runInfoFromJson(value: unknown): RunInfo {
  const data = require(object(value, "run"), "run", "run_id", "status");
  const status = String(data["status"]);
  return {
    runId: String(data["run_id"]),
    sessionId: String(data["session_id"] ?? ""),
    status,
    stopReason: strOrNull(data["stop_reason"]),
    usage: (data["usage"] ?? {}) as Record<string, number>,
    error: strOrNull(data["error"]),
    active: ["pending", "queued", "running"].includes(status),
    raw: data,
  };
}

/** One of a team's scores: built in (`thumbs`, `score`) or its own (categorical with
 * `labels`, numeric from `minimum` to `maximum`, or boolean). */
export interface ScoreDefinition {
  name: string;
  kind: "categorical" | "numeric" | "boolean" | string;
  description: string;
  labels: string[];
  minimum: number | null;
  maximum: number | null;
  builtIn: boolean;
}

/** A reviewer's rating of a session (`seq` 0) or one message: `scores` by name
 * (`thumbs`: true is up; `score`: 1-5; the team's own). */
export interface Rating {
  id: number;
  seq: number;
  messageId: string | null;
  author: string;
  scores: Record<string, string | number | boolean>;
  tags: string[];
  comment: string;
  raw: Json;
}

export function scoreDefinitionFromJson(value: unknown): ScoreDefinition {
  const data = require(object(value, "score"), "score", "name", "kind");
  return {
    name: String(data["name"]),
    kind: String(data["kind"]),
    description: String(data["description"] ?? ""),
    labels: Array.isArray(data["labels"]) ? data["labels"].map(String) : [],
    minimum: typeof data["minimum"] === "number" ? data["minimum"] : null,
    maximum: typeof data["maximum"] === "number" ? data["maximum"] : null,
    builtIn: Boolean(data["built_in"]),
  };
}

export function scoresFromJson(value: unknown): ScoreDefinition[] {
  const data = object(value, "score list");
  if (!Array.isArray(data["scores"])) throw new ProtocolError("a score list without scores");
  return data["scores"].map(scoreDefinitionFromJson);
}

export function ratingFromJson(value: unknown): Rating {
  const data = require(object(value, "rating"), "rating", "id", "scores");
  return {
    id: Number(data["id"]),
    seq: Number(data["seq"] ?? 0),
    messageId: strOrNull(data["message_id"]),
    author: String(data["author"] ?? ""),
    scores: object(data["scores"], "rating scores") as Rating["scores"],
    tags: Array.isArray(data["tags"]) ? data["tags"].map(String) : [],
    comment: String(data["comment"] ?? ""),
    raw: data,
  };
}

// ---- experiments (docs/experiments.md) ----

/** One replay of an experiment: a source session on one candidate, and where it stands. */
export interface ExperimentReplay {
  source: string;
  candidate: number;
  session: string;
  state: string;
  turns: number;
  turnsDone: number;
  tokens: number;
  cost: string | null;
  divergence: Json | null;
}

/** One side of a pair as reviewers scored it with one of the team's scores: how many
 * gave it, the mean (a yes/no score: the share of yes; none for labels), and a count per
 * label for labels and yes/no. */
export interface PairScoreSide {
  count: number;
  mean: number | null;
  counts?: Record<string, number>;
}

/** One candidate's replays, verdicts against the recording, and scores per side. */
export interface ExperimentSummary {
  candidate: number;
  replays: number;
  done: number;
  diverged: number;
  failed: number;
  running: number;
  tokens: number;
  cost: string | null;
  wins: number;
  losses: number;
  ties: number;
  scores: Record<string, { kind: string; baseline: PairScoreSide; candidate: PairScoreSide }>;
}

/** A team's sessions replayed on candidates; `replays` and `summary` from `get` and `create`. */
export interface Experiment {
  id: string;
  team: string;
  name: string;
  candidates: Json[];
  replays: ExperimentReplay[];
  summary: ExperimentSummary[];
  raw: Json;
}

export function experimentFromJson(value: unknown): Experiment {
  const data = require(object(value, "experiment"), "experiment", "id", "candidates");
  const replays = Array.isArray(data["replays"]) ? (data["replays"] as Json[]) : [];
  const summary = Array.isArray(data["summary"]) ? (data["summary"] as Json[]) : [];
  return {
    id: String(data["id"]),
    team: String(data["team"] ?? ""),
    name: String(data["name"] ?? ""),
    candidates: Array.isArray(data["candidates"]) ? (data["candidates"] as Json[]) : [],
    replays: replays.map((r) => ({
      source: String(r["source"]),
      candidate: num(r["candidate"]),
      session: String(r["session"]),
      state: String(r["state"]),
      turns: num(r["turns"]),
      turnsDone: num(r["turns_done"]),
      tokens: num(r["tokens"]),
      cost: strOrNull(r["cost"]),
      divergence: (r["divergence"] as Json | null) ?? null,
    })),
    summary: summary.map((s) => ({
      candidate: num(s["candidate"]),
      replays: num(s["replays"]),
      done: num(s["done"]),
      diverged: num(s["diverged"]),
      failed: num(s["failed"]),
      running: num(s["running"]),
      tokens: num(s["tokens"]),
      cost: strOrNull(s["cost"]),
      wins: num(s["wins"]),
      losses: num(s["losses"]),
      ties: num(s["ties"]),
      scores: (s["scores"] ?? {}) as ExperimentSummary["scores"],
    })),
    raw: data,
  };
}

export function experimentsFromJson(value: unknown): Experiment[] {
  const data = object(value, "experiment list");
  if (!Array.isArray(data["experiments"])) throw new ProtocolError("an experiment list without experiments");
  return data["experiments"].map(experimentFromJson);
}

/** A reviewer's verdict on one pair: what won and each side's scores. */
export interface PairVerdict {
  source: string;
  candidate: number;
  winner: string;
  note: string;
  reviewer: string;
  scores: { baseline?: Record<string, unknown>; candidate?: Record<string, unknown> };
}

export function pairVerdictFromJson(value: unknown): PairVerdict {
  const data = require(object(value, "verdict"), "verdict", "source", "winner");
  return {
    source: String(data["source"]),
    candidate: num(data["candidate"]),
    winner: String(data["winner"]),
    note: String(data["note"] ?? ""),
    reviewer: String(data["reviewer"] ?? ""),
    scores: (data["scores"] ?? {}) as PairVerdict["scores"],
  };
}

/** One pair item of a review queue. */
export interface PairQueueItem {
  id: number;
  position: number;
  source: string;
  candidate: number;
  assignee: string | null;
  done: boolean;
}

/** An experiment sent to a review queue: the queue, how many pairs went in now, and
 * every pair item of the experiment in that queue. */
export interface QueuedPairs {
  queueId: number;
  queueName: string;
  added: number;
  items: PairQueueItem[];
}

export function queuedPairsFromJson(value: unknown): QueuedPairs {
  const data = require(object(value, "queued pairs"), "queued pairs", "queue", "items");
  const queue = object(data["queue"], "queue");
  const items = Array.isArray(data["items"]) ? (data["items"] as Json[]) : [];
  return {
    queueId: num(queue["id"]),
    queueName: String(queue["name"] ?? ""),
    added: num(data["added"]),
    items: items.map((i) => ({
      id: num(i["id"]),
      position: num(i["position"]),
      source: String(i["source"]),
      candidate: num(i["candidate"]),
      assignee: strOrNull(i["assignee"]),
      done: Boolean(i["done"]),
    })),
  };
}
