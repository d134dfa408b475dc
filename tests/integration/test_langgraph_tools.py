"""Guarded tools in real LangGraph graphs: effects through the run, people through interrupt()."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langgraph.prebuilt", reason="needs the [langgraph] extra")

from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode
from langgraph.types import Command

from tests.conformance._pg import fresh_schema, in_schema, pg_dsn
from tether import effects
from tether.core import (
    ApprovalRequiredError,
    NotInRunError,
    Phase,
    RunTerminalError,
    SpecError,
)
from tether.crypto import Signer, TrustRoots
from tether.integrations.langgraph import GuardedTool, TetherSaver, guard, sign_answer
from tether.runtime import CrashPlan, CrashPoint, Runtime, SimulatedCrash
from tether.store import PostgresStore, SQLiteStore
from tether.testing import Sandbox

from ..conftest import World, make_policy, make_task

ALICE = Signer.generate("alice", "approver")
MALLORY = Signer.generate("mallory", "approver")
REVIEWER = Signer.generate("rev", "reviewer")
TRUST = TrustRoots.of(ALICE.trust_root(), REVIEWER.trust_root())
GUARDED = {"file.write": {"risk": "low", "permission": "workspace.write", "needs_approval": True}}


def save_note(path: str, content: str) -> str:
    """Save a note to the workspace."""
    raise AssertionError("a guarded tool's own body never runs")


SAVE = guard(save_note, kind="file.write")


def calls(*args: dict[str, Any]) -> AIMessage:
    """The model's turn: one tool call per args dict (what an LLM would emit)."""
    return AIMessage(
        content="",
        tool_calls=[
            {"name": "save_note", "args": a, "id": f"call-{i}", "type": "tool_call"}
            for i, a in enumerate(args)
        ],
    )


def tool_graph(saver: Any = None, *, is_async: bool = False) -> Any:
    """agent -> tools (a ToolNode of the guarded tool) -> END; the agent's turn is in the input."""
    builder = StateGraph(MessagesState)
    if is_async:

        async def agent(state: MessagesState) -> dict[str, Any]:
            return {}

        builder.add_node("agent", agent)
    else:
        builder.add_node("agent", lambda state: {})
    builder.add_node("tools", ToolNode([SAVE]))
    builder.add_edge(START, "agent")
    builder.add_edge("agent", "tools")
    builder.add_edge("tools", END)
    return builder.compile(checkpointer=saver)


def thread(tid: str = "t1") -> Any:
    return {"configurable": {"thread_id": tid}}


def tool_messages(result: dict[str, Any]) -> list[str]:
    return [m.content for m in result["messages"] if isinstance(m, ToolMessage)]


@pytest.fixture
def saver(tmp_path: Path, world: World) -> Iterator[TetherSaver]:
    """TetherSaver on a real SQLite file (the same file the run's store uses)."""
    store = SQLiteStore(world.db)
    yield TetherSaver(store, world.keyring)
    store.close()


def loop(world: World, crash: CrashPlan | None = None) -> Runtime:
    return world.runtime(None, crash=crash, trust=TRUST)


def test_a_guarded_tool_in_a_toolnode_sends_once_and_a_rerun_gets_the_receipt(
    world: World,
) -> None:
    """The ToolNode's call goes through the run; the same call re-executed is replayed, not sent."""
    graph = tool_graph()
    note = {"path": "notes.txt", "content": "hello\n"}
    with effects.run(loop(world), "r1"):
        first = graph.invoke({"messages": [calls(note)]})
        again = graph.invoke({"messages": [calls(note)]})
    sent, replayed = json.loads(tool_messages(first)[0]), json.loads(tool_messages(again)[0])
    assert (sent["outcome"], replayed["outcome"]) == ("executed", "replayed")
    assert replayed["result"] == sent["result"] and sent["result"]["path"] == "notes.txt"
    assert world.sandbox.write_count() == 1
    assert world.sandbox.files["notes.txt"] == "hello\n"


