"""Which reviewer decision settles which review case, every cell, and what each settlement commits.

The expected table is written here a second time, as a plain restatement
of the one in ``tether.core._case_table``, so the two must agree everywhere.
The transitions are checked the way a commit checks them: every phase and
effect-status move through ``seal_commit``, every state through
``validate_state``.
"""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests._states import pending_state, pending_write
from tether.core import (
    AcceptRefusedError,
    Capabilities,
    DecisionRefusedError,
    EffectStatus,
    EnvironmentState,
    EvidenceSignatureError,
    Intent,
    OutcomeKind,
    Phase,
    ReviewDecision,
    ReviewReason,
    RunState,
    new_decision,
)
from tether.core import _case_rules as case_rules
from tether.core import _replay as replay_rules
from tether.core import _settle as settle_rules
from tether.core._case_table import (
    REVIEW_NAMESPACE,
    CaseKind,
    Settlement,
    case_kind,
    fitting,
    settlement,
)
from tether.core._commit import noted_write, seal_commit
from tether.core._evidence import check_decision
from tether.core._payload import validate_state
from tether.core._review import open_review
from tether.core._transition import EffectRef, Execute, Facts, LedgerNote

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
ENV = EnvironmentState("smtp", "mail-1", 0, "sha256:" + "a" * 64)
INTENT = Intent("email.send", "customer@example.com", {"subject": "s", "body": "b"}, "low")

D = ReviewDecision
S = Settlement
K = CaseKind
#: The table, restated: (kind, decision) -> settlement; a missing cell is refused.
EXPECTED: dict[tuple[CaseKind, ReviewDecision], Settlement] = {
    (K.UNKNOWN_OUTCOME, D.REPLAN): S.REPLAN,
    (K.UNKNOWN_OUTCOME, D.ABORT): S.ABORT,
    (K.UNKNOWN_OUTCOME, D.LANDED): S.LANDED,
    (K.UNKNOWN_OUTCOME, D.NOT_LANDED): S.RESEND,
    (K.UNKNOWN_OUTCOME, D.COMPENSATE): S.LANDED_COMPENSATE,
    (K.UNKNOWN_ON_CANCEL, D.REPLAN): S.REPLAN,
    (K.UNKNOWN_ON_CANCEL, D.ABORT): S.ABORT,
    (K.UNKNOWN_ON_CANCEL, D.LANDED): S.LANDED_CANCEL,
    (K.UNKNOWN_ON_CANCEL, D.NOT_LANDED): S.DROPPED_CANCEL,
    (K.UNKNOWN_EARLIER, D.REPLAN): S.REPLAN,
    (K.UNKNOWN_EARLIER, D.ABORT): S.ABORT,
    (K.UNKNOWN_EARLIER, D.LANDED): S.LANDED_EARLIER,
    (K.COMMITTED_FROZEN, D.REPLAN): S.REPLAN,
    (K.COMMITTED_FROZEN, D.ABORT): S.ABORT,
    (K.COMMITTED_FROZEN, D.COMPENSATE): S.COMPENSATE,
    (K.ENVIRONMENT_DRIFT, D.REPLAN): S.REPLAN,
    (K.ENVIRONMENT_DRIFT, D.ABORT): S.ABORT,
    (K.ENVIRONMENT_DRIFT, D.ACCEPT): S.ACCEPT,
    (K.OTHER, D.REPLAN): S.REPLAN,
    (K.OTHER, D.ABORT): S.ABORT,
}


def frozen(kind: CaseKind) -> RunState:
    """A run frozen on a case of ``kind``, opened the way the rules open it."""
    pending = pending_write(
        INTENT, prestate=ENV, expected_post=ENV, at=NOW, status=EffectStatus.DISPATCHED
    )
    state = pending_state(pending, at=NOW)
    running = state.evolve(phase=Phase.RUNNING, pending=None)
    opened: dict[CaseKind, Any] = {
        K.UNKNOWN_OUTCOME: (state, ReviewReason.OUTCOME_UNKNOWN, EffectStatus.OUTCOME_UNKNOWN),
        K.UNKNOWN_ON_CANCEL: (
            state,
            ReviewReason.CANCEL_OUTCOME_UNKNOWN,
            EffectStatus.OUTCOME_UNKNOWN,
        ),
        K.COMMITTED_FROZEN: (state, ReviewReason.RECEIPT_MISMATCH, EffectStatus.COMMITTED),
        K.OTHER: (state, ReviewReason.KEY_CONFLICT, None),
        K.UNKNOWN_EARLIER: (running, ReviewReason.REPLAY_OF_UNKNOWN, None),
        K.ENVIRONMENT_DRIFT: (running, ReviewReason.ENVIRONMENT_DRIFT, None),
    }
    base, reason, status = opened[kind]
    evidence: tuple[dict[str, Any], ...] = ()
    if kind is K.UNKNOWN_EARLIER:
        evidence = ({"kind": reason.value, "earlier_idempotency_key": "idem-0"},)
    return (
        open_review(
            base,
            case_id="case-1",
            reason=reason,
            detail="d",
            now=NOW,
            live=ENV,
            evidence=evidence,
            ledger=() if status is None else (LedgerNote(status),),
        ).state
        or base
    )


