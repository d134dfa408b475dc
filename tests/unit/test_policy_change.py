"""The policy-change rules, as tables: adopting a policy, and judging what a run holds.

``adoption`` decides by the clause of the policy in force (recorded in the
signed state), never by the newcomer's; ``held_problem`` judges a held action
by the gate's own contract checks; ``forbidden_outcome`` says whether a
forbidden held write is rejected or goes to a person; and the settle rules
never send a write the policy in force forbids.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest

from tests._states import pending_state, pending_write
from tests.conftest import make_policy, make_task
from tether.core import (
    Capabilities,
    EffectStatus,
    EnvironmentState,
    Intent,
    OutcomeKind,
    Phase,
    PolicyChange,
    Proposal,
    RunState,
    Spent,
    UnknownFieldError,
)
from tether.core import _policy_change as policy_rules
from tether.core import _settle as settle_rules
from tether.core._actions import Rejection, catalog, gate
from tether.core._compensation import COMPENSATES
from tether.core._payload import validate_state
from tether.core._policy_change import Adoption
from tether.core._transition import Execute, Facts
from tether.testing import Sandbox

NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
PRE = EnvironmentState("sandbox", "inst", 3, "sha256:" + "a" * 64)
POST = EnvironmentState("sandbox", "inst", 4, "sha256:" + "b" * 64)
KINDS = catalog(Sandbox({}).kinds)
TASK = make_task("sha256:" + "0" * 64)
LOOSE = make_policy()
WRITE = Intent("file.write", "notes.txt", {"content": "x"}, "low")
READ = Intent("file.read", "notes.txt", {}, "low")
HIGH = {"risk": "high", "permission": "workspace.write", "needs_approval": False}

REFUSE, NEW = PolicyChange.REFUSE, PolicyChange.NEW_OCCURRENCE
SAME, ADOPT, REFUSED = Adoption.SAME, Adoption.NEW_OCCURRENCE, Adoption.REFUSED


# -- adoption: the policy in force decides ------------------------------------

ADOPTION_TABLE = [
    # (changed, in force, admitted by) -> adoption
    *[
        (False, clause, who, SAME)
        for clause in (REFUSE, NEW)
        for who in (None, "worker", "operator")
    ],
    (True, NEW, None, ADOPT),
    (True, NEW, "worker", ADOPT),
    (True, NEW, "operator", ADOPT),
    (True, NEW, "reviewer", ADOPT),
    (True, REFUSE, "operator", ADOPT),
    (True, REFUSE, None, REFUSED),
    (True, REFUSE, "worker", REFUSED),
    (True, REFUSE, "reviewer", REFUSED),
    (True, REFUSE, "approver", REFUSED),
]


@pytest.mark.parametrize(("changed", "in_force", "admitted_by", "expected"), ADOPTION_TABLE)
def test_adoption_is_decided_by_the_clause_in_force(
    changed: bool, in_force: PolicyChange, admitted_by: str | None, expected: Adoption
) -> None:
    """A refusing policy in force is left only by an operator's signed admission; new_occurrence by anyone."""
    assert policy_rules.adoption(in_force, changed=changed, admitted_by=admitted_by) is expected


# -- the in-force clause is signed state ---------------------------------------


def state(
    intent: Intent = WRITE,
    *,
    status: EffectStatus = EffectStatus.INTENDED,
    cost: int = 0,
    spent_cost: int = 0,
    mutating: bool = True,
    clause: PolicyChange = REFUSE,
) -> RunState:
    pending = pending_write(
        intent,
        prestate=PRE,
        expected_post=POST if mutating else PRE,
        at=NOW,
        status=status,
        cost=cost,
        mutating=mutating,
    )
    return pending_state(
        pending, at=NOW, spent=Spent(proposals=1, cost=spent_cost), policy_change=clause
    )


@pytest.mark.parametrize("clause", list(PolicyChange))
def test_the_in_force_clause_round_trips_through_the_checkpoint(clause: PolicyChange) -> None:
    """The clause survives the strict codec; ``refuse`` is written as absence, the safe default."""
    held = state(clause=clause)
    payload = held.to_json()
    assert ("policy_change" in payload) is (clause is NEW)
    assert RunState.from_json(payload).policy_change is clause
    validate_state(held)


