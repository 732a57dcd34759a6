/** `SectrClient`: sessions, runs and asks over Sectr's HTTP API, with fetch and web streams. */

import {
  DeadlineExceededError,
  InvalidRequestError,
  InvalidStateError,
  ProtocolError,
  RedirectError,
  RequestCancelledError,
  SectrError,
  SessionBusyError,
  TransportError,
  errorFromResponse,
} from "./errors.js";
import {
  type Answer,
  Edit,
  type PermissionAsk,
  Respond,
  type Rating,
  type RunEvent,
  type RunInfo,
  type RunResult,
  SessionMode,
  type Snapshot,
  type Transcript,
  Verdict,
  answerOf,
  permissionAskFromPayload,
  runEventFromJson,
  type ScoreDefinition,
  type Experiment,
  type PairVerdict,
  type QueuedPairs,
  experimentFromJson,
  experimentsFromJson,
  pairVerdictFromJson,
  queuedPairsFromJson,
  ratingFromJson,
  runInfoFromJson,
  scoreDefinitionFromJson,
  scoresFromJson,
  snapshotFromJson,
  transcriptFromJson,
} from "./models.js";
import { type Prompt, checkParts } from "./parts.js";
import { SSEDecoder, type ServerSentEvent } from "./sse.js";

export const API_PREFIX = "/api/v1";
/** Sent with every request about a known session, so a load balancer can keep it on one server. */
export const AFFINITY_HEADER = "X-Sectr-Session";
/** The run a POST answered with its event stream started (`Accept: text/event-stream`). */
export const RUN_ID_HEADER = "X-Sectr-Run-Id";
const MAX_RECONNECTS = 8;
const DEFAULT_TIMEOUT_MS = 30_000;
/** The server sends a comment every 15 s; a stream silent this long is reconnected. */
const STREAM_SILENCE_MS = 45_000;

/** How one call is made, apart from what it asks for: the last argument of every call. */
export interface RequestControls {
  /** Aborting it stops the call (RequestCancelledError); a run goes on on the server. */
  signal?: AbortSignal;
  /** Added to the request's headers. */
  headers?: Record<string, string>;
  /** The total time for the call; for `run` and `retry`, for starting the run and
   * consuming it (DeadlineExceededError). */
  timeoutMs?: number;
}

export interface ClientOptions {
  /** Where Sectr runs, e.g. "https://sectr.example.com" (the API is under /api/v1). */
  baseUrl: string;
  /** An API token (`python manage.py sectr_token USERNAME`, or the web UI). */
  token?: string;
  headers?: Record<string, string>;
  /** The default total time of a call that is not a run (30 s). */
  timeoutMs?: number;
  maxReconnects?: number;
  fetch?: typeof fetch;
}

/** A run's responders: answer a permission ask (a verdict, an `Edit` of its arguments or a
 * `Respond` with the call's result) and the same Run follows the resumed run. */
export interface Responders {
  onPermissionAsk?: (ask: PermissionAsk) => Answer | Promise<Answer>;
}

/** How an ask is decided, besides its verdict. */
export interface DecideOptions {
  note?: string;
  /** "turn" ("Approve all", with an approving verdict): also the later gated calls of the turn. */
  scope?: "turn";
  /** With allow_once: run the call with these arguments instead of the model's. */
  arguments?: Record<string, unknown>;
  /** With respond: the call's result, given to the model instead of running the tool. */
  result?: string;
}

export type ResolveOptions = Omit<DecideOptions, "scope">;

export interface WebhookOptions {
  /** "json" (Sectr's own signed body, the default) or "slack" (an incoming-webhook message). */
  kind?: "json" | "slack";
  /** Signs the JSON deliveries; write-only (never returned). Left out: a random one. */
  secret?: string;
}

/** One of a team's webhooks, as its moderators see it: never its secret. */
export interface Webhook {
  id: number;
  url: string;
  kind: string;
  active: boolean;
  createdAt: string;
}

function webhookFromJson(data: any): Webhook {
  if (!data || typeof data !== "object" || data.id === undefined || typeof data.url !== "string") {
    throw new ProtocolError("a webhook without id and url");
  }
  return {
    id: Number(data.id),
    url: data.url,
    kind: String(data.kind ?? "json"),
    active: Boolean(data.active ?? true),
    createdAt: String(data.created_at ?? ""),
  };
}

export interface RunOptions extends Responders {
  /** Wait for the session's active run to end instead of SessionBusyError. */
  queue?: boolean;
  /** The POST's answer is the run's event stream itself (one request fewer before the
   * first event). Consume the Run then (iterate it or `result()`): until it is, the
   * stream holds a connection. */
  stream?: boolean;
}

export interface SessionEventsOptions {
  /** Only the events after this seq (a snapshot's `lastSeq`: what comes next). */
  after?: number;
}

export interface CreateOptions {
  title?: string;
  mode?: SessionMode | string;
  model?: string;
  limits?: Record<string, number>;
  reasoningEffort?: string;
  team?: string | null;
}

export interface ForkOptions {
  title?: string;
  reasoningEffort?: string;
  model?: string;
  providerId?: string;
  modelId?: string;
  worktreeSelector?: string | Record<string, unknown>;
  atSeq?: number;
}

export interface ClearOptions {
  worktreeSelector?: string | Record<string, unknown>;
}

/** Refuse an option the method does not know, naming the method (a typo is not ignored). */
function checkOptions(method: string, options: object | undefined, allowed: readonly string[]): void {
  if (options == null) return;
  if (typeof options !== "object") throw new TypeError(`${method}: options must be an object`);
  for (const key of Object.keys(options)) {
    if (!allowed.includes(key)) {
      throw new TypeError(`${method}: unknown option '${key}' (its options: ${allowed.join(", ") || "none"})`);
    }
  }
}

/** The request controls every call takes as its last argument. */
export const CONTROL_KEYS = ["signal", "headers", "timeoutMs"] as const;

function checkControls(method: string, controls: RequestControls | undefined): void {
  checkOptions(`${method} (request controls)`, controls, CONTROL_KEYS);
}

/** A point in time a call must finish by. */
class Deadline {
  readonly end: number | undefined;
  constructor(readonly ms: number | undefined) {
    if (ms !== undefined && !(ms > 0)) throw new TypeError("timeoutMs is a number of milliseconds above zero");
    this.end = ms === undefined ? undefined : Date.now() + ms;
  }
  remaining(): number | undefined {
    return this.end === undefined ? undefined : Math.max(this.end - Date.now(), 0);
  }
  get expired(): boolean {
    return this.end !== undefined && Date.now() >= this.end;
  }
  error(what: string): DeadlineExceededError {
    return new DeadlineExceededError(`${what}: the deadline of ${this.ms} ms passed`);
  }
}