@pytest.mark.parametrize("kind", list(CaseKind))
def test_each_frozen_state_is_the_kind_of_case_it_was_built_as(kind: CaseKind) -> None:
    """case_kind reads the kind from the case and the pending write alone."""
    state = frozen(kind)
    validate_state(state)
    assert case_kind(state.review_cases[-1], state) is kind


@pytest.mark.parametrize(("kind", "decision"), list(itertools.product(CaseKind, ReviewDecision)))
def test_every_cell_of_the_table(kind: CaseKind, decision: ReviewDecision) -> None:
    """A fitting decision gets its settlement; any other is refused, typed, naming the decisions that fit."""
    state = frozen(kind)
    case = state.review_cases[-1]
    want = EXPECTED.get((kind, decision))
    if want is not None:
        assert settlement(case, state, decision) is want
        assert decision in fitting(kind)
        return
    with pytest.raises(DecisionRefusedError) as refused:
        settlement(case, state, decision)
    assert refused.value.case_id == "case-1" and refused.value.decision == decision.value
    assert refused.value.fits == tuple(d.value for d in fitting(kind))
    assert decision not in fitting(kind)


def decision_body(state: RunState, decision: str, evidence: str | None = None) -> dict[str, Any]:
    return new_decision(
        state,
        state.review_cases[-1],
        "rita",
        decision,
        issued_at=NOW,
        expires_at=NOW + timedelta(seconds=60),
        nonce="n" * 32,
        evidence=evidence,
    )


def test_landed_needs_the_evidence_the_reviewer_found() -> None:
    """landed without evidence, with an empty one, a non-text one or one too long is refused."""
    state = frozen(K.UNKNOWN_OUTCOME)
    case = state.review_cases[-1]
    for missing in (None, "", "   "):
        with pytest.raises(DecisionRefusedError, match="evidence"):
            decision_body(state, "landed", missing)
    body = decision_body(state, "abort")
    with pytest.raises(DecisionRefusedError):
        check_decision({**body, "decision": "landed"}, "rita", state, case, now=NOW, ttl_s=600)
    for bad in (42, "x" * 2001):
        with pytest.raises(EvidenceSignatureError):
            check_decision(
                {**body, "decision": "landed", "evidence": bad},
                "rita",
                state,
                case,
                now=NOW,
                ttl_s=600,
            )
    good = decision_body(state, "landed", "<tether-1@shop.test>")
    assert check_decision(good, "rita", state, case, now=NOW, ttl_s=600) is D.LANDED
    assert good["evidence"] == "<tether-1@shop.test>"


def test_accept_on_a_write_names_the_decisions_that_fit() -> None:
    """accept on an unknown outcome is refused as AcceptRefusedError, whose message lists landed."""
    state = frozen(K.UNKNOWN_OUTCOME)
    with pytest.raises(AcceptRefusedError) as refused:
        decision_body(state, "accept")
    assert "landed" in str(refused.value) and "landed" in refused.value.fits


def sealed(before: RunState, transition: Any) -> RunState:
    """The transition committed as the session commits it: every move checked."""
    after = transition.state
    effect = noted_write(before.pending, after.pending)
    result = seal_commit(
        before, after, transition.events, now=NOW, ledger=transition.ledger, effect=effect
    )
    validate_state(result.state)
    return result.state


def settle(state: RunState, decision: str, evidence: str | None = None, **extra: Any) -> Any:
    body = decision_body(state, decision, evidence)
    document = {"signer": "rita", "alg": "ed25519", "body": body, "signature": "s"}
    case = state.review_cases[-1]
    return case_rules.settle_case(
        state,
        case,
        settlement(case, state, decision),
        document,
        body,
        cursor=None,
        now=NOW,
        **extra,
    )


