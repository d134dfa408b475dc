"""A commit sealed and held for the run's next one: a deferred receipt (see ``core.Durability``).

The session seals a deferred commit at once (its trace events and ledger
entries are chained; its state pins them) and keeps the rows here; the next
commit is sealed on top of that state and writes these rows first, in its
own fenced transaction. Until then the store holds the checkpoint before, on
which the run's write is still ``dispatched``: a crash in between is the
"effect sent, receipt not persisted" window, settled by asking the adapter.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from tether.core import LedgerEntry, RunState, TraceEvent
from tether.core._commit import Sealed


@dataclass(frozen=True, slots=True)
class Deferred:
    """The rows of commits sealed but not written, and the stored heads they follow."""

    events: tuple[TraceEvent, ...]
    entries: tuple[LedgerEntry, ...]
    blobs: Mapping[str, bytes]
    #: The trace head and length of the state the store holds (the last one written).
    stored_head: str
    stored_length: int

    @classmethod
    def after(
        cls, prior: Deferred | None, before: RunState, sealed: Sealed, blobs: Mapping[str, bytes]
    ) -> Deferred:
        """``prior`` (if any) and then ``sealed``, the commit sealed on ``before``."""
        if prior is None:
            return cls(
                sealed.events, sealed.entries, dict(blobs), before.trace_head, before.trace_length
            )
        return cls(
            (*prior.events, *sealed.events),
            (*prior.entries, *sealed.entries),
            {**prior.blobs, **blobs},
            prior.stored_head,
            prior.stored_length,
        )

    def trace(self, read: Callable[[str, int], list[TraceEvent]], limit: int) -> list[TraceEvent]:
        """The newest ``limit`` trace events, oldest first: the stored ones read by ``read(head,
        limit)``, then these (a reader sees the deferred commit's events as the session does)."""
        mine = list(self.events)
        if limit <= len(mine):
            return mine[len(mine) - limit :]
        if self.stored_length == 0:
            return mine
        return [*read(self.stored_head, limit - len(mine)), *mine]