/** One attempt's abort: the caller's signal, the deadline, or a silence timer. */
class Scope {
  readonly controller = new AbortController();
  why: "cancelled" | "deadline" | "silent" | undefined;
  private timers: ReturnType<typeof setTimeout>[] = [];
  private silence: ReturnType<typeof setTimeout> | undefined;
  private readonly onAbort = (): void => this.abort("cancelled");

  constructor(private readonly signal: AbortSignal | undefined, deadline: Deadline) {
    if (signal?.aborted) this.abort("cancelled");
    signal?.addEventListener("abort", this.onAbort, { once: true });
    const left = deadline.remaining();
    if (left !== undefined) this.timers.push(setTimeout(() => this.abort("deadline"), left));
  }

  abort(why: "cancelled" | "deadline" | "silent"): void {
    if (this.why) return;
    this.why = why;
    this.controller.abort();
  }

  /** (Re)arm the timer that treats a silent stream as cut. */
  heard(ms: number): void {
    if (this.silence) clearTimeout(this.silence);
    this.silence = setTimeout(() => this.abort("silent"), ms);
  }

  dispose(): void {
    this.signal?.removeEventListener("abort", this.onAbort);
    for (const timer of this.timers) clearTimeout(timer);
    if (this.silence) clearTimeout(this.silence);
  }
}

function mergedHeaders(...sets: (Record<string, string> | undefined)[]): Record<string, string> {
  return Object.assign({}, ...sets.filter(Boolean)) as Record<string, string>;
}

interface CallOptions {
  body?: unknown;
  query?: Record<string, string | number | undefined>;
  sessionId?: string;
  deadline?: Deadline;
}

export class SectrClient {
  readonly baseUrl: string;
  readonly sessions: Sessions;
  readonly runs: Runs;
  readonly asks: Asks;
  readonly teams: Teams;
  readonly scores: Scores;
  readonly experiments: Experiments;
  readonly maxReconnects: number;
  private readonly headers: Record<string, string>;
  private readonly timeoutMs: number;
  private readonly fetchImpl: typeof fetch;

  constructor(options: ClientOptions) {
    checkOptions("new SectrClient()", options, ["baseUrl", "token", "headers", "timeoutMs", "maxReconnects", "fetch"]);
    if (!options?.baseUrl) throw new TypeError("new SectrClient(): baseUrl is required");
    this.baseUrl = options.baseUrl.replace(/\/+$/, "");
    this.headers = mergedHeaders(
      { Accept: "application/json" },
      options.token ? { Authorization: `Bearer ${options.token}` } : undefined,
      options.headers,
    );
    this.timeoutMs = options.timeoutMs ?? DEFAULT_TIMEOUT_MS;
    this.maxReconnects = options.maxReconnects ?? MAX_RECONNECTS;
    this.fetchImpl = options.fetch ?? globalThis.fetch.bind(globalThis);
    this.sessions = new Sessions(this);
    this.runs = new Runs(this);
    this.asks = new Asks(this);
    this.teams = new Teams(this);
    this.scores = new Scores(this);
    this.experiments = new Experiments(this);
  }

  /** A handle on a session by id, without a request (`sessions.get` checks it exists). */
  session(sessionId: string): Session {
    return new Session(this, sessionId);
  }

  /** One API call: the decoded JSON answer, or a typed SectrError. */
  async request(method: string, path: string, options: CallOptions = {}, controls: RequestControls = {}): Promise<any> {
    const deadline = options.deadline ?? new Deadline(controls.timeoutMs ?? this.timeoutMs);
    const what = `${method} ${path}`;
    if (deadline.expired) throw deadline.error(what);
    const scope = new Scope(controls.signal, deadline);
    let url = this.baseUrl + API_PREFIX + path;
    const query = Object.entries(options.query ?? {}).filter(([, v]) => v !== undefined);
    if (query.length) url += "?" + new URLSearchParams(query.map(([k, v]) => [k, String(v)])).toString();
    const headers = mergedHeaders(
      this.headers,
      options.body !== undefined ? { "Content-Type": "application/json" } : undefined,
      options.sessionId ? { [AFFINITY_HEADER]: options.sessionId } : undefined,
      controls.headers,
    );
    try {
      const response = await this.fetchImpl(url, {
        method,
        headers,
        body: options.body !== undefined ? JSON.stringify(options.body) : undefined,
        signal: scope.controller.signal,
        redirect: "manual",
      });
      const text = await response.text();
      return decodeAnswer(response, text);
    } catch (error) {
      throw scopeError(error, scope, deadline, what);
    } finally {
      scope.dispose();
    }
  }

  /** @internal One connection of a run's event stream (or of the stream at `path`); an
   * answer `503 unavailable` throws StreamUnavailable, a cut to reconnect from after its
   * Retry-After. */
  async openStream(runId: string, headers: Record<string, string>, scope: Scope, path?: string): Promise<Response> {
    const response = await this.fetchImpl(`${this.baseUrl}${API_PREFIX}${path ?? `/runs/${runId}/events`}`, {
      headers: mergedHeaders(this.headers, { Accept: "text/event-stream" }, headers),
      signal: scope.controller.signal,
      redirect: "manual",
    });
    if (isEventStream(response)) return response;
    const text = await response.text();
    const waitMs = unavailableRetryAfter(response, text);
    if (waitMs !== undefined) {
      try {
        decodeAnswer(response, text);
      } catch (error) {
        if (error instanceof SectrError) throw new StreamUnavailable(error, waitMs);
        throw error;
      }
    }
    if (response.status >= 300) decodeAnswer(response, text);
    const type = response.headers.get("content-type") ?? "";
    throw new ProtocolError(`the server answered ${response.status} with ${type || "no content type"}, not text/event-stream`, {
      status: response.status,
    });
  }

  /** @internal POST a run asking for its event stream: the run's id and the open stream,
   * or the id alone from a server that answered with JSON (an error: its typed error,
   * except a 503 `unavailable`, which posted nothing: the POST is sent again after its
   * Retry-After, a few times; see `unavailableWait`). */
  async postRunStream(
    path: string,
    body: unknown,
    sessionId: string,
    controls: RequestControls,
    deadline: Deadline,
  ): Promise<{ runId: string; opened?: { response: Response; scope: Scope } }> {
    const what = `POST ${path}`;
    for (let retries = 0; ; retries += 1) {
      if (deadline.expired) throw deadline.error(what);
      const scope = new Scope(controls.signal, deadline);
      let keep = false;
      try {
        const response = await this.fetchImpl(this.baseUrl + API_PREFIX + path, {
          method: "POST",
          headers: mergedHeaders(
            this.headers,
            { "Content-Type": "application/json", Accept: "text/event-stream", [AFFINITY_HEADER]: sessionId },
            controls.headers,
          ),
          body: JSON.stringify(body),
          signal: scope.controller.signal,
          redirect: "manual",
        });
        if (isEventStream(response)) {
          const runId = response.headers.get(RUN_ID_HEADER);
          if (!runId) throw new ProtocolError(`an event stream answered the POST without its ${RUN_ID_HEADER} header`);
          keep = true;
          return { runId, opened: { response, scope } };
        }
        const text = await response.text();
        const wait = unavailableWait(response, text, retries, deadline);
        if (wait === undefined) return { runId: String(decodeAnswer(response, text).run_id) };
        await pause(wait, scope.controller.signal);
      } catch (error) {
        throw scopeError(error, scope, deadline, what);
      } finally {
        if (!keep) scope.dispose();
      }
    }
  }
}