def test_landed_records_the_write_committed_by_the_reviewer_and_goes_on() -> None:
    """landed: running, nothing pending, one committed note whose receipt names the reviewer and the evidence."""
    state = frozen(K.UNKNOWN_OUTCOME)
    transition = settle(state, "landed", "<mid@x>")
    after = sealed(state, transition)
    assert after.phase is Phase.RUNNING and after.pending is None and not after.review_cases
    (note,) = transition.ledger
    assert note.status is EffectStatus.COMMITTED and note.subject is None
    receipt = note.receipt
    assert receipt["namespace"] == REVIEW_NAMESPACE and receipt["business_object_id"] == "<mid@x>"
    assert receipt["result"]["reviewer_id"] == "rita"
    assert after.writes_committed == 1 and after.last_write is not None
    assert transition.call is None


def test_not_landed_keeps_the_write_pending_and_the_next_settle_sends_it_once_under_its_key() -> (
    None
):
    """not_landed: pending, resend ordered; settle commits dispatched (order cleared) and sends with the same key."""
    state = frozen(K.UNKNOWN_OUTCOME)
    transition = settle(state, "not_landed")
    after = sealed(state, transition)
    assert after.phase is Phase.PENDING and after.pending is not None
    assert after.pending.resend_ordered and after.pending.status is EffectStatus.OUTCOME_UNKNOWN
    assert transition.ledger == ()
    facts = Facts(
        now=NOW,
        live=ENV,
        needs_approval=False,
        case_id="case-2",
        capabilities=Capabilities(idempotent=False, queryable=False, conditional_writes=False),
        namespace="smtp",
    )
    send = settle_rules.settle(after, facts)
    assert isinstance(send.call, Execute) and send.call.retry
    assert send.call.key == state.pending.idempotency_key  # type: ignore[union-attr]
    assert [n.status for n in send.ledger] == [EffectStatus.DISPATCHED]
    sent = sealed(after, send)
    assert sent.pending is not None and not sent.pending.resend_ordered and sent.pending.resent
    # Settled again without an answer (a crash after the commit): unknown again, never resent.
    again = settle_rules.settle(sent, facts)
    assert again.outcome is OutcomeKind.FROZEN and again.call is None


@pytest.mark.parametrize(
    ("decision", "status"),
    [("landed", EffectStatus.COMMITTED), ("not_landed", EffectStatus.CANCELLED)],
)
def test_a_case_a_cancel_opened_ends_cancelled_once_the_write_is_settled(
    decision: str, status: EffectStatus
) -> None:
    """On a cancel's case, landed records committed and not_landed cancelled; the run ends cancelled either way."""
    state = frozen(K.UNKNOWN_ON_CANCEL)
    transition = settle(state, decision, "seen" if decision == "landed" else None)
    after = sealed(state, transition)
    assert after.phase is Phase.CANCELLED and after.pending is None
    assert [n.status for n in transition.ledger] == [status]


def test_landed_earlier_records_the_set_aside_attempt_by_its_subject() -> None:
    """landed on a replay of an unknown effect: the earlier key is committed (named as subject); the run goes on."""
    state = frozen(K.UNKNOWN_EARLIER)
    earlier = EffectRef("idem-0", "a0", "sha256:" + "e" * 64, EffectStatus.OUTCOME_UNKNOWN)
    transition = settle(state, "landed", "https://x/1", earlier=earlier)
    after = sealed(state, transition)
    assert after.phase is Phase.RUNNING
    (note,) = transition.ledger
    assert note.subject == earlier and note.status is EffectStatus.COMMITTED


def test_a_reviewed_receipt_is_replayed_from_the_ledger_without_asking() -> None:
    """A re-proposal of an effect a person found landed is replayed, settled by review, even where the adapter can be asked."""
    receipt = {"namespace": REVIEW_NAMESPACE, "receipt_id": "review:case-1", "result": {}}
    known = replay_rules.KnownEffect("eff", "a1", "idem-1", "sha256:x", receipt)
    record = replay_rules.EffectHistory(committed=known)
    caps = Capabilities(idempotent=False, queryable=True, conditional_writes=False, stateful=False)
    assert replay_rules.lookup_key(record, caps) is None
    judged = replay_rules.judge(replay_rules.ReplayFacts(record=record, capabilities=caps, now=NOW))
    assert judged.verdict is replay_rules.Verdict.REPLAY and judged.settled_by == "review"
