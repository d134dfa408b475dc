"""Replay or fork: a re-proposed effect equal to one already made is not made again.

An agent restored after a crash regenerates its action ids and rewrites its
prose, so neither the action id nor the idempotency key (minted per
proposal) can recognise a second attempt at the same effect. The *effect
digest* can: the digest of ``{namespace, kind, target, identity}``, where
``identity`` is what the adapter says makes the effect (its
``effect_identity`` hook; by default the normalized arguments). Every
ledger entry records it under its hash, so the set of effects a run has
made is read from the verified ledger and survives recovery and rewind.

The rule is :func:`judge`, one function of values (:class:`ReplayFacts`),
with :func:`lookup_key` saying whom the session must ask first. The
adapter's receipt is the authority and the ledger a copy; so:

=================================================  =============================
what is known of the effect digest                 verdict
=================================================  =============================
a signed fork is armed for it                      forked: a new effect, once
nothing                                            proceed: a new effect
an unsettled attempt (dispatched, outcome          asked by its key:
unknown):
  committed, this attempt's key and intent         replay (settled by look-up), but
                                                   as below where the target moved
  committed under the key, another intent          review (``key_conflict``):
                                                   never an answer for ours, nor
                                                   proof it did not land; going
                                                   on takes a signed fork
  refused (recorded as refused)                    proceed: it never landed
  absent, final, the key within retention          proceed: it never landed
  (its age on the store's clock and the runtime's)
  absent otherwise, or not queryable               review (``replay_of_unknown_
                                                   effect``): never sent again
  in flight, unreachable                           wait
a commit, on a stateful target that no longer      proceed: a new effect (A, B,
holds what it left (writing now changes it)        A writes A again)
a commit, on a tracked target the adapter          wait (nothing is sent while
could not read                                     it cannot tell)
a commit, on a target the adapter cannot read,     as its declared ``targets``:
another effect committed on it since (A, B, A):
  ``state`` (each write replaces it)               proceed: a new effect (A again)
  ``collection`` (each effect its own object)      as below: the first, replayed
  ``unknown`` (not declared)                       review (``repeat_or_revert``):
                                                   a revert or a duplicate, a
                                                   person says (fork, or abort)
a commit, on a target the adapter cannot read,     as its declared ``targets``:
another effect sent to it since, its outcome not
known (A, B?, A: it may have landed, or land yet):
  ``state``                                        review (``repeat_or_revert``):
                                                   a replay may answer for B's
                                                   value, a send may be
                                                   overwritten by B landing late
  ``collection``                                   as below: the first, replayed
  ``unknown``                                      review (``repeat_or_revert``)
a commit, the adapter cannot be asked              replay (settled by the
                                                   signed ledger, said so)
a commit a person found landed (a signed           replay (settled by the
``landed``)                                        review, said so)
a commit, asked by its key:
  the same receipt, every field                    replay (settled by adapter)
  another receipt, or another intent's             review (``receipt_drift``)
  absent, or refused                               review (``receipt_missing``):
                                                   absence is never proof of a
                                                   commit, nor a licence to send
  in flight, unreachable                           wait
=================================================  =============================

A replay of a kind the policy gates needs an approval, like the write
itself (the seed: "same-key/same-intent replay ... still needs new approval
where policy requires it"): the proposal waits for one (:attr:`Verdict.HOLD`)
and is answered once it holds. A replay is a proposal: it is charged, and
the last one the budget allows ends the run.

Doing an effect again on purpose takes a signed fork (:func:`tether.core._forks.check_fork`):
a reviewer's or operator's document naming the effect digest and the
earlier receipt (id, fingerprint, key), alive now, with a one-time nonce the
checkpoint remembers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from enum import StrEnum
from typing import Any

from tether.core import _budgets as budgets_rules
from tether.core import _steps as steps
from tether.core import _terms as terms_rules
from tether.core._actions import ActionResult, Proposal
from tether.core._canonical import JSONValue, digest
from tether.core._case_table import REVIEW_NAMESPACE
from tether.core._ledger import LedgerEntry, redact_receipt
from tether.core._model import (
    Capabilities,
    EnvironmentState,
    Intent,
    Receipt,
    Targets,
    format_time,
)
from tether.core._phases import EffectStatus, OutcomeReason, ReviewReason
from tether.core._results import with_result
from tether.core._retention import remembered
from tether.core._spec import Budgets
from tether.core._state import RunState
from tether.core._steps import park
from tether.core._terms import SentTerms
from tether.core._transition import (
    EffectRef,
    Event,
    LedgerNote,
    LookupAnswer,
    LookupStatus,
    OutcomeKind,
    Transition,
)


def effect_digest(namespace: str, kind: str, target: str, identity: Mapping[str, Any]) -> str:
    """The digest two proposals share exactly when they are the same effect."""
    return digest(
        {"namespace": namespace, "kind": kind, "target": target, "identity": dict(identity)}
    )


@dataclass(frozen=True, slots=True)
class KnownEffect:
    """One attempt at an effect the ledger records under a digest: its key, and its receipt."""

    effect_digest: str
    action_id: str
    idempotency_key: str
    intent_digest: str
    #: The receipt as the ledger holds it (a sensitive kind's result as a digest);
    #: ``None`` while the outcome is unknown.
    receipt: dict[str, Any] | None
    #: When the attempt was first dispatched (by the ledger): the adapter cannot
    #: have heard of the key before, so its memory of it is at most this old.
    sent_at: datetime | None = None
    #: The attempt's last ledger status.
    status: EffectStatus = EffectStatus.COMMITTED
    #: What the callee promised when the attempt was sent (every send of its
    #: key: :func:`tether.core._terms.weaker`); ``None``: not recorded.
    sent_under: SentTerms | None = None

    @property
    def receipt_id(self) -> str | None:
        return None if self.receipt is None else str(self.receipt.get("receipt_id"))

    @property
    def receipt_fingerprint(self) -> str | None:
        return None if self.receipt is None else digest(self.receipt)


@dataclass(frozen=True, slots=True)
class EffectHistory:
    """What the ledger says of one effect digest: the last commit, and an unsettled attempt."""

    committed: KnownEffect | None = None
    #: Dispatched or outcome unknown, and never settled (it may have landed).
    unsettled: KnownEffect | None = None

    @property
    def current(self) -> KnownEffect | None:
        """The attempt a re-proposal is judged by: an unsettled one first."""
        return self.unsettled if self.unsettled is not None else self.committed


def known_effects(
    entries: Iterable[LedgerEntry], known: Mapping[str, EffectHistory] | None = None
) -> dict[str, EffectHistory]:
    """The records ``entries`` (oldest first) change, starting from ``known``.

    Only the changed digests are returned, so a session folding in one
    commit's entries does work in proportion to them, not to the history.
    Entries without an effect digest (written before it existed) match nothing.
    """
    base = known if known is not None else {}
    changed: dict[str, EffectHistory] = {}
    for entry in entries:
        terms = entry.terms
        effect = None if terms is None else terms.effect
        if effect is None:
            continue
        record = changed.get(effect) or base.get(effect) or EffectHistory()
        key = entry.idempotency_key
        unsettled = record.unsettled
        mine = unsettled is not None and unsettled.idempotency_key == key
        sent_at = unsettled.sent_at if mine and unsettled is not None else entry.at
        status = entry.status
        sent_under = unsettled.sent_under if mine and unsettled is not None else None
        if status is EffectStatus.DISPATCHED and terms is not None:
            sent = terms_rules.sent_terms(
                terms.retry, queryable=terms.queryable, absent_is_final=terms.absent_is_final
            )
            sent_under = sent if sent_under is None else terms_rules.weaker(sent_under, sent)
        this = KnownEffect(
            effect,
            entry.action_id,
            key,
            entry.intent_digest,
            entry.receipt,
            sent_at,
            status,
            sent_under,
        )
        if status is EffectStatus.COMMITTED:
            record = EffectHistory(this, None if mine else unsettled)
        elif status in {EffectStatus.DISPATCHED, EffectStatus.OUTCOME_UNKNOWN}:
            record = EffectHistory(record.committed, this)
        elif status in {EffectStatus.REJECTED, EffectStatus.CANCELLED}:
            record = EffectHistory(record.committed, None if mine else unsettled)
        elif status is EffectStatus.COMPENSATED:
            # Undone: doing it again is not a duplicate of anything standing.
            committed = record.committed
            gone = committed is not None and committed.idempotency_key == key
            record = EffectHistory(None if gone else committed, unsettled)
        else:  # intended: nothing left the process yet
            continue
        changed[effect] = record
    return changed


class Overwrite(StrEnum):
    """What the ledger says came onto a target, from other effects, since an effect's last attempt.

    Read where the adapter cannot read the target (:func:`since_on_target`):
    the newest attempt on the target that may have landed decides.
    """

    NO = "no"  # nothing since (or nothing asked: a tracked target, a collection)
    YES = "yes"  # another effect committed on it since: A, B, A
    MAYBE = "maybe"  # another effect sent to it since, its outcome unknown: it may land yet


#: Attempts the ledger knows never landed: refused, cancelled before the send, never sent.
_NEVER_LANDED = frozenset({EffectStatus.REJECTED, EffectStatus.CANCELLED, EffectStatus.INTENDED})
#: Attempts that landed (a compensation undid one, but it was on the target in between).
_LANDED = frozenset({EffectStatus.COMMITTED, EffectStatus.COMPENSATED})


def since_on_target(
    rows: Iterable[tuple[str, str, EffectStatus]], effect: str, seen: set[str]
) -> Overwrite | None:
    """What came onto a target since ``effect``'s last attempt that may have landed there.

    ``rows``: the target's ledger rows as (key, effect digest, status), newest
    first; a key's newest row is its status now, so its older rows are passed
    over (``seen`` holds the keys met so far, kept across pages). The newest
    attempt that is not known to have missed decides: ``effect``'s own
    (:attr:`Overwrite.NO`), another effect's commit (:attr:`Overwrite.YES`),
    or another effect's attempt whose outcome nobody knows, dispatched or
    unknown, set aside by a replan or not (:attr:`Overwrite.MAYBE`: it may
    have landed after ``effect``'s, or may land yet). ``None``: these rows do
    not decide (older rows may; none left means :attr:`Overwrite.NO`).
    """
    for key, other, status in rows:
        if key in seen:
            continue
        seen.add(key)
        if status in _NEVER_LANDED:
            continue
        if other == effect:
            return Overwrite.NO
        return Overwrite.YES if status in _LANDED else Overwrite.MAYBE
    return None


class Verdict(StrEnum):
    """What the replay rule says of a re-proposed effect."""

    PROCEED = "proceed"  # a new effect: carry the proposal out
    FORKED = "forked"  # a signed fork asked for it again: carry it out, the fork consumed
    REPLAY = "replay"  # it happened: answer with the recorded receipt, send nothing
    HOLD = "hold"  # it happened, and the policy wants the replay approved first
    WAIT = "wait"  # an earlier attempt is not settled yet: nothing moves
    REVIEW = "review"  # nothing can decide it safely: a person does


@dataclass(frozen=True, slots=True)
class ReplayFacts:
    """Everything :func:`judge` reads, as values.

    ``target_moved``: where the adapter tracks targets (a stateful
    environment, or a declared ``target_state``), carrying the proposal out
    now would change its target (it does not hold what the write leaves);
    ``None``: the adapter was asked and could not tell. ``answer``: the adapter's look-up by :func:`lookup_key`'s key.
    ``overwritten``: what the ledger says came onto the same target
    (namespace, kind, target) from other effects since this effect's last
    attempt, read where the adapter cannot read the target (see
    :attr:`Capabilities.targets` and :func:`since_on_target`): another
    effect committed (:attr:`Overwrite.YES`), or sent with an outcome nobody
    knows (:attr:`Overwrite.MAYBE`), after the known commit or (an unsettled
    attempt) after a send that may have landed before or after it.
    ``approved``: an approval of exactly this replay holds. ``sensitive``: the policy marks the
    kind sensitive.
    """

    record: EffectHistory | None
    capabilities: Capabilities
    now: datetime
    forked: bool = False
    target_moved: bool | None = False
    overwritten: Overwrite = Overwrite.NO
    answer: LookupAnswer | None = None
    needs_approval: bool = False
    approved: bool = False
    #: The policy marks the kind sensitive: the ledger and the agent see its result's digest only.
    sensitive: bool = False
    #: The unsettled attempt's key's age in seconds by the STORE's clock, read after the
    #: look-up (``None``: the store could not say; a skew margin is charged instead).
    key_age_s: float | None = None


@dataclass(frozen=True, slots=True)
class Judgement:
    """The verdict, why, the attempt it stands on, and the receipt a replay answers with."""

    verdict: Verdict
    reason: OutcomeReason | ReviewReason
    known: KnownEffect | None = None
    #: For a replay: the receipt as the ledger would hold it, its fingerprint, and who said so.
    receipt: dict[str, Any] | None = None
    fingerprint: str | None = None
    settled_by: str = ""


def lookup_key(
    record: EffectHistory | None,
    capabilities: Capabilities,
    *,
    forked: bool = False,
    target_moved: bool | None = False,
    overwritten: Overwrite = Overwrite.NO,
) -> str | None:
    """The key whose receipt the adapter must be asked for before :func:`judge`, if any."""
    if forked or record is None or not capabilities.queryable:
        return None
    if record.unsettled is not None:
        return record.unsettled.idempotency_key
    committed = record.committed
    if committed is None or (capabilities.tracks_targets and target_moved is not False):
        return None  # moved: a new effect; unreadable: the rule waits, nothing to ask
    if overwritten_verdict(capabilities, overwritten) is not None:
        return None  # a new effect, or a person's: the earlier receipt answers nothing
    if _reviewed(committed.receipt):
        return None  # a person settled it; the adapter never knew
    return committed.idempotency_key


def judge(facts: ReplayFacts) -> Judgement:
    """Replay, proceed, hold, wait or review a write whose effect the ledger may know."""
    if facts.forked:
        return Judgement(Verdict.FORKED, OutcomeReason.FORK_USED)
    record = facts.record
    if record is None or record.current is None:
        return Judgement(Verdict.PROCEED, OutcomeReason.NEW_EFFECT)
    if record.unsettled is not None:
        return _approved(facts, _judge_unsettled(facts, record.unsettled))
    committed = record.committed
    if committed is None or committed.receipt is None:  # a commit always has its receipt
        return Judgement(Verdict.PROCEED, OutcomeReason.NEW_EFFECT)
    moved = _moved(facts, committed)
    if moved is not None:
        return moved
    verdict = overwritten_verdict(facts.capabilities, facts.overwritten)
    if verdict is not None:
        return Judgement(*verdict, committed)
    return _approved(facts, _judge_committed(facts, committed, committed.receipt))


def overwritten_verdict(
    capabilities: Capabilities, overwritten: Overwrite
) -> tuple[Verdict, OutcomeReason | ReviewReason] | None:
    """A, B, A where the adapter cannot read the target: as the target is declared.

    ``None``: the rule goes on as if nothing came between (no other effect
    since, a tracked target, or a collection, whose third is the first again).
    """
    if overwritten is Overwrite.NO or capabilities.tracks_targets:
        return None
    if capabilities.targets is Targets.STATE:
        if overwritten is Overwrite.MAYBE:
            # B's outcome is unknown: a replay may answer for a target that shows B,
            # and A sent again may be overwritten by B landing late. A person looks.
            return Verdict.REVIEW, ReviewReason.REPEAT_OR_REVERT
        return Verdict.PROCEED, OutcomeReason.TARGET_MOVED  # the write restores A: a new effect
    if capabilities.targets is Targets.UNKNOWN:
        return Verdict.REVIEW, ReviewReason.REPEAT_OR_REVERT
    return None


def _moved(facts: ReplayFacts, known: KnownEffect) -> Judgement | None:
    """Where the adapter tracks targets: a new effect if the target moved, wait if unreadable."""
    if not facts.capabilities.tracks_targets or facts.target_moved is False:
        return None
    if facts.target_moved is None:
        return Judgement(Verdict.WAIT, OutcomeReason.ADAPTER_UNAVAILABLE, known)
    return Judgement(Verdict.PROCEED, OutcomeReason.TARGET_MOVED, known)


def _judge_unsettled(facts: ReplayFacts, known: KnownEffect) -> Judgement:
    """An earlier attempt that may have landed: only the adapter, asked by its key, can say."""
    answer = facts.answer
    # Settled under the weaker of the terms it was sent under and those declared now.
    caps = terms_rules.settling_capabilities(facts.capabilities, known.sent_under)
    if answer is None or not caps.queryable:
        return Judgement(Verdict.REVIEW, ReviewReason.REPLAY_OF_UNKNOWN, known)
    status = answer.status
    if status is LookupStatus.COMMITTED and answer.receipt is not None:
        receipt = answer.receipt
        ours = (receipt.idempotency_key, receipt.intent_digest) == (
            known.idempotency_key,
            known.intent_digest,
        )
        if not ours:
            # The adapter holds another intent under our key: never an answer for
            # ours, and no proof that ours did not land either (the adapter may be
            # wrong). Sending the effect again takes a person's signed fork, even
            # after a replan set the key aside.
            return Judgement(Verdict.REVIEW, ReviewReason.KEY_CONFLICT, known)
        moved = _moved(facts, known)
        if moved is not None:
            return moved
        verdict = overwritten_verdict(facts.capabilities, facts.overwritten)
        if verdict is not None:
            return Judgement(*verdict, known)  # it landed, and another effect since (A, B, A)
        # Only the result's digest where the kind is sensitive, as the ledger holds it.
        body = receipt.to_json()
        return Judgement(
            Verdict.REPLAY,
            OutcomeReason.EFFECT_REPLAYED,
            known,
            redact_receipt(body) if facts.sensitive else body,
            receipt.fingerprint,
            "lookup",
        )
    if status in {LookupStatus.IN_PROGRESS, LookupStatus.UNAVAILABLE}:
        return Judgement(Verdict.WAIT, _waiting(status), known)
    if status is LookupStatus.REFUSED:
        return Judgement(Verdict.PROCEED, OutcomeReason.NEVER_LANDED, known)
    if status is LookupStatus.ABSENT and caps.absent_is_final and _remembered(facts, known):
        return Judgement(Verdict.PROCEED, OutcomeReason.NEVER_LANDED, known)
    return Judgement(Verdict.REVIEW, ReviewReason.REPLAY_OF_UNKNOWN, known)


def _judge_committed(facts: ReplayFacts, known: KnownEffect, recorded: dict[str, Any]) -> Judgement:
    """A commit the ledger records: replayed only as the adapter, where it can be asked, agrees."""
    if _reviewed(recorded):
        # A reviewer's signed "landed": the adapter could not say (that is why a
        # person was asked), so the signed ledger's record of the decision answers.
        return Judgement(
            Verdict.REPLAY,
            OutcomeReason.EFFECT_REPLAYED,
            known,
            recorded,
            digest(recorded),
            "review",
        )
    if not facts.capabilities.queryable:
        # Nothing can be asked: the signed ledger holds the only copy of the
        # adapter's receipt, given by the adapter when the write landed.
        return Judgement(
            Verdict.REPLAY,
            OutcomeReason.EFFECT_REPLAYED,
            known,
            recorded,
            digest(recorded),
            "ledger",
        )
    answer = facts.answer
    if answer is None:
        raise ValueError("a queryable adapter's receipt must be asked for first")  # caller's bug
    status = answer.status
    if status in {LookupStatus.IN_PROGRESS, LookupStatus.UNAVAILABLE}:
        return Judgement(Verdict.WAIT, _waiting(status), known)
    if status is LookupStatus.COMMITTED and answer.receipt is not None:
        if same_receipt(recorded, answer.receipt):
            return Judgement(
                Verdict.REPLAY,
                OutcomeReason.EFFECT_REPLAYED,
                known,
                recorded,
                digest(recorded),
                "adapter",
            )
        return Judgement(Verdict.REVIEW, ReviewReason.RECEIPT_DRIFT, known)
    return Judgement(Verdict.REVIEW, ReviewReason.RECEIPT_MISSING, known)


def _reviewed(receipt: Mapping[str, Any] | None) -> bool:
    """Whether a recorded receipt is one a person gave (a signed ``landed``)."""
    return receipt is not None and receipt.get("namespace") == REVIEW_NAMESPACE


def same_receipt(recorded: Mapping[str, Any], receipt: Receipt) -> bool:
    """Whether the adapter's ``receipt`` is the ledger's ``recorded`` one, field for field.

    The ledger may hold a sensitive kind's result as its digest only: then
    the result is compared by that digest, every other field as it is.
    """
    body = receipt.to_json()
    return dict(recorded) == body or dict(recorded) == redact_receipt(body)


def _approved(facts: ReplayFacts, judgement: Judgement) -> Judgement:
    """A replay the policy gates waits for an approval of it, as the write itself would."""
    if judgement.verdict is Verdict.REPLAY and facts.needs_approval and not facts.approved:
        return Judgement(
            Verdict.HOLD,
            OutcomeReason.APPROVAL_REQUIRED,
            judgement.known,
            judgement.receipt,
            judgement.fingerprint,
            judgement.settled_by,
        )
    return judgement


def _remembered(facts: ReplayFacts, known: KnownEffect) -> bool:
    """Whether the adapter still remembers ``known``'s key (within its declared retention).

    Its age is measured on the store's clock as well as the runtime's
    (:mod:`tether.core._retention`): a worker whose clock runs behind cannot
    make a forgotten key look remembered.
    """
    limit = facts.capabilities.retention_s
    if limit is None:
        return True
    if known.sent_at is None:
        return False  # no record of when it was sent: assume the worst
    return remembered(limit, facts.now, known.sent_at, facts.key_age_s)


def _waiting(status: LookupStatus) -> OutcomeReason:
    if status is LookupStatus.IN_PROGRESS:
        return OutcomeReason.IN_FLIGHT
    return OutcomeReason.ADAPTER_UNAVAILABLE


@dataclass(frozen=True, slots=True)
class Proceed:
    """Carry the proposal out as a new effect, from ``state`` and with ``events`` first."""

    state: RunState
    events: tuple[Event, ...] = ()


def decide(
    state: RunState,
    proposal: Proposal,
    judgement: Judgement,
    *,
    effect: str,
    budgets: Budgets,
    case_id: str,
    now: datetime,
    live: EnvironmentState,
    charged: bool = False,
    held: Intent | None = None,
    hold_key: str = "",
    shown: dict[str, Any] | None = None,
) -> Transition | Proceed:
    """The transition :func:`judge`'s verdict makes of ``state`` (the step counted).

    ``charged``: the proposal was paid for already (an approved replay that
    waited). ``held`` and ``hold_key``: the proposal as a held action and the key
    minted to bind its approval, for a replay the policy gates (:attr:`Verdict.HOLD`). A replay's answer is the agent's next result; the last proposal
    the budget allows ends the run. ``shown``: what a review case records of the
    effect for the person who decides it (its kind, target, arguments where not
    sensitive, when it was sent, where to look for it).
    """
    verdict = judgement.verdict
    if verdict is Verdict.FORKED:
        forks = list(state.forks)
        forks.remove(effect)
        used: Event = ("fork_used", {"action_id": proposal.action_id, "effect_digest": effect})
        return Proceed(state.evolve(forks=tuple(forks)), (used,))
    if verdict is Verdict.PROCEED:
        return Proceed(state)
    known = judgement.known
    if known is None:
        raise ValueError(f"verdict {verdict} names no earlier attempt")  # judge's bug
    if verdict is Verdict.WAIT:
        return Transition(
            OutcomeKind.RETRY_LATER,
            reason=judgement.reason,
            message=f"an earlier attempt at this effect (key {known.idempotency_key}) is not "
            f"settled yet ({judgement.reason}); nothing was sent",
        )
    spent = state.spent if charged else budgets_rules.charged(state.spent, proposals=1)
    charged_state = state.evolve(spent=spent)
    if verdict is Verdict.REVIEW:
        return _review(
            charged_state, proposal, effect, known, judgement.reason, case_id, now, live, shown
        )
    if verdict is Verdict.HOLD:
        if held is None or not hold_key:
            raise ValueError("a replay that needs approval needs its held form")  # caller's bug
        return _held(state, proposal, effect, known, held, hold_key, now)
    receipt = judgement.receipt or {}
    replayed = _replayed(
        charged_state, proposal, effect, known, receipt, judgement.fingerprint or "", judgement
    )
    if known.receipt is None:
        # The adapter proved an attempt the ledger left unsettled landed: the ledger
        # records it now, so the effect is known committed from here on.
        settled = LedgerNote(
            EffectStatus.COMMITTED,
            receipt,
            subject=EffectRef(
                known.idempotency_key, known.action_id, known.intent_digest, known.status
            ),
        )
        replayed = replace(replayed, ledger=(settled,))
    after = replayed.state
    if after is None:  # _replayed always sets it
        raise ValueError("a replay names no state")
    ended, ending = budgets_rules.charged_last(after, budgets)
    if ending:
        return Transition(
            OutcomeKind.REPLAYED,
            state=ended,
            events=(*replayed.events, *ending),
            blobs=replayed.blobs,
            reason=replayed.reason,
            message=f"{replayed.message}; that was the last proposal the budget allows",
        )
    return replayed


def _held(
    state: RunState,
    proposal: Proposal,
    effect: str,
    known: KnownEffect,
    held: Intent,
    key: str,
    now: datetime,
) -> Transition:
    """A gated kind's replay waits for a person's approval; approving it sends nothing."""
    hold = steps.hold(state, proposal, held, key=key, now=now)
    note: Event = (
        "replay_held",
        {"action_id": proposal.action_id, "effect_digest": effect, "replay_of": known.action_id},
    )
    return Transition(
        hold.outcome,
        state=hold.state,
        events=(*hold.events, note),
        reason=hold.reason,
        message=f"{hold.message} (a replay of an effect that already happened: approving "
        "it sends nothing)",
    )


_REVIEW_WHY = {
    ReviewReason.REPLAY_OF_UNKNOWN: "has an unknown outcome and cannot be settled by its key: sending it "
    "again could be a second effect",
    ReviewReason.KEY_CONFLICT: "is held by the adapter under its key for another intent (a key conflict "
    "no person has reviewed)",
    ReviewReason.RECEIPT_DRIFT: "has a receipt at the adapter that differs from the ledger's copy: the "
    "recorded effect cannot be claimed, and sending it could be a second effect",
    ReviewReason.REPEAT_OR_REVERT: "is committed, and another effect was committed on the same "
    "target since, or sent to it with an outcome nobody knows: doing it again may restore what "
    "the target held (a revert), make a second object (a duplicate), or be overwritten by the "
    "other landing late, and a replay may answer for a target that holds the other now",
    ReviewReason.RECEIPT_MISSING: "is committed in the ledger, but the adapter holds no receipt for its key "
    "(deleted, or forgotten): the effect cannot be claimed, and sending it could be a second "
    "effect",
}


def _review(
    state: RunState,
    proposal: Proposal,
    effect: str,
    known: KnownEffect,
    reason: OutcomeReason | ReviewReason,
    case_id: str,
    now: datetime,
    live: EnvironmentState,
    shown: dict[str, Any] | None = None,
) -> Transition:
    """Freeze for a person: an effect nothing can settle is neither replayed nor sent."""
    why = ReviewReason(reason)
    settle = (
        "sign landed if you find it happened (with what you found), or abort; to do it again "
        "on purpose, sign a fork (`tether fork`), then replan"
        if why is ReviewReason.REPLAY_OF_UNKNOWN
        else "to do it again (a revert), sign a fork (`tether fork`), then replan; if it would "
        "be a duplicate, replan without it, or abort"
        if why is ReviewReason.REPEAT_OR_REVERT
        else "abort, or replan after a signed fork (`tether fork`) if it must happen again"
    )
    detail = (
        f"action {proposal.action_id!r} proposes effect {effect}, whose earlier attempt "
        f"{known.action_id!r} (key {known.idempotency_key}) {_REVIEW_WHY[why]}. A person "
        f"decides: {settle}."
    )
    item: dict[str, Any] = {
        "kind": why.value,
        "effect_digest": effect,
        "action_id": proposal.action_id,
        "earlier_action_id": known.action_id,
        "earlier_idempotency_key": known.idempotency_key,
        "earlier_intent_digest": known.intent_digest,
        "earlier_receipt_fingerprint": known.receipt_fingerprint,
        "earlier_sent_at": None if known.sent_at is None else format_time(known.sent_at),
    }
    if shown:
        item["effect"] = dict(shown)
    return park(
        state,
        case_id=case_id,
        reason=why,
        detail=detail,
        now=now,
        live=live,
        evidence=(item,),
    )


def _replayed(
    state: RunState,
    proposal: Proposal,
    effect: str,
    known: KnownEffect,
    receipt: dict[str, Any],
    fingerprint: str,
    judgement: Judgement,
) -> Transition:
    """The recorded receipt stands for the proposal; nothing is sent or counted as written.

    ``receipt`` as the ledger holds it (a sensitive kind's result as a
    digest), ``fingerprint`` that of the receipt the replay stands on.
    """
    facts: dict[str, JSONValue] = {
        "replay_of": known.action_id,
        "idempotency_key": known.idempotency_key,
        "receipt_id": str(receipt.get("receipt_id")),
        "receipt_fingerprint": fingerprint,
        "effect_digest": effect,
        "settled_by": judgement.settled_by,
    }
    result = ActionResult(
        action_id=proposal.action_id,
        kind=proposal.kind,
        target=proposal.target,
        outcome=OutcomeKind.REPLAYED.value,
        reason=OutcomeReason.EFFECT_REPLAYED,
        data={
            **facts,
            "business_object_id": receipt.get("business_object_id"),
            "result": receipt.get("result"),
            "message": f"this effect already happened (action {known.action_id!r}); nothing was "
            "sent again. Doing it again needs a signed fork.",
        },
    )
    after, blobs = with_result(state, result)
    return Transition(
        OutcomeKind.REPLAYED,
        state=after,
        events=(("effect_replayed", {"action_id": proposal.action_id, **facts}),),
        blobs=blobs,
        reason=OutcomeReason.EFFECT_REPLAYED,
        message=f"effect {effect} already committed as receipt {facts['receipt_id']}; replayed",
    )