/** A POST that asked for its run's stream and was answered 503 `unavailable` (live
 * updates, or the database, away for a moment) posted nothing: it is sent again after the
 * answer's Retry-After, up to this many times more, each wait at most
 * UNAVAILABLE_WAIT_CAP_MS, then the 503 is thrown. */
const STREAM_POST_RETRIES = 3;
const UNAVAILABLE_WAIT_CAP_MS = 10_000;

/** The milliseconds a 503 `unavailable` answer (its body `text`) asks to wait before
 * asking again (its Retry-After, at most UNAVAILABLE_WAIT_CAP_MS), or undefined for any
 * other answer. */
function unavailableRetryAfter(response: Response, text: string): number | undefined {
  if (response.status !== 503) return undefined;
  let code: unknown;
  try {
    code = (JSON.parse(text) as { error?: { code?: unknown } })?.error?.code;
  } catch {
    return undefined;
  }
  if (code !== "unavailable") return undefined;
  // The API sends seconds (never a date); a missing or odd value counts as 1 s.
  const header = response.headers.get("retry-after");
  const seconds = header ? Number(header) : 1;
  return Math.min(Number.isFinite(seconds) && seconds >= 0 ? seconds * 1000 : 1000, UNAVAILABLE_WAIT_CAP_MS);
}

/** The milliseconds to wait before sending a streamed POST again after its answer, or
 * undefined to throw its error instead: only a 503 `unavailable` is retried, at most
 * STREAM_POST_RETRIES times, and not when the wait would outlast the deadline. */
function unavailableWait(response: Response, text: string, retries: number, deadline: Deadline): number | undefined {
  const ms = retries < STREAM_POST_RETRIES ? unavailableRetryAfter(response, text) : undefined;
  const left = deadline.remaining();
  return ms === undefined || (left !== undefined && ms >= left) ? undefined : ms;
}

/** An event stream's GET answered `503 unavailable` (the database, or live updates, away
 * for a moment): a cut to reconnect from after `waitMs` (its Retry-After), or, when the
 * stream gives up, `error` (that 503) to throw. */
class StreamUnavailable extends Error {
  constructor(
    readonly error: SectrError,
    readonly waitMs: number,
  ) {
    super(error.message);
  }
}

/** The milliseconds to wait before reconnecting a stream after `unavailable`, this being
 * the `failures`-th attempt in a row without a new event; throws the 503 itself once more
 * than `maxReconnects` attempts in a row failed, or when the wait would outlast `deadline`. */
function streamUnavailableWait(unavailable: StreamUnavailable, failures: number, maxReconnects: number, deadline?: Deadline): number {
  const left = deadline?.remaining();
  if (failures > maxReconnects || (left !== undefined && unavailable.waitMs >= left)) throw unavailable.error;
  return unavailable.waitMs;
}

/** Wait `ms`, or less when `signal` aborts (then reject). */
function pause(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal.aborted) return reject(new Error("aborted"));
    const onAbort = (): void => {
      clearTimeout(timer);
      reject(new Error("aborted"));
    };
    const timer = setTimeout(() => {
      signal.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    signal.addEventListener("abort", onAbort, { once: true });
  });
}

function isEventStream(response: Response): boolean {
  const type = response.headers.get("content-type") ?? "";
  return response.ok && type.toLowerCase().startsWith("text/event-stream") && response.body !== null;
}

/** One SSE event of a stream as the RunEvent its data carries. */
function eventFromSse(sse: ServerSentEvent): RunEvent {
  let data: unknown;
  try {
    data = JSON.parse(sse.data);
  } catch {
    throw new ProtocolError(`an SSE event's data is not JSON: ${sse.data.slice(0, 80)}`);
  }
  const event = runEventFromJson(data);
  if (event.kind !== sse.event) throw new ProtocolError(`an SSE event named ${sse.event} carries a ${event.kind} event`);
  return event;
}

function decodeAnswer(response: Response, text: string): any {
  const status = response.status;
  if (status >= 400) throw errorFromResponse(status, text, response.headers);
  if (status >= 300 || response.type === "opaqueredirect") {
    const error = new RedirectError(`the server answered ${status || "a redirect"}: point baseUrl at the API itself`, {
      status,
    });
    error.location = response.headers.get("location") ?? undefined;
    throw error;
  }
  if (status === 204) return undefined;
  if (!(response.headers.get("content-type") ?? "").toLowerCase().includes("json")) {
    throw new ProtocolError(`the server answered ${status}, not JSON`, { status });
  }
  try {
    return JSON.parse(text);
  } catch {
    throw new ProtocolError(`the server answered ${status} with a body that is not JSON`, { status });
  }
}

function scopeError(error: unknown, scope: Scope, deadline: Deadline, what: string): SectrError {
  if (error instanceof SectrError) return error;
  if (scope.why === "cancelled") return new RequestCancelledError(`${what}: the call was cancelled`);
  if (scope.why === "deadline" || deadline.expired) return deadline.error(what);
  const message = error instanceof Error ? `${error.name}: ${error.message}` : String(error);
  return new TransportError(`${what}: ${message}`);
}

function sessionBody(options: CreateOptions): Record<string, unknown> {
  const body: Record<string, unknown> = {};
  if (options.team !== undefined) body["team"] = options.team || null;
  if (options.title !== undefined) body["title"] = options.title;
  if (options.mode !== undefined) body["mode"] = String(options.mode);
  if (options.model !== undefined) body["model"] = options.model;
  if (options.limits !== undefined) body["limits"] = options.limits;
  if (options.reasoningEffort !== undefined) body["reasoning_effort"] = options.reasoningEffort;
  return body;
}

const FORK_KEYS = ["title", "reasoningEffort", "model", "providerId", "modelId", "worktreeSelector", "atSeq"] as const;

