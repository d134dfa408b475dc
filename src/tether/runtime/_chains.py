"""One chain of one run (its trace or its ledger), proven from the signed head down on demand.

A recovery reads the head rows and the rows of the write it must settle; a
step asks about one effect or one action id. :class:`ProvenChain` proves
exactly those rows on the chain the signed checkpoint pins, by walking from
the head down to them once (each row on the way hashes to its content, links
to the next, and carries the seq its place says), and remembers how far it
has walked: a later question about a row above that point reads nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

from tether.core import IntegrityError
from tether.core._segment import ChainRow, walk_down
from tether.core._state import GENESIS_HASH

Row = TypeVar("Row", bound=ChainRow)

#: Rows fetched per round trip while walking down.
BATCH = 512

Fetch = Callable[[str, int, int], Sequence[Row]]


class ProvenChain(Generic[Row]):
    """A chain pinned by ``head`` and ``length``, proven down to :attr:`floor` so far.

    ``fetch(link, low, high)`` returns the rows the store holds with
    ``low <= seq <= high`` whose chain ends at ``link`` (the hash of the
    row at ``high``): by seq range, strays included, or by links from
    ``link``. ``strays`` is handed the rows of a fetched range that the
    chain does not pass through (a forgery, or an orphan of a commit that
    never landed): it raises, or returns when it has proven them harmless.
    """

    def __init__(
        self,
        head: str,
        length: int,
        fetch: Fetch[Row],
        broken: Callable[[str], IntegrityError],
        strays: Callable[[Sequence[Row]], None] | None = None,
    ) -> None:
        self.head = head
        self.length = length
        self._fetch = fetch
        self._broken = broken
        self._strays = strays
        #: seq -> hash of every row proven so far.
        self.proven: dict[int, str] = {}
        #: Newest first: the rows proven so far.
        self.rows: list[Row] = []
        #: The lowest seq proven (``length + 1``: nothing yet).
        self.floor = length + 1
        self._link = head
        if length == 0 and head != GENESIS_HASH:
            raise broken("is empty, yet its head is not genesis")

    def down_to(self, seq: int) -> list[Row]:
        """Prove every row from the head down to ``seq`` (at least 1); the rows newly proven."""
        target = max(seq, 1)
        new: list[Row] = []
        while self.floor > target:
            high = self.floor - 1
            low = max(target, high - BATCH + 1)
            stretch = walk_down(
                self._fetch(self._link, low, high),
                top=self._link,
                top_seq=high,
                floor=low,
                genesis=GENESIS_HASH,
                broken=self._broken,
            )
            if stretch.strays:
                if self._strays is None:
                    raise self._broken(
                        f"holds entry seq {stretch.strays[0].seq} that is not on the signed chain"
                    )
                self._strays(stretch.strays)
            for row in stretch.chain:
                self.proven[row.seq] = row.hash
            new.extend(stretch.chain)
            self.rows.extend(stretch.chain)
            self.floor, self._link = low, stretch.link
        return new

    def step_down(self, rows: int = 2) -> list[Row]:
        """Prove the next ``rows`` rows below the floor (none left: an empty list).

        Two by default: an unsettled write's entries (``intended``, then
        ``dispatched``) sit right under the head.
        """
        if self.floor <= 1:
            return []
        return self.down_to(max(1, self.floor - rows))

    def check(self, row: Row) -> bool:
        """Whether ``row`` is on the chain; one in its range that is not goes to ``strays`` first.

        ``strays`` raises for a forgery, or returns (the row is set aside:
        ``False``) when it proved the row an orphan.
        """
        if self.on_chain(row):
            return True
        if 1 <= row.seq <= self.length:
            if self._strays is None:
                raise self._broken(f"holds entry seq {row.seq} that is not on the signed chain")
            self._strays([row])
        return False

    def on_chain(self, row: Row) -> bool:
        """Whether ``row`` is the chain's row at its seq (walking down to it if needed)."""
        if not 1 <= row.seq <= self.length:
            return False
        self.down_to(row.seq)
        return self.proven.get(row.seq) == row.hash
