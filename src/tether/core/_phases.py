"""Phases, effect statuses and the one table of legal moves for each."""

from __future__ import annotations

from enum import StrEnum

from tether.core._errors import IllegalTransitionError


class Phase(StrEnum):
    """Where a run is. Defined here and nowhere else."""

    RUNNING = "running"
    PENDING = "pending"
    NEEDS_REVIEW = "needs_review"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in _TERMINAL


_TERMINAL = frozenset({Phase.COMPLETED, Phase.FAILED, Phase.CANCELLED})

_PHASE_MOVES: dict[Phase, frozenset[Phase]] = {
    # running -> running is an ordinary step that advances the checkpoint;
    # running -> needs_review: a worker parks a run it cannot drive.
    Phase.RUNNING: frozenset(
        {
            Phase.RUNNING,
            Phase.PENDING,
            Phase.NEEDS_REVIEW,
            Phase.COMPLETED,
            Phase.FAILED,
            Phase.CANCELLED,
        }
    ),
    # pending -> pending: the intent is durable and the effect is still unsettled
    # (dispatched, or waiting for an approval). pending -> completed: a finish
    # that waited for an approval ran the verifier, and it passed.
    Phase.PENDING: frozenset(
        {
            Phase.PENDING,
            Phase.RUNNING,
            Phase.NEEDS_REVIEW,
            Phase.COMPLETED,
            Phase.FAILED,
            Phase.CANCELLED,
        }
    ),
    # Only a trusted, signed decision leaves needs_review (replan or abort).
    Phase.NEEDS_REVIEW: frozenset({Phase.NEEDS_REVIEW, Phase.RUNNING, Phase.FAILED}),
    Phase.COMPLETED: frozenset(),
    Phase.FAILED: frozenset(),
    Phase.CANCELLED: frozenset(),
}


def check_phase_move(current: Phase, new: Phase) -> None:
    """Raise :class:`IllegalTransitionError` unless ``current -> new`` is in the table."""
    if new not in _PHASE_MOVES[current]:
        raise IllegalTransitionError(f"phase {current} cannot move to {new}")


class EffectStatus(StrEnum):
    """What the effect ledger knows about one external write."""

    INTENDED = "intended"
    DISPATCHED = "dispatched"
    COMMITTED = "committed"
    OUTCOME_UNKNOWN = "outcome_unknown"
    REJECTED = "rejected"
    COMPENSATED = "compensated"
    # The run was cancelled before the write was ever sent (the signed state
    # said intended): it never landed and never will.
    CANCELLED = "cancelled"


_EFFECT_MOVES: dict[EffectStatus | None, frozenset[EffectStatus]] = {
    None: frozenset({EffectStatus.INTENDED}),
    # Re-dispatch after a crash reuses the same key: dispatched -> dispatched.
    EffectStatus.INTENDED: frozenset(
        {
            EffectStatus.DISPATCHED,
            EffectStatus.COMMITTED,
            EffectStatus.REJECTED,
            EffectStatus.CANCELLED,
        }
    ),
    EffectStatus.DISPATCHED: frozenset(
        {
            EffectStatus.DISPATCHED,
            EffectStatus.COMMITTED,
            EffectStatus.OUTCOME_UNKNOWN,
            EffectStatus.REJECTED,
            EffectStatus.CANCELLED,
        }
    ),
    # A retry with the same key after an uncertain outcome (queryable or
    # idempotent adapters only; the runtime freezes the others) is re-dispatched.
    EffectStatus.OUTCOME_UNKNOWN: frozenset(
        {
            EffectStatus.DISPATCHED,
            EffectStatus.COMMITTED,
            EffectStatus.REJECTED,
            EffectStatus.OUTCOME_UNKNOWN,
        }
    ),
    EffectStatus.COMMITTED: frozenset({EffectStatus.COMPENSATED}),
    EffectStatus.REJECTED: frozenset(),
    EffectStatus.COMPENSATED: frozenset(),
    EffectStatus.CANCELLED: frozenset(),
}


class RetrySemantics(StrEnum):
    """What retrying an effect under its key can promise, as the adapter declares it.

    ``idempotent``: a second send under the key is no second effect.
    ``queryable``: the adapter can be asked by key whether it landed (no
    resend without asking). ``neither``: an uncertain send is settled only by
    a person.
    """

    IDEMPOTENT = "idempotent"
    QUERYABLE = "queryable"
    NEITHER = "neither"


class Compensation(StrEnum):
    """How a committed effect can be undone, as its kind declares it.

    ``none``: it cannot be (or nobody said how). ``adapter``: by an action
    the adapter carries out. ``human``: only a person can (an apology for a
    sent email, a refund by hand).
    """

    NONE = "none"
    ADAPTER = "adapter"
    HUMAN = "human"


def check_effect_move(current: EffectStatus | None, new: EffectStatus) -> None:
    """Raise :class:`IllegalTransitionError` unless the ledger may record ``new`` next."""
    if new not in _EFFECT_MOVES[current]:
        raise IllegalTransitionError(f"effect status {current} cannot move to {new}")


class ReviewReason(StrEnum):
    """Why a run was frozen for a person: each review case names one (defined once, here)."""

    #: A write may have landed and nothing authoritative can say (a blind send, a
    #: look-up whose "absent" proves nothing, a key past retention, stuck in flight).
    OUTCOME_UNKNOWN = "outcome_unknown"
    #: The adapter holds our key for another intent digest.
    KEY_CONFLICT = "key_conflict"
    #: A receipt for our key and intent, but another namespace or post-state.
    RECEIPT_MISMATCH = "receipt_mismatch"
    #: The write committed outside the approval that allowed it.
    APPROVAL_BOUNDARY = "approval_boundary"
    #: A cancel reached a write that may have been sent.
    CANCEL_OUTCOME_UNKNOWN = "cancel_outcome_unknown"
    #: A re-proposed effect whose earlier attempt has an unknown outcome.
    REPLAY_OF_UNKNOWN = "replay_of_unknown_effect"
    #: A re-proposed effect the ledger records committed, and the adapter holds no receipt for.
    RECEIPT_MISSING = "receipt_missing"
    #: A re-proposed effect whose receipt at the adapter differs from the ledger's copy.
    RECEIPT_DRIFT = "receipt_drift"
    #: The environment changed outside the run while it was down.
    ENVIRONMENT_DRIFT = "environment_drift"
    #: The environment is ahead of the checkpoint (a restored store, say).
    ENVIRONMENT_AHEAD = "environment_ahead"
    #: A worker could not drive the run, again and again.
    WORKER_ERROR = "worker_error"
    #: A rewind could not restore the workspace it was admitted to restore.
    REWIND_FAILED = "rewind_failed"