function forkBody(options: ForkOptions): Record<string, unknown> {
  const names: Record<(typeof FORK_KEYS)[number], string> = {
    title: "title",
    reasoningEffort: "reasoning_effort",
    model: "model",
    providerId: "provider_id",
    modelId: "model_id",
    worktreeSelector: "worktree_selector",
    atSeq: "at_seq",
  };
  const body: Record<string, unknown> = {};
  for (const key of FORK_KEYS) if (options[key] !== undefined) body[names[key]] = options[key];
  return body;
}

export class Sessions {
  constructor(private readonly client: SectrClient) {}

  async create(options: CreateOptions = {}, controls: RequestControls = {}): Promise<Session> {
    checkOptions("sessions.create()", options, ["title", "mode", "model", "limits", "reasoningEffort", "team"]);
    checkControls("sessions.create()", controls);
    const data = await this.client.request("POST", "/sessions", { body: sessionBody(options) }, controls);
    return new Session(this.client, String(data.id), snapshotFromJson(data));
  }

  async get(sessionId: string, controls: RequestControls = {}): Promise<Session> {
    checkControls("sessions.get()", controls);
    const data = await this.client.request("GET", `/sessions/${sessionId}`, { sessionId }, controls);
    return new Session(this.client, sessionId, snapshotFromJson(data));
  }

  async list(
    options: { limit?: number; offset?: number } = {},
    controls: RequestControls = {},
  ): Promise<{ sessions: Snapshot[]; count: number; nextOffset: number | null }> {
    checkOptions("sessions.list()", options, ["limit", "offset"]);
    checkControls("sessions.list()", controls);
    const data = await this.client.request("GET", "/sessions", { query: { limit: options.limit, offset: options.offset } }, controls);
    if (!Array.isArray(data?.sessions)) throw new ProtocolError("a session list without sessions");
    return { sessions: data.sessions.map(snapshotFromJson), count: Number(data.count ?? 0), nextOffset: data.next_offset ?? null };
  }

  /** A new session from this one's conversation. `model`, or `providerId` + `modelId`,
   * picks its model; `worktreeSelector` comes back in `snapshot().placement`. */
  async fork(sessionId: string, options: ForkOptions = {}, controls: RequestControls = {}): Promise<Session> {
    checkOptions("sessions.fork()", options, FORK_KEYS);
    checkControls("sessions.fork()", controls);
    const data = await this.client.request("POST", `/sessions/${sessionId}/fork`, { body: forkBody(options), sessionId }, controls);
    return new Session(this.client, String(data.id), snapshotFromJson(data));
  }
}

export class Session {
  /** The snapshot of the latest answer that carried one. */
  lastSnapshot: Snapshot | undefined;
  private active: Run | undefined;

  constructor(
    private readonly client: SectrClient,
    readonly id: string,
    snapshot?: Snapshot,
  ) {
    this.lastSnapshot = snapshot;
  }

  private call(method: string, suffix: string, body: unknown, controls: RequestControls, deadline?: Deadline): Promise<any> {
    return this.client.request(method, `/sessions/${this.id}${suffix}`, { body, sessionId: this.id, deadline }, controls);
  }

  private keep(data: unknown): Snapshot {
    this.lastSnapshot = snapshotFromJson(data);
    return this.lastSnapshot;
  }

  async snapshot(controls: RequestControls = {}): Promise<Snapshot> {
    checkControls("session.snapshot()", controls);
    return this.keep(await this.call("GET", "", undefined, controls));
  }

  /** What the model sees (`view: "model"`) or everything people saw (`"history"`). */
  async transcript(options: { view?: "model" | "history" } = {}, controls: RequestControls = {}): Promise<Transcript> {
    checkOptions("session.transcript()", options, ["view"]);
    checkControls("session.transcript()", controls);
    const data = await this.client.request(
      "GET",
      `/sessions/${this.id}/transcript`,
      { query: { view: options.view ?? "model" }, sessionId: this.id },
      controls,
    );
    return transcriptFromJson(data);
  }

  async rename(title: string, controls: RequestControls = {}): Promise<Snapshot> {
    checkControls("session.rename()", controls);
    return this.keep(await this.call("POST", "/rename", { title }, controls));
  }

  async setMode(mode: SessionMode | string, controls: RequestControls = {}): Promise<Snapshot> {
    checkControls("session.setMode()", controls);
    return this.keep(await this.call("POST", "/mode", { mode: String(mode) }, controls));
  }

  async setModel(model: string, options: { reasoningEffort?: string } = {}, controls: RequestControls = {}): Promise<Snapshot> {
    checkOptions("session.setModel()", options, ["reasoningEffort"]);
    checkControls("session.setModel()", controls);
    const body: Record<string, unknown> = { model };
    if (options.reasoningEffort !== undefined) body["reasoning_effort"] = options.reasoningEffort;
    return this.keep(await this.call("POST", "/model", body, controls));
  }

  /** True when the model-visible history got shorter, false for a no-op. */
  async compact(controls: RequestControls = {}): Promise<boolean> {
    checkControls("session.compact()", controls);
    return Boolean((await this.call("POST", "/compact", undefined, controls)).compacted);
  }

  /** A new empty session with this one's mode, model, limits and worktree selector. */
  async clear(options: ClearOptions = {}, controls: RequestControls = {}): Promise<Session> {
    checkOptions("session.clear()", options, ["worktreeSelector"]);
    checkControls("session.clear()", controls);
    const body = options.worktreeSelector !== undefined ? { worktree_selector: options.worktreeSelector } : undefined;
    const data = await this.call("POST", "/clear", body, controls);
    return new Session(this.client, String(data.id), snapshotFromJson(data));
  }

  fork(options: ForkOptions = {}, controls: RequestControls = {}): Promise<Session> {
    return this.client.sessions.fork(this.id, options, controls);
  }

  async close(controls: RequestControls = {}): Promise<Snapshot> {
    checkControls("session.close()", controls);
    return this.keep(await this.call("POST", "/close", undefined, controls));
  }

  async delete(controls: RequestControls = {}): Promise<void> {
    checkControls("session.delete()", controls);
    await this.call("DELETE", "", undefined, controls);
  }

  /** Rate the session (or the message `messageId`) with scores by name: `thumbs` (true:
   * up), `score` (1-5) and the team's own; replaces your earlier rating of it. */
  async rate(scores: Record<string, string | number | boolean | null>, options: RateOptions = {}, controls: RequestControls = {}): Promise<Rating> {
    checkOptions("session.rate()", options, ["messageId", "tags", "comment"]);
    checkControls("session.rate()", controls);
    if (typeof scores !== "object" || scores === null || Array.isArray(scores)) throw new TypeError("session.rate(): scores is an object of score name to value");
    const body: Record<string, unknown> = { scores };
    if (options.messageId !== undefined) body["message_id"] = options.messageId;
    if (options.tags !== undefined) body["tags"] = options.tags;
    if (options.comment !== undefined) body["comment"] = options.comment;
    return ratingFromJson(await this.call("POST", "/ratings", body, controls));
  }

