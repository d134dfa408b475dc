"""The MCP gateway as an app for tether's crash harness: killed at every crash point of a tool call.

    tether crashtest --app tests.integration._mcp_crash_app:app

(from the repository root). Each harness child is one gateway process: the
gateway's own code (:class:`~tether.integrations.mcp.Gateway`, its
``call``), with its upstream, the SDK server of
``tests/integration/_mcp_upstream.py``, started as its child over stdio and
writing one row per effect to a SQLite file of the run's own. The agent's
side is a fixed list of tool calls (:data:`CALLS`), asked of the gateway the
way its MCP server asks them, from the start every time the gateway is
started again, as a restarted agent asks again. The harness SIGKILLs the
child at the chosen pass of a crash point (the upstream dies with it, its
committed rows stay) and recovers the run in fresh processes; the rows are
what the world received.

- ``app``: the policy names ``count_notes`` a read; ``add_note`` takes no
  key (killed after the send, the run goes to review, one row), ``charge``
  accepts one (asked again under the same key, one charge).
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import sys
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types

from tether import effects
from tether.core import TetherError
from tether.crypto import Keyring
from tether.integrations.mcp import (
    CALL_META,
    Gateway,
    GatewayConfig,
    GatewayPolicy,
    Upstream,
    stdio_target,
)
from tether.runtime import CrashPlan, Runtime
from tether.store import ContentStore

ROOT = Path(__file__).resolve().parents[2]
#: What the agent asks, in order, every time (the repeated add_note is a replay).
CALLS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("count_notes", {}),
    ("add_note", {"text": "first"}),
    ("charge", {"account": "acme", "cents": 500}),
    ("add_note", {"text": "first"}),
)
#: How often a call answered "not carried out" (an earlier attempt still in flight) is asked again.
ATTEMPTS = 20


class GatewayApp:
    """prepare / runtime / drive / effects, as :class:`~tether.testing.crash_harness.LoopCrashApp`."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = Path(workdir)
        ring = self.workdir / "keyring.json"
        if not ring.exists():  # made by the harness's own process, before any child starts
            Keyring.generate("k1").write_file(ring)
        self.keyring = Keyring.from_file(ring)
        self.gateway: Gateway | None = None

    def db(self, run_id: str) -> Path:
        """The run's upstream's own SQLite file."""
        return self.workdir / "worlds" / f"{run_id}.sqlite"

    def prepare(self, run_id: str) -> None:
        """A fresh world: the directory the run's upstream makes its file in."""
        self.db(run_id).parent.mkdir(parents=True, exist_ok=True)

    def runtime(self, store: ContentStore, run_id: str, crash: CrashPlan) -> Runtime:
        """The gateway's runtime over ``store``, armed with ``crash``, for the upstream's tools."""
        argv = [sys.executable, "-m", "tests.integration._mcp_upstream", str(self.db(run_id))]
        upstream = Upstream(stdio_target(argv, str(ROOT)), timeout_s=60)
        config = GatewayConfig(
            store=f"sqlite:///{self.workdir / 'tether.sqlite'}",  # shown in messages only
            run_id=run_id,
            keyring=self.keyring,
            policy=GatewayPolicy.from_json({"reads": ["count_notes"]}),
            instance="notes",  # the name the upstream gives itself, known without asking it
            lease_ttl_s=5.0,
            crash=crash,
        )
        gateway = Gateway(config, upstream)
        self.gateway = gateway
        return gateway.build_runtime(self.tools(upstream), store=store)

    def tools(self, upstream: Upstream) -> list[types.Tool]:
        """The upstream's tool list: listed once by the first process, then read back (every
        run's upstream is the same server, so the list is the same)."""
        listed = self.workdir / "tools.json"
        if not listed.exists():
            found = anyio.run(self._list, upstream)
            temp = listed.with_name(f"tools.{os.getpid()}.json")
            temp.write_text(json.dumps([t.model_dump(mode="json", by_alias=True) for t in found]))
            os.replace(temp, listed)
        return [types.Tool.model_validate(t) for t in json.loads(listed.read_text())]

    @staticmethod
    async def _list(upstream: Upstream) -> list[types.Tool]:
        async with anyio.create_task_group() as group:
            await upstream.start(group)
            try:
                return await upstream.tools()
            finally:
                await upstream.aclose()
                group.cancel_scope.cancel()

    def drive(self, runtime: Runtime, run_id: str) -> None:
        """Ask :data:`CALLS` of the gateway and finish; a run that ended, or is frozen, is left."""
        anyio.run(self._drive, runtime, run_id)

    async def _drive(self, runtime: Runtime, run_id: str) -> None:
        gateway = self.gateway
        if gateway is None:
            raise RuntimeError("runtime() builds the gateway first")
        async with anyio.create_task_group() as group:
            await gateway.upstream.start(group)
            gateway.loop = asyncio.get_running_loop()
            try:
                async with effects.run_async(runtime, run_id) as run:
                    gateway.run = run
                    if run.phase.terminal:
                        return
                    for name, arguments in CALLS:
                        await self._ask(gateway, name, arguments)
                    await gateway.recorded()  # as the gateway does before it lets the run go
                    try:
                        await run.finish_async("the agent is done")
                    except TetherError:
                        return  # frozen for review: a person decides, the run waits
            finally:
                await gateway.upstream.aclose()
                group.cancel_scope.cancel()

    @staticmethod
    async def _ask(gateway: Gateway, name: str, arguments: dict[str, Any]) -> None:
        """One call, asked again while an earlier attempt is still in flight (bounded)."""
        for attempt in range(ATTEMPTS):
            answer = await gateway.call(name, arguments)
            said = (answer.meta or {}).get(CALL_META, {})
            if not answer.is_error or "waits_for" in said or "outcome" in said:
                return
            await anyio.sleep(min(0.5, 0.01 * 2**attempt))

    def effects(self, run_id: str) -> dict[str, int]:
        """The rows the run's upstream holds: notes added and charges made."""
        db = self.db(run_id)
        if not db.exists():
            return {"add_note": 0, "charge": 0}
        with sqlite3.connect(db) as con:
            return {
                "add_note": _count(con, "notes"),
                "charge": _count(con, "charges"),
            }


def _count(con: sqlite3.Connection, table: str) -> int:
    try:
        return int(con.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])
    except sqlite3.OperationalError:  # the upstream never started: no table, no rows
        return 0


def app(workdir: Path) -> GatewayApp:
    """``--app tests.integration._mcp_crash_app:app``."""
    return GatewayApp(workdir)
