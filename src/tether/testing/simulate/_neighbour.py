"""A healthy run beside the simulated one: "one failing run never stops a healthy one".

Invariant 7's second half. A ``neighbour`` event hands a second run to the
same workers, on the same store: started, its lease let go at once, as a
launcher does. Its world never fails: a workspace of its own that is always
up, an agent that writes twice and finishes, a policy that gates nothing,
no crash armed in its process, ids of its own (the simulated run's ids do
not move). Only a worker's claim (a ``drive`` event) moves it, so whatever
the simulated run does meanwhile (its service down, frozen for a person,
its agent failing), what is judged is the worker's choice:

- a turn (one ``drive`` event: a claim and the drive of what it took) builds
  at most :data:`BUILDS_PER_TURN` runtimes: a worker that tries a run again
  at once, in the same turn, never yields it to the next one;
- a claim passes the healthy run over at most :data:`PASSED_OVER` times
  while it could be claimed (free of any lease, due, not waiting for a
  person): the worker takes the run that waited longest;
- once the world heals, it ends within :data:`DRAIN_DRIVES` drives,
  ``completed``, with its two writes in its workspace, each exactly once.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from tether.runtime import Runtime
from tether.store import Mark
from tether.testing._sandbox import Sandbox
from tether.testing.simulate._agent import SimAgent
from tether.testing.simulate._judge import Judge
from tether.testing.simulate._people import TRUST
from tether.testing.simulate._process import KEYRING, LEASE_TTL_S, SimRuntime, rules
from tether.testing.simulate._scenario import RUN_ID, Item, Scenario
from tether.testing.simulate._world import SimClock, SimIds

#: The healthy run's id. It sorts after the simulated run's, so a claim that broke a
#: tie between the two (claimable at the same simulated instant) by run id would take
#: the failing one every time; the store takes the one taken least recently.
NEIGHBOUR_ID = f"{RUN_ID}-neighbour"
TARGET = "src/n.txt"
PLAN = (Item("write", TARGET, "1"), Item("write", TARGET, "2"), Item("finish"))
#: Runtimes one worker may build in one turn: one per run it claimed (a claim takes one).
BUILDS_PER_TURN = 1
#: Claims that may pass the healthy run over while it could be claimed.
PASSED_OVER = 2
#: Drives the healthy run may take to end once the world has healed.
DRAIN_DRIVES = 6
_CLAIMABLE = frozenset({"running", "pending", "needs_review"})
_ENDED = frozenset({"completed", "failed", "cancelled"})


class Runaway(BaseException):
    """An event that never returns (a worker looping on a down service): stopped and judged."""


class Neighbour:
    """The healthy run, its world, and what the judge keeps about its turns."""

    def __init__(self, scenario: Scenario, clock: SimClock) -> None:
        self.clock = clock
        self.ids = SimIds()
        self.workspace = Sandbox(
            {TARGET: "0"}, instance_id="ws-neighbour", id_source=self.ids.bare, clock=clock.now
        )
        env = self.workspace.environment()
        self.task, self.policy = rules(
            replace(scenario, gated=()), env.state_fingerprint, env.namespace, remote=False
        )
        self.incarnations = 0
        #: Claims that passed it over while it could be claimed.
        self.passed_over = 0
        #: How and when it ended, and where the simulated run stood then ("": not yet).
        self.ending = ""

    def runtime(self, store: Any, worker: str) -> Runtime:
        """A process for the healthy run: its own agent, world and policy; no crash armed."""
        self.incarnations += 1
        return SimRuntime(
            store=store,
            keyring=KEYRING,
            adapter=self.workspace,
            task=self.task,
            policy=self.policy,
            agent=SimAgent(PLAN, self.incarnations),
            clock=self.clock,
            ids=self.ids,
            worker=worker,
            trust=TRUST,
            lease_ttl_s=LEASE_TTL_S,
        )

    def arrive(self, store: Any, *, died: bool = False) -> None:
        """A launcher starts the healthy run and lets its lease go: the workers' turn.

        ``died``: the launcher dies holding the lease, so the run becomes
        claimable only when that lease runs out (a time, not "since ever").
        """
        session = self.runtime(store, "launcher").start(NEIGHBOUR_ID)
        if not died:
            session.release()

    def claimable(self, mark: Mark | None) -> bool:
        """Whether a claim could take it now (the store's own test, for a run nobody parked)."""
        if mark is None or mark.phase not in _CLAIMABLE or mark.waiting_after is not None:
            return False
        now = self.clock.now()
        expires, retry = mark.lease_expires_at, mark.retry_at
        free = mark.lease_owner is None or (expires is not None and expires <= now)
        return free and (retry is None or retry <= now)

    @staticmethod
    def built(judge: Judge, builds: int, run_id: str, worker: str) -> None:
        """A worker built its ``builds``-th runtime this turn; past the bound, it never yields."""
        if builds > BUILDS_PER_TURN:
            judge.fail(
                7,
                f"worker {worker} took up {run_id} {builds} times in one turn: a worker "
                "that tries a run again at once never gives the next run its turn",
            )
            raise Runaway(f"{worker} never yields {run_id}")

    def turn_ended(self, judge: Judge, waited: bool, mark: Mark | None) -> None:
        """After a turn: a healthy run that could be claimed and is still not over was passed over."""
        judge.checks += 1
        if not waited or ended(mark):
            return
        self.passed_over += 1
        if self.passed_over == PASSED_OVER + 1:
            judge.fail(
                7,
                f"the healthy run {NEIGHBOUR_ID} was passed over by {self.passed_over} claims "
                f"while it could be claimed ({RUN_ID} was taken instead)",
            )

    def judge_end(self, judge: Judge, mark: Mark | None) -> None:
        """Once the world healed and the workers drove it: ended, its writes each done once."""
        judge.checks += 3
        if mark is None or mark.phase != "completed":
            phase = None if mark is None else mark.phase
            judge.fail(
                7, f"the healthy run {NEIGHBOUR_ID} did not complete ({phase}) after the drain"
            )
            return
        held = self.workspace.files.get(TARGET)
        if held != PLAN[-2].value:
            judge.fail(3, f"the healthy run completed, but {TARGET} holds {held!r}")
        writes = self.workspace.write_count()
        if writes != len(PLAN) - 1:
            judge.fail(
                1, f"the healthy run's {len(PLAN) - 1} writes reached its world {writes} times"
            )


def ended(mark: Mark | None) -> bool:
    """Whether the run the mark names is over."""
    return mark is not None and mark.phase in _ENDED
