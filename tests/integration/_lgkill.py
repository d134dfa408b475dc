"""One process of a LangGraph SIGKILL-after-effect trial (see test_langgraph_guarded_kill.py).

    python -m tests.integration._lgkill MODE PHASE URL TITLE DIR

A two-node graph: ``agent`` emits the model's turn (one ``open_ticket``
tool call), a ``ToolNode`` runs it, and the tool's effect is a real
``POST /tickets`` to the counting service at URL (bench/_compare_kill.py).
PHASE ``first`` dies by SIGKILL right after the service answered; PHASE
``resume`` is a new process that resumes the graph from its saver.

MODE ``control``: plain ``SqliteSaver`` and a tool that POSTs itself (the
way a LangGraph user writes it). MODE ``tether``: ``TetherSaver`` and the
tool guarded by tether (HttpEffect sends it under a key persisted first),
the graph run inside ``tether.effects.run``; the kill is tether's own
``CrashPlan(EFFECT_SENT, mode="kill")``.
"""

from __future__ import annotations

import json
import os
import sqlite3
import sys
from pathlib import Path
from typing import Any

from bench._compare_kill import post_ticket, ticket_runtime
from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode

from tests.integration._zygote import serve
from tether import effects
from tether.adapters import REFERENCE_PROFILE, HttpEffect
from tether.crypto import Keyring
from tether.integrations.langgraph import TetherSaver, guard
from tether.store import open_store

RUN_ID = "ticket-run"
CONFIG: Any = {"configurable": {"thread_id": RUN_ID}}


def open_ticket(title: str) -> str:
    """Open a support ticket with this title."""
    raise NotImplementedError  # the control and the guarded tool each say what it does


def graph_with(tool: Any, saver: Any, title: str) -> Any:
    def agent(state: MessagesState) -> dict[str, Any]:
        turn = {
            "name": "open_ticket",
            "args": {"title": title},
            "id": "call-1",
            "type": "tool_call",
        }
        return {"messages": [AIMessage(content="", tool_calls=[turn])]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("tools", ToolNode([tool]))
    builder.add_edge(START, "agent")
    builder.add_edge("agent", "tools")
    builder.add_edge("tools", END)
    return builder.compile(checkpointer=saver)


def control(first: bool, url: str, title: str, where: Path) -> Any:
    @tool("open_ticket")
    def plain(title: str) -> str:
        """Open a support ticket with this title."""
        post_ticket(url, title)  # SIGKILLs this process right after the send when armed
        return "opened"

    conn = sqlite3.connect(where / "lg.sqlite", check_same_thread=False)
    graph = graph_with(plain, SqliteSaver(conn), title)
    result = graph.invoke({"messages": []} if first else None, CONFIG, durability="sync")
    conn.close()
    return json.dumps(result["messages"][-1].content)


def guarded(first: bool, url: str, title: str, where: Path) -> Any:
    keyring = Keyring.from_file(where / "keyring.json")
    url_of_store = f"sqlite:///{where / 'tether.sqlite'}"
    tool = guard(open_ticket, kind="http.post", to_effect=lambda a: ("tickets", {"json": dict(a)}))
    with (
        HttpEffect(url, profile=REFERENCE_PROFILE) as http,
        TetherSaver.from_url(url_of_store, keyring) as saver,
    ):
        store = open_store(url_of_store)
        runtime = ticket_runtime(http, store, keyring, "lg-kill", armed=first)
        graph = graph_with(tool, saver, title)
        with effects.run(runtime, RUN_ID):
            result = graph.invoke({"messages": []} if first else None, CONFIG, durability="sync")
        store.close()
    return result["messages"][-1].content  # the guarded tool's answer, JSON already


def phase(mode: str, name: str, url: str, title: str, where: str) -> int:
    """Run one phase of a trial in this process; its answer on stdout. The exit code."""
    first = name == "first"
    if first:
        os.environ["COMPARE_ARMED"] = "1"  # the control's tool kills itself after the send
    else:
        os.environ.pop("COMPARE_ARMED", None)
    shown = (control if mode == "control" else guarded)(first, url, title, Path(where))
    if first:
        print("the armed child was not killed", file=sys.stderr)
        return 3
    print(shown)
    return 0


def redirected(job: dict[str, Any]) -> int:
    """One trial phase in a forked child, its stdout and stderr in files named after the phase.

    Every trial's process is forked by ``_zygote.serve`` after the imports and
    before anything is opened: the seconds LangGraph and tether take to
    import are paid once per test, not once per process.
    """
    base = Path(job["where"]) / job["phase"]
    for fd, suffix in ((1, ".out"), (2, ".err")):
        sink = os.open(f"{base}{suffix}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(sink, fd)
        os.close(sink)
    return phase(job["mode"], job["phase"], job["url"], job["title"], job["where"])


def main(argv: list[str]) -> int:
    if argv == ["zygote"]:
        serve(redirected)
        return 0
    return phase(*argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