@pytest.mark.parametrize("mode", ["invoke", "stream", "ainvoke", "astream"])
def test_the_run_reaches_parallel_tool_calls_in_every_execution_mode(
    world: World, mode: str
) -> None:
    """Two tool calls of one turn, run by ToolNode in parallel, both act on the context's run."""
    graph = tool_graph(is_async=mode.startswith("a"))
    turn = {
        "messages": [
            calls(
                {"path": "notes.txt", "content": "one\n"},
                {"path": "src/two.txt", "content": "two\n"},
            )
        ]
    }

    async def drive_async() -> None:
        if mode == "ainvoke":
            await graph.ainvoke(turn)
        else:
            async for _ in graph.astream(turn):
                pass

    with effects.run(loop(world), "r1"):
        if mode == "invoke":
            graph.invoke(turn)
        elif mode == "stream":
            for _ in graph.stream(turn):
                pass
        else:
            asyncio.run(drive_async())
    assert world.sandbox.files["notes.txt"] == "one\n"
    assert world.sandbox.files["src/two.txt"] == "two\n"
    assert world.sandbox.write_count() == 2


def test_a_plain_node_may_invoke_a_guarded_tool_sync_and_async(world: World) -> None:
    """A node calling tool.invoke or tool.ainvoke itself acts on the context's run too."""

    async def writer(state: MessagesState) -> dict[str, Any]:
        done = await SAVE.ainvoke({"path": "src/a.txt", "content": "a\n"})
        again = SAVE.invoke({"path": "src/a.txt", "content": "a\n"})
        return {"messages": [AIMessage(content=f"{done['outcome']} {again['outcome']}")]}

    builder = StateGraph(MessagesState)
    builder.add_node("writer", writer)
    builder.add_edge(START, "writer")
    graph = builder.compile()
    with effects.run(loop(world), "r1"):
        result = asyncio.run(graph.ainvoke({"messages": []}))
    assert result["messages"][-1].content == "executed replayed"
    assert world.sandbox.write_count() == 1


def test_a_guarded_tool_outside_a_run_is_refused_and_sends_nothing(world: World) -> None:
    """Without `effects.run` around the graph the tool raises NotInRunError; nothing is sent."""
    with pytest.raises(NotInRunError):
        tool_graph().invoke({"messages": [calls({"path": "notes.txt", "content": "x"})]})
    assert world.sandbox.write_count() == 0


def test_guard_keeps_a_tools_schema_and_checks_its_target() -> None:
    """The wrapper shows the model the wrapped tool's name and schema; a bad target fails typed."""

    @tool
    def email(to: str, subject: str, body: str = "") -> str:
        """Send an email."""
        return "sent"

    guarded = guard(email, kind="email.send", target="to")
    assert isinstance(guarded, GuardedTool)
    assert guarded.name == "email" and guarded.description == "Send an email."
    assert (
        guarded.tool_call_schema.model_json_schema() == email.tool_call_schema.model_json_schema()
    )
    with pytest.raises(SpecError):
        guard(email, kind="email.send", target="cc")
    with pytest.raises(SpecError):
        guard(email, kind="")
    mapped = guard(email, kind="http.post", to_effect=lambda a: ("mail", {"json": a}))
    assert mapped._call_of((), {"to": "a@b", "subject": "s"}) == (
        "mail",
        {"json": {"to": "a@b", "subject": "s"}},
    )
    broken = guard(email, kind="http.post", to_effect=lambda a: a)  # type: ignore[arg-type,return-value]
    with pytest.raises(SpecError):
        broken._call_of((), {"to": "a@b", "subject": "s"})


# -- people: approvals and reviews as interrupts ---------------------------------------------


def approved(world: World, ask: dict[str, Any], signer: Signer = ALICE) -> dict[str, Any]:
    """What a person's tool does with the interrupt: sign its request (on the test's clock)."""
    return sign_answer(ask, signer, now=world.clock.now())


def interrupts(result: dict[str, Any]) -> list[dict[str, Any]]:
    return [i.value for i in result.get("__interrupt__", [])]


@pytest.mark.parametrize("is_async", [False, True])
def test_an_approval_interrupts_the_graph_and_a_signed_resume_sends_once(
    world: World, saver: TetherSaver, is_async: bool
) -> None:
    """The interrupt carries the request; Command(resume=signed) in a new run block sends once."""
    world.policy = make_policy(kinds=GUARDED)
    graph = tool_graph(saver, is_async=is_async)

    def go(value: Any) -> dict[str, Any]:
        with effects.run(loop(world), "r1"):
            if is_async:
                return dict(asyncio.run(graph.ainvoke(value, thread())))
            return dict(graph.invoke(value, thread()))

    stopped = go({"messages": [calls({"path": "notes.txt", "content": "hello\n"})]})
    (ask,) = interrupts(stopped)
    assert ask["tether"] == "approval_required" and ask["refused"] is None
    assert ask["request"]["run_id"] == "r1" and ask["request"]["intent_digest"]
    assert world.sandbox.write_count() == 0

    done = go(Command(resume=approved(world, ask)))
    assert "__interrupt__" not in done
    assert '"sha256:' in tool_messages(done)[0]  # the receipt's result reached the model
    assert world.sandbox.write_count() == 1
    assert world.sandbox.files["notes.txt"] == "hello\n"


