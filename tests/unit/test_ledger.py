"""Ledger entries: what each records about its effect, and which rows still verify."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest

from tether.core import (
    GENESIS_HASH,
    Compensation,
    EffectStatus,
    EffectTerms,
    LedgerEntry,
    LedgerIntegrityError,
    RetrySemantics,
    seal_entry,
    verify_ledger,
)

AT = datetime(2026, 12, 4, tzinfo=UTC)
RECEIPT = {"receipt_id": "r1", "result": {"text": "Dear customer, ..."}}


def effect(*, sensitive: bool) -> EffectTerms:
    return EffectTerms(
        adapter="smtp",
        kind="email.send",
        target="customer@example.com",
        retry=RetrySemantics.NEITHER,
        compensation=Compensation.HUMAN,
        sensitive=sensitive,
    )


def entry(
    seq: int,
    prev: str,
    status: EffectStatus,
    *,
    terms: EffectTerms | None = None,
    payload: dict[str, Any] | None = None,
    receipt: dict[str, Any] | None = None,
) -> LedgerEntry:
    return seal_entry(
        "run",
        seq,
        prev,
        idempotency_key="k1",
        status=status,
        action_id="a1",
        intent_digest="sha256:" + "1" * 64,
        receipt=receipt,
        epoch=1,
        at=AT,
        terms=terms,
        payload=payload,
    )


def test_an_entry_without_terms_hashes_as_entries_always_did() -> None:
    """Rows written before terms existed keep their body, so older chains still verify."""
    old = entry(1, GENESIS_HASH, EffectStatus.INTENDED)
    assert "terms" not in old.body() and "payload" not in old.body()
    new = entry(2, old.hash, EffectStatus.DISPATCHED, terms=effect(sensitive=False))
    assert new.body()["terms"] == effect(sensitive=False).to_json()
    chain, strays = verify_ledger(
        "run", [new, old], new.hash, 2, GENESIS_HASH, orphans_possible=False
    )
    assert chain == [old, new] and strays == []


def test_a_sensitive_entry_keeps_digests_whatever_the_caller_passed() -> None:
    """Sealing under sensitive terms drops the payload and keeps only the result's digest."""
    sealed = entry(
        1,
        GENESIS_HASH,
        EffectStatus.COMMITTED,
        terms=effect(sensitive=True),
        payload={"body": "Dear customer, ..."},
        receipt=RECEIPT,
    )
    assert sealed.payload is None and sealed.receipt is not None
    assert sealed.receipt["receipt_id"] == "r1"
    assert sealed.receipt["result"]["redacted"] is True
    assert "Dear customer" not in str(sealed.to_json())
    plain = entry(
        1,
        GENESIS_HASH,
        EffectStatus.COMMITTED,
        terms=effect(sensitive=False),
        payload={"body": "Dear customer, ..."},
        receipt=RECEIPT,
    )
    assert plain.payload == {"body": "Dear customer, ..."} and plain.receipt == RECEIPT


def test_a_payload_added_to_an_entry_without_terms_fails_verify() -> None:
    """A row written before terms existed cannot gain a payload the chain does not cover."""
    old = entry(1, GENESIS_HASH, EffectStatus.INTENDED)
    forged = replace(old, payload={"to": "attacker@example.com", "body": "wire the money"})
    with pytest.raises(LedgerIntegrityError):
        verify_ledger("run", [forged], old.hash, 1, GENESIS_HASH, orphans_possible=False)
