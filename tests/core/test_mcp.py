"""MCP tool servers as Sectr tools (`sectr.mcp`), against servers nobody on the project
wrote: `mcp-server-time` and `mcp-server-git` from PyPI (Python, the stateless protocol
revision, stdio) and `@modelcontextprotocol/server-everything` from npm (TypeScript, the
session-based revision, stdio and Streamable HTTP; scripts/ensure_mcp_test_servers.sh installs it)."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from sectr import LocalRuntime
from sectr.agents import DEFAULT_AGENT, AgentSpec
from sectr.events import EventType
from sectr.mcp import (
    McpPool,
    McpServer,
    McpToolError,
    MemoryMediaStore,
    ServerConfig,
    cap,
    result_output,
    server_configs_from_json,
    tool_name,
)
from sectr.payloads import InvalidEvent, check_event
from sectr.tools import SchemaTool, ToolRegistry

from .conftest import ScriptedProvider, call, of_type, say

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
EVERYTHING = ROOT / "var" / "mcp-npm" / "node_modules" / ".bin" / "mcp-server-everything"


def _bin(name: str) -> str:
    path = BIN / name
    assert path.exists(), f"{name} is not installed: run scripts/setup.sh (requirements.txt pins it)"
    return str(path)


def _everything() -> str:
    assert EVERYTHING.exists(), "server-everything is not installed: run scripts/ensure_mcp_test_servers.sh"
    return str(EVERYTHING)


@pytest.fixture
async def time_server() -> AsyncIterator[McpServer]:
    async with McpServer(ServerConfig(name="time", command=_bin("mcp-server-time"), timeout_s=20)) as server:
        yield server


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    path = tmp_path / "repo"
    path.mkdir()
    git = ["git", "-C", str(path), "-c", "user.name=t", "-c", "user.email=t@example.org"]
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    (path / "a.txt").write_text("one\n")
    subprocess.run([*git, "add", "a.txt"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "first"], check=True)
    (path / "b.txt").write_text("two\n")
    subprocess.run([*git, "add", "b.txt"], check=True)  # staged, for the model's commit
    return path


@pytest.fixture
async def git_server(repo: Path) -> AsyncIterator[McpServer]:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.org", "GIT_COMMITTER_NAME": "t"}
    env["GIT_COMMITTER_EMAIL"] = "t@example.org"
    config = ServerConfig(name="git", command=_bin("mcp-server-git"), args=("--repository", str(repo)), env=env)
    async with McpServer(config) as server:
        yield server


def commits(repo: Path) -> list[str]:
    out = subprocess.run(["git", "-C", str(repo), "log", "--format=%s"], check=True, capture_output=True, text=True)
    return out.stdout.split()


def one_call(name: str, arguments: str) -> ScriptedProvider:
    """A model that calls one tool, then answers with the text of the result it got."""

    def script(request: Any, n: int) -> list[Any]:
        if n == 1:
            return call(name, arguments, call_id="c1")
        return say("done: " + str(request.messages[-1].get("content", "")))

    return ScriptedProvider(script)


def result_of(rt: LocalRuntime, sid: str) -> dict[str, Any]:
    (result,) = of_type(rt.journal.read(sid), EventType.TOOL_RESULT)
    return dict(result.payload)


def server_pids() -> Iterator[int]:
    """This process's children: the stdio servers it started."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == os.getpid():
                yield int(entry)


# ---- names and discovery ----


def test_tool_names_are_openai_function_names_and_stable() -> None:
    assert tool_name("git", "git_commit") == "git__git_commit"
    long = tool_name("srv", "x" * 80)
    assert re.fullmatch(r"[A-Za-z0-9_-]{1,64}", long) and long == tool_name("srv", "x" * 80)
    assert long != tool_name("srv", "x" * 79)
    dotted = tool_name("srv", "files.read")
    assert re.fullmatch(r"[A-Za-z0-9_-]{1,64}", dotted) and dotted != tool_name("srv", "files_read")


