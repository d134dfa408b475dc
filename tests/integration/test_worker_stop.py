"""A worker told to stop in the middle of a run: it finishes the step, lets go, and goes no further."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.conftest import ScriptedAgent, finish, make_policy, make_task, write
from tether.core import Observation, Phase
from tether.crypto import Keyring
from tether.runtime import AgentContext, Decision, Runtime, Worker
from tether.store import SQLiteStore
from tether.testing import Sandbox

WRITES = 6
HELD_AT = 2  # the agent blocks while deciding its third write (two have landed)
WAIT_S = 20.0


@dataclass
class HeldAgent(ScriptedAgent):
    """Writes ``WRITES`` versions of a file; deciding the ``HELD_AT``-th waits to be released once."""

    entered: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)

    def decide(self, context: AgentContext, observation: Observation) -> Decision:
        if context.plan_cursor == HELD_AT and not self.release.is_set():
            self.entered.set()
            if not self.release.wait(WAIT_S):
                raise RuntimeError("the test never released the agent")
        return super().decide(context, observation)


@dataclass
class App:
    """One run in a real SQLite file, its sandbox, and the factory a worker builds runtimes with."""

    path: Path
    agent: HeldAgent
    sandbox: Sandbox = field(default_factory=lambda: Sandbox({"notes.txt": "draft\n"}))
    keyring: Keyring = field(default_factory=lambda: Keyring.generate("k1"))
    task: Any = None

    def runtime(self, store: Any, run_id: str, worker: str = "starter") -> Runtime:
        self.task = self.task or make_task(self.sandbox.environment().state_fingerprint)
        return Runtime(
            store=store,
            keyring=self.keyring,
            adapter=self.sandbox,
            task=self.task,
            policy=make_policy(),
            agent=self.agent,
            worker=worker,
        )


def test_a_worker_stopped_mid_run_finishes_the_step_releases_the_lease_and_takes_no_more(
    tmp_path: Path,
) -> None:
    """Stopped while the agent decides a write, the worker commits that write, frees the run, stops."""
    steps = [write("notes.txt", f"v{i}\n") for i in range(WRITES)]
    app = App(tmp_path / "tether.sqlite", HeldAgent([*steps, finish]))
    with SQLiteStore(app.path) as store:
        app.runtime(store, "r1").start("r1")
    served: list[Any] = []

    def serve() -> None:
        with SQLiteStore(app.path) as store:
            worker = Worker(store, app.runtime, "w1", lease_ttl_s=30, poll_s=0.01)
            served.append(worker)
            worker.serve()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert app.agent.entered.wait(WAIT_S), "the worker never reached the held step"
    assert app.sandbox.write_count() == HELD_AT  # mid-run: two writes landed, four to go
    (worker,) = served
    worker.stop()
    app.agent.release.set()
    thread.join(WAIT_S)
    assert not thread.is_alive(), "a stopped worker kept serving"

    # The step it was in finished (the held write landed and was recorded), and no other.
    assert app.sandbox.write_count() == HELD_AT + 1
    assert app.sandbox.files["notes.txt"] == f"v{HELD_AT}\n"
    assert (worker.stats.claimed, worker.stats.completed) == (1, 0)
    with SQLiteStore(app.path) as store:
        mark = store.get_mark("r1")
        assert mark is not None and mark.phase == Phase.RUNNING
        assert mark.lease_owner is None, "the stopped worker kept the lease"
        state = app.runtime(store, "r1").checkpointer.load("r1").state
        assert state.writes_committed == HELD_AT + 1 and state.pending is None
        # Released, not left to expire: another worker takes it at once and finishes it.
        (lease,) = store.claim_expired("w2", 30)
        assert Worker(store, app.runtime, "w2").drive(lease) is Phase.COMPLETED
    assert app.sandbox.write_count() == WRITES