  /** Reviewers' ratings of the session and its messages, with the team's scores. */
  async ratings(controls: RequestControls = {}): Promise<{ scores: ScoreDefinition[]; ratings: Rating[] }> {
    checkControls("session.ratings()", controls);
    const data = await this.call("GET", "/ratings", undefined, controls);
    if (!Array.isArray(data?.ratings)) throw new ProtocolError("a rating list without ratings");
    return { scores: scoresFromJson(data), ratings: data.ratings.map(ratingFromJson) };
  }

  /** Start a run with a prompt (text, or parts checked before anything is sent). */
  async run(prompt: Prompt, options: RunOptions = {}, controls: RequestControls = {}): Promise<Run> {
    checkOptions("session.run()", options, ["onPermissionAsk", "queue", "stream"]);
    checkControls("session.run()", controls);
    const deadline = new Deadline(controls.timeoutMs);
    if (typeof prompt !== "string") {
      const snapshot = this.lastSnapshot ?? (await this.keepFrom(controls, deadline));
      checkParts(prompt, snapshot.media);
    }
    if (!options.queue && this.active && !this.active.finished) {
      const info = await this.client.runs.get(this.active.id, { ...controls, timeoutMs: deadline.remaining() });
      if (info.active) {
        throw new SessionBusyError(`run ${this.active.id} of this session is still ${info.status}`, { code: "session_busy" });
      }
    }
    const body: Record<string, unknown> = { content: prompt };
    if (options.queue) body["queue"] = true;
    if (options.stream) {
      const { runId, opened } = await this.client.postRunStream(`/sessions/${this.id}/runs`, body, this.id, controls, deadline);
      this.active = new Run(this.client, runId, this.id, options, controls, deadline, opened);
      return this.active;
    }
    const data = await this.call("POST", "/runs", body, controls, deadline);
    this.active = new Run(this.client, String(data.run_id), this.id, options, controls, deadline);
    return this.active;
  }

  /**
   * Every run's events of this session as they come (`GET /sessions/{id}/events`): from
   * the session's first run, or after seq `after`. It resumes by itself after a cut
   * (from the last event it delivered) and never ends: `break` out of the loop, or abort
   * the signal of its controls.
   */
  events(options: SessionEventsOptions = {}, controls: RequestControls = {}): AsyncGenerator<RunEvent> {
    checkOptions("session.events()", options, ["after"]);
    checkControls("session.events()", controls);
    return this.followEvents(options.after, controls);
  }

  private async *followEvents(after: number | undefined, controls: RequestControls): AsyncGenerator<RunEvent> {
    let lastSeq: number | undefined;
    let deliveredAtLastSeq = 0;
    let skip = 0;
    let failures = 0;
    const path = `/sessions/${this.id}/events`;
    for (;;) {
      const mark = lastSeq;
      const scope = new Scope(controls.signal, new Deadline(undefined));
      try {
        const headers = mergedHeaders(controls.headers, { [AFFINITY_HEADER]: this.id });
        if (lastSeq !== undefined) {
          // As a Run resumes: from the seq before the last one seen, skipping what was delivered.
          skip = deliveredAtLastSeq;
          headers["Last-Event-ID"] = String(Math.max(lastSeq - 1, 0));
        } else if (after !== undefined) {
          headers["Last-Event-ID"] = String(after);
        }
        scope.heard(STREAM_SILENCE_MS);
        const response = await this.client.openStream("", headers, scope, path);
        const reader = response.body!.getReader();
        const decoder = new SSEDecoder();
        try {
          for (;;) {
            const { done, value } = await reader.read();
            if (done) break;
            scope.heard(STREAM_SILENCE_MS);
            for (const sse of decoder.feed(value)) {
              const event = eventFromSse(sse);
              if (event.seq !== null) {
                if (after !== undefined && event.seq <= after) continue;
                if (lastSeq !== undefined && event.seq < lastSeq) continue;
                if (event.seq === lastSeq) {
                  if (skip > 0) {
                    skip -= 1;
                    continue;
                  }
                  deliveredAtLastSeq += 1;
                } else {
                  lastSeq = event.seq;
                  deliveredAtLastSeq = 1;
                  skip = 0;
                }
              }
              yield event;
            }
          }
        } finally {
          reader.cancel().catch(() => undefined);
        }
        throw new StreamCut("the session's stream ended"); // a restart's `retry:`: go on
      } catch (error) {
        if (error instanceof StreamUnavailable) {
          // A 503 before the stream (the database away): a cut, reconnected after Retry-After.
          failures = lastSeq !== mark ? 1 : failures + 1;
          try {
            await pause(streamUnavailableWait(error, failures, this.client.maxReconnects), scope.controller.signal);
          } catch (stopped) {
            if (stopped instanceof SectrError) throw stopped;
            throw new RequestCancelledError(`session ${this.id}: the call was cancelled`);
          }
          continue;
        }
        if (error instanceof SectrError) throw error;
        if (scope.why === "cancelled") throw new RequestCancelledError(`session ${this.id}: the call was cancelled`);
        failures = lastSeq !== mark ? 1 : failures + 1;
        if (failures > this.client.maxReconnects) {
          throw new TransportError(`the event stream of ${this.id} failed ${failures} times: ${String(error)}`);
        }
        await new Promise((resolve) => setTimeout(resolve, Math.min(250 * 2 ** (failures - 1), 5000)));
      } finally {
        scope.dispose();
      }
    }
  }

  /** Retry the failed step (only after a retryable failure; else InvalidStateError). */
  async retry(options: Responders = {}, controls: RequestControls = {}): Promise<Run> {
    checkOptions("session.retry()", options, ["onPermissionAsk"]);
    checkControls("session.retry()", controls);
    const deadline = new Deadline(controls.timeoutMs);
    const data = await this.call("POST", "/retry", undefined, controls, deadline);
    this.active = new Run(this.client, String(data.run_id), this.id, options, controls, deadline);
    return this.active;
  }

  private async keepFrom(controls: RequestControls, deadline: Deadline): Promise<Snapshot> {
    return this.keep(await this.call("GET", "", undefined, controls, deadline));
  }
}

export class Runs {
  constructor(private readonly client: SectrClient) {}

  async get(runId: string, controls: RequestControls = {}): Promise<RunInfo> {
    checkControls("runs.get()", controls);
    return runInfoFromJson(await this.client.request("GET", `/runs/${runId}`, {}, controls));
  }

