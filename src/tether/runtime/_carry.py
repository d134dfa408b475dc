"""Carrying out the actions that change nothing: reads, test runs, a finish, a cancel.

A read or a test run is observed and committed with what it found; a finish
runs the task's verifier on the state the run is in now; an action that
waited for a person's approval is carried out once the approval holds.
"""

from __future__ import annotations

from tether.core import (
    ActionClass,
    ActionKind,
    AdapterError,
    AdapterUnavailableError,
    ContractViolationError,
    Outcome,
    OutcomeKind,
    OutcomeReason,
    PendingWrite,
    Phase,
    Proposal,
    RunState,
    Verification,
    digest_bytes,
)
from tether.core import _steps as step_rules
from tether.core._actions import Rejection as GateRejection
from tether.core._actions import needs_approval, version_problem
from tether.core._evidence import approval_problem
from tether.runtime._agent import AgentContext
from tether.runtime._view import Event, Session


def carry_out(
    session: Session,
    base: RunState,
    context: AgentContext | None,
    proposal: Proposal,
    kind: ActionKind,
    events: list[Event],
    *,
    spent_already: bool,
    approved: bool = False,
) -> Outcome:
    """Carry out a read, a test run, a finish or a cancel, and commit what it found.

    ``approved``: the action waited for a person's approval (its commit is
    never deferred: see ``observation_durability``).

    An adapter that refuses the action (a directory named as a file, a
    test command it won't run) is a rejection the agent hears about; one
    that can't be reached changes nothing and says retry later.
    """
    rt = session.rt
    if kind.action_class is ActionClass.CANCEL:
        transition = step_rules.cancel(
            base,
            str(proposal.args["reason"]),
            by="agent",
            action_id=proposal.action_id,
            charge=None if spent_already else proposal.cost,
        )
        return session.apply(transition, prefix=events, context=context)
    session.guard()
    try:
        if kind.action_class is ActionClass.READ:
            args = dict(proposal.args)
            data = rt.adapter.read(kind.name, proposal.target, args, rt.task.allows_target)
            durability = step_rules.observation_durability(
                read=True, approved=approved, riding=session.riding
            )
            transition = step_rules.observed(
                base, proposal, data, spent_already=spent_already, durability=durability
            )
        elif kind.action_class is ActionClass.TEST:
            test = rt.task.tests[proposal.target]
            data = rt.adapter.verify(test.argv, test.timeout_s).summary()
            transition = step_rules.observed(base, proposal, data, spent_already=spent_already)
        elif rt.task.verifier is None:  # finish, and the task names nothing to test
            transition = step_rules.verified(
                base,
                proposal,
                Verification(
                    env_version=base.environment.version,
                    state_fingerprint=base.environment.state_fingerprint,
                    passed=True,
                    exit_code=0,
                    output_digest=digest_bytes(b""),
                    at=rt.clock.now(),
                ),
                judged_here=True,
                output_tail="the task names no verifier: completed on the agent's finish",
                summary=str(proposal.args.get("summary", "")),
                spent_already=spent_already,
                named=False,
            )
        else:  # finish: the task's verifier judges the state the run is in now
            result = rt.adapter.verify(rt.task.verifier.argv, rt.task.verifier.timeout_s)
            transition = step_rules.verified(
                base,
                proposal,
                result.verification(rt.clock.now()),
                judged_here=result.environment == base.environment,
                output_tail=result.output_tail,
                summary=str(proposal.args.get("summary", "")),
                spent_already=spent_already,
            )
    except AdapterUnavailableError as exc:
        return Outcome(
            OutcomeKind.RETRY_LATER, session.state, OutcomeReason.ADAPTER_UNAVAILABLE, str(exc)
        )
    except (ContractViolationError, AdapterError) as exc:
        reason = (
            exc.reason if isinstance(exc, ContractViolationError) else OutcomeReason.ADAPTER_REFUSED
        )
        transition = step_rules.reject(
            base,
            proposal,
            GateRejection(reason, str(exc)),
            rt.task.budgets,
            spent_already=spent_already,
        )
    return session.apply(transition, prefix=events, context=context)


def carry_out_approved(session: Session, pending: PendingWrite) -> Outcome:
    """A non-mutating action waiting for approval: carry it out once an approval holds.

    Held under a policy a recovery has since replaced, it is judged again by
    the policy in force: refused (the agent hears why) if that forbids it,
    carried out without an approval if that needs none. It was built on the
    environment it was held in (``pending.prestate``): one the world has
    moved on from is refused ``stale_version`` by the same rule as any action
    (:func:`~tether.core.version_problem`), approved or not, and the agent
    looks again; an approval could never bind the world as it is now anyway.
    """
    rt = session.rt
    kind = rt.kinds[pending.intent.kind]  # the catalog declares it
    proposal = Proposal(
        pending.action_id,
        pending.intent.kind,
        pending.intent.target,
        args=dict(pending.intent.args),
        based_on_version=pending.prestate.version,
        cost=pending.cost,
    )
    live = rt.adapter.environment()
    # Whatever happens next (done, refused) the held action is no longer pending.
    base = session.state.evolve(phase=Phase.RUNNING, pending=None)
    forbidden = rt.held_problem(session.state)
    if forbidden is not None:
        refused = step_rules.reject(base, proposal, forbidden, rt.task.budgets, spent_already=True)
        return session.apply(refused)
    stale = version_problem(kind, proposal.based_on_version, live)
    if stale is not None:
        refused = step_rules.reject(base, proposal, stale, rt.task.budgets, spent_already=True)
        return session.apply(refused)
    problem = approval_problem(
        session.state,
        needs=needs_approval(rt.policy, kind),
        now=rt.clock.now(),
        live=live,
        idempotent=False,
        policy_version=rt.binding.policy_version,
    )
    if problem is not None:
        return Outcome(OutcomeKind.WAITING_FOR_APPROVAL, session.state, problem[0], problem[1])
    return carry_out(session, base, None, proposal, kind, [], spent_already=True, approved=True)
