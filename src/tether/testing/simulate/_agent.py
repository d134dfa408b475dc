"""The simulated agent: plays the scenario's plan from its restored context.

It proposes at ``plan[context.plan_cursor]``, so what it does is a function
of the checkpoint it was restored from. A restored agent does not remember
its ids: each incarnation (a new process after a crash) names its actions
afresh (``p<cursor>.i<incarnation>``), as ACRFence's re-proposal does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tether.core import Observation, Proposal
from tether.runtime import AgentContext, Decision
from tether.testing.simulate._scenario import Item

_KINDS = {
    "read": "file.read",
    "test": "tests.run",
    "write": "file.write",
    "ticket": "ticket.create",
    "board": "board.set",
}


class SimAgentError(Exception):
    """The agent's own code failed (armed by an ``agent_error`` event): a failing run."""


@dataclass
class AgentFaults:
    """What the simulator armed for the run's agent, whichever process it lives in."""

    errors: int = 0  # the next N decisions raise SimAgentError
    stale: int = 0  # the next N proposals are built on a version the agent saw before
    #: Every environment version the agent has observed.
    seen: set[int] = field(default_factory=set)
    #: Action id -> (the version it was built on, the version observed then): stale ones.
    staled: dict[str, tuple[int, int]] = field(default_factory=dict)

    def built_on(self, action_id: str, version: int) -> tuple[str, int]:
        """The action's id and the version it is built on: the one observed, or (armed) an
        older one, under an id of its own (no earlier event can name it)."""
        older = sorted(v for v in self.seen if v != version)
        self.seen.add(version)
        if self.stale <= 0 or not older:
            return action_id, version
        self.stale -= 1
        based = max([v for v in older if v < version] or older)
        action_id = f"{action_id}.s{len(self.staled) + 1}"
        self.staled[action_id] = (based, version)
        return action_id, based


@dataclass
class SimAgent:
    """Plays ``plan``; ``incarnation`` names its actions; ``calls`` counts its decisions."""

    plan: tuple[Item, ...]
    incarnation: int
    #: The plan kinds it tries again after a replan ("write", "ticket", "board").
    redo: frozenset[str] = frozenset({"write", "ticket", "board"})
    calls: int = 0
    faults: AgentFaults = field(default_factory=AgentFaults)

    def decide(self, context: AgentContext, observation: Observation) -> Decision:
        self.calls += 1
        if self.faults.errors > 0:
            self.faults.errors -= 1
            raise SimAgentError("simulated: the agent's own code failed")
        cursor = context.plan_cursor
        item = self.plan[min(cursor, len(self.plan) - 1)]
        after = AgentContext(context.messages, context.memory, cursor + 1)
        action_id = f"p{cursor}.i{self.incarnation}"
        told = observation.last_outcome
        redo = None if told is None or told.reason != "replanned" else told.action_id
        again = None if redo is None else planned(self.plan, redo)
        if redo is not None and again is not None and again.kind in self.redo:
            # After a replan the agent tries the frozen action again (ACRFence's
            # re-proposal), under a new id, and stays where it was in its plan.
            item, after = again, AgentContext(context.messages, context.memory, cursor)
            action_id = f"{redo.split('.', 1)[0]}.i{self.incarnation}.r{cursor}"
        if item.kind == "finish":
            return Decision(after, finished=True)
        if item.kind == "write":
            args: dict[str, Any] = {"content": item.value}
        elif item.kind == "ticket":
            args = {"title": item.value}
        elif item.kind == "board":
            args = {"value": item.value}
        else:
            args = {}
        action_id, based_on = self.faults.built_on(action_id, observation.environment.version)
        proposal = Proposal(
            action_id, _KINDS[item.kind], item.target, args, based_on_version=based_on
        )
        return Decision(after, proposal)


def planned(plan: tuple[Item, ...], action_id: str) -> Item | None:
    """The plan item an action id names (``p<cursor>.i<n>``), or ``None``."""
    if not action_id.startswith("p") or "." not in action_id:
        return None
    head = action_id[1:].split(".", 1)[0]
    if not head.isdigit():
        return None
    cursor = int(head)
    return plan[cursor] if cursor < len(plan) else None