async def test_discovery_names_the_tools_server__tool_with_their_schemas_and_gates(
    time_server: McpServer, git_server: McpServer
) -> None:
    time_tools = {t.name: t for t in await time_server.discover()}
    assert set(time_tools) == {"time__get_current_time", "time__convert_time"}
    raw = {t.name: t for t in await time_server.list_tools()}
    current = time_tools["time__get_current_time"]
    assert current.parameters == raw["get_current_time"].input_schema  # passed through as the server gives it
    assert current.schema["function"]["description"] == raw["get_current_time"].description
    assert (current.gated, current.mutating, current.idempotent) == (False, False, True)  # readOnlyHint
    assert current.mcp_server == "time"
    assert time_server.protocol_version == "2026-07-28"  # the Python servers' stateless revision

    git_tools = {t.name: t for t in await git_server.discover()}
    commit, reset = git_tools["git__git_commit"], git_tools["git__git_reset"]
    assert (commit.gated, commit.mutating, commit.idempotent) == (True, False, False)  # destructiveHint false
    assert (reset.gated, reset.mutating) == (True, True)  # destructive
    assert not git_tools["git__git_status"].gated


async def test_a_servers_tool_globs_limit_what_it_offers(repo: Path) -> None:
    config = ServerConfig(
        name="git", command=_bin("mcp-server-git"), args=("--repository", str(repo)), tools=("git_s*",)
    )
    async with McpServer(config) as server:
        assert sorted(t.name for t in await server.discover()) == ["git__git_show", "git__git_status"]


def test_the_default_agent_is_offered_no_mcp_tools_and_a_glob_selects_them() -> None:
    async def fn(arguments: dict[str, Any], context: Any = None) -> str:
        return "x"

    mcp_tool = SchemaTool(fn, name="git__git_status", description="status", parameters={"type": "object"})
    mcp_tool.mcp_server = "git"
    plain = SchemaTool(fn, name="plain", description="plain", parameters={"type": "object"})
    registry = ToolRegistry([plain, mcp_tool])
    assert DEFAULT_AGENT.select_tools(registry).names() == ["plain"]
    assert AgentSpec(tools=("git__*",)).select_tools(registry).names() == ["git__git_status"]
    assert AgentSpec(tools=("*",)).select_tools(registry).names() == ["plain", "git__git_status"]


async def test_the_default_agents_model_is_not_offered_a_servers_tools(time_server: McpServer) -> None:
    provider = ScriptedProvider(lambda request, n: say("hi"))
    rt = LocalRuntime(tools=await time_server.discover(), provider=provider)
    await rt.send(await rt.create_session(), "hello")
    offered = {t["function"]["name"] for t in provider.requests[0].tools or []}
    assert offered and not any(name.startswith("time__") for name in offered)


# ---- calls through a run ----


async def test_a_read_only_tool_runs_without_asking(time_server: McpServer) -> None:
    provider = one_call("time__get_current_time", '{"timezone": "Europe/Paris"}')
    rt = LocalRuntime(tools=await time_server.discover(), provider=provider, agent=AgentSpec(tools=("time__*",)))
    sid = await rt.create_session()
    done = await rt.send(sid, "what time is it in Paris?")
    assert done.type is EventType.INVOCATION_COMPLETED
    result = result_of(rt, sid)
    assert not result.get("is_error") and '"timezone": "Europe/Paris"' in result["content"]
    assert not of_type(rt.journal.read(sid), EventType.APPROVAL_REQUESTED)
    assert not of_type(rt.journal.read(sid), EventType.TOOL_STARTED)  # idempotent: no start to journal


async def test_git_commit_asks_and_runs_only_after_approval(git_server: McpServer, repo: Path) -> None:
    provider = one_call("git__git_commit", json.dumps({"repo_path": str(repo), "message": "approved"}))
    rt = LocalRuntime(tools=await git_server.discover(), provider=provider, agent=AgentSpec(tools=("git__*",)))
    sid = await rt.create_session()
    suspended = await rt.send(sid, "commit the staged file")
    assert suspended.type is EventType.INVOCATION_SUSPENDED
    assert commits(repo) == ["first"]  # nothing ran while it waited
    done = await rt.decide(sid, suspended.payload["ask_id"], "allow_once", approver="bob")
    assert done.type is EventType.INVOCATION_COMPLETED
    assert commits(repo) == ["approved", "first"]
    assert not result_of(rt, sid).get("is_error")
    # Not idempotent: journaled as started before it ran, so a crash cannot re-run it.
    assert of_type(rt.journal.read(sid), EventType.TOOL_STARTED)


