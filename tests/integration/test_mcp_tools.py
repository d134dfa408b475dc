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

from tests._plain import plain
from tests.integration._mcp_kit import Setup, connected, document, text
from tether.cli import main as tether_main
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


BIG = 2**60 + 1  # past 2**53: canonical JSON (RFC 8785) cannot write it exactly


def test_an_integer_past_2_53_reaches_the_upstream_exactly_and_is_one_effect(setup: Setup) -> None:
    """big_number(2**60+1): the upstream gets the exact integer, the agent the exact answer, and asked again (after a restart) the recorded one."""

    async def first() -> Any:
        async with connected(setup.gateway()) as client:
            return await client.call_tool("big_number", {"n": BIG})

    async def later() -> tuple[Any, Any]:
        async with connected(setup.gateway()) as client:
            again = await client.call_tool("big_number", {"n": BIG})
            other = await client.call_tool("big_number", {"n": BIG + 1})
            return again, other

    done = anyio.run(first)
    assert not done.is_error, text(done)
    assert done.structured_content == {"n": BIG, "next": BIG + 1}
    assert meta(done)["outcome"] == "executed"
    again, other = anyio.run(later)
    assert meta(again)["outcome"] == "replayed"
    assert again.structured_content == {"n": BIG, "next": BIG + 1}  # exact, from the record
    assert meta(other)["outcome"] == "executed"  # another integer is another effect
    assert other.structured_content == {"n": BIG + 1, "next": BIG + 2}
    assert calls(setup, "big_number") == [{"n": BIG}, {"n": BIG + 1}]
    # The intent carries the arguments as their exact JSON text; the receipt, the answer's
    # digest (kept apart, exact).
    store = open_store(setup.store)
    try:
        view = open_run(store, setup.run_id, keyring=Keyring.from_file(setup.keyring))
    finally:
        store.close()
    intended = [e for e in view.ledger if e.status.value == "intended"]
    assert intended[0].payload == {"arguments": f'{{"n":{BIG}}}'}  # exact JSON text
    committed = [e for e in view.ledger if e.status.value == "committed"]
    result = committed[0].receipt["result"]["tether_kept_apart"]
    assert result["why"] == "holds integers beyond 2**53" and result["sha256"].startswith("sha256:")


def test_a_read_answering_an_integer_past_2_53_is_passed_on_exactly(setup: Setup) -> None:
    """A read whose answer holds 2**60+1: the agent gets it exactly each time, and each time the upstream is asked."""
    setup.policy = {"reads": ["count_notes", "big_number"]}

    async def main() -> list[Any]:
        async with connected(setup.gateway()) as client:
            return [await client.call_tool("big_number", {"n": BIG}) for _ in range(2)]

    answers = anyio.run(main)
    for answer in answers:
        assert not answer.is_error, text(answer)
        assert meta(answer)["outcome"] == "observed"
        assert answer.structured_content == {"n": BIG, "next": BIG + 1}
    assert calls(setup, "big_number") == [{"n": BIG}, {"n": BIG}]


def test_a_replayed_answer_over_16_kib_is_given_back_whole_under_its_output_schema(
    setup: Setup,
) -> None:
    """report(400) answers over 16 KiB under an output schema: asked again after a restart, the client gets exactly that answer, which its schema check accepts."""

    async def session() -> Any:
        async with connected(setup.gateway()) as client:
            tool = next(t for t in (await client.list_tools()).tools if t.name == "report")
            assert tool.output_schema is not None
            return await client.call_tool("report", {"lines": 400})

    first = anyio.run(session)
    again = anyio.run(session)  # a new gateway process: nothing of the first answer in memory
    assert not first.is_error and not again.is_error, text(again)
    assert len(json.dumps(first.structured_content)) > 16_384
    assert meta(first)["outcome"] == "executed" and meta(again)["outcome"] == "replayed"
    assert again.structured_content == first.structured_content
    assert [c.model_dump() for c in again.content] == [c.model_dump() for c in first.content]
    assert calls(setup, "report") == [{"lines": 400}]


