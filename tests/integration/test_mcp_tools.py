"""What the gateway does with unusual tools and answers, through the real SDK client and `tether mcp`.

Tools named like a run's own actions, integers past 2**53, answers over
16 KiB under an output schema, and the same call made again after another
one (A, B, A). The upstream (``NOTES_TEST_EXTRA=1``) records each call of
these tools as a row in its own ``calls`` table: the rows are what the
world received.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import anyio
import pytest

pytest.importorskip("mcp", reason="needs the [mcp] extra")

from tests.integration._mcp_kit import Setup, connected, document, text
from tether.crypto import Keyring
from tether.runtime import open_run
from tether.store import open_store

pytestmark = pytest.mark.slow


@pytest.fixture
def setup(tmp_path: Path) -> Setup:
    Keyring.generate("k1").write_file(tmp_path / "keyring.json")
    found = Setup(tmp_path)
    found.extra_env = {"NOTES_TEST_EXTRA": "1"}
    return found


def meta(result: Any) -> dict[str, Any]:
    return document(result)["_meta"]["tether/call"]


def calls(setup: Setup, tool: str | None = None) -> list[dict[str, Any]]:
    """The arguments of every call the upstream received (of ``tool``), oldest first."""
    if not setup.db.exists():
        return []
    with sqlite3.connect(setup.db) as con:
        rows = con.execute("SELECT tool, args FROM calls ORDER BY id").fetchall()
    return [json.loads(args) for name, args in rows if tool is None or name == tool]


def committed_kinds(setup: Setup) -> list[str]:
    """The kinds of the run's committed effects, from its signed ledger."""
    store = open_store(setup.store)
    try:
        view = open_run(store, setup.run_id, keyring=Keyring.from_file(setup.keyring))
    finally:
        store.close()
    return [e.terms.kind for e in view.ledger if e.status.value == "committed" and e.terms]


def test_tools_named_like_a_runs_own_actions_are_offered_and_guarded(setup: Setup) -> None:
    """An upstream with tools finish, cancel and tests.run: offered unchanged, each sent once, the run goes on."""

    async def main() -> None:
        async with connected(setup.direct_with(setup.extra_env)) as direct:
            upstream = (await direct.list_tools()).tools
        async with connected(setup.gateway()) as client:
            offered = (await client.list_tools()).tools
            assert [t.model_dump(mode="json") for t in offered] == [
                t.model_dump(mode="json") for t in upstream
            ]
            for tool, args in (
                ("finish", {"summary": "job 7"}),
                ("cancel", {"reason": "job 8"}),
                ("tests.run", {"suite": "unit"}),
            ):
                first = await client.call_tool(tool, args)
                assert not first.is_error, text(first)
                assert meta(first)["outcome"] == "executed" and meta(first)["tool"] == tool
                again = await client.call_tool(tool, args)
                assert meta(again)["outcome"] == "replayed"
                assert again.structured_content == first.structured_content
            # The run did not end: a tool's finish is not the run's.
            later = await client.call_tool("add_note", {"text": "after finish"})
            assert meta(later)["outcome"] == "executed", text(later)

    anyio.run(main)
    assert [c for c in calls(setup)] == [
        {"summary": "job 7"},
        {"reason": "job 8"},
        {"suite": "unit"},
    ]
    assert committed_kinds(setup) == ["mcp:finish", "mcp:cancel", "mcp:tests.run", "add_note"]
