"""Which signed decision settles which review case: one table, read by every path.

A review case is one of a few kinds (:func:`case_kind`, from the case and
the run's state alone), and each kind has its own ways out. The table
(:func:`settlement`) maps (kind, decision) to what the decision does; a
decision the table has no row for is refused with
:class:`~tether.core.DecisionRefusedError` and the case stays frozen, evidence
kept. The checks a signed decision goes through (``check_decision``), the
documents the CLI and the page prepare, and the page's buttons all read it,
so a refused decision looks the same whichever path it came by.

==================  =======  =====  ======  ===============  ================  ===================
kind                replan   abort  accept  landed           not_landed        compensate
==================  =======  =====  ======  ===============  ================  ===================
unknown_outcome     replan   abort  --      landed           resend            landed, compensate
unknown_on_cancel   replan   abort  --      landed, cancel   dropped, cancel   --
unknown_earlier     replan   abort  --      landed_earlier   --                --
committed_frozen    replan   abort  --      --               --                compensate
environment_drift   replan   abort  accept  --               --                --
other               replan   abort  --      --               --                --
==================  =======  =====  ======  ===============  ================  ===================

``landed``: a person found the write in the world (their evidence is
signed with it); the ledger records it committed, by that person, and the
run goes on without sending it. ``resend``: a person found it did not land;
it is sent once more under its own key (a callee that deduplicates by key
still sees one request). ``compensate`` on an unknown outcome: it landed
(the evidence names what to undo) and is undone by its kind's declared
compensation. An earlier attempt a replan set aside (``unknown_earlier``,
no write pending) can be found landed; sending it again is a new effect,
which takes a signed fork.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from enum import StrEnum

from tether.core._errors import DecisionRefusedError
from tether.core._model import ReviewCase, parse_time_text
from tether.core._phases import EffectStatus, ReviewReason
from tether.core._retention import UNMEASURED_SKEW_S
from tether.core._state import RunState


class ReviewDecision(StrEnum):
    """The decisions a reviewer can sign for a review case.

    ``replan`` goes on from the case's environment with the case's key
    quarantined; ``abort`` fails the run; ``accept`` (a drift case only)
    takes the environment as observed and goes on; ``landed`` and
    ``not_landed`` settle a write whose outcome is unknown (it happened,
    with the reviewer's evidence; it did not, send it once more);
    ``compensate`` undoes the case's effect the way its kind declared.
    """

    REPLAN = "replan"
    ABORT = "abort"
    ACCEPT = "accept"
    LANDED = "landed"
    NOT_LANDED = "not_landed"
    COMPENSATE = "compensate"


class CaseKind(StrEnum):
    """What a review case is about, as far as a decision goes."""

    #: The pending write's outcome is unknown (nothing authoritative can say).
    UNKNOWN_OUTCOME = "unknown_outcome"
    #: The same, reached by a cancel: the run ends cancelled once it is settled.
    UNKNOWN_ON_CANCEL = "unknown_on_cancel"
    #: A re-proposed effect whose earlier attempt (no longer pending) has an unknown outcome.
    UNKNOWN_EARLIER = "unknown_earlier"
    #: The pending write committed, and something about its receipt froze the run.
    COMMITTED_FROZEN = "committed_frozen"
    #: The environment changed outside the run, and no write is named.
    ENVIRONMENT_DRIFT = "environment_drift"
    #: Anything else (a key conflict, a receipt gone, a worker that keeps failing, ...).
    OTHER = "other"


class Settlement(StrEnum):
    """What a fitting decision does to its case (see the module's table)."""

    REPLAN = "replan"
    ABORT = "abort"
    ACCEPT = "accept"
    #: Committed by a person; the run goes on, nothing is sent.
    LANDED = "landed"
    #: Sent once more under its key at the next step.
    RESEND = "resend"
    #: Committed by a person, then undone by its declared compensation.
    LANDED_COMPENSATE = "landed_compensate"
    #: Committed by a person; the run ends cancelled, as the cancel asked.
    LANDED_CANCEL = "landed_cancel"
    #: Never landed, and never will be sent; the run ends cancelled.
    DROPPED_CANCEL = "dropped_cancel"
    #: The earlier attempt is committed by a person; the run goes on.
    LANDED_EARLIER = "landed_earlier"
    #: The committed effect is undone by its declared compensation.
    COMPENSATE = "compensate"


#: The namespace of a receipt a person gave (``case_rules.reviewed_receipt``): no
#: adapter's. The replay rule answers a re-proposal of such an effect from the
#: ledger, without asking the adapter (which never knew it landed).
REVIEW_NAMESPACE = "tether.review"

#: Review cases about the environment alone: it changed outside the run
#: (``environment_drift``) or is ahead of the checkpoint (``environment_ahead``).
DRIFT_REASONS = frozenset({ReviewReason.ENVIRONMENT_DRIFT, ReviewReason.ENVIRONMENT_AHEAD})

_D = ReviewDecision
_K = CaseKind
_S = Settlement
_ALWAYS = {_D.REPLAN: _S.REPLAN, _D.ABORT: _S.ABORT}
TABLE: dict[CaseKind, dict[ReviewDecision, Settlement]] = {
    _K.UNKNOWN_OUTCOME: {
        **_ALWAYS,
        _D.LANDED: _S.LANDED,
        _D.NOT_LANDED: _S.RESEND,
        _D.COMPENSATE: _S.LANDED_COMPENSATE,
    },
    _K.UNKNOWN_ON_CANCEL: {
        **_ALWAYS,
        _D.LANDED: _S.LANDED_CANCEL,
        _D.NOT_LANDED: _S.DROPPED_CANCEL,
    },
    _K.UNKNOWN_EARLIER: {**_ALWAYS, _D.LANDED: _S.LANDED_EARLIER},
    _K.COMMITTED_FROZEN: {**_ALWAYS, _D.COMPENSATE: _S.COMPENSATE},
    _K.ENVIRONMENT_DRIFT: {**_ALWAYS, _D.ACCEPT: _S.ACCEPT},
    _K.OTHER: dict(_ALWAYS),
}

#: Settlements that record the case's write as committed by a person: the
#: decision must carry the evidence the person found.
NEEDS_EVIDENCE = frozenset({_S.LANDED, _S.LANDED_COMPENSATE, _S.LANDED_CANCEL, _S.LANDED_EARLIER})

#: What a person reads, per kind, about where the way out is when a decision does not fit.
_WAYS = {
    _K.UNKNOWN_OUTCOME: "its write's outcome is unknown: sign landed (with what you found), "
    "not_landed (it is sent once more under its key), compensate (where its kind can be undone), "
    "replan or abort",
    _K.UNKNOWN_ON_CANCEL: "a cancel waits on a write whose outcome is unknown: sign landed or "
    "not_landed (the run is then cancelled, as asked), replan or abort",
    _K.UNKNOWN_EARLIER: "an earlier attempt, set aside by a replan, has an unknown outcome: sign "
    "landed (with what you found), or abort; sending it again is a new effect: sign a fork "
    "(`tether fork`), then replan",
    _K.COMMITTED_FROZEN: "its write committed: sign compensate (where its kind can be undone), "
    "replan or abort",
    _K.ENVIRONMENT_DRIFT: "the environment changed outside the run: sign accept, replan or abort",
    _K.OTHER: "sign replan or abort",
}


def case_kind(case: ReviewCase, state: RunState) -> CaseKind:
    """The kind of ``case`` in ``state``: what the run knows of the write it names."""
    pending = state.pending
    names_pending = (
        bool(case.idempotency_key)
        and pending is not None
        and pending.mutating
        and pending.idempotency_key == case.idempotency_key
    )
    if names_pending and pending is not None:
        if pending.status is EffectStatus.OUTCOME_UNKNOWN:
            if case.reason == ReviewReason.OUTCOME_UNKNOWN:
                return CaseKind.UNKNOWN_OUTCOME
            if case.reason == ReviewReason.CANCEL_OUTCOME_UNKNOWN:
                return CaseKind.UNKNOWN_ON_CANCEL
        if pending.status is EffectStatus.COMMITTED:
            return CaseKind.COMMITTED_FROZEN
        return CaseKind.OTHER
    if case.reason == ReviewReason.REPLAY_OF_UNKNOWN and earlier_key(case):
        return CaseKind.UNKNOWN_EARLIER
    if case.reason in DRIFT_REASONS and not case.idempotency_key:
        return CaseKind.ENVIRONMENT_DRIFT
    return CaseKind.OTHER


def earlier_key(case: ReviewCase) -> str:
    """The key of the earlier attempt a replay case names in its evidence ('' if none)."""
    for item in case.evidence:
        key = item.get("earlier_idempotency_key") if isinstance(item, dict) else None
        if isinstance(key, str) and key:
            return key
    return ""


def ways_out(kind: CaseKind) -> str:
    """What a person reads about the decisions a case of ``kind`` takes."""
    return _WAYS[kind]


def needs_evidence(kind: CaseKind, decision: ReviewDecision) -> bool:
    """Whether ``decision`` on a case of ``kind`` must carry what the reviewer found."""
    return TABLE[kind].get(decision) in NEEDS_EVIDENCE


#: The order a person is offered decisions in: settling what is known first, giving up last.
_OFFERED = (_D.LANDED, _D.NOT_LANDED, _D.COMPENSATE, _D.ACCEPT, _D.REPLAN, _D.ABORT)


def fitting(kind: CaseKind) -> tuple[ReviewDecision, ...]:
    """The decisions a case of ``kind`` takes, in the order a person is offered them."""
    return tuple(d for d in _OFFERED if d in TABLE[kind])


#: The label of the hint a freeze records where a look-up by key that finds nothing
#: proves nothing (its text says why); the case card warns on it.
KEY_LOOKUP_HINT = "key look-up"
#: The label of the hint a freeze records where the adapter declares a retention: when
#: the service forgets the key, about (by the runtime's clock at the send).
KEY_KEPT_HINT = "key kept until"


def key_doubt(hints: dict[str, str], now: datetime | None) -> str:
    """Why a look-up by the case's key may prove nothing when shown at ``now`` ('' if it can).

    From the freeze's hints: :data:`KEY_LOOKUP_HINT` always; :data:`KEY_KEPT_HINT`
    once ``now`` is within the tolerated skew of it (``None``: the reader has no
    clock, and is warned). The not_landed check decides on both clocks
    (``tether.core._retention``); the card errs towards the warning.
    """
    told = hints.get(KEY_LOOKUP_HINT, "")
    if told:
        return told
    kept = hints.get(KEY_KEPT_HINT)
    if kept is None:
        return ""
    try:
        until = parse_time_text(kept)
    except ValueError:
        until = None
    if now is None or until is None or now >= until - timedelta(seconds=UNMEASURED_SKEW_S):
        return f"the service may have forgotten the key: it keeps keys until about {kept}"
    return ""


def not_landed_warning(kind: CaseKind, protected: bool | None, key_doubt: str = "") -> str:
    """What a person reads before signing ``not_landed`` where tether cannot check it ('' if none).

    Before a ``not_landed`` is consumed the runtime asks the adapter by key,
    and refuses it while the write landed or is still in flight
    (``tether.core._case_rules.check_not_landed``). ``protected``: that
    check can be made (the adapter can be asked by key), or a resend is
    deduplicated by the callee anyway; ``None``: the ledger read did not
    say, so the person is warned. ``key_doubt``: the freeze's
    :data:`KEY_LOOKUP_HINT` (why a look-up by key may prove nothing): the
    person must look for the effect itself, and say what they searched.
    """
    if ReviewDecision.NOT_LANDED not in TABLE[kind]:
        return ""
    if key_doubt:
        return (
            f"a look-up by this key may prove nothing ({key_doubt}): a service that answers "
            "'not found' for the key has not shown that the write never landed. Look for the "
            "effect itself in the system it called (what it made, by its content: a ticket "
            "by its title, a message by its subject), not for the key; where tether cannot "
            "confirm the absence, not_landed is refused unless its evidence says what you "
            "searched (--evidence)"
        )
    if protected:
        return ""
    return (
        "tether cannot ask this write's adapter by its key whether it landed or is still in "
        "flight: the request may still be being carried out. If the service could still be "
        "working on it, wait until it has finished and look again before signing not_landed; "
        "a resend while it is in flight could be a second effect"
    )


def settlement(case: ReviewCase, state: RunState, decision: ReviewDecision | str) -> Settlement:
    """What ``decision`` does to ``case``; a decision that does not fit is refused.

    Raises :class:`~tether.core.DecisionRefusedError` (the case stays frozen),
    naming the decisions that fit.
    """
    try:
        chosen = ReviewDecision(decision)
    except ValueError:
        chosen = None
    kind = case_kind(case, state)
    row = TABLE[kind]
    if chosen is None or chosen not in row:
        fits = tuple(d.value for d in fitting(kind))
        raise DecisionRefusedError(
            f"case {case.case_id} ({case.reason}) does not take {decision!r}: {_WAYS[kind]}",
            case_id=case.case_id,
            reason=case.reason,
            decision=str(decision),
            fits=fits,
        )
    return row[chosen]
