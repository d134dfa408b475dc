"""Compensation and effect decisions, as pure values.

A committed effect can be undone only the way its kind declared when it
was recorded (``EffectTerms.compensation`` in the ledger): ``adapter``
compensation is carried out by the runtime, and only when a reviewer's
signed **effect decision** orders it; ``human`` and ``none`` are refused
(:class:`CompensationRefusedError`): an email is not unsent by a program.

The compensation is itself an effect, and it rides the pending-write
protocol unchanged: its intent (:func:`compensation_intent`) names the
original effect (key, action id, intent digest, receipt id and fingerprint,
business object) under the original's kind, so the adapter that owns the
kind carries it out; a fresh key is minted and the intent persisted with
the decision (checkpoint + ledger, one fenced commit) before anything leaves
the process; the settle rules send, look up and reconcile it like any write,
so a crash anywhere is settled by its key and an unknown outcome of a blind
adapter goes to ``needs_review``. The commit that records its receipt also
records ``committed -> compensated`` for the original, with the
compensation's receipt (:func:`compensated_note`).

An effect decision binds task, run, policy version, the effect's key, the
fingerprint of the receipt the ledger holds for it, the ledger status it was
signed against, the decision (``accept`` | ``compensate``), its lifetime and
a one-time nonce. Its body joins the state's ``decisions`` (restoring needs
the reviewers' roots); its nonce is refused when any document the run
consumed carried it (``consumed_nonces``): a replay is refused. ``accept`` records the acceptance; on an effect
whose review case is open (an unknown outcome) it closes the case the way a
replan does.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from tether.core._canonical import JSONValue, digest
from tether.core._case_table import ReviewDecision
from tether.core._errors import EvidenceBindingError, PolicyError
from tether.core._evidence import (
    check_bound,
    check_lifetime,
    check_nonce,
    check_shape,
    consumed_nonces,
)
from tether.core._ledger import EffectTerms, LedgerEntry
from tether.core._model import Capabilities, EnvironmentState, Intent, PendingWrite, format_time
from tether.core._people import apply_decision, evidence_digest
from tether.core._phases import Compensation, EffectStatus, OutcomeReason, Phase
from tether.core._state import RunState
from tether.core._transition import EffectRef, Event, LedgerNote, OutcomeKind, Transition

#: The one argument of a compensation intent: which effect it undoes. A dotted
#: name no adapter kind declares, so the gate refuses it in any proposal.
COMPENSATES = "tether.compensates"
#: Action ids of compensations start with this (an agent's action id may not).
COMPENSATION_PREFIX = "compensate:"

EFFECT_DECISION_FIELDS = (
    "kind", "reviewer_id", "task_id", "run_id", "policy_version", "idempotency_key",
    "receipt_fingerprint", "ledger_status", "decision", "issued_at", "expires_at", "nonce",
)  # fmt: skip


class EffectDecision(StrEnum):
    """What a reviewer can decide about one effect in the ledger."""

    ACCEPT = "accept"
    COMPENSATE = "compensate"


class CompensationRefusedError(PolicyError):
    """The effect cannot be compensated by the runtime; nothing changed.

    ``compensation`` is what its kind declared (``none``, ``human``) or why
    else (``not_committed``, ``not_offered``, ``busy``); ``idempotency_key``
    names the effect. A person undoes a ``human`` effect by hand, then signs
    an ``accept``.
    """

    def __init__(
        self, message: str, *, run_id: str, idempotency_key: str, compensation: str
    ) -> None:
        self.idempotency_key = idempotency_key
        self.compensation = compensation
        super().__init__(message, run_id=run_id)


@dataclass(frozen=True, slots=True)
class EffectRecord:
    """What the verified ledger says of one effect now: its last status and receipt."""

    idempotency_key: str
    action_id: str
    intent_digest: str
    status: EffectStatus
    #: The newest receipt recorded for the key (the committed one; the
    #: compensation's once compensated); ``None`` for an effect without one.
    receipt: dict[str, Any] | None
    terms: EffectTerms | None

    @property
    def receipt_fingerprint(self) -> str | None:
        """The digest of the receipt as the ledger holds it (``None`` without one)."""
        return None if self.receipt is None else digest(self.receipt)

    @property
    def compensation(self) -> Compensation:
        """How its kind said, when it was recorded, that it could be undone."""
        return Compensation.NONE if self.terms is None else self.terms.compensation

    @classmethod
    def find(cls, entries: Iterable[LedgerEntry], key: object) -> EffectRecord | None:
        """The record of ``key`` in a verified chain (oldest first), or ``None``."""
        last: LedgerEntry | None = None
        receipt: dict[str, Any] | None = None
        for entry in entries:
            if entry.idempotency_key == key:
                last = entry
                receipt = entry.receipt if entry.receipt is not None else receipt
        if last is None:
            return None
        return cls(
            last.idempotency_key,
            last.action_id,
            last.intent_digest,
            last.status,
            receipt,
            last.terms,
        )


def effect_decision_request(state: RunState, effect: EffectRecord) -> dict[str, Any]:
    """The fields an effect decision about ``effect`` must carry, bound to the run now."""
    return {
        "kind": "effect_decision",
        "task_id": state.binding.task_id,
        "run_id": state.run_id,
        "policy_version": state.binding.policy_version,
        "idempotency_key": effect.idempotency_key,
        "receipt_fingerprint": effect.receipt_fingerprint,
        "ledger_status": effect.status.value,
    }


def new_effect_decision(
    state: RunState,
    effect: EffectRecord,
    reviewer_id: str,
    decision: EffectDecision | str,
    *,
    issued_at: datetime,
    expires_at: datetime,
    nonce: str,
) -> dict[str, Any]:
    """The body a reviewer signs to accept ``effect`` or order its compensation."""
    return {
        **effect_decision_request(state, effect),
        "reviewer_id": reviewer_id,
        "decision": EffectDecision(decision).value,
        "issued_at": format_time(issued_at),
        "expires_at": format_time(expires_at),
        "nonce": nonce,
    }


def check_effect_decision(
    body: dict[str, Any],
    signer_id: str,
    state: RunState,
    effect: EffectRecord | None,
    *,
    now: datetime,
    ttl_s: int,
) -> EffectDecision:
    """Refuse a decision that is malformed, mis-bound, stale, expired or replayed.

    ``effect`` is the ledger's record of the key the body names, read now:
    a ledger status or receipt that moved since the signature makes the
    decision stale (:class:`~tether.core.EvidenceBindingError`).
    """
    check_shape(body, EFFECT_DECISION_FIELDS)
    if body["reviewer_id"] != signer_id:
        raise EvidenceBindingError("reviewer_id", signer_id, body["reviewer_id"])
    if effect is None:
        raise EvidenceBindingError(
            "idempotency_key", "the key of an effect in this run's ledger", body["idempotency_key"]
        )
    check_bound(body, effect_decision_request(state, effect))
    check_lifetime(body, now=now, ttl_s=ttl_s)
    check_nonce(body, consumed_nonces(state))
    try:
        return EffectDecision(body["decision"])
    except ValueError as exc:
        raise EvidenceBindingError("decision", "accept or compensate", body["decision"]) from exc


def check_compensable(state: RunState, effect: EffectRecord, *, offered: bool) -> None:
    """Refuse, with :class:`CompensationRefusedError`, what the runtime may not undo now.

    Only a ``committed`` effect whose kind declared ``adapter`` compensation,
    whose adapter offers it (``offered``), and only while the run is running
    with nothing pending (one action at a time; a frozen run is replanned
    first). A compensation is never itself compensated.
    """

    def refuse(why: str, message: str) -> CompensationRefusedError:
        return CompensationRefusedError(
            f"run {state.run_id}: effect {effect.idempotency_key} ({effect.action_id}) "
            f"cannot be compensated by the runtime: {message}",
            run_id=state.run_id,
            idempotency_key=effect.idempotency_key,
            compensation=why,
        )

    check_undoable(state, effect, offered=offered)
    if effect.status is not EffectStatus.COMMITTED:
        raise refuse("not_committed", f"the ledger says {effect.status.value}, not committed")
    if state.phase is not Phase.RUNNING or state.pending is not None:
        raise refuse(
            "busy", f"the run is {state.phase.value}; a compensation waits for it to be running"
        )


def is_compensation(action_id: str) -> bool:
    """Whether ``action_id`` names a compensation the runtime ordered (never itself undone)."""
    return action_id.startswith(COMPENSATION_PREFIX)


def check_undoable(state: RunState, effect: EffectRecord, *, offered: bool) -> None:
    """Refuse, with :class:`CompensationRefusedError`, an effect the runtime cannot undo at all.

    Its kind must have declared ``adapter`` compensation when it was recorded,
    its adapter must offer it (``offered``), and it must not itself be a
    compensation. Whether it may be undone *now* is the caller's to add
    (:func:`check_compensable` for a running run; a review case's decision
    for a frozen one).
    """

    def refuse(why: str, message: str) -> CompensationRefusedError:
        return CompensationRefusedError(
            f"run {state.run_id}: effect {effect.idempotency_key} ({effect.action_id}) "
            f"cannot be compensated by the runtime: {message}",
            run_id=state.run_id,
            idempotency_key=effect.idempotency_key,
            compensation=why,
        )

    declared = effect.compensation
    if declared is Compensation.HUMAN:
        raise refuse("human", "its kind is undone only by a person; do it, then sign accept")
    if declared is not Compensation.ADAPTER:
        raise refuse("none", "its kind declares no way to undo it")
    if is_compensation(effect.action_id):
        raise refuse("none", "it is itself a compensation")
    if not offered:
        raise refuse("not_offered", "the adapter that owns its kind offers no compensate()")


def compensation_intent(effect: EffectRecord, *, risk: str) -> Intent:
    """The intent that undoes ``effect``: its kind and target, naming exactly what it undoes."""
    terms = effect.terms
    receipt = effect.receipt or {}
    if terms is None:
        raise ValueError("an effect without recorded terms cannot be compensated")  # caller's bug
    named: dict[str, JSONValue] = {
        "idempotency_key": effect.idempotency_key,
        "action_id": effect.action_id,
        "intent_digest": effect.intent_digest,
        "receipt_id": str(receipt.get("receipt_id", "")),
        "receipt_fingerprint": effect.receipt_fingerprint,
        "business_object_id": str(receipt.get("business_object_id", "")),
    }
    return Intent(terms.kind, terms.target, {COMPENSATES: named}, risk)


def compensated_effect(intent: Intent) -> dict[str, Any] | None:
    """What a compensation intent undoes (see :func:`compensation_intent`), else ``None``."""
    if set(intent.args) != {COMPENSATES}:
        return None
    named = intent.args[COMPENSATES]
    return named if isinstance(named, dict) else None


def compensated_note(pending: PendingWrite, receipt: dict[str, Any]) -> LedgerNote | None:
    """``compensated`` for the original effect, when ``pending`` is a compensation that landed."""
    named = compensated_effect(pending.intent)
    if named is None or not pending.action_id.startswith(COMPENSATION_PREFIX):
        return None
    return LedgerNote(
        EffectStatus.COMPENSATED,
        receipt,
        subject=EffectRef(
            idempotency_key=str(named["idempotency_key"]),
            action_id=str(named["action_id"]),
            intent_digest=str(named["intent_digest"]),
            # Ordered only for a committed effect, and nothing else can move it
            # while its compensation is the one pending write.
            status=EffectStatus.COMMITTED,
        ),
    )


def _cursor(state: RunState, cursor: int | None) -> int:
    return state.inbox_cursor if cursor is None else max(state.inbox_cursor, cursor)


def _decided(document: dict[str, Any], body: dict[str, Any]) -> dict[str, JSONValue]:
    """What the trace records of a decision about an effect (an effect decision's body,
    or a review decision's, which names a case instead of a ledger status)."""
    return {
        "idempotency_key": body["idempotency_key"],
        "ledger_status": body.get("ledger_status"),
        "case_id": body.get("case_id"),
        "receipt_fingerprint": body["receipt_fingerprint"],
        "decision": body["decision"],
        "reviewer_id": body["reviewer_id"],
        "nonce": body["nonce"],
        "evidence_digest": evidence_digest(document),
    }


def accept_effect(
    state: RunState,
    effect: EffectRecord,
    document: dict[str, Any],
    body: dict[str, Any],
    *,
    cursor: int | None,
) -> Transition:
    """A verified ``accept``: recorded; an open review case about the effect closes as replanned.

    The ledger is not changed: it keeps what the adapter proved (an unknown
    outcome stays unknown there); the trace says a person accepted it as done.
    """
    accepted: Event = ("effect_accepted", _decided(document, body))
    case = next(
        (c for c in state.review_cases if c.idempotency_key == effect.idempotency_key), None
    )
    if case is not None and state.phase is Phase.NEEDS_REVIEW:
        closed = apply_decision(state, case, ReviewDecision.REPLAN, document, cursor=cursor)
        if closed.state is None:  # apply_decision always commits; keeps the type checker honest
            raise ValueError("a decision without a state")
        return Transition(
            OutcomeKind.RECORDED,
            state=closed.state,
            events=(*closed.events, accepted),
            reason=OutcomeReason.EFFECT_ACCEPTED,
        )
    return Transition(
        OutcomeKind.RECORDED,
        state=state.evolve(
            decisions=(*state.decisions, document), inbox_cursor=_cursor(state, cursor)
        ),
        events=(accepted,),
        reason=OutcomeReason.EFFECT_ACCEPTED,
    )


def order_compensation(
    state: RunState,
    effect: EffectRecord,
    document: dict[str, Any],
    body: dict[str, Any],
    intent: Intent,
    *,
    key: str,
    expected_post: EnvironmentState,
    now: datetime,
    capabilities: Capabilities,
    cursor: int | None,
) -> Transition:
    """A verified ``compensate``: the compensation becomes the pending write, durable, keyed.

    Exactly as ``propose_write`` for a write that needs no further approval
    (the signed decision is the authority): sent at once on an adapter that
    settles by key (``dispatched`` lands with the intent), otherwise
    ``intended`` now and ``dispatched`` in its own commit right before the
    call. The decision's nonce is consumed in the same commit.
    """
    settles_by_key = capabilities.idempotent or (
        capabilities.queryable and capabilities.absent_is_final
    )
    status = EffectStatus.DISPATCHED if settles_by_key else EffectStatus.INTENDED
    pending = PendingWrite(
        action_id=f"{COMPENSATION_PREFIX}{effect.action_id}@{state.generation + 1}",
        intent=intent,
        intent_digest=intent.digest,
        idempotency_key=key,
        prestate=state.environment,
        expected_post=expected_post,
        generation=state.generation + 1,
        proposed_at=now,
        cost=0,
        status=status,
        dispatched_at=now if settles_by_key else None,
    )
    events: tuple[Event, ...] = (
        ("compensation_ordered", {**_decided(document, body), "compensation_key": key}),
        (
            "intent_persisted",
            {
                "action_id": pending.action_id,
                "idempotency_key": key,
                "intent_digest": pending.intent_digest,
                "kind": intent.kind,
                "target": intent.target,
                "expected_post": expected_post.to_json(),
            },
        ),
    )
    notes: tuple[LedgerNote, ...] = (LedgerNote(EffectStatus.INTENDED),)
    if settles_by_key:
        notes = (*notes, LedgerNote(EffectStatus.DISPATCHED))
    return Transition(
        OutcomeKind.IN_FLIGHT,
        state=state.evolve(
            phase=Phase.PENDING,
            pending=pending,
            decisions=(*state.decisions, document),
            inbox_cursor=_cursor(state, cursor),
        ),
        events=events,
        ledger=notes,
        reason=OutcomeReason.COMPENSATION_ORDERED,
    )
