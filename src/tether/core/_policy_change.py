"""Policy change: whether a run may adopt another policy, and what becomes of what it holds.

A run is bound to the policy its checkpoint names (the policy *in force*).
A runtime may come back to it with another one (a new file, a new version).
Two questions follow, each answered here as a function of values:

**May the run adopt the newcomer?** (:func:`adoption`) Only the policy in
force can say: a newcomer that says of itself "runs may switch to me" is
exactly what an attacker (or a careless edit) would write. The run's signed
state records the in-force policy's ``authority.policy_change`` clause
(``RunState.policy_change``; a checkpoint older than the field reads as
``refuse``), so the decision never trusts the newcomer.

===========  ==============  ============================  ================
changed      in-force says   admitted by (a person's       adoption
                             signed document)
===========  ==============  ============================  ================
no           anything        anyone                        ``same``
yes          new_occurrence  anyone the policy lets        ``new_occurrence``
                             recover (unsigned included)
yes          refuse          an operator                   ``new_occurrence``
yes          refuse          anyone else, the runtime's    ``refused``
                             own key, or nobody
===========  ==============  ============================  ================

**Is the action the run holds still allowed?** (:func:`held_problem`) An
action held before the change (a write made durable but not yet sent, or
waiting for its approval; a read or test run waiting for approval) is
judged again, right before it would be sent, by the same checks of the
action contract a fresh proposal meets (:func:`~tether.core.contract_problem`:
kind, scope, rule and permission, risk against ``max_risk``, budget); the
approval the policy in force requires is checked there too, by the
approval gate. A compensation is exempt: its authority is the signed
effect decision that ordered it.

**A forbidden held write** (:func:`forbidden_outcome`) is never sent. If the
signed state proves nothing left (``intended``), or the adapter's final
look-up proved it never landed, it is rejected: the ledger says
``rejected``, the trace says why, and the agent hears it. If it may have
been sent (``dispatched``, and nothing proved otherwise after settling by
its key), dropping it would hide an effect that may be real: its outcome
is unknown and a person decides.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum

from tether.core._actions import ActionKind, Rejection, contract_problem
from tether.core._compensation import compensated_effect
from tether.core._phases import EffectStatus
from tether.core._spec import Policy, PolicyChange, TaskSpec
from tether.core._state import RunState

#: The one role whose signed admission adopts a policy the one in force refuses.
ADOPTING_ROLE = "operator"


class Adoption(StrEnum):
    """What an admitted recovery does about the policy this runtime has."""

    SAME = "same"  # the checkpoint's own policy: nothing to adopt
    NEW_OCCURRENCE = "new_occurrence"  # adopted: a new work occurrence, linked to the old one
    REFUSED = "refused"  # the policy in force does not let this admission adopt it


class Forbidden(StrEnum):
    """What becomes of a held write the policy in force forbids."""

    REJECT = "reject"  # nothing left (proved): rejected, the run goes on without it
    REVIEW = "review"  # it may have landed: outcome unknown, a person decides


def adoption(in_force: PolicyChange, *, changed: bool, admitted_by: str | None) -> Adoption:
    """Whether a run whose checkpoint's clause is ``in_force`` may adopt another policy.

    ``changed``: the runtime's policy is not the checkpoint's (id, version or
    fingerprint differ). ``admitted_by``: the role of the person whose signed
    admission document admits this recovery, as the trust roots say now;
    ``None`` when the recovery is unsigned or signed by the runtime's own key
    (a worker vouching for itself is not a person's decision).
    """
    if not changed:
        return Adoption.SAME
    if in_force is PolicyChange.NEW_OCCURRENCE or admitted_by == ADOPTING_ROLE:
        return Adoption.NEW_OCCURRENCE
    return Adoption.REFUSED


def held_problem(
    state: RunState,
    *,
    kinds: Mapping[str, ActionKind],
    task: TaskSpec,
    policy: Policy,
) -> Rejection | None:
    """Why ``policy`` forbids the action ``state`` holds, or ``None`` (nothing held, or allowed).

    The held action's cost was charged when it was proposed, so the budget
    is judged as the gate judged it then: against what was spent before it.
    """
    pending = state.pending
    if pending is None or compensated_effect(pending.intent) is not None:
        return None
    return contract_problem(
        pending.intent.kind,
        pending.intent.target,
        pending.cost,
        kinds=kinds,
        task=task,
        policy=policy,
        cost_spent=max(0, state.spent.cost - pending.cost),
    )


def forbidden_outcome(status: EffectStatus, *, known_absent: bool) -> Forbidden:
    """What becomes of a forbidden held write whose signed status is ``status``.

    ``known_absent``: the adapter's final look-up, asked by the write's key
    after it was dispatched, found nothing (it never landed).
    """
    if status is EffectStatus.INTENDED or known_absent:
        return Forbidden.REJECT
    return Forbidden.REVIEW
