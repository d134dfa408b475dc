"""A worker driving several runs at once on SQLite, killed inside a group commit (or not).

``python -m tests.integration._groupchild seed HOME RUNS STEPS`` makes the
store, the keyring and one file workspace per run, and starts each run
(genesis only, no lease). ``python -m tests.integration._groupchild work
HOME STEPS CONCURRENCY LEASE_TTL [KILL_AT]`` runs one ``Worker`` with that
concurrency until no run is left to claim; with ``KILL_AT`` it SIGKILLs
itself at the first checkpoint write, from the KILL_AT-th on (counted across
its runs), that falls inside a transaction carrying two commits or more,
first leaving in ``HOME/batch`` how many it carries.

Every step writes ``notes.txt`` of the run's workspace (fsynced, journaled
by key), so a step whose commit was lost and whose write was made anyway
shows as a write the ledger does not know.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from tether import (
    AgentContext,
    Decision,
    FileWorkspace,
    Keyring,
    Policy,
    Proposal,
    Runtime,
    TaskSpec,
)
from tether.runtime import CrashPlan, CrashPoint, Worker
from tether.store import open_store

VERIFIER = (sys.executable, "-c", "pass")


class Writer:
    """Writes ``notes.txt`` at every step (one action id per step), then finishes."""

    def __init__(self, steps: int) -> None:
        self.steps = steps

    def decide(self, context: AgentContext, observation: Any) -> Decision:
        cursor = context.plan_cursor + 1
        if cursor > self.steps:
            return Decision(AgentContext(plan_cursor=cursor), finished=True)
        return Decision(
            AgentContext(plan_cursor=cursor),
            Proposal(
                action_id=f"w{cursor}",
                kind="file.write",
                target="notes.txt",
                args={"content": f"step {cursor}\n"},
                based_on_version=observation.environment.version,
            ),
        )


def workspace(home: Path, run_id: str) -> FileWorkspace:
    """The run's own workspace and journal under ``home``."""
    return FileWorkspace(
        home / "runs" / run_id, home / "journals" / run_id, verifier_allowlist=[VERIFIER]
    )


def runtime(store: Any, home: Path, run_id: str, worker: str, steps: int, crash: Any) -> Runtime:
    ws = workspace(home, run_id)
    task = TaskSpec.from_json(
        {
            "task_id": "group",
            "task_version": "1",
            "allowed_kinds": ["file.write"],
            "allowed_paths": ["notes.txt"],
            "permissions": ["workspace.write"],
            "budgets": {"proposals": steps + 5, "steps": steps + 5, "wall_time_s": 3600, "cost": 0},
            "initial_environment": {
                "namespace": "file-workspace",
                "state_fingerprint": (home / "fingerprint").read_text(),
            },
            "verifier": {"argv": list(VERIFIER), "timeout_s": 60},
        }
    )
    policy = Policy.from_json(
        {
            "policy_id": "group",
            "policy_version": "1",
            "kinds": {
                "file.write": {
                    "risk": "low",
                    "permission": "workspace.write",
                    "needs_approval": False,
                }
            },
            "max_risk": "low",
            "approval_ttl_s": 60,
        }
    )
    return Runtime(
        store=store,
        keyring=Keyring.from_file(home / "keyring.json"),
        adapter=ws,
        task=task,
        policy=policy,
        agent=Writer(steps),
        worker=worker,
        crash=crash,
    )


def open_store_of(home: Path) -> Any:
    """The store named in ``HOME/store-url`` (a fresh PostgreSQL schema), else ``HOME/store.sqlite``."""
    named = home / "store-url"
    return open_store(named.read_text() if named.exists() else home / "store.sqlite")


def run_ids(count: int) -> list[str]:
    return [f"run-{index:02d}" for index in range(count)]


def seed(home: Path, runs: int, steps: int) -> None:
    Keyring.generate("group").write_file(home / "keyring.json")
    for index, run_id in enumerate(run_ids(runs)):
        (home / "runs" / run_id).mkdir(parents=True)
        (home / "runs" / run_id / "notes.txt").write_text("start\n")
        if index == 0:
            with workspace(home, run_id) as ws:
                (home / "fingerprint").write_text(ws.environment().state_fingerprint)
    with open_store_of(home) as store:
        for run_id in run_ids(runs):
            runtime(store, home, run_id, "seeder", steps, CrashPlan()).start(run_id)


class _KillInBatch(CrashPlan):
    """SIGKILL at the first checkpoint write, from the nth on, inside a transaction of many commits.

    The hits run one at a time (inside the store's transaction: on SQLite under
    its one connection, on PostgreSQL in the batch's leader or in a commit
    alone, which GroupCommit runs one at a time too), so counting them
    across runs needs no lock of its own.
    """

    def __init__(self, nth: int, store: Any, note: Path) -> None:
        super().__init__(CrashPoint.CHECKPOINT_WRITE, nth, "kill")
        self._store = store
        self._note = note

    def hit(self, point: CrashPoint) -> None:
        if point != self.point:
            return
        self.hits += 1
        group = self._store._group
        writing = 0 if group is None else group.writing
        if self.hits >= self.nth and writing >= 2:
            self._note.write_text(str(writing))
            # Still inside the transaction: a run told its commit was durable
            # before it was would have time now to make its step's write.
            time.sleep(0.5)
            os.kill(os.getpid(), signal.SIGKILL)


def work(home: Path, steps: int, concurrency: int, ttl: float, kill_at: int | None) -> None:
    with open_store_of(home) as store:
        crash = CrashPlan() if kill_at is None else _KillInBatch(kill_at, store, home / "batch")

        def factory(store: Any, run_id: str, worker: str) -> Runtime:
            return runtime(store, home, run_id, worker, steps, crash)

        worker = Worker(
            store, factory, "group-worker", lease_ttl_s=ttl, poll_s=0.05, concurrency=concurrency
        )
        worker.serve(idle_exit=True)


def main(argv: list[str]) -> None:
    home = Path(argv[1])
    if argv[0] == "seed":
        seed(home, int(argv[2]), int(argv[3]))
        return
    kill_at = int(argv[5]) if len(argv) > 5 else None
    work(home, int(argv[2]), int(argv[3]), float(argv[4]), kill_at)


if __name__ == "__main__":
    main(sys.argv[1:])
