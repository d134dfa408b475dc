"""The human gates: signed approvals for pending writes, signed decisions for review cases.

Evidence is signed outside the runtime; here it is verified against trust
roots, bound field by field to the run as it is now, and only then recorded.
A refused decision leaves the run exactly as frozen as it was, and the
refusal is traced.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from tether.core import (
    ApprovalExpiredError,
    ApprovalRequiredError,
    CanonicalJSONError,
    EvidenceError,
    Phase,
    PolicyError,
    Receipt,
    ReviewDriftError,
    RunFrozenError,
    RunState,
    TrustRootsRequiredError,
    digest,
    parse_time_text,
)
from tether.core._evidence import (
    ReviewDecision,
    check_approval,
    check_decision,
    check_unexpired,
    parse_utc,
)
from tether.crypto import Role, TrustRoots

if TYPE_CHECKING:
    from tether.runtime._runtime import RunSession, Runtime


def needs_approval(rt: Runtime, state: RunState) -> bool:
    """Whether the policy requires an approval before the pending write executes."""
    pending = state.pending
    if pending is None:
        return False
    rule = rt.policy.kinds.get(pending.intent.kind)
    return rule is not None and rule.needs_approval


def active_approval(state: RunState) -> dict[str, Any] | None:
    """The body of the approval currently in force for the pending write, if any."""
    pending = state.pending
    if pending is None or not pending.approvals:
        return None
    body = pending.approvals[-1]["body"]
    return body if isinstance(body, dict) else None


def require_approval(session: RunSession) -> None:
    """Before an execution: a live approval bound to the current environment, or raise."""
    rt, state = session.rt, session.state
    if not needs_approval(rt, state):
        return
    body = active_approval(state)
    if body is None:
        raise ApprovalRequiredError(
            f"run {state.run_id}: pending write needs an approval; sign one with "
            f"`tether approve {state.run_id} <action>`",
            run_id=state.run_id,
        )
    check_unexpired(body, rt.clock.now())
    live = rt.adapter.environment()
    allowed = {body["state_fingerprint"]}
    pending = state.pending
    if pending is not None and rt.adapter.capabilities.idempotent:
        # An idempotent adapter that already applied the write (a crash after
        # the effect) dedups the retry by key: its post-state is not a change.
        allowed.add(pending.expected_post.state_fingerprint)
    if live.state_fingerprint not in allowed or live.instance_id != body["environment_instance_id"]:
        raise ApprovalExpiredError(
            f"run {state.run_id}: the environment changed since the approval was signed; "
            "a fresh approval is needed"
        )


def committed_within_approval(state: RunState, receipt: Receipt) -> str | None:
    """Why a committed receipt cannot be reconciled under the approval, or None if it can."""
    body = active_approval(state)
    if body is None:
        return "the write committed without an approval on record"
    try:
        committed = parse_time_text(receipt.committed_at)
    except ValueError:
        return "the receipt has no commit time to compare with the approval's expiry"
    if committed >= parse_utc(body, "expires_at"):
        return "the write committed after its approval expired"
    return None


def consume_inbox(session: RunSession) -> None:
    """Apply the signed evidence people left in the store's inbox since the last read.

    Each entry is read once: accepted or refused, the cursor moves past it in
    the same checkpoint that records the outcome, so a refused document is
    traced once and never retried.
    """
    state = session.state
    if state.phase.terminal:
        return
    for item in session.rt.store.evidence(state.run_id, after=state.inbox_cursor):
        try:
            if item.kind == "approval":
                approve(session, item.document, cursor=item.seq)
            else:
                review(session, item.document, cursor=item.seq)
        except (EvidenceError, PolicyError) as exc:
            if session.state.inbox_cursor < item.seq:  # review() traces its own refusals
                session.commit(
                    session.state.evolve(inbox_cursor=item.seq),
                    [
                        (
                            "evidence_refused",
                            {
                                "seq": item.seq,
                                "kind": item.kind,
                                "error": type(exc).__name__,
                                "message": str(exc),
                            },
                        )
                    ],
                )


def approve(session: RunSession, document: Any, *, cursor: int | None = None) -> RunState:
    """Verify and record a signed approval for the pending write."""
    rt, state = session.rt, session.state
    _refuse_unless(state, Phase.PENDING, "approve")
    if not needs_approval(rt, state):
        raise PolicyError(f"run {state.run_id}: the pending write needs no approval")
    body = _trust(rt).verify(document, Role.APPROVER)
    check_approval(
        body,
        document["signer"],
        state,
        now=rt.clock.now(),
        ttl_s=rt.policy.approval_ttl_s,
        consumed=frozenset(state.consumed_nonces),
    )
    pending = state.pending
    if pending is None:  # checked by _refuse_unless; keeps the type checker honest
        raise ApprovalRequiredError("no pending write", run_id=state.run_id)
    events: list[tuple[str, dict[str, Any]]] = [
        ("approval_superseded", {"evidence": old}) for old in pending.approvals
    ]
    events.append(
        (
            "approval_recorded",
            {
                "approver_id": body["approver_id"],
                "nonce": body["nonce"],
                "expires_at": body["expires_at"],
                "evidence_digest": digest(document),
            },
        )
    )
    session.commit(
        state.evolve(
            pending=replace(pending, approvals=(document,)),
            consumed_nonces=(*state.consumed_nonces, body["nonce"]),
            inbox_cursor=state.inbox_cursor if cursor is None else cursor,
        ),
        events,
    )
    return session.state


def review(session: RunSession, document: Any, *, cursor: int | None = None) -> RunState:
    """Verify a signed reviewer decision and apply it; any doubt leaves the case frozen."""
    rt, state = session.rt, session.state
    if cursor is not None:
        state = state.evolve(inbox_cursor=cursor)
    _refuse_unless(state, Phase.NEEDS_REVIEW, "review")
    try:
        body = _trust(rt).verify(document, Role.REVIEWER)
        case = next((c for c in state.review_cases if c.case_id == body.get("case_id")), None)
        if case is None:
            raise ReviewDriftError(f"no open review case {body.get('case_id')!r}")
        decision = check_decision(
            body, document["signer"], state, case, consumed=frozenset(state.consumed_nonces)
        )
        _reread(rt, case, body)
    except EvidenceError as exc:
        session.commit(
            state,
            [
                (
                    "review_decision_refused",
                    {
                        "error": type(exc).__name__,
                        "message": str(exc),
                        "evidence_digest": _safe_digest(document),
                    },
                )
            ],
        )
        raise
    sealed = {
        "case": case.to_json(),
        "pending": None if state.pending is None else state.pending.to_json(),
        "decision": document,
    }
    consumed = (*state.consumed_nonces, body["nonce"])
    if decision is ReviewDecision.REPLAN:
        session.commit(
            state.evolve(
                phase=Phase.RUNNING,
                pending=None,
                review_cases=tuple(c for c in state.review_cases if c.case_id != case.case_id),
                quarantined_keys=(*state.quarantined_keys, case.idempotency_key),
                consumed_nonces=consumed,
            ),
            [
                ("review_sealed", sealed),
                ("key_quarantined", {"idempotency_key": case.idempotency_key}),
            ],
        )
    else:
        session.commit(
            state.evolve(
                phase=Phase.FAILED, stop_reason="aborted_by_review", consumed_nonces=consumed
            ),
            [("review_sealed", sealed), ("failed", {"reason": "aborted_by_review"})],
        )
    return session.state


def check_restorable(rt: Runtime, state: RunState) -> None:
    """A checkpoint with approval evidence restores only where its signers are trusted again."""
    pending = state.pending
    if pending is None or not pending.approvals:
        return
    trust = rt.trust
    if trust is None or Role.APPROVER not in trust.roles():
        raise TrustRootsRequiredError(
            f"run {state.run_id} carries signed approval evidence; pass the approvers' trust "
            "roots to restore it",
            run_id=state.run_id,
        )
    for document in pending.approvals:
        try:
            trust.verify(document, Role.APPROVER)
        except EvidenceError as exc:
            raise TrustRootsRequiredError(
                f"run {state.run_id}: approval evidence does not verify under the given trust "
                f"roots: {exc}",
                run_id=state.run_id,
            ) from exc


def _reread(rt: Runtime, case: Any, body: dict[str, Any]) -> None:
    """Before consuming a decision, the adapter's receipt and the environment must be unchanged."""
    live = rt.adapter.environment()
    if live != case.environment:
        raise ReviewDriftError(
            f"the environment changed since the case was opened (now version {live.version})"
        )
    receipt = rt.adapter.lookup(case.idempotency_key) if rt.adapter.capabilities.queryable else None
    now = None if receipt is None else receipt.fingerprint
    if rt.adapter.capabilities.queryable and now != body["receipt_fingerprint"]:
        raise ReviewDriftError(
            "the adapter's authoritative receipt changed since the decision was signed"
        )


def _trust(rt: Runtime) -> TrustRoots:
    if rt.trust is None:
        raise EvidenceError("this runtime was given no trust roots; it cannot accept evidence")
    return rt.trust


def _refuse_unless(state: RunState, phase: Phase, what: str) -> None:
    if state.phase is not phase:
        if state.phase.terminal:
            raise RunFrozenError(f"run {state.run_id} is {state.phase}; nothing to {what}")
        raise PolicyError(
            f"run {state.run_id} is {state.phase}, not {phase}; nothing to {what}",
            run_id=state.run_id,
        )


def _safe_digest(document: Any) -> str | None:
    try:
        return digest(document)
    except CanonicalJSONError:  # a malformed document still gets its refusal traced
        return None