  /** A Run handle on an existing run (to stream or await it from elsewhere). */
  attach(runId: string, options: Responders & { sessionId?: string } = {}, controls: RequestControls = {}): Run {
    checkOptions("runs.attach()", options, ["onPermissionAsk", "sessionId"]);
    checkControls("runs.attach()", controls);
    return new Run(this.client, runId, options.sessionId, options, controls, new Deadline(controls.timeoutMs));
  }
}

export class Asks {
  constructor(private readonly client: SectrClient) {}

  /** Decide (or vote on) an ask: the resumed run, or null while a quorum is short.
   * `arguments` (with allow_once) runs the call with these instead; `result` (with
   * respond) answers it with this text instead of running it. */
  async decide(
    askId: string,
    verdict: Verdict | string,
    options: DecideOptions = {},
    controls: RequestControls = {},
  ): Promise<{ run: Run | null; ask: Record<string, unknown> | null }> {
    checkOptions("asks.decide()", options, DECIDE_KEYS);
    checkControls("asks.decide()", controls);
    const body: Record<string, unknown> = { verdict: String(verdict) };
    for (const key of DECIDE_KEYS) if (options[key] !== undefined) body[key] = options[key];
    const data = await this.client.request("POST", `/asks/${askId}`, { body }, controls);
    const run = data.run_id ? new Run(this.client, String(data.run_id), data.session_id, {}, {}, new Deadline(undefined)) : null;
    return { run, ask: data.ask ?? null };
  }

  /** Decide an ask; the resumed session's run. AskAlreadyResolvedError if decided. */
  async resolve(askId: string, verdict: Verdict | string, options: ResolveOptions = {}, controls: RequestControls = {}): Promise<Run> {
    checkOptions("asks.resolve()", options, RESOLVE_KEYS);
    const decision = await this.decide(askId, verdict, options, controls);
    if (!decision.run) throw new InvalidStateError("the vote was recorded; the ask needs more approvals", { code: "quorum_pending" });
    return decision.run;
  }
}

const DECIDE_KEYS = ["note", "scope", "arguments", "result"] as const;
const RESOLVE_KEYS = ["note", "arguments", "result"] as const;

/** A team's webhooks: its moderators list, add and delete them (others: PermissionDeniedError,
 * or NotFoundError without a role in the team). A secret is write-only. */
export class Teams {
  constructor(private readonly client: SectrClient) {}

  async webhooks(team: string, controls: RequestControls = {}): Promise<Webhook[]> {
    checkControls("teams.webhooks()", controls);
    const data = await this.client.request("GET", `/teams/${encodeURIComponent(team)}/webhooks`, {}, controls);
    if (!Array.isArray(data?.webhooks)) throw new ProtocolError("a webhook list without webhooks");
    return data.webhooks.map(webhookFromJson);
  }

  async addWebhook(team: string, url: string, options: WebhookOptions = {}, controls: RequestControls = {}): Promise<Webhook> {
    checkOptions("teams.addWebhook()", options, ["kind", "secret"]);
    checkControls("teams.addWebhook()", controls);
    const body: Record<string, unknown> = { url };
    if (options.kind !== undefined) body["kind"] = options.kind;
    if (options.secret !== undefined) body["secret"] = options.secret;
    return webhookFromJson(await this.client.request("POST", `/teams/${encodeURIComponent(team)}/webhooks`, { body }, controls));
  }

  async deleteWebhook(team: string, webhookId: number, controls: RequestControls = {}): Promise<void> {
    checkControls("teams.deleteWebhook()", controls);
    await this.client.request("DELETE", `/teams/${encodeURIComponent(team)}/webhooks/${webhookId}`, {}, controls);
  }
}

/** A score's labels (categorical), range (numeric) and description. */
export interface ScoreOptions {
  labels?: string[];
  minimum?: number;
  maximum?: number;
  description?: string;
}

export interface RateOptions {
  messageId?: string;
  tags?: string[];
  comment?: string;
}

const SCORE_KEYS = ["labels", "minimum", "maximum", "description"] as const;

function scoreBody(options: ScoreOptions): Record<string, unknown> {
  const body: Record<string, unknown> = {};
  for (const key of SCORE_KEYS) if (options[key] !== undefined) body[key] = options[key];
  return body;
}

/** A team's scores: read by anyone with a role in it, defined by its moderators. */
export class Scores {
  constructor(private readonly client: SectrClient) {}

  async list(team: string, controls: RequestControls = {}): Promise<ScoreDefinition[]> {
    checkControls("scores.list()", controls);
    return scoresFromJson(await this.client.request("GET", `/teams/${encodeURIComponent(team)}/scores`, {}, controls));
  }

  /** Define a score: categorical (give `labels`), numeric (`minimum`, `maximum`) or boolean. */
  async create(team: string, name: string, kind: string, options: ScoreOptions = {}, controls: RequestControls = {}): Promise<ScoreDefinition> {
    checkOptions("scores.create()", options, SCORE_KEYS);
    checkControls("scores.create()", controls);
    const body = { name, kind, ...scoreBody(options) };
    return scoreDefinitionFromJson(await this.client.request("POST", `/teams/${encodeURIComponent(team)}/scores`, { body }, controls));
  }

  /** Change a score's labels, range or description (its name and kind stay). */
  async update(team: string, name: string, options: ScoreOptions = {}, controls: RequestControls = {}): Promise<ScoreDefinition> {
    checkOptions("scores.update()", options, SCORE_KEYS);
    checkControls("scores.update()", controls);
    const path = `/teams/${encodeURIComponent(team)}/scores/${encodeURIComponent(name)}`;
    return scoreDefinitionFromJson(await this.client.request("PUT", path, { body: scoreBody(options) }, controls));
  }

  /** Delete a score; ratings keep the values given with it. */
  async delete(team: string, name: string, controls: RequestControls = {}): Promise<void> {
    checkControls("scores.delete()", controls);
    await this.client.request("DELETE", `/teams/${encodeURIComponent(team)}/scores/${encodeURIComponent(name)}`, {}, controls);
  }
}

/** How an experiment's sources are named (one of them) and whether read-only tools run. */
export interface ExperimentOptions {
  sessions?: string[];
  queue?: number;
  last?: number;
  liveReads?: boolean;
}

export interface JudgeOptions {
  note?: string;
  /** Each side's values of the team's own scores: `{ baseline: {...}, candidate: {...} }`. */
  scores?: { baseline?: Record<string, string | number | boolean>; candidate?: Record<string, string | number | boolean> };
}

/** An existing queue of the experiment's team (`queue`), or a new one (`name`, `reviewers`). */
export interface SendToQueueOptions {
  queue?: number;
  name?: string;
  reviewers?: string[];
}

