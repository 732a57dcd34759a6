"""Fixtures for a team's MCP servers: the installation's stdio servers from PyPI
(`mcp-server-time`, `mcp-server-git` on a scratch repository) in an operator's
SECTR_MCP_SERVERS file, and npm's `server-everything` in its Streamable HTTP mode."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# crew: owner (member), member, reviewer, moderator; other: outsider (its moderator); staff.
from tests.server.teams.test_agents import people  # noqa: F401 - a fixture, shared

ROOT = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent
EVERYTHING = ROOT / "var" / "mcp-npm" / "node_modules" / ".bin" / "mcp-server-everything"
GIT_ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.org",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.org",
}


def bin_path(name: str) -> str:
    path = BIN / name
    assert path.exists(), f"{name} is not installed: run scripts/setup.sh (requirements.txt pins it)"
    return str(path)


def make_repo(path: Path) -> Path:
    """A git repository with one commit and `b.txt` staged, for the model's commit."""
    path.mkdir()
    git = ["git", "-C", str(path), "-c", "user.name=t", "-c", "user.email=t@example.org"]
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    (path / "a.txt").write_text("one\n")
    subprocess.run([*git, "add", "a.txt"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "first"], check=True)
    (path / "b.txt").write_text("two\n")
    subprocess.run([*git, "add", "b.txt"], check=True)
    return path


def commits(repo: Path) -> list[str]:
    out = subprocess.run(["git", "-C", str(repo), "log", "--format=%s"], check=True, capture_output=True, text=True)
    return out.stdout.splitlines()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "repo")


def servers_file(path: Path, repo: Path, **more: dict[str, Any]) -> Path:
    """An operator's SECTR_MCP_SERVERS file: `time` and `git` (on `repo`), and `more`."""
    entries: dict[str, Any] = {
        "time": {"command": bin_path("mcp-server-time")},
        "git": {"command": bin_path("mcp-server-git"), "args": ["--repository", str(repo)], "env": GIT_ENV},
        **more,
    }
    path.write_text(json.dumps(entries))
    return path


@pytest.fixture
def installation(tmp_path: Path, repo: Path, settings: Any) -> Path:
    settings.SECTR_MCP_SERVERS = str(servers_file(tmp_path / "mcp-servers.json", repo))
    return repo


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_everything() -> tuple[subprocess.Popen[bytes], str]:
    """server-everything over Streamable HTTP on a free port: the process and its /mcp URL."""
    assert EVERYTHING.exists(), "server-everything is not installed: run scripts/ensure_mcp_test_servers.sh"
    port = free_port()
    proc = subprocess.Popen(
        [str(EVERYTHING), "streamableHttp"],
        env={**os.environ, "PORT": str(port)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 20
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, f"http://127.0.0.1:{port}/mcp"
        except OSError:
            if time.monotonic() > deadline:
                proc.kill()
                raise AssertionError("server-everything did not start") from None
            time.sleep(0.05)


@pytest.fixture
def everything_http() -> Iterator[str]:
    proc, url = start_everything()
    try:
        yield url
    finally:
        proc.kill()
        proc.wait()
