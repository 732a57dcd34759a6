// The SDK against a live Sectr whose live updates or database are away on demand: its
// channel layer refuses event streams' joins (tests/server/layer_faults.py, as a lost
// Redis does), and its event streams' GETs are answered `503 unavailable` with
// `Retry-After: 2` (tests/server/stream_fault_urls.py, as while PostgreSQL restarts).
// A streamed POST answered 503 posted nothing: run(prompt, { stream: true }) sends it
// again after that wait, a few times at most. A stream's GET answered 503 (its first, or a
// reconnect after a cut) is a cut too: the SDK reconnects after that wait, from the last
// event it got, and throws the 503 only after `maxReconnects` attempts in a row, or when
// the wait would outlast `timeoutMs`.
import assert from "node:assert/strict";
import { writeFileSync } from "node:fs";
import { mkdtemp, readFile, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";

import { RequestCancelledError, SectrClient, SectrError } from "../dist/index.js";
import { cuttingProxy, startSectr } from "./live.mjs";

let live;
let refused; // the file whose number is how many stream joins the server refuses next
let refusedStreams; // the file whose number is how many stream GETs the server answers 503 next
const posts = [];
let client;

before(async () => {
  const dir = await mkdtemp(join(tmpdir(), "sectr-layer-"));
  refused = join(dir, "refused-joins");
  refusedStreams = join(dir, "refused-streams");
  await writeFile(refused, "0");
  await writeFile(refusedStreams, "0");
  live = await startSectr({
    settings: "tests.server.layer_fault_settings",
    env: { SECTR_TEST_REFUSED_JOINS: refused, SECTR_TEST_REFUSED_STREAMS: refusedStreams },
  });
  client = new SectrClient({
    baseUrl: live.baseUrl,
    token: live.tokens.alice,
    fetch: (url, init) => {
      if (init?.method === "POST" && String(url).endsWith("/runs")) posts.push(Date.now());
      return fetch(url, init);
    },
  });
});

after(async () => {
  await live?.stop();
});

async function userMessages(session) {
  return (await session.transcript()).messages.filter((message) => message.role === "user").length;
}

describe("a streamed POST answered 503 unavailable", () => {
  test("is sent again after Retry-After, and the run streams once the layer is back", async () => {
    const session = await client.sessions.create({ title: "layer back" });
    await writeFile(refused, "2");
    posts.length = 0;
    const run = await session.run("!slow 3", { stream: true });
    const result = await run.result();
    assert.equal(result.text, "tick 1 tick 2 tick 3 ");
    assert.equal(await readFile(refused, "utf8"), "0");
    assert.equal(posts.length, 3);
    assert.ok(posts[1] - posts[0] >= 1900 && posts[2] - posts[1] >= 1900, `waits: ${posts}`); // Retry-After: 2
    assert.equal(await userMessages(session), 1); // the refused POSTs posted nothing
  });

  test("is thrown after a few attempts while the layer stays away, with nothing posted", async () => {
    const session = await client.sessions.create({ title: "layer away" });
    await writeFile(refused, "100");
    posts.length = 0;
    await assert.rejects(session.run("hello", { stream: true }), (error) => {
      assert.ok(error instanceof SectrError);
      assert.deepEqual([error.status, error.code], [503, "unavailable"]);
      return true;
    });
    assert.equal(posts.length, 4); // the first and three more
    // A deadline shorter than Retry-After: the 503 at once.
    posts.length = 0;
    await assert.rejects(session.run("hello", { stream: true }, { timeoutMs: 1500 }), (error) => error.status === 503);
    assert.equal(posts.length, 1);
    // Aborting the wait stops the call.
    const controller = new AbortController();
    setTimeout(() => controller.abort(), 300);
    await assert.rejects(session.run("hello", { stream: true }, { signal: controller.signal }), (error) => error.code === "cancelled");
    await writeFile(refused, "0");
    assert.equal(await userMessages(session), 0);
  });
});

const ticks = (count) => Array.from({ length: count }, (_, i) => `tick ${i + 1} `).join("");
const signature = (events) => events.map((e) => `${e.kind}:${e.runId}:${e.seq}:${e.text}`);

async function replay(runId) {
  const events = [];
  for await (const event of client.runs.attach(runId)) events.push(event);
  return events;
}

describe("a stream's GET answered 503 unavailable", () => {
  test("is a cut: the run's stream reconnects after Retry-After, from its last event", async () => {
    await writeFile(refusedStreams, "1"); // the first GET of the run's stream
    const proxy = await cuttingProxy(live.baseUrl);
    try {
      const flaky = new SectrClient({ baseUrl: proxy.url, token: live.tokens.alice });
      const session = await flaky.sessions.create({ title: "database away" });
      // A cut after tick 4, whose reconnect is answered 503 twice while the run goes on.
      proxy.cutAfter(["tick 4 "], () => writeFileSync(refusedStreams, "2"));
      const started = Date.now();
      const run = await session.run("!slow 40");
      const events = [];
      for await (const event of run) events.push(event);
      const waited = Date.now() - started;
      assert.equal(proxy.cuts, 1);
      assert.equal(await readFile(refusedStreams, "utf8"), "0"); // three 503s, each followed by a reconnect
      assert.ok(waited >= 3 * 2000 - 100, `waited ${waited} ms`); // Retry-After: 2, three times
      const seqs = events.map((e) => e.seq);
      assert.deepEqual(seqs, [...new Set(seqs)].sort((a, b) => a - b), "no event twice");
      const text = events.filter((e) => e.kind === "message.delta").map((e) => e.text).join("");
      assert.equal(text, ticks(40), "no event lost");
      assert.equal(events.at(-1).kind, "result");
      assert.deepEqual(signature(events), signature(await replay(run.id)));
    } finally {
      await proxy.close();
    }
  });

  test("is a cut: a session's stream reconnects after Retry-After, from its last event", async () => {
    const proxy = await cuttingProxy(live.baseUrl);
    try {
      const flaky = new SectrClient({ baseUrl: proxy.url, token: live.tokens.alice });
      const session = await flaky.sessions.create({ title: "database away, session" });
      const run = await session.run("!slow 12");
      await writeFile(refusedStreams, "1"); // the first GET of the session's stream
      proxy.cutAfter(["tick 5 "], () => writeFileSync(refusedStreams, "1"));
      const found = [];
      for await (const event of session.events()) {
        found.push(event);
        if (event.kind === "result") break;
      }
      assert.equal(proxy.cuts, 1);
      assert.equal(await readFile(refusedStreams, "utf8"), "0");
      assert.deepEqual(signature(found), signature(await replay(run.id)), "every event once, in order");
    } finally {
      await proxy.close();
    }
  });

  test("is thrown after maxReconnects attempts in a row, at once past the deadline", async () => {
    const patient = new SectrClient({ baseUrl: live.baseUrl, token: live.tokens.alice, maxReconnects: 2 });
    const session = await patient.sessions.create({ title: "database away for longer" });
    const run = await session.run("hello");
    await writeFile(refusedStreams, "100");
    const unavailable = (error) => {
      assert.ok(error instanceof SectrError);
      assert.deepEqual([error.status, error.code], [503, "unavailable"]);
      return true;
    };
    await assert.rejects(patient.runs.attach(run.id).result(), unavailable);
    assert.equal(await readFile(refusedStreams, "utf8"), "97"); // the first GET and maxReconnects more
    await assert.rejects(session.events().next(), unavailable);
    assert.equal(await readFile(refusedStreams, "utf8"), "94");
    // A deadline shorter than Retry-After: the 503 at once, not a wait past it.
    await assert.rejects(patient.runs.attach(run.id, {}, { timeoutMs: 1500 }).result(), unavailable);
    assert.equal(await readFile(refusedStreams, "utf8"), "93");
    // Aborting the wait stops the call.
    const controller = new AbortController();
    setTimeout(() => controller.abort(), 300);
    const started = Date.now();
    await assert.rejects(
      patient.runs.attach(run.id, {}, { signal: controller.signal }).result(),
      (error) => error instanceof RequestCancelledError,
    );
    assert.ok(Date.now() - started < 1500);
    await writeFile(refusedStreams, "0");
    assert.equal((await patient.runs.attach(run.id).result()).stopReason, "end_turn");
  });
});
