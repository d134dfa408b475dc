"""Forks: doing an effect the ledger records once more, on purpose, under a signed document.

A reviewer's or operator's fork names the effect digest and the earlier
receipt (id, fingerprint, key), is alive now, and carries a one-time nonce
the checkpoint remembers (:func:`check_fork`); recorded, it arms its effect
digest for one new execution (:func:`record_fork`), which the replay rule
(:func:`tether.core._replay.judge`) then lets through as ``forked``.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from tether.core._errors import EvidenceBindingError, EvidenceSignatureError, NonceReusedError
from tether.core._evidence import check_lifetime, check_nonce, consumed_nonces
from tether.core._model import format_time
from tether.core._phases import OutcomeReason
from tether.core._replay import EffectHistory, KnownEffect
from tether.core._state import RunState
from tether.core._transition import OutcomeKind, Transition

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
    check_nonce(body, consumed_nonces(state))  # one-time across every kind of document
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
        reason=OutcomeReason.FORK_RECORDED,
    )
