"""What approvals and reviewer decisions must bind, and the checks that enforce it.

Pure: signatures are checked in ``crypto``; here the *content* of a verified
body is compared, field by field, with what the run needs right now. Every
mismatch names its field, so an operator sees exactly which binding broke.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from tether.core._errors import (
    ApprovalExpiredError,
    EvidenceBindingError,
    EvidenceSignatureError,
    NonceReusedError,
)
from tether.core._model import ReviewCase, format_time, parse_time_text
from tether.core._state import RunState

APPROVAL_FIELDS = (
    "kind", "approver_id", "task_id", "run_id", "policy_version", "action_id",
    "idempotency_key", "intent_digest", "environment_version", "environment_instance_id",
    "state_fingerprint", "generation", "issued_at", "expires_at", "nonce",
)  # fmt: skip

DECISION_FIELDS = (
    "kind", "reviewer_id", "task_id", "run_id", "policy_version", "case_id", "action_id",
    "idempotency_key", "pending_intent_digest", "receipt_intent_digest", "receipt_fingerprint",
    "environment_version", "decision", "issued_at", "nonce",
)  # fmt: skip


# How far a signer's clock may run ahead of the runtime's.
CLOCK_SKEW = timedelta(seconds=60)


class ReviewDecision(StrEnum):
    """The two ways out of needs_review."""

    REPLAN = "replan"
    ABORT = "abort"


def approval_request(state: RunState) -> dict[str, Any]:
    """The fields an approval of the run's pending write must carry, as the run sees them now."""
    pending = state.pending
    if pending is None:
        raise EvidenceBindingError("action_id", "a pending write", None)
    env = state.environment
    return {
        "kind": "approval",
        "task_id": state.binding.task_id,
        "run_id": state.run_id,
        "policy_version": state.binding.policy_version,
        "action_id": pending.action_id,
        "idempotency_key": pending.idempotency_key,
        "intent_digest": pending.intent_digest,
        "environment_version": env.version,
        "environment_instance_id": env.instance_id,
        "state_fingerprint": env.state_fingerprint,
        "generation": pending.generation,
    }


def decision_request(state: RunState, case: ReviewCase) -> dict[str, Any]:
    """The fields a reviewer decision on ``case`` must carry."""
    receipt_digest = None if case.receipt is None else case.receipt.get("intent_digest")
    return {
        "kind": "review_decision",
        "task_id": state.binding.task_id,
        "run_id": state.run_id,
        "policy_version": state.binding.policy_version,
        "case_id": case.case_id,
        "action_id": case.action_id,
        "idempotency_key": case.idempotency_key,
        "pending_intent_digest": case.intent_digest,
        "receipt_intent_digest": receipt_digest,
        "receipt_fingerprint": case.receipt_fingerprint,
        "environment_version": case.environment.version,
    }


def _check_shape(body: dict[str, Any], fields: tuple[str, ...]) -> None:
    missing = [f for f in fields if f not in body]
    extra = sorted(set(body) - set(fields))
    if missing or extra:
        raise EvidenceSignatureError(
            f"evidence body has missing fields {missing} or unknown fields {extra}"
        )


def _check_bound(body: dict[str, Any], expected: dict[str, Any]) -> None:
    for name, want in expected.items():
        have = body.get(name)
        # bool is an int in Python; a bound integer must be a real integer.
        if have != want or type(have) is not type(want):
            raise EvidenceBindingError(name, want, have)


def check_approval(
    body: dict[str, Any],
    signer_id: str,
    state: RunState,
    *,
    now: datetime,
    ttl_s: int,
    consumed: tuple[str, ...] | frozenset[str],
) -> None:
    """Refuse an approval that is malformed, mis-bound, expired, too long-lived or replayed."""
    _check_shape(body, APPROVAL_FIELDS)
    if body["approver_id"] != signer_id:
        raise EvidenceBindingError("approver_id", signer_id, body["approver_id"])
    _check_bound(body, approval_request(state))
    issued, expires = parse_utc(body, "issued_at"), parse_utc(body, "expires_at")
    if expires - issued > timedelta(seconds=ttl_s):
        raise EvidenceBindingError(
            "expires_at", f"at most {ttl_s}s after issued_at", body["expires_at"]
        )
    # Judged on the runtime's clock when recorded: an approval "issued" in the
    # future would otherwise outlive the policy's lifetime by any amount.
    if issued > now + CLOCK_SKEW:
        raise EvidenceBindingError(
            "issued_at", f"not after {format_time(now + CLOCK_SKEW)}", body["issued_at"]
        )
    if expires > now + timedelta(seconds=ttl_s) + CLOCK_SKEW:
        raise EvidenceBindingError("expires_at", f"at most {ttl_s}s from now", body["expires_at"])
    check_unexpired(body, now)
    check_nonce(body, consumed)


def check_unexpired(body: dict[str, Any], now: datetime) -> None:
    """Expiry is exclusive: an approval is valid strictly before ``expires_at``."""
    if now >= parse_utc(body, "expires_at"):
        raise ApprovalExpiredError(
            f"approval {body.get('nonce')!r} expired at {body['expires_at']} "
            f"(now {format_time(now)}); a fresh approval is needed"
        )


def check_nonce(body: dict[str, Any], consumed: tuple[str, ...] | frozenset[str]) -> None:
    nonce = body.get("nonce")
    if not isinstance(nonce, str) or len(nonce) < 16:
        raise EvidenceSignatureError("evidence nonce must be a string of at least 16 characters")
    if nonce in consumed:
        raise NonceReusedError(f"nonce {nonce!r} was consumed before")


def check_decision(
    body: dict[str, Any],
    signer_id: str,
    state: RunState,
    case: ReviewCase,
    *,
    consumed: tuple[str, ...] | frozenset[str],
) -> ReviewDecision:
    """Refuse a decision that is malformed, mis-bound or replayed; return the decision."""
    _check_shape(body, DECISION_FIELDS)
    if body["reviewer_id"] != signer_id:
        raise EvidenceBindingError("reviewer_id", signer_id, body["reviewer_id"])
    _check_bound(body, decision_request(state, case))
    parse_utc(body, "issued_at")
    check_nonce(body, consumed)
    try:
        return ReviewDecision(body["decision"])
    except ValueError as exc:
        raise EvidenceBindingError("decision", "replan or abort", body["decision"]) from exc


def parse_utc(body: dict[str, Any], name: str) -> datetime:
    """A ``...Z`` timestamp field of an evidence body."""
    text = body.get(name)
    try:
        return parse_time_text(text)
    except ValueError as exc:
        raise EvidenceSignatureError(f"evidence field {name} is not a UTC time: {text!r}") from exc


def new_approval(
    state: RunState, approver_id: str, *, issued_at: datetime, expires_at: datetime, nonce: str
) -> dict[str, Any]:
    """The body an approver signs for the run's pending write (the nonce comes from outside)."""
    return {
        **approval_request(state),
        "approver_id": approver_id,
        "issued_at": format_time(issued_at),
        "expires_at": format_time(expires_at),
        "nonce": nonce,
    }


def new_decision(
    state: RunState,
    case: ReviewCase,
    reviewer_id: str,
    decision: ReviewDecision | str,
    *,
    issued_at: datetime,
    nonce: str,
) -> dict[str, Any]:
    """The body a reviewer signs to decide ``case``."""
    return {
        **decision_request(state, case),
        "reviewer_id": reviewer_id,
        "decision": ReviewDecision(decision).value,
        "issued_at": format_time(issued_at),
        "nonce": nonce,
    }
