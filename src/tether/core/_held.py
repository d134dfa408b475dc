"""The held action and the call that asks for it, as functions of values.

A run holds at most one action (``RunState.pending``): a write whose effect
is not settled yet, a read or test run waiting for its approval, or a replay
of a gated kind waiting for one. Before anything new, a step settles it
first. Three questions follow, each answered here and nowhere else:

* which rule settles it (:func:`held_kind`): a replay, a held non-write, or
  a write settled by its key;
* whether a call asks for exactly it (:func:`answers_held`): its own action
  id, or the same action (a non-write: the same kind, target and
  arguments; a write: the same effect digest);
* what a caller's call does once the step has settled what came first
  (:func:`after_settle`).
"""

from __future__ import annotations

from enum import StrEnum

from tether.core._actions import Proposal
from tether.core._model import PendingWrite
from tether.core._phases import Phase
from tether.core._state import RunState


class HeldKind(StrEnum):
    """Which rule settles the action a run holds."""

    #: A write: settled by its key (dispatched, asked, sent again or frozen).
    WRITE = "write"
    #: A read, a test run or a finish that waited for its approval: carried out once approved.
    ACTION = "action"
    #: A replay of a gated write kind that waited for its approval: judged again, then answered.
    REPLAY = "replay"


def held_kind(pending: PendingWrite, *, kind_mutates: bool | None) -> HeldKind:
    """Which rule settles ``pending``; ``kind_mutates``: whether its kind, as the catalog
    declares it now, is a write (``None``: the catalog no longer declares it)."""
    if pending.mutating:
        return HeldKind.WRITE
    # Held without changing anything, yet of a write kind: only a replay is held so.
    return HeldKind.REPLAY if kind_mutates else HeldKind.ACTION


def answers_held(
    held: PendingWrite,
    proposal: Proposal,
    *,
    effect: str | None = None,
    held_effect: str | None = None,
) -> bool:
    """Whether ``proposal`` asks for exactly the action ``held`` is: "this call answers it".

    Its own action id always does. Otherwise a held non-write is asked for by
    the same kind, target and arguments; a held write by the same effect
    (``effect``, the proposal's effect digest, equal to ``held_effect``, the
    held intent's; ``None`` where the proposal is no effect the adapter would
    take), whatever the caller's ids, which a framework regenerates on resume.
    """
    if held.action_id == proposal.action_id:
        return True
    if not held.mutating:
        intent = held.intent
        asked = (proposal.kind, proposal.target, dict(proposal.args))
        return (intent.kind, intent.target, intent.args) == asked
    return effect is not None and effect == held_effect


class AfterSettle(StrEnum):
    """What a caller's call does once the step has settled what came first."""

    #: Nothing held the run, or what did is settled and was another action: carry the call out.
    PROCEED = "proceed"
    #: The settled action is the one the call asks for: its outcome is the call's answer.
    ANSWER = "answer"
    #: The run still holds earlier work (a person, the adapter): the settled outcome says
    #: why, and nothing of the call ran.
    WAIT = "wait"
    #: The run ended or froze while settling: the call is refused as a stopped run's is.
    STOPPED = "stopped"


def after_settle(state: RunState, *, settled: bool, asked: bool) -> AfterSettle:
    """What a call does next, from the run ``state`` after settling.

    ``settled``: the step settled something first (the inbox ended the run,
    a rewind finished, a held action was settled); ``asked``: the action the
    run held before is the one the call asks for (:func:`answers_held`).

    =============================================  ===========
    nothing was settled                            proceed
    the run still holds an action, or a rewind     wait
    the call's own held action, settled            answer
    the run ended, or froze                        stopped
    other earlier work settled, the run at rest    proceed
    =============================================  ===========
    """
    if not settled:
        return AfterSettle.PROCEED
    if state.pending is not None or state.rewinding is not None:
        return AfterSettle.WAIT
    if asked:
        return AfterSettle.ANSWER
    if state.phase.terminal or state.phase is Phase.NEEDS_REVIEW:
        return AfterSettle.STOPPED
    return AfterSettle.PROCEED
