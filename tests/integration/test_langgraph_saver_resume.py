"""A real LangGraph StateGraph on TetherSaver, stopped in one process and resumed in another."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langgraph.graph", reason="needs the [langgraph] extra")

from tether.crypto import Keyring

CHILD = """
import json, operator, sys
from typing import Annotated, TypedDict

from langgraph.graph import END, START, StateGraph

from tether.crypto import Keyring
from tether.integrations.langgraph import TetherSaver


class State(TypedDict):
    topic: str
    steps: Annotated[list[str], operator.add]
    draft: str


def research(state: State) -> dict:
    return {"steps": ["research"], "draft": f"notes on {state['topic']}"}


def write(state: State) -> dict:
    return {"steps": ["write"], "draft": state["draft"].upper()}


builder = StateGraph(State)
builder.add_node("research", research)
builder.add_node("write", write)
builder.add_edge(START, "research")
builder.add_edge("research", "write")
builder.add_edge("write", END)

mode, url, keyfile = sys.argv[1:]
with TetherSaver.from_url(url, Keyring.from_file(keyfile)) as saver:
    graph = builder.compile(checkpointer=saver, interrupt_before=["write"])
    config = {"configurable": {"thread_id": "smoke"}}
    if mode == "start":
        graph.invoke({"topic": "tides", "steps": [], "draft": ""}, config)
    elif mode == "resume":
        graph.invoke(None, config)
    snapshot = graph.get_state(config)
    history = len(list(graph.get_state_history(config)))
    print(json.dumps({"values": snapshot.values, "next": list(snapshot.next), "history": history}))
"""


def _child(mode: str, url: str, keyfile: Path) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, mode, url, str(keyfile)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_a_graph_stopped_in_one_process_resumes_in_another_with_the_same_state(
    tmp_path: Path,
) -> None:
    """A two-node graph interrupted in one process finishes in a second; a third reads that state."""
    keyfile = tmp_path / "keyring.json"
    Keyring.generate("k1").write_file(keyfile)
    url = f"sqlite:///{tmp_path / 'graph.sqlite'}"

    started = _child("start", url, keyfile)
    assert started["next"] == ["write"]
    assert started["values"] == {"topic": "tides", "steps": ["research"], "draft": "notes on tides"}

    resumed = _child("resume", url, keyfile)
    assert resumed["next"] == []
    assert resumed["values"] == {
        "topic": "tides",
        "steps": ["research", "write"],
        "draft": "NOTES ON TIDES",
    }

    assert _child("show", url, keyfile) == resumed
