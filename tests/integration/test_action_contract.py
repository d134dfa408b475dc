"""The first seed's action contract through the real runtime, on a real SQLite file.

One regression test per defect: a read or a test run built on a version the
environment has left was carried out; a rejection spending the last proposal
failed the run without a traced ``failed``; a reviewer decision reusing a
nonce another case consumed was accepted; an approval's nonce was forgotten
once the write it approved settled.
"""

from __future__ import annotations

import secrets
from datetime import timedelta
from typing import Any

import pytest

from tests.conftest import ScriptedAgent, World, finish, make_policy, make_task, write
from tether.core import (
    Intent,
    NonceReusedError,
    Observation,
    OutcomeKind,
    Phase,
    Proposal,
    ReviewReason,
    RunTerminalError,
    new_approval,
    new_decision,
    new_fork,
)
from tether.crypto import Signer, TrustRoots
from tether.runtime import AgentContext, CrashPlan, CrashPoint, Decision, RunSession, SimulatedCrash

ALICE = Signer.generate("alice", "approver")
REVIEWER = Signer.generate("rev", "reviewer")
TRUST = TrustRoots.of(ALICE.trust_root(), REVIEWER.trust_root())
UNIT = {"unit": {"argv": ["python", "-c", "pass"], "timeout_s": 30}}


def on_version(kind: str, target: str, version: int | None, action_id: str) -> Any:
    """A step proposing ``kind`` on ``target``, built on ``version`` whatever it observed."""

    def step(context: AgentContext, obs: Observation) -> Decision:
        proposal = Proposal(action_id, kind, target, based_on_version=version)
        return Decision(
            AgentContext(context.messages, context.memory, context.plan_cursor + 1), proposal
        )

    return step


def reasons(session: RunSession) -> list[tuple[str, Any]]:
    """The trace as (kind, reason) pairs, read back from the store."""
    return [(e.kind, e.data.get("reason")) for e in session.trace()]


# -- a read or a test run built on another version -----------------------------------


def test_a_stale_read_and_test_run_are_refused_as_a_stale_write_is(world: World) -> None:
    """After a write moved the environment to version 1, a read, a test run and a write built
    on version 0 are each refused stale_version; nothing is read or run; a fresh read is."""
    world.task = make_task(world.sandbox.environment().state_fingerprint, tests=UNIT)
    agent = ScriptedAgent(
        [
            write("notes.txt", "x\n", "w0"),
            on_version("file.read", "notes.txt", 0, "r-stale"),
            on_version("tests.run", "unit", 0, "t-stale"),
            write("notes.txt", "y\n", "w-stale", based_on_version=0),
            on_version("file.read", "notes.txt", None, "r-now"),
            finish,
        ]
    )
    session = world.runtime(agent).start("r1")
    assert session.step().kind is OutcomeKind.EXECUTED
    refused = [session.step() for _ in range(3)]
    assert [(o.kind, o.reason) for o in refused] == [(OutcomeKind.REJECTED, "stale_version")] * 3
    assert session.step().kind is OutcomeKind.OBSERVED  # None: built on what it observes now
    recovered = world.runtime(agent).recover("r1")  # the trace as the SQLite file holds it
    trace = recovered.trace()
    rejected = [e.data for e in trace if e.kind == "proposal_rejected"]
    assert [r["action_id"] for r in rejected] == ["r-stale", "t-stale", "w-stale"]
    assert {r["reason"] for r in rejected} == {"stale_version"}
    observed = [e.data["action_id"] for e in trace if e.kind == "action_observed"]
    assert observed == ["r-now"]  # the stale read and test run were never carried out
    assert recovered.state.spent.proposals == 5
    assert world.sandbox.files["notes.txt"] == "x\n"


def test_a_stale_read_through_act_is_refused_and_a_versionless_one_is_read(world: World) -> None:
    """The caller's own loop: act() refuses a read naming a version the environment left."""
    session = world.runtime(ScriptedAgent([finish])).start("r1")
    written = session.act(Proposal("w0", "file.write", "notes.txt", {"content": "x\n"}))
    assert written.kind is OutcomeKind.EXECUTED
    stale = session.act(Proposal("r0", "file.read", "notes.txt", based_on_version=0))
    assert (stale.kind, stale.reason) == (OutcomeKind.REJECTED, "stale_version")
    fresh = session.act(Proposal("r1", "file.read", "notes.txt"))
    assert fresh.kind is OutcomeKind.OBSERVED