def test_a_refused_document_re_interrupts_with_the_reason_and_a_good_one_then_sends(
    world: World, saver: TetherSaver
) -> None:
    """An untrusted signer's approval is refused visibly and sends nothing; a trusted one then sends once."""
    world.policy = make_policy(kinds=GUARDED)
    graph = tool_graph(saver)
    with effects.run(loop(world), "r1"):
        stopped = graph.invoke(
            {"messages": [calls({"path": "notes.txt", "content": "hello\n"})]}, thread()
        )
    (ask,) = interrupts(stopped)
    with effects.run(loop(world), "r1"):
        refused = graph.invoke(Command(resume=approved(world, ask, MALLORY)), thread())
    (again,) = interrupts(refused)
    assert again["tether"] == "approval_required" and again["request"] == ask["request"]
    assert again["refused"] and "mallory" in again["refused"]
    assert world.sandbox.write_count() == 0
    with effects.run(loop(world), "r1"):
        done = graph.invoke(Command(resume=approved(world, ask)), thread())
    assert "__interrupt__" not in done
    assert world.sandbox.write_count() == 1


def test_two_approvals_in_one_node_each_send_once(world: World, saver: TetherSaver) -> None:
    """A node with two guarded writes is resumed twice; each earlier answer is skipped, not reused."""
    world.policy = make_policy(kinds=GUARDED)

    def writer(state: MessagesState) -> dict[str, Any]:
        one = SAVE.invoke({"path": "notes.txt", "content": "one\n"})
        two = SAVE.invoke({"path": "src/two.txt", "content": "two\n"})
        return {"messages": [AIMessage(content=f"{one['outcome']} {two['outcome']}")]}

    builder = StateGraph(MessagesState)
    builder.add_node("writer", writer)
    builder.add_edge(START, "writer")
    graph = builder.compile(checkpointer=saver)
    with effects.run(loop(world), "r1"):
        result = graph.invoke({"messages": []}, thread())
    answers = 0
    while asks := interrupts(result):
        (ask,) = asks
        answers += 1
        with effects.run(loop(world), "r1"):
            result = graph.invoke(Command(resume=approved(world, ask)), thread())
    assert answers == 2
    assert world.sandbox.write_count() == 2
    assert world.sandbox.files == {"notes.txt": "one\n", "src/two.txt": "two\n"}


def test_a_call_blocked_behind_another_write_shows_that_write_not_its_own_name(
    world: World, saver: TetherSaver
) -> None:
    """The interrupt names the waiting write (kind, target, args), not the tool blocked behind it."""
    world.policy = make_policy(kinds=GUARDED)

    def writer(state: MessagesState) -> dict[str, Any]:
        with contextlib.suppress(ApprovalRequiredError):  # notes.txt now waits for a person
            effects.call("file.write", "notes.txt", {"content": "first\n"})
        SAVE.invoke({"path": "src/two.txt", "content": "two\n"})
        return {}

    builder = StateGraph(MessagesState)
    builder.add_node("writer", writer)
    builder.add_edge(START, "writer")
    graph = builder.compile(checkpointer=saver)
    with effects.run(loop(world), "r1"):
        (ask,) = interrupts(graph.invoke({"messages": []}, thread()))
    assert ask["for_this_call"] is False and ask["tool"] is None
    assert (ask["kind"], ask["target"]) == ("file.write", "notes.txt")
    assert ask["args"]["content"] == "first\n"
    assert world.sandbox.write_count() == 0


def test_outside_a_graph_a_needed_approval_is_the_typed_error(world: World) -> None:
    """Invoked with no graph around it, the guarded tool raises what effects.call raises."""
    world.policy = make_policy(kinds=GUARDED)
    with effects.run(loop(world), "r1"), pytest.raises(ApprovalRequiredError):
        SAVE.invoke({"path": "notes.txt", "content": "hello\n"})
    assert world.sandbox.write_count() == 0


