"""A policy change never releases what the old policy held, on a real SQLite file.

Two defects, each a regression test through the real runtime: a write left
``intended`` by a crash was sent after a recovery under a policy that forbids
its kind (only the approval rule was checked again), and a policy file that
said ``new_occurrence`` about itself adopted itself over a policy in force
that refused any change.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import ScriptedAgent, World, finish, make_policy, write
from tether.core import (
    AdmissionRefusedError,
    EffectStatus,
    OutcomeKind,
    Phase,
    PolicyChange,
    PolicyMismatchError,
    Proposal,
)
from tether.core._actions import gate
from tether.crypto import Signer, TrustRoots
from tether.runtime import (
    CrashPlan,
    CrashPoint,
    Runtime,
    SimulatedCrash,
    deliver,
    open_run,
    prepare_admission,
)
from tether.testing import Sandbox

OPERATOR = Signer.generate("op-ada", "operator")
WORKER = Signer.generate("worker-7", "worker")
HIGH = {"risk": "high", "permission": "workspace.write", "needs_approval": False}
GUARDED = {"risk": "low", "permission": "workspace.write", "needs_approval": True}
#: v1 lets a recovery adopt another policy; v2 makes file.write too risky.
OPEN_V1 = make_policy(authority={"policy_change": "new_occurrence"})
STRICT_V2 = make_policy(policy_version="2", kinds={"file.write": HIGH})


def agent() -> ScriptedAgent:
    return ScriptedAgent([write("notes.txt", "v1\n", action_id="w1"), finish])


def sandbox(world: World, **capabilities: bool) -> Sandbox:
    """The world's workspace with other capabilities (same files, so the same task)."""
    world.sandbox = Sandbox(
        {"notes.txt": "draft\n"}, instance_id="sbx-1", clock=world.clock.now, **capabilities
    )
    return world.sandbox


def crashed(world: World, point: CrashPoint) -> None:
    """Start run-a under ``world.policy`` and kill it at ``point`` during its write."""
    session = world.runtime(agent(), crash=CrashPlan(point)).start("run-a")
    with pytest.raises(SimulatedCrash):
        session.step()


def statuses(rt: Runtime) -> list[str]:
    return [entry.status.value for entry in rt.store.ledger("run-a")]


def test_a_crashed_intended_write_is_not_sent_under_a_policy_that_forbids_it(
    world: World,
) -> None:
    """Left intended by a crash and recovered under v2 (file.write above max_risk): rejected, never sent."""
    world.policy = OPEN_V1
    blind = sandbox(world, idempotent=False, queryable=False)  # "intended" stays intended
    crashed(world, CrashPoint.INTENT_PERSISTED)
    rt = world.runtime(agent(), policy=STRICT_V2)
    session = rt.recover("run-a")
    assert session.state.pending is not None
    assert session.state.pending.status is EffectStatus.INTENDED
    outcome = session.step()
    assert blind.write_count() == 0
    assert (outcome.kind, outcome.reason) == (OutcomeKind.REJECTED, "risk")
    assert statuses(rt) == ["intended", "rejected"]
    state = session.state
    assert state.phase is Phase.RUNNING and state.pending is None
    assert state.binding.policy_version == "2"
    heard = state.last_outcome
    assert heard is not None and heard.reason == "risk" and "forbids" in heard.message
    rejected = [e for e in session.trace() if e.kind == "effect_rejected"]
    assert rejected and rejected[-1].data["action_id"] == "w1"
    # The same proposal made fresh under v2 is refused with the same word.
    fresh = Proposal("w2", "file.write", "notes.txt", {"content": "v1\n"}, based_on_version=0)
    refusal = gate(
        fresh,
        kinds=rt.kinds,
        task=rt.task,
        policy=STRICT_V2,
        phase=Phase.RUNNING,
        environment=state.environment,
        now=world.clock.now(),
        action_seen=False,
        cost_spent=0,
    )
    assert refusal is not None and refusal.reason == outcome.reason


def test_a_write_waiting_for_approval_is_rejected_under_a_policy_that_forbids_it(
    world: World,
) -> None:
    """Held for a person under v1, then recovered under v2 that forbids the kind: rejected, never sent."""
    world.policy = make_policy(
        kinds={"file.write": GUARDED}, authority={"policy_change": "new_occurrence"}
    )
    session = world.runtime(agent()).start("run-a")
    assert session.step().kind is OutcomeKind.WAITING_FOR_APPROVAL
    rt = world.runtime(agent(), policy=STRICT_V2)
    outcome = rt.recover("run-a").step()
    assert (outcome.kind, outcome.reason) == (OutcomeKind.REJECTED, "risk")
    assert world.sandbox.write_count() == 0
    assert statuses(rt) == ["intended", "rejected"]


@pytest.mark.parametrize(
    ("capabilities", "point", "phase", "ledger", "writes"),
    [
        # Asked by its key first: nothing there, and absence is final: rejected.
        ({}, CrashPoint.INTENT_PERSISTED, Phase.RUNNING, ["dispatched", "rejected"], 0),
        # Asked by its key first: it landed before the crash: that is history, reconciled.
        ({}, CrashPoint.EFFECT_SENT, Phase.RUNNING, ["dispatched", "committed"], 1),
        # Cannot be asked, may have landed: not sent again, a person decides.
        (
            {"queryable": False},
            CrashPoint.INTENT_PERSISTED,
            Phase.NEEDS_REVIEW,
            ["dispatched", "outcome_unknown"],
            0,
        ),
    ],
    ids=["absent_final", "landed", "cannot_ask"],
)
def test_a_dispatched_write_is_settled_by_its_key_before_it_is_judged(
    world: World,
    capabilities: dict[str, bool],
    point: CrashPoint,
    phase: Phase,
    ledger: list[str],
    writes: int,
) -> None:
    """A write that may have been sent is never dropped: settled by its key, then rejected only if it never landed."""
    world.policy = OPEN_V1
    workspace = sandbox(world, **capabilities)
    crashed(world, point)
    rt = world.runtime(agent(), policy=STRICT_V2)
    session = rt.recover("run-a")
    session.step()
    assert workspace.write_count() == writes
    assert statuses(rt) == ["intended", *ledger]
    assert session.state.phase is phase