const EXPERIMENT_KEYS = ["sessions", "queue", "last", "liveReads"] as const;
const JUDGE_KEYS = ["note", "scores"] as const;
const SEND_KEYS = ["queue", "name", "reviewers"] as const;

/**
 * Experiments (docs/experiments.md): a team's sessions replayed on candidate agent
 * versions, created by its moderators, read and judged by its reviewers; their pairs can
 * go to a review queue for blind A/B verdicts.
 */
export class Experiments {
  constructor(private readonly client: SectrClient) {}

  /** The team's experiments, newest first. */
  async list(team: string, controls: RequestControls = {}): Promise<Experiment[]> {
    checkControls("experiments.list()", controls);
    return experimentsFromJson(await this.client.request("GET", `/teams/${encodeURIComponent(team)}/experiments`, {}, controls));
  }

  /** An experiment with its replays' progress and the summary per candidate. */
  async get(experimentId: string, controls: RequestControls = {}): Promise<Experiment> {
    checkControls("experiments.get()", controls);
    return experimentFromJson(await this.client.request("GET", `/experiments/${encodeURIComponent(experimentId)}`, {}, controls));
  }

  /** Replay sessions of the team (one of `sessions`, `queue`, `last`) on each candidate (`{ agent, version?, model? }`). */
  async create(team: string, name: string, candidates: Record<string, unknown>[], options: ExperimentOptions = {}, controls: RequestControls = {}): Promise<Experiment> {
    checkOptions("experiments.create()", options, EXPERIMENT_KEYS);
    checkControls("experiments.create()", controls);
    const body: Record<string, unknown> = { name, candidates };
    if (options.sessions !== undefined) body["sessions"] = options.sessions;
    if (options.queue !== undefined) body["queue"] = options.queue;
    if (options.last !== undefined) body["last"] = options.last;
    if (options.liveReads !== undefined) body["live_reads"] = options.liveReads;
    return experimentFromJson(await this.client.request("POST", `/teams/${encodeURIComponent(team)}/experiments`, { body }, controls));
  }

  /** A verdict on one pair, given openly: `winner` baseline, candidate or tie. */
  async judge(experimentId: string, source: string, candidate: number, winner: string, options: JudgeOptions = {}, controls: RequestControls = {}): Promise<PairVerdict> {
    checkOptions("experiments.judge()", options, JUDGE_KEYS);
    checkControls("experiments.judge()", controls);
    const body: Record<string, unknown> = { source, candidate, winner };
    if (options.note !== undefined) body["note"] = options.note;
    if (options.scores !== undefined) body["scores"] = options.scores;
    const path = `/experiments/${encodeURIComponent(experimentId)}/verdicts`;
    return pairVerdictFromJson(await this.client.request("POST", path, { body }, controls));
  }

  /** Every pair of the experiment into a review queue of its team, for blind A/B verdicts. */
  async sendToQueue(experimentId: string, options: SendToQueueOptions = {}, controls: RequestControls = {}): Promise<QueuedPairs> {
    checkOptions("experiments.sendToQueue()", options, SEND_KEYS);
    checkControls("experiments.sendToQueue()", controls);
    if ((options.queue === undefined) === (options.name === undefined)) {
      throw new InvalidRequestError("experiments.sendToQueue(): give either a queue's id or a new queue's name", { code: "queue" });
    }
    const body: Record<string, unknown> = options.queue !== undefined ? { queue: options.queue } : { name: options.name };
    if (options.reviewers !== undefined) body["reviewers"] = options.reviewers;
    const path = `/experiments/${encodeURIComponent(experimentId)}/queue`;
    return queuedPairsFromJson(await this.client.request("POST", path, { body }, controls));
  }
}

class StreamCut extends Error {}

/**
 * One run, consumed once: `for await (const event of run)` or `await run.result()`, not
 * both (InvalidStateError). The stream resumes by itself after a cut, from the last
 * event it delivered (`Last-Event-ID`), with nothing lost and nothing repeated; a run
 * that stops on a permission ask answered through it (a responder, or `resolveAsk`
 * while iterating) goes on with the resumed run.
 */
export class Run implements AsyncIterable<RunEvent> {
  private runId: string;
  private readonly ids: string[];
  private lastSeq: number | undefined;
  private deliveredAtLastSeq = 0;
  private skip = 0;
  private pending: PermissionAsk | undefined;
  private nextRunId: string | undefined;
  private readonly usage: Record<string, number> = {};
  private final: RunResult | undefined;
  private consumed: "iteration" | "result" | undefined;

  constructor(
    private readonly client: SectrClient,
    runId: string,
    readonly sessionId: string | undefined,
    private readonly responders: Responders,
    private readonly controls: RequestControls,
    private readonly deadline: Deadline,
    /** The run's event stream a POST opened (`session.run(prompt, { stream: true })`), read first. */
    private opened?: { response: Response; scope: Scope },
  ) {
    this.runId = runId;
    this.ids = [runId];
  }

  /** The server run followed now (a run resumed after an approval has its own id). */
  get id(): string {
    return this.runId;
  }

  get runIds(): string[] {
    return [...this.ids];
  }

  get finished(): boolean {
    return this.final !== undefined;
  }

  get pendingAsk(): PermissionAsk | undefined {
    return this.pending;
  }

  [Symbol.asyncIterator](): AsyncIterator<RunEvent> {
    this.consume("iteration");
    return this.events();
  }

  /** Wait for the end: `text`, `stopReason`, `usage`, `error`. */
  async result(): Promise<RunResult> {
    if (this.consumed === "result" && this.final) return this.final;
    if (this.consumed !== "result") this.consume("result");
    for await (const _event of this.events()) {
      // drained
    }
    return this.final!;
  }

  private consume(how: "iteration" | "result"): void {
    if (this.consumed) {
      throw new InvalidStateError(`this run was already consumed by ${this.consumed}: iterate a run or call result(), once`, {
        code: "run_consumed",
      });
    }
    this.consumed = how;
  }

  private headers(): Record<string, string> {
    return mergedHeaders(this.controls.headers, this.sessionId ? { [AFFINITY_HEADER]: this.sessionId } : undefined);
  }

  private control(controls: RequestControls): RequestControls {
    return { ...controls, headers: mergedHeaders(this.controls.headers, controls.headers) };
  }

  async cancel(controls: RequestControls = {}): Promise<RunInfo> {
    checkControls("run.cancel()", controls);
    const data = await this.client.request("POST", `/runs/${this.id}/cancel`, { sessionId: this.sessionId }, this.control(controls));
    return runInfoFromJson(data);
  }

  async steer(text: string, controls: RequestControls = {}): Promise<RunInfo> {
    checkControls("run.steer()", controls);
    const data = await this.client.request(
      "POST",
      `/runs/${this.id}/steer`,
      { body: { text }, sessionId: this.sessionId },
      this.control(controls),
    );
    return runInfoFromJson(data);
  }

