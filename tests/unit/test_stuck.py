"""A way forward from every stuck state: drift goes to review, accept, signed cancels.

Against the sandbox and a real SQLite file per test; the PostgreSQL, real
workspace and worker-process cases are in tests/integration/test_stuck_*.
"""

from __future__ import annotations

import secrets
from datetime import timedelta
from typing import Any

import pytest

from tests.conftest import ManualClock, ScriptedAgent, World, finish, make_policy, write
from tether.core import (
    AcceptRefusedError,
    ApprovalExpiredError,
    CancelRefusedError,
    EffectStatus,
    EnvironmentDriftError,
    EnvironmentState,
    EvidenceBindingError,
    EvidenceSignatureError,
    OutcomeKind,
    Phase,
    Policy,
    ReviewCase,
    ReviewDriftError,
    RunState,
    SpecError,
    new_cancel,
    new_decision,
)
from tether.core._cancel import check_cancel
from tether.core._evidence import check_accept
from tether.crypto import Signer, TrustRoots
from tether.runtime import CrashPlan, CrashPoint, RunSession, SimulatedCrash
from tether.testing import Sandbox

REVIEWER = Signer.generate("rev", "reviewer")
OPERATOR = Signer.generate("ops", "operator")
APPROVER = Signer.generate("alice", "approver")
TRUST = TrustRoots.of(REVIEWER.trust_root(), OPERATOR.trust_root(), APPROVER.trust_root())
GUARDED = {"file.write": {"risk": "low", "permission": "workspace.write", "needs_approval": True}}


def runtime(world: World, agent: Any = None, **kw: Any) -> Any:
    kw.setdefault("trust", TRUST)
    return world.runtime(agent or ScriptedAgent([write("notes.txt", "x"), finish]), **kw)


def drifted(world: World) -> RunSession:
    """A run that wrote once, crashed before its next proposal, and whose file a person edited.

    Its receipt was committed at once (``defer_receipts=False``): the drift is about
    the run, not about a write whose receipt was not durable yet.
    """
    agent = ScriptedAgent([write("notes.txt", "x"), write("notes.txt", "y", "a1"), finish])
    crashes = CrashPlan(CrashPoint.BEFORE_PROPOSAL, nth=2)
    with pytest.raises(SimulatedCrash):
        runtime(world, agent, crash=crashes, defer_receipts=False).start("r1").run()
    world.sandbox.bypass_write("notes.txt", "a colleague's one-line edit\n")
    agent = ScriptedAgent([write("notes.txt", "x"), write("notes.txt", "y", "a1"), finish])
    return runtime(world, agent).recover("r1")


def decide(world: World, session: RunSession, verdict: str, signer: Signer = REVIEWER) -> Any:
    body = new_decision(
        session.state,
        session.state.review_cases[0],
        signer.signer_id,
        verdict,
        issued_at=world.clock.now(),
        expires_at=world.clock.now() + timedelta(seconds=300),
        nonce=secrets.token_hex(16),
    )
    return signer.sign(body)


def cancel_doc(
    world: World, state: RunState, signer: Signer = OPERATOR, ttl: float = 300, **changes: Any
) -> dict[str, Any]:
    body = new_cancel(
        state,
        signer.signer_id,
        reason="the customer withdrew the request",
        issued_at=world.clock.now(),
        expires_at=world.clock.now() + timedelta(seconds=ttl),
        nonce=secrets.token_hex(16),
    )
    body.update(changes)
    return signer.sign(body)


def case(reason: str, key: str = "") -> ReviewCase:
    env = EnvironmentState("sandbox", "sbx-1", 1, "sha256:" + "a" * 64)
    return ReviewCase(
        case_id="case-1",
        reason=reason,
        action_id="a0" if key else "",
        idempotency_key=key,
        intent_digest="sha256:" + "b" * 64 if key else "",
        receipt=None,
        receipt_fingerprint=None,
        environment=env,
        opened_at=ManualClock().now(),
    )


# -- accept, as a pure rule -----------------------------------------------------


@pytest.mark.parametrize("reason", ["environment_drift", "environment_ahead"])
def test_accept_is_allowed_for_a_drift_case_that_names_no_write(reason: str) -> None:
    """check_accept lets a drift case about the environment alone be accepted."""
    check_accept(case(reason))  # returns nothing: the refusals below are the other half


