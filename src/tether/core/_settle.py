"""Settling a pending write, as pure functions of what is known.

The one rule that makes the ledger trustworthy: a write is sent only while
the SIGNED state says ``dispatched``, and that state is committed (with the
ledger entry, in one fenced transaction) before the call. So ``intended``
proves nothing was sent, and the decisions below read the signed state,
never a ledger row anyone could insert.

``settle`` (a pending write, what now?), then ``after_lookup`` /
``after_execute`` with the adapter's answer:

==========  =========  ===========  ==========================================
status      queryable  idempotent   settle
==========  =========  ===========  ==========================================
intended    any        any          approval gate; commit ``dispatched``; send
unknown+    any        any          approval gate; commit ``dispatched``; send
                                    again, same key
dispatched  yes        any          look up by key first
dispatched  no         yes          approval gate; send again, same key
dispatched  no         no           outcome unknown -> needs_review
==========  =========  ===========  ==========================================

``unknown+`` is ``outcome_unknown`` with a resend ordered: a reviewer signed
``not_landed`` (see ``tether.core.case_rules``); the order is cleared in the
commit that says ``dispatched``, so it buys one send.

==================================  ===========================================
look-up answer                      after_lookup
==================================  ===========================================
committed, same intent digest       reconcile (below)
committed, other intent digest      key_conflict -> needs_review
in progress                         wait; never send while one may be in flight;
                                    in flight past the adapter's limit since
                                    dispatch: outcome unknown -> needs_review
refused (recorded as refused)       sent once: rejected, the run goes on;
                                    resent: outcome unknown -> needs_review
unavailable                         retry later, nothing changes
absent, final or idempotent        approval gate; send again, same key (a
                                    retry: a refusal means outcome unknown);
                                    a key past the adapter's retention (its
                                    age the larger of the store's clock's and
                                    the runtime's, ``_retention``):
                                    outcome unknown -> needs_review
inconclusive (answered, proving     as absent, never final: idempotent ->
nothing), idempotent                send again, same key (as above)
absent, not final, not idempotent;  outcome unknown -> needs_review
inconclusive, not idempotent
==================================  ===========================================

==================================  ===========================================
execute answer                      after_execute
==================================  ===========================================
receipt                             reconcile (below): ``executed``, first send
                                    or a resend alike (a look-up's receipt,
                                    nothing sent, is ``replayed``)
conflict (same key, other intent)   key_conflict -> needs_review
precondition failed, first send     rejected; the run goes on
precondition failed, a retry        outcome unknown -> needs_review (the first
                                    attempt may have landed)
in progress                         wait (past the limit: as for a look-up)
unavailable, blind adapter          outcome unknown -> needs_review
unavailable, otherwise              retry later (still ``dispatched``); the
                                    caller backs off (``_retry``), and a repeat
                                    resend records nothing while recent
==================================  ===========================================

Reconcile: the receipt must carry our key and intent digest (else
key_conflict), our adapter's namespace and exactly the post-state the intent
produces (else committed + receipt_mismatch), and, where the policy needs
an approval, a commit time inside the approval (else committed +
approval_boundary): the receipt's own ``committed_at``, or where it has
none, the moment the receipt reached the runtime (``Facts.now``, taken after
the send returned or the look-up answered), an upper bound on its commit. Otherwise the run advances with ``committed``. Every
freeze after a commit records ``committed`` first: whatever a person decides,
the ledger says the effect happened.

When the advance must be durable (``receipt_durability``): a write step is
one durable commit where a lost receipt costs nothing but a question. The
receipt of this step's own send rides on the run's next commit
(``deferred``: the next intent, or the next checkpoint of any kind) when
the adapter settles "sent, receipt not persisted" by key without a person:

=============================================  ==========  ================
receipt                                        adapter     durability
=============================================  ==========  ================
of this step's send, no approval, no undoing   idempotent, deferred
                                               no retention
of this step's send, no approval, no undoing   queryable,  deferred
                                               absence
                                               final, no
                                               retention
a look-up's (nothing sent: a recovery's)       any         now
of a write a person approved                   any         now
of a compensation (it moves another effect)    any         now
any other                                      any         now
=============================================  ==========  ================

Why deferred is safe there: a crash before the next commit leaves the
signed state where the intent commit put it, the write ``dispatched``, and
``settle`` above asks the adapter by key (committed: reconciled, nothing
sent) or sends again under the key (idempotent: the same receipt). The
deferred commit only ever lands inside the next commit's transaction, which
is sealed on top of it: no effect leaves the process between a deferred
receipt and that commit (every send waits for its own intent commit), so at
most one receipt is ever not durable. Not deferred: a blind adapter (nothing
could settle it), one whose look-up may miss a landed write and cannot
deduplicate (a lost receipt would freeze a write that landed), one that
declares a retention (a process that lives on past it before its next
commit, then dies, would leave a write that landed as unknown, or settle it
by an absence that no longer proves anything: outside attack a1), a write a
person approved (a resend after the crash would need the approval in force
again), and a compensation (its commit also moves the effect it undid).

Cancelling a dispatched write (``cancel_pending``) never sends it and never
abandons it: the adapter is asked first where it can be; committed ->
reconcile (then the run is cancelled with the effect on record); absent and
in progress or unreachable -> the cancel waits; absent, or not queryable ->
needs_review (``cancel_outcome_unknown``): a look-up that finds nothing
cannot prove that an older worker is not still sending, and a cancel would
make "never landed" final.

The policy gate, before every send: a write the policy in force forbids
(re-judged by the action contract after a policy change) is never sent;
rejected where nothing can have landed, else outcome unknown (see
:mod:`tether.core._policy_change`).

The approval gate: where the policy needs one, an approval in force,
unexpired on the runtime's clock, for the environment as it is now; without
it the write waits (``waiting_for_approval``) and nothing is committed.

The environment as it is now is read only where it decides the step: a
freeze records it in its case, and the approval gate judges against it.
Given none (``Facts.live`` is ``None``), those rules ask for it
(:func:`read_first`) and the caller decides the step again with it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from typing import Any

from tether.core import _policy_change as policy_rules
from tether.core._canonical import digest
from tether.core._compensation import compensated_note
from tether.core._evidence import approval_problem, committed_within_approval
from tether.core._model import Capabilities, CompletedWrite, PendingWrite, Receipt
from tether.core._phases import EffectStatus, OutcomeReason, Phase, ReviewReason
from tether.core._retention import key_age, remembered
from tether.core._retry import in_flight_allowance, records_resend
from tether.core._review import open_review
from tether.core._state import RunState
from tether.core._terms import settling_capabilities
from tether.core._transition import (
    Durability,
    Event,
    Execute,
    ExecuteAnswer,
    ExecuteStatus,
    Facts,
    LedgerNote,
    Lookup,
    LookupAnswer,
    LookupStatus,
    OutcomeKind,
    ReadEnvironment,
    Transition,
)


def _pending(state: RunState) -> PendingWrite:
    pending = state.pending
    if pending is None:
        raise ValueError(f"run {state.run_id} has no pending write")  # a caller's bug
    return pending


def _promised(facts: Facts) -> Facts:
    """``facts`` with the promises the pending write's sends were not made under taken away.

    A dispatched write may have landed under the terms it was sent under:
    it is resent by key, or a look-up's absence is final, only where those
    terms and the adapter's now both say so (:mod:`tether.core._terms`).
    """
    caps = settling_capabilities(facts.capabilities, facts.sent_under)
    return facts if caps is facts.capabilities else replace(facts, capabilities=caps)


def settle(state: RunState, facts: Facts) -> Transition:
    """The first move for a pending write, from its signed status alone."""
    pending = _pending(state)
    if pending.status is not EffectStatus.INTENDED:
        facts = _promised(facts)
    caps = facts.capabilities
    if pending.status is EffectStatus.INTENDED:
        return dispatch(state, facts)
    if pending.resend_ordered:
        return resend_ordered(state, facts)
    if caps.queryable:
        return Transition(
            OutcomeKind.IN_FLIGHT, call=Lookup(pending.idempotency_key, pending.intent)
        )
    if caps.idempotent:
        return _past_retention(state, facts) or send_again(state, facts)
    return freeze(
        state,
        facts,
        ReviewReason.OUTCOME_UNKNOWN,
        None,
        "a write that cannot be queried or deduplicated was dispatched and its outcome is "
        "unknown; a person must decide",
        ledger=(LedgerNote(EffectStatus.OUTCOME_UNKNOWN),),
    )


def _waiting(state: RunState, facts: Facts, *, known_absent: bool = False) -> Transition | None:
    """Why the pending write is not sent now: the policy in force forbids it, or it awaits approval.

    A forbidden write is never sent (see :mod:`tether.core._policy_change`):
    rejected where nothing can have landed, else its outcome is unknown.
    """
    forbidden = facts.forbidden
    if forbidden is not None:
        pending = _pending(state)
        why = f"the policy in force forbids this write ({forbidden.reason}: {forbidden.message})"
        if policy_rules.forbidden_outcome(pending.status, known_absent=known_absent) is (
            policy_rules.Forbidden.REJECT
        ):
            return _rejected(state, forbidden.reason, f"{why}; it was never sent")
        return freeze(
            state,
            facts,
            ReviewReason.OUTCOME_UNKNOWN,
            None,
            f"{why}, and it may already have been sent under key {pending.idempotency_key}; "
            "it is not sent again, so whether it landed is unknown: a person must decide",
            ledger=(LedgerNote(EffectStatus.OUTCOME_UNKNOWN),),
        )
    if not facts.needs_approval:
        return None
    live = facts.live
    if live is None:
        return read_first(OutcomeKind.WAITING_FOR_APPROVAL)  # judged against the world now
    problem = approval_problem(
        state,
        needs=True,
        now=facts.now,
        live=live,
        idempotent=facts.capabilities.idempotent,
        policy_version=facts.policy_version,
    )
    if problem is None:
        return None
    reason, message = problem
    return Transition(OutcomeKind.WAITING_FOR_APPROVAL, reason=reason, message=message)


def dispatch(state: RunState, facts: Facts) -> Transition:
    """Commit ``dispatched`` (unless the signed state already says so), then send once."""
    pending = _pending(state)
    waiting = _waiting(state, facts)
    if waiting is not None:
        return waiting
    call = Execute(pending.idempotency_key, pending.intent, pending.prestate, retry=False)
    if pending.status is EffectStatus.DISPATCHED:
        # Committed as dispatched by the step that made it pending, in this session.
        return Transition(OutcomeKind.EXECUTED, call=call)
    dispatched = state.evolve(
        pending=replace(pending, status=EffectStatus.DISPATCHED, dispatched_at=facts.now)
    )
    return Transition(
        OutcomeKind.EXECUTED,
        state=dispatched,
        events=(("effect_dispatched", {"action_id": pending.action_id}),),
        ledger=(LedgerNote(EffectStatus.DISPATCHED),),
        call=call,
    )


def send_again(state: RunState, facts: Facts, *, known_absent: bool = False) -> Transition:
    """Send again under the same key, still ``dispatched``, after committing that it is resent.

    An earlier attempt may have landed, so a refusal (a failed precondition)
    is an unknown outcome, not a rejection, and so is a refusal a later
    look-up finds stored (it may be the resend's): the commit first says
    ``resent`` and when this send began (the in-flight limit counts from it),
    and the ledger records the second dispatch. A write already signed as
    resent is sent again without a commit while that record is recent
    (``tether.core._retry.records_resend``): the fact is durable, and an
    adapter that stays down must not grow the run per attempt.
    ``known_absent``: the adapter's final look-up found nothing, so a
    receipt is a fresh commit.
    """
    pending = _pending(state)
    waiting = _waiting(state, facts, known_absent=known_absent)
    if waiting is not None:
        return waiting
    call = Execute(
        pending.idempotency_key,
        pending.intent,
        pending.prestate,
        retry=True,
        known_absent=known_absent,
    )
    since = (facts.now - (pending.dispatched_at or pending.proposed_at)).total_seconds()
    limit = facts.capabilities.in_flight_limit_s
    if not records_resend(resent=pending.resent, since_s=since, in_flight_limit_s=limit):
        # Already signed as resent, recently: the same send again records
        # nothing, so an adapter that stays down adds no checkpoint and no
        # ledger row per attempt (the stuck test allows for it: ``_stuck``).
        return Transition(OutcomeKind.EXECUTED, call=call)
    resending = replace(pending, resent=True, dispatched_at=facts.now)
    return Transition(
        OutcomeKind.EXECUTED,
        state=state.evolve(pending=resending),
        events=(("effect_resent", {"action_id": pending.action_id}),),
        ledger=(LedgerNote(EffectStatus.DISPATCHED),),
        call=call,
    )


def resend_ordered(state: RunState, facts: Facts) -> Transition:
    """The send a reviewer's signed ``not_landed`` ordered: once more, under the same key.

    The commit that says ``dispatched`` (and when) also clears the order, so
    it is the only send it buys: a crash after it leaves a dispatched write
    that an adapter which cannot settle it by key freezes again (its outcome
    unknown once more), never a second blind send. It is still a retry (the
    person may be wrong): a refusal is an unknown outcome, not a rejection.
    The policy and approval gates apply as to any send.
    """
    pending = _pending(state)
    waiting = _waiting(state, facts)
    if waiting is not None:
        return waiting
    resending = replace(
        pending,
        status=EffectStatus.DISPATCHED,
        resend_ordered=False,
        resent=True,
        dispatched_at=facts.now,
    )
    return Transition(
        OutcomeKind.EXECUTED,
        state=state.evolve(pending=resending),
        events=(("effect_resent", {"action_id": pending.action_id, "ordered_by": "review"}),),
        ledger=(LedgerNote(EffectStatus.DISPATCHED),),
        call=Execute(pending.idempotency_key, pending.intent, pending.prestate, retry=True),
    )


def after_lookup(state: RunState, facts: Facts, answer: LookupAnswer) -> Transition:
    """Act on what the adapter recorded under the pending write's key."""
    pending = _pending(state)
    facts = _promised(facts)
    caps = facts.capabilities
    if answer.status is LookupStatus.COMMITTED and answer.receipt is not None:
        return reconcile(state, facts, answer.receipt, fresh=False)
    if answer.status is LookupStatus.IN_PROGRESS:
        return _stuck(state, facts, answer.detail) or Transition(
            OutcomeKind.IN_FLIGHT,
            reason=OutcomeReason.IN_FLIGHT,
            message=answer.detail or "an earlier attempt under this key is still in flight",
        )
    if answer.status is LookupStatus.REFUSED:
        if pending.resent:
            # The refusal may be the resend's; the first attempt may have landed
            # and been forgotten. The same reading as a refused resend's reply.
            return freeze(
                state,
                facts,
                ReviewReason.OUTCOME_UNKNOWN,
                None,
                f"the adapter holds a refusal under key {pending.idempotency_key} "
                f"({answer.detail}), but the write was sent more than once and the first "
                "attempt may have landed; a person must decide",
                ledger=(LedgerNote(EffectStatus.OUTCOME_UNKNOWN),),
            )
        # Sent once, and the adapter recorded that it refused this very request:
        # nothing landed, and a resend under the key would only be refused again.
        return _rejected(state, OutcomeReason.REFUSED, answer.detail)
    if answer.status is LookupStatus.UNAVAILABLE:
        return Transition(
            OutcomeKind.RETRY_LATER,
            reason=OutcomeReason.ADAPTER_UNAVAILABLE,
            message=answer.detail or "the adapter could not be asked; nothing changed",
        )
    # An answer that proves nothing is never absence, final or not; where a
    # same-key resend is safe, it is resent all the same.
    inconclusive = answer.status is LookupStatus.INCONCLUSIVE
    final = caps.absent_is_final and not inconclusive
    if final or caps.idempotent:
        # Still a retry: an adapter that lost a receipt it once gave would make
        # a refused re-send look like a clean rejection of a write that landed.
        return _past_retention(state, facts) or send_again(state, facts, known_absent=final)
    found = (
        f"the adapter's look-up for key {pending.idempotency_key} proved nothing "
        f"({answer.detail or 'no detail'})"
        if inconclusive
        else f"the adapter has no receipt for key {pending.idempotency_key} yet, a look-up "
        "that finds nothing is not final"
    )
    return freeze(
        state,
        facts,
        ReviewReason.OUTCOME_UNKNOWN,
        None,
        f"{found}, and the write cannot be deduplicated; a person must decide",
        ledger=(LedgerNote(EffectStatus.OUTCOME_UNKNOWN),),
    )


def _past_retention(state: RunState, facts: Facts) -> Transition | None:
    """A freeze when the key may have outlived the adapter's memory of it, else ``None``.

    The key was minted with the intent, before any send, so its age is
    measured from then: never younger than the adapter's oldest record of it;
    on the store's clock as well as the runtime's (:mod:`tether.core._retention`),
    so a worker whose clock runs behind cannot take a stale absence as final.
    """
    pending = _pending(state)
    limit = facts.capabilities.retention_s
    if remembered(limit, facts.now, pending.proposed_at, facts.key_age_s):
        return None
    age = key_age(facts.now, pending.proposed_at, facts.key_age_s)
    return freeze(
        state,
        facts,
        ReviewReason.OUTCOME_UNKNOWN,
        None,
        f"key {pending.idempotency_key} may be {age:.0f} s old ({_measured(facts)}), past the "
        f"{limit:g} s the adapter promises to remember keys: a look-up that finds nothing "
        "proves nothing and a send could be a second effect; a person must decide",
        ledger=(LedgerNote(EffectStatus.OUTCOME_UNKNOWN),),
    )


def _measured(facts: Facts) -> str:
    """Which clocks measured a key's age, for the person who reads why it froze."""
    if facts.key_age_s is None:
        return "by this runtime's clock plus a skew margin: the store could not say"
    return "the larger of the store's and this runtime's measures"


def _stuck(state: RunState, facts: Facts, detail: str) -> Transition | None:
    """A freeze when the key has been in flight past the adapter's limit, else ``None``."""
    pending = _pending(state)
    return _aged_out(
        state,
        facts,
        # A resent write's latest send may be up to a margin younger than the
        # one signed (see ``send_again``): never judged stuck before its limit.
        in_flight_allowance(facts.capabilities.in_flight_limit_s, resent=pending.resent),
        pending.dispatched_at or pending.proposed_at,
        lambda age, limit: (
            f"key {pending.idempotency_key} is still in flight {age:.0f} s "
            f"after it was sent, past the {limit:g} s the adapter allows "
            f"({detail or 'no detail'}): the request may never finish, or may have landed; "
            "a person must decide"
        ),
    )


def _aged_out(
    state: RunState,
    facts: Facts,
    limit: float | None,
    since: datetime,
    why: Callable[[float, float], str],
) -> Transition | None:
    """Outcome unknown, for a person, once ``limit`` seconds have passed since ``since``."""
    if limit is None:
        return None
    age = (facts.now - since).total_seconds()
    if age <= limit:
        return None
    return freeze(
        state,
        facts,
        ReviewReason.OUTCOME_UNKNOWN,
        None,
        why(age, limit),
        ledger=(LedgerNote(EffectStatus.OUTCOME_UNKNOWN),),
    )


def _rejected(state: RunState, reason: str, detail: str) -> Transition:
    """The pending write was refused and nothing landed: the run goes on without it."""
    pending = _pending(state)
    return Transition(
        OutcomeKind.REJECTED,
        state=state.evolve(phase=Phase.RUNNING, pending=None),
        events=(("effect_rejected", {"action_id": pending.action_id, "reason": detail}),),
        ledger=(LedgerNote(EffectStatus.REJECTED),),
        reason=reason,
        message=detail,
    )


def after_execute(
    state: RunState, facts: Facts, call: Execute, answer: ExecuteAnswer
) -> Transition:
    """Act on the adapter's answer to a send."""
    _pending(state)  # a caller bug to ask with nothing pending
    facts = _promised(facts)
    if answer.status is ExecuteStatus.COMMITTED and answer.receipt is not None:
        # Sent by this step, first time or again under the key: executed. Whether
        # an earlier attempt had landed is not this answer's to say (an idempotent
        # adapter returns the same receipt either way); only a look-up's receipt,
        # read back with nothing sent, is a replay.
        return reconcile(state, facts, answer.receipt, fresh=True)
    if answer.status is ExecuteStatus.CONFLICT:
        return freeze(
            state,
            facts,
            ReviewReason.KEY_CONFLICT,
            answer.receipt,
            "the adapter holds a receipt for this key with a different intent digest",
        )
    if answer.status is ExecuteStatus.PRECONDITION_FAILED:
        if call.retry:
            return freeze(
                state,
                facts,
                ReviewReason.OUTCOME_UNKNOWN,
                None,
                f"a retried write found its precondition failed ({answer.detail}) and the "
                "adapter holds no receipt; the first attempt may have landed",
                ledger=(LedgerNote(EffectStatus.OUTCOME_UNKNOWN),),
            )
        return _rejected(state, OutcomeReason.PRECONDITION_FAILED, answer.detail)
    if answer.status is ExecuteStatus.IN_PROGRESS:
        return _stuck(state, facts, answer.detail) or Transition(
            OutcomeKind.IN_FLIGHT, reason=OutcomeReason.IN_FLIGHT, message=answer.detail
        )
    if facts.capabilities.blind:
        return freeze(
            state,
            facts,
            ReviewReason.OUTCOME_UNKNOWN,
            None,
            f"the adapter failed mid-send ({answer.detail}) and can neither be asked nor "
            "deduplicate; a person must decide",
            ledger=(LedgerNote(EffectStatus.OUTCOME_UNKNOWN),),
        )
    return Transition(
        OutcomeKind.RETRY_LATER,
        reason=OutcomeReason.ADAPTER_UNAVAILABLE,
        message=answer.detail or "the adapter failed; the write stays dispatched",
    )


def reconcile(state: RunState, facts: Facts, receipt: Receipt, *, fresh: bool) -> Transition:
    """Accept the adapter's receipt only if it is bound to exactly this intent.

    ``fresh``: the receipt answers this step's own send (``executed``);
    otherwise a look-up read it back and nothing was sent (``replayed``).
    """
    pending = _pending(state)
    if (
        receipt.idempotency_key != pending.idempotency_key
        or receipt.intent_digest != pending.intent_digest
    ):
        return freeze(
            state,
            facts,
            ReviewReason.KEY_CONFLICT,
            receipt,
            "same idempotency key, different intent digest",
        )
    committed = (LedgerNote(EffectStatus.COMMITTED, receipt.to_json()),)
    stateful = facts.capabilities.stateful
    moved = stateful and receipt.post_state != pending.expected_post
    if receipt.namespace != facts.namespace or moved:
        return freeze(
            state,
            facts,
            ReviewReason.RECEIPT_MISMATCH,
            receipt,
            "the receipt is not for the post-state this intent produces",
            ledger=committed,
            status=EffectStatus.COMMITTED,
        )
    if facts.needs_approval:
        outside = committed_within_approval(state, receipt, received_at=facts.now)
        if outside is not None:
            return freeze(
                state,
                facts,
                ReviewReason.APPROVAL_BOUNDARY,
                receipt,
                outside,
                ledger=committed,
                status=EffectStatus.COMMITTED,
            )
    durability = receipt_durability(
        # What a recovery would settle the write under if this receipt were lost:
        # the weaker of the terms its sends were made under and today's.
        settling_capabilities(facts.capabilities, facts.sent_under),
        fresh=fresh,
        approved=facts.needs_approval,
        undoes=compensated_note(pending, {}) is not None,
    )
    return advance(state, receipt, fresh=fresh, stateful=stateful, durability=durability)


def receipt_durability(
    capabilities: Capabilities, *, fresh: bool, approved: bool, undoes: bool
) -> Durability:
    """When the advance a receipt implies must be durable (the table in the module docstring).

    ``fresh``: the receipt answers this step's own send (not a look-up's);
    ``approved``: the policy needs a person's approval for the write;
    ``undoes``: the write is a compensation (its commit moves another effect).
    """
    settles_by_key = capabilities.idempotent or (
        capabilities.queryable and capabilities.absent_is_final
    )
    # A declared retention bounds how long the key settles it: the receipt is
    # written now rather than ride on a commit that may come after it lapsed.
    forever = capabilities.retention_s is None
    if fresh and settles_by_key and forever and not approved and not undoes:
        return Durability.DEFERRED
    return Durability.NOW


def advance(
    state: RunState,
    receipt: Receipt,
    *,
    fresh: bool,
    stateful: bool = True,
    durability: Durability = Durability.NOW,
) -> Transition:
    """The deterministic state transition a committed receipt implies.

    ``stateful``: the receipt's post-state is the run's environment now; a
    remote effect (``False``) leaves the environment where it was.
    ``durability``: when its commit must land (:func:`receipt_durability`).
    """
    pending = _pending(state)
    kind = "effect_committed" if fresh else "effect_reconciled"
    after = receipt.post_state if stateful else state.environment
    # A compensation that landed also records, in the same commit, that the
    # effect it undid is compensated (with this, its own, receipt).
    undone = compensated_note(pending, receipt.to_json())
    extra_notes: tuple[LedgerNote, ...] = () if undone is None else (undone,)
    extra_events: tuple[Event, ...] = ()
    if undone is not None and undone.subject is not None:
        extra_events = (
            (
                "effect_compensated",
                {
                    "idempotency_key": undone.subject.idempotency_key,
                    "action_id": undone.subject.action_id,
                    "compensation_key": pending.idempotency_key,
                    "receipt_id": receipt.receipt_id,
                    "receipt_fingerprint": receipt.fingerprint,
                },
            ),
        )
    return Transition(
        OutcomeKind.EXECUTED if fresh else OutcomeKind.REPLAYED,
        state=state.evolve(
            phase=Phase.RUNNING,
            pending=None,
            environment=after,
            last_write=CompletedWrite(
                action_id=pending.action_id,
                idempotency_key=pending.idempotency_key,
                intent_digest=pending.intent_digest,
                receipt_id=receipt.receipt_id,
                receipt_fingerprint=receipt.fingerprint,
                result_digest=digest(receipt.result),
                post_version=after.version,
            ),
            writes_committed=state.writes_committed + 1,
            verification=None,  # any write invalidates earlier verifier evidence
        ),
        events=(
            (
                kind,
                {
                    "action_id": pending.action_id,
                    "idempotency_key": pending.idempotency_key,
                    "receipt_id": receipt.receipt_id,
                    "receipt_fingerprint": receipt.fingerprint,
                    "post_state": receipt.post_state.to_json(),
                },
            ),
            *extra_events,
        ),
        ledger=(LedgerNote(EffectStatus.COMMITTED, receipt.to_json()), *extra_notes),
        durability=durability,
    )


def freeze(
    state: RunState,
    facts: Facts,
    reason: ReviewReason,
    receipt: Receipt | None,
    detail: str,
    *,
    ledger: tuple[LedgerNote, ...] = (),
    status: EffectStatus | None = None,
) -> Transition:
    """Enter needs_review, keeping the pending intent and every piece of evidence.

    The case records the environment as it is now: given none, the freeze
    asks for it first (:func:`read_first`).
    """
    pending = _pending(state)  # a caller's bug to freeze a write that is not there
    live = facts.live
    if live is None:
        return read_first(OutcomeKind.FROZEN)
    return open_review(
        state,
        case_id=facts.case_id,
        reason=reason,
        detail=detail,
        now=facts.now,
        live=live,
        receipt=receipt,
        evidence=hint_evidence(pending.idempotency_key, facts.hint),
        ledger=ledger,
        status=status,
    )


def hint_evidence(key: str, hint: dict[str, str] | None) -> tuple[dict[str, Any], ...]:
    """A case's record of where a person would look for the write under ``key`` (if any)."""
    if not hint:
        return ()
    return ({"kind": "where_to_look", "idempotency_key": key, "hints": dict(hint)},)


def read_first(outcome: OutcomeKind) -> Transition:
    """A step that needs the environment as it is now, and was given none.

    It commits nothing; the caller reads the environment and decides the
    same step again with it (see :class:`~tether.core.ReadEnvironment`).
    ``outcome`` is what the step is about to be.
    """
    return Transition(outcome, call=ReadEnvironment())


def cancel_pending(state: RunState, facts: Facts, answer: LookupAnswer | None) -> Transition:
    """Settle a dispatched write before a cancel; ``answer`` is ``None`` if it can't be asked.

    A reconcile leaves the run running with the effect recorded (the caller
    then cancels); anything else is the outcome to report instead.
    """
    pending = _pending(state)
    if answer is not None and answer.status is LookupStatus.COMMITTED:
        return after_lookup(state, facts, answer)
    if answer is not None and answer.status in {LookupStatus.IN_PROGRESS, LookupStatus.UNAVAILABLE}:
        return after_lookup(state, facts, answer)
    # "Absent" is not proof here: a worker whose lease lapsed may still be
    # inside the send, and unlike a re-send under the same key (deduplicated),
    # a cancel would make "never landed" final. A person decides.
    return freeze(
        state,
        facts,
        ReviewReason.CANCEL_OUTCOME_UNKNOWN,
        None,
        f"the run was asked to cancel while write {pending.action_id!r} (key "
        f"{pending.idempotency_key}) may have been sent, and the adapter cannot prove whether "
        "it landed; a person must decide",
        ledger=(LedgerNote(EffectStatus.OUTCOME_UNKNOWN),),
    )
