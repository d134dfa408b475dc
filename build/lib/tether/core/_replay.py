"""Replay or fork: a re-proposed effect equal to one already committed is not sent again.

An agent restored after a crash regenerates its action ids and rewrites its
prose, so neither the action id nor the idempotency key (minted per
proposal) can recognise a second attempt at the same effect. The *effect
digest* can: the digest of ``{namespace, kind, target, identity}``, where
``identity`` is what the adapter says makes the effect (its
``effect_identity`` hook; by default the normalized arguments). Every
ledger entry records it under its hash, so the set of effects a run has
committed is read from the verified ledger and survives recovery and rewind.

:func:`decide`, for a write that passed the gate:

=====================================  ========================================
what the ledger knows of the digest    decide
=====================================  ========================================
nothing                                proceed: a new effect
a signed fork is armed for it          proceed, the fork consumed (once)
committed                              replayed: the recorded receipt, nothing
                                       sent, no ledger entry, no write counted
outcome unknown / dispatched, the      committed: replayed with the adapter's
adapter asked by the earlier key       receipt; absent and final, or refused:
                                       proceed (it never landed); in flight or
                                       unreachable: retry later, nothing moves
outcome unknown, cannot be settled     needs_review (``replay_of_unknown_effect``)
=====================================  ========================================

Doing an effect again on purpose takes a signed fork (:func:`check_fork`):
a reviewer's or operator's document naming the effect digest and the
earlier receipt (id, fingerprint, key), alive now, with a one-time nonce the
checkpoint remembers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from tether.core._actions import ActionResult, Proposal
from tether.core._canonical import JSONValue, digest
from tether.core._errors import EvidenceBindingError, EvidenceSignatureError, NonceReusedError
from tether.core._evidence import check_lifetime, check_nonce
from tether.core._ledger import LedgerEntry, redact_receipt
from tether.core._model import Capabilities, EnvironmentState, format_time
from tether.core._phases import EffectStatus
from tether.core._state import RunState
from tether.core._steps import _charged, _with_result, park
from tether.core._transition import Event, LookupAnswer, LookupStatus, OutcomeKind, Transition

REPLAY_OF_UNKNOWN = "replay_of_unknown_effect"


def effect_digest(namespace: str, kind: str, target: str, identity: Mapping[str, Any]) -> str:
    """The digest two proposals share exactly when they are the same effect."""
    return digest(
        {"namespace": namespace, "kind": kind, "target": target, "identity": dict(identity)}
    )


@dataclass(frozen=True, slots=True)
class KnownEffect:
    """One effect the ledger records under a digest: its key, and its receipt when committed."""

    effect_digest: str
    action_id: str
    idempotency_key: str
    intent_digest: str
    #: The receipt as the ledger holds it (a sensitive kind's result as a digest);
    #: ``None`` while the outcome is unknown.
    receipt: dict[str, Any] | None

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
        this = KnownEffect(
            effect, entry.action_id, entry.idempotency_key, entry.intent_digest, entry.receipt
        )
        key = entry.idempotency_key
        unsettled = record.unsettled
        mine = unsettled is not None and unsettled.idempotency_key == key
        status = entry.status
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


@dataclass(frozen=True, slots=True)
class Proceed:
    """Carry the proposal out as a new effect, from ``state`` and with ``events`` first."""

    state: RunState
    events: tuple[Event, ...] = ()


def decide(
    state: RunState,
    proposal: Proposal,
    *,
    effect: str,
    record: EffectHistory | None,
    capabilities: Capabilities,
    answer: LookupAnswer | None,
    case_id: str,
    now: datetime,
    live: EnvironmentState,
) -> Transition | Proceed:
    """Replay, proceed, wait or freeze a write whose effect digest is ``effect``.

    ``state`` is the run as the step leaves it before the write (the step
    counted); ``record`` what the verified ledger knows of ``effect``;
    ``answer`` the adapter's look-up by the unsettled attempt's key, when it
    could be asked.
    """
    if effect in state.forks:
        forks = list(state.forks)
        forks.remove(effect)
        used: Event = ("fork_used", {"action_id": proposal.action_id, "effect_digest": effect})
        return Proceed(state.evolve(forks=tuple(forks)), (used,))
    known = None if record is None else record.current
    if record is None or known is None:
        return Proceed(state)
    if known is record.committed and known.receipt is not None:
        fingerprint = digest(known.receipt)
        return _replayed(state, proposal, effect, known, known.receipt, fingerprint, "ledger")
    if answer is not None:
        if answer.status is LookupStatus.COMMITTED and answer.receipt is not None:
            # Only the result's digest: the policy may mark the kind sensitive,
            # and the ledger would then never have held the result itself.
            receipt = redact_receipt(answer.receipt.to_json()) or {}
            fingerprint = answer.receipt.fingerprint
            return _replayed(state, proposal, effect, known, receipt, fingerprint, "lookup")
        if answer.status in {LookupStatus.IN_PROGRESS, LookupStatus.UNAVAILABLE}:
            return Transition(
                OutcomeKind.RETRY_LATER,
                reason="in_flight"
                if answer.status is LookupStatus.IN_PROGRESS
                else "adapter_unavailable",
                message=f"an earlier attempt at this effect (key {known.idempotency_key}) is not "
                f"settled yet ({answer.detail or answer.status}); nothing was sent",
            )
        landed_never = answer.status is LookupStatus.REFUSED or (
            answer.status is LookupStatus.ABSENT and capabilities.absent_is_final
        )
        if landed_never:
            return Proceed(state)
    detail = (
        f"action {proposal.action_id!r} proposes effect {effect}, whose earlier attempt "
        f"{known.action_id!r} (key {known.idempotency_key}) has an unknown outcome and cannot be "
        "settled by its key: sending it again could be a second effect. A person decides: "
        "abort, or replan after a signed fork (`tether fork`) if it must happen again."
    )
    charged = state.evolve(spent=_charged(state.spent, proposals=1))
    return park(
        charged,
        case_id=case_id,
        reason=REPLAY_OF_UNKNOWN,
        detail=detail,
        now=now,
        live=live,
        evidence=(
            {
                "kind": REPLAY_OF_UNKNOWN,
                "effect_digest": effect,
                "action_id": proposal.action_id,
                "earlier_action_id": known.action_id,
                "earlier_idempotency_key": known.idempotency_key,
                "earlier_intent_digest": known.intent_digest,
            },
        ),
    )


def _replayed(
    state: RunState,
    proposal: Proposal,
    effect: str,
    known: KnownEffect,
    receipt: dict[str, Any],
    fingerprint: str,
    settled_by: str,
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
        "settled_by": settled_by,
    }
    result = ActionResult(
        action_id=proposal.action_id,
        kind=proposal.kind,
        target=proposal.target,
        outcome=OutcomeKind.REPLAYED.value,
        reason="effect_replayed",
        data={
            **facts,
            "business_object_id": receipt.get("business_object_id"),
            "result": receipt.get("result"),
            "message": f"this effect already happened (action {known.action_id!r}); nothing was "
            "sent again. Doing it again needs a signed fork.",
        },
    )
    after, blobs = _with_result(state.evolve(spent=_charged(state.spent, proposals=1)), result)
    return Transition(
        OutcomeKind.REPLAYED,
        state=after,
        events=(("effect_replayed", {"action_id": proposal.action_id, **facts}),),
        blobs=blobs,
        reason="effect_replayed",
        message=f"effect {effect} already committed as receipt {facts['receipt_id']}; replayed",
    )


# -- forks ---------------------------------------------------------------------

FORK_FIELDS = (
    "kind", "signer_id", "task_id", "run_id", "policy_version", "effect_digest", "receipt_id",
    "receipt_fingerprint", "idempotency_key", "issued_at", "expires_at", "nonce",
)  # fmt: skip


def fork_request(state: RunState, known: KnownEffect) -> dict[str, Any]:
    """The fields a fork of ``known`` (the effect's current attempt) must carry."""
    return {
        "kind": "fork",
        "task_id": state.binding.task_id,
        "run_id": state.run_id,
        "policy_version": state.binding.policy_version,
        "effect_digest": known.effect_digest,
        "receipt_id": known.receipt_id,
        "receipt_fingerprint": known.receipt_fingerprint,
        "idempotency_key": known.idempotency_key,
    }


def new_fork(
    state: RunState,
    known: KnownEffect,
    signer_id: str,
    *,
    issued_at: datetime,
    expires_at: datetime,
    nonce: str,
) -> dict[str, Any]:
    """The body a reviewer or operator signs to do ``known``'s effect once more."""
    return {
        **fork_request(state, known),
        "signer_id": signer_id,
        "issued_at": format_time(issued_at),
        "expires_at": format_time(expires_at),
        "nonce": nonce,
    }


def check_fork(
    body: dict[str, Any],
    signer_id: str,
    state: RunState,
    known: Mapping[str, EffectHistory],
    *,
    now: datetime,
    ttl_s: int,
) -> str:
    """Refuse a fork that is malformed, mis-bound, expired or replayed; its effect digest."""
    missing = [f for f in FORK_FIELDS if f not in body]
    extra = sorted(set(body) - set(FORK_FIELDS))
    if missing or extra:
        raise EvidenceSignatureError(
            f"fork body has missing fields {missing} or unknown fields {extra}"
        )
    if body["signer_id"] != signer_id:
        raise EvidenceBindingError("signer_id", signer_id, body["signer_id"])
    effect = body["effect_digest"]
    record = known.get(effect) if isinstance(effect, str) else None
    current = None if record is None else record.current
    if current is None:
        raise EvidenceBindingError("effect_digest", "an effect this run's ledger records", effect)
    for name, want in fork_request(state, current).items():
        have = body.get(name)
        if have != want or type(have) is not type(want):
            raise EvidenceBindingError(name, want, have)
    check_lifetime(body, now=now, ttl_s=ttl_s)
    check_nonce(body, frozenset(state.fork_nonces))
    if effect in state.forks:
        raise NonceReusedError(f"a fork of effect {effect} is already armed and unused")
    return str(effect)


def record_fork(
    state: RunState, body: dict[str, Any], evidence_digest: str | None, *, cursor: int
) -> Transition:
    """A verified fork arms its effect digest for one new execution; its nonce is spent."""
    effect = str(body["effect_digest"])
    return Transition(
        OutcomeKind.RECORDED,
        state=state.evolve(
            forks=(*state.forks, effect),
            fork_nonces=(*state.fork_nonces, str(body["nonce"])),
            inbox_cursor=max(state.inbox_cursor, cursor),
        ),
        events=(
            (
                "fork_recorded",
                {
                    "signer_id": body["signer_id"],
                    "effect_digest": effect,
                    "receipt_id": body["receipt_id"],
                    "idempotency_key": body["idempotency_key"],
                    "nonce": body["nonce"],
                    "expires_at": body["expires_at"],
                    "evidence_digest": evidence_digest,
                },
            ),
        ),
        reason="fork_recorded",
    )