async def test_git_commit_does_not_run_after_a_denial(git_server: McpServer, repo: Path) -> None:
    provider = one_call("git__git_commit", json.dumps({"repo_path": str(repo), "message": "denied"}))
    rt = LocalRuntime(tools=await git_server.discover(), provider=provider, agent=AgentSpec(tools=("git__*",)))
    sid = await rt.create_session()
    suspended = await rt.send(sid, "commit the staged file")
    await rt.decide(sid, suspended.payload["ask_id"], "deny", approver="bob")
    assert commits(repo) == ["first"]
    assert result_of(rt, sid)["content"].startswith("denied")


async def test_a_servers_error_is_an_error_result_and_the_run_ends_normally(time_server: McpServer) -> None:
    provider = one_call("time__get_current_time", '{"timezone": "Nowhere/Atlantis"}')
    rt = LocalRuntime(tools=await time_server.discover(), provider=provider, agent=AgentSpec(tools=("time__*",)))
    sid = await rt.create_session()
    done = await rt.send(sid, "time in Atlantis?")
    assert done.type is EventType.INVOCATION_COMPLETED
    result = result_of(rt, sid)
    assert result.get("is_error")
    assert "MCP server time: get_current_time reported an error" in result["content"]
    assert "Nowhere/Atlantis" in result["content"]


async def test_a_protocol_error_is_an_error_result(time_server: McpServer) -> None:
    gone = time_server.make_tool(
        {"name": "vanished", "inputSchema": {"type": "object"}, "annotations": {"readOnlyHint": True}}
    )
    provider = one_call("time__vanished", "{}")
    rt = LocalRuntime(tools=[gone], provider=provider, agent=AgentSpec(tools=("time__*",)))
    sid = await rt.create_session()
    done = await rt.send(sid, "call it")
    assert done.type is EventType.INVOCATION_COMPLETED
    result = result_of(rt, sid)
    assert result.get("is_error") and "vanished failed" in result["content"] and "Unknown tool" in result["content"]
    # The server answered: the connection is kept.
    assert time_server.alive


async def test_an_unreachable_server_is_an_error_result(tmp_path: Path) -> None:
    server = McpServer(ServerConfig(name="gone", command=str(tmp_path / "no-such-server"), connect_timeout_s=5))
    tool = server.make_tool(
        {"name": "anything", "inputSchema": {"type": "object"}, "annotations": {"readOnlyHint": True}}
    )
    rt = LocalRuntime(tools=[tool], provider=one_call("gone__anything", "{}"), agent=AgentSpec(tools=("gone__*",)))
    sid = await rt.create_session()
    done = await rt.send(sid, "call it")
    assert done.type is EventType.INVOCATION_COMPLETED
    result = result_of(rt, sid)
    assert result.get("is_error") and "MCP server gone is unreachable" in result["content"]
    assert server.last_error
    await server.close()


async def test_a_crashed_stdio_server_is_started_again_for_the_next_call(time_server: McpServer) -> None:
    assert "UTC" in await time_server.call("get_current_time", {"timezone": "UTC"})
    (pid,) = list(server_pids())
    os.kill(pid, signal.SIGKILL)
    for _ in range(100):  # the client notices the closed pipe
        if not time_server.alive:
            break
        await asyncio.sleep(0.05)
    assert "UTC" in await time_server.call("get_current_time", {"timezone": "UTC"})
    (new_pid,) = list(server_pids())
    assert new_pid != pid
    assert time_server.last_error and "closed" in time_server.last_error


async def test_a_result_over_the_cap_is_cut_with_a_note() -> None:
    config = ServerConfig(name="time", command=_bin("mcp-server-time"), max_result_bytes=20)
    async with McpServer(config) as server:
        text = await server.call("get_current_time", {"timezone": "UTC"})
    kept, note = text.split("\n[cut: ", 1)
    assert len(kept.encode()) <= 20 and note.startswith("the result was ")
    assert cap("é" * 10, 5).startswith("éé\n[cut: the result was 20 bytes")  # never half a character


