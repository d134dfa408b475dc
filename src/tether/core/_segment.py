"""A stretch of a hash chain below its signed head, checked without the rest of it.

The signed checkpoint pins each chain (the trace, the effect ledger) by its
head hash and its length. Every row's hash covers its content and the hash
of the row before it, so the rows reached from the head by their links,
each hashing to its own content and carrying the seq its place says, are
exactly the rows the runtime signed: nothing below needs reading to trust
them. :func:`walk_down` checks one such stretch, from a row already proven
(the head, or the lowest row of an earlier stretch) down to a floor.

What a stretch does not show is damage below its floor: a row edited,
deleted or reordered further down is found by the walk that reaches it, and
by ``tether verify``, which walks from the head to genesis.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from tether.core._errors import CanonicalJSONError, IntegrityError
from tether.core._trace import chain_hash


class ChainRow(Protocol):
    """What a walk needs of a trace event or a ledger entry."""

    @property
    def seq(self) -> int: ...

    @property
    def hash(self) -> str: ...

    @property
    def prev_hash(self) -> str: ...

    def body_bytes(self) -> bytes: ...


Row = TypeVar("Row", bound=ChainRow)


@dataclass(frozen=True, slots=True)
class Stretch(Generic[Row]):
    """Rows proven on a chain, newest first, and the rows beside them that are not.

    ``link`` is the ``prev_hash`` of the lowest row proven (the hash the row
    below it must have); ``strays`` are rows the caller fetched in the same
    seq range that the chain does not pass through.
    """

    chain: tuple[Row, ...]
    strays: tuple[Row, ...]
    link: str


def walk_down(
    rows: Iterable[Row],
    *,
    top: str,
    top_seq: int,
    floor: int,
    genesis: str,
    broken: Callable[[str], IntegrityError],
) -> Stretch[Row]:
    """The chain from ``top`` (the row at ``top_seq``, already trusted) down to seq ``floor``.

    ``rows`` are the rows the store holds in that range (more are fine).
    Each row on the way must hash to its own content and carry the seq its
    place says; a row missing on the way, or a hash that does not match,
    raises ``broken(problem)``. The walk stops at ``floor`` (inclusive) or at
    genesis, whichever comes first; genesis before seq 0 is a break.
    """
    by_hash: dict[str, Row] = {}
    for row in rows:
        if row.hash in by_hash:
            raise broken(f"holds entry {row.hash} twice")
        by_hash[row.hash] = row
    chain: list[Row] = []
    cursor, expected = top, top_seq
    while expected >= max(floor, 1):
        if cursor == genesis:
            raise broken(f"reaches genesis at seq {expected}; the checkpoint signed more")
        found = by_hash.pop(cursor, None)
        if found is None:
            raise broken(f"lacks entry {cursor} (deleted or never written)")
        row = found
        if not hashes_to_itself(row):
            raise broken(f"entry {row.seq} was altered (its hash does not match its content)")
        if row.seq != expected:
            raise broken(f"entry {row.hash} is out of order (seq {row.seq}, not {expected})")
        chain.append(row)
        cursor, expected = row.prev_hash, expected - 1
    if expected == 0 and cursor != genesis:
        raise broken(f"does not begin at genesis (its first entry follows {cursor})")
    low = max(floor, 1)
    strays = tuple(
        sorted(
            (r for r in by_hash.values() if low <= r.seq <= top_seq),
            key=lambda r: (r.seq, r.hash),
        )
    )
    return Stretch(tuple(chain), strays, cursor)


def hashes_to_itself(row: ChainRow) -> bool:
    """Whether ``row``'s hash is the hash of its content after its ``prev_hash``."""
    try:
        return chain_hash(row.prev_hash, row.body_bytes()) == row.hash
    except (CanonicalJSONError, ValueError):
        return False  # content that cannot be encoded cannot be what was signed
