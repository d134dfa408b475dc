"""What one protocol step returns: a transition value, and the outcome a caller reads.

A :class:`Transition` says everything the session must do, in order:
commit ``state`` (with ``events`` in the trace and ``ledger`` notes in the
effect ledger, all in ONE fenced store transaction) when ``state`` is set,
then make ``call`` (at most one adapter call) when it is set, and hand the
answer to the next pure function. Its ``durability`` says when that commit
must be durable: before anything else (the default), or with the run's next
commit (:class:`Durability`). The session holds no rule of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from tether.core._actions import Rejection
from tether.core._ledger import EffectTerms, LedgerEntry
from tether.core._model import Capabilities, EnvironmentState, Intent, Receipt
from tether.core._phases import EffectStatus
from tether.core._state import RunState
from tether.core._terms import SentTerms

Event = tuple[str, dict[str, Any]]


class Durability(StrEnum):
    """When a transition's commit must be durable. Defined here and nowhere else.

    ``deferred``: the commit may ride on the run's next one (the next intent,
    the next checkpoint of any kind), sealed now and written then, in that
    commit's one transaction. A crash before it leaves the signed state one
    step behind, a write still ``dispatched``, which recovery settles by asking
    the adapter by key: the "effect sent, receipt not persisted" window, no
    new one. Only a receipt is deferred this way, and only where the adapter
    can settle that window (``tether.core.settle_rules.receipt_durability``);
    and a read's observation, which a crash may drop with nothing to settle
    (``observation_durability`` in ``_steps``).
    """

    NOW = "now"  # durable before anything else happens
    DEFERRED = "deferred"  # sealed now, written with the run's next commit


class OutcomeKind(StrEnum):
    """What a step did, in one word. Defined here and nowhere else."""

    EXECUTED = "executed"  # a write was sent and its receipt recorded
    REPLAYED = "replayed"  # a write found already committed; its receipt reused, nothing sent
    REJECTED = "rejected"  # the gate or the adapter refused; nothing happened
    WAITING_FOR_APPROVAL = "waiting_for_approval"  # a person must sign first
    FROZEN = "frozen"  # needs_review: only a signed decision opens it
    FINISHED = "finished"  # completed, with a passing verifier at the final state
    FAILED = "failed"
    CANCELLED = "cancelled"
    WAITED = "waited"  # the agent asked for nothing this step
    VERIFIER_FAILED = "verifier_failed"  # the agent said finished; the verifier disagreed
    IN_FLIGHT = "in_flight"  # the adapter says an earlier attempt is still running
    RETRY_LATER = "retry_later"  # the adapter could not be reached; nothing changed
    RECORDED = "recorded"  # evidence (an approval, a decision) was recorded
    RECOVERED = "recovered"  # a new epoch began
    OBSERVED = "observed"  # a read or a test run was carried out; its answer is the next result


@dataclass(frozen=True, slots=True)
class Outcome:
    """A step's typed result: its kind, a stable reason word, and the trace event it produced.

    ``event`` is the kind of the last trace event the step committed (``None``
    when it committed nothing); ``state`` is the run state after the step.
    """

    kind: OutcomeKind
    state: RunState
    reason: str | None = None
    message: str = ""
    event: str | None = None
    #: The ledger entry of the write this step committed (its receipt as the
    #: ledger records it), when it committed one.
    committed: LedgerEntry | None = None
    #: The action the outcome answers, when it is not the one the caller proposed
    #: (an approved held action carried out by the step; see ``RunSession.act``).
    action_id: str | None = None

    @property
    def phase(self) -> Any:
        """The run's phase after the step (shorthand for ``outcome.state.phase``)."""
        return self.state.phase


@dataclass(frozen=True, slots=True)
class Lookup:
    """Ask the adapter what it recorded under ``key`` (judged against ``intent``, if it can)."""

    key: str
    intent: Intent | None = None


@dataclass(frozen=True, slots=True)
class Execute:
    """Send ``intent`` under ``key``. ``retry``: an earlier attempt may have landed.

    ``known_absent``: the adapter's final look-up just found nothing, so a
    receipt this send returns is a fresh commit (a refusal is still a retry's:
    an adapter that lost a receipt would otherwise hide a landed write).
    """

    key: str
    intent: Intent
    prestate: EnvironmentState
    retry: bool
    known_absent: bool = False


@dataclass(frozen=True, slots=True)
class ReadEnvironment:
    """Read the adapter's environment now, then decide again with it as :attr:`Facts.live`.

    A rule given no environment (``Facts.live`` is ``None``) asks for it,
    committing nothing, only where the world as it is now decides the step:
    a freeze records it in its review case (a person's decision is bound to
    it), and an approval is judged against it before a send. Every other
    step is decided without reading it.
    """