def blind_world(world: World) -> None:
    """An adapter that can neither deduplicate nor be asked what it did."""
    world.sandbox = Sandbox(
        {"notes.txt": "draft\n"}, instance_id="sbx-1", idempotent=False, queryable=False
    )
    world.task = make_task(world.sandbox.environment().state_fingerprint)


def decided(world: World, ask: dict[str, Any], decision: str) -> dict[str, Any]:
    return sign_answer(ask, REVIEWER, decision=decision, now=world.clock.now())


def crashed_blind_write(world: World, graph: Any) -> dict[str, Any]:
    """The write sent, the process 'dies' before the receipt; resumed, the run needs review."""
    turn = {"messages": [calls({"path": "notes.txt", "content": "hello\n"})]}
    with (
        pytest.raises(SimulatedCrash),
        effects.run(loop(world, CrashPlan(CrashPoint.EFFECT_SENT)), "r1"),
    ):
        graph.invoke(turn, thread())
    assert world.sandbox.write_count() == 1
    with effects.run(loop(world), "r1"):
        return dict(graph.invoke(None, thread()))


def test_an_unknown_outcome_interrupts_for_review_and_an_abort_ends_the_run(
    world: World, saver: TetherSaver
) -> None:
    """The interrupt names the case; a signed abort is applied and the write is never re-sent."""
    blind_world(world)
    graph = tool_graph(saver)
    stopped = crashed_blind_write(world, graph)
    (ask,) = interrupts(stopped)
    assert ask["tether"] == "needs_review" and ask["case_id"] and ask["reason"]
    assert ask["request"]["case_id"] == ask["case_id"]
    assert world.sandbox.write_count() == 1
    with effects.run(loop(world), "r1") as run, pytest.raises(RunTerminalError):
        graph.invoke(Command(resume=decided(world, ask, "abort")), thread())
    assert run.phase is Phase.FAILED
    assert world.sandbox.write_count() == 1


def test_a_replan_closes_the_case_and_the_re_executed_call_is_still_not_resent(
    world: World, saver: TetherSaver
) -> None:
    """After a signed replan the same write, proposed again, opens a new case instead of a resend."""
    blind_world(world)
    graph = tool_graph(saver)
    (ask,) = interrupts(crashed_blind_write(world, graph))
    with effects.run(loop(world), "r1") as run:
        again = graph.invoke(Command(resume=decided(world, ask, "replan")), thread())
        assert run.phase is Phase.NEEDS_REVIEW
    (second,) = interrupts(again)
    assert second["tether"] == "needs_review" and second["refused"] is None
    assert second["case_id"] != ask["case_id"] and second["reason"] == "replay_of_unknown_effect"
    assert world.sandbox.write_count() == 1


@pytest.mark.postgres
def test_an_approval_interrupt_and_its_resume_on_postgresql(world: World) -> None:
    """The same approval round trip with the run and the graph's checkpoints in PostgreSQL."""
    dsn = pg_dsn()  # skips without a server; TETHER_REQUIRE_PG=1 makes that a failure
    world.policy = make_policy(kinds=GUARDED)
    with fresh_schema(dsn) as schema:
        stores = [PostgresStore(in_schema(dsn, schema), max_connections=2) for _ in range(2)]
        try:
            graph = tool_graph(TetherSaver(stores[0], world.keyring))

            def go(value: Any) -> dict[str, Any]:
                with effects.run(world.runtime(None, trust=TRUST, store=stores[1]), "r1"):
                    return dict(graph.invoke(value, thread()))

            (ask,) = interrupts(go({"messages": [calls({"path": "notes.txt", "content": "pg\n"})]}))
            assert ask["tether"] == "approval_required"
            done = go(Command(resume=approved(world, ask)))
            again = go(None)  # the finished thread, run again: nothing more is sent
        finally:
            for store in stores:
                store.close()
    assert "__interrupt__" not in done and "__interrupt__" not in again
    assert world.sandbox.write_count() == 1
    assert world.sandbox.files["notes.txt"] == "pg\n"


def test_sign_answer_refuses_a_review_without_a_known_decision() -> None:
    """A review answer needs replan, abort or accept; anything else is refused before signing."""
    ask = {"tether": "needs_review", "request": {"kind": "review_decision"}}
    for decision in (None, "approve"):
        with pytest.raises(SpecError, match="decision"):
            sign_answer(ask, ALICE, decision=decision)
