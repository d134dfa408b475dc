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
from tether.runtime import CrashPlan, CrashPoint, SimulatedCrash, open_run
from tether.store import open_store

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def gateway(
    where: Path, keyring: Keyring, crash: CrashPlan | None = None, store_query: str = ""
) -> Gateway:
    argv = [sys.executable, "-m", "tests.integration._mcp_upstream", str(where / "up.sqlite")]
    config = GatewayConfig(
        store=f"sqlite:///{where / 'tether.sqlite'}{store_query}",
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


def test_the_same_call_asked_twice_at_once_is_executed_once_each_answer_its_own(
    tmp_path: Path,
) -> None:
    """Two equal add_note calls at once: one answered as executed, the other replayed under its own action id; one row."""

    async def twice(found: Gateway, run: Any) -> Any:
        answers: list[Any] = []

        async def ask() -> None:
            answers.append(await found.call("add_note", {"text": "feed the cat"}))

        async with anyio.create_task_group() as group:
            group.start_soon(ask)
            group.start_soon(ask)
        await found.recorded()
        return answers

    answers = anyio.run(session, gateway(tmp_path, Keyring.generate("k1")), twice)
    metas = [(answer.meta or {})[CALL_META] for answer in answers]
    assert sorted(meta["outcome"] for meta in metas) == ["executed", "replayed"]
    assert len({meta["action_id"] for meta in metas}) == 2
    assert all(answer.structured_content["text"] == "feed the cat" for answer in answers)
    assert notes(tmp_path) == 1


def test_a_receipt_the_busy_store_refused_after_the_answer_is_recorded_at_exit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store busy past its timeout as add_note's receipt is committed: answered all the same, and recorded as the gateway exits."""
    marker = tmp_path / "kill"
    marker.write_text(f"lock {tmp_path / 'tether.sqlite'}")
    monkeypatch.setenv("NOTES_TEST_KILL", str(marker))
    keyring = Keyring.generate("k1")

    async def busy(found: Gateway, run: Any) -> Any:
        answer = await found.call("add_note", {"text": "pay the rent"})
        await found.recorded()  # its commit refused: the store was held past its timeout
        await anyio.sleep(4.5)  # the store free again before the gateway exits
        return answer, run.session.state.pending is not None

    async def until_exit(found: Gateway, run: Any) -> Any:
        try:
            return await busy(found, run)
        finally:
            await found.early.record_again()  # what the gateway's exit does

    answer, unrecorded = anyio.run(
        session, gateway(tmp_path, keyring, store_query="?busy_timeout_ms=200"), until_exit
    )
    assert (answer.meta or {})[CALL_META]["outcome"] == "executed"
    assert unrecorded, "the receipt was not committed while the store was held"
    view = open_run(open_store(f"sqlite:///{tmp_path / 'tether.sqlite'}"), "first", keyring=keyring)
    assert view.state.phase.value == "running" and view.state.pending is None
    assert [e.status.value for e in view.ledger][-1] == "committed"
    assert notes(tmp_path) == 1
