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
from typing import Any

from tether.runtime import CrashPoint, SimulatedCrash
from tether.store import SQLiteStore


class SimStore(SQLiteStore):
    """One worker's connection to the shared simulated database."""

    clock_sql = "sim_now_us()"

    def __init__(self, path: str | os.PathLike[str], micros: Any) -> None:
        super().__init__(path, synchronous="OFF")
        self._conn.create_function("sim_now_us", 0, micros)
        #: "before" or "after": the next commit dies there; None: it does not.
        self.crash_at: str | None = None
        self.commits = 0

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
