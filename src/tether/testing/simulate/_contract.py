"""The first seed's action contract, judged: invariant 8 (the simulator's own number).

1. An action built on an environment version the environment has left (the
   agent's ``stale`` fault builds one: a read, a test run, a write or a
   ticket) is refused and never carried out: its id shows in the trace only
   in ``proposal_rejected``.
2. A run that fails says so in its trace: a ``failed`` event with its stop
   reason (a spent budget, a review's abort, a worker's error).
3. A step that spends the last proposal on a refusal or a replay ends the
   run at once (``failed``), not at its next step.
4. A reviewer decision that carries a nonce the run consumed before (another
   case's, an approval's, a fork's or a cancel's) is refused: it closes no case.

Judged after every event that committed, from what the store holds (the
verified checkpoint and the trace it names), and after each step the
simulator takes itself, from what the step reports.
"""

from __future__ import annotations

from typing import Any

from tether.core import OutcomeKind, RunState
from tether.testing.simulate._judge import Judge
from tether.testing.simulate._scenario import RUN_ID

#: The simulation judged (its runner; typed loosely, as the people's acts take it).
Simulation = Any
#: The only trace event that may name an action built on a version the environment left.
REFUSED = "proposal_rejected"
_SPENDING = (OutcomeKind.REJECTED, OutcomeKind.REPLAYED)
#: Trace events read back beyond the new ones (a rewind may have gone back first).
_MARGIN = 16


class Contract:
    """What the judge of the action contract has read so far."""

    def __init__(self) -> None:
        #: Trace events already judged (the newest are read after each commit).
        self.trace_read = 0
        self.failed_judged = False
        #: (stale action, trace event kind) already reported.
        self.carried: set[tuple[str, str]] = set()
        self.reuse_judged: set[str] = set()

    def after_commit(self, sim: Simulation, phase: str) -> None:
        """Judge 1, 2 and 4 on the run as the store holds it after an event that committed."""
        staled: dict[str, tuple[int, int]] = sim.agent.staled
        reused: dict[str, str] = sim.people.reused
        ending = phase == "failed" and not self.failed_judged
        if not (staled or reused or ending):
            return
        state: RunState | None = sim.state()
        if state is None:
            return
        judge: Judge = sim.judge
        if staled:
            self._stale(sim, state, staled, judge)
        if ending and state.phase.value == "failed":
            self.failed_judged = True
            judge.checks += 1
            events = _trace(sim, state, state.trace_length + 1)
            reasons = [e.data.get("reason") for e in events if e.kind == "failed"]
            if state.stop_reason not in reasons:
                judge.fail(
                    8,
                    f"the run failed ({state.stop_reason}) and its trace says no such thing "
                    f"(failed events: {reasons})",
                )
        for nonce, case_id in reused.items():
            if nonce in self.reuse_judged:
                continue
            judge.checks += 1
            for document in state.decisions:
                body = document.get("body")
                if isinstance(body, dict) and (body.get("nonce"), body.get("case_id")) == (
                    nonce,
                    case_id,
                ):
                    self.reuse_judged.add(nonce)
                    judge.fail(
                        8,
                        f"a reviewer's decision reusing the consumed nonce {nonce} "
                        f"closed case {case_id}",
                    )

    def _stale(
        self, sim: Simulation, state: RunState, staled: dict[str, tuple[int, int]], judge: Judge
    ) -> None:
        # The events since the last look (a margin more: a rewind may have gone back
        # first); a stale action's id is its own, so no event before it can name it.
        fresh = max(0, state.trace_length - self.trace_read) + _MARGIN
        self.trace_read = state.trace_length
        judge.checks += 1
        for event in _trace(sim, state, min(fresh, state.trace_length + 1)):
            action = event.data.get("action_id")
            if event.kind == REFUSED or action not in staled:
                continue
            if (action, event.kind) in self.carried:
                continue
            self.carried.add((action, event.kind))
            based, observed = staled[action]
            judge.fail(
                8,
                f"{action} was built on environment version {based} when the environment "
                f"was at {observed}, and was carried out ({event.kind})",
            )

    @staticmethod
    def after_step(sim: Simulation, session: Any, outcome: Any) -> None:
        """Judge 3 on a step the simulator took: the last proposal spent ends the run at once."""
        if outcome.kind not in _SPENDING or session is None:
            return
        state = session.state
        budget = sim.task.budgets.proposals
        sim.judge.checks += 1
        if state.spent.proposals >= budget and not state.phase.terminal:
            sim.judge.fail(
                8,
                f"a step {outcome.kind.value} spent the last of {budget} proposals and the "
                f"run is still {state.phase.value}",
            )


def _trace(sim: Simulation, state: RunState, newest: int) -> list[Any]:
    """The run's newest ``newest`` trace events, from the head its checkpoint names."""
    return list(sim.observer.trace(RUN_ID, state.trace_head, newest))