def test_a_sensitive_answer_over_16_kib_is_not_stored_and_its_replay_says_so(setup: Setup) -> None:
    """A sensitive report: its text is never stored, and its replay is an error answer saying why, which the output schema does not bind."""
    setup.policy = {"reads": ["count_notes"], "tools": {"report": {"sensitive": True}}}

    async def session() -> Any:
        async with connected(setup.gateway()) as client:
            return await client.call_tool("report", {"lines": 400})

    first = anyio.run(session)
    again = anyio.run(session)
    assert not first.is_error and first.structured_content is not None
    assert again.is_error and meta(again)["outcome"] == "replayed"
    assert meta(again)["answer_kept"] is False
    assert "not kept whole" in text(again)
    assert calls(setup, "report") == [{"lines": 400}]
    plain(setup.base / "tether.sqlite")  # the bytes as sealed, not as deflated
    with sqlite3.connect(setup.base / "tether.sqlite") as con:
        bodies = [bytes(row[0]) for row in con.execute("SELECT body FROM tether_blobs")]
    assert not any(b"line 00001" in body for body in bodies)


def test_a_call_made_again_after_another_is_answered_from_the_record_until_a_fork(
    setup: Setup, tmp_path: Path
) -> None:
    """A, B, A on a tool the policy declares a collection: the second A is the first's recorded answer (one row); a reviewer's signed fork lets A through once more, then it is replayed again."""
    setup.policy = {"reads": ["count_notes"], "tools": {"add_note": {"targets": "collection"}}}
    keys = tmp_path / "keys"
    made = tether_main(["keys", "new", "--role", "reviewer", "--id", "rita", "--out", str(keys)])
    assert made == 0
    setup.trust = keys / "rita.trust.json"

    def fork(effect: str) -> int:
        return tether_main(
            [
                "fork",
                setup.run_id,
                effect,
                "--store",
                setup.store,
                "--key",
                str(keys / "rita.key"),
                "--yes",
            ]
        )

    async def main() -> None:
        async with connected(setup.gateway()) as client:
            a = await client.call_tool("add_note", {"text": "A"})
            b = await client.call_tool("add_note", {"text": "B"})
            a_again = await client.call_tool("add_note", {"text": "A"})
            assert [meta(x)["outcome"] for x in (a, b, a_again)] == [
                "executed",
                "executed",
                "replayed",
            ]
            assert a_again.structured_content == a.structured_content == {"id": 1, "text": "A"}
            assert setup.rows() == 2
            assert await anyio.to_thread.run_sync(fork, meta(a)["effect"]) == 0
            forked = await client.call_tool("add_note", {"text": "A"})
            assert meta(forked)["outcome"] == "executed", text(forked)
            assert forked.structured_content == {"id": 3, "text": "A"}
            once_more = await client.call_tool("add_note", {"text": "A"})
            assert meta(once_more)["outcome"] == "replayed"
            assert once_more.structured_content == {"id": 3, "text": "A"}

    anyio.run(main)
    assert setup.rows() == 3


def test_a_call_made_again_after_another_on_a_tool_declared_unknown_waits_for_a_person(
    setup: Setup,
) -> None:
    """A, B, A on a tool the policy declares unknown: the third is neither sent nor answered from the first, a person decides (repeat_or_revert)."""
    setup.policy = {"reads": ["count_notes"], "tools": {"add_note": {"targets": "unknown"}}}

    async def main() -> None:
        async with connected(setup.gateway()) as client:
            for note in ("A", "B"):
                done = await client.call_tool("add_note", {"text": note})
                assert meta(done)["outcome"] == "executed", text(done)
            again = await client.call_tool("add_note", {"text": "A"})
            assert again.is_error
            assert meta(again)["waits_for"] == "review"
            assert meta(again)["reason"] == "repeat_or_revert"

    anyio.run(main)
    assert setup.rows() == 2


def test_a_call_made_again_after_another_on_a_declared_state_tool_is_sent_again(
    setup: Setup,
) -> None:
    """A, B, A on a tool the policy declares a state: the third is sent (the world is set back to A), and A once more right after is replayed."""
    setup.policy = {"reads": ["count_notes"], "tools": {"add_note": {"targets": "state"}}}

    async def main() -> None:
        async with connected(setup.gateway()) as client:
            outcomes = []
            for note in ("A", "B", "A", "A"):
                done = await client.call_tool("add_note", {"text": note})
                outcomes.append(meta(done)["outcome"])
            assert outcomes == ["executed", "executed", "executed", "replayed"]

    anyio.run(main)
    assert setup.rows() == 3  # A, B, and A written again
