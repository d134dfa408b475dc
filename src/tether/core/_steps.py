"""The steps that are not a write's settling: begin, propose, hold, reject, observe, finish,
cancel, park, as pure values.

Each returns a :class:`~tether.core.Transition` the session commits. What a
step charges and when a budget ends the run is ``_budgets``; the results a
step hands the agent, ``_results``; the action ids a run has used, ``_taken``.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from typing import Any

from tether.core._actions import ActionResult, Proposal, Rejection
from tether.core._budgets import (
    budget_reason,
    charged,
    charged_last,
    exhausted,
    failed,
    spent_budget,
)
from tether.core._canonical import JSONValue
from tether.core._errors import EnvironmentDriftError
from tether.core._model import (
    OUTCOME_OUTPUT_MAX,
    Capabilities,
    EnvironmentState,
    Intent,
    PendingWrite,
    Receipt,
    Verification,
)
from tether.core._phases import EffectStatus, OutcomeReason, Phase, ReviewReason
from tether.core._results import (
    NOTED_OUTCOMES,
    decode_results,
    encode_results,
    note_outcome,
    with_result,
)
from tether.core._review import open_review
from tether.core._spec import Budgets
from tether.core._state import RunState
from tether.core._taken import ACTION_EVENTS, abandoned_stretch, action_id_of, actions_taken
from tether.core._transition import Durability, Event, LedgerNote, OutcomeKind, Transition

# ``step_rules`` (this module) is the one namespace the session reads the
# step rules from; the budget, result and trace-bookkeeping rules live in
# their own modules and are named here too.
__all__ = [
    "ACTION_EVENTS",
    "NOTED_OUTCOMES",
    "abandoned_stretch",
    "action_id_of",
    "actions_taken",
    "begin_step",
    "budget_reason",
    "cancel",
    "charged",
    "charged_last",
    "decode_results",
    "encode_results",
    "exhausted",
    "failed",
    "hold",
    "note_outcome",
    "observed",
    "park",
    "propose_write",
    "reject",
    "spent_budget",
    "verified",
    "with_result",
]


def begin_step(state: RunState, env: EnvironmentState) -> tuple[RunState, list[Event]]:
    """The state a new step starts from, with the environment just read, and what it noticed.

    The step is counted; the previous results are spent (the agent has seen
    them); verifier evidence about another environment is dropped. Another
    instance than the run's is refused: nothing acts on it.
    """
    if env.instance_id != state.environment.instance_id:
        raise EnvironmentDriftError(
            f"run {state.run_id}: the adapter now serves another environment instance; "
            "refusing to act",
            expected=state.environment.to_json(),
            actual=env.to_json(),
            hint="nothing was done: give the runtime the adapter the run started with, "
            "and recover the run",
            run_id=state.run_id,
        )
    events: list[Event] = []
    if env != state.environment:
        events.append(
            ("environment_changed", {"from": state.environment.to_json(), "to": env.to_json()})
        )
    verification = state.verification
    if verification is not None and (
        verification.env_version != env.version
        or verification.state_fingerprint != env.state_fingerprint
    ):
        verification = None  # evidence about an older environment proves nothing about this one
    base = state.evolve(
        environment=env,
        observed_version=env.version,
        spent=replace(state.spent, steps=state.spent.steps + 1),
        results_digest=None,
        last_outcome=None,
        verification=verification,
    )
    return base, events


def _pend(
    state: RunState,
    proposal: Proposal,
    intent: Intent,
    key: str,
    now: datetime,
    expected_post: EnvironmentState,
    status: EffectStatus,
    *,
    mutating: bool,
) -> RunState:
    """``state`` with ``proposal`` as its pending action, charged one proposal and its cost."""
    pending = PendingWrite(
        action_id=proposal.action_id,
        intent=intent,
        intent_digest=intent.digest,
        idempotency_key=key,
        prestate=state.environment,
        expected_post=expected_post,
        generation=state.generation + 1,
        proposed_at=now,
        cost=proposal.cost,
        status=status,
        mutating=mutating,
        dispatched_at=now if status is EffectStatus.DISPATCHED else None,
    )
    return state.evolve(
        phase=Phase.PENDING,
        pending=pending,
        spent=charged(state.spent, proposals=1, cost=proposal.cost),
    )


def propose_write(
    state: RunState,
    proposal: Proposal,
    intent: Intent,
    *,
    key: str,
    expected_post: EnvironmentState,
    now: datetime,
    needs_approval: bool,
    capabilities: Capabilities,
) -> Transition:
    """A write passed the gate: its intent and freshly minted key become durable, pending.

    Sent at once on an adapter that dedups, or whose look-up that finds
    nothing proves the write never landed (``dispatched`` lands with the
    intent: outcome ``in_flight``, the caller sends next): a crash before the
    send is then settled by asking or resending. Otherwise (a blind adapter,
    one whose absence proves nothing, like a mailbox search, or a person must
    sign first) the commit says only ``intended``, and ``dispatched`` gets its
    own commit right before the call, so a crash before the send is known to
    have sent nothing; a write that needs approval waits, and nothing leaves
    the process.
    """
    settles_by_key = capabilities.idempotent or (
        capabilities.queryable and capabilities.absent_is_final
    )
    at_once = not needs_approval and settles_by_key
    status = EffectStatus.DISPATCHED if at_once else EffectStatus.INTENDED
    after = _pend(state, proposal, intent, key, now, expected_post, status, mutating=True)
    pending = after.pending
    if pending is None:  # _pend always sets it; keeps the type checker honest
        raise ValueError("no pending action")
    persisted: Event = (
        "intent_persisted",
        {
            "action_id": pending.action_id,
            "idempotency_key": key,
            "intent_digest": pending.intent_digest,
            "kind": intent.kind,
            "target": intent.target,
            "expected_post": expected_post.to_json(),
        },
    )
    notes: tuple[LedgerNote, ...] = (LedgerNote(EffectStatus.INTENDED),)
    if at_once:
        notes = (*notes, LedgerNote(EffectStatus.DISPATCHED))
    if not needs_approval:
        return Transition(OutcomeKind.IN_FLIGHT, state=after, events=(persisted,), ledger=notes)
    requested: Event = (
        "approval_requested",
        {"action_id": pending.action_id, "idempotency_key": key},
    )
    return Transition(
        OutcomeKind.WAITING_FOR_APPROVAL,
        state=after,
        events=(persisted, requested),
        ledger=notes,
        reason=OutcomeReason.APPROVAL_REQUIRED,
        message=f"the write needs an approval: `tether approve {state.run_id} {pending.action_id}`",
    )


def hold(
    state: RunState, proposal: Proposal, intent: Intent, *, key: str, now: datetime
) -> Transition:
    """A read, a test run or a finish the policy wants approved waits, durable, for a person.

    It becomes the pending action with no ledger entries (it changes nothing)
    and a key minted only to bind the approval to exactly this action.
    """
    after = _pend(
        state, proposal, intent, key, now, state.environment, EffectStatus.INTENDED, mutating=False
    )
    requested: Event = (
        "approval_requested",
        {
            "action_id": proposal.action_id,
            "idempotency_key": key,
            "intent_digest": intent.digest,
            "kind": intent.kind,
            "target": intent.target,
        },
    )
    return Transition(
        OutcomeKind.WAITING_FOR_APPROVAL,
        state=after,
        events=(requested,),
        reason=OutcomeReason.APPROVAL_REQUIRED,
        message=f"{intent.kind} needs an approval: `tether approve {state.run_id} "
        f"{proposal.action_id}`",
    )


def reject(
    state: RunState,
    proposal: Proposal,
    rejection: Rejection,
    budgets: Budgets,
    *,
    spent_already: bool = False,
) -> Transition:
    """Refuse a proposal: it costs one proposal, enters the trace, and is the agent's next result.

    The last proposal the budget allows fails the run, traced ``failed``
    after the rejection (:func:`charged_last`).
    """
    spent = state.spent if spent_already else charged(state.spent, proposals=1)
    after, ending = charged_last(state.evolve(spent=spent), budgets)
    kind = OutcomeKind.FAILED if ending else OutcomeKind.REJECTED
    action_id = (
        proposal.action_id if isinstance(proposal.action_id, str) else repr(proposal.action_id)
    )
    result = ActionResult(
        action_id=action_id,
        kind=str(proposal.kind),
        target=str(proposal.target),
        outcome=OutcomeKind.REJECTED.value,
        reason=rejection.reason,
        data={"message": rejection.message},
    )
    after, blobs = with_result(after, result)
    event = (
        "proposal_rejected",
        {"action_id": action_id, "reason": rejection.reason, "message": rejection.message},
    )
    return Transition(
        kind,
        state=after,
        events=(event, *ending),
        blobs=blobs,
        reason=rejection.reason,
        message=rejection.message,
    )


#: At most this many trace events wait for the run's next commit behind deferred reads: past
#: it a read commits at once (what a crash may drop, and what a session holds, stay bounded).
MAX_RIDING_EVENTS = 256


def observation_durability(*, read: bool, approved: bool, riding: int) -> Durability:
    """When the commit recording a carried-out read or test run must be durable.

    ``read``: the action is a read (a test run is not: its command may leave
    files behind); ``approved``: it waited for a person's approval, whose
    use must be durable once made; ``riding``: the trace events already
    waiting for the run's next commit.

    A read changes nothing outside the run, so a crash that drops its record
    repeats no effect and hides none: the run is where it was before the
    read, and the agent asks again. So its commit rides on the run's next
    one (the next write's intent, any checkpoint, the lease given up), as a
    deferred receipt does; the budget it charged is lost with it.
    """
    if read and not approved and riding < MAX_RIDING_EVENTS:
        return Durability.DEFERRED
    return Durability.NOW


def observed(
    state: RunState,
    proposal: Proposal,
    data: dict[str, JSONValue],
    *,
    spent_already: bool = False,
    durability: Durability = Durability.NOW,
) -> Transition:
    """A read or a test run was carried out: its answer becomes the agent's next result.

    ``durability``: when its commit must land (:func:`observation_durability`).
    """
    spent = state.spent if spent_already else charged(state.spent, proposals=1, cost=proposal.cost)
    result = ActionResult(
        action_id=proposal.action_id,
        kind=proposal.kind,
        target=proposal.target,
        outcome=OutcomeKind.OBSERVED.value,
        data=data,
    )
    after, blobs = with_result(state.evolve(spent=spent, phase=Phase.RUNNING, pending=None), result)
    event = (
        "action_observed",
        {
            "action_id": proposal.action_id,
            "kind": proposal.kind,
            "target": proposal.target,
            "results_digest": after.results_digest,
        },
    )
    return Transition(
        OutcomeKind.OBSERVED, state=after, events=(event,), blobs=blobs, durability=durability
    )


def verified(
    state: RunState,
    proposal: Proposal,
    verification: Verification,
    *,
    judged_here: bool,
    output_tail: str,
    summary: str,
    spent_already: bool = False,
    named: bool = True,
) -> Transition:
    """``finish`` ran the verifier: complete when it passed on exactly this state.

    Otherwise the run goes on, and the agent's next result says why.
    ``named=False``: the task names no verifier, ``verification`` records
    the state the agent finished in, and the run completes on its word, said
    so in the trace (``no_verifier``) and in the stop reason.
    """
    spent = state.spent if spent_already else charged(state.spent, proposals=1, cost=proposal.cost)
    ran = (
        "verifier_ran" if named else "no_verifier",
        {
            **verification.to_json(),
            "action_id": proposal.action_id,
            "judged_current_state": judged_here,
            "output_tail": output_tail[-500:],
        },
    )
    after = state.evolve(spent=spent, verification=verification, phase=Phase.RUNNING, pending=None)
    if verification.passed and judged_here:
        stop = OutcomeReason.VERIFIED if named else OutcomeReason.FINISHED_UNVERIFIED
        return Transition(
            OutcomeKind.FINISHED,
            state=after.evolve(phase=Phase.COMPLETED, stop_reason=stop, results_digest=None),
            events=(ran, ("completed", {"summary": summary})),
            reason=stop,
        )
    reason = (
        OutcomeReason.VERIFIER_FAILED if judged_here else OutcomeReason.VERIFIER_JUDGED_OTHER_STATE
    )
    result = ActionResult(
        action_id=proposal.action_id,
        kind=proposal.kind,
        target=proposal.target,
        outcome=OutcomeKind.VERIFIER_FAILED.value,
        reason=reason,
        data={
            "passed": verification.passed,
            "exit_code": verification.exit_code,
            "output_tail": output_tail[-OUTCOME_OUTPUT_MAX:],
        },
    )
    after, blobs = with_result(after, result)
    return Transition(
        OutcomeKind.VERIFIER_FAILED,
        state=after,
        events=(ran,),
        blobs=blobs,
        reason=reason,
        message=output_tail[-500:],
    )


def cancel(
    state: RunState,
    reason: str,
    *,
    by: str,
    action_id: str | None = None,
    charge: int | None = None,
    document: dict[str, Any] | None = None,
    cursor: int | None = None,
) -> Transition:
    """End a run in ``cancelled``; a pending write must be one that never left.

    A write the signed state says was never sent (``intended``) is dropped
    here and the ledger says ``cancelled``; a dispatched one is the caller's
    to settle first (``settle_rules.cancel_pending``). ``charge``: the
    agent's own cancel costs a proposal and its cost, like any action.
    ``document``: a person's signed cancel (whole, into the trace), read
    from the inbox entry ``cursor``.
    """
    pending = state.pending
    notes: tuple[LedgerNote, ...] = ()
    data: dict[str, JSONValue] = {"reason": reason, "by": by}
    if document is not None:
        data["evidence"] = document
    if cursor is not None:
        data["seq"] = cursor
        state = state.evolve(inbox_cursor=max(state.inbox_cursor, cursor))
    if charge is not None:
        state = state.evolve(spent=charged(state.spent, proposals=1, cost=charge))
    if action_id is not None:
        data["action_id"] = action_id
    if pending is not None:
        if pending.mutating and pending.status is not EffectStatus.INTENDED:
            raise ValueError("a dispatched write must be settled before a cancel")  # caller's bug
        if pending.mutating:
            notes = (LedgerNote(EffectStatus.CANCELLED),)
        data["dropped"] = pending.action_id
    return Transition(
        OutcomeKind.CANCELLED,
        state=state.evolve(
            phase=Phase.CANCELLED,
            stop_reason=OutcomeReason.CANCELLED,
            pending=None,
            results_digest=None,
        ),
        events=(("run_cancelled", data),),
        ledger=notes,
        reason=OutcomeReason.CANCELLED,
        message=reason,
    )


def park(
    state: RunState,
    *,
    case_id: str,
    reason: ReviewReason | str,
    detail: str,
    now: datetime,
    live: EnvironmentState,
    receipt: Receipt | None = None,
    evidence: tuple[dict[str, Any], ...] = (),
) -> Transition:
    """Freeze a run no rule can decide for a person: a worker could not drive it, or
    its environment is ahead of its checkpoint. ``evidence`` goes into the case whole.

    The case names the pending write when there is one (so a decision binds
    it, as any other); otherwise it is about the run. A held non-mutating
    action is dropped: it changed nothing. A replan resumes the run, an abort
    ends it, like any review case.
    """
    # The step's results are dropped: the agent hears of the case, not of the step.
    return open_review(
        state.evolve(results_digest=None),
        case_id=case_id,
        reason=ReviewReason(reason),
        detail=detail,
        now=now,
        live=live,
        receipt=receipt,
        evidence=evidence,
    )
