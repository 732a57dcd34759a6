"""Hostile input against a real server: every request below is answered 4xx with the right
error code, and nothing is written (the server's own database is counted before and
after each: envelopes, sessions, runs, media blobs and links, tokens, media files).

No request leaves this machine: the URL rules refuse before any fetch (Sectr never
fetches media URLs), and no case needs DNS beyond numeric forms and /etc/hosts.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.server.api.test_api_support import LiveApi, live_api, row_counts

pytestmark = pytest.mark.slow

MIB = 1024 * 1024
PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 64
JPEG = b"\xff\xd8\xff\xe0" + b"\x00" * 64
WAV = b"RIFF\x24\x00\x00\x00WAVEfmt " + b"\x00" * 64


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def image(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


def data_url(mime: str, data: bytes) -> str:
    return f"data:{mime};base64,{b64(data)}"


def audio(data: bytes, fmt: str = "wav") -> dict[str, Any]:
    return {"type": "input_audio", "input_audio": {"data": b64(data), "format": fmt}}


def parts(*items: dict[str, Any]) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": "look"}, *items]}


@dataclass(frozen=True)
class Case:
    name: str
    method: str
    path: str  # {S}: alice's session (demo model), {L}: one on a model without media, {R}: a finished run
    status: int
    code: str
    json: Any = None
    raw: bytes | None = None
    headers: dict[str, str] = field(default_factory=dict)


RUNS = "/sessions/{S}/runs"

CASES = [
    # -- malformed bodies --
    Case("truncated JSON", "POST", "/sessions", 400, "malformed_json", raw=b'{"title": '),
    Case("not JSON", "POST", "/sessions", 400, "malformed_json", raw=b"hello"),
    Case("JSON array body", "POST", "/sessions", 400, "invalid_body", raw=b"[]"),
    Case("JSON string body", "POST", "/sessions", 400, "invalid_body", raw=b'"title"'),
    Case("NaN", "POST", "/sessions", 400, "malformed_json", raw=b'{"limits": {"max_turns": NaN}}'),
    Case("Infinity", "POST", "/sessions", 400, "malformed_json", raw=b'{"limits": {"max_turns": Infinity}}'),
    Case("invalid UTF-8", "POST", "/sessions", 400, "malformed_json", raw=b'{"title": "\xff\xfe"}'),
    Case("nested 100k deep", "POST", "/sessions", 400, "malformed_json", raw=b"[" * 100_000),
    Case("lone surrogate", "POST", "/sessions", 400, "invalid_unicode", raw=b'{"title": "\\ud800"}'),
    Case("NUL character", "POST", "/sessions", 400, "invalid_unicode", raw=b'{"title": "a\\u0000b"}'),
    Case("NUL in a key", "POST", "/sessions", 400, "invalid_unicode", raw=b'{"ti\\u0000tle": "a"}'),
    Case("trailing garbage", "POST", "/sessions", 400, "malformed_json", raw=b'{"title": "a"} {"title": "b"}'),
    Case("body over 256 KiB", "POST", "/sessions", 413, "too_large", json={"title": "x" * 300_000}),
    Case("run body over 32 MiB", "POST", RUNS, 413, "too_large", json={"content": "x" * (33 * MIB)}),
    # -- wrong types and values --
    Case("title is a number", "POST", "/sessions", 400, "invalid_title", json={"title": 5}),
    Case("title is empty", "POST", "/sessions", 400, "invalid_title", json={"title": ""}),
    Case("title is blank", "POST", "/sessions", 400, "invalid_title", json={"title": " \t\n "}),
    Case("title of 121 characters", "POST", "/sessions", 400, "invalid_title", json={"title": "t" * 121}),
    Case("title of 121 emoji", "POST", "/sessions", 400, "invalid_title", json={"title": "\U0001f600" * 121}),
    Case("title of 100k characters", "POST", "/sessions", 400, "invalid_title", json={"title": "y" * 100_000}),
    Case("unknown mode", "POST", "/sessions", 400, "invalid_mode", json={"mode": "yolo"}),
    Case("mode is a list", "POST", "/sessions", 400, "invalid_mode", json={"mode": ["plan"]}),
    Case("SQL-ish mode", "POST", "/sessions/{S}/mode", 400, "invalid_mode", json={"mode": "plan'; DROP TABLE x;--"}),
    Case("empty model", "POST", "/sessions", 400, "invalid_model", json={"model": ""}),
    Case("model of 300 characters", "POST", "/sessions", 400, "invalid_model", json={"model": "m" * 300}),
    Case("limits is a string", "POST", "/sessions", 400, "invalid_limits", json={"limits": "many"}),
    Case("negative limit", "POST", "/sessions", 400, "invalid_limits", json={"limits": {"max_turns": -1}}),
    Case("boolean limit", "POST", "/sessions", 400, "invalid_limits", json={"limits": {"max_turns": True}}),
    Case("unknown limit", "POST", "/sessions", 400, "invalid_limits", json={"limits": {"max_fun": 1}}),
    Case(
        "unknown reasoning effort",
        "POST",
        "/sessions",
        400,
        "invalid_reasoning_effort",
        json={"reasoning_effort": "max"},
    ),
    Case("unknown field", "POST", "/sessions", 400, "invalid_body", json={"title": "ok", "owner": "bob"}),
    Case("rename to null", "POST", "/sessions/{S}/rename", 400, "invalid_title", json={"title": None}),
    Case("fork at seq 0", "POST", "/sessions/{S}/fork", 400, "invalid_seq", json={"at_seq": 0}),
    Case("fork past the end", "POST", "/sessions/{S}/fork", 400, "invalid_seq", json={"at_seq": 10**9}),
    Case("fork at a string seq", "POST", "/sessions/{S}/fork", 400, "invalid_at_seq", json={"at_seq": "3"}),
    Case("fork at seq true", "POST", "/sessions/{S}/fork", 400, "invalid_at_seq", json={"at_seq": True}),
    Case("fork at seq 1e400", "POST", "/sessions/{S}/fork", 400, "invalid_at_seq", raw=b'{"at_seq": 1e400}'),
    Case("a body where none is taken", "POST", "/sessions/{S}/close", 400, "invalid_body", json={"force": True}),
    Case("verdict for no ask", "POST", "/asks/ask_0000", 404, "not_found", json={"verdict": "allow_once"}),
    # -- prompts --
    Case("no content", "POST", RUNS, 400, "invalid_content", json={}),
    Case("content is a number", "POST", RUNS, 400, "invalid_content", json={"content": 42}),
    Case("empty content", "POST", RUNS, 400, "prompt", json={"content": ""}),
    Case("blank content", "POST", RUNS, 400, "prompt", json={"content": "   \n"}),
    Case("content over 200k characters", "POST", RUNS, 400, "prompt", json={"content": "w" * 200_001}),
    Case("empty part list", "POST", RUNS, 400, "prompt", json={"content": []}),
    Case("a part that is a number", "POST", RUNS, 400, "prompt", json={"content": [1]}),
    Case("unknown part type", "POST", RUNS, 400, "prompt", json={"content": [{"type": "video", "url": "x"}]}),
    Case("text part without text", "POST", RUNS, 400, "prompt", json={"content": [{"type": "text", "text": 5}]}),
    Case("queue is a string", "POST", RUNS, 400, "invalid_queue", json={"content": "hi", "queue": "yes"}),
    Case("17 parts", "POST", RUNS, 400, "prompt", json={"content": [{"type": "text", "text": "p"}] * 17}),
    # -- media parts --
    Case("png declared, jpeg bytes", "POST", RUNS, 400, "mime_type", json=parts(image(data_url("image/png", JPEG)))),
    Case("html declared", "POST", RUNS, 400, "mime_type", json=parts(image(data_url("text/html", b"<script>")))),
    Case("svg declared", "POST", RUNS, 400, "mime_type", json=parts(image(data_url("image/svg+xml", b"<svg/>")))),
    Case(
        "image bytes not base64", "POST", RUNS, 400, "prompt", json=parts(image("data:image/png;base64,!!!notbase64"))
    ),
    Case("data URL not base64", "POST", RUNS, 400, "prompt", json=parts(image("data:image/png,rawbytes"))),
    Case(
        "bad image detail",
        "POST",
        RUNS,
        400,
        "prompt",
        json=parts({"type": "image_url", "image_url": {"url": data_url("image/png", PNG), "detail": "ultra"}}),
    ),
    Case("image part without url", "POST", RUNS, 400, "prompt", json=parts({"type": "image_url", "image_url": {}})),
    Case(
        "image over 10 MiB",
        "POST",
        RUNS,
        400,
        "size",
        json=parts(image(data_url("image/png", PNG + b"\x00" * (10 * MIB)))),
    ),
    Case(
        "three 7 MiB images",
        "POST",
        RUNS,
        400,
        "size",
        json=parts(*[image(data_url("image/png", PNG + bytes([i]) * (7 * MIB))) for i in range(3)]),
    ),
    Case("audio format aac", "POST", RUNS, 400, "mime_type", json=parts(audio(WAV, "aac"))),
    Case("wav declared, png bytes", "POST", RUNS, 400, "mime_type", json=parts(audio(PNG, "wav"))),
    Case(
        "audio by URL",
        "POST",
        RUNS,
        400,
        "url",
        json=parts({"type": "input_audio", "input_audio": {"url": "https://93.184.215.14/a.wav", "format": "wav"}}),
    ),
    Case("http URL", "POST", RUNS, 400, "url", json=parts(image("http://example.com/cat.png"))),
    Case("ftp URL", "POST", RUNS, 400, "url", json=parts(image("ftp://example.com/cat.png"))),
    Case("javascript URL", "POST", RUNS, 400, "url", json=parts(image("javascript:alert(1)"))),
    Case("file URL", "POST", RUNS, 400, "url", json=parts(image("file:///etc/passwd"))),
    Case("sectr-media reference", "POST", RUNS, 400, "url", json=parts(image("sectr-media://" + "0" * 64))),
    Case("loopback", "POST", RUNS, 400, "url", json=parts(image("https://127.0.0.1/cat.png"))),
    Case("loopback, short form", "POST", RUNS, 400, "url", json=parts(image("https://127.1/cat.png"))),
    Case("loopback as an integer", "POST", RUNS, 400, "url", json=parts(image("https://2130706433/cat.png"))),
    Case("metadata service", "POST", RUNS, 400, "url", json=parts(image("https://169.254.169.254/latest/meta-data/"))),
    Case("metadata host name", "POST", RUNS, 400, "url", json=parts(image("https://metadata.google.internal/x.png"))),
    Case("private 10/8", "POST", RUNS, 400, "url", json=parts(image("https://10.0.0.1/cat.png"))),
    Case("private 192.168/16", "POST", RUNS, 400, "url", json=parts(image("https://192.168.1.1/cat.png"))),
    Case("shared 100.64/10", "POST", RUNS, 400, "url", json=parts(image("https://100.100.100.200/cat.png"))),
    Case("unspecified", "POST", RUNS, 400, "url", json=parts(image("https://0.0.0.0/cat.png"))),
    Case("IPv6 loopback", "POST", RUNS, 400, "url", json=parts(image("https://[::1]/cat.png"))),
    Case(
        "IPv4-mapped IPv6 loopback", "POST", RUNS, 400, "url", json=parts(image("https://[::ffff:127.0.0.1]/cat.png"))
    ),
    Case("IPv6 link-local", "POST", RUNS, 400, "url", json=parts(image("https://[fe80::1]/cat.png"))),
    Case("localhost", "POST", RUNS, 400, "url", json=parts(image("https://localhost/cat.png"))),
    Case("localhost with a port", "POST", RUNS, 400, "url", json=parts(image("https://localhost:8443/cat.png"))),
    Case("credentials in URL", "POST", RUNS, 400, "url", json=parts(image("https://user:pw@93.184.215.14/cat.png"))),
    Case("URL with spaces", "POST", RUNS, 400, "url", json=parts(image("https://exa mple.com/cat.png"))),
    Case("bad port", "POST", RUNS, 400, "url", json=parts(image("https://93.184.215.14:99999/cat.png"))),
    Case(
        "image for a model without images",
        "POST",
        "/sessions/{L}/runs",
        400,
        "capability",
        json=parts(image(data_url("image/png", PNG))),
    ),
    Case("audio for a model without audio", "POST", "/sessions/{L}/runs", 400, "capability", json=parts(audio(WAV))),
    # -- ids, paths and query strings --
    Case("session id of 200 characters", "GET", "/sessions/" + "s" * 200, 404, "not_found"),
    Case("SQL-ish session id", "GET", "/sessions/ses_x'%20OR%20'1'='1", 404, "not_found"),
    Case("unicode session id", "GET", "/sessions/ses_%E2%98%83", 404, "not_found"),
    Case("NUL in a session id", "GET", "/sessions/ses_%00", 400, "invalid_unicode"),
    Case("NUL in a team name", "GET", "/teams/t%00/rules", 400, "invalid_unicode"),
    Case("NUL in a query parameter", "GET", "/asks?tool=a%00", 400, "invalid_unicode"),
    Case("unknown run", "GET", "/runs/run_doesnotexist", 404, "not_found"),
    Case("SQL-ish run id", "POST", "/runs/1;DELETE%20FROM%20runs/cancel", 404, "not_found"),
    Case("SQL-ish ask id", "POST", "/asks/ask_'%20OR%201=1", 404, "not_found", json={"verdict": "allow_once"}),
    Case("limit 0", "GET", "/sessions?limit=0", 400, "invalid_limit"),
    Case("limit not a number", "GET", "/sessions?limit=abc", 400, "invalid_limit"),
    Case("negative offset", "GET", "/sessions?offset=-1", 400, "invalid_offset"),
    Case("after not a number", "GET", "/runs/{R}/events?after=abc", 400, "invalid_after"),
    Case("negative Last-Event-ID", "GET", "/runs/{R}/events", 400, "invalid_after", headers={"Last-Event-ID": "-5"}),
    # -- state --
    Case("steer a finished run", "POST", "/runs/{R}/steer", 409, "stale_run_control", json={"text": "late"}),
    Case("cancel a finished run", "POST", "/runs/{R}/cancel", 409, "stale_run_control"),
    Case("steer without text", "POST", "/runs/{R}/steer", 400, "invalid_text", json={}),
    Case("retry with nothing failed", "POST", "/sessions/{S}/retry", 409, "failed_step_retry_ineligible"),
    Case("another user's session", "GET", "/sessions/{S}/transcript", 404, "not_found", headers={"X-As": "bob"}),
]


@dataclass
class Target:
    api: LiveApi
    ids: dict[str, str]


@pytest.fixture(scope="module")
def target() -> Iterator[Target]:
    with live_api() as api:
        http = api.http()
        session = http.post("/sessions", json={"title": "target"}).json()["id"]
        plain = http.post("/sessions", json={"title": "text only", "model": "llama3.1"}).json()["id"]
        run = http.post(f"/sessions/{session}/runs", json={"content": "hello"}).json()["run_id"]
        with http.stream("GET", f"/runs/{run}/events") as response:
            for _ in response.iter_lines():
                pass
        yield Target(api, {"S": session, "L": plain, "R": run})


def test_there_are_at_least_fifty_hostile_cases() -> None:
    assert len(CASES) >= 50
    assert len({case.name for case in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_hostile_input_is_refused_and_writes_nothing(target: Target, case: Case) -> None:
    headers = dict(case.headers)
    user = headers.pop("X-As", "alice")
    path = case.path.format(**target.ids)
    before = row_counts(target.api.live)
    kwargs: dict[str, Any] = {"headers": headers}
    if case.raw is not None:
        kwargs["content"] = case.raw
        kwargs["headers"] = {"Content-Type": "application/json", **headers}
    elif case.json is not None:
        kwargs["json"] = case.json
    response = target.api.http(user).request(case.method, path, **kwargs)
    assert response.status_code == case.status, response.text[:500]
    error = response.json()["error"]
    assert error["code"] == case.code, error
    assert isinstance(error["message"], str) and error["message"]
    assert row_counts(target.api.live) == before, "a refused request wrote something"