def guarded_and_waiting(world: World, trust: TrustRoots) -> tuple[Any, int]:
    """run-a under v1 (refuse, the default), its write held for an approval; the mark."""
    world.policy = make_policy(kinds={"file.write": GUARDED})
    assert world.policy.authority.policy_change is PolicyChange.REFUSE
    session = world.runtime(agent(), trust=trust).start("run-a")
    assert session.step().kind is OutcomeKind.WAITING_FOR_APPROVAL
    return session, session.state.generation


def test_a_policy_that_adopts_itself_does_not_release_a_held_write(world: World) -> None:
    """v2 says new_occurrence and needs no approval; v1 in force refuses: recovery is refused, nothing sent."""
    trust = TrustRoots.of(OPERATOR.trust_root(), WORKER.trust_root())
    _, generation = guarded_and_waiting(world, trust)
    v2 = make_policy(policy_version="2", authority={"policy_change": "new_occurrence"})
    for principal in (None, WORKER):
        rt = world.runtime(agent(), policy=v2, trust=TrustRoots.of(OPERATOR.trust_root()))
        if principal is not None:
            rt = world.runtime(agent(), policy=v2, trust=trust, principal=principal)
        with pytest.raises(AdmissionRefusedError) as caught:
            rt.recover("run-a")
        assert caught.value.binding == "policy"
    assert world.sandbox.write_count() == 0
    view = open_run(world.store(), "run-a", keyring=world.keyring)
    assert view.state.generation == generation and view.state.binding.policy_version == "1"
    assert view.state.pending is not None and view.state.phase is Phase.PENDING


def test_an_operators_signed_admission_adopts_the_new_policy(world: World) -> None:
    """Held until an operator signs an admission naming v2 (tether admit); then v2 judges the write."""
    trust = TrustRoots.of(OPERATOR.trust_root())
    guarded_and_waiting(world, trust)
    v2 = make_policy(policy_version="2")  # no approval for file.write; refuses changes itself
    store = world.store()
    now = world.clock.now()
    view = open_run(store, "run-a", keyring=world.keyring, now=now)
    deliver(store, prepare_admission(view, OPERATOR, now=now, policy=v2), now=now)
    rt = world.runtime(agent(), policy=v2, trust=trust)
    session = rt.recover("run-a")
    outcome = session.step()
    assert outcome.kind is OutcomeKind.EXECUTED and world.sandbox.write_count() == 1
    state = session.state
    assert state.binding.policy_version == "2" and state.policy_change is PolicyChange.REFUSE
    opened = [e for e in session.trace() if e.kind == "recovered"][-1].data
    assert opened["principal"] == OPERATOR.signer_id and opened["signed"] is True
    assert opened["previous_policy"]["policy_version"] == "1"


def test_a_finished_run_is_read_under_another_policy_only_where_the_one_in_force_allows(
    world: World,
) -> None:
    """A completed run made under a refusing v1 is refused to a v2 runtime; under an open v1 it reads."""
    for v1, readable in ((make_policy(), False), (OPEN_V1, True)):
        world.policy = v1
        run_id = f"run-{readable}"
        session = world.runtime(ScriptedAgent([finish])).start(run_id)
        session.step()
        assert session.state.phase is Phase.COMPLETED
        rt = world.runtime(agent(), policy=make_policy(policy_version="2"))
        if readable:
            assert rt.recover(run_id).state.phase is Phase.COMPLETED
        else:
            with pytest.raises(PolicyMismatchError):
                rt.recover(run_id)


def test_an_approval_signed_under_the_old_policy_does_not_release_the_write_under_the_new(
    world: World,
) -> None:
    """Approved under v1, recovered under v2 (still gated): it waits for an approval under v2."""
    from tests.conftest import signed_approval

    alice = Signer.generate("alice", "approver")
    trust = TrustRoots.of(alice.trust_root())
    world.policy = make_policy(
        authority={"policy_change": "new_occurrence"}, kinds={"file.write": GUARDED}
    )
    first = world.runtime(agent(), trust=trust).start("run-a")
    assert first.step().kind is OutcomeKind.WAITING_FOR_APPROVAL
    first.approve(signed_approval(alice, first.state, world.clock.now()))
    v2 = make_policy(policy_version="2", kinds={"file.write": GUARDED})
    session = world.runtime(agent(), policy=v2, trust=trust).recover("run-a")
    assert session.awaiting_approval
    waiting = session.step()
    assert (waiting.kind, waiting.reason) == (
        OutcomeKind.WAITING_FOR_APPROVAL,
        "approval_policy_changed",
    )
    assert world.sandbox.write_count() == 0
    session.approve(signed_approval(alice, session.state, world.clock.now()))
    assert session.step().kind is OutcomeKind.EXECUTED
    assert world.sandbox.write_count() == 1