def test_a_server_config_is_either_a_command_or_a_url_and_hides_its_headers() -> None:
    with pytest.raises(ValueError):
        ServerConfig(name="x")
    with pytest.raises(ValueError):
        ServerConfig(name="x", command="a", url="http://b")
    with pytest.raises(ValueError):
        ServerConfig(name="Not A Slug", command="a")
    assert "s3cret" not in repr(ServerConfig(name="x", url="https://h/mcp", headers={"Authorization": "s3cret"}))


# ---- images and audio in results ----


async def test_an_image_result_is_kept_by_the_media_store_and_journaled_as_a_reference() -> None:
    store = MemoryMediaStore()
    async with McpServer(ServerConfig(name="every", command=_everything()), store_media=store) as server:
        tools = await server.discover()
        rt = LocalRuntime(
            tools=tools, provider=one_call("every__get-tiny-image", "{}"), agent=AgentSpec(tools=("every__*",))
        )
        sid = await rt.create_session()
        await rt.send(sid, "show me")
    result = result_of(rt, sid)
    (media,) = result["media"]
    assert media["kind"] == "image" and media["mime_type"] == "image/png"
    kept = store.get(media["ref"])
    assert kept is not None and kept.data.startswith(b"\x89PNG") and media["bytes"] == len(kept.data)
    assert re.fullmatch(r"sectr-media://[0-9a-f]{64}", media["ref"])
    # The model reads the image named in the text; the bytes are nowhere in the journal.
    assert re.search(r"\[image image/png, \d+\.\d KB\]", result["content"])
    assert "The image above is the MCP logo." in result["content"]
    journal_text = json.dumps([e.payload for e in rt.journal.read(sid)])
    assert "iVBORw0KGgo" not in journal_text and "data" not in media


async def test_an_image_over_the_media_limit_is_named_and_not_kept() -> None:
    store = MemoryMediaStore()
    config = ServerConfig(name="every", command=_everything(), max_media_bytes=100)
    async with McpServer(config, store_media=store) as server:
        output = await server.call("get-tiny-image", {})
    assert output.media == () and store.items == {}
    assert re.search(r"\[image image/png, \d+\.\d KB: not kept, over the 100 bytes limit\]", output)


async def test_audio_is_kept_like_images_and_blob_resources_and_bad_data_are_only_named() -> None:
    from mcp_types import (
        AudioContent,
        BlobResourceContents,
        CallToolResult,
        EmbeddedResource,
        ImageContent,
        TextResourceContents,
    )

    wav = b"RIFF\x24\x00\x00\x00WAVEfmt " + bytes(28)
    result = CallToolResult(
        content=[
            AudioContent(type="audio", data=base64.b64encode(wav).decode(), mime_type="audio/wav"),
            ImageContent(type="image", data="not base64!", mime_type="image/png"),
            EmbeddedResource(
                type="resource",
                resource=BlobResourceContents(
                    uri="file:///a.pdf", blob=base64.b64encode(b"%PDF" * 300).decode(), mime_type="application/pdf"
                ),
            ),
            EmbeddedResource(type="resource", resource=TextResourceContents(uri="file:///a.txt", text="the text")),
        ]
    )
    store = MemoryMediaStore()
    output = await result_output(result, ServerConfig(name="x", command="x"), store, "ses_1")
    (audio,) = output.media
    assert audio == {"ref": audio["ref"], "kind": "audio", "mime_type": "audio/wav", "bytes": len(wav)}
    assert store.get(audio["ref"]) is not None
    assert output.splitlines() == [
        f"[audio audio/wav, {len(wav)} bytes]",
        "[image image/png, 8 bytes: not kept, not valid base64]",
        "[resource: <file:///a.pdf> (application/pdf, 1.2 KB; not kept)]",
        "the text",
    ]
    # The result cap counts the text the model reads; the references stay whole.
    capped = await result_output(result, ServerConfig(name="x", command="x", max_result_bytes=10), store, None)
    assert capped.startswith("[audio aud\n[cut: ") and len(capped.media) == 1


