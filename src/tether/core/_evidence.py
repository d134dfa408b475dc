"""What approvals and reviewer decisions must bind, and the checks that enforce it.

Pure: signatures are checked in ``crypto``; here the *content* of a verified
body is compared, field by field, with what the run needs right now. Every
mismatch names its field, so an operator sees exactly which binding broke.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from tether.core._case_table import (
    DRIFT_REASONS,
    NEEDS_EVIDENCE,
    CaseKind,
    ReviewDecision,
    case_kind,
    fitting,
    settlement,
    ways_out,
)
from tether.core._errors import (
    AcceptRefusedError,
    ApprovalExpiredError,
    DecisionRefusedError,
    EvidenceBindingError,
    EvidenceSignatureError,
    NonceReusedError,
)
from tether.core._model import (
    EnvironmentState,
    Receipt,
    ReviewCase,
    format_time,
    parse_time_text,
)
from tether.core._phases import OutcomeReason
from tether.core._state import ReplayApproval, RunState, SpentNonce

APPROVAL_FIELDS = (
    "kind", "approver_id", "task_id", "run_id", "policy_version", "action_id",
    "idempotency_key", "intent_digest", "environment_version", "environment_instance_id",
    "state_fingerprint", "issued_at", "expires_at", "nonce",
)  # fmt: skip

DECISION_FIELDS = (
    "kind", "reviewer_id", "task_id", "run_id", "policy_version", "case_id", "action_id",
    "idempotency_key", "pending_intent_digest", "receipt_intent_digest", "receipt_fingerprint",
    "environment_version", "environment_instance_id", "state_fingerprint", "decision",
    "issued_at", "expires_at", "nonce",
)  # fmt: skip


# How far a signer's clock may run ahead of the runtime's.
CLOCK_SKEW = timedelta(seconds=60)


#: Optional fields of a decision body: what the reviewer found (a receipt id, a
#: message id, a URL), required where the decision records a write as landed.
DECISION_OPTIONAL = ("evidence",)
#: At most this many characters of it (it is copied into the ledger).
EVIDENCE_MAX = 2000


def check_accept(case: ReviewCase) -> None:
    """Refuse ``accept`` for a case it would close blind.

    Accept means "the environment as observed is right; go on from it". That
    is a judgement about the environment only, so it is allowed for a drift
    case that names no write. A case naming a write (an outcome unknown, a
    conflicting receipt, a drift found while a write was pending) would have
    that write's outcome hidden by it: ``replan`` (which quarantines the key)
    or ``abort`` is the way out there.
    """
    if case.reason not in DRIFT_REASONS:
        raise AcceptRefusedError(
            f"case {case.case_id} is {case.reason!r}, not a drift of the environment; "
            "accept is only for environment_drift or environment_ahead: sign replan or abort",
            case_id=case.case_id,
            reason=case.reason,
        )
    unrecorded = [
        e for e in case.evidence if isinstance(e, dict) and e.get("kind") == "unrecorded_receipt"
    ]
    if unrecorded:
        raise AcceptRefusedError(
            f"case {case.case_id} lists {len(unrecorded)} receipt(s) of effects the ledger never "
            "recorded; accepting the environment would leave them out of it for good: sign "
            "replan or abort, with the receipts in the sealed evidence",
            case_id=case.case_id,
            reason=case.reason,
        )
    if case.idempotency_key:
        raise AcceptRefusedError(
            f"case {case.case_id} names the write {case.action_id!r} (key "
            f"{case.idempotency_key}); accepting the environment would hide what that write "
            "did: sign replan (its key is quarantined) or abort",
            case_id=case.case_id,
            reason=case.reason,
        )


def approval_request(state: RunState) -> dict[str, Any]:
    """The fields an approval of the run's pending write must carry.

    They bind the pending write itself (its action, key, intent and the
    environment it was proposed against), never the checkpoint generation:
    a restore or a re-checkpoint leaves a valid approval valid.
    """
    pending = state.pending
    if pending is None:
        raise EvidenceBindingError("action_id", "a pending write", None)
    env = pending.prestate
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
        "environment_instance_id": case.environment.instance_id,
        "state_fingerprint": case.environment.state_fingerprint,
    }


def check_shape(
    body: dict[str, Any], fields: tuple[str, ...], optional: tuple[str, ...] = ()
) -> None:
    missing = [f for f in fields if f not in body]
    extra = sorted(set(body) - set(fields) - set(optional))
    if missing or extra:
        raise EvidenceSignatureError(
            f"evidence body has missing fields {missing} or unknown fields {extra}"
        )


def check_bound(body: dict[str, Any], expected: dict[str, Any]) -> None:
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
) -> None:
    """Refuse an approval that is malformed, mis-bound, expired, too long-lived, or whose
    nonce the run consumed before (with any document: :func:`consumed_nonces`)."""
    check_shape(body, APPROVAL_FIELDS)
    if body["approver_id"] != signer_id:
        raise EvidenceBindingError("approver_id", signer_id, body["approver_id"])
    check_bound(body, approval_request(state))
    check_lifetime(body, now=now, ttl_s=ttl_s)
    check_nonce(body, consumed_nonces(state))


def check_lifetime(body: dict[str, Any], *, now: datetime, ttl_s: int) -> None:
    """Issued no later than now (plus skew), alive now, and no longer-lived than the policy allows."""
    issued, expires = parse_utc(body, "issued_at"), parse_utc(body, "expires_at")
    if expires - issued > timedelta(seconds=ttl_s):
        raise EvidenceBindingError(
            "expires_at", f"at most {ttl_s}s after issued_at", body["expires_at"]
        )
    # Judged on the runtime's clock when recorded: evidence "issued" in the
    # future would otherwise outlive the policy's lifetime by any amount.
    if issued > now + CLOCK_SKEW:
        raise EvidenceBindingError(
            "issued_at", f"not after {format_time(now + CLOCK_SKEW)}", body["issued_at"]
        )
    if expires > now + timedelta(seconds=ttl_s) + CLOCK_SKEW:
        raise EvidenceBindingError("expires_at", f"at most {ttl_s}s from now", body["expires_at"])
    check_unexpired(body, now)


def check_unexpired(body: dict[str, Any], now: datetime) -> None:
    """Expiry is exclusive: an approval is valid strictly before ``expires_at``."""
    if now >= parse_utc(body, "expires_at"):
        raise ApprovalExpiredError(
            f"approval {body.get('nonce')!r} expired at {body['expires_at']} "
            f"(now {format_time(now)}); a fresh approval is needed"
        )


def consumed_nonces(state: RunState) -> frozenset[str]:
    """Every nonce the run's state records as consumed, whatever kind of document carried it.

    Each kind keeps its own: reviewer and effect decisions whole in
    ``decisions``, forks in ``fork_nonces``, cancels read without ending the
    run in ``cancel_nonces``, approvals in ``approval_nonces`` until the
    approval expires (:func:`keep_approval_nonce`: whatever action it
    approved has long settled by then, and the checkpoint stays bounded by
    the approvals alive). A nonce is one-time across all of them: every check
    refuses a document whose nonce is here (:func:`check_nonce`), so a
    decision for one case cannot reuse a nonce another case, an approval, a
    fork or a cancel consumed. Checkpoints written before ``approval_nonces``
    kept an approval's nonce with its pending action (``pending.nonces``),
    read the same way.
    """
    nonces = {*state.fork_nonces, *state.cancel_nonces}
    nonces.update(spent.nonce for spent in state.approval_nonces)
    if state.pending is not None:
        nonces.update(state.pending.nonces)
    for document in state.decisions:
        body = document.get("body")
        if isinstance(body, dict) and isinstance(body.get("nonce"), str):
            nonces.add(body["nonce"])
    return frozenset(nonces)


def keep_approval_nonce(
    kept: tuple[SpentNonce, ...], nonce: str, expires_at: datetime, *, now: datetime
) -> tuple[SpentNonce, ...]:
    """The approval nonces a run keeps once it consumes ``nonce`` (its approval expiring at
    ``expires_at``) at ``now``.

    A nonce is forgotten only once its approval has expired on any clock the
    runtime tolerates (``until`` plus :data:`CLOCK_SKEW`): the approval itself
    is refused as expired from then on, and never binds another action (its
    key is minted once), so the record holds only the approvals that could
    still be presented, and is bounded by them, never by the run's history.
    """
    alive = tuple(spent for spent in kept if now < spent.until + CLOCK_SKEW)
    return (*alive, SpentNonce(nonce, expires_at))


def check_nonce(body: dict[str, Any], consumed: tuple[str, ...] | frozenset[str]) -> None:
    """Refuse a nonce that is too short to be one-time, or that ``consumed`` holds."""
    nonce = body.get("nonce")
    if not isinstance(nonce, str) or len(nonce) < 16:
        raise EvidenceSignatureError("evidence nonce must be a string of at least 16 characters")
    if nonce in consumed:
        raise NonceReusedError(
            f"nonce {nonce!r} was consumed before by a signed document of this run (a nonce is "
            "one-time across every kind of document and every case): sign it with a fresh nonce"
        )


def check_decision(
    body: dict[str, Any],
    signer_id: str,
    state: RunState,
    case: ReviewCase,
    *,
    now: datetime,
    ttl_s: int,
) -> ReviewDecision:
    """Refuse a decision that is malformed, mis-bound, expired, too long-lived, or whose
    nonce the run consumed before.

    A decision closes its case, and a case id is never reused, so a replayed
    decision finds no case; its nonce is still one-time across cases and
    kinds: a decision for another case (or an approval, a fork, a cancel)
    that carries a consumed nonce is refused (:func:`consumed_nonces`).
    """
    check_shape(body, DECISION_FIELDS, DECISION_OPTIONAL)
    if body["reviewer_id"] != signer_id:
        raise EvidenceBindingError("reviewer_id", signer_id, body["reviewer_id"])
    check_bound(body, decision_request(state, case))
    check_lifetime(body, now=now, ttl_s=ttl_s)
    check_nonce(body, consumed_nonces(state))
    try:
        decision = ReviewDecision(body["decision"])
    except ValueError as exc:
        known = ", ".join(d.value for d in ReviewDecision)
        raise EvidenceBindingError("decision", f"one of {known}", body["decision"]) from exc
    check_fits(state, case, decision, body.get("evidence"))
    return decision


def check_fits(
    state: RunState, case: ReviewCase, decision: ReviewDecision, evidence: object
) -> None:
    """Refuse a decision the case does not take, or one that lacks the evidence it needs.

    The case kind's row of the table decides (:func:`~tether.core.case_rules.settlement`);
    ``accept`` is checked further (:func:`check_accept`); a decision that
    records the write as landed carries what the reviewer found (a non-empty
    ``evidence`` of at most :data:`EVIDENCE_MAX` characters), and any
    decision may carry a note there.
    """
    if evidence is not None and (not isinstance(evidence, str) or len(evidence) > EVIDENCE_MAX):
        raise EvidenceSignatureError(
            f"a decision's evidence is a text of at most {EVIDENCE_MAX} characters"
        )
    if decision is ReviewDecision.ACCEPT:
        kind = case_kind(case, state)
        if kind is not CaseKind.ENVIRONMENT_DRIFT and case.reason not in DRIFT_REASONS:
            raise AcceptRefusedError(
                f"case {case.case_id} is {case.reason!r}, not a drift of the environment; "
                f"accept is only for environment_drift or environment_ahead: {ways_out(kind)}",
                case_id=case.case_id,
                reason=case.reason,
                fits=tuple(d.value for d in fitting(kind)),
            )
        check_accept(case)  # its own refusal says why accept cannot close a drift case
    settled = settlement(case, state, decision)
    if settled in NEEDS_EVIDENCE and not (isinstance(evidence, str) and evidence.strip()):
        raise DecisionRefusedError(
            f"{decision.value} on case {case.case_id} records the write as committed by you: "
            "give the evidence you found (a receipt id, a message id, a URL), e.g. "
            "`--evidence '<message-id>'`",
            case_id=case.case_id,
            reason=case.reason,
            decision=decision.value,
        )


def parse_utc(body: dict[str, Any], name: str) -> datetime:
    """A ``...Z`` timestamp field of an evidence body."""
    text = body.get(name)
    try:
        return parse_time_text(text)
    except ValueError as exc:
        raise EvidenceSignatureError(f"evidence field {name} is not a UTC time: {text!r}") from exc


def answer_body(
    request: Mapping[str, Any],
    signer: tuple[str, str],
    *,
    issued_at: datetime,
    expires_at: datetime,
    nonce: str,
    decision: ReviewDecision | None = None,
    evidence: str | None = None,
) -> dict[str, Any]:
    """The body a person signs answering ``request``: who (``(field, id)``), when, a nonce."""
    field, signer_id = signer
    body = {**request, field: signer_id}
    if decision is not None:
        body["decision"] = decision.value
    if evidence is not None:
        body["evidence"] = evidence
    return {
        **body,
        "issued_at": format_time(issued_at),
        "expires_at": format_time(expires_at),
        "nonce": nonce,
    }


def new_approval(
    state: RunState, approver_id: str, *, issued_at: datetime, expires_at: datetime, nonce: str
) -> dict[str, Any]:
    """The body an approver signs for the run's pending write (the nonce comes from outside)."""
    return answer_body(
        approval_request(state),
        ("approver_id", approver_id),
        issued_at=issued_at,
        expires_at=expires_at,
        nonce=nonce,
    )


