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