def test_the_journal_refuses_media_that_are_not_references() -> None:
    base = {"tool_call_id": "c1", "name": "t", "content": "x"}
    good = {"ref": "sectr-media://" + "a" * 64, "kind": "image", "mime_type": "image/png", "bytes": 3}
    check_event(EventType.TOOL_RESULT, {**base, "media": [good]})
    for bad in (
        "nope",
        [{**good, "ref": "https://example.org/x.png"}],
        [{**good, "data": "iVBORw0KGgo="}],
        [{**good, "kind": "video"}],
        [{**good, "bytes": -1}],
        [good] * 17,
    ):
        with pytest.raises(InvalidEvent):
            check_event(EventType.TOOL_RESULT, {**base, "media": bad})


# ---- the session-based revision (TypeScript SDK 1.x), over stdio and Streamable HTTP ----


async def test_the_session_based_revision_over_stdio_with_images_named_and_timeouts() -> None:
    config = ServerConfig(name="every", command=_everything(), timeout_s=1.5)
    async with McpServer(config) as server:
        tools = {t.name: t for t in await server.discover()}
        assert server.protocol_version == "2025-11-25"
        assert {"every__echo", "every__get-tiny-image", "every__trigger-long-running-operation"} <= set(tools)
        assert await server.call("echo", {"message": "hi"}) == "Echo: hi"
        image = await server.call("get-tiny-image", {})  # no media store: named, not kept
        assert re.search(r"\[image image/png, \d+\.\d KB: not kept, no media store\]", image)
        assert image.media == ()

        rt = LocalRuntime(
            tools=tools.values(),
            provider=one_call("every__trigger-long-running-operation", '{"duration": 10, "steps": 2}'),
            agent=AgentSpec(tools=("every__*",)),
        )
        sid = await rt.create_session()
        done = await rt.send(sid, "run the long one")
        assert done.type is EventType.INVOCATION_COMPLETED
        result = result_of(rt, sid)
        assert result.get("is_error") and "timed out after 1.5s" in result["content"]
        # A server that did not answer in time is replaced: the next call works.
        assert await server.call("echo", {"message": "again"}) == "Echo: again"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
