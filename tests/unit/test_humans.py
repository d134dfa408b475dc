"""Signed approvals that expire, and a review gate only a trusted signed decision opens.

Each test is one bullet of the first seed's "How to validate" on approvals,
expiry, replay versus conflict, reviewer trust and evidence.
"""

from __future__ import annotations

import secrets
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from tests.conftest import ScriptedAgent, World, finish, make_policy, make_task, write
from tether.core import (
    EffectStatus,
    EvidenceBindingError,
    EvidenceSignatureError,
    NonceReusedError,
    OutcomeKind,
    Phase,
    PolicyError,
    ReviewDriftError,
    RunFrozenError,
    RunState,
    TrustRootsRequiredError,
    UnknownSignerError,
    new_approval,
    new_decision,
)
from tether.crypto import Signer, TrustRoots
from tether.runtime import CrashPlan, CrashPoint, RunSession, SimulatedCrash
from tether.testing import Sandbox

ALICE = Signer.generate("alice", "approver")
MALLORY = Signer.generate("mallory", "approver")
REVIEWER = Signer.generate("rev", "reviewer")
TRUST = TrustRoots.of(ALICE.trust_root(), REVIEWER.trust_root())
GUARDED = {"file.write": {"risk": "low", "permission": "workspace.write", "needs_approval": True}}


@pytest.fixture
def guarded(world: World) -> World:
    world.policy = make_policy(kinds=GUARDED, approval_ttl_s=600)
    return world


def agent() -> ScriptedAgent:
    return ScriptedAgent([write("notes.txt", "x"), finish])


def two_writes() -> ScriptedAgent:
    return ScriptedAgent([write("notes.txt", "x"), write("notes.txt", "y", "a1"), finish])


def runtime(world: World, **kw: Any):
    kw.setdefault("trust", TRUST)
    return world.runtime(kw.pop("agent", None) or agent(), **kw)


def approval(
    world: World, state: RunState, signer: Signer = ALICE, ttl: float = 300, **changes: Any
) -> dict[str, Any]:
    now = world.clock.now()
    body = new_approval(
        state,
        signer.signer_id,
        issued_at=now,
        expires_at=now + timedelta(seconds=ttl),
        nonce=secrets.token_hex(16),
    )
    body.update(changes)
    return signer.sign(body)


def pending_session(world: World) -> RunSession:
    session = runtime(world).start("r1")
    session.step()
    assert session.state.phase is Phase.PENDING
    return session


# -- approvals -----------------------------------------------------------------


def test_a_write_that_needs_approval_waits_and_never_executes_without_one(guarded: World) -> None:
    """The pending write stays pending, run() stops, and a step says an approval is required."""
    session = pending_session(guarded)
    assert session.awaiting_approval
    assert session.run().phase is Phase.PENDING
    outcome = session.step()
    assert (outcome.kind, outcome.reason) == (OutcomeKind.WAITING_FOR_APPROVAL, "approval_required")
    assert outcome.event is None  # waiting commits nothing
    assert guarded.sandbox.write_count() == 0
    assert session.trace()[-1].kind == "approval_requested"


def test_an_approval_in_the_agents_own_proposal_is_a_contract_violation(guarded: World) -> None:
    """A proposal claiming its own approval is refused, traced, and approves nothing."""
    claims = ScriptedAgent([write("notes.txt", "x", args={"content": "x", "approved_by": "me"})])
    session = runtime(guarded, agent=claims).start("r1")
    session.step()
    assert session.trace()[-1].data["reason"] == "embedded_approval"
    assert session.state.pending is None and guarded.sandbox.write_count() == 0


def test_a_valid_approval_lets_the_write_execute_once(guarded: World) -> None:
    """A trusted, bound, unexpired approval is recorded, checkpointed whole, and the write runs."""
    session = pending_session(guarded)
    document = approval(guarded, session.state)
    session.approve(document)
    restored = runtime(guarded).checkpointer.load("r1").state
    assert restored.pending is not None and restored.pending.approvals == (document,)
    assert session.run().phase is Phase.COMPLETED
    assert guarded.sandbox.write_count() == 1