@pytest.mark.parametrize(
    ("reason", "key"),
    [
        ("outcome_unknown", "idem-1"),
        ("receipt_conflict", "idem-1"),
        ("worker_error", ""),
        ("environment_drift", "idem-1"),
    ],
)
def test_accept_is_refused_where_it_would_hide_a_write_or_is_not_drift(
    reason: str, key: str
) -> None:
    """check_accept refuses a case that is not drift, or that names a write, with a typed error."""
    with pytest.raises(AcceptRefusedError) as caught:
        check_accept(case(reason, key))
    assert caught.value.case_id == "case-1" and caught.value.reason == reason


def test_accept_is_refused_for_an_ahead_case_listing_receipts_the_ledger_never_recorded() -> None:
    """Accepting would leave effects out of the ledger for good: refused, replan or abort instead."""
    from dataclasses import replace

    listed = replace(
        case("environment_ahead"),
        evidence=({"kind": "unrecorded_receipt", "receipt_id": "r-9"},),
    )
    with pytest.raises(AcceptRefusedError, match="never recorded"):
        check_accept(listed)


# -- drift at recovery --------------------------------------------------------------


def test_drift_between_crash_and_recovery_freezes_the_run_with_both_states(world: World) -> None:
    """A file edited outside the run while it was down: recovery opens a drift case, no error."""
    session = drifted(world)
    assert session.state.phase is Phase.NEEDS_REVIEW
    (opened,) = session.state.review_cases
    (evidence,) = opened.evidence
    assert opened.reason == "environment_drift" and opened.idempotency_key == ""
    assert evidence["observed"] == world.sandbox.environment().to_json()
    assert evidence["checkpoint"] == session.state.environment.to_json()
    assert evidence["checkpoint"] != evidence["observed"]
    assert world.store().get_mark("r1").phase == "needs_review"


def test_a_signed_accept_continues_from_the_observed_environment(world: World) -> None:
    """accept closes the drift case; the run goes on from the edited file and completes."""
    session = drifted(world)
    observed = world.sandbox.environment()
    session.review(decide(world, session, "accept"))
    assert session.state.phase is Phase.RUNNING and session.state.environment == observed
    assert session.state.last_outcome is not None
    assert session.state.last_outcome.reason == "accepted"
    kinds = [e.kind for e in session.trace()]
    assert kinds[-2:] == ["review_sealed", "environment_accepted"]
    outcome = session.run()
    assert outcome.kind is OutcomeKind.FINISHED and session.state.phase is Phase.COMPLETED
    assert world.sandbox.files["notes.txt"] == "y"


def test_a_signed_replan_of_a_drift_case_resumes_and_abort_fails_it(world: World) -> None:
    """replan goes on from the observed environment; abort ends the run in failed."""
    session = drifted(world)
    session.review(decide(world, session, "replan"))
    assert session.state.phase is Phase.RUNNING
    assert session.state.environment == world.sandbox.environment()
    assert session.state.quarantined_keys == ()  # the case named no write


def test_a_signed_abort_of_a_drift_case_fails_the_run(world: World) -> None:
    """abort of a drift case ends the run failed, the case sealed into the trace."""
    session = drifted(world)
    session.review(decide(world, session, "abort"))
    assert session.state.phase is Phase.FAILED
    assert session.state.stop_reason == "aborted_by_review"


def test_accept_signed_for_a_conflict_case_is_refused_and_traced(world: World) -> None:
    """An accept forged past new_decision for a case naming a write is refused, traced, frozen."""
    agent = ScriptedAgent([write("notes.txt", "x"), finish])
    rt = runtime(world, agent, crash=CrashPlan(CrashPoint.EFFECT_SENT))
    with pytest.raises(SimulatedCrash):
        rt.start("r1").run()
    pending = rt.checkpointer.load("r1").state.pending
    world.sandbox.tamper_receipt(pending.idempotency_key, intent_digest="sha256:" + "e" * 64)
    session = runtime(world, agent).recover("r1")
    session.step()
    assert session.state.phase is Phase.NEEDS_REVIEW
    with pytest.raises(AcceptRefusedError):
        decide(world, session, "accept")  # the signing helper refuses it first
    body = new_decision(
        session.state,
        session.state.review_cases[0],
        "rev",
        "replan",
        issued_at=world.clock.now(),
        expires_at=world.clock.now() + timedelta(seconds=300),
        nonce=secrets.token_hex(16),
    )
    body["decision"] = "accept"
    with pytest.raises(AcceptRefusedError):
        session.review(REVIEWER.sign(body))
    assert session.state.phase is Phase.NEEDS_REVIEW
    refused = session.trace()[-1]
    assert refused.kind == "evidence_refused" and refused.data["error"] == "AcceptRefusedError"