async def everything_http() -> AsyncIterator[str]:
    port = _free_port()
    proc = await asyncio.create_subprocess_exec(
        _everything(),
        "streamableHttp",
        env={**os.environ, "PORT": str(port)},
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        for _ in range(200):
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.close()
                break
            except OSError:
                await asyncio.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.kill()
        await proc.wait()


async def test_streamable_http_with_the_session_based_revision(everything_http: str) -> None:
    config = ServerConfig(name="every", url=everything_http, headers={"X-Test": "1"})
    async with McpServer(config) as server:
        names = {t.name for t in await server.discover()}
        assert "every__echo" in names and server.protocol_version == "2025-11-25"
        assert await server.call("echo", {"message": "over http"}) == "Echo: over http"


async def test_a_connect_guard_chooses_the_address_and_can_refuse_the_host(everything_http: str) -> None:
    # The name never resolves: the connection goes only where the guard says.
    url = everything_http.replace("127.0.0.1", "mcp.sectr-test.invalid")
    asked: list[tuple[str, int]] = []

    def to_loopback(host: str, port: int) -> list[str]:
        asked.append((host, port))
        return ["127.0.0.1"]

    async with McpServer(ServerConfig(name="every", url=url, connect_guard=to_loopback)) as server:
        assert await server.call("echo", {"message": "guarded"}) == "Echo: guarded"
    assert asked and asked[0] == ("mcp.sectr-test.invalid", int(everything_http.split(":")[2].split("/")[0]))

    def refuse(host: str, port: int) -> list[str]:
        raise ValueError(f"{host} is not for you")

    config = ServerConfig(name="every", url=everything_http, connect_guard=refuse, connect_timeout_s=5)
    async with McpServer(config) as server:
        with pytest.raises(McpToolError, match="unreachable.*refused: 127.0.0.1 is not for you"):
            await server.call("echo", {"message": "x"})


async def test_an_http_server_that_is_not_there_is_an_error() -> None:
    config = ServerConfig(name="nobody", url=f"http://127.0.0.1:{_free_port()}/mcp", connect_timeout_s=5)
    async with McpServer(config) as server:
        with pytest.raises(McpToolError, match="MCP server nobody is unreachable"):
            await server.call("echo", {"message": "x"})


# ---- what a call carries ----


async def test_a_call_carries_its_idempotency_key_in_meta() -> None:
    script = str(Path(__file__).with_name("mcp_meta_server.py"))
    async with McpServer(ServerConfig(name="meta", command=sys.executable, args=(script,))) as server:
        rt = LocalRuntime(
            tools=await server.discover(),
            provider=one_call("meta__show_meta", "{}"),
            agent=AgentSpec(tools=("meta__*",)),
        )
        sid = await rt.create_session()
        await rt.send(sid, "show the meta")
        meta = json.loads(result_of(rt, sid)["content"])
    assert meta["sectr/idempotency_key"] == f"{sid}:c1"
    # The stateless revision: version and client identity travel in each request's _meta.
    assert meta["io.modelcontextprotocol/protocolVersion"] == "2026-07-28"
    assert meta["io.modelcontextprotocol/clientInfo"]["name"] == "sectr"


# ---- a process's connections (a worker's pool) and a session's tools ----


async def test_a_pool_keeps_one_connection_per_server_and_its_discovery() -> None:
    pool = McpPool()
    config = ServerConfig(name="time", command=_bin("mcp-server-time"))
    first, second = await asyncio.gather(pool.tools("team1:time", config), pool.tools("team1:time", config))
    assert first is second and {t.name for t in first} == {"time__get_current_time", "time__convert_time"}
    assert await pool.tools("team1:time", config) is first
    assert len(list(server_pids())) == 1
    assert "UTC" in await first[0].run({"timezone": "UTC"})
    assert pool.status("team1:time") == {"connected": True, "protocol_version": "2026-07-28", "last_error": None}
    pool.refresh("team1:time")
    assert await pool.tools("team1:time", config) is not first
    await pool.close()
    assert list(server_pids()) == []


async def test_a_pool_offers_no_tools_of_a_server_it_cannot_reach(tmp_path: Path) -> None:
    pool = McpPool()
    config = ServerConfig(name="gone", command=str(tmp_path / "missing"), connect_timeout_s=5)
    assert await pool.tools("gone", config) == []
    assert pool.status("gone")["last_error"]
    await pool.close()


async def test_a_runtimes_tool_source_adds_a_sessions_mcp_tools() -> None:
    pool = McpPool()
    config = ServerConfig(name="time", command=_bin("mcp-server-time"))
    sessions_seen: list[str] = []

    async def team_tools(state: Any) -> list[Any]:
        sessions_seen.append(state.session_id)
        return list(await pool.tools("time", config))

    rt = LocalRuntime(
        provider=one_call("time__get_current_time", '{"timezone": "UTC"}'),
        agent=AgentSpec(tools=("get_time", "time__*")),
        extra_tools=team_tools,
    )
    assert "time__get_current_time" not in rt.runtime.tools  # the process's registry is untouched
    sid = await rt.create_session()
    assert (await rt.send(sid, "time?")).type is EventType.INVOCATION_COMPLETED
    assert sessions_seen == [sid]
    assert '"timezone": "UTC"' in result_of(rt, sid)["content"]
    await pool.close()


CHANGING = ROOT / "tests" / "server" / "mcp" / "changing_mcp_server.py"


def changing(era: str, ttl_ms: int = 0, *, listen: bool = True) -> ServerConfig:
    """Our server whose tool list grows when `grow` is called (docs in the file)."""
    env = {"CHANGING_MCP_ERA": era, "CHANGING_MCP_TTL_MS": str(ttl_ms), "CHANGING_MCP_LISTEN": str(int(listen))}
    return ServerConfig(name="changing", command=sys.executable, args=(str(CHANGING),), env=env, timeout_s=20)


async def wait_until(check: Any, seconds: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + seconds
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.02)


async def grow_and_run_extra_1(pool: McpPool, config: ServerConfig, heard: list[str]) -> None:
    """Call `grow` on the pool's server "c": it adds extra_1 and says its tools changed;
    once the pool heard that (its first change), its tools include extra_1, which runs."""
    assert await pool.server("c", config).call("grow", {}) == "added extra_1"
    await wait_until(lambda: heard == ["c"])
    tools = {t.name: t for t in await pool.tools("c", config)}
    assert set(tools) == {"changing__grow", "changing__shrink", "changing__extra_1"}
    assert await tools["changing__extra_1"].run({}) == "extra 1"


async def test_a_session_based_servers_tool_list_change_makes_the_pool_discover_again() -> None:
    heard: list[str] = []
    pool = McpPool(on_tools_changed=heard.append)
    config = changing("legacy")
    first = await pool.tools("c", config)
    assert {t.name for t in first} == {"changing__grow", "changing__shrink"}
    server = pool.server("c", config)
    assert server.protocol_version == "2025-11-25" and server.tools_ttl_s is None
    assert await pool.tools("c", config) is first  # no hint, no change: kept
    await grow_and_run_extra_1(pool, config, heard)
    await pool.close()


async def test_a_stateless_servers_cache_hint_is_honoured_and_none_keeps_the_tools() -> None:
    pool = McpPool()
    # Servers that serve no `subscriptions/listen`: the hint is all they say.
    hinted, plain = changing("modern", ttl_ms=300, listen=False), changing("modern", listen=False)
    first = await pool.tools("hinted", hinted)
    server = pool.server("hinted", hinted)
    assert server.protocol_version == "2026-07-28" and server.tools_ttl_s == 0.3
    await server.call("grow", {})  # no notification: nothing to listen to
    assert await pool.tools("hinted", hinted) is first  # still fresh
    await asyncio.sleep(0.4)
    assert "changing__extra_1" in {t.name for t in await pool.tools("hinted", hinted)}

    kept = await pool.tools("plain", plain)
    await pool.server("plain", plain).call("grow", {})
    await asyncio.sleep(0.4)
    assert pool.server("plain", plain).tools_ttl_s is None
    assert await pool.tools("plain", plain) is kept  # no hint: kept until refresh
    pool.refresh("plain")
    assert "changing__extra_1" in {t.name for t in await pool.tools("plain", plain)}
    await pool.close()


class ChangingHttp:
    """The changing server over Streamable HTTP at the stateless revision (no session),
    on a port of its own; `restart()` kills it and starts a fresh one on the same port."""

    def __init__(self) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        env = {**os.environ, "CHANGING_MCP_ERA": "modern", "CHANGING_MCP_HTTP_PORT": str(self.port)}
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, str(CHANGING), env=env, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
        )
        for _ in range(400):
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", self.port)
                writer.close()
                return
            except OSError:
                await asyncio.sleep(0.05)

    async def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            await self.proc.wait()

    async def restart(self) -> None:
        await self.stop()
        await self.start()