def test_an_unknown_signer_is_refused(guarded: World) -> None:
    """An approval signed by a key the runtime does not trust is refused."""
    session = pending_session(guarded)
    with pytest.raises(UnknownSignerError):
        session.approve(approval(guarded, session.state, MALLORY))


def test_a_reviewer_key_cannot_approve(guarded: World) -> None:
    """Trust roots are per role: a reviewer's signature is not an approval."""
    session = pending_session(guarded)
    forged = Signer(REVIEWER.signer_id, ALICE.role, REVIEWER.alg, REVIEWER._secret)
    with pytest.raises(UnknownSignerError):
        session.approve(approval(guarded, session.state, forged))


def test_a_tampered_approval_is_refused(guarded: World) -> None:
    """Changing a signed field after signing breaks the signature."""
    session = pending_session(guarded)
    document = approval(guarded, session.state)
    document["body"] = {**document["body"], "expires_at": "2099-01-01T00:00:00.000000Z"}
    with pytest.raises(EvidenceSignatureError):
        session.approve(document)


def test_hmac_trust_roots_work_where_there_are_no_asymmetric_keys(guarded: World) -> None:
    """An HMAC approver configured as a trust root is accepted like an Ed25519 one."""
    bot = Signer.hmac("bot", "approver", secrets.token_bytes(32))
    session = pending_session(guarded)
    session.rt.trust = TrustRoots.of(bot.trust_root())
    session.approve(approval(guarded, session.state, bot))
    assert session.run().phase is Phase.COMPLETED


@pytest.mark.parametrize(
    ("field_name", "value"),
    [
        ("task_id", "other-task"),
        ("run_id", "other-run"),
        ("policy_version", "2"),
        ("action_id", "other-action"),
        ("idempotency_key", "idem-other"),
        ("intent_digest", "sha256:" + "9" * 64),
        ("environment_version", 5),
        ("environment_instance_id", "sbx-other"),
        ("state_fingerprint", "sha256:" + "8" * 64),
        ("approver_id", "bob"),
    ],
)
def test_every_binding_is_enforced(guarded: World, field_name: str, value: object) -> None:
    """An approval bound to another run, task, policy, action, key, intent, environment or state is refused."""
    session = pending_session(guarded)
    with pytest.raises(EvidenceBindingError) as caught:
        session.approve(approval(guarded, session.state, **{field_name: value}))
    assert caught.value.field == field_name
    assert session.state.pending is not None and not session.state.pending.approvals


def test_an_approval_binds_the_pending_write_not_the_checkpoint_generation(
    guarded: World,
) -> None:
    """Re-checkpoints and a restore leave an approval valid; a body still binding a generation is refused."""
    session = pending_session(guarded)
    document = approval(guarded, session.state)
    signed_at = session.state.generation
    with pytest.raises(UnknownSignerError):  # its refusal is checkpointed: the generation moves
        session.approve(approval(guarded, session.state, MALLORY))
    recovered = runtime(guarded).recover("r1")  # a new epoch, recorded with its first commit
    assert recovered.state.generation == signed_at + 1
    with pytest.raises(EvidenceSignatureError, match="unknown fields"):
        recovered.approve(approval(guarded, recovered.state, generation=signed_at))
    recovered.approve(document)
    assert recovered.run().phase is Phase.COMPLETED
    assert guarded.sandbox.write_count() == 1


def test_expiry_is_exclusive_and_checked_without_any_new_proposal(guarded: World) -> None:
    """At exactly expires_at the approval no longer executes, though nothing else happened."""
    session = pending_session(guarded)
    session.approve(approval(guarded, session.state, ttl=10))
    guarded.clock.advance(10)
    outcome = session.step()
    assert (outcome.kind, outcome.reason) == (OutcomeKind.WAITING_FOR_APPROVAL, "approval_expired")
    assert session.awaiting_approval
    assert guarded.sandbox.write_count() == 0


