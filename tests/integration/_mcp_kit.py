"""Real parts for the MCP gateway's tests: the SDK's client, `tether mcp`, the test upstream.

A :class:`Setup` is one directory: the upstream's SQLite file (its rows are
the effects the world received), tether's store, a keyring, a policy file.
:meth:`Setup.gateway` is the command a client starts (``python -m
tether.cli mcp ... -- python -m tests.integration._mcp_upstream DB``), as a
desktop client would; :meth:`Setup.direct` starts the upstream alone (the
unguarded control).

``python -m tests.integration._mcp_kit call SERVER_JSON TOOL ARGS_JSON
ANSWER_FILE`` is a client in a process of its own: it connects, calls one
tool, writes the answer to ``ANSWER_FILE``, and SIGKILLs itself right after
the tool returned (a client killed at the worst moment).
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
from mcp import Client, StdioServerParameters
from mcp.types import CallToolResult

ROOT = Path(__file__).resolve().parents[2]
UPSTREAM = [sys.executable, "-m", "tests.integration._mcp_upstream"]


def child_env(**extra: str) -> dict[str, str]:
    """The environment of every child: this checkout's tether first on the path."""
    paths = [str(ROOT / "src"), str(ROOT)]
    if os.environ.get("PYTHONPATH"):
        paths.append(os.environ["PYTHONPATH"])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths), PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


@dataclass
class Setup:
    """One gateway configuration in one directory (see the module docstring)."""

    base: Path
    run_id: str = "agent-run"
    policy: dict[str, Any] = field(default_factory=lambda: {"reads": ["count_notes"]})
    trust: Path | None = None
    #: An approver's key the gateway signs approvals given in the client with.
    approver_key: Path | None = None
    upstream_url: str | None = None
    upstream_headers: list[str] = field(default_factory=list)
    extra_env: dict[str, str] = field(default_factory=dict)
    lease_ttl: str = "1"

    @property
    def db(self) -> Path:
        """The upstream's own SQLite file."""
        return self.base / "upstream.sqlite"

    @property
    def store(self) -> str:
        """tether's store URL."""
        return f"sqlite:///{self.base / 'tether.sqlite'}"

    @property
    def keyring(self) -> Path:
        return self.base / "keyring.json"

    @property
    def kill_marker(self) -> Path:
        """While this file exists, the upstream's next effect kills who it names."""
        return self.base / "kill-next"

    def gateway_argv(self) -> list[str]:
        """``tether mcp`` with this setup, as a client's configuration names it."""
        policy = self.base / "policy.json"
        policy.write_text(json.dumps(self.policy))
        argv = [
            "-m",
            "tether.cli",
            "mcp",
            "--store",
            self.store,
            "--run",
            self.run_id,
            "--policy",
            str(policy),
            "--keyring",
            str(self.keyring),
            "--lease-ttl",
            self.lease_ttl,
        ]
        if self.trust is not None:
            argv += ["--trust", str(self.trust)]
        if self.approver_key is not None:
            argv += ["--approver-key", str(self.approver_key)]
        if self.upstream_url is not None:
            for header in self.upstream_headers:
                argv += ["--upstream-header", header]
            return [*argv, "--upstream", self.upstream_url]
        return [*argv, "--", *UPSTREAM, str(self.db)]

    def gateway(self) -> StdioServerParameters:
        """The gateway as a stdio server, started by the client."""
        return StdioServerParameters(
            command=sys.executable,
            args=self.gateway_argv(),
            env=child_env(
                NOTES_TEST_KILL=str(self.kill_marker),
                NOTES_TEST_SLOW_START=str(self.slow_start_marker),
                **self.extra_env,
            ),
            cwd=str(ROOT),
        )

    def direct(self) -> StdioServerParameters:
        """The upstream alone: the client straight to it, nothing between."""
        return self.direct_with({})

    def direct_with(self, env: dict[str, str]) -> StdioServerParameters:
        """The upstream alone, with ``env`` added to its environment."""
        return StdioServerParameters(
            command=UPSTREAM[0],
            args=[*UPSTREAM[1:], str(self.db)],
            env=child_env(NOTES_TEST_KILL=str(self.kill_marker), **env),
            cwd=str(ROOT),
        )

    def rows(self, table: str = "notes") -> int:
        """How many rows the upstream holds: the effects the world received."""
        if not self.db.exists():
            return 0
        with sqlite3.connect(self.db) as con:
            try:
                return int(con.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])
            except sqlite3.OperationalError:
                return 0

    @property
    def slow_start_marker(self) -> Path:
        """While this file exists, the next upstream started waits five seconds before serving."""
        return self.base / "slow-start"

    def gateway_pids(self) -> list[int]:
        """The gateway processes of this setup's store (read from /proc)."""
        return [
            pid
            for pid, argv in _processes()
            if b"tether.cli" in argv and self.store.encode() in argv
        ]

    def upstream_pids(self) -> list[int]:
        """The processes serving this setup's upstream file (read from /proc)."""
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            module = argv[1:3] == [b"-m", b"tests.integration._mcp_upstream"]
            if module and str(self.db).encode() in argv:
                found.append(int(entry.name))
        return found

    def arm(self, who: str) -> None:
        """Make the upstream's next effect kill ``parent`` (the gateway) or ``self``, or ``hang``."""
        self.kill_marker.write_text(who)


def _processes() -> list[tuple[int, list[bytes]]]:
    """Every process's id and command line (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            found.append((int(entry.name), (entry / "cmdline").read_bytes().split(b"\0")))
        except OSError:
            continue
    return found


@asynccontextmanager
async def connected(server: StdioServerParameters | str) -> AsyncIterator[Client]:
    """The SDK's client, connected (it starts a stdio server as its child)."""
    async with Client(server, read_timeout_seconds=60) as client:
        yield client


def call_in_child(
    server: StdioServerParameters, tool: str, args: dict[str, Any], answer: Path
) -> int:
    """Run a client process that calls ``tool`` once and is SIGKILLed after it returned."""
    import subprocess

    spec = json.dumps(server.model_dump(mode="json"))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.integration._mcp_kit",
            "call",
            spec,
            tool,
            json.dumps(args),
            str(answer),
        ],
        env=child_env(),
        cwd=str(ROOT),
        timeout=120,
        check=False,
    )
    return done.returncode


def document(result: CallToolResult) -> dict[str, Any]:
    """A tool's answer as JSON (what the agent reads)."""
    return result.model_dump(by_alias=True, mode="json", exclude_none=True)


def text(result: CallToolResult) -> str:
    """The text of a tool's answer."""
    return " ".join(getattr(block, "text", "") for block in result.content)


async def _call_then_die(spec: str, tool: str, args: str, answer: str) -> None:
    server = StdioServerParameters.model_validate(json.loads(spec))
    async with connected(server) as client:
        result = await client.call_tool(tool, json.loads(args))
        Path(answer).write_text(json.dumps(document(result)))
        os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    if sys.argv[1:2] == ["call"]:
        anyio.run(_call_then_die, *sys.argv[2:6])