def test_another_instance_still_fails_closed(world: World) -> None:
    """Drift becomes review; a different environment instance still raises at recovery."""
    runtime(world).start("r1").run(max_steps=1)
    twin = Sandbox(world.sandbox.files, instance_id="sbx-2")
    with pytest.raises(EnvironmentDriftError, match="instance"):
        runtime(world, adapter=twin).recover("r1")


# -- signed cancel ---------------------------------------------------------------------


def test_a_cancel_binds_task_run_policy_reason_expiry_and_nonce(world: World) -> None:
    """check_cancel accepts the body new_cancel makes and refuses each broken binding."""
    state = runtime(world).start("r1").state
    now = world.clock.now()
    good = cancel_doc(world, state)["body"]
    assert check_cancel(good, "ops", state, now=now, ttl_s=600) == good["reason"]
    for name, value, error in [
        ("run_id", "r2", EvidenceBindingError),
        ("policy_fingerprint", "sha256:" + "0" * 64, EvidenceBindingError),
        ("task_id", "t9", EvidenceBindingError),
        ("operator_id", "someone", EvidenceBindingError),
        ("reason", " ", EvidenceSignatureError),
        ("nonce", "short", EvidenceSignatureError),
    ]:
        with pytest.raises(error):
            check_cancel({**good, name: value}, "ops", state, now=now, ttl_s=600)
    with pytest.raises(EvidenceSignatureError):
        check_cancel({**good, "generation": 3}, "ops", state, now=now, ttl_s=600)
    with pytest.raises(ApprovalExpiredError):
        check_cancel(good, "ops", state, now=now + timedelta(seconds=301), ttl_s=600)


def test_a_signed_cancel_in_the_inbox_ends_the_run_at_its_next_step(world: World) -> None:
    """An operator's cancel left in the inbox cancels the run; the document is in the trace."""
    agent = ScriptedAgent([write("notes.txt", "x"), write("notes.txt", "y", "a1"), finish])
    session = runtime(world, agent).start("r1")
    session.step()
    document = cancel_doc(world, session.state)
    seq = world.store().put_evidence("r1", "cancel", document)
    session.step()
    assert session.state.phase is Phase.CANCELLED and session.state.inbox_cursor == seq
    event = session.trace()[-1]
    assert event.kind == "run_cancelled" and event.data["evidence"] == document
    assert event.data["by"] == "operator:ops" and world.sandbox.write_count() == 1


def test_a_cancel_drops_a_write_still_waiting_for_approval(world: World) -> None:
    """A pending write never sent (waiting for approval) is dropped; the ledger says cancelled."""
    world.policy = make_policy(kinds=GUARDED)
    session = runtime(world).start("r1")
    assert session.step().kind is OutcomeKind.WAITING_FOR_APPROVAL
    world.store().put_evidence("r1", "cancel", cancel_doc(world, session.state))
    session.step()
    assert session.state.phase is Phase.CANCELLED and world.sandbox.write_count() == 0
    last = world.store().ledger("r1")[-1]
    assert last.status is EffectStatus.CANCELLED


def test_a_cancel_signed_by_an_approver_is_refused_and_traced(world: World) -> None:
    """Only the roles the policy's authority.cancel names may cancel; others are traced refusals."""
    session = runtime(world).start("r1")
    world.store().put_evidence("r1", "cancel", cancel_doc(world, session.state, signer=APPROVER))
    session.step()
    assert session.state.phase is not Phase.CANCELLED
    refused = next(e for e in session.trace() if e.kind == "evidence_refused")
    assert refused.data["kind"] == "cancel" and refused.data["error"] == "UnknownSignerError"


