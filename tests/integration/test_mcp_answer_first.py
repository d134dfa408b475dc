"""The gateway answers an effect as soon as the upstream answered, while its receipt is committed.

The gateway's own call path in this process (:class:`~tether.integrations.mcp.Gateway`),
its upstream the SDK server of ``tests/integration/_mcp_upstream.py`` as a real child over
stdio, each effect a row in that server's SQLite file: the rows are what the world received.
"""

from __future__ import annotations

import asyncio
import sqlite3
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

pytest.importorskip("mcp", reason="needs the [mcp] extra")

from tether import effects
from tether.crypto import Keyring
from tether.integrations.mcp import (
    CALL_META,
    Gateway,
    GatewayConfig,
    GatewayPolicy,
    Upstream,
    stdio_target,
)
from tether.runtime import CrashPlan, CrashPoint, SimulatedCrash

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def gateway(where: Path, keyring: Keyring, crash: CrashPlan | None = None) -> Gateway:
    argv = [sys.executable, "-m", "tests.integration._mcp_upstream", str(where / "up.sqlite")]
    config = GatewayConfig(
        store=f"sqlite:///{where / 'tether.sqlite'}",
        run_id="first",
        keyring=keyring,
        policy=GatewayPolicy.from_json({"reads": ["count_notes"]}),
        instance="notes",
        lease_ttl_s=1.0,
        crash=crash,
    )
    return Gateway(config, Upstream(stdio_target(argv, str(ROOT)), timeout_s=60))


async def session(found: Gateway, body: Any) -> Any:
    """Run ``body(gateway, run)`` with the upstream started and the run open."""
    async with anyio.create_task_group() as group:
        await found.upstream.start(group)
        found.loop = asyncio.get_running_loop()
        try:
            tools = await found.upstream.tools()
            runtime = await anyio.to_thread.run_sync(found.build_runtime, tools)
            async with effects.run_async(runtime, "first") as run:
                found.run = run
                return await body(found, run)
        finally:
            await found.upstream.aclose()
            group.cancel_scope.cancel()


def notes(where: Path) -> int:
    with sqlite3.connect(where / "up.sqlite") as con:
        return int(con.execute("SELECT COUNT(*) FROM notes").fetchone()[0])


def test_an_effect_is_answered_even_when_the_gateway_dies_committing_its_receipt(
    tmp_path: Path,
) -> None:
    """add_note's answer reaches the agent before its receipt's commit, which dies; started again, the gateway leaves the call to a person and the upstream holds one row."""
    keyring = Keyring.generate("k1")
    # Its first hit: the commit of this call's receipt (the intent's records none).
    dying = gateway(tmp_path, keyring, CrashPlan(CrashPoint.RECEIPT_PERSISTED))

    async def answered(found: Gateway, run: Any) -> Any:
        answer = await found.call("add_note", {"text": "pay the rent"})
        with pytest.raises(SimulatedCrash):
            await found.recorded()
        raise _Died(answer)

    with pytest.raises(BaseException) as died:
        anyio.run(session, dying, answered)
    answer = _died(died.value)
    assert not answer.is_error
    assert answer.structured_content["text"] == "pay the rent"
    assert (answer.meta or {})[CALL_META]["outcome"] == "executed"
    assert notes(tmp_path) == 1

    async def again(found: Gateway, run: Any) -> Any:
        await anyio.sleep(1.2)  # the dead gateway's lease lapses
        return await found.call("add_note", {"text": "pay the rent"})

    asked = anyio.run(session, gateway(tmp_path, keyring), again)
    assert asked.is_error
    assert (asked.meta or {})[CALL_META]["waits_for"] == "review"
    assert notes(tmp_path) == 1


class _Died(Exception):
    """The first gateway's end, carrying the answer the agent had got."""

    def __init__(self, answer: Any) -> None:
        super().__init__("died")
        self.answer = answer


def _died(error: BaseException) -> Any:
    """The answer a :class:`_Died` carries, out of the task groups it crossed."""
    while isinstance(error, BaseExceptionGroup):
        error = error.exceptions[0]
    if not isinstance(error, _Died):
        raise error
    return error.answer
