"""Ledger entries: what each records about its effect, and which rows still verify."""

from __future__ import annotations

import re
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest

from tether.core import (
    Compensation,
    EffectStatus,
    EffectTerms,
    LedgerEntry,
    LedgerIntegrityError,
    RetrySemantics,
)
from tether.core._ledger import seal_entry, verify_ledger
from tether.core._state import GENESIS_HASH

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


def chain_of_two() -> tuple[LedgerEntry, LedgerEntry]:
    """An intent and its dispatch, chained from genesis: what a signed head of length 2 pins."""
    first = entry(1, GENESIS_HASH, EffectStatus.INTENDED)
    return first, entry(2, first.hash, EffectStatus.DISPATCHED)


def test_the_signed_chain_verifies_oldest_first_with_no_strays() -> None:
    """Rows in any order that chain exactly to the signed head come back oldest first, no strays."""
    first, second = chain_of_two()
    chain, strays = verify_ledger(
        "run", [second, first], second.hash, 2, GENESIS_HASH, orphans_possible=False
    )
    assert (chain, strays) == ([first, second], [])


def test_a_row_off_the_signed_chain_is_refused_by_core_alone() -> None:
    """A sealed row no signed head reaches is a forgery when content and mark commit together."""
    first, second = chain_of_two()
    # Well formed, chained to a real entry, even the next seq: only the signed head says it is not ours.
    forged = entry(3, second.hash, EffectStatus.COMMITTED, receipt=RECEIPT)
    with pytest.raises(LedgerIntegrityError, match="not on the signed chain"):
        verify_ledger(
            "run", [first, second, forged], second.hash, 2, GENESIS_HASH, orphans_possible=False
        )
    # Content and mark in separate stores: the stray is handed back, for the caller to prove.
    chain, strays = verify_ledger(
        "run", [first, second, forged], second.hash, 2, GENESIS_HASH, orphans_possible=True
    )
    assert (chain, strays) == ([first, second], [forged])


def _rows(case: str) -> tuple[list[LedgerEntry], str, int]:
    """``(rows, head, length)`` for one way a ledger can disagree with its signed head."""
    first, second = chain_of_two()
    if case == "deleted":
        return [second], second.hash, 2
    if case == "altered":
        return [first, replace(second, action_id="a2")], second.hash, 2
    if case == "shorter than signed":
        # Its seq fits a chain of two, but it links straight to genesis: one entry is missing.
        cut = entry(2, GENESIS_HASH, EffectStatus.DISPATCHED)
        return [cut], cut.hash, 2
    if case == "out of order":
        renumbered = entry(5, first.hash, EffectStatus.DISPATCHED)
        return [first, renumbered], renumbered.hash, 2
    if case == "another run's row":
        return [first, second, replace(second, run_id="other")], second.hash, 2
    if case == "a row twice":
        return [first, second, second], second.hash, 2
    raise AssertionError(case)


@pytest.mark.parametrize(
    ("case", "says"),
    [
        ("deleted", "lacks entry"),
        ("altered", "was altered"),
        ("shorter than signed", "has 1 entries on its chain; the checkpoint signed 2"),
        ("out of order", "out of order"),
        ("another run's row", "holds an entry of run 'other'"),
        ("a row twice", "twice"),
    ],
)
def test_a_ledger_that_disagrees_with_its_signed_head_is_refused(case: str, says: str) -> None:
    """Every way rows can differ from the chain the checkpoint signed raises, even with orphans possible."""
    rows, head, length = _rows(case)
    with pytest.raises(LedgerIntegrityError, match=re.escape(says)):
        verify_ledger("run", rows, head, length, GENESIS_HASH, orphans_possible=True)
