"""The effect ledger: one hash chain per run, pinned by the signed state.

Each entry's hash covers the previous head and the entry's canonical body,
exactly like the trace. The checkpoint carries the head and the length, so
a forged, deleted, reordered or edited entry no longer chains to the head
the runtime signed and restore refuses it. Entries are written only inside
the fenced commit of the checkpoint they belong to: a stale worker whose
commit is refused leaves no entry behind.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from tether.core._canonical import JSONValue
from tether.core._errors import CanonicalJSONError, LedgerIntegrityError
from tether.core._model import format_time
from tether.core._phases import EffectStatus
from tether.core._trace import chain_hash


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """One status of one external effect. Entries are appended, never changed."""

    run_id: str
    idempotency_key: str
    seq: int
    status: EffectStatus
    action_id: str
    intent_digest: str
    receipt: dict[str, Any] | None
    epoch: int
    at: datetime
    prev_hash: str = ""
    hash: str = ""

    def body(self) -> dict[str, JSONValue]:
        return {
            "run_id": self.run_id,
            "seq": self.seq,
            "idempotency_key": self.idempotency_key,
            "status": self.status.value,
            "action_id": self.action_id,
            "intent_digest": self.intent_digest,
            "receipt": self.receipt,
            "epoch": self.epoch,
            "at": format_time(self.at),
        }

    def to_json(self) -> dict[str, JSONValue]:
        return {**self.body(), "prev_hash": self.prev_hash, "hash": self.hash}


def seal_entry(
    run_id: str,
    seq: int,
    prev_hash: str,
    *,
    idempotency_key: str,
    status: EffectStatus,
    action_id: str,
    intent_digest: str,
    receipt: dict[str, Any] | None,
    epoch: int,
    at: datetime,
) -> LedgerEntry:
    """The next entry of a chain whose head is ``prev_hash``."""
    entry = LedgerEntry(
        run_id, idempotency_key, seq, status, action_id, intent_digest, receipt, epoch, at
    )
    return LedgerEntry(
        run_id,
        idempotency_key,
        seq,
        status,
        action_id,
        intent_digest,
        receipt,
        epoch,
        at,
        prev_hash,
        chain_hash(prev_hash, entry.body()),
    )


def verify_ledger(
    run_id: str,
    rows: Iterable[LedgerEntry],
    head: str,
    length: int,
    genesis: str,
    *,
    orphans_possible: bool,
) -> tuple[list[LedgerEntry], list[LedgerEntry]]:
    """``(chain, strays)``: the chain ending at ``head`` oldest first, and rows off it.

    ``rows`` is everything the store holds for the run. Every entry on the
    chain must hash to itself and link to its predecessor, and the chain must
    be exactly ``length`` long and end at genesis, or this raises
    :class:`LedgerIntegrityError`. A row off the chain is a forgery unless
    ``orphans_possible`` (content and mark in separate stores, where a crash
    between the two leaves the rows of a commit that never landed); then the
    strays are returned, for the caller to prove each one an orphan with
    :func:`orphans_of`.
    """

    def broken(problem: str) -> LedgerIntegrityError:
        return LedgerIntegrityError(f"run {run_id}: effect ledger {problem}", run_id=run_id)

    by_hash: dict[str, LedgerEntry] = {}
    for row in rows:
        if row.run_id != run_id:
            raise broken(f"holds an entry of run {row.run_id!r}")
        if row.hash in by_hash:
            raise broken(f"holds entry {row.hash} twice")
        by_hash[row.hash] = row
    chain: list[LedgerEntry] = []
    cursor = head
    while cursor != genesis:
        if len(chain) >= length:
            raise broken(f"is longer than the {length} entries the checkpoint signed")
        entry = by_hash.pop(cursor, None)
        if entry is None:
            raise broken(f"lacks entry {cursor} (deleted or never written)")
        try:
            recomputed = chain_hash(entry.prev_hash, entry.body())
        except (CanonicalJSONError, ValueError) as exc:
            raise broken(f"entry {entry.seq} cannot be hashed: {exc}") from exc
        if recomputed != entry.hash:
            raise broken(f"entry {entry.seq} was altered (its hash does not match its content)")
        if entry.seq != length - len(chain):
            raise broken(f"entry {entry.hash} is out of order (seq {entry.seq})")
        chain.append(entry)
        cursor = entry.prev_hash
    if len(chain) != length:
        raise broken(f"has {len(chain)} entries on its chain; the checkpoint signed {length}")
    strays = sorted(by_hash.values(), key=lambda e: (e.seq, e.hash))
    if strays and not orphans_possible:
        raise stray_error(run_id, strays[0])
    chain.reverse()
    return chain, strays


def stray_error(run_id: str, stray: LedgerEntry) -> LedgerIntegrityError:
    """The error for a row that no signed head reaches."""
    return LedgerIntegrityError(
        f"run {run_id}: effect ledger holds entry seq {stray.seq} ({stray.status.value} for key "
        f"{stray.idempotency_key}) that is not on the signed chain",
        run_id=run_id,
    )


def orphans_of(strays: Iterable[LedgerEntry], heads: Iterable[str], genesis: str) -> set[str]:
    """Hashes of the strays reachable from ``heads`` (ledger heads of signed, unlanded checkpoints)."""
    by_hash = {e.hash: e for e in strays}
    reached: set[str] = set()
    for head in heads:
        cursor = head
        while cursor != genesis and cursor in by_hash and cursor not in reached:
            reached.add(cursor)
            cursor = by_hash[cursor].prev_hash
    return reached