def test_an_approval_longer_lived_than_the_policy_allows_is_refused(guarded: World) -> None:
    """expires_at more than approval_ttl_s after issued_at is refused."""
    session = pending_session(guarded)
    with pytest.raises(EvidenceBindingError) as caught:
        session.approve(approval(guarded, session.state, ttl=601))
    assert caught.value.field == "expires_at"


def test_a_consumed_nonce_is_refused_again_even_after_a_restore(guarded: World) -> None:
    """A nonce once recorded can never be registered again, across checkpoint and restore."""
    session = pending_session(guarded)
    document = approval(guarded, session.state)
    session.approve(document)
    with pytest.raises(NonceReusedError):
        session.approve(document)
    again = runtime(guarded).recover("r1")
    assert again.state.pending is not None
    assert document["body"]["nonce"] in {spent.nonce for spent in again.state.approval_nonces}
    with pytest.raises(NonceReusedError):
        again.approve(document)


def test_the_environment_is_refingerprinted_before_the_approved_write(guarded: World) -> None:
    """A change after approval (same version, new content) stops the write until re-approved."""
    session = pending_session(guarded)
    session.approve(approval(guarded, session.state))
    guarded.sandbox.bypass_write("notes.txt", "changed under us")
    outcome = session.step()
    assert (outcome.kind, outcome.reason) == (OutcomeKind.WAITING_FOR_APPROVAL, "approval_stale")
    assert "environment changed" in outcome.message
    assert guarded.sandbox.write_count() == 0


def test_expired_approval_restores_readable_and_stays_frozen_until_fresh(guarded: World) -> None:
    """Expiry is not corruption: the evidence restores, the write waits, a fresh approval runs it."""
    session = pending_session(guarded)
    old = approval(guarded, session.state, ttl=60)
    session.approve(old)
    guarded.clock.advance(3600)
    recovered = runtime(guarded).recover("r1")  # restores: no integrity error
    pending = recovered.state.pending
    assert pending is not None and pending.approvals == (old,)
    assert recovered.run().phase is Phase.PENDING  # waits for a person
    assert recovered.step().reason == "approval_expired"
    fresh = approval(guarded, recovered.state)
    recovered.approve(fresh)
    superseded = [e for e in recovered.trace() if e.kind == "approval_superseded"]
    assert superseded and superseded[-1].data["evidence"] == old
    assert recovered.state.pending is not None
    assert recovered.state.pending.approvals == (fresh,)
    recovered.step()
    assert guarded.sandbox.write_count() == 1
    receipt = guarded.sandbox.lookup(pending.idempotency_key)
    assert receipt is not None  # the same key as before the expiry: never a second key


def test_a_write_committed_before_the_crash_reconciles_without_a_new_approval(
    guarded: World,
) -> None:
    """If the receipt proves the approved write committed, recovery reconciles only."""
    session = pending_session(guarded)
    session.approve(approval(guarded, session.state, ttl=60))
    session.rt.crash = session.rt.checkpointer.crash = CrashPlan(CrashPoint.EFFECT_SENT)
    with pytest.raises(SimulatedCrash):
        session.step()
    guarded.clock.advance(3600)  # the approval has expired by the time we recover
    recovered = runtime(guarded).recover("r1")
    recovered.step()
    assert recovered.state.phase is Phase.RUNNING
    assert recovered.trace()[-1].kind == "effect_reconciled"
    assert guarded.sandbox.write_count() == 1


