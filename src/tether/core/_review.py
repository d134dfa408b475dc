"""Opening a review case: the one way a run is frozen for a person.

Every freeze (a write whose outcome nothing can settle, a key conflict, a
replay nothing can answer, a drifted environment, a worker that keeps
failing) builds its case here, so every case binds the same fields the same
way and a reviewer's decision binds it the same way whichever rule opened it.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from typing import Any

from tether.core._model import EnvironmentState, Receipt, ReviewCase
from tether.core._phases import EffectStatus, Phase, ReviewReason
from tether.core._state import RunState
from tether.core._transition import LedgerNote, OutcomeKind, Transition

#: At most this much of a case's detail is kept (a worker's traceback can be long).
DETAIL_MAX = 2000
#: At most this much of it is the outcome's message.
MESSAGE_MAX = 500


def open_review(
    state: RunState,
    *,
    case_id: str,
    reason: ReviewReason,
    detail: str,
    now: datetime,
    live: EnvironmentState,
    receipt: Receipt | None = None,
    evidence: tuple[dict[str, Any], ...] = (),
    ledger: tuple[LedgerNote, ...] = (),
    status: EffectStatus | None = None,
) -> Transition:
    """Enter needs_review with a case holding every piece of evidence.

    The case names the pending write when there is one, so a decision binds
    it (its action, key and intent digest); a held action that changes
    nothing is dropped (there is nothing to decide about it). ``ledger``
    notes land with the freeze (``committed`` first, when the effect is known
    to have happened, whatever a person decides), and ``status`` (by default
    the last note's) is the pending write's ledger status as the frozen state
    keeps it. ``live`` is the environment as it is now.
    """
    pending = state.pending
    if pending is not None and not pending.mutating:
        pending = None
    case = ReviewCase(
        case_id=case_id,
        reason=ReviewReason(reason).value,
        action_id="" if pending is None else pending.action_id,
        idempotency_key="" if pending is None else pending.idempotency_key,
        intent_digest="" if pending is None else pending.intent_digest,
        receipt=None if receipt is None else receipt.to_json(),
        receipt_fingerprint=None if receipt is None else receipt.fingerprint,
        environment=live,
        opened_at=now,
        detail=detail[-DETAIL_MAX:],
        evidence=tuple(evidence),
    )
    if status is None and ledger:
        status = ledger[-1].status
    if pending is not None and status is not None:
        pending = replace(pending, status=status)
    if pending is not None and pending.resend_ordered:
        # A resend a reviewer ordered that froze again before it left (a policy
        # that now forbids it): the new case is decided afresh.
        pending = replace(pending, resend_ordered=False)
    return Transition(
        OutcomeKind.FROZEN,
        state=state.evolve(
            phase=Phase.NEEDS_REVIEW,
            pending=pending,
            review_cases=(*state.review_cases, case),
        ),
        events=(("needs_review", case.to_json()),),
        ledger=ledger,
        reason=case.reason,
        message=detail[-MESSAGE_MAX:],
    )