def test_a_checkpoint_older_than_the_clause_reads_as_refuse() -> None:
    """A payload without the field (every checkpoint before it existed) refuses a change."""
    payload = state(clause=NEW).to_json()
    del payload["policy_change"]
    assert RunState.from_json(payload).policy_change is REFUSE


def test_an_unknown_clause_in_a_checkpoint_is_refused() -> None:
    """A clause word the codec does not know fails the parse instead of meaning anything."""
    payload: dict[str, Any] = {**state().to_json(), "policy_change": "whatever"}
    with pytest.raises(UnknownFieldError, match="policy_change"):
        RunState.from_json(payload)


# -- held_problem: the gate's contract, judged again ---------------------------


def _no_rule_for_writes() -> Any:
    return replace(LOOSE, kinds={k: v for k, v in LOOSE.kinds.items() if k != "file.write"})


def _renamed_permission() -> Any:
    rule = {"risk": "low", "permission": "workspace.admin", "needs_approval": False}
    return make_policy(kinds={"file.write": rule})


HELD_TABLE: list[tuple[str, RunState, dict[str, Any], str | None]] = [
    ("allowed as it was", state(), {}, None),
    ("nothing held", state().evolve(phase=Phase.RUNNING, pending=None), {}, None),
    ("risk above max_risk", state(), {"policy": make_policy(kinds={"file.write": HIGH})}, "risk"),
    ("medium kind, max_risk lowered", state(), {"policy": make_policy(kinds={"file.write": {**HIGH, "risk": "medium"}}, max_risk="low")}, "risk"),
    ("no rule for the kind", state(), {"policy": _no_rule_for_writes()}, "no_rule"),
    ("permission the task lacks", state(), {"policy": _renamed_permission()}, "permission"),
    ("kind the task disallows", state(), {"task": make_task("f", allowed_kinds=["file.read"])}, "scope_kind"),
    ("target outside the paths", state(Intent("file.write", "etc/x", {"content": "x"}, "low")), {}, "scope_target"),
    ("kind nobody declares now", state(), {"kinds": catalog(())}, "unknown_kind"),
    ("its cost is already charged", state(cost=100, spent_cost=100), {}, None),
    ("over the budget before it", state(cost=60, spent_cost=160), {}, "budget_cost"),
    ("a held read, risk above", state(READ, mutating=False), {"policy": make_policy(kinds={"file.read": HIGH}, max_risk="low")}, "risk"),
    ("needs approval now: the approval gate's", state(), {"policy": make_policy(kinds={"file.write": {**HIGH, "risk": "low", "needs_approval": True}})}, None),
    ("a compensation: its decision's", state(Intent("file.write", "notes.txt", {COMPENSATES: {"idempotency_key": "k"}}, "low")), {"policy": make_policy(kinds={"file.write": HIGH})}, None),
]  # fmt: skip


@pytest.mark.parametrize(
    ("case", "held", "overrides", "reason"), HELD_TABLE, ids=[row[0] for row in HELD_TABLE]
)
def test_a_held_action_meets_the_whole_contract_again(
    case: str, held: RunState, overrides: dict[str, Any], reason: str | None
) -> None:
    """Each contract check the gate makes refuses a held action with the gate's own reason word."""
    args: dict[str, Any] = {"kinds": KINDS, "task": TASK, "policy": LOOSE, **overrides}
    problem = policy_rules.held_problem(held, **args)
    assert (None if problem is None else problem.reason) == reason, case


# A compensation is never an agent's proposal; nothing held, nothing to propose.
PROPOSABLE = [
    row
    for row in HELD_TABLE
    if row[1].pending is not None and COMPENSATES not in row[1].pending.intent.args
]