def test_a_commit_after_the_approval_expired_enters_review(guarded: World) -> None:
    """A receipt whose commit time is past the approval's expiry is not reconciled automatically."""
    session = pending_session(guarded)
    session.approve(approval(guarded, session.state, ttl=60))
    session.rt.crash = session.rt.checkpointer.crash = CrashPlan(CrashPoint.EFFECT_SENT)
    with pytest.raises(SimulatedCrash):
        session.step()
    pending = session.state.pending
    assert pending is not None
    guarded.sandbox.tamper_receipt(
        pending.idempotency_key, committed_at="2026-12-02T13:00:00.000000Z"
    )
    recovered = runtime(guarded).recover("r1")
    recovered.step()
    assert recovered.state.phase is Phase.NEEDS_REVIEW
    assert recovered.state.review_cases[0].reason == "approval_boundary"


def test_restoring_approval_evidence_needs_the_trust_roots_again(guarded: World) -> None:
    """Without the approvers' trust roots a checkpoint carrying approvals does not restore."""
    session = pending_session(guarded)
    session.approve(approval(guarded, session.state))
    with pytest.raises(TrustRootsRequiredError):
        runtime(guarded, trust=None).recover("r1")
    with pytest.raises(TrustRootsRequiredError):
        runtime(guarded, trust=TrustRoots.of(REVIEWER.trust_root())).recover("r1")
    with pytest.raises(TrustRootsRequiredError):
        runtime(guarded, trust=TrustRoots.of(MALLORY.trust_root())).recover("r1")
    assert runtime(guarded).recover("r1").state.phase is Phase.PENDING


def test_same_key_same_intent_replay_still_needs_a_live_approval(guarded: World) -> None:
    """Retrying the same key and intent after expiry needs a new approval; a conflict does not reuse it."""
    session = pending_session(guarded)
    session.approve(approval(guarded, session.state, ttl=60))
    guarded.sandbox.fail_next(after_commit=False)
    outcome = session.step()
    assert (outcome.kind, outcome.reason) == (OutcomeKind.RETRY_LATER, "adapter_unavailable")
    assert "not attempted" in outcome.message
    pending = session.state.pending
    assert pending is not None and pending.status is EffectStatus.DISPATCHED
    guarded.clock.advance(61)
    outcome = session.step()
    assert (outcome.kind, outcome.reason) == (OutcomeKind.WAITING_FOR_APPROVAL, "approval_expired")
    session.approve(approval(guarded, session.state))
    assert session.step().kind is OutcomeKind.EXECUTED
    assert guarded.sandbox.write_count() == 1
    assert guarded.sandbox.lookup(pending.idempotency_key) is not None  # the same key, retried


# -- the review gate ----------------------------------------------------------------


def conflicted(world: World) -> RunSession:
    """A run frozen by same key / different intent, recovered in a fresh runtime."""
    rt = runtime(world, agent=two_writes(), crash=CrashPlan(CrashPoint.EFFECT_SENT))
    with pytest.raises(SimulatedCrash):
        rt.start("r1").run()
    pending = rt.checkpointer.load("r1").state.pending
    assert pending is not None
    world.sandbox.tamper_receipt(pending.idempotency_key, intent_digest="sha256:" + "e" * 64)
    session = runtime(world, agent=two_writes()).recover("r1")
    session.step()
    assert session.state.phase is Phase.NEEDS_REVIEW
    return session


def decision(
    world: World,
    session: RunSession,
    verdict: str = "replan",
    signer: Signer = REVIEWER,
    **changes: Any,
) -> dict[str, Any]:
    body = new_decision(
        session.state,
        session.state.review_cases[0],
        signer.signer_id,
        verdict,
        issued_at=world.clock.now(),
        expires_at=world.clock.now() + timedelta(seconds=300),
        nonce=secrets.token_hex(16),
    )
    body.update(changes)
    return signer.sign(body)


def test_needs_review_refuses_proposals_execution_and_approvals(world: World) -> None:
    """A frozen run refuses steps and approvals with typed errors, keeping its case."""
    session = conflicted(world)
    with pytest.raises(RunFrozenError):
        session.step()
    with pytest.raises(PolicyError):
        session.approve(approval(world, session.state))
    assert len(session.state.review_cases) == 1