Call = Lookup | Execute | ReadEnvironment


@dataclass(frozen=True, slots=True)
class LedgerNote:
    """A ledger status for the pending write's key, sealed into the chain at commit.

    It belongs to the write pending BEFORE the transition, even when the
    state it commits holds no pending write any more, unless ``subject``
    names another effect.
    """

    status: EffectStatus
    receipt: dict[str, Any] | None = None
    #: Set only on a note about another effect than the pending write: the
    #: ``compensated`` a compensation's commit records for the effect it undid.
    subject: EffectRef | None = None


@dataclass(frozen=True, slots=True)
class EffectRef:
    """An effect already in the ledger, named by a note about it (see ``LedgerNote.subject``).

    ``status`` is its last ledger status, as verified when the note was decided.
    """

    idempotency_key: str
    action_id: str
    intent_digest: str
    status: EffectStatus
    #: What the effect is (its own terms, from its first ledger entry): the
    #: note's entry records them, so the replay rule knows which effect moved.
    terms: EffectTerms | None = None


@dataclass(frozen=True, slots=True)
class Transition:
    """One protocol step's whole effect on the world, as a value."""

    outcome: OutcomeKind
    state: RunState | None = None  # None: nothing to commit
    events: tuple[Event, ...] = ()
    ledger: tuple[LedgerNote, ...] = ()
    call: Call | None = None
    reason: str | None = None
    message: str = ""
    #: Content-addressed bytes the commit stores with ``state`` (a step's results).
    blobs: tuple[tuple[str, bytes], ...] = ()
    #: When the commit of ``state`` must be durable (see :class:`Durability`).
    durability: Durability = Durability.NOW

    @property
    def durable(self) -> bool:
        """Whether this step needs a store commit before anything else happens.

        A deferred one (:class:`Durability`) commits too, but with the run's next commit.
        """
        return self.state is not None and self.durability is Durability.NOW


class LookupStatus(StrEnum):
    """What an adapter's look-up by key can say."""

    COMMITTED = "committed"
    ABSENT = "absent"
    IN_PROGRESS = "in_progress"
    UNAVAILABLE = "unavailable"
    #: The adapter recorded this request under the key and refused it: nothing landed.
    REFUSED = "refused"
    #: The adapter answered, but nothing in its answer proves a receipt or an absence
    #: (see :class:`~tether.core.LookupInconclusiveError`): the outcome is unknown.
    INCONCLUSIVE = "inconclusive"


@dataclass(frozen=True, slots=True)
class LookupAnswer:
    """The adapter's answer to :class:`Lookup` (``receipt`` when committed)."""

    status: LookupStatus
    receipt: Receipt | None = None
    detail: str = ""


class ExecuteStatus(StrEnum):
    """What an adapter's execute can end in."""

    COMMITTED = "committed"
    CONFLICT = "conflict"  # same key, another intent: the adapter's receipt is evidence
    PRECONDITION_FAILED = "precondition_failed"
    UNAVAILABLE = "unavailable"
    IN_PROGRESS = "in_progress"


@dataclass(frozen=True, slots=True)
class ExecuteAnswer:
    """The adapter's answer to :class:`Execute`."""

    status: ExecuteStatus
    receipt: Receipt | None = None
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Facts:
    """What the session knows right now that a pure step may need.

    ``case_id`` is minted by the session in advance and used only if the step
    opens a review case; ``live`` is the adapter's environment as read now,
    or ``None`` when it was not read (a rule that needs it asks for it:
    :class:`ReadEnvironment`). ``forbidden``: why the policy in force
    forbids the pending write (:func:`tether.core.policy_rules.held_problem`),
    so it is never sent.
    """

    now: datetime
    live: EnvironmentState | None
    needs_approval: bool
    case_id: str
    capabilities: Capabilities
    namespace: str
    forbidden: Rejection | None = None
    #: The version of the policy in force now: an approval signed under another is none.
    policy_version: str | None = None
    #: Where a person would look for the pending write (the adapter's labelled
    #: hints), read with ``live``: a freeze records it in its case.
    hint: dict[str, str] | None = None
    #: What the callee promised when the pending write was sent (the ledger's
    #: record of its sends); a dispatched write is settled under the weaker of
    #: these and ``capabilities`` (:mod:`tether.core._terms`). ``None``: not
    #: recorded (or nothing was sent yet), ``capabilities`` alone decide.
    sent_under: SentTerms | None = None
    #: The pending write's key's age in seconds by the STORE's clock (its now, less
    #: when it recorded the key's first ledger row), read after any look-up; ``None``:
    #: not read, or the store could not say (then a skew margin is charged instead:
    #: :mod:`tether.core._retention`). Only the retention rule reads it.
    key_age_s: float | None = None
