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
    # Only a trusted, signed decision leaves needs_review: replan, accept or a
    # person's "it landed" go on (running); "it did not land" sends the write
    # once more, and "compensate" orders its undo (pending); abort fails the
    # run; a case a cancel opened ends cancelled once a person settles the write.
    Phase.NEEDS_REVIEW: frozenset(
        {Phase.NEEDS_REVIEW, Phase.RUNNING, Phase.PENDING, Phase.FAILED, Phase.CANCELLED}
    ),
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
    # idempotent adapters, or a reviewer's signed "it did not land") is
    # re-dispatched; a reviewer's "it landed" records it committed; a
    # reviewer's "it did not land" on a run a cancel froze records it
    # cancelled: it never landed and never will be sent.
    EffectStatus.OUTCOME_UNKNOWN: frozenset(
        {
            EffectStatus.DISPATCHED,
            EffectStatus.COMMITTED,
            EffectStatus.REJECTED,
            EffectStatus.OUTCOME_UNKNOWN,
            EffectStatus.CANCELLED,
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
    #: A re-proposed effect, committed before, whose target another effect wrote since
    #: (A, B, A), on a target not declared a state or a collection: a revert or a duplicate;
    #: or, on any target but a collection, one another effect was sent to with an outcome
    #: nobody knows (A, B?, A).
    REPEAT_OR_REVERT = "repeat_or_revert"
    #: The environment changed outside the run while it was down.
    ENVIRONMENT_DRIFT = "environment_drift"
    #: The environment is ahead of the checkpoint (a restored store, say).
    ENVIRONMENT_AHEAD = "environment_ahead"
    #: A worker could not drive the run, again and again.
    WORKER_ERROR = "worker_error"
    #: A rewind could not restore the workspace it was admitted to restore.
    REWIND_FAILED = "rewind_failed"


class OutcomeReason(StrEnum):
    """Why a step ended as it did, in one stable word (defined once, here).

    A frozen step's reason is its review case's (:class:`ReviewReason`); every
    other reason tether gives an outcome, a trace's ending or an agent's
    result is one of these. The two share no word. An adapter that refuses a
    proposal (``ContractViolationError``) may name its own.
    """

    # -- the adapter has not settled it yet ---------------------------------
    #: An earlier attempt under the key is still running at the adapter.
    IN_FLIGHT = "in_flight"
    #: The adapter could not be reached; nothing changed.
    ADAPTER_UNAVAILABLE = "adapter_unavailable"

    # -- approvals --------------------------------------------------------------
    #: The policy needs a person's signed approval, and none is on record.
    APPROVAL_REQUIRED = "approval_required"
    #: The approval on record ran out.
    APPROVAL_EXPIRED = "approval_expired"
    #: The environment moved since the approval was signed.
    APPROVAL_STALE = "approval_stale"
    #: The approval was signed under another policy version than the one in force.
    APPROVAL_POLICY_CHANGED = "approval_policy_changed"

    # -- the replay rule (what it said of a re-proposed effect) ---------------
    #: Nothing the ledger records: a new effect.
    NEW_EFFECT = "new_effect"
    #: A stateful target no longer holds what the recorded write left: a new effect.
    TARGET_MOVED = "target_moved"
    #: The adapter proves the earlier attempt never landed.
    NEVER_LANDED = "never_landed"
    #: A signed fork let the effect happen once more.
    FORK_USED = "fork_used"
    #: It happened already: the recorded receipt answers, nothing is sent.
    EFFECT_REPLAYED = "effect_replayed"
    #: An approved replay whose effect no longer stands (the world moved while it waited).
    REPLAY_OUTDATED = "replay_outdated"

    # -- a pending write the adapter refused ----------------------------------
    #: The adapter recorded that it refused this very request: nothing landed.
    REFUSED = "refused"
    #: The write's precondition failed on its first send: nothing landed.
    PRECONDITION_FAILED = "precondition_failed"
    #: The adapter refused to carry out a read or a test run (an adapter error).
    ADAPTER_REFUSED = "adapter_refused"

    # -- people -------------------------------------------------------------------
    APPROVAL_RECORDED = "approval_recorded"
    FORK_RECORDED = "fork_recorded"
    #: A reviewer accepted a drifted environment as observed.
    ACCEPTED = "accepted"
    #: A reviewer decided replan: the run plans again from the world as it is.
    REPLANNED = "replanned"
    #: A reviewer decided abort: the run failed.
    ABORTED_BY_REVIEW = "aborted_by_review"
    #: A reviewer found that a write whose outcome was unknown landed: recorded committed.
    LANDED_BY_REVIEW = "landed_by_review"
    #: A reviewer found that a write whose outcome was unknown did not land: sent once more.
    RESEND_BY_REVIEW = "resend_by_review"
    #: A signed document the run would not accept (traced, the inbox moved past it).
    EVIDENCE_REFUSED = "evidence_refused"
    #: The world moved under an open review case: it was replaced by one recording it now.
    REVIEW_CASE_REFRESHED = "review_case_refreshed"
    #: The inbox admission that opened this epoch was read.
    ADMISSION_READ = "admission_read"
    #: A reviewer accepted an effect as it stands.
    EFFECT_ACCEPTED = "effect_accepted"
    #: A reviewer ordered an effect compensated: the compensation is pending.
    COMPENSATION_ORDERED = "compensation_ordered"
    #: A rewind restored context and workspace together.
    REWOUND = "rewound"

    # -- endings and the verifier ---------------------------------------------
    CANCELLED = "cancelled"
    #: Completed: the task's verifier passed at the final state.
    VERIFIED = "verified"
    #: Completed on the agent's word: the task names no verifier.
    FINISHED_UNVERIFIED = "finished_unverified"
    VERIFIER_FAILED = "verifier_failed"
    #: The verifier judged another state than the run's (the world moved under it).
    VERIFIER_JUDGED_OTHER_STATE = "verifier_judged_other_state"
    EXHAUSTED_STEPS = "budget_exhausted:steps"
    EXHAUSTED_PROPOSALS = "budget_exhausted:proposals"
    EXHAUSTED_COST = "budget_exhausted:cost"
    EXHAUSTED_WALL_TIME = "budget_exhausted:wall_time"
    EXHAUSTED_DEADLINE = "budget_exhausted:deadline"

    # -- the gate's refusals of a proposal ------------------------------------
    PENDING_EXISTS = "pending_exists"
    EMBEDDED_APPROVAL = "embedded_approval"
    MISSING_ARGUMENT = "missing_argument"
    UNKNOWN_ARGUMENT = "unknown_argument"
    AGENT_KEY = "agent_key"
    RISK_MISMATCH = "risk_mismatch"
    DEADLINE = "deadline"
    DUPLICATE_ACTION = "duplicate_action"
    UNKNOWN_KIND = "unknown_kind"
    SCOPE_KIND = "scope_kind"
    SCOPE_TARGET = "scope_target"
    TEST_TARGET = "test_target"
    NO_RULE = "no_rule"
    PERMISSION = "permission"
    RISK = "risk"
    BUDGET_COST = "budget_cost"
    MISSING_VERSION = "missing_version"
    STALE_VERSION = "stale_version"
    SCHEMA = "schema"

    # -- the effects API ------------------------------------------------------
    #: The call's own action did not run: earlier work was settled first.
    SETTLED_EARLIER_WORK = "settled_earlier_work"