def refused(world: World, session: RunSession, document: dict[str, Any], error: type) -> None:
    before = session.state.review_cases
    with pytest.raises(error):
        session.review(document)
    assert session.state.phase is Phase.NEEDS_REVIEW
    assert session.state.review_cases == before
    assert session.trace()[-1].kind == "evidence_refused"
    assert session.trace()[-1].data["kind"] == "review_decision"


def test_an_unknown_reviewer_leaves_the_case_frozen(world: World) -> None:
    """A decision signed by an untrusted reviewer is refused, traced, and changes nothing."""
    session = conflicted(world)
    stranger = Signer.generate("stranger", "reviewer")
    refused(world, session, decision(world, session, signer=stranger), UnknownSignerError)


def test_a_tampered_decision_leaves_the_case_frozen(world: World) -> None:
    """A decision edited after signing (replan turned into abort) is refused."""
    session = conflicted(world)
    document = decision(world, session, "replan")
    document["body"] = {**document["body"], "decision": "abort"}
    refused(world, session, document, EvidenceSignatureError)


@pytest.mark.parametrize(
    ("field_name", "value"),
    [
        ("run_id", "r-other"),
        ("task_id", "t-other"),
        ("policy_version", "9"),
        ("action_id", "a-other"),
        ("idempotency_key", "idem-other"),
        ("pending_intent_digest", "sha256:" + "1" * 64),
        ("receipt_intent_digest", "sha256:" + "2" * 64),
        ("receipt_fingerprint", "sha256:" + "3" * 64),
        ("environment_version", 99),
    ],
)
def test_every_decision_binding_is_enforced(world: World, field_name: str, value: object) -> None:
    """A decision bound to anything but this case, both digests and this receipt is refused."""
    session = conflicted(world)
    refused(world, session, decision(world, session, **{field_name: value}), EvidenceBindingError)


def refreshed(world: World, session: RunSession, document: dict[str, Any]) -> None:
    """The stale decision is refused and never applies; the case now records the world as it
    is, and a decision signed against it is accepted."""
    (before,) = session.state.review_cases
    with pytest.raises(ReviewDriftError):
        session.review(document)
    assert session.state.phase is Phase.NEEDS_REVIEW
    kinds = [e.kind for e in session.trace()[-2:]]
    assert kinds == ["evidence_refused", "review_case_refreshed"]
    (case,) = session.state.review_cases
    assert case.case_id != before.case_id and case.environment == world.sandbox.environment()
    assert case.evidence[-1]["kind"] == "changed_under_review"
    assert case.evidence[-1]["previous_case"] == before.case_id
    key = case.idempotency_key
    assert case.receipt_fingerprint == world.sandbox.lookup(key).fingerprint  # type: ignore[union-attr]
    session.review(decision(world, session, "abort"))
    assert session.state.phase is Phase.FAILED


def test_an_environment_change_after_issuance_refuses_the_decision_and_refreshes_the_case(
    world: World,
) -> None:
    """If the environment moved between signing and consuming, the decision is refused."""
    session = conflicted(world)
    document = decision(world, session)
    world.sandbox.bypass_write("notes.txt", "moved on")
    refreshed(world, session, document)


def test_receipt_drift_after_issuance_refuses_the_decision_and_refreshes_the_case(
    world: World,
) -> None:
    """The runtime rereads the adapter's receipt before consuming a decision; drift refuses it."""
    session = conflicted(world)
    document = decision(world, session)
    key = session.state.review_cases[0].idempotency_key
    world.sandbox.tamper_receipt(key, receipt_id="rcpt-changed")
    refreshed(world, session, document)


