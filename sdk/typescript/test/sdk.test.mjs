// @sectr/sdk against a live Sectr: the seed page's examples, with only the import and
// the client's construction changed, and the SDK's own promises.
import assert from "node:assert/strict";
import { mkdtemp, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";

import {
  AFFINITY_HEADER,
  AuthenticationError,
  DeadlineExceededError,
  Edit,
  InvalidRequestError,
  InvalidStateError,
  NotFoundError,
  PermissionDeniedError,
  PromptValidationError,
  RequestCancelledError,
  Respond,
  SectrClient,
  SectrError,
  SessionBusyError,
  SessionMode,
  Verdict,
  imagePartFromBlob,
  imagePartFromUrl,
  textPart,
} from "../dist/index.js";
import { audioPartFromPath, imagePartFromPath } from "../dist/node.js";
import { cuttingProxy, startSectr } from "./live.mjs";

const PNG = new Uint8Array([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, ...new Array(64).fill(0)]);
const WAV = new Uint8Array([...new TextEncoder().encode("RIFF$\0\0\0WAVEfmt "), ...new Array(64).fill(0)]);
const NOTE = '!tool write_note {"title": "plan", "body": "ship it"}';

let live;
let client;

before(async () => {
  live = await startSectr();
  client = new SectrClient({ baseUrl: live.baseUrl, token: live.tokens.alice });
});

after(async () => {
  await live?.stop();
});

describe("scores and ratings", () => {
  test("a moderator defines scores and rates a session with them; bad values and outsiders are refused", async () => {
    const mod = new SectrClient({ baseUrl: live.baseUrl, token: live.tokens.mod });
    const tone = await mod.scores.create("crew", "ts-tone", "categorical", { labels: ["warm", "cold"], description: "How it sounds" });
    assert.deepEqual([tone.name, tone.kind, tone.labels, tone.builtIn], ["ts-tone", "categorical", ["warm", "cold"], false]);
    const depth = await mod.scores.update("crew", "ts-tone", { labels: ["warm", "cold", "flat"] });
    assert.deepEqual(depth.labels, ["warm", "cold", "flat"]);
    const names = (await client.scores.list("crew")).map((s) => s.name);
    assert.deepEqual(names.slice(0, 2), ["thumbs", "score"]);
    assert.ok(names.includes("ts-tone"));
    await assert.rejects(client.scores.create("crew", "mine", "boolean"), PermissionDeniedError);

    const session = await mod.sessions.create({ title: "rated from TypeScript", team: "crew" });
    const rating = await session.rate({ thumbs: false, "ts-tone": "flat" }, { comment: "meh", tags: ["ts"] });
    assert.deepEqual(rating.scores, { thumbs: false, "ts-tone": "flat" });
    assert.equal(rating.messageId, null);
    await assert.rejects(session.rate({ "ts-tone": "loud" }), InvalidRequestError);
    const { ratings, scores } = await session.ratings();
    assert.deepEqual(ratings.map((r) => [r.author, r.comment, r.tags]), [["mod", "meh", ["ts"]]]);
    assert.ok(scores.some((s) => s.name === "ts-tone"));
    await mod.scores.delete("crew", "ts-tone");
    const outsider = new SectrClient({ baseUrl: live.baseUrl, token: live.tokens.bob });
    await assert.rejects(outsider.scores.list("crew"), NotFoundError);
    await assert.rejects(outsider.session(session.id).ratings(), NotFoundError);
  });
});

describe("experiments", () => {
  test("a moderator sends an experiment's pairs to a review queue; a verdict with scores is counted per candidate", async () => {
    const mod = new SectrClient({ baseUrl: live.baseUrl, token: live.tokens.mod });
    await mod.scores.create("crew", "ts-clarity", "numeric", { minimum: 1, maximum: 5 });
    const session = await mod.sessions.create({ title: "to replay from TypeScript", team: "crew" });
    await (await session.run("hello")).result();
    const created = await mod.experiments.create("crew", "ts trial", [{ agent: "default" }], { sessions: [session.id] });
    assert.equal(created.replays.length, 1);
    let experiment = created;
    for (let i = 0; i < 200 && experiment.replays.some((r) => r.state === "running"); i += 1) {
      await new Promise((done) => setTimeout(done, 100));
      experiment = await mod.experiments.get(created.id);
    }
    assert.equal(experiment.replays[0].state, "done");

    const sent = await mod.experiments.sendToQueue(created.id, { name: "ts pairs", reviewers: ["mod"] });
    assert.deepEqual([sent.queueName, sent.added, sent.items.length], ["ts pairs", 1, 1]);
    assert.deepEqual([sent.items[0].source, sent.items[0].candidate, sent.items[0].assignee, sent.items[0].done], [session.id, 0, "mod", false]);
    const again = await mod.experiments.sendToQueue(created.id, { queue: sent.queueId });
    assert.deepEqual([again.added, again.items.map((i) => i.id)], [0, [sent.items[0].id]]);
    await assert.rejects(mod.experiments.sendToQueue(created.id, { name: "ts other", reviewers: ["alice"] }), InvalidRequestError);
    await assert.rejects(mod.experiments.sendToQueue(created.id, {}), InvalidRequestError);

    await assert.rejects(
      mod.experiments.judge(created.id, session.id, 0, "candidate", { scores: { candidate: { "ts-clarity": 9 } } }),
      InvalidRequestError,
    );
    const verdict = await mod.experiments.judge(created.id, session.id, 0, "candidate", {
      note: "clearer",
      scores: { baseline: { "ts-clarity": 2 }, candidate: { "ts-clarity": 4 } },
    });
    assert.deepEqual([verdict.winner, verdict.note, verdict.scores], ["candidate", "clearer", { baseline: { "ts-clarity": 2 }, candidate: { "ts-clarity": 4 } }]);
    const [summary] = (await mod.experiments.get(created.id)).summary;
    assert.deepEqual([summary.wins, summary.losses, summary.ties], [1, 0, 0]);
    assert.deepEqual(summary.scores["ts-clarity"], { kind: "numeric", baseline: { count: 1, mean: 2 }, candidate: { count: 1, mean: 4 } });
    assert.deepEqual((await mod.experiments.list("crew")).map((e) => e.id).includes(created.id), true);

    const outsider = new SectrClient({ baseUrl: live.baseUrl, token: live.tokens.bob });
    await assert.rejects(outsider.experiments.get(created.id), NotFoundError);
    await assert.rejects(outsider.experiments.sendToQueue(created.id, { queue: sent.queueId }), NotFoundError);
    const member = new SectrClient({ baseUrl: live.baseUrl, token: live.tokens.alice });
    await assert.rejects(member.experiments.get(created.id), NotFoundError);
    await mod.scores.delete("crew", "ts-clarity");
  });
});

describe("sessions", () => {
  test("create, get, snapshot in camelCase, transcript", async () => {
    const session = await client.sessions.create({});
    const snapshot = await session.snapshot();
    assert.equal(snapshot.state, "idle");
    assert.equal(snapshot.title?.value, undefined);
    assert.equal(snapshot.resolvedModel?.providerId, "demo");
    assert.equal(snapshot.resolvedModel?.modelId, "demo");
    assert.ok(snapshot.resolvedModel.contextWindow > 0);
    assert.deepEqual(snapshot.media, { image: true, audio: true });
    assert.equal(snapshot.tokenUsage.total.inputTokens, 0);
    const again = await client.sessions.get(session.id);
    assert.equal(again.lastSnapshot.id, session.id);

    const result = await (await session.run("hello")).result();
    assert.equal(result.stopReason, "end_turn");
    assert.equal(result.text, "You said: hello");
    const transcript = await session.transcript();
    assert.deepEqual(transcript.messages.map((m) => m.role), ["user", "assistant"]);
    assert.equal(transcript.messages[0].text, "hello");
    assert.equal(transcript.complete, true);
    assert.equal((await session.snapshot()).title?.value, "hello");
  });

  test("rename, setMode, compact, clear and fork return what they say", async () => {
    const session = await client.sessions.create({ title: "Source" });
    assert.equal((await session.rename("Renamed")).title?.value, "Renamed");
    assert.equal((await session.setMode(SessionMode.Plan)).mode, "plan");
    assert.equal(await session.compact(), false);
    await (await session.run("one")).result();
    const fork = await client.sessions.fork(session.id, {
      title: "Fork",
      reasoningEffort: "high",
      providerId: "demo",
      modelId: "llama3.1",
      worktreeSelector: { repo: "app", branch: "x" },
    });
    const forked = await fork.snapshot();
    assert.equal(forked.title?.value, "Fork");
    assert.equal(forked.resolvedModel?.modelId, "llama3.1");
    assert.equal(forked.resolvedModel?.reasoningEffort, "high");
    assert.deepEqual(forked.placement, { worktreeSelector: { repo: "app", branch: "x" } });
    const cleared = await session.clear({ worktreeSelector: "wt-2" });
    assert.notEqual(cleared.id, session.id);
    assert.deepEqual(cleared.lastSnapshot.placement, { worktreeSelector: "wt-2" });
    assert.equal(cleared.lastSnapshot.mode, "plan");
    assert.equal((await session.close()).state, "completed");
    await session.delete();
    await assert.rejects(client.sessions.get(session.id), (error) => {
      assert.ok(error instanceof NotFoundError);
      assert.equal(error.code, "not_found");
      assert.equal(error.status, 404);
      return true;
    });
  });

  test("errors are typed, with code and status", async () => {
    const stranger = new SectrClient({ baseUrl: live.baseUrl, token: "nope" });
    await assert.rejects(stranger.sessions.create({}), (error) => {
      assert.ok(error instanceof AuthenticationError && error instanceof SectrError);
      assert.equal(error.status, 401);
      return true;
    });
    const session = await client.sessions.create({});
    await assert.rejects(session.retry(), (error) => error instanceof InvalidStateError && error.status === 409);
  });

  test("a typo'd option names the method and the option", async () => {
    const session = await client.sessions.create({});
    await assert.rejects(session.run("x", { onPermisionAsk: () => "deny" }), /session\.run\(\): unknown option 'onPermisionAsk'/);
    await assert.rejects(client.sessions.fork(session.id, { worktree: "x" }), /sessions\.fork\(\): unknown option 'worktree'/);
    await assert.rejects(session.snapshot({ timeout: 3 }), /session\.snapshot\(\) \(request controls\): unknown option 'timeout'/);
  });
});

describe("runs", () => {
  test("iterate the events: deltas, then the result last", async () => {
    const session = await client.sessions.create({});
    const run = await session.run("stream me");
    const kinds = [];
    let text = "";
    for await (const event of run) {
      kinds.push(event.kind);
      if (event.kind === "message.delta") text += event.text;
    }
    assert.equal(kinds[0], "session.title");
    assert.ok(kinds.includes("turn.start") && kinds.includes("turn.end"));
    assert.equal(kinds.at(-1), "result");
    assert.equal(text, "You said: stream me");
    await assert.rejects(run.result(), InvalidStateError); // consumed once
  });

  test("result() then iterating is an invalid local operation", async () => {
    const session = await client.sessions.create({});
    const run = await session.run("once");
    await run.result();
    assert.throws(() => run[Symbol.asyncIterator](), (error) => error instanceof InvalidStateError && error.code === "run_consumed");
  });

  test("a second run on the handle while one is active is SessionBusyError", async () => {
    const session = await client.sessions.create({});
    const run = await session.run("!slow 20");
    await assert.rejects(session.run("again"), SessionBusyError);
    await run.cancel();
    const result = await run.result();
    assert.equal(result.stopReason, "cancelled");
  });

  test("steer, and a steer after the end is refused", async () => {
    const session = await client.sessions.create({});
    const run = await session.run("!slow 15");
    const events = [];
    for await (const event of run) {
      events.push(event);
      if (event.kind === "turn.start" && events.filter((e) => e.kind === "turn.start").length === 1) {
        await run.steer("also this");
      }
    }
    assert.ok(events.some((event) => event.kind === "steer"));
    await assert.rejects(run.steer("late"), (error) => error instanceof InvalidStateError && error.code === "stale_run_control");
  });

  test("a responder answers the permission ask and the same Run follows the resumed run", async () => {
    const session = await client.sessions.create({});
    const asks = [];
    const run = await session.run(NOTE, {
      onPermissionAsk: (ask) => {
        asks.push(ask);
        return "allow_once";
      },
    });
    const kinds = [];
    for await (const event of run) kinds.push(event.kind);
    assert.equal(asks.length, 1);
    assert.equal(asks[0].name, "write_note");
    assert.ok(kinds.includes("permission.ask") && kinds.includes("tool.result"));
    assert.equal(kinds.filter((kind) => kind === "result").length, 1);
    assert.equal(run.runIds.length, 2);
  });

  test("resolveAsk while iterating, the seed's way", async () => {
    const session = await client.sessions.create({});
    const run = await session.run(NOTE);
    let stop;
    for await (const event of run) {
      if (event.kind === "permission.ask") await run.resolveAsk(event.payload.ask_id, "allow_once");
      if (event.kind === "result") stop = event.payload.stop;
    }
    assert.equal(stop, "end_turn");
  });

  test("without a responder the run ends awaiting approval", async () => {
    const session = await client.sessions.create({});
    const result = await (await session.run(NOTE)).result();
    assert.equal(result.stopReason, "awaiting_approval");
    assert.equal(result.ask?.name, "write_note");
  });

  test("timeoutMs is a deadline for the whole run", async () => {
    const session = await client.sessions.create({});
    const started = Date.now();
    const run = await session.run("!slow 25", {}, { timeoutMs: 1000 });
    await assert.rejects(run.result(), (error) => {
      assert.ok(error instanceof DeadlineExceededError);
      assert.equal(error.code, "deadline_exceeded");
      return true;
    });
    const elapsed = Date.now() - started;
    assert.ok(elapsed >= 900 && elapsed < 1800, `took ${elapsed} ms`);
    await run.cancel();
  });

  test("an AbortController signal stops the client's waiting", async () => {
    const session = await client.sessions.create({});
    const controller = new AbortController();
    const run = await session.run("!slow 40", {}, { signal: controller.signal });
    setTimeout(() => controller.abort(), 300);
    await assert.rejects(run.result(), RequestCancelledError);
    await run.cancel();
  });

  test("every request about the session carries the affinity header", async () => {
    const seen = [];
    const recording = new SectrClient({
      baseUrl: live.baseUrl,
      token: live.tokens.alice,
      fetch: (url, init) => {
        seen.push({ url: String(url), session: new Headers(init.headers).get(AFFINITY_HEADER) });
        return fetch(url, init);
      },
    });
    const session = await recording.sessions.create({});
    seen.length = 0;
    const run = await session.run("hi", {}, { headers: { "X-Trace": "t1" } });
    await run.result();
    await session.snapshot();
    assert.ok(seen.length >= 3);
    for (const request of seen) assert.equal(request.session, session.id, request.url);
  });
});

describe("edit and respond", () => {
  test("a responder's Edit runs the call with the edited arguments and the model is told", async () => {
    const session = await client.sessions.create({});
    const asked = [];
    const run = await session.run('!tool write_note {"title": "t", "body": "asked"}', {
      onPermissionAsk: (ask) => {
        asked.push(ask.arguments);
        return new Edit({ ...ask.arguments, body: "from TypeScript" });
      },
    });
    const results = [];
    for await (const event of run) if (event.kind === "tool.result") results.push(event);
    assert.deepEqual(asked, [{ title: "t", body: "asked" }]);
    const result = await session.transcript();
    const tool = result.messages.find((m) => m.role === "tool");
    assert.ok(tool.text.startsWith('(arguments edited by alice: {"body": "from TypeScript", "title": "t"})\n'), tool.text);
    assert.equal(results.length, 1);
    assert.equal(run.runIds.length, 2);
  });

  test("a responder's Respond answers the call instead of running it", async () => {
    const session = await client.sessions.create({});
    const result = await (
      await session.run('!tool write_note {"title": "u", "body": "b"}', { onPermissionAsk: () => new Respond("no need") })
    ).result();
    assert.equal(result.stopReason, "end_turn");
    assert.match(result.text, /\(answered by alice instead of running write_note\) no need/);
  });

  test("resolveAsk and asks.resolve take arguments and result; a bad one is a 400", async () => {
    const session = await client.sessions.create({});
    const run = await session.run('!tool write_note {"title": "v", "body": "b"}');
    let text = "";
    for await (const event of run) {
      if (event.kind === "permission.ask") {
        await assert.rejects(
          run.resolveAsk(event.payload.ask_id, Verdict.AllowOnce, { arguments: { title: "v", nope: 1 } }),
          (error) => error instanceof InvalidRequestError && error.code === "invalid_arguments",
        );
        await run.resolveAsk(event.payload.ask_id, Verdict.AllowOnce, { arguments: { title: "v", body: "resolved" } });
      }
      if (event.kind === "message.delta") text += event.text;
    }
    assert.match(text, /resolved/);
    const stopped = await (await session.run('!tool write_note {"title": "w", "body": "b"}')).result();
    assert.equal(stopped.stopReason, "awaiting_approval");
    const resumed = await client.asks.resolve(stopped.ask.askId, Verdict.Respond, { result: "done by hand" });
    assert.match((await resumed.result()).text, /done by hand/);
    await assert.rejects(run.resolveAsk("ask_x", "deny", { reason: "x" }), /run\.resolveAsk\(\): unknown option 'reason'/);
  });
});

describe("teams", () => {
  const HOOK = "https://93.184.215.14/ts-hook";

  test("a moderator adds, lists and deletes a webhook; its secret never comes back", async () => {
    const mod = new SectrClient({ baseUrl: live.baseUrl, token: live.tokens.mod });
    const hook = await mod.teams.addWebhook("crew", HOOK, { kind: "slack", secret: "ts-secret-1234" });
    assert.deepEqual([hook.url, hook.kind, hook.active], [HOOK, "slack", true]);
    assert.ok(!("secret" in hook));
    const listed = await mod.teams.webhooks("crew");
    assert.deepEqual(listed.map((h) => [h.id, h.url]), [[hook.id, HOOK]]);
    assert.ok(!JSON.stringify(listed).includes("ts-secret-1234"));
    await assert.rejects(mod.teams.addWebhook("crew", "http://127.0.0.1:9/x"), (e) => e instanceof InvalidRequestError && e.status === 400);
    await mod.teams.deleteWebhook("crew", hook.id);
    assert.deepEqual(await mod.teams.webhooks("crew"), []);
    await assert.rejects(mod.teams.addWebhook("crew", HOOK, { kinds: "slack" }), /teams\.addWebhook\(\): unknown option 'kinds'/);
  });

  test("a member is refused and an outsider is not told the team exists", async () => {
    await assert.rejects(client.teams.webhooks("crew"), PermissionDeniedError);
    const bob = new SectrClient({ baseUrl: live.baseUrl, token: live.tokens.bob });
    await assert.rejects(bob.teams.addWebhook("crew", HOOK), NotFoundError);
  });
});

describe("parts", () => {
  test("images and audio go as parts, from a Blob and from a path", async () => {
    const dir = await mkdtemp(join(tmpdir(), "sectr-sdk-"));
    await writeFile(join(dir, "cat.png"), PNG);
    await writeFile(join(dir, "hello.wav"), WAV);
    const session = await client.sessions.create({});
    const parts = [
      textPart("what is this"),
      await imagePartFromBlob(new Blob([PNG], { type: "image/png" })),
      await imagePartFromPath(join(dir, "cat.png")),
      await audioPartFromPath(join(dir, "hello.wav")),
    ];
    const events = [];
    for await (const event of await session.run(parts)) events.push(event);
    const reasoning = events.filter((e) => e.kind === "reasoning.delta").map((e) => e.text).join("");
    assert.match(reasoning, /2 images and 1 audio clip/);
    const [user] = (await session.transcript()).messages;
    assert.ok(user.parts[1].image_url.url.startsWith("sectr-media://"));
  });

  test("bad parts are refused before sending", async () => {
    const dir = await mkdtemp(join(tmpdir(), "sectr-sdk-"));
    await writeFile(join(dir, "notes.png"), "just text");
    await assert.rejects(imagePartFromPath(join(dir, "notes.png")), (e) => e instanceof PromptValidationError && e.code === "mime_type");
    await assert.rejects(imagePartFromBlob(new Blob([PNG], { type: "image/jpeg" })), (e) => e.code === "mime_type");
    assert.throws(() => imagePartFromUrl("http://example.com/a.png"), (e) => e instanceof PromptValidationError && e.code === "url");
    await assert.rejects(imagePartFromBlob(new Blob([PNG, new Uint8Array(10 * 1024 * 1024)])), (e) => e.code === "size");

    const sent = [];
    const recording = new SectrClient({
      baseUrl: live.baseUrl,
      token: live.tokens.alice,
      fetch: (url, init) => {
        sent.push(`${init.method ?? "GET"} ${new URL(String(url)).pathname}`);
        return fetch(url, init);
      },
    });
    const plain = await recording.sessions.create({ model: "llama3.1" });
    assert.equal(plain.lastSnapshot.media.image, false);
    const image = await imagePartFromBlob(new Blob([PNG]));
    await assert.rejects(plain.run([textPart("x"), image]), (e) => e instanceof PromptValidationError && e.code === "capability");
    const able = await recording.sessions.create({});
    await assert.rejects(
      able.run([{ type: "image_url", image_url: { url: "https://127.0.0.1/a.png" } }]),
      (e) => e instanceof PromptValidationError && e.code === "url",
    );
    assert.ok(!sent.some((line) => line.endsWith("/runs")), sent.join(", "));
  });
});

describe("resume", () => {
  test("a dropped connection resumes with Last-Event-ID, without a gap or a repeat", async () => {
    const proxy = await cuttingProxy(live.baseUrl);
    try {
      const flaky = new SectrClient({ baseUrl: proxy.url, token: live.tokens.alice });
      const session = await flaky.sessions.create({});
      // Cut just after the server sent each of these events, whether or not the client
      // has read it yet: each cut forces a reconnect, even when the client lags.
      proxy.cutAfter(["tick 5 ", "tick 11 ", "tick 17 "]);
      const run = await session.run("!slow 24");
      const seqs = [];
      let ticks = "";
      for await (const event of run) {
        if (event.seq !== null) seqs.push(`${event.seq}:${event.kind}`);
        if (event.kind === "message.delta") ticks += event.text;
      }
      assert.equal(proxy.cuts, 3);
      assert.ok(proxy.accepted >= 4, `only ${proxy.accepted} connections`);
      const expected = Array.from({ length: 24 }, (_, i) => `tick ${i + 1} `).join("");
      assert.ok(ticks.includes(expected), ticks);
      assert.equal(new Set(seqs).size, seqs.length, "an event came twice");
      // The journal says what the run was: the same events, in order, once each.
      const replay = [];
      for await (const event of client.runs.attach(run.id)) replay.push(event.kind);
      const delivered = [];
      for (const entry of seqs) delivered.push(entry.split(":")[1]);
      assert.deepEqual(delivered, replay.slice(0, delivered.length));
    } finally {
      await proxy.close();
    }
  });
});

describe("streams that start with the run", () => {
  const recording = () => {
    const sent = [];
    const recorder = new SectrClient({
      baseUrl: live.baseUrl,
      token: live.tokens.alice,
      fetch: (url, init) => {
        sent.push(`${init?.method ?? "GET"} ${new URL(url).pathname}`);
        return fetch(url, init);
      },
    });
    return { sent, recorder };
  };

  test("run(prompt, { stream: true }) reads the POST's answer: no second request", async () => {
    const { sent, recorder } = recording();
    const session = await recorder.sessions.create({});
    const run = await session.run("!slow 4", { stream: true });
    const events = [];
    for await (const event of run) events.push(event);
    assert.equal(events.at(-1).kind, "result");
    assert.equal(events.at(-1).payload.text, "tick 1 tick 2 tick 3 tick 4 ");
    assert.ok(events.every((event) => event.runId === run.id));
    assert.deepEqual(
      sent.filter((line) => line.includes("/runs")),
      [`POST /api/v1/sessions/${session.id}/runs`],
    );
    const replay = [];
    for await (const event of client.runs.attach(run.id)) replay.push(event);
    assert.deepEqual(events, replay);
    // A refusal is the typed error, as without stream.
    const other = await client.sessions.create({});
    await other.run("!slow 30");
    await assert.rejects(client.session(other.id).run("again", { stream: true }), SessionBusyError);
  });

  test("a POST stream cut mid-run resumes from its last event", async () => {
    const proxy = await cuttingProxy(live.baseUrl);
    try {
      const flaky = new SectrClient({ baseUrl: proxy.url, token: live.tokens.alice });
      const session = await flaky.sessions.create({});
      const run = await session.run("!slow 12", { stream: true });
      let ticks = "";
      const seqs = [];
      for await (const event of run) {
        if (event.seq !== null) seqs.push(`${event.seq}:${event.kind}`);
        if (event.kind === "message.delta") {
          ticks += event.text;
          if (event.text === "tick 4 ") proxy.cut();
        }
      }
      assert.ok(ticks.includes(Array.from({ length: 12 }, (_, i) => `tick ${i + 1} `).join("")), ticks);
      assert.equal(new Set(seqs).size, seqs.length, "an event came twice");
      assert.ok(proxy.accepted >= 2);
    } finally {
      await proxy.close();
    }
  });

  test("session.events() follows every run of the session and resumes after a seq", async () => {
    const session = await client.sessions.create({});
    const first = await (await session.run("!slow 3", { stream: true })).result();
    const events = [];
    const stream = session.events();
    let second;
    for await (const event of stream) {
      events.push(event);
      if (event.kind === "result" && !second) second = await session.run("!slow 2");
      else if (event.kind === "result") break;
    }
    const perRun = [];
    for (const runId of [first.runId, second.id]) {
      for await (const event of client.runs.attach(runId)) perRun.push(event);
    }
    assert.deepEqual(events, perRun);
    const middle = events[3].seq;
    const tail = [];
    for await (const event of session.events({ after: middle })) {
      tail.push(event);
      if (event.kind === "result" && event.runId === second.id) break;
    }
    assert.deepEqual(tail, events.filter((event) => event.seq > middle));
    await assert.rejects(
      (async () => {
        for await (const _event of client.session("ses_nope").events()) break;
      })(),
      NotFoundError,
    );
  });
});
