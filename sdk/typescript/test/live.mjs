// Starts a live Sectr for the tests (tests/sdk_live_server.py: Daphne and a worker on a
// scratch database, users alice/bob/mod with API tokens) and stops it afterwards.
import { spawn } from "node:child_process";
import { existsSync } from "node:fs";
import net from "node:net";
import { dirname, resolve } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";

export const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), "../../..");

function python() {
  if (process.env.SECTR_PYTHON) return process.env.SECTR_PYTHON;
  const venv = resolve(ROOT, ".venv/bin/python");
  return existsSync(venv) ? venv : "python3";
}

/** { baseUrl, tokens, stop() } once the server answers; `settings` is the server's
 * settings module (tests/sdk_live_server.py), `env` added to its environment. */
export async function startSectr({ settings, env } = {}) {
  const child = spawn(python(), ["-m", "tests.sdk_live_server", ...(settings ? [settings] : [])], {
    cwd: ROOT,
    stdio: ["pipe", "pipe", "inherit"],
    env: { ...process.env, ...env },
  });
  const lines = createInterface({ input: child.stdout });
  const info = await new Promise((resolveInfo, reject) => {
    child.once("exit", (code) => reject(new Error(`the live server exited (${code}) before it was ready`)));
    lines.once("line", (line) => resolveInfo(JSON.parse(line)));
  });
  child.removeAllListeners("exit");
  return {
    ...info,
    async stop() {
      const exited = new Promise((done) => child.once("exit", done));
      child.stdin.end();
      await exited;
    },
  };
}

/** The bytes of a `message.delta` frame's text as the server's SSE encodes it. */
function deltaMarker(text) {
  return Buffer.from(`"text":${JSON.stringify(text)}`);
}

/** Where the end of `data` that may be `marker`'s beginning starts (split across two
 * reads, so held until the next), or data.length. */
function partialMarkerAt(data, marker) {
  for (let size = Math.min(marker.length - 1, data.length); size > 0; size -= 1) {
    if (marker.subarray(0, size).equals(data.subarray(data.length - size))) return data.length - size;
  }
  return data.length;
}

/** A TCP proxy whose `cut()` drops every open connection at once (a flaky network).
 *
 * `cutAfter(texts, onCut)` cuts when the server's bytes carry the SSE frame of the delta
 * with the first text left, forwarded up to that frame's end and not one byte more: the
 * client has that event and must reconnect for the next, however far ahead of the client
 * the server is (a cut by the client as it reads an event finds the rest of the run in
 * its buffers when it lags, under load, and forces no reconnect). `onCut` runs first. */
export async function cuttingProxy(targetUrl) {
  const target = new URL(targetUrl);
  const open = new Set();
  let accepted = 0;
  let cuts = 0;
  let markers = [];
  let onCut;
  const cutAll = (graceful) => {
    cuts += 1;
    for (const { client, upstream } of [...open]) {
      if (graceful) {
        client.end(() => upstream.destroy()); // once what was written went out
      } else {
        client.resetAndDestroy?.() ?? client.destroy();
        upstream.destroy();
      }
    }
    open.clear();
  };
  const server = net.createServer((client) => {
    accepted += 1;
    const upstream = net.connect(Number(target.port), target.hostname);
    const pair = { client, upstream };
    open.add(pair);
    const drop = () => {
      open.delete(pair);
      client.destroy();
      upstream.destroy();
    };
    client.on("error", drop).on("close", drop);
    upstream.on("error", drop).on("close", drop);
    client.pipe(upstream);
    let held = Buffer.alloc(0);
    upstream.on("data", (chunk) => {
      const data = held.length ? Buffer.concat([held, chunk]) : chunk;
      held = Buffer.alloc(0);
      if (!open.has(pair)) return; // cut: not one byte more
      if (!markers.length) return void client.write(data);
      const at = data.indexOf(markers[0]);
      if (at < 0) {
        const split = partialMarkerAt(data, markers[0]);
        held = data.subarray(split);
        return void client.write(data.subarray(0, split));
      }
      const end = data.indexOf("\n\n", at);
      if (end < 0) {
        held = data.subarray(at); // the frame's end is still to come
        return void client.write(data.subarray(0, at));
      }
      markers.shift();
      onCut?.();
      client.write(data.subarray(0, end + 2));
      cutAll(true); // FIN after the data: the client reads that frame, then the stream ends
    });
  });
  await new Promise((done) => server.listen(0, "127.0.0.1", done));
  const { port } = server.address();
  return {
    url: `http://127.0.0.1:${port}`,
    get accepted() {
      return accepted;
    },
    get cuts() {
      return cuts;
    },
    cut() {
      cutAll(false);
    },
    cutAfter(texts, then) {
      markers = texts.map(deltaMarker);
      onCut = then;
    },
    close() {
      markers = [];
      this.cut();
      return new Promise((done) => server.close(done));
    },
  };
}