def test_a_trusted_replan_quarantines_the_key_and_resumes_with_a_new_one(world: World) -> None:
    """Replan seals the evidence, quarantines the key for good, and resumes via a new proposal."""
    session = conflicted(world)
    case = session.state.review_cases[0]
    document = decision(world, session, "replan")
    session.review(document)
    assert session.state.phase is Phase.RUNNING
    assert session.state.pending is None
    assert case.idempotency_key in session.state.quarantined_keys
    sealed = next(e for e in session.trace() if e.kind == "review_sealed")
    assert sealed.data["case"] == case.to_json()
    assert sealed.data["decision"] == document
    assert sealed.data["pending"]["idempotency_key"] == case.idempotency_key
    assert session.run().phase is Phase.COMPLETED
    assert session.state.last_write is not None
    assert session.state.last_write.idempotency_key not in session.state.quarantined_keys
    # A pending write may never reuse a quarantined key.
    from tether.core import InvariantError
    from tether.core._payload import validate_state

    state = session.state
    pending = replace(state.pending or _some_pending(state), idempotency_key=case.idempotency_key)
    with pytest.raises(InvariantError, match="quarantined"):
        validate_state(
            state.evolve(phase=Phase.PENDING, stop_reason=None, pending=pending, verification=None)
        )


def _some_pending(state: RunState):
    from tether.core import Intent, PendingWrite

    intent = Intent("file.write", "notes.txt", {"content": "z"}, "low")
    return PendingWrite(
        "z",
        intent,
        intent.digest,
        "idem-z",
        state.environment,
        state.environment,
        state.generation,
        state.updated_at,
        0,
    )


def test_a_trusted_abort_fails_the_run_and_keeps_all_evidence(world: World) -> None:
    """Abort ends the run failed, the pending write cleared, case, intent and decision sealed."""
    session = conflicted(world)
    pending, (case,) = session.state.pending, session.state.review_cases
    document = decision(world, session, "abort")
    session.review(document)
    assert session.state.phase is Phase.FAILED
    assert session.state.stop_reason == "aborted_by_review"
    assert session.state.pending is None and session.state.review_cases == ()
    assert session.state.environment == case.environment  # where the decision was made
    sealed = next(e for e in session.trace() if e.kind == "review_sealed")
    assert pending is not None and sealed.data["pending"] == pending.to_json()
    assert sealed.data["case"] == case.to_json() and sealed.data["decision"] == document
    restored = runtime(world).recover("r1").state  # restores in that same environment
    assert restored.phase is Phase.FAILED
    assert world.sandbox.write_count() == 1


@pytest.mark.parametrize("verdict", ["replan", "abort"])
def test_restoring_a_consumed_decision_needs_the_reviewer_trust_root(
    world: World, verdict: str
) -> None:
    """A state shaped by a reviewer's decision restores only where that reviewer is trusted."""
    session = conflicted(world)
    document = decision(world, session, verdict)
    session.review(document)
    assert session.state.decisions == (document,)
    approvers_only = TrustRoots.of(ALICE.trust_root())
    for trust in (
        None,
        approvers_only,
        TrustRoots.of(Signer.generate("rev", "reviewer").trust_root()),
    ):
        with pytest.raises(TrustRootsRequiredError):
            world.runtime(two_writes(), trust=trust).recover("r1")
    assert runtime(world).recover("r1").state.decisions == (document,)


def test_open_cases_and_nonces_survive_checkpoint_and_restore(world: World) -> None:
    """The open case and a refused decision's state come back whole; a spent decision stays spent."""
    session = conflicted(world)
    refused(
        world,
        session,
        decision(world, session, signer=Signer.generate("x", "reviewer")),
        UnknownSignerError,
    )
    restored = runtime(world).recover("r1")
    assert restored.state.review_cases == session.state.review_cases
    assert restored.state.phase is Phase.NEEDS_REVIEW
    document = decision(world, restored, "abort")
    restored.review(document)
    again = runtime(world).recover("r1")
    assert again.state.review_cases == ()  # the case is closed: no decision can apply again
    with pytest.raises(RunFrozenError):
        again.review(document)  # the run is over; the nonce is spent either way