def new_decision(
    state: RunState,
    case: ReviewCase,
    reviewer_id: str,
    decision: ReviewDecision | str,
    *,
    issued_at: datetime,
    expires_at: datetime,
    nonce: str,
    evidence: str | None = None,
) -> dict[str, Any]:
    """The body a reviewer signs to decide ``case``; a decision the case does not take is
    refused (:class:`~tether.core.DecisionRefusedError`), and so is ``landed`` without the
    ``evidence`` the reviewer found."""
    try:
        chosen = ReviewDecision(decision)
    except ValueError as exc:
        known = ", ".join(d.value for d in ReviewDecision)
        raise EvidenceBindingError("decision", f"one of {known}", decision) from exc
    if evidence is not None:
        evidence = evidence.strip()
    check_fits(state, case, chosen, evidence)
    return answer_body(
        decision_request(state, case),
        ("reviewer_id", reviewer_id),
        issued_at=issued_at,
        expires_at=expires_at,
        nonce=nonce,
        decision=chosen,
        evidence=evidence or None,
    )


def approval_problem(
    state: RunState,
    *,
    needs: bool,
    now: datetime,
    live: EnvironmentState,
    idempotent: bool,
    policy_version: str | None = None,
) -> tuple[OutcomeReason, str] | None:
    """Why the pending write may not be sent now for want of approval, or ``None``.

    Checked right before every send: an approval in force, unexpired on the
    runtime's clock, for the environment as it is now. An idempotent adapter
    that already applied the write dedups the retry by key, so its post-state
    is not a change. ``policy_version``: the policy in force now; an approval
    signed under another version (before a recovery adopted this one) is no
    approval under it.
    """
    pending = state.pending
    if not needs or pending is None:
        return None
    body = active_approval(state)
    if (
        body is not None
        and policy_version is not None
        and body.get("policy_version") != policy_version
    ):
        return (
            OutcomeReason.APPROVAL_POLICY_CHANGED,
            f"approval {body.get('nonce')!r} was signed under policy version "
            f"{body.get('policy_version')!r}; the run is now under {policy_version!r}: a fresh "
            f"approval is needed (`tether approve {state.run_id} {pending.action_id}`)",
        )
    if body is None:
        return (
            OutcomeReason.APPROVAL_REQUIRED,
            f"run {state.run_id}: the pending write needs an approval; sign one with "
            f"`tether approve {state.run_id} {pending.action_id}`",
        )
    if now >= parse_utc(body, "expires_at"):
        return (
            OutcomeReason.APPROVAL_EXPIRED,
            f"approval {body.get('nonce')!r} expired at {body['expires_at']}; a fresh "
            "approval is needed",
        )
    allowed = {body["state_fingerprint"]}
    if idempotent:
        allowed.add(pending.expected_post.state_fingerprint)
    if live.state_fingerprint not in allowed or live.instance_id != body["environment_instance_id"]:
        return (
            OutcomeReason.APPROVAL_STALE,
            f"run {state.run_id}: the environment changed since the approval was signed; "
            "a fresh approval is needed",
        )
    return None


