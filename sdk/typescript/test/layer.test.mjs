// run(prompt, { stream: true }) while live updates are unavailable, against a live Sectr
// whose channel layer refuses event streams' joins on demand (tests/server/layer_faults.py,
// as a lost Redis does): the server answers `503 unavailable` with `Retry-After: 2` and
// posts nothing; the SDK sends the POST again after that wait, a few times at most.
import assert from "node:assert/strict";
import { mkdtemp, readFile, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";

import { SectrClient, SectrError } from "../dist/index.js";
import { startSectr } from "./live.mjs";

let live;
let refused; // the file whose number is how many stream joins the server refuses next
const posts = [];
let client;

before(async () => {
  refused = join(await mkdtemp(join(tmpdir(), "sectr-layer-")), "refused-joins");
  await writeFile(refused, "0");
  live = await startSectr({
    settings: "tests.server.layer_fault_settings",
    env: { SECTR_TEST_REFUSED_JOINS: refused },
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
