"""The crash harness's child process: one stage of one run of the user's app.

``python -m tether.testing._crashchild STAGE --app SPEC --workdir DIR --store URL
--run RUN --report FILE [--point POINT --hit N]``

- ``clean``: start the run unarmed, run it to its end, and report how often it
  passed each crash point.
- ``start``: start the run armed to SIGKILL this process at the ``N``-th pass
  of ``POINT``. Reaching the end instead exits 0, which the harness reports.
- ``recover``: ``start_or_recover`` the run and run it as far as it goes.

An app with its own loop (:class:`~tether.testing.crash_harness.LoopCrashApp`)
is driven by its ``drive`` at every stage instead of an agent's ``run``.

``clean`` and ``recover`` write what the run's signed state and ledger say
to ``FILE`` (JSON, replaced whole). Any error leaves the file unwritten and
the exit status non-zero, with the error on stderr for the harness to show.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from tether.core import EffectStatus, Phase
from tether.runtime import CrashPlan, CrashPoint, Runtime
from tether.store import open_store
from tether.testing._crashreport import UNCERTAIN, Settled
from tether.testing.crash_harness import CrashApp, LoopCrashApp, load_app

#: The kind of a committed effect whose intent the signed trace does not name.
UNNAMED = "(unknown kind)"


@dataclass
class PassCounter(CrashPlan):
    """A crash plan that never fires and counts every pass of every point."""

    passes: Counter[CrashPoint] = field(default_factory=Counter)

    def hit(self, point: CrashPoint) -> None:
        self.passes[point] += 1


def settled(rt: Runtime, run_id: str) -> Settled:
    """The run as its signed checkpoint, trace and ledger say, receipts counted by kind."""
    state = rt.checkpointer.load(run_id).state
    kinds = {
        event.data["idempotency_key"]: event.data["kind"]
        for event in rt.checkpointer.verified_trace(state)
        if event.kind == "intent_persisted"
    }
    keys = {
        entry.idempotency_key
        for entry in rt.checkpointer.verified_ledger(state)
        if entry.status is EffectStatus.COMMITTED
    }
    committed = Counter(kinds.get(key, UNNAMED) for key in keys)
    reviews = tuple(case.reason for case in state.review_cases)
    held: Counter[str] = Counter()
    if state.phase is Phase.NEEDS_REVIEW and state.pending is not None and UNCERTAIN in reviews:
        held[state.pending.intent.kind] += 1
    return Settled(state.phase.value, reviews, dict(committed), dict(held))


def drive(app: CrashApp, rt: Runtime, run_id: str, *, recover: bool) -> None:
    """Run ``run_id`` as far as it goes: the app's own loop, or its agent's steps."""
    if isinstance(app, LoopCrashApp):
        app.drive(rt, run_id)  # its effects.run starts or recovers the run, and lets go
        return
    if not recover:
        rt.start(run_id).run()
        return
    session = rt.start_or_recover(run_id)
    try:
        session.run()
    finally:
        session.release()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tether.testing._crashchild")
    parser.add_argument("stage", choices=["clean", "start", "recover"])
    parser.add_argument("--app", required=True)
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--store", required=True)
    parser.add_argument("--run", required=True)
    parser.add_argument("--report", type=Path)
    parser.add_argument("--point", choices=[p.value for p in CrashPoint])
    parser.add_argument("--hit", type=int, default=1)
    args = parser.parse_args(argv)
    app = load_app(args.app, args.workdir)
    with open_store(args.store) as store:
        if args.stage == "start":
            plan = CrashPlan(CrashPoint(args.point), nth=args.hit, mode="kill")
            rt = app.runtime(store, args.run, plan)
            rt.lease_ttl_s = None  # a lease left by the killed child would block recovery
            drive(app, rt, args.run, recover=False)
            return 0
        if args.stage == "clean":
            counter = PassCounter()
            rt = app.runtime(store, args.run, counter)
            rt.lease_ttl_s = None
            drive(app, rt, args.run, recover=False)
            report = {**settled(rt, args.run).to_json(), "passes": dict(counter.passes)}
        else:
            rt = app.runtime(store, args.run, CrashPlan())
            drive(app, rt, args.run, recover=True)
            report = settled(rt, args.run).to_json()
    temp = args.report.with_name(args.report.name + ".tmp")
    temp.write_text(json.dumps(report, sort_keys=True))
    os.replace(temp, args.report)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
