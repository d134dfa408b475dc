"""Settling a pending write: ask the adapter first, act once, reconcile, advance.

These are the steps between "the intent and its key are durable" and "the
state has advanced", where every crash window lies. Each function takes the
run's :class:`~tether.runtime._runtime.RunSession`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tether.core import (
    AdapterUnavailableError,
    CompletedWrite,
    EffectStatus,
    IdempotencyConflictError,
    Phase,
    PreconditionFailedError,
    Receipt,
    digest,
)
from tether.runtime import _humans
from tether.runtime._crash import CrashPoint
from tether.store import LedgerEntry

if TYPE_CHECKING:
    from tether.runtime._runtime import RunSession


def settle(session: RunSession) -> None:
    """Bring the pending write to a known outcome, asking the adapter first."""
    rt = session.rt
    pending = session._pending()
    entries = rt.store.ledger(session.run_id, pending.idempotency_key)
    latest = entries[-1] if entries else None
    cached = next(
        (e.receipt for e in reversed(entries) if e.status is EffectStatus.COMMITTED), None
    )
    caps = rt.adapter.capabilities
    if latest is not None and latest.status is EffectStatus.REJECTED:
        # The adapter refused it before the crash: replay that transition, no call.
        session.commit(
            session.state.evolve(phase=Phase.RUNNING, pending=None),
            [("effect_rejected", {"action_id": pending.action_id, "reason": "recorded"})],
        )
        return
    if caps.queryable:
        session._guard()
        receipt = rt.adapter.lookup(pending.idempotency_key)
        if receipt is not None:
            reconcile(session, receipt, cached)
            return
        if cached is not None:
            session._freeze(
                "receipt_missing",
                None,
                "the ledger holds a committed receipt the adapter no longer has; replay refused",
                cached=cached,
            )
            return
        # The adapter is the authority and has no receipt: the write did not commit.
    elif cached is not None:
        if not caps.idempotent:
            # Nothing can confirm the receipt again; accept it only if the live
            # state is exactly what it says and what the intent produces.
            receipt = Receipt.from_json(cached)
            live = rt.adapter.environment()
            if not (live == receipt.post_state == pending.expected_post):
                session._freeze(
                    "receipt_unverifiable",
                    receipt,
                    "the ledger's receipt cannot be confirmed by the adapter and the live "
                    "environment is not the state it records",
                    cached=cached,
                )
                return
            if _humans.needs_approval(rt, session.state):
                outside = _humans.committed_within_approval(session.state, receipt)
                if outside is not None:
                    session._freeze("approval_boundary", receipt, outside, cached=cached)
                    return
            advance(session, receipt, "reconciled_unverifiable")
            return
    elif (
        latest is not None
        and latest.status
        in {
            EffectStatus.DISPATCHED,
            EffectStatus.OUTCOME_UNKNOWN,
        }
        and not caps.idempotent
    ):
        session._ledger(EffectStatus.OUTCOME_UNKNOWN, receipt=None)
        session._freeze(
            "outcome_unknown",
            None,
            "a write that cannot be queried or deduplicated was dispatched and its "
            "outcome is unknown; a person must decide",
        )
        return
    dispatch(session, entries, cached)


def dispatch(
    session: RunSession, entries: list[LedgerEntry], cached: dict[str, Any] | None
) -> None:
    rt = session.rt
    pending = session._pending()
    if cached is None:
        # With a committed receipt on record, an idempotent re-execute only
        # fetches that receipt: no new effect, so no approval is needed for it.
        _humans.require_approval(session)
    fence = session._guard()  # a worker whose lease moved on records nothing more
    if cached is None:
        # A committed entry already says what happened; an idempotent
        # re-execute only fetches the adapter's receipt to compare.
        statuses = [EffectStatus.DISPATCHED]
        if not entries:
            statuses.insert(0, EffectStatus.INTENDED)
        session._ledger(*statuses, receipt=None)
    try:
        receipt = rt.adapter.execute(
            pending.idempotency_key, pending.intent, pending.prestate, fence
        )
    except IdempotencyConflictError as exc:
        session._freeze(
            "key_conflict",
            exc.receipt,
            "the adapter holds a receipt for this key with a different intent digest",
        )
        return
    except PreconditionFailedError as exc:
        if entries and entries[-1].status in {
            EffectStatus.DISPATCHED,
            EffectStatus.OUTCOME_UNKNOWN,
        }:
            # A retry of a write that was already sent finds its target changed,
            # and the adapter has no receipt: the first attempt may have landed.
            session._ledger(EffectStatus.OUTCOME_UNKNOWN, receipt=None)
            session._freeze(
                "outcome_unknown",
                None,
                f"a retried write found its precondition failed ({exc}) and the adapter "
                "holds no receipt; the first attempt may have landed",
            )
            return
        session._ledger(EffectStatus.REJECTED, receipt=None)
        session.commit(
            session.state.evolve(phase=Phase.RUNNING, pending=None),
            [("effect_rejected", {"action_id": pending.action_id, "reason": str(exc)})],
        )
        return
    except AdapterUnavailableError:
        session._ledger(EffectStatus.OUTCOME_UNKNOWN, receipt=None)
        raise
    rt.crash.hit(CrashPoint.EFFECT_SENT)
    reconcile(session, receipt, cached, fresh=True)


def reconcile(
    session: RunSession, receipt: Receipt, cached: dict[str, Any] | None, *, fresh: bool = False
) -> None:
    """Accept the adapter's receipt only if it is bound to exactly this intent."""
    pending = session._pending()
    if (
        receipt.idempotency_key != pending.idempotency_key
        or receipt.intent_digest != pending.intent_digest
    ):
        session._freeze(
            "key_conflict",
            receipt,
            "same idempotency key, different intent digest",
        )
        return
    if cached is None and (
        receipt.namespace != session.rt.adapter.namespace
        or receipt.post_state != pending.expected_post
        or (
            _humans.needs_approval(session.rt, session.state)
            and _humans.committed_within_approval(session.state, receipt) is not None
        )
    ):
        # The adapter committed this exact intent under our key: whatever a
        # person decides next, the ledger must say the effect happened.
        session._ledger(EffectStatus.COMMITTED, receipt=receipt.to_json())
        cached = receipt.to_json()
    if cached is not None and cached != receipt.to_json():
        session._freeze(
            "receipt_drift",
            receipt,
            "the adapter's receipt differs from the ledger's copy; replay refused",
            cached=cached,
        )
        return
    if (
        receipt.namespace != session.rt.adapter.namespace
        or receipt.post_state != pending.expected_post
    ):
        session._freeze(
            "receipt_mismatch",
            receipt,
            "the receipt is not for the post-state this intent produces",
        )
        return
    if _humans.needs_approval(session.rt, session.state):
        outside = _humans.committed_within_approval(session.state, receipt)
        if outside is not None:
            session._freeze("approval_boundary", receipt, outside, cached=cached)
            return
    if cached is None:
        session._ledger(EffectStatus.COMMITTED, receipt=receipt.to_json())
        session.rt.crash.hit(CrashPoint.RECEIPT_PERSISTED)
    advance(session, receipt, "effect_committed" if fresh else "effect_reconciled")


def advance(session: RunSession, receipt: Receipt, kind: str) -> None:
    """The deterministic state transition a committed receipt implies."""
    pending = session._pending()
    state = session.state.evolve(
        phase=Phase.RUNNING,
        pending=None,
        environment=receipt.post_state,
        last_write=CompletedWrite(
            action_id=pending.action_id,
            idempotency_key=pending.idempotency_key,
            intent_digest=pending.intent_digest,
            receipt_id=receipt.receipt_id,
            receipt_fingerprint=receipt.fingerprint,
            result_digest=digest(receipt.result),
            post_version=receipt.post_state.version,
        ),
        writes_committed=session.state.writes_committed + 1,
        verification=None,  # any write invalidates earlier verifier evidence
    )
    session.commit(
        state,
        [
            (
                kind,
                {
                    "action_id": pending.action_id,
                    "idempotency_key": pending.idempotency_key,
                    "receipt_id": receipt.receipt_id,
                    "receipt_fingerprint": receipt.fingerprint,
                    "post_state": receipt.post_state.to_json(),
                },
            )
        ],
    )
