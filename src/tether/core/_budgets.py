"""Budgets: what a step charges, which budget a run has spent, and the one failed ending."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from tether.core._phases import OutcomeReason, Phase
from tether.core._spec import Budgets
from tether.core._state import RunState, Spent, working_ms
from tether.core._transition import Event, OutcomeKind, Transition


def charged(spent: Spent, *, proposals: int = 0, cost: int = 0) -> Spent:
    return replace(spent, proposals=spent.proposals + proposals, cost=spent.cost + cost)


def spent_budget(
    state: RunState, budgets: Budgets, now: datetime, *, resumed_at: datetime | None = None
) -> str | None:
    """Which budget the run has spent (``steps``, ``proposals``, ``cost``, ``wall_time``,
    ``deadline``, checked in that order), or ``None`` while every one has room.

    Wall time is the run's own working time (see :func:`working_ms`;
    ``resumed_at``: when this epoch began, so downtime before it is not
    counted); the optional ``deadline_s`` is calendar time from the start.
    """
    spent = state.spent
    worked_ms = spent.wall_time_ms + working_ms(state, now, resumed_at)
    if spent.steps >= budgets.steps:
        return "steps"
    if spent.proposals >= budgets.proposals:
        return "proposals"
    if spent.cost > budgets.cost:
        return "cost"
    if worked_ms > budgets.wall_time_s * 1000:
        return "wall_time"
    if budgets.deadline_s is not None and (
        (now - state.started_at).total_seconds() > budgets.deadline_s
    ):
        return "deadline"
    return None


def failed(state: RunState, reason: OutcomeReason) -> tuple[RunState, Event]:
    """The one ending of a failed run: ``state`` in ``failed`` with ``reason`` as its stop
    reason, and the ``failed`` event that traces it.

    Every path that fails a run builds its ending here (a spent budget found
    at a step's start, a rejection that spent the last proposal, a review's
    abort), so a failed run always says why in its trace, the same way.
    """
    word = OutcomeReason(reason).value
    return state.evolve(phase=Phase.FAILED, stop_reason=word), ("failed", {"reason": word})


def budget_reason(which: str) -> OutcomeReason:
    """The stop reason of a run that failed on the budget ``which`` (a :func:`spent_budget` word)."""
    return OutcomeReason(f"budget_exhausted:{which}")


def exhausted(
    state: RunState, budgets: Budgets, now: datetime, *, resumed_at: datetime | None = None
) -> Transition | None:
    """Fail the run when a budget is spent (see :func:`spent_budget`)."""
    which = spent_budget(state, budgets, now, resumed_at=resumed_at)
    if which is None:
        return None
    reason = budget_reason(which)
    after, ending = failed(state, reason)
    return Transition(OutcomeKind.FAILED, state=after, events=(ending,), reason=reason)


def charged_last(state: RunState, budgets: Budgets) -> tuple[RunState, tuple[Event, ...]]:
    """``state`` just charged a proposal: failed, with its ``failed`` event, when that was the
    last proposal the budget allows; else ``state`` as it is and no event.

    For a step that ends without an action going on (a rejection, a replay):
    the run fails at once rather than at its next step.
    """
    if state.spent.proposals < budgets.proposals:
        return state, ()
    after, ending = failed(state, budget_reason("proposals"))
    return after, (ending,)
