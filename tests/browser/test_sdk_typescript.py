"""@sectr/sdk in Chromium: the built ESM (sdk/typescript/dist, no bundler) loaded into a
page on the server's own origin runs a session, including an image from a Blob
(`imagePartFromBlob`), a stream of events, a fork with a worktree selector, and a part
refused before sending."""

from __future__ import annotations

import json
import mimetypes
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import BrowserContext, Route

from tests.liveserver import ROOT, LiveSectr

SDK = ROOT / "sdk" / "typescript"

PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>sdk</title></head>
<body>
<script type="module">
import { SectrClient, SessionMode, PromptValidationError, imagePartFromBlob, imagePartFromUrl, textPart }
  from "/_sdk/dist/index.js";

const PNG = new Uint8Array([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, ...new Array(64).fill(0)]);

async function scenario() {
  const client = new SectrClient({ baseUrl: location.origin, token: TOKEN });
  const session = await client.sessions.create({});
  const snapshot = await session.snapshot();
  const image = await imagePartFromBlob(new Blob([PNG], { type: "image/png" }));
  const run = await session.run([textPart("what is in the picture"), image]);
  const kinds = [];
  let reasoning = "";
  let text = "";
  for await (const event of run) {
    kinds.push(event.kind);
    if (event.kind === "reasoning.delta") reasoning += event.text;
    if (event.kind === "message.delta") text += event.text;
  }
  const transcript = await session.transcript();
  let refused = null;
  try {
    imagePartFromUrl("http://example.com/cat.png");
  } catch (error) {
    refused = error instanceof PromptValidationError ? error.code : String(error);
  }
  const mode = (await session.setMode(SessionMode.Plan)).mode;
  const fork = await session.fork({ worktreeSelector: "wt-browser" });
  const forked = await fork.snapshot();
  return {
    state: snapshot.state,
    provider: snapshot.resolvedModel?.providerId,
    kinds, reasoning, text,
    imageStored: transcript.messages[0].parts[1].image_url.url.startsWith("sectr-media://"),
    title: (await session.snapshot()).title?.value,
    refused, mode,
    selector: forked.placement?.worktreeSelector,
  };
}

scenario().then(
  (value) => { window.__sdkResult = value; },
  (error) => { window.__sdkResult = { error: `${error.name}: ${error.message}` }; },
);
</script>
</body></html>
"""


def build_sdk() -> None:
    npm = shutil.which("npm")
    assert npm, "npm is missing: run `bash scripts/ensure_node.sh`"
    if not (SDK / "node_modules" / "typescript").exists():
        subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=SDK, check=True, capture_output=True, timeout=300)
    subprocess.run([npm, "run", "build"], cwd=SDK, check=True, capture_output=True, timeout=300)


@pytest.fixture(scope="module")
def built() -> Path:
    build_sdk()
    return SDK / "dist"


@pytest.fixture
def sdk_context(context: BrowserContext, live: LiveSectr, built: Path) -> Iterator[BrowserContext]:
    token = live.token_for("alice")

    def serve(route: Route) -> None:
        path = route.request.url.split("/_sdk/", 1)[1].split("?", 1)[0]
        if path == "page.html":
            route.fulfill(status=200, content_type="text/html", body=PAGE.replace("TOKEN", json.dumps(token)))
            return
        file = (SDK / path).resolve()
        if not file.is_relative_to(built) or not file.is_file():
            route.fulfill(status=404, body="not here")
            return
        content_type = "text/javascript" if file.suffix == ".js" else mimetypes.guess_type(file.name)[0]
        route.fulfill(status=200, content_type=content_type or "application/octet-stream", body=file.read_bytes())

    # The page and the SDK's files are served on the API's own origin, as an application
    # that bundles the SDK would be.
    context.route(f"{live.base_url}/_sdk/**", serve)
    yield context


@pytest.mark.timeout(300)  # the build (npm ci on a fresh machine, tsc) comes first
def test_the_built_sdk_runs_a_session_in_chromium(sdk_context: BrowserContext, live: LiveSectr) -> None:
    page = sdk_context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(f"{live.base_url}/_sdk/page.html")
    page.wait_for_function("window.__sdkResult !== undefined", timeout=30_000)
    result: dict[str, Any] = page.evaluate("window.__sdkResult")
    assert "error" not in result, result
    assert errors == []
    assert result["state"] == "idle" and result["provider"] == "demo"
    assert result["kinds"][-1] == "result" and "turn.start" in result["kinds"]
    assert "1 image" in result["reasoning"]
    assert result["text"] == "You said: what is in the picture"
    assert result["imageStored"] is True
    assert result["title"] == "what is in the picture"
    assert result["refused"] == "url"
    assert result["mode"] == "plan"
    assert result["selector"] == "wt-browser"