def test_a_held_read_whose_environment_moved_is_refused_not_left_waiting(world: World) -> None:
    """A read waiting for approval, its environment changed outside the run, is refused
    stale_version at the next step (an approval could never bind it again); the run goes on."""
    world.policy = make_policy(
        kinds={"file.read": {"risk": "low", "permission": "workspace.read", "needs_approval": True}}
    )
    agent = ScriptedAgent([on_version("file.read", "notes.txt", None, "r0"), finish])
    session = world.runtime(agent, trust=TRUST).start("r1")
    assert session.step().kind is OutcomeKind.WAITING_FOR_APPROVAL
    args = world.sandbox.normalize("file.write", "notes.txt", {"content": "another actor's\n"})
    other = Intent("file.write", "notes.txt", args, "low")
    world.sandbox.execute("someone-else", other, world.sandbox.environment())  # version 0 -> 1
    outcome = session.step()
    assert (outcome.kind, outcome.reason) == (OutcomeKind.REJECTED, "stale_version")
    assert session.state.phase is Phase.RUNNING and session.state.pending is None
    assert session.state.spent.proposals == 1  # charged once, when it was held
    assert not [e for e in session.trace() if e.kind == "action_observed"]
    assert session.run().phase is Phase.COMPLETED


# -- a rejection that spends the last proposal --------------------------------------


def test_a_rejection_spending_the_last_proposal_traces_failed(world: World) -> None:
    """The budget's last proposal, refused, fails the run and the trace says failed, and why."""
    world.task = make_task(world.sandbox.environment().state_fingerprint, budgets={"proposals": 2})
    agent = ScriptedAgent([write("outside.txt", "x")])
    session = world.runtime(agent).start("r1")
    assert session.step().kind is OutcomeKind.REJECTED
    last = session.step()
    assert (last.kind, last.event) == (OutcomeKind.FAILED, "failed")
    assert session.state.stop_reason == "budget_exhausted:proposals"
    with pytest.raises(RunTerminalError):
        world.runtime(agent).recover("r1").step()
    trace = reasons(world.runtime(agent).recover("r1"))
    assert trace[-3:] == [
        ("proposal_rejected", "scope_target"),
        ("proposal_rejected", "scope_target"),
        ("failed", "budget_exhausted:proposals"),
    ]
    assert [kind for kind, _ in trace].count("failed") == 1


def test_a_rejection_through_act_spending_the_last_proposal_traces_failed(world: World) -> None:
    """The same ending when the caller's own loop spends the last proposal on a refused call."""
    world.task = make_task(world.sandbox.environment().state_fingerprint, budgets={"proposals": 1})
    session = world.runtime(ScriptedAgent([finish])).start("r1")
    outcome = session.act(Proposal("w0", "file.write", "outside.txt", {"content": "x"}))
    assert outcome.kind is OutcomeKind.FAILED and session.state.phase is Phase.FAILED
    assert reasons(session)[-1] == ("failed", "budget_exhausted:proposals")


# -- a decision nonce reused across cases -------------------------------------------


def _writes() -> ScriptedAgent:
    steps = [write("notes.txt", "x\n"), write("notes.txt", "y\n", "a1"), write("src/z.py", "z\n")]
    return ScriptedAgent([*steps, finish])


def _conflict(world: World, session: RunSession | None) -> RunSession:
    """Crash right after the next write is sent, tamper its receipt: recovered, frozen."""
    crash = CrashPlan(CrashPoint.EFFECT_SENT)
    with pytest.raises(SimulatedCrash):
        if session is None:
            world.runtime(_writes(), crash=crash, trust=TRUST).start("r1").run()
        else:
            world.runtime(_writes(), crash=crash, trust=TRUST).recover("r1").run()
    pending = world.runtime(_writes(), trust=TRUST).checkpointer.load("r1").state.pending
    assert pending is not None
    world.sandbox.tamper_receipt(pending.idempotency_key, intent_digest="sha256:" + "e" * 64)
    frozen = world.runtime(_writes(), trust=TRUST).recover("r1")
    frozen.step()
    assert frozen.state.phase is Phase.NEEDS_REVIEW
    return frozen


def _decision(world: World, session: RunSession, nonce: str) -> dict[str, Any]:
    now = world.clock.now()
    body = new_decision(
        session.state,
        session.state.review_cases[0],
        REVIEWER.signer_id,
        "replan",
        issued_at=now,
        expires_at=now + timedelta(seconds=300),
        nonce=nonce,
    )
    return REVIEWER.sign(body)


def test_a_decision_reusing_a_nonce_another_case_consumed_is_refused(world: World) -> None:
    """Case 1 is replanned with nonce N; case 2's decision carrying N is refused and traced,
    the run stays frozen (after a restore too), and a fresh nonce opens it."""
    nonce = secrets.token_hex(16)
    first = _conflict(world, None)
    first.review(_decision(world, first, nonce))
    assert first.state.phase is Phase.RUNNING
    second = _conflict(world, first)
    case = second.state.review_cases[0]
    with pytest.raises(NonceReusedError):
        second.review(_decision(world, second, nonce))
    refused = second.trace()[-1]
    assert (refused.kind, refused.data["error"]) == ("evidence_refused", "NonceReusedError")
    restored = world.runtime(_writes(), trust=TRUST).recover("r1")
    assert restored.state.phase is Phase.NEEDS_REVIEW
    assert restored.state.review_cases == (case,)
    with pytest.raises(NonceReusedError):
        restored.review(_decision(world, restored, nonce))
    restored.review(_decision(world, restored, secrets.token_hex(16)))
    assert restored.state.phase is Phase.RUNNING


