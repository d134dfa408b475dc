"""Gathering the facts the replay rule reads, and carrying out what it says.

The rule itself is :func:`tether.core.replay_rules.judge`, a function of
values; this module only reads the world for it: whether a stateful target
would change, the adapter's receipt under the key the rule names, whether
the policy gates the kind and an approval holds. A replay the policy gates
waits for a person as a held action (it changes nothing, so it has no
ledger entries) and is answered once approved, judged again then.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from tether.adapters import capabilities_of, namespace_of, target_moved, where_to_look
from tether.core import (
    ContractViolationError,
    EnvironmentState,
    Intent,
    Outcome,
    OutcomeKind,
    OutcomeReason,
    PendingWrite,
    Phase,
    Proposal,
    RunState,
    Targets,
)
from tether.core import _replay as replay_rules
from tether.core import _steps as step_rules
from tether.core._actions import Rejection as GateRejection
from tether.core._actions import needs_approval, risk_of
from tether.core._evidence import (
    active_approval,
    approval_problem,
    remember_replay_approval,
    replay_approved,
)
from tether.core._ledger import target_digest
from tether.core._transition import Lookup, Transition
from tether.runtime._view import Session


def replay_or_fork(
    session: Session,
    base: RunState,
    proposal: Proposal,
    intent: Intent,
    effect: str,
    *,
    approved: bool = False,
    charged: bool = False,
    live: EnvironmentState | None = None,
) -> Transition | replay_rules.Proceed:
    """What the replay rule says of a write of ``intent`` (its effect digest ``effect``).

    ``live``: the environment as read now, where ``base`` may hold an older one (a
    held replay carried out later); whether the target moved is judged on it.
    """
    rt = session.rt
    record = session.effects.get(effect)
    forked = effect in base.forks
    if record is None and not forked:
        return replay_rules.Proceed(base)
    caps = capabilities_of(rt.adapter, proposal.kind)
    moved: bool | None = False
    if caps.stateful and not forked:
        env = base.environment if live is None else live
        moved = rt.adapter.derive_post_state(env, intent).state_fingerprint != env.state_fingerprint
    elif caps.target_state and not forked and record is not None:
        moved = target_moved(rt.adapter, intent)  # a function's holds(): asked, not derived
    overwritten = replay_rules.Overwrite.NO
    if (
        not forked
        and not caps.tracks_targets
        and caps.targets is not Targets.COLLECTION  # the answer would change nothing
        and record is not None
    ):
        # A, B, A where nothing can read the target: did another effect land on it since,
        # or may it have (sent, its outcome unknown)?
        target = target_digest(namespace_of(rt.adapter, intent.kind), intent.kind, intent.target)
        overwritten = session.history.on_target(target, effect)
    key = replay_rules.lookup_key(
        record, caps, forked=forked, target_moved=moved, overwritten=overwritten
    )
    answer = None
    if key is not None:
        current = None if record is None else record.current
        # Judged against the intent when it is exactly the recorded attempt's
        # (an adapter that keeps its own request fingerprint needs it).
        same = current is not None and current.intent_digest == intent.digest
        answer = session.ask(Lookup(key, intent if same else None))
    age = None
    unsettled = None if record is None else record.unsettled
    if answer is not None and unsettled is not None and caps.retention_s is not None:
        # Read after the look-up answered, on the store's clock: a worker whose own
        # clock runs behind cannot take a forgotten key's absence as final.
        age = session.history.key_age(effect, unsettled.idempotency_key)
    kind = rt.kinds[proposal.kind]
    rule = rt.policy.kinds.get(proposal.kind)
    now = rt.clock.now()
    version = rt.binding.policy_version
    approved = approved or replay_approved(base, effect, now=now, policy_version=version)
    judgement = replay_rules.judge(
        replay_rules.ReplayFacts(
            record=record,
            capabilities=caps,
            now=rt.clock.now(),
            forked=forked,
            target_moved=moved,
            overwritten=overwritten,
            answer=answer,
            needs_approval=needs_approval(rt.policy, kind),
            approved=approved,
            sensitive=rule is not None and rule.sensitive,
            key_age_s=age,
        )
    )
    shown = None
    known = judgement.known
    if judgement.verdict is replay_rules.Verdict.REVIEW and known is not None:
        # What the reviewer needs to find the earlier attempt: this is the same effect.
        shown = {
            "kind": intent.kind,
            "target": intent.target,
            "where_to_look": where_to_look(rt.adapter, known.idempotency_key, intent),
        }
        if rule is None or not rule.sensitive:
            shown["args"] = dict(intent.args)
    return replay_rules.decide(
        base,
        proposal,
        judgement,
        effect=effect,
        budgets=rt.task.budgets,
        case_id=rt.ids.new_id("case"),
        now=rt.clock.now(),
        live=base.environment if live is None else live,  # what a review case records
        charged=charged,
        # A replay the policy gates waits as a held action: the proposal as it came,
        # keyed only to bind a person's approval to exactly it.
        held=Intent(
            kind.name, proposal.target, dict(proposal.args), risk_of(rt.policy, kind).value
        ),
        hold_key=rt.ids.new_id("idem") if judgement.verdict is replay_rules.Verdict.HOLD else "",
        shown=shown,
    )


def carry_out_held(session: Session, pending: PendingWrite) -> Outcome:
    """A held replay, once approved: judged again now (the adapter asked again), then answered.

    Held under a policy a recovery has since replaced, it is judged by the
    policy in force, as any held action: refused if that forbids the kind,
    answered without an approval if that needs none.
    """
    rt = session.rt
    held = pending.intent
    proposal = Proposal(
        pending.action_id, held.kind, held.target, args=dict(held.args), cost=pending.cost
    )
    base = session.state.evolve(phase=Phase.RUNNING, pending=None)
    forbidden = rt.held_problem(session.state)
    if forbidden is not None:
        return session.apply(
            step_rules.reject(base, proposal, forbidden, rt.task.budgets, spent_already=True)
        )
    # A replay sends nothing, so an approval of it binds no environment: one signed
    # before an unrelated file changed still answers it (judged against the run's own).
    problem = approval_problem(
        session.state,
        needs=needs_approval(rt.policy, rt.kinds[held.kind]),
        now=rt.clock.now(),
        live=session.state.environment,
        idempotent=False,
        policy_version=rt.binding.policy_version,
    )
    if problem is not None:
        return Outcome(OutcomeKind.WAITING_FOR_APPROVAL, session.state, problem[0], problem[1])
    try:
        args: dict[str, Any] = rt.adapter.normalize(held.kind, held.target, dict(held.args))
    except ContractViolationError as exc:
        refused = GateRejection(exc.reason, str(exc))
        return session.apply(
            step_rules.reject(base, proposal, refused, rt.task.budgets, spent_already=True)
        )
    intent = Intent(held.kind, held.target, args, held.risk)
    decided = replay_or_fork(
        session,
        base,
        proposal,
        intent,
        rt.effect_digest(intent),
        approved=True,
        charged=True,
        live=rt.adapter.environment(),
    )
    if isinstance(decided, replay_rules.Proceed):
        # The world moved while it waited: no longer a replay. It is dropped, and
        # the agent, told why, proposes it again as the write it now is.
        return session.apply(
            step_rules.reject(
                base,
                proposal,
                GateRejection(
                    OutcomeReason.REPLAY_OUTDATED,
                    "the effect this approval would have replayed no longer stands; propose "
                    "the write again",
                ),
                rt.task.budgets,
                spent_already=True,
            )
        )
    if decided.state is None:
        return Outcome(decided.outcome, session.state, decided.reason, decided.message)
    if decided.outcome is OutcomeKind.REPLAYED:
        # This approval also answers the same replay asked again while it lives (a
        # graph node that re-runs, a continuation run twice) without a person.
        remembered = remember_replay_approval(
            decided.state,
            rt.effect_digest(intent),
            active_approval(session.state),
            now=rt.clock.now(),
        )
        decided = replace(decided, state=remembered)
    return session.apply(decided)