@pytest.fixture
async def changing_http() -> AsyncIterator[ChangingHttp]:
    server = ChangingHttp()
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


async def follows_a_stateless_servers_changes(config: ServerConfig) -> None:
    """A stateless server sends no notification on the connection: a change reaches only a
    client listening with `subscriptions/listen`, which a pool's connections keep open."""
    heard: list[str] = []
    pool = McpPool(on_tools_changed=heard.append)
    first = await pool.tools("c", config)
    server = pool.server("c", config)
    assert server.protocol_version == "2026-07-28" and server.tools_ttl_s is None
    assert await pool.tools("c", config) is first  # no hint, no change: kept
    await grow_and_run_extra_1(pool, config, heard)
    assert await server.call("shrink", {}) == "removed extra_1"
    await wait_until(lambda: heard == ["c", "c"])
    assert "changing__extra_1" not in {t.name for t in await pool.tools("c", config)}
    await pool.close()


async def test_a_stateless_stdio_servers_tool_list_change_reaches_a_listening_pool() -> None:
    await follows_a_stateless_servers_changes(changing("modern"))


async def test_a_stateless_http_servers_tool_list_change_reaches_a_listening_pool(changing_http: ChangingHttp) -> None:
    await follows_a_stateless_servers_changes(ServerConfig(name="changing", url=changing_http.url, timeout_s=20))