@pytest.mark.parametrize("row", PROPOSABLE, ids=[row[0] for row in PROPOSABLE])
def test_a_held_write_is_judged_as_the_same_proposal_made_fresh(row: Any) -> None:
    """Where a held action and a fresh proposal of it differ only in being held, the verdicts agree."""
    case, held, overrides, reason = row
    pending = held.pending
    assert pending is not None
    args: dict[str, Any] = {"kinds": KINDS, "task": TASK, "policy": LOOSE, **overrides}
    fresh = Proposal(
        "fresh",
        pending.intent.kind,
        pending.intent.target,
        dict(pending.intent.args),
        based_on_version=PRE.version if pending.mutating else None,
        cost=pending.cost,
    )
    rejection = gate(
        fresh,
        **args,
        phase=Phase.RUNNING,
        environment=PRE,
        now=NOW,
        action_seen=False,
        cost_spent=held.spent.cost - pending.cost,
    )
    assert (None if rejection is None else rejection.reason) == reason, case


# -- forbidden_outcome: rejected, or a person decides ---------------------------

OUTCOME_TABLE = [
    (EffectStatus.INTENDED, False, policy_rules.Forbidden.REJECT),
    (EffectStatus.INTENDED, True, policy_rules.Forbidden.REJECT),
    (EffectStatus.DISPATCHED, True, policy_rules.Forbidden.REJECT),
    (EffectStatus.DISPATCHED, False, policy_rules.Forbidden.REVIEW),
]


@pytest.mark.parametrize(("status", "known_absent", "expected"), OUTCOME_TABLE)
def test_a_forbidden_write_is_rejected_only_where_nothing_can_have_landed(
    status: EffectStatus, known_absent: bool, expected: policy_rules.Forbidden
) -> None:
    """Intended, or proved absent by a final look-up: rejected; maybe sent: a person decides."""
    assert policy_rules.forbidden_outcome(status, known_absent=known_absent) is expected


# -- the settle rules never send a forbidden write --------------------------------

RISK = Rejection("risk", "kind 'file.write' is high risk; the policy allows medium")


def facts(*, forbidden: Rejection | None, idempotent: bool = True) -> Facts:
    return Facts(
        now=NOW,
        live=PRE,
        needs_approval=False,
        case_id="case-1",
        capabilities=Capabilities(idempotent=idempotent, queryable=True, conditional_writes=True),
        namespace="sandbox",
        forbidden=forbidden,
    )


def test_an_intended_forbidden_write_is_rejected_and_never_sent() -> None:
    """dispatch: nothing is called, the ledger says rejected, the agent hears the gate's reason."""
    t = settle_rules.dispatch(state(), facts(forbidden=RISK))
    assert t.call is None and t.outcome is OutcomeKind.REJECTED and t.reason == "risk"
    assert [n.status for n in t.ledger] == [EffectStatus.REJECTED]
    assert t.state is not None and t.state.pending is None and t.state.phase is Phase.RUNNING
    assert t.events[0][0] == "effect_rejected" and "never sent" in t.events[0][1]["reason"]


def test_a_dispatched_forbidden_write_proved_absent_is_rejected() -> None:
    """send_again after a final look-up found nothing: rejected, nothing called."""
    held = state(status=EffectStatus.DISPATCHED)
    t = settle_rules.send_again(held, facts(forbidden=RISK), known_absent=True)
    assert t.call is None and t.outcome is OutcomeKind.REJECTED
    assert [n.status for n in t.ledger] == [EffectStatus.REJECTED]


def test_a_dispatched_forbidden_write_that_may_have_landed_goes_to_a_person() -> None:
    """send_again without proof of absence: not sent, outcome unknown, frozen for review."""
    held = state(status=EffectStatus.DISPATCHED)
    t = settle_rules.send_again(held, facts(forbidden=RISK), known_absent=False)
    assert t.call is None and t.outcome is OutcomeKind.FROZEN and t.reason == "outcome_unknown"
    assert [n.status for n in t.ledger] == [EffectStatus.OUTCOME_UNKNOWN]
    assert t.state is not None and t.state.phase is Phase.NEEDS_REVIEW
    assert "forbids" in t.message


def test_an_allowed_write_is_sent_as_before() -> None:
    """Without a verdict against it, dispatch and send_again call the adapter as they did."""
    first = settle_rules.dispatch(state(), facts(forbidden=None))
    again = settle_rules.send_again(state(status=EffectStatus.DISPATCHED), facts(forbidden=None))
    assert isinstance(first.call, Execute) and not first.call.retry
    assert isinstance(again.call, Execute) and again.call.retry