def test_an_approval_issued_in_the_future_is_refused(guarded: World) -> None:
    """An approval whose issue time is ahead of the runtime's clock cannot stretch its lifetime."""
    session = pending_session(guarded)
    later = guarded.clock.now() + timedelta(days=365)
    body = new_approval(
        session.state,
        ALICE.signer_id,
        issued_at=later,
        expires_at=later + timedelta(seconds=300),
        nonce=secrets.token_hex(16),
    )
    with pytest.raises(EvidenceBindingError) as caught:
        session.approve(ALICE.sign(body))
    assert caught.value.field == "issued_at"


def test_an_idempotent_unqueryable_adapter_finishes_an_approved_write_after_a_crash(
    guarded: World,
) -> None:
    """After the effect, the retry with the same key dedups; the approval still covers it."""
    guarded.sandbox = Sandbox(
        {"notes.txt": "draft\n"}, instance_id="sbx-1", queryable=False, clock=guarded.clock.now
    )
    session = pending_session(guarded)
    session.approve(approval(guarded, session.state))
    session.rt.crash = session.rt.checkpointer.crash = CrashPlan(CrashPoint.EFFECT_SENT)
    with pytest.raises(SimulatedCrash):
        session.step()
    recovered = runtime(guarded).recover("r1")
    assert recovered.run().phase is Phase.COMPLETED
    assert guarded.sandbox.write_count() == 1


def test_checkpoints_stay_flat_as_approvals_accumulate(guarded: World) -> None:
    """200 approved writes, ten seconds apart: the last checkpoint is within 1 KB of the fortieth
    (an approval's nonce is kept only until the approval expires, five minutes on; approvals
    for replays are kept for the newest 32 effects only)."""
    guarded.task = make_task(
        guarded.sandbox.environment().state_fingerprint,
        budgets={"proposals": 500, "steps": 1000},
    )
    steps = [write("notes.txt", f"v{i}\n", f"a{i}") for i in range(200)]
    session = runtime(guarded, agent=ScriptedAgent(steps)).start("r1")
    sizes: list[int] = []  # after each write committed
    approved: list[int] = []  # with the approval and its nonce on the pending write
    for _ in range(200):
        guarded.clock.advance(10)
        outcome = session.step()
        assert outcome.kind is OutcomeKind.WAITING_FOR_APPROVAL
        session.approve(approval(guarded, session.state))
        approved.append(len(session.rt.checkpointer.load("r1").envelope))
        assert session.step().kind is OutcomeKind.EXECUTED
        sizes.append(len(session.rt.checkpointer.load("r1").envelope))
    assert session.state.writes_committed == guarded.sandbox.write_count() == 200
    assert session.state.ledger_length == 600  # intended, dispatched, committed per write
    assert sizes[-1] - sizes[39] <= 1024, (sizes[39], sizes[-1])
    assert approved[-1] - approved[39] <= 1024, (approved[39], approved[-1])
    assert len(session.state.replay_approvals) <= 32
    # The nonces of the approvals of the last six minutes (five alive, one of clock skew).
    assert len(session.state.approval_nonces) == 36


def test_a_frozen_run_taken_over_opens_a_new_epoch_with_the_decision(world: World) -> None:
    """Another worker applies the decision: its epoch and name are on the commit, traced."""
    frozen = conflicted(world)
    epoch = frozen.state.epoch
    generation = runtime(world, agent=two_writes(), worker="w-second").checkpointer.load("r1")
    taker = runtime(world, agent=two_writes(), worker="w-second").recover("r1")
    assert taker.state.generation == generation.state.generation  # the restore wrote nothing
    taker.review(decision(world, taker, "abort"))
    assert (taker.state.epoch, taker.state.worker) == (epoch + 1, "w-second")
    recovered = [e for e in taker.trace() if e.kind == "recovered"]
    assert recovered[-1].data["previous_epoch"] == epoch


