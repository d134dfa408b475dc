"""What a fitting reviewer decision does to its case, as pure transitions.

The table in :mod:`tether.core._case_table` says which settlement a signed
decision asks for; here each settlement is the transition it commits, in
ONE fenced commit with its ledger notes (the runtime verifies the document,
rereads the world, and hands the verified body here):

- ``landed``: the case's write is recorded ``committed`` in the ledger, with
  a receipt a person gave (:func:`reviewed_receipt`: the reviewer's id, the
  evidence they found, the case and the decision's digest); nothing is
  sent; the run goes on.
- ``resend``: the write stays pending under its key, marked for one more
  send (``resend_ordered``); the next step commits ``dispatched`` and sends
  it (``settle_rules.settle``), so a crash after that commit is an unknown
  outcome again, never a second blind send.
- ``landed_compensate`` / ``compensate``: the write is committed (by the
  person, or already by its adapter) and its compensation becomes the
  pending write, keyed and durable, exactly as an effect decision orders it.
- ``landed_cancel`` / ``dropped_cancel``: the write is settled (committed,
  or ``cancelled``: it never landed and never will be sent) and the run ends
  cancelled, as the cancel that froze it asked.
- ``landed_earlier``: an earlier attempt a replan set aside is committed,
  by the person; a re-proposal of its effect is then replayed, never sent.

``replan``, ``abort`` and ``accept`` are :func:`tether.core.people_rules.apply_decision`.

A ``not_landed`` is a person's word that nothing landed, and it orders a
resend (or drops the write for good, on a cancel's case). Before it is
consumed, the adapter is asked by key where it can be
(:func:`check_not_landed`), because a request that stayed in flight past
its limit may still be carried out while the person looks:

===================================  =========================================
the adapter, asked by the case's key  the ``not_landed``
===================================  =========================================
holds a receipt (any intent)          refused: it landed (sign ``landed``)
still in flight                       refused: wait, then decide again
unreachable                           refused: decide again once it answers,
                                      or sign ``abort`` / ``landed`` now
recorded the request as refused       stands: the adapter agrees
absent, final, key within retention,  stands: the adapter agrees
no takeover since the send
absent otherwise, inconclusive        stands only with evidence (what the
                                      person searched, not the key); refused
                                      without it
cannot be asked by key                stands on the person's word (unproven);
                                      the case card warns before signing
===================================  =========================================

An unreachable adapter refuses the decision rather than leaving it unread:
an unread decision holds the case (a second one is refused at delivery), so
a person could not sign ``abort`` or ``landed`` until it expired.

"Absent otherwise": the service may have forgotten the key (past its
declared retention, :mod:`tether.core._retention`), its absence is not
declared final, or a worker whose lease lapsed may still be inside the send
and its adapter's absence does not outlive a takeover (the settle rule's
``absence_outlives_takeover``). A look-up by key proves nothing then, so
the person must have looked for the effect itself, and say where.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from enum import StrEnum
from typing import Any

from tether.core._canonical import JSONValue, digest
from tether.core._case_table import (
    REVIEW_NAMESPACE,
    ReviewDecision,
    Settlement,
    case_kind,
    fitting,
)
from tether.core._compensation import EffectRecord, order_compensation
from tether.core._errors import DecisionRefusedError
from tether.core._ledger import EffectTerms
from tether.core._model import (
    Capabilities,
    CompletedWrite,
    EnvironmentState,
    Intent,
    LastOutcome,
    Receipt,
    ReviewCase,
)
from tether.core._people import apply_decision, evidence_digest
from tether.core._phases import EffectStatus, OutcomeReason, Phase
from tether.core._state import RunState
from tether.core._steps import cancel as cancel_run
from tether.core._transition import (
    EffectRef,
    Event,
    LedgerNote,
    LookupAnswer,
    LookupStatus,
    OutcomeKind,
    Transition,
)


@dataclass(frozen=True, slots=True)
class Undo:
    """What the runtime prepared for a compensation a decision orders.

    ``effect`` is the effect to undo as it stands once the decision applies
    (committed; by the person for an unknown outcome, see :func:`landed_record`);
    ``intent`` its compensation (``compensation_rules.compensation_intent``),
    ``key`` minted for it, ``expected_post`` and ``capabilities`` its
    adapter's.
    """

    effect: EffectRecord
    intent: Intent
    key: str
    expected_post: EnvironmentState
    capabilities: Capabilities


def reviewed_receipt(
    case: ReviewCase,
    body: dict[str, Any],
    document: dict[str, Any],
    *,
    idempotency_key: str,
    intent_digest: str,
) -> Receipt:
    """The receipt of a write a person found landed: who, what they found, when they signed.

    Its namespace is :data:`REVIEW_NAMESPACE`, so no reader takes it for an
    adapter's; ``business_object_id`` is the evidence (a message id, a URL, a
    receipt id at the service), which is what a compensation names.
    """
    evidence = str(body.get("evidence") or "")
    return Receipt(
        namespace=REVIEW_NAMESPACE,
        adapter_version="1",
        receipt_id=f"review:{case.case_id}",
        idempotency_key=idempotency_key,
        intent_digest=intent_digest,
        result={
            "settled_by": "review",
            "decision": str(body.get("decision")),
            "reviewer_id": str(body.get("reviewer_id")),
            "evidence": evidence,
            "case_id": case.case_id,
            "case_reason": case.reason,
            "signed_at": str(body.get("issued_at")),
            "decision_digest": evidence_digest(document),
        },
        business_object_id=evidence,
        committed_at=str(body.get("issued_at")),
        post_state=case.environment,
    )


def is_reviewed(receipt: dict[str, Any] | None) -> bool:
    """Whether a receipt (as the ledger holds it) is one a person gave."""
    return receipt is not None and receipt.get("namespace") == REVIEW_NAMESPACE


def landed_record(
    state: RunState,
    case: ReviewCase,
    body: dict[str, Any],
    document: dict[str, Any],
    terms: EffectTerms | None,
) -> EffectRecord:
    """The case's pending write as the ledger will hold it once a person's ``landed`` applies."""
    pending = state.pending
    if pending is None:
        raise ValueError("a landed decision names the pending write")  # the table's bug
    receipt = reviewed_receipt(
        case,
        body,
        document,
        idempotency_key=pending.idempotency_key,
        intent_digest=pending.intent_digest,
    )
    return EffectRecord(
        pending.idempotency_key,
        pending.action_id,
        pending.intent_digest,
        EffectStatus.COMMITTED,
        receipt.to_json(),
        terms,
    )


def settle_case(
    state: RunState,
    case: ReviewCase,
    settled: Settlement,
    document: dict[str, Any],
    body: dict[str, Any],
    *,
    cursor: int | None,
    now: datetime,
    earlier: EffectRef | None = None,
    undo: Undo | None = None,
) -> Transition:
    """The transition a verified decision commits (see the module docstring).

    ``earlier``: the earlier attempt a ``landed_earlier`` settles (its last
    ledger status, read now). ``undo``: the compensation a ``compensate``
    orders. Either missing where needed is a caller's bug.
    """
    if settled in {Settlement.REPLAN, Settlement.ABORT, Settlement.ACCEPT}:
        return apply_decision(state, case, ReviewDecision(settled.value), document, cursor=cursor)
    sealed, closed = _close(state, case, document, cursor)
    if settled is Settlement.RESEND:
        return _resend(state, closed, sealed, body)
    if settled is Settlement.LANDED_EARLIER:
        if earlier is None:
            raise ValueError("landed_earlier needs the earlier attempt")  # caller's bug
        return _landed(closed, case, sealed, document, body, earlier)
    pending = state.pending
    if pending is None:
        raise ValueError(f"{settled} settles the pending write; there is none")  # table's bug
    mine = EffectRef(
        pending.idempotency_key, pending.action_id, pending.intent_digest, pending.status
    )
    if settled is Settlement.LANDED:
        return _landed(closed, case, sealed, document, body, mine)
    if settled in {Settlement.LANDED_CANCEL, Settlement.DROPPED_CANCEL}:
        return _then_cancel(closed, case, sealed, document, body, settled, mine)
    if undo is None:
        raise ValueError(f"{settled} needs the compensation to order")  # caller's bug
    notes: tuple[LedgerNote, ...] = ()
    landed: tuple[Event, ...] = ()
    env = case.environment
    base = closed.evolve(
        decisions=state.decisions,  # order_compensation records the decision itself
        environment=env,
        observed_version=min(closed.observed_version, env.version),
        verification=None,
    )
    if settled is Settlement.LANDED_COMPENSATE:
        receipt = undo.effect.receipt
        notes = (LedgerNote(EffectStatus.COMMITTED, receipt, subject=mine),)
        landed = (_landed_event(mine, receipt or {}, body),)
        base = base.evolve(writes_committed=base.writes_committed + 1)
    # The undo's notes are its own (it is the write the step makes pending); the
    # original's are named by ``subject``. The decision's nonce is consumed with it.
    ordered = order_compensation(
        base,
        undo.effect,
        document,
        body,
        undo.intent,
        key=undo.key,
        expected_post=undo.expected_post,
        now=now,
        capabilities=undo.capabilities,
        cursor=cursor,
    )
    return replace(
        ordered,
        events=(sealed, *landed, *ordered.events),
        ledger=(*notes, *ordered.ledger),
    )


def _close(
    state: RunState, case: ReviewCase, document: dict[str, Any], cursor: int | None
) -> tuple[Event, RunState]:
    """The case, the write and the decision sealed into the trace; the case closed."""
    sealed: Event = (
        "review_sealed",
        {
            "case": case.to_json(),
            "pending": None if state.pending is None else state.pending.to_json(),
            "decision": document,
        },
    )
    at = state.inbox_cursor if cursor is None else max(state.inbox_cursor, cursor)
    closed = state.evolve(
        review_cases=tuple(c for c in state.review_cases if c.case_id != case.case_id),
        decisions=(*state.decisions, document),
        inbox_cursor=at,
    )
    return sealed, closed


def _landed_event(effect: EffectRef, receipt: dict[str, Any], body: dict[str, Any]) -> Event:
    data: dict[str, JSONValue] = {
        "action_id": effect.action_id,
        "idempotency_key": effect.idempotency_key,
        "receipt_id": str(receipt.get("receipt_id")),
        "receipt_fingerprint": digest(receipt),
        "reviewer_id": str(body.get("reviewer_id")),
        "evidence": str(body.get("evidence") or ""),
    }
    return ("effect_landed_by_review", data)


def _landed(
    closed: RunState,
    case: ReviewCase,
    sealed: Event,
    document: dict[str, Any],
    body: dict[str, Any],
    effect: EffectRef,
) -> Transition:
    """Committed by a person; the run goes on from the world the case recorded."""
    receipt = reviewed_receipt(
        case,
        body,
        document,
        idempotency_key=effect.idempotency_key,
        intent_digest=effect.intent_digest,
    )
    recorded = receipt.to_json()
    # The pending write's note needs no subject; an earlier attempt's does.
    mine = closed.pending is not None and closed.pending.idempotency_key == effect.idempotency_key
    note = LedgerNote(EffectStatus.COMMITTED, recorded, subject=None if mine else effect)
    env = case.environment
    told = LastOutcome.bounded(
        OutcomeKind.RECORDED.value,
        action_id=effect.action_id,
        reason=OutcomeReason.LANDED_BY_REVIEW,
        message=f"reviewer {body.get('reviewer_id')} found that {effect.action_id!r} landed "
        f"({body.get('evidence')}); it is recorded as done and was not sent again",
    )
    after = closed.evolve(
        phase=Phase.RUNNING,
        pending=None,
        environment=env,
        observed_version=min(closed.observed_version, env.version),
        last_write=CompletedWrite(
            action_id=effect.action_id,
            idempotency_key=effect.idempotency_key,
            intent_digest=effect.intent_digest,
            receipt_id=receipt.receipt_id,
            receipt_fingerprint=receipt.fingerprint,
            result_digest=digest(receipt.result),
            post_version=env.version,
        ),
        writes_committed=closed.writes_committed + 1,
        verification=None,
        last_outcome=told,
    )
    return Transition(
        OutcomeKind.RECORDED,
        state=after,
        events=(sealed, _landed_event(effect, recorded, body)),
        ledger=(note,),
        reason=OutcomeReason.LANDED_BY_REVIEW,
        message=told.message,
    )


def _resend(state: RunState, closed: RunState, sealed: Event, body: dict[str, Any]) -> Transition:
    """Still pending under its key, marked to be sent once more at the next step."""
    pending = state.pending
    if pending is None:
        raise ValueError("a resend names the pending write")  # the table's bug
    ordered: Event = (
        "resend_ordered",
        {
            "action_id": pending.action_id,
            "idempotency_key": pending.idempotency_key,
            "reviewer_id": str(body.get("reviewer_id")),
            "evidence": str(body.get("evidence") or ""),
        },
    )
    told = LastOutcome.bounded(
        OutcomeKind.RECORDED.value,
        action_id=pending.action_id,
        reason=OutcomeReason.RESEND_BY_REVIEW,
        message=f"reviewer {body.get('reviewer_id')} found that {pending.action_id!r} did not "
        f"land; it is sent once more under its key {pending.idempotency_key}",
    )
    return Transition(
        OutcomeKind.RECORDED,
        state=closed.evolve(
            phase=Phase.PENDING,
            pending=replace(pending, resend_ordered=True),
            last_outcome=told,
        ),
        events=(sealed, ordered),
        reason=OutcomeReason.RESEND_BY_REVIEW,
        message=told.message,
    )


def _then_cancel(
    closed: RunState,
    case: ReviewCase,
    sealed: Event,
    document: dict[str, Any],
    body: dict[str, Any],
    settled: Settlement,
    effect: EffectRef,
) -> Transition:
    """The write settled by the person, then the run cancelled, as the cancel that froze it asked."""
    if settled is Settlement.LANDED_CANCEL:
        receipt: dict[str, Any] | None = reviewed_receipt(
            case,
            body,
            document,
            idempotency_key=effect.idempotency_key,
            intent_digest=effect.intent_digest,
        ).to_json()
        note = LedgerNote(EffectStatus.COMMITTED, receipt)
        settles: Event = _landed_event(effect, receipt or {}, body)
        writes = closed.writes_committed + 1
    else:
        note = LedgerNote(EffectStatus.CANCELLED)
        settles = (
            "effect_dropped_by_review",
            {
                "action_id": effect.action_id,
                "idempotency_key": effect.idempotency_key,
                "reviewer_id": str(body.get("reviewer_id")),
                "evidence": str(body.get("evidence") or ""),
            },
        )
        writes = closed.writes_committed
    ended = cancel_run(
        closed.evolve(pending=None, writes_committed=writes),
        f"cancelled as asked, once reviewer {body.get('reviewer_id')} settled "
        f"{effect.action_id!r} ({body.get('decision')})",
        by=str(body.get("reviewer_id")),
    )
    return replace(ended, events=(sealed, settles, *ended.events), ledger=(note,))


# -- not_landed, checked against the adapter ------------------------------------

#: The settlements a ``not_landed`` asks for: each says the write never landed.
NOT_LANDED = frozenset({Settlement.RESEND, Settlement.DROPPED_CANCEL})


class NotLandedCheck(StrEnum):
    """What the adapter's answer makes of a signed ``not_landed`` (module docstring's table)."""

    #: The adapter agrees nothing landed (a final absence, or a refusal it recorded).
    STANDS = "stands"
    #: The adapter cannot say (not askable, or its answer proves nothing): the person's word.
    UNPROVEN = "unproven"
    #: Refused: the adapter holds a receipt under the key.
    LANDED = "landed"
    #: Refused: the adapter is still carrying a request under the key out.
    IN_FLIGHT = "in_flight"
    #: Refused: the adapter could not be reached (decide again once it answers).
    UNREACHABLE = "unreachable"
    #: Refused: the adapter's absence proves nothing now and the decision does not say
    #: what the person searched instead of the key.
    UNSEARCHED = "unsearched"


def absence_doubt(*, absent_is_final: bool, remembered: bool, taken_over: bool) -> str:
    """Why a look-up by key that finds nothing proves nothing now ('' where it is final).

    ``taken_over``: a worker whose lease lapsed sent the write and its
    adapter's absence does not outlive that (it may still be inside the send).
    """
    if not remembered:
        return "the service may have forgotten the key (it is older than its declared retention)"
    if not absent_is_final:
        return "the service does not declare that a key it does not know was never used"
    if taken_over:
        return (
            "the worker that sent it lost its lease and may still be inside the call, about "
            "to send it"
        )
    return ""


def check_not_landed(
    answer: LookupAnswer | None,
    *,
    absent_is_final: bool,
    remembered: bool,
    taken_over: bool = False,
    evidence: bool = False,
) -> NotLandedCheck:
    """What ``answer`` (``None``: the adapter cannot be asked by key) makes of a ``not_landed``.

    ``absent_is_final``: the adapter's absence is final under the terms the
    write was sent under and those declared now; ``remembered``: the key is
    within the adapter's retention (``tether.core._retention``, on the
    store's clock too); ``taken_over``: see :func:`absence_doubt`;
    ``evidence``: the decision says what the person found (searched for the
    effect itself). Any receipt under the key refuses it, another intent's
    included: the key is taken, so a resend could not be ours.
    """
    if answer is None:
        return NotLandedCheck.UNPROVEN
    status = answer.status
    if status is LookupStatus.COMMITTED:
        return NotLandedCheck.LANDED
    if status is LookupStatus.IN_PROGRESS:
        return NotLandedCheck.IN_FLIGHT
    if status is LookupStatus.UNAVAILABLE:
        return NotLandedCheck.UNREACHABLE
    if status is LookupStatus.REFUSED:
        return NotLandedCheck.STANDS
    doubt = absence_doubt(
        absent_is_final=absent_is_final, remembered=remembered, taken_over=taken_over
    )
    if status is LookupStatus.ABSENT and not doubt:
        return NotLandedCheck.STANDS
    return NotLandedCheck.UNPROVEN if evidence else NotLandedCheck.UNSEARCHED


def refuse_not_landed(
    case: ReviewCase,
    state: RunState,
    check: NotLandedCheck,
    answer: LookupAnswer | None,
    *,
    doubt: str = "",
) -> DecisionRefusedError | None:
    """The refusal a ``not_landed`` gets when the adapter contradicts it, else ``None``.

    The message names what the adapter reported (``doubt``: why its absence
    proves nothing now, :func:`absence_doubt`), and what to do instead.
    """
    key = case.idempotency_key
    fits = tuple(d.value for d in fitting(case_kind(case, state)))
    detail = "" if answer is None or not answer.detail else f" ({answer.detail})"
    head = f"case {case.case_id}: not_landed refused: "
    if check is NotLandedCheck.LANDED:
        receipt = None if answer is None else answer.receipt
        found = (
            "a receipt"
            if receipt is None
            else f"receipt {receipt.receipt_id} (business object {receipt.business_object_id}, "
            f"committed at {receipt.committed_at or 'an unrecorded time'}"
            + (", for another intent" if receipt.intent_digest != case.intent_digest else "")
            + ")"
        )
        # not_landed is no way out here: the write landed.
        fits = tuple(d for d in fits if d != ReviewDecision.NOT_LANDED.value)
        said, why = (
            "landed",
            (
                f"the adapter holds {found} under key {key}, so the write landed; sign landed with "
                "what it found (or compensate, where the case takes it) instead"
            ),
        )
    elif check is NotLandedCheck.IN_FLIGHT:
        said, why = (
            "in_flight",
            (
                f"the adapter reports a request under key {key} still in flight{detail}, so it may "
                "still land and a resend could be a second effect; wait until the service has "
                "finished it, then look again and decide again"
            ),
        )
    elif check is NotLandedCheck.UNREACHABLE:
        said, why = (
            "unreachable",
            (
                f"the service could not be asked about key {key}{detail}, and a write it may hold "
                "cannot be declared never landed unasked; decide again when it answers, or sign "
                "abort or landed now (the case is free for another decision)"
            ),
        )
    elif check is NotLandedCheck.UNSEARCHED:
        said, why = (
            "unsearched",
            (
                f"a look-up by key {key} proves nothing now "
                f"({doubt or 'the answer of the adapter proves nothing'}); look for the effect itself in "
                "the system it called (what it made, by its content: a ticket by its title, a "
                "message by its subject), not for the key, and sign not_landed again with evidence "
                "saying what you searched (or landed with what you found)"
            ),
        )
    else:
        return None
    return DecisionRefusedError(
        head + why,
        case_id=case.case_id,
        reason=case.reason,
        decision=ReviewDecision.NOT_LANDED.value,
        fits=fits,
        found=said,
    )
