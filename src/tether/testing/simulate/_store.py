"""The real SQLite store, on simulated time, with crash points around every commit.

The lease clock is SQL (``clock_sql``); here it calls a Python function
registered on the connection, so leases expire when the simulated clock
says so. :meth:`SimStore.commit` can be armed to die BEFORE the commit (nothing
lands) or AFTER it landed but before the caller hears: both raise
:class:`~tether.runtime.SimulatedCrash`, and the simulator throws the
session away, as a process that died.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, TypeVar

from tether.core import LedgerEntry
from tether.runtime import CrashPoint, SimulatedCrash
from tether.store import Mark, SQLiteStore
from tether.store._history_sql import LEDGER_COLUMNS
from tether.store._rows import ledger_entry_of

T = TypeVar("T")


class SimStore(SQLiteStore):
    """One worker's connection to the shared simulated database."""

    clock_sql = "sim_now_us()"

    def __init__(
        self, path: str | os.PathLike[str], micros: Any, writes: list[int] | None = None
    ) -> None:
        #: Write units begun on the database by every store sharing this counter (all of
        #: one simulation's connections): while it stands still, nothing in it changed.
        self.writes = writes if writes is not None else [0]
        #: run id -> (the counter when its mark was read, the mark): see :meth:`read_mark`.
        self._marks: dict[str, tuple[int, Mark | None]] = {}
        super().__init__(path, synchronous="OFF")
        self._conn.create_function("sim_now_us", 0, micros)
        #: "before" or "after": the next commit dies there; None: it does not.
        self.crash_at: str | None = None
        self.commits = 0

    def _unit(self, body: Callable[[], T], *, write: bool, transaction: bool = True) -> T:
        if not write:
            return super()._unit(body, write=write, transaction=transaction)
        self.writes[0] += 1
        try:
            return super()._unit(body, write=write, transaction=transaction)
        finally:
            self.writes[0] += 1

    def read_mark(self, run_id: str) -> Mark | None:
        """``get_mark(run_id)``, read again only if some store of the simulation wrote since.

        Every writer of the simulated database is a store sharing :attr:`writes`, and a
        mark is only its row: no write since the last read, the same mark.
        """
        seen = self._marks.get(run_id)
        if seen is not None and seen[0] == self.writes[0]:
            return seen[1]
        mark = self.get_mark(run_id)
        self._marks[run_id] = (self.writes[0], mark)
        return mark

    def commit(self, commit: Any, *args: Any, **kwargs: Any) -> Any:
        armed, self.crash_at = self.crash_at, None
        if armed == "before":
            raise SimulatedCrash(CrashPoint.CHECKPOINT_WRITE)
        lease = super().commit(commit, *args, **kwargs)
        self.commits += 1
        if armed == "after":
            raise SimulatedCrash(CrashPoint.CHECKPOINT_WRITE)
        return lease

    def ledger_shape(self, run_id: str) -> tuple[Any, ...] | None:
        """What the judge reads of the run's ledger rows, as SQLite sums it up in one probe:
        their number, the newest row, and every (key, seq, status). Equal shapes, equal rows
        (rows are only ever inserted): the ledger need not be read back and parsed again."""
        return self._read(
            lambda: self._one(
                "SELECT count(*), max(rowid), group_concat(idempotency_key || ' ' || seq || ' ' "
                "|| status, ',') FROM tether_ledger WHERE run_id = ?",
                (run_id,),
            )
        )

    def ledger_after(self, run_id: str, rowid: int) -> list[LedgerEntry]:
        """The run's ledger rows inserted after row ``rowid``, read back as ``ledger`` reads
        every row (the same columns, the same checks), in insertion order."""
        rows = self._read(
            lambda: self._all(
                f"SELECT {LEDGER_COLUMNS} FROM tether_ledger WHERE run_id = ? AND rowid > ? "
                "ORDER BY rowid",
                (run_id, rowid),
            )
        )
        return [ledger_entry_of(run_id, row) for row in rows]