def awaits_approval(
    state: RunState, *, needs: bool, now: datetime, policy_version: str | None = None
) -> bool:
    """Whether the pending action waits for a person: it needs an approval and has none alive
    (under ``policy_version``, the policy in force, when given).

    Whether an approval in force still binds the environment is judged at
    the send, against the environment as it is then (:func:`approval_problem`).
    """
    if not needs or state.pending is None:
        return False
    body = active_approval(state)
    if body is None or now >= parse_utc(body, "expires_at"):
        return True
    return policy_version is not None and body.get("policy_version") != policy_version


#: Approvals remembered for replays: enough for every gated write of a graph node
#: that runs again on each resume, bounded so checkpoints stay flat.
REPLAY_APPROVALS_KEPT = 32


def replay_approved(state: RunState, effect: str, *, now: datetime, policy_version: str) -> bool:
    """Whether an approval alive now, under ``policy_version``, lets ``effect`` be replayed."""
    return any(
        a.effect == effect and a.policy_version == policy_version and now < a.until
        for a in state.replay_approvals
    )


def remember_replay_approval(
    state: RunState, effect: str, body: dict[str, Any] | None, *, now: datetime
) -> RunState:
    """``state`` remembering that the approval ``body`` lets ``effect`` be replayed until it
    expires; approvals already expired are dropped, and at most the newest
    :data:`REPLAY_APPROVALS_KEPT` are kept, so the checkpoint stays flat however many
    approvals a run collects (a replay of an older one asks a person again)."""
    kept = tuple(a for a in state.replay_approvals if now < a.until and a.effect != effect)
    if body is not None:
        until = parse_utc(body, "expires_at")
        if now < until:
            version = str(body.get("policy_version", ""))
            kept = (*kept, ReplayApproval(effect, until, version))
    kept = kept[-REPLAY_APPROVALS_KEPT:]
    if kept == state.replay_approvals:
        return state
    return state.evolve(replay_approvals=kept)