  async status(controls: RequestControls = {}): Promise<RunInfo> {
    checkControls("run.status()", controls);
    const data = await this.client.request("GET", `/runs/${this.id}`, { sessionId: this.sessionId }, this.control(controls));
    return runInfoFromJson(data);
  }

  /** Decide an ask of this run (with `arguments` for an edit, `result` for a response);
   * while it is consumed, it follows the resumed run itself. */
  async resolveAsk(
    askId: string,
    verdict: Verdict | string,
    options: ResolveOptions = {},
    controls: RequestControls = {},
  ): Promise<Run> {
    checkOptions("run.resolveAsk()", options, RESOLVE_KEYS);
    checkControls("run.resolveAsk()", controls);
    const resumed = await this.client.asks.resolve(askId, verdict, options, this.control(controls));
    if (!this.finished && (!this.pending || this.pending.askId === askId)) this.nextRunId = resumed.id;
    return resumed;
  }

  private async *events(): AsyncGenerator<RunEvent> {
    let failures = 0;
    while (!this.finished) {
      if (this.deadline.expired) throw this.deadline.error(`run ${this.id}`);
      const mark = `${this.runId}:${this.lastSeq}`;
      const opened = this.opened;
      this.opened = undefined;
      const scope = opened?.scope ?? new Scope(this.controls.signal, this.deadline);
      try {
        yield* this.follow(scope, opened?.response);
      } catch (error) {
        if (error instanceof StreamUnavailable) {
          // A 503 before the stream (the database away): a cut, reconnected after Retry-After.
          failures = `${this.runId}:${this.lastSeq}` !== mark ? 1 : failures + 1;
          const wait = streamUnavailableWait(error, failures, this.client.maxReconnects, this.deadline);
          try {
            await pause(wait, scope.controller.signal);
          } catch {
            if (scope.why === "deadline" || this.deadline.expired) throw this.deadline.error(`run ${this.id}`);
            throw new RequestCancelledError(`run ${this.id}: the call was cancelled`);
          }
          continue;
        }
        if (error instanceof SectrError) throw error;
        if (scope.why === "cancelled") throw new RequestCancelledError(`run ${this.id}: the call was cancelled`);
        if (scope.why === "deadline" || this.deadline.expired) throw this.deadline.error(`run ${this.id}`);
        failures = `${this.runId}:${this.lastSeq}` !== mark ? 1 : failures + 1;
        if (failures > this.client.maxReconnects) {
          throw new TransportError(`the event stream of ${this.id} failed ${failures} times: ${String(error)}`);
        }
        const wait = Math.min(250 * 2 ** (failures - 1), 5000, this.deadline.remaining() ?? Infinity);
        await new Promise((resolve) => setTimeout(resolve, wait));
      } finally {
        scope.dispose();
      }
    }
  }

  /** One connection's events until the current server run is over. */
  private async *follow(scope: Scope, opened?: Response): AsyncGenerator<RunEvent> {
    const headers = this.headers();
    if (this.lastSeq !== undefined) {
      // One envelope may give more than one event: resume from the one before the last
      // seq seen and skip the events of that seq already delivered.
      this.skip = this.deliveredAtLastSeq;
      headers["Last-Event-ID"] = String(Math.max(this.lastSeq - 1, 0));
    }
    scope.heard(STREAM_SILENCE_MS);
    const response = opened ?? (await this.client.openStream(this.runId, headers, scope));
    const reader = response.body!.getReader();
    const decoder = new SSEDecoder();
    try {
      for (;;) {
        const { done, value } = await reader.read();
        if (done) break;
        scope.heard(STREAM_SILENCE_MS);
        for (const sse of decoder.feed(value)) {
          const step = this.accept(eventFromSse(sse));
          if (step.deliver) yield step.deliver;
          if (!step.done) continue;
          if (step.ask && step.held) {
            await this.answer(step.ask);
            if (this.afterAsk()) return;
            this.finish(step.held);
            yield step.held;
          }
          return;
        }
      }
    } finally {
      reader.cancel().catch(() => undefined);
    }
    throw new StreamCut("the stream ended before the run's result");
  }

  private accept(event: RunEvent): { deliver?: RunEvent; ask?: PermissionAsk; held?: RunEvent; done?: boolean } {
    if (event.runId !== this.runId) throw new ProtocolError(`an event of run ${event.runId} in the stream of ${this.runId}`);
    if (event.seq !== null) {
      if (this.lastSeq !== undefined && event.seq < this.lastSeq) return {};
      if (event.seq === this.lastSeq) {
        if (this.skip > 0) {
          this.skip -= 1;
          return {};
        }
        this.deliveredAtLastSeq += 1;
      } else {
        this.lastSeq = event.seq;
        this.deliveredAtLastSeq = 1;
        this.skip = 0;
      }
    }
    if (event.kind === "permission.ask") this.pending = permissionAskFromPayload(event.payload, this.runId);
    if (event.kind !== "result") return { deliver: event };
    for (const [key, value] of Object.entries((event.payload["usage"] ?? {}) as Record<string, unknown>)) {
      if (typeof value === "number") this.usage[key] = (this.usage[key] ?? 0) + value;
    }
    if (event.payload["stop"] === "awaiting_approval" && this.pending) return { ask: this.pending, held: event, done: true };
    this.finish(event);
    return { deliver: event, done: true };
  }

  private async answer(ask: PermissionAsk): Promise<void> {
    const responder = this.responders.onPermissionAsk;
    if (this.nextRunId || !responder) return;
    const answer = await responder(ask);
    if (answer == null || this.nextRunId) return;
    const { verdict, options } = answerOf(answer);
    await this.resolveAsk(ask.askId, verdict, options);
  }

  private afterAsk(): boolean {
    if (!this.nextRunId) return false;
    this.runId = this.nextRunId;
    this.ids.push(this.runId);
    this.nextRunId = undefined;
    this.pending = undefined;
    this.lastSeq = undefined;
    this.deliveredAtLastSeq = 0;
    this.skip = 0;
    return true;
  }

  private finish(event: RunEvent): void {
    const payload = event.payload;
    if (typeof payload["stop"] !== "string") throw new ProtocolError("a result event without a stop reason");
    this.final = {
      runId: this.runId,
      runIds: [...this.ids],
      text: String(payload["text"] ?? ""),
      stopReason: payload["stop"],
      usage: { ...this.usage },
      error: payload["error"] == null ? null : String(payload["error"]),
      ask: payload["stop"] === "awaiting_approval" ? (this.pending ?? null) : null,
    };
  }
}

export { Edit, Respond, SessionMode, Verdict };