def test_trust_roots_without_the_needed_role_leave_the_evidence_unread(world: World) -> None:
    """Roots with approvers only meet a reviewer's decision: a configuration error, cursor kept."""
    from tether.core import TrustRootsRequiredError

    frozen = conflicted(world)
    document = decision(world, frozen, "abort")
    world.store().put_evidence("r1", "review_decision", document)
    approvers_only = TrustRoots.of(ALICE.trust_root())
    session = runtime(world, agent=two_writes(), trust=approvers_only).recover("r1")
    with pytest.raises(TrustRootsRequiredError, match="no reviewers"):
        session.run()
    assert session.state.inbox_cursor == frozen.state.inbox_cursor  # nothing consumed
    fixed = runtime(world, agent=two_writes()).recover("r1")
    fixed.run()
    assert fixed.state.phase is Phase.FAILED  # the same signed decision, read once fixed


@pytest.mark.parametrize("signature", [None, 5])
def test_a_document_without_signature_text_is_refused_saying_so(signature: object) -> None:
    """A missing or non-text signature is named as such, not as another algorithm."""
    signed = ALICE.sign({"kind": "approval"})
    with pytest.raises(EvidenceSignatureError, match="no signature text"):
        TRUST.verify({**signed, "signature": signature}, ALICE.role)


def test_a_run_awaits_approval_exactly_while_it_has_none_alive(world: World) -> None:
    """None yet, then one alive (even for a since-changed environment), then one expired."""
    from tests.conftest import signed_approval
    from tether.core._evidence import awaits_approval

    rule = {"risk": "low", "permission": "workspace.write", "needs_approval": True}
    world.policy = make_policy(kinds={"file.write": rule})
    trust = TrustRoots.of(ALICE.trust_root())
    session = world.runtime(ScriptedAgent([write("notes.txt", "x\n"), finish]), trust=trust).start(
        "r1"
    )
    now = world.clock.now()
    assert awaits_approval(session.state, needs=True, now=now) is False  # nothing pending yet
    session.step()
    assert awaits_approval(session.state, needs=False, now=now) is False
    assert awaits_approval(session.state, needs=True, now=now) is True
    assert session.awaiting_approval is True
    session.approve(signed_approval(ALICE, session.state, now))
    world.sandbox.bypass_write("src/other.txt", "moved\n")  # stale now: judged at the send
    assert awaits_approval(session.state, needs=True, now=now) is False
    later = now + timedelta(seconds=301)
    assert awaits_approval(session.state, needs=True, now=later) is True


def test_an_approval_under_another_policy_version_is_no_approval(world: World) -> None:
    """At the send and for awaits_approval alike: signed under v1, the run now under v2."""
    from tests.conftest import signed_approval
    from tether.core._evidence import approval_problem, awaits_approval

    rule = {"risk": "low", "permission": "workspace.write", "needs_approval": True}
    world.policy = make_policy(kinds={"file.write": rule})
    trust = TrustRoots.of(ALICE.trust_root())
    agent = ScriptedAgent([write("notes.txt", "x\n"), finish])
    session = world.runtime(agent, trust=trust).start("r1")
    session.step()
    now = world.clock.now()
    session.approve(signed_approval(ALICE, session.state, now))
    live = world.sandbox.environment()
    kw: dict[str, Any] = {"needs": True, "now": now, "live": live, "idempotent": False}
    assert approval_problem(session.state, **kw, policy_version="1") is None
    problem = approval_problem(session.state, **kw, policy_version="2")
    assert problem is not None and problem[0] == "approval_policy_changed"
    assert awaits_approval(session.state, needs=True, now=now, policy_version="1") is False
    assert awaits_approval(session.state, needs=True, now=now, policy_version="2") is True