def test_a_policy_can_let_reviewers_cancel(world: World) -> None:
    """authority.cancel naming reviewers lets a reviewer's signed cancel land."""
    world.policy = make_policy(authority={"cancel": ["operator", "reviewer"]})
    session = runtime(world).start("r1")
    world.store().put_evidence("r1", "cancel", cancel_doc(world, session.state, signer=REVIEWER))
    session.step()
    assert session.state.phase is Phase.CANCELLED


def test_a_cancel_of_a_frozen_run_is_refused_a_review_abort_ends_it(world: World) -> None:
    """A frozen run is not cancelled by a cancel document: it is refused with a typed reason."""
    session = drifted(world)
    world.store().put_evidence("r1", "cancel", cancel_doc(world, session.state))
    session.consume_inbox()
    assert session.state.phase is Phase.NEEDS_REVIEW
    refused = session.trace()[-1]
    assert refused.kind == "evidence_refused"
    assert refused.data["error"] == CancelRefusedError.__name__


def test_a_cancel_refused_while_frozen_is_never_read_again(world: World) -> None:
    """Its nonce is recorded when it is refused, so delivering it again after the review is refused too."""
    session = drifted(world)
    document = cancel_doc(world, session.state)
    world.store().put_evidence("r1", "cancel", document)
    session.consume_inbox()
    assert document["body"]["nonce"] in session.state.cancel_nonces
    session.review(decide(world, session, "accept"))
    assert session.state.phase is Phase.RUNNING
    world.store().put_evidence("r1", "cancel", document)  # the same signed document, replayed
    session.consume_inbox()
    assert session.state.phase is Phase.RUNNING
    refused = session.trace()[-1]
    assert refused.kind == "evidence_refused" and "nonce" in refused.data["message"]


def test_a_cancel_nobody_may_sign_does_not_block_a_frozen_runs_review(world: World) -> None:
    """A frozen run refuses cancels anyway: one no trusted role may sign is refused, the abort behind it applies."""
    session = drifted(world)
    no_operators = TrustRoots.of(REVIEWER.trust_root(), APPROVER.trust_root())
    world.store().put_evidence("r1", "cancel", cancel_doc(world, session.state))
    world.store().put_evidence("r1", "review_decision", decide(world, session, "abort"))
    agent = ScriptedAgent([write("notes.txt", "x"), finish])
    again = runtime(world, agent, trust=no_operators).recover("r1")
    again.consume_inbox()
    assert again.state.phase is Phase.FAILED
    refused = next(e for e in again.trace() if e.kind == "evidence_refused")
    assert refused.data["kind"] == "cancel" and "operators" in refused.data["message"]


def test_the_cancel_authority_is_in_the_fingerprint_only_when_set() -> None:
    """A policy silent on authority.cancel keeps its fingerprint; naming reviewers changes it."""
    plain = make_policy()
    assert "authority" not in plain.to_json()
    same = make_policy(authority={"cancel": ["operator"]})
    assert same.fingerprint == plain.fingerprint
    wider = make_policy(authority={"cancel": ["operator", "reviewer"]})
    assert wider.fingerprint != plain.fingerprint
    assert wider.to_json()["authority"]["cancel"] == ["operator", "reviewer"]
    with pytest.raises(SpecError, match="cancel"):
        Policy.from_json({**plain.to_json(), "authority": {"cancel": []}})
    with pytest.raises(SpecError, match="unknown roles"):
        Policy.from_json({**plain.to_json(), "authority": {"cancel": ["agent"]}})


def test_the_world_moving_again_under_a_drift_case_refreshes_it_and_accept_then_applies(
    world: World,
) -> None:
    """An accept signed before a second edit is refused and the case refreshed; a new one lands."""
    session = drifted(world)
    stale = decide(world, session, "accept")
    world.sandbox.bypass_write("notes.txt", "and a second edit\n")
    with pytest.raises(ReviewDriftError):
        session.review(stale)
    (fresh,) = session.state.review_cases
    assert fresh.reason == "environment_drift"
    assert fresh.environment == world.sandbox.environment()
    session.review(decide(world, session, "accept"))
    assert session.state.phase is Phase.RUNNING
    assert session.state.environment == world.sandbox.environment()
