"""Carrying out a new proposal: the gate, then the way its kind's class says.

A write is judged by the replay rule first (an effect the run already made
is not made again), then made pending with a key minted once and persisted
before anything leaves the process, then dispatched; a read, a test run or
a finish the policy gates waits, held, for a person; any other non-write is
carried out at once (:mod:`tether.runtime._carry`). Every decision is a
pure function in :mod:`tether.core`; this module reads what they need and
applies what they return.
"""

from __future__ import annotations

from typing import Any

from tether.adapters import capabilities_of
from tether.core import (
    ContractViolationError,
    Intent,
    Outcome,
    OutcomeKind,
    OutcomeReason,
    Proposal,
    RunState,
)
from tether.core import _settle as settle_rules
from tether.core import _steps as step_rules
from tether.core._actions import Rejection as GateRejection
from tether.core._actions import gate, needs_approval, risk_of
from tether.core._transition import Transition
from tether.runtime import _carry, _replaying
from tether.runtime._agent import AgentContext
from tether.runtime._crash import CrashPoint
from tether.runtime._view import Event, Session


def act(
    session: Session,
    base: RunState,
    context: AgentContext,
    proposal: Proposal,
    events: list[Event],
    *,
    runtime_finish: bool = False,
) -> Outcome:
    """Gate one proposal, then carry it out the way its kind's class says."""
    rt = session.rt
    rejection = gate(
        proposal,
        kinds=rt.kinds,
        task=rt.task,
        policy=rt.policy,
        phase=base.phase,
        environment=base.environment,
        now=rt.clock.now(),
        # The runtime's own finish id is unique by generation; an agent
        # cannot make it "used before" by borrowing it.
        action_seen=not runtime_finish and session.history.action_used(proposal.action_id),
        cost_spent=base.spent.cost,
    )
    kind = rt.kinds.get(proposal.kind) if rejection is None else None
    args: dict[str, Any] = {}
    if kind is not None and kind.mutating:
        try:
            args = rt.adapter.normalize(proposal.kind, proposal.target, proposal.args)
        except ContractViolationError as exc:
            rejection = GateRejection(exc.reason, str(exc))
    elif kind is not None:
        args = dict(proposal.args)  # the gate checked it is an object
    if rejection is not None or kind is None:
        if rejection is None:  # unreachable: the gate refuses unknown kinds
            rejection = GateRejection(OutcomeReason.UNKNOWN_KIND, f"no kind {proposal.kind!r}")
        return session.apply(
            step_rules.reject(base, proposal, rejection, rt.task.budgets),
            prefix=events,
            context=context,
        )
    if kind.mutating:
        return _propose_write(session, base, context, proposal, args, events)
    if needs_approval(rt.policy, kind):
        intent = Intent(kind.name, proposal.target, args, risk_of(rt.policy, kind).value)
        held = step_rules.hold(
            base, proposal, intent, key=rt.ids.new_id("idem"), now=rt.clock.now()
        )
        return session.apply(held, prefix=events, context=context)
    return _carry.carry_out(session, base, context, proposal, kind, events, spent_already=False)


def _propose_write(
    session: Session,
    base: RunState,
    context: AgentContext,
    proposal: Proposal,
    args: dict[str, Any],
    events: list[Event],
) -> Outcome:
    rt = session.rt
    kind = rt.kinds[proposal.kind]
    intent = Intent(proposal.kind, proposal.target, args, risk_of(rt.policy, kind).value)
    decided = _replaying.replay_or_fork(session, base, proposal, intent, rt.effect_digest(intent))
    if isinstance(decided, Transition):
        if decided.state is None:
            return Outcome(decided.outcome, session.state, decided.reason, decided.message)
        return session.apply(decided, prefix=events, context=context)
    base, events = decided.state, [*events, *decided.events]
    transition = step_rules.propose_write(
        base,
        proposal,
        intent,
        key=rt.ids.new_id("idem"),  # minted once, before anything is sent; never again
        expected_post=rt.adapter.derive_post_state(base.environment, intent),
        now=rt.clock.now(),
        needs_approval=needs_approval(rt.policy, kind),
        capabilities=capabilities_of(rt.adapter, proposal.kind),
    )
    outcome = session.apply(transition, prefix=events, context=context)
    if outcome.kind is OutcomeKind.WAITING_FOR_APPROVAL:
        return outcome  # it waits, durable, for a person; nothing leaves the process
    rt.crash.hit(CrashPoint.INTENT_PERSISTED)
    return session.apply(session.decide(lambda facts: settle_rules.dispatch(session.state, facts)))
