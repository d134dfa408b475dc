"""A worker process that a run kills: a poison run among healthy ones, or a kill in every step.

``python -m tests.integration._poisonchild poison HOME STEPS CONCURRENCY LEASE_TTL HOW``
runs one ``Worker`` with that concurrency over the runs ``_groupchild seed``
made, until none is left to claim. Every run's agent thinks for a while
before each step (a model call: ``THINK_S``); ``run-00``, from its second
step on, ends the whole process at once (``os._exit``, as a segfault or an
OOM kill would), taking every run the process drives with it: HOW ``decide``
in its agent, ``send`` in its adapter as its second write is sent (a poison
effect: every resend of it kills the process again).

``python -m tests.integration._poisonchild list HOME`` prints ``tether runs --json``.

``python -m tests.integration._poisonchild midstep HOME STEPS LEASE_TTL``
runs a worker of one thread that SIGKILLs its own process right after the
first write it sends (the write made, its receipt not yet recorded), as a
deploy killing workers mid-step would, each time after the claim committed
progress (it settled the write the previous process left unsettled).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from tests.integration._groupchild import VERIFIER, Writer, open_store_of, runtime
from tether import AgentContext, Decision, FileWorkspace, Intent, Receipt, Runtime
from tether.cli import main as cli_main
from tether.runtime import CrashPlan, CrashPoint, Worker

#: How long every agent thinks before a step.
THINK_S = 0.3
#: The run whose agent ends the process.
POISON = "run-00"


class Thinking(Writer):
    """The writer, slow to decide; ``poison``: ends the process from its second step on."""

    def __init__(self, steps: int, poison: bool) -> None:
        super().__init__(steps)
        self.poison = poison

    def decide(self, context: AgentContext, observation: Any) -> Decision:
        if self.poison and context.plan_cursor >= 1:
            os._exit(3)
        time.sleep(THINK_S)
        return super().decide(context, observation)


class PoisonWorkspace(FileWorkspace):
    """A run's workspace whose second write ends the process as it is sent, every time."""

    def execute(self, key: str, intent: Intent, *args: Any, **kwargs: Any) -> Receipt:
        if intent.args.get("content") == "step 2\n":
            os._exit(3)
        return super().execute(key, intent, *args, **kwargs)


def poison(home: Path, steps: int, concurrency: int, ttl: float, how: str) -> None:
    with open_store_of(home) as store:

        def factory(store: Any, run_id: str, worker: str) -> Runtime:
            built = runtime(store, home, run_id, worker, steps, CrashPlan())
            built.agent = Thinking(steps, run_id == POISON and how == "decide")
            if run_id == POISON and how == "send":
                built.adapter = PoisonWorkspace(
                    home / "runs" / run_id,
                    home / "journals" / run_id,
                    verifier_allowlist=[VERIFIER],
                )
            return built

        worker = Worker(
            store, factory, "poison-worker", lease_ttl_s=ttl, poll_s=0.05, concurrency=concurrency
        )
        worker.serve(idle_exit=True)


def midstep(home: Path, steps: int, ttl: float) -> None:
    with open_store_of(home) as store:
        crash = CrashPlan(CrashPoint.EFFECT_SENT, 1, "kill")

        def factory(store: Any, run_id: str, worker: str) -> Runtime:
            return runtime(store, home, run_id, worker, steps, crash)

        Worker(store, factory, "deployed-worker", lease_ttl_s=ttl, poll_s=0.05).serve(
            idle_exit=True
        )


def main(argv: list[str]) -> None:
    home = Path(argv[1])
    if argv[0] == "list":  # `tether runs --json` of HOME's store
        named = home / "store-url"
        store = named.read_text() if named.exists() else str(home / "store.sqlite")
        cli_main(["runs", "--store", store, "--keyring", str(home / "keyring.json"), "--json"])
        return
    if argv[0] == "poison":
        poison(home, int(argv[2]), int(argv[3]), float(argv[4]), argv[5])
        return
    midstep(home, int(argv[2]), float(argv[3]))


if __name__ == "__main__":
    main(sys.argv[1:])