def active_approval(state: RunState) -> dict[str, Any] | None:
    """The body of the approval currently in force for the pending write, if any."""
    pending = state.pending
    if pending is None or not pending.approvals:
        return None
    body = pending.approvals[-1].get("body")
    return body if isinstance(body, dict) else None


def committed_within_approval(
    state: RunState, receipt: Receipt, *, received_at: datetime
) -> str | None:
    """Why a committed receipt cannot be reconciled under the approval, or None if it can.

    The commit time compared with the approval's expiry is the receipt's own
    (``committed_at``) where it has one. A receipt without one (a function's
    body returns no trusted commit time) is bounded by ``received_at``, the
    runtime's clock when the receipt reached it (the body had returned, or a
    look-up had found it): the write cannot have committed after that, so a
    receipt received before the expiry committed inside the approval. One
    received after it, with no time of its own, proves nothing: review.
    """
    body = active_approval(state)
    if body is None:
        return "the write committed without an approval on record"
    expires = parse_utc(body, "expires_at")
    if not receipt.committed_at:
        if received_at < expires:
            return None
        return (
            "the receipt has no commit time, and it reached the runtime after the approval "
            "expired: nothing proves the write committed inside the approval"
        )
    try:
        committed = parse_time_text(receipt.committed_at)
    except ValueError:
        return "the receipt's commit time is not a time to compare with the approval's expiry"
    if committed >= expires:
        return "the write committed after its approval expired"
    return None
