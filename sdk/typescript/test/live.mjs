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

/** A TCP proxy whose `cut()` drops every open connection at once (a flaky network). */
export async function cuttingProxy(targetUrl) {
  const target = new URL(targetUrl);
  const open = new Set();
  let accepted = 0;
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
    upstream.pipe(client);
  });
  await new Promise((done) => server.listen(0, "127.0.0.1", done));
  const { port } = server.address();
  return {
    url: `http://127.0.0.1:${port}`,
    get accepted() {
      return accepted;
    },
    cut() {
      for (const { client, upstream } of [...open]) {
        client.resetAndDestroy?.() ?? client.destroy();
        upstream.destroy();
      }
      open.clear();
    },
    close() {
      this.cut();
      return new Promise((done) => server.close(done));
    },
  };
}