def test_a_decision_reusing_the_pending_writes_approval_nonce_is_refused(world: World) -> None:
    """An approval's nonce is consumed too: a decision on the case its write fell into, carrying
    it, is refused."""
    world.policy = make_policy(
        kinds={
            "file.write": {"risk": "low", "permission": "workspace.write", "needs_approval": True}
        }
    )
    nonce = secrets.token_hex(16)
    session = world.runtime(_writes(), trust=TRUST).start("r1")
    assert session.step().kind is OutcomeKind.WAITING_FOR_APPROVAL
    now = world.clock.now()
    approval = new_approval(
        session.state,
        ALICE.signer_id,
        issued_at=now,
        expires_at=now + timedelta(seconds=300),
        nonce=nonce,
    )
    session.approve(ALICE.sign(approval))
    frozen = _conflict(world, session)
    with pytest.raises(NonceReusedError):
        frozen.review(_decision(world, frozen, nonce))
    assert frozen.state.phase is Phase.NEEDS_REVIEW


def test_a_fork_reusing_a_decisions_nonce_is_refused(world: World) -> None:
    """A fork is checked against every consumed nonce, not only other forks': one carrying a
    replan's nonce is refused and traced, arming nothing; a fresh nonce arms it."""
    nonce = secrets.token_hex(16)
    session = _conflict(world, None)
    session.review(_decision(world, session, nonce))
    assert session.step().kind is OutcomeKind.EXECUTED
    effect, record = next((e, r) for e, r in session.effects.items() if r.current is not None)
    assert record.current is not None

    def fork(nonce: str) -> dict[str, Any]:
        now = world.clock.now()
        body = new_fork(
            session.state,
            record.current,
            REVIEWER.signer_id,
            issued_at=now,
            expires_at=now + timedelta(seconds=300),
            nonce=nonce,
        )
        return REVIEWER.sign(body)

    with pytest.raises(NonceReusedError):
        session.fork(fork(nonce))
    refused = session.trace()[-1]
    assert (refused.kind, refused.data["kind"]) == ("evidence_refused", "fork")
    assert session.state.forks == ()
    session.fork(fork(secrets.token_hex(16)))
    assert session.state.forks == (effect,)


# -- an approval's nonce outlives the write it approved ----------------------------

GUARDED = {"file.write": {"risk": "low", "permission": "workspace.write", "needs_approval": True}}


def _approval(world: World, session: RunSession, nonce: str) -> dict[str, Any]:
    now = world.clock.now()
    body = new_approval(
        session.state,
        ALICE.signer_id,
        issued_at=now,
        expires_at=now + timedelta(seconds=300),
        nonce=nonce,
    )
    return ALICE.sign(body)


def test_an_approval_nonce_stays_consumed_after_its_write_settled(world: World) -> None:
    """Write 1 approved with nonce N and sent; the next write's approval and a later case's
    decision carrying N are refused (NonceReusedError, traced), after a restore too; once
    N's approval has expired the checkpoint forgets it, and fresh nonces are taken."""
    world.policy = make_policy(kinds=GUARDED)
    nonce = secrets.token_hex(16)
    session = world.runtime(_writes(), trust=TRUST).start("r1")
    assert session.step().kind is OutcomeKind.WAITING_FOR_APPROVAL
    session.approve(_approval(world, session, nonce))
    assert session.step().kind is OutcomeKind.EXECUTED
    assert session.state.pending is None
    assert session.step().kind is OutcomeKind.WAITING_FOR_APPROVAL  # the second write
    with pytest.raises(NonceReusedError, match="consumed before"):
        session.approve(_approval(world, session, nonce))
    refused = session.trace()[-1]
    assert (refused.kind, refused.data["error"]) == ("evidence_refused", "NonceReusedError")
    restored = world.runtime(_writes(), trust=TRUST).recover("r1")
    with pytest.raises(NonceReusedError):
        restored.approve(_approval(world, restored, nonce))
    restored.park(ReviewReason.WORKER_ERROR, "stuck, for a person")  # a case of another kind
    with pytest.raises(NonceReusedError):
        restored.review(_decision(world, restored, nonce))
    assert restored.state.phase is Phase.NEEDS_REVIEW
    restored.review(_decision(world, restored, secrets.token_hex(16)))
    assert restored.state.phase is Phase.RUNNING
    # Six minutes on, N's approval has expired on every clock: it is no longer carried.
    world.clock.advance(360)
    assert restored.step().kind is OutcomeKind.WAITING_FOR_APPROVAL
    restored.approve(_approval(world, restored, secrets.token_hex(16)))
    assert nonce not in {spent.nonce for spent in restored.state.approval_nonces}
    assert restored.step().kind is OutcomeKind.EXECUTED
