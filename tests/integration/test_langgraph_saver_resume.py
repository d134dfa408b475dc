"""A real LangGraph StateGraph on TetherSaver, stopped in one process and resumed in another."""

from __future__ import annotations

import json
import operator
import subprocess
import sys
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest

pytest.importorskip("langgraph.graph", reason="needs the [langgraph] extra")

from langgraph.graph import END, START, StateGraph

from tether.crypto import Keyring
from tether.integrations.langgraph import TetherSaver, ThreadConflictError


class Steps(TypedDict):
    steps: Annotated[list[str], operator.add]


def first(state: Steps) -> dict[str, list[str]]:
    return {"steps": ["first"]}


def second(state: Steps) -> dict[str, list[str]]:
    return {"steps": ["second"]}


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


def test_replaying_a_graph_from_an_older_checkpoint_is_refused_and_changes_nothing(
    tmp_path: Path,
) -> None:
    """Time travel reads history, but re-running from an old checkpoint is a typed conflict."""
    builder = StateGraph(Steps)
    builder.add_node("first", first)
    builder.add_node("second", second)
    builder.add_edge(START, "first")
    builder.add_edge("first", "second")
    builder.add_edge("second", END)
    url = f"sqlite:///{tmp_path / 'graph.sqlite'}"
    with TetherSaver.from_url(url, Keyring.generate("k1")) as saver:
        graph = builder.compile(checkpointer=saver)
        config: Any = {"configurable": {"thread_id": "t"}}
        assert graph.invoke({"steps": []}, config) == {"steps": ["first", "second"]}
        history = list(graph.get_state_history(config))
        assert [h.next for h in history] == [(), ("second",), ("first",), ("__start__",)]
        assert history[2].values == {"steps": []}  # an older state, read by id
        with pytest.raises(ThreadConflictError) as caught:
            graph.invoke(None, history[2].config)
        assert caught.value.older
        assert graph.get_state(config).values == {"steps": ["first", "second"]}
        assert len(list(graph.get_state_history(config))) == len(history)


def test_a_node_that_failed_twice_with_different_errors_still_recovers(tmp_path: Path) -> None:
    """LangGraph re-records a retried task's error under the same key; the saver accepts that."""
    failures = iter(["first failure", "second failure"])

    def flaky(state: Steps) -> dict[str, list[str]]:
        message = next(failures, None)
        if message is not None:
            raise RuntimeError(message)
        return {"steps": ["done"]}

    builder = StateGraph(Steps)
    builder.add_node("flaky", flaky)
    builder.add_edge(START, "flaky")
    builder.add_edge("flaky", END)
    url = f"sqlite:///{tmp_path / 'graph.sqlite'}"
    with TetherSaver.from_url(url, Keyring.generate("k1")) as saver:
        graph = builder.compile(checkpointer=saver)
        config: Any = {"configurable": {"thread_id": "t"}}
        with pytest.raises(RuntimeError, match="first failure"):
            graph.invoke({"steps": []}, config)
        with pytest.raises(RuntimeError, match="second failure"):
            graph.invoke(None, config)
        assert graph.invoke(None, config) == {"steps": ["done"]}


class Both(TypedDict):
    steps: Annotated[list[str], operator.add]


def _side_by_side(effects: list[str], fail: list[bool]) -> Any:
    """Two nodes in one super-step: ``sent`` makes an effect, ``flaky`` fails while ``fail[0]``."""

    def sent(state: Both) -> dict[str, list[str]]:
        effects.append("sent")  # the real-world effect a resume must not repeat
        return {"steps": ["sent"]}

    def flaky(state: Both) -> dict[str, list[str]]:
        if fail[0]:
            raise RuntimeError("flaky failed")
        return {"steps": ["flaky"]}

    builder = StateGraph(Both)
    builder.add_node("sent", sent)
    builder.add_node("flaky", flaky)
    builder.add_edge(START, "sent")
    builder.add_edge(START, "flaky")
    builder.add_edge("sent", END)
    builder.add_edge("flaky", END)
    return builder


def test_a_resume_skips_a_task_whose_pending_write_is_stored(tmp_path: Path) -> None:
    """A failed super-step keeps the finished node's write; the resume does not run it again."""
    effects: list[str] = []
    fail = [True]
    url = f"sqlite:///{tmp_path / 'graph.sqlite'}"
    with TetherSaver.from_url(url, Keyring.generate("k1")) as saver:
        graph = _side_by_side(effects, fail).compile(checkpointer=saver)
        config: Any = {"configurable": {"thread_id": "t"}}
        with pytest.raises(RuntimeError, match="flaky failed"):
            graph.invoke({"steps": []}, config)
        fail[0] = False
        assert sorted(graph.invoke(None, config)["steps"]) == ["flaky", "sent"]
    assert effects == ["sent"]


@pytest.mark.parametrize("how", ["deleted", "all_deleted"])
def test_a_deleted_pending_write_is_refused_not_run_again(tmp_path: Path, how: str) -> None:
    """The finished node's pending write deleted: the saver refuses the thread, the node never reruns."""
    import sqlite3

    from tether.integrations.langgraph import CheckpointRollbackError, PendingWriteMissingError

    effects: list[str] = []
    fail = [True]
    db = tmp_path / "graph.sqlite"
    keyring = Keyring.generate("k1")
    config: Any = {"configurable": {"thread_id": "t"}}
    with TetherSaver.from_url(f"sqlite:///{db}", keyring) as saver:
        graph = _side_by_side(effects, fail).compile(checkpointer=saver)
        with pytest.raises(RuntimeError, match="flaky failed"):
            graph.invoke({"steps": []}, config)
    with sqlite3.connect(db) as conn:  # outside the saver, as a cleanup job or a person would
        (head,) = conn.execute("SELECT checkpoint_id FROM tether_lg_marks").fetchone()
        rows = conn.execute(
            "SELECT idx FROM tether_lg_writes WHERE checkpoint_id = ? ORDER BY idx", (head,)
        ).fetchall()
        assert rows == [(-1,), (0,)]  # the failed node's error, the finished node's write
        only = "" if how == "all_deleted" else " AND idx >= 0"
        conn.execute(f"DELETE FROM tether_lg_writes WHERE checkpoint_id = ?{only}", (head,))
    fail[0] = False
    with TetherSaver.from_url(f"sqlite:///{db}", keyring) as saver:
        graph = _side_by_side(effects, fail).compile(checkpointer=saver)
        with pytest.raises(PendingWriteMissingError) as caught:
            graph.invoke(None, config)
    assert isinstance(caught.value, CheckpointRollbackError) and caught.value.found == "gone"
    assert effects == ["sent"]  # never sent again