async def test_a_subscription_opened_again_counts_as_a_change(changing_http: ChangingHttp) -> None:
    """Nothing replays what a server said while nobody listened: the subscription of a
    connection opened again (the server restarted, the HTTP connection was lost) counts
    as a change, and then the new stream is heard."""
    heard: list[str] = []
    pool = McpPool(on_tools_changed=heard.append)
    config = ServerConfig(name="changing", url=changing_http.url, timeout_s=20)
    await pool.tools("c", config)
    server = pool.server("c", config)
    await changing_http.restart()
    # A stateless server keeps no session, so the connection may outlive the restart: its
    # listener subscribes again on it at once, and that counts as the change. Or a
    # request fails meanwhile and the connection is lost: then the next call's new
    # connection subscribes, and that counts. Which one comes first is timing alone.
    await wait_until(lambda: heard == ["c"] or not server.alive)
    if heard == []:
        assert not server.alive
    assert await server.call("grow", {}) == "added extra_1"  # heard on the new process's stream
    await wait_until(lambda: heard == ["c", "c"])
    assert "changing__extra_1" in {t.name for t in await pool.tools("c", config)}
    await pool.close()


async def test_a_one_off_discovery_opens_no_subscription() -> None:
    """Nobody listens to a connection without an `on_tools_changed` listener (a save's
    discovery): it asks the server for no stream."""
    async with McpServer(changing("modern")) as server:
        await server.discover()
        assert not [t for t in asyncio.all_tasks() if t.get_name().startswith("mcp-listen:")]


async def test_a_tool_the_server_removed_since_its_discovery_is_an_error_result() -> None:
    async with McpServer(changing("legacy")) as server:
        await server.call("grow", {})
        extra = {t.name: t for t in await server.discover()}["changing__extra_1"]
        await server.call("shrink", {"quietly": True})
        with pytest.raises(McpToolError, match=r"MCP server changing: extra_1 reported an error: Unknown tool"):
            await extra.run({})
        await server.discover()  # the list no longer has it: the error says why
        with pytest.raises(McpToolError, match=r"no longer lists this tool: its tools changed"):
            await extra.run({})


def test_an_operators_servers_file_is_checked_entry_by_entry() -> None:
    configs = server_configs_from_json(
        {"git": {"command": "mcp-server-git", "args": ["--repository", "/srv/repo"], "env": {"A": "b"}, "cwd": "/srv"}},
        max_result_bytes=1000,
    )
    assert configs["git"].args == ("--repository", "/srv/repo") and configs["git"].max_result_bytes == 1000
    for bad, message in [
        ([], "expected a JSON object"),
        ({"git": {"args": []}}, "'git': needs a command"),
        ({"git": {"command": "x", "args": "--all"}}, "args must be a list of strings"),
        ({"git": {"command": "x", "env": {"A": 1}}}, "env must map names to strings"),
        ({"git": {"command": "x", "shell": True}}, "unknown keys"),
        ({"Not Slug": {"command": "x"}}, "invalid MCP server name"),
    ]:
        with pytest.raises(ValueError, match=message):
            server_configs_from_json(bad)


async def test_plan_mode_refuses_an_mcp_tool_that_is_not_read_only(git_server: McpServer, repo: Path) -> None:
    provider = one_call("git__git_commit", json.dumps({"repo_path": str(repo), "message": "in plan"}))
    rt = LocalRuntime(tools=await git_server.discover(), provider=provider, agent=AgentSpec(tools=("git__*",)))
    sid = await rt.create_session(mode="plan")
    done = await rt.send(sid, "commit")
    assert done.type is EventType.INVOCATION_COMPLETED
    assert result_of(rt, sid)["content"].startswith("refused: git__git_commit changes things")
    assert commits(repo) == ["first"]


async def test_plan_mode_runs_a_read_only_mcp_tool(time_server: McpServer) -> None:
    provider = one_call("time__get_current_time", '{"timezone": "UTC"}')
    rt = LocalRuntime(tools=await time_server.discover(), provider=provider, agent=AgentSpec(tools=("time__*",)))
    sid = await rt.create_session(mode="plan")
    await rt.send(sid, "time?")
    assert '"timezone": "UTC"' in result_of(rt, sid)["content"]
