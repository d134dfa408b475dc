"""The steps people take, as pure values: record an approval, apply a reviewer decision.

The runtime verifies a signed document against its trust roots and every
binding (``check_approval``, ``check_decision``) and then hands the verified
body here; what the checkpoint then says, and what the trace records, is
decided by these functions alone. A refusal is a value too
(:func:`refused`), so it is traced the same way whichever path the document
came by.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from enum import StrEnum
from typing import Any

from tether.core._budgets import failed
from tether.core._canonical import digest
from tether.core._case_table import ReviewDecision
from tether.core._errors import CanonicalJSONError
from tether.core._evidence import keep_approval_nonce, parse_utc
from tether.core._model import EnvironmentState, LastOutcome, Receipt, ReviewCase
from tether.core._phases import OutcomeReason, Phase
from tether.core._spec import Policy
from tether.core._state import RunState
from tether.core._transition import Event, OutcomeKind, Transition


def _cursor(state: RunState, cursor: int | None) -> int:
    return state.inbox_cursor if cursor is None else max(state.inbox_cursor, cursor)


def evidence_digest(document: Any) -> str | None:
    """The digest a trace records for a document (``None`` if it is not even JSON)."""
    try:
        return digest(document)
    except CanonicalJSONError:  # a malformed document still gets its refusal traced
        return None


def record_approval(
    state: RunState,
    document: dict[str, Any],
    body: dict[str, Any],
    *,
    cursor: int | None,
    now: datetime,
) -> Transition:
    """A verified approval becomes the one in force for the pending action.

    The approval it replaces is sealed into the trace; its nonce is consumed
    for the run until the approval expires (:func:`~tether.core.keep_approval_nonce`),
    counted by :func:`~tether.core.consumed_nonces` with every other kind's,
    so no later document of any kind, for any case, can carry it meanwhile.
    """
    pending = state.pending
    if pending is None:
        raise ValueError(f"run {state.run_id} has no pending action")  # a caller's bug
    events: list[Event] = [("approval_superseded", {"evidence": old}) for old in pending.approvals]
    events.append(
        (
            "approval_recorded",
            {
                "approver_id": body["approver_id"],
                "nonce": body["nonce"],
                "expires_at": body["expires_at"],
                "evidence_digest": evidence_digest(document),
            },
        )
    )
    approved = replace(pending, approvals=(document,))
    spent = keep_approval_nonce(
        state.approval_nonces, str(body["nonce"]), parse_utc(body, "expires_at"), now=now
    )
    return Transition(
        OutcomeKind.RECORDED,
        state=state.evolve(
            pending=approved, approval_nonces=spent, inbox_cursor=_cursor(state, cursor)
        ),
        events=tuple(events),
        reason=OutcomeReason.APPROVAL_RECORDED,
    )


def apply_decision(
    state: RunState,
    case: ReviewCase,
    decision: ReviewDecision,
    document: dict[str, Any],
    *,
    cursor: int | None,
) -> Transition:
    """A verified reviewer decision closes its case: replan or accept goes on, abort fails the run.

    Either way the case, the pending action and the decision are sealed into
    the trace, the pending action is cleared, and the run continues (or
    ends) in the environment the decision was made in. A replan quarantines
    the key for good. The decision stays in the state, so restoring it needs
    the reviewers' trust roots.
    """
    sealed: Event = (
        "review_sealed",
        {
            "case": case.to_json(),
            "pending": None if state.pending is None else state.pending.to_json(),
            "decision": document,
        },
    )
    after = state.evolve(
        pending=None,
        environment=case.environment,
        observed_version=min(state.observed_version, case.environment.version),
        review_cases=tuple(c for c in state.review_cases if c.case_id != case.case_id),
        verification=None,
        decisions=(*state.decisions, document),
        inbox_cursor=_cursor(state, cursor),
    )
    # A case about a write quarantines its key; one about the run (worker_error
    # with nothing pending) has no key to quarantine.
    key = case.idempotency_key
    quarantined = (*state.quarantined_keys, key) if key else state.quarantined_keys
    quarantine: tuple[Event, ...] = (("key_quarantined", {"idempotency_key": key}),) if key else ()
    if decision is ReviewDecision.ACCEPT:
        # Only a drift case naming no write gets here (check_accept): nothing to
        # quarantine. The observed environment (the one the decision is bound
        # to) becomes the run's, and the run re-observes it at its next step.
        accepted: Event = (
            "environment_accepted",
            {
                "case_id": case.case_id,
                "checkpoint": state.environment.to_json(),
                "observed": case.environment.to_json(),
            },
        )
        told = LastOutcome.bounded(
            OutcomeKind.RECORDED.value,
            reason=OutcomeReason.ACCEPTED,
            message=f"a reviewer accepted the environment as observed (version "
            f"{case.environment.version}, changed outside the run); look at it again before "
            "acting",
        )
        return Transition(
            OutcomeKind.RECORDED,
            state=after.evolve(phase=Phase.RUNNING, last_outcome=told),
            events=(sealed, accepted),
            reason=OutcomeReason.ACCEPTED,
        )
    if decision is ReviewDecision.REPLAN:
        return Transition(
            OutcomeKind.RECORDED,
            state=after.evolve(
                phase=Phase.RUNNING,
                quarantined_keys=quarantined,
                last_outcome=LastOutcome.bounded(
                    OutcomeKind.RECORDED.value,
                    action_id=case.action_id or None,
                    reason=OutcomeReason.REPLANNED,
                    message=f"a reviewer decided replan on {case.reason}: "
                    + ("nothing pending was carried on (its key is quarantined); " if key else "")
                    + "plan again from the environment as it is",
                ),
            ),
            events=(sealed, *quarantine),
            reason=OutcomeReason.REPLANNED,
        )
    aborted, ending = failed(after, OutcomeReason.ABORTED_BY_REVIEW)
    return Transition(
        OutcomeKind.FAILED,
        state=aborted,
        events=(sealed, ending),
        reason=OutcomeReason.ABORTED_BY_REVIEW,
    )


def refused(
    state: RunState, kind: str, document: Any, error: Exception, *, cursor: int | None
) -> Transition:
    """A document the runtime would not accept: traced once, the inbox cursor moved past it."""
    data: dict[str, Any] = {
        "kind": kind,
        "error": type(error).__name__,
        "message": str(error),
        "evidence_digest": evidence_digest(document),
    }
    if cursor is not None:
        data["seq"] = cursor
    return Transition(
        OutcomeKind.REJECTED,
        state=state.evolve(inbox_cursor=_cursor(state, cursor)),
        events=(("evidence_refused", data),),
        reason=OutcomeReason.EVIDENCE_REFUSED,
        message=str(error),
    )


def refresh_case(
    state: RunState,
    case: ReviewCase,
    *,
    live: EnvironmentState,
    receipt: Receipt | None,
    case_id: str,
    now: datetime,
    why: str,
) -> Transition:
    """The world moved under an open case: it is replaced by one recording the world now.

    A decision is signed against the case's environment and receipt; one that
    finds them changed is refused (the stale decision never applies), and
    without this a person could never sign anything the run would accept.
    The new case keeps the old one's evidence and adds what changed, so the
    next decision is made, and bound, with the world as it is.
    """
    moved = {
        "kind": "changed_under_review",
        "previous_case": case.case_id,
        "previous_environment": case.environment.to_json(),
        "previous_receipt_fingerprint": case.receipt_fingerprint,
        "environment": live.to_json(),
        "receipt_fingerprint": None if receipt is None else receipt.fingerprint,
        "why": why[-500:],
    }
    fresh = replace(
        case,
        case_id=case_id,
        receipt=None if receipt is None else receipt.to_json(),
        receipt_fingerprint=None if receipt is None else receipt.fingerprint,
        environment=live,
        opened_at=now,
        evidence=(*case.evidence, moved),
    )
    cases = tuple(fresh if c.case_id == case.case_id else c for c in state.review_cases)
    return Transition(
        OutcomeKind.FROZEN,
        state=state.evolve(review_cases=cases),
        events=(("review_case_refreshed", {"replaces": case.case_id, "case": fresh.to_json()}),),
        reason=OutcomeReason.REVIEW_CASE_REFRESHED,
        message=why[-500:],
    )


def noted_admission(state: RunState, cursor: int) -> Transition:
    """The inbox admission that opened this epoch, read: the cursor moves past it."""
    return Transition(
        OutcomeKind.RECORDED,
        state=state.evolve(inbox_cursor=_cursor(state, cursor)),
        events=(("admission_read", {"seq": cursor}),),
        reason=OutcomeReason.ADMISSION_READ,
    )


class InboxRead(StrEnum):
    """What the run does with one inbox entry, before any signature is checked."""

    READ = "read"  # verify it and apply it (or trace its refusal)
    REFUSE = "refuse"  # refuse it at once, traced: reading it could change nothing
    STOP = "stop"  # leave it unread, the cursor where it is: the runtime is misconfigured


def signers_of(policy: Policy, kind: str) -> frozenset[str]:
    """The roles that may sign an inbox entry of ``kind`` (empty: read without a role check)."""
    if kind == "approval":
        return frozenset({"approver"})
    if kind in {"review_decision", "effect_decision"}:
        return frozenset({"reviewer"})
    if kind == "fork":
        return frozenset({"reviewer", "operator"})
    if kind == "rewind":
        return frozenset(policy.authority.rewind) - {"agent"}
    if kind == "cancel":
        return frozenset(policy.authority.cancel)
    return frozenset()


def inbox_read(policy: Policy, kind: str, roles: frozenset[str], phase: Phase) -> InboxRead:
    """Whether the run reads an inbox entry of ``kind`` given the roles its trust roots name.

    An entry nobody in the roots may sign is left unread (refusing it would
    burn a valid signature over a configuration gap), except a cancel
    reaching a run frozen for review: the run refuses every cancel then, and
    one left unread would block the reviewer's decision behind it.
    """
    needed = signers_of(policy, kind)
    if not needed or roles & needed:
        return InboxRead.READ
    if kind == "cancel" and phase is Phase.NEEDS_REVIEW:
        return InboxRead.REFUSE
    return InboxRead.STOP
