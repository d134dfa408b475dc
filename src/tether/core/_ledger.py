"""The effect ledger: one hash chain per run, pinned by the signed state.

Each entry's hash covers the previous head and the entry's canonical body,
exactly like the trace. The checkpoint carries the head and the length, so
a forged, deleted, reordered or edited entry no longer chains to the head
the runtime signed and restore refuses it. Entries are written only inside
the fenced commit of the checkpoint they belong to: a stale worker whose
commit is refused leaves no entry behind.

Each entry also says what kind of effect it records (:class:`EffectTerms`):
the adapter that carries it out, its kind and target, what a retry under the
key can promise and how the effect could be undone. The first entry of an
effect (``intended``) keeps its arguments, unless the policy marks the kind
sensitive: then the ledger keeps digests only, of the arguments (the intent
digest) and of the result inside the receipt.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from tether.core._canonical import (
    JSONValue,
    canonical_bytes,
    digest,
    object_bytes,
    part_bytes,
    scalar_bytes,
)
from tether.core._errors import CanonicalJSONError, LedgerIntegrityError
from tether.core._model import Capabilities, format_time
from tether.core._phases import Compensation, EffectStatus, RetrySemantics
from tether.core._trace import chain_hash


@dataclass(frozen=True, slots=True)
class EffectTerms:
    """What one effect is, for the ledger: who carries it out and what it can promise.

    ``adapter`` is the namespace of the adapter that owns ``kind``;
    ``retry`` and ``compensation`` are what that adapter declares; with
    ``sensitive`` (the policy's word) the ledger keeps no payload body.
    """

    adapter: str
    kind: str
    target: str
    retry: RetrySemantics
    compensation: Compensation
    sensitive: bool = False
    #: The effect digest (``tether.core.effect_digest``): what the effect does,
    #: whatever its action id, key or prose; a re-proposal equal to a committed
    #: effect is replayed, not sent. ``None`` on entries written before it existed.
    effect: str | None = None

    @property
    def target_key(self) -> str:
        """What the effect acts on, as a digest of (namespace, kind, target).

        The store indexes committed entries by it, so the replay rule learns
        whether another effect was committed on a target since (A, B, A)
        without reading the run's history.
        """
        return target_digest(self.adapter, self.kind, self.target)

    def to_json(self) -> dict[str, JSONValue]:
        body: dict[str, JSONValue] = {
            "adapter": self.adapter,
            "kind": self.kind,
            "target": self.target,
            "retry": self.retry.value,
            "compensation": self.compensation.value,
            "sensitive": self.sensitive,
        }
        # Only when known, so the hashes of entries written before keep verifying.
        if self.effect is not None:
            body["effect"] = self.effect
        return body


# Asked of every committed row written and read back (its index column is checked
# against it); a run's targets are few and repeat, so their digests are kept.
@functools.lru_cache(maxsize=1024)
def target_digest(namespace: str, kind: str, target: str) -> str:
    """The digest two effects share exactly when they act on the same target."""
    return digest({"namespace": namespace, "kind": kind, "target": target})


def retry_semantics(capabilities: Capabilities) -> RetrySemantics:
    """The strongest retry promise ``capabilities`` make (idempotent before queryable)."""
    if capabilities.idempotent:
        return RetrySemantics.IDEMPOTENT
    if capabilities.queryable:
        return RetrySemantics.QUERYABLE
    return RetrySemantics.NEITHER


def redact_receipt(receipt: dict[str, Any] | None) -> dict[str, Any] | None:
    """``receipt`` with its ``result`` replaced by the result's digest (for sensitive kinds)."""
    if receipt is None or "result" not in receipt:
        return receipt
    return {**receipt, "result": {"redacted": True, "digest": digest(receipt["result"])}}


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
    #: ``None`` only on entries written before the ledger recorded terms.
    terms: EffectTerms | None = None
    #: The effect's arguments, on its ``intended`` entry, unless sensitive.
    payload: dict[str, Any] | None = None
    # The canonical bytes of body() as sealed: set by seal_entry only, and not
    # an __init__ argument, so dataclasses.replace() and rows read back start
    # without it and are encoded afresh (a changed entry never reuses it).
    _sealed_body: bytes = field(default=b"", init=False, compare=False, repr=False)
    # The receipt, terms and payload as JSON text, as sealed (set with _sealed_body).
    _sealed_columns: tuple[str | None, str | None, str | None] | None = field(
        default=None, init=False, compare=False, repr=False
    )

    def column_texts(self) -> tuple[str | None, str | None, str | None]:
        """The receipt, terms and payload as JSON text (``None`` when absent), as a store keeps them.

        Canonical when sealed here; any JSON of the same values would do, since
        a reader parses them and re-encodes canonically before hashing.
        """
        if self._sealed_columns is not None:
            return self._sealed_columns
        terms = None if self.terms is None else self.terms.to_json()
        return _text(self.receipt), _text(terms), _text(self.payload)

    def body_bytes(self) -> bytes:
        """The canonical bytes the hash covers (as sealed, or encoded now)."""
        return self._sealed_body or canonical_bytes(self.body())

    def body(self) -> dict[str, JSONValue]:
        body: dict[str, JSONValue] = {
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
        # An entry written before terms existed (neither terms nor payload)
        # hashes as it always did, so the chains of older runs still verify;
        # any other entry's hash covers both, so neither can be stripped from
        # a newer entry nor added to an older one.
        if self.terms is not None or self.payload is not None:
            body["terms"] = None if self.terms is None else self.terms.to_json()
            body["payload"] = self.payload
        return body

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
    terms: EffectTerms | None = None,
    payload: dict[str, Any] | None = None,
) -> LedgerEntry:
    """The next entry of a chain whose head is ``prev_hash``.

    With sensitive ``terms`` the payload is dropped and the receipt's result
    kept as a digest, whatever the caller passed.
    """
    if terms is not None and terms.sensitive:
        payload, receipt = None, redact_receipt(receipt)
    s = scalar_bytes
    members = {
        "run_id": s(run_id),
        "seq": s(seq),
        "idempotency_key": s(idempotency_key),
        "status": s(status.value),
        "action_id": s(action_id),
        "intent_digest": s(intent_digest),
        "receipt": canonical_bytes(receipt),
        "epoch": s(epoch),
        "at": s(format_time(at)),
    }
    if terms is not None or payload is not None:
        # As LedgerEntry.body() says: an entry with neither hashes as entries
        # written before terms existed.
        members["terms"] = b"null" if terms is None else part_bytes(terms, _terms_json)[0]
        members["payload"] = canonical_bytes(payload)
    body = object_bytes(members)
    if receipt is not None or payload is not None:
        # The entry keeps its own copies of the documents, read back from the
        # bytes its hash covers: a caller changing its dicts afterwards cannot
        # make the stored columns differ from what was sealed.
        sealed_doc = json.loads(body)
        receipt, payload = sealed_doc["receipt"], sealed_doc.get("payload")
    sealed = LedgerEntry(
        run_id,
        idempotency_key,
        seq,
        status,
        action_id,
        intent_digest,
        receipt,
        epoch,
        at,
        prev_hash=prev_hash,
        hash=chain_hash(prev_hash, body),
        terms=terms,
        payload=payload,
    )
    object.__setattr__(sealed, "_sealed_body", body)
    object.__setattr__(
        sealed,
        "_sealed_columns",
        (
            _column(members["receipt"]),
            _column(members.get("terms", b"null")),
            _column(members.get("payload", b"null")),
        ),
    )
    return sealed


def _column(data: bytes) -> str | None:
    return None if data == b"null" else data.decode("utf-8")


def _text(value: Any) -> str | None:
    return None if value is None else canonical_bytes(value).decode("utf-8")


def _terms_json(terms: EffectTerms) -> JSONValue:
    return terms.to_json()


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
