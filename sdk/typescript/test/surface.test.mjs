// The TypeScript SDK against the contract both SDKs share (sdk/surface.json, in
// snake_case; camelCase here). No server: calls go to a fetch that refuses everything,
// so an option the SDK does not know shows as its TypeError, a known one as the fetch's.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";

import * as sdk from "../dist/index.js";
import { permissionAskFromPayload, snapshotFromJson } from "../dist/models.js";
import * as node from "../dist/node.js";

const surface = JSON.parse(readFileSync(new URL("../../surface.json", import.meta.url), "utf8"));
const camel = (name) => name.replace(/_([a-z])/g, (_, ch) => ch.toUpperCase());

class Refused extends Error {}
const client = new sdk.SectrClient({
  baseUrl: "http://127.0.0.1:9",
  fetch: () => Promise.reject(new Refused("no network in this test")),
});
const session = new sdk.Session(client, "ses_x", undefined);
const run = client.runs.attach("run_x", { sessionId: "ses_x" });

// How each method is called: its receiver and the arguments before its options.
const CALLS = {
  "Sessions.create": [client.sessions, []],
  "Sessions.get": [client.sessions, ["ses_x"]],
  "Sessions.list": [client.sessions, []],
  "Sessions.fork": [client.sessions, ["ses_x"]],
  "Session.snapshot": [session, []],
  "Session.transcript": [session, []],
  "Session.rename": [session, ["t"]],
  "Session.set_mode": [session, [sdk.SessionMode.Plan]],
  "Session.set_model": [session, ["demo"]],
  "Session.compact": [session, []],
  "Session.clear": [session, []],
  "Session.fork": [session, []],
  "Session.close": [session, []],
  "Session.delete": [session, []],
  "Session.run": [session, ["hi"]],
  "Session.retry": [session, []],
  "Session.events": [session, []],
  "Run.result": [run, []],
  "Run.cancel": [run, []],
  "Run.steer": [run, ["t"]],
  "Run.status": [run, []],
  "Run.resolve_ask": [run, ["ask_x", sdk.Verdict.AllowOnce]],
  "Runs.get": [client.runs, ["run_x"]],
  "Runs.attach": [client.runs, ["run_x"]],
  "Asks.decide": [client.asks, ["ask_x", "deny"]],
  "Asks.resolve": [client.asks, ["ask_x", "deny"]],
  "Teams.webhooks": [client.teams, ["crew"]],
  "Teams.add_webhook": [client.teams, ["crew", "https://hooks.example/x"]],
  "Teams.delete_webhook": [client.teams, ["crew", 1]],
  "Session.rate": [session, [{ thumbs: true }]],
  "Session.ratings": [session, []],
  "Scores.list": [client.scores, ["crew"]],
  "Scores.create": [client.scores, ["crew", "tone", "boolean"]],
  "Scores.update": [client.scores, ["crew", "tone"]],
  "Scores.delete": [client.scores, ["crew", "tone"]],
  "Experiments.list": [client.experiments, ["crew"]],
  "Experiments.get": [client.experiments, ["exp_x"]],
  "Experiments.create": [client.experiments, ["crew", "trial", [{ agent: "crew/helper" }]]],
  "Experiments.judge": [client.experiments, ["exp_x", "ses_x", 0, "tie"]],
  "Experiments.send_to_queue": [client.experiments, ["exp_x"]],
};

for (const [cls, methods] of Object.entries(surface.methods)) {
  for (const [method, options] of Object.entries(methods)) {
    const key = `${cls}.${method}`;
    test(`${key} is ${camel(method)}, with its options`, async () => {
      assert.ok(sdk[cls], `${cls} is not exported`);
      assert.equal(typeof sdk[cls].prototype[camel(method)], "function", `${cls}.${camel(method)} is missing`);
      const [receiver, leading] = CALLS[key] ?? assert.fail(`no call recipe for ${key}`);
      if (options.length === 0) return;
      const call = (opts) => {
        try {
          return Promise.resolve(receiver[camel(method)](...leading, opts, {}));
        } catch (error) {
          return Promise.reject(error);
        }
      };
      const known = Object.fromEntries(options.map((name) => [camel(name), undefined]));
      const outcome = await call(known).then(
        () => "ok",
        (error) => error,
      );
      assert.ok(!(outcome instanceof TypeError), `${key}: ${outcome?.message}`);
      await assert.rejects(call({ notAnOption: 1 }), (error) => error instanceof TypeError && /unknown option 'notAnOption'/.test(error.message));
    });
  }
}

test("the request controls and the affinity header are the listed ones", () => {
  assert.deepEqual([...sdk.CONTROL_KEYS], surface.request_controls.typescript);
  assert.equal(sdk.AFFINITY_HEADER, surface.affinity_header);
});

test("the event kinds are the listed ones", () => {
  assert.deepEqual([...sdk.EVENT_KINDS], surface.event_kinds);
});

test("the error classes carry the listed codes", () => {
  for (const [name, code] of Object.entries(surface.errors)) {
    const tsName = surface.error_names[name]?.typescript ?? name;
    const ErrorClass = sdk[tsName];
    assert.ok(ErrorClass, `${tsName} is not exported`);
    const error = new ErrorClass("x");
    assert.ok(error instanceof sdk.SectrError, tsName);
    assert.equal(error.code, code, tsName);
  }
});

test("the snapshot has the listed fields", () => {
  const usage = { input_tokens: 1, output_tokens: 2, reasoning_tokens: 0, cached_input_tokens: 0 };
  const snapshot = snapshotFromJson({
    id: "ses_x",
    state: "idle",
    mode: "default",
    title: "T",
    resolved_model: { provider_id: "demo", model_id: "demo", context_window: 8192, reasoning_effort: null },
    limits: { max_turns: 50 },
    turns: 0,
    tool_calls: 0,
    token_usage: { total: usage, by_model: { demo: usage } },
    media: { image: true, audio: false },
    placement: { worktree_selector: { some_key: 1 } },
    pending_ask: null,
    created_at: null,
    updated_at: null,
    owner: "alice",
    team: null,
    last_seq: 3,
  });
  for (const field of surface.snapshot_fields) assert.ok(camel(field) in snapshot, field);
  assert.equal(snapshot.title.value, "T");
  assert.equal(snapshot.tokenUsage.byModel.demo.outputTokens, 2);
  assert.deepEqual(snapshot.placement, { worktreeSelector: { some_key: 1 } }); // the selector stays as given
});

test("a permission ask has the listed fields", () => {
  const payload = { ask_id: "ask_1", name: "deploy", arguments: {}, tool_call_id: "c1", may_have_run: true };
  const ask = permissionAskFromPayload(payload, "run_1");
  assert.deepEqual(Object.keys(ask).sort(), surface.ask_fields.map(camel).sort());
  assert.equal(ask.mayHaveRun, true);
  assert.equal(permissionAskFromPayload({ ask_id: "ask_1", name: "deploy" }, "run_1").mayHaveRun, false);
});

test("the part helpers exist", () => {
  for (const name of [...surface.parts.common, ...surface.parts.typescript_only]) {
    assert.equal(typeof sdk[camel(name)], "function", name);
  }
  for (const name of surface.parts.paths) assert.equal(typeof node[camel(name)], "function", name);
});
