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
import shutil
import tempfile
import weakref
from collections.abc import Callable
from pathlib import Path
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
    # Its rows live for one simulation: deflating them (about 5% of a seed) buys nothing
    # here. Readers take plain and deflated rows alike; the codec's own tests and every
    # other store write deflated rows.
    deflate = False

    def __init__(
        self, path: str | os.PathLike[str], micros: Any, writes: list[int] | None = None
    ) -> None:
        self._bind(micros, writes)
        super().__init__(path, synchronous="OFF")
        # Through a method, so a connection reused by the next simulation reads its clock
        # (defining the function again would make SQLite prepare every statement anew).
        self._conn.create_function("sim_now_us", 0, self._now_us)

    def _bind(self, micros: Any, writes: list[int] | None) -> None:
        self._micros = micros
        #: Write units begun on the database by every store sharing this counter (all of
        #: one simulation's connections): while it stands still, nothing in it changed.
        self.writes = writes if writes is not None else [0]
        #: run id -> (the counter when its mark was read, the mark): see :meth:`read_mark`.
        self._marks: dict[str, tuple[int, Mark | None]] = {}
        #: "before" or "after": the next commit dies there; None: it does not.
        self.crash_at: str | None = None
        self.commits = 0

    @property
    def busy(self) -> bool:
        """Whether a transaction is open on the connection."""
        return bool(self._conn.in_transaction)

    def _now_us(self) -> int:
        return int(self._micros())

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


class SimDatabase:
    """One simulated database file and the connections left open on it, lent to one
    simulation after another: emptied back to the template's rows in between.

    Opening a connection, preparing each statement on it again and closing it (the
    last close folding the WAL into a file about to be deleted) cost about a sixth
    of a seed. Each simulation still starts on a database holding exactly the rows
    of a freshly migrated one, through connections no unit of work is open on.
    """

    def __init__(self) -> None:
        directory = tempfile.mkdtemp(prefix="tether-sim-", dir=_tmp_root())
        self.path = Path(directory) / "sim.sqlite"
        #: The process that opened it (a forked child must not use its connections).
        self.pid = os.getpid()
        # Removed when dropped or at exit, by this process only (not by a forked child).
        self._remove = weakref.finalize(self, _remove, directory, self.pid)
        # Migrated here, closed (the WAL folded in): the template every simulation starts from.
        SQLiteStore(self.path, synchronous="OFF").close()
        self._stores: list[SimStore] = []
        self._lent = 0
        first = self.store(lambda: 0, None)
        tables = [
            str(row[0])
            for row in first.read(
                lambda q: q.all(
                    "SELECT name FROM sqlite_master WHERE type = 'table' "
                    "AND name NOT LIKE 'sqlite%' ORDER BY name"
                )
            )
        ]

        def rows(q: Any) -> dict[str, list[tuple[Any, ...]]]:
            return {t: q.all(f"SELECT * FROM {t} ORDER BY rowid") for t in tables}

        #: Every table's rows in the template (the migrations applied, the turn counter).
        self._template = first.read(rows)
        self._lent = 0

    def store(self, micros: Any, writes: list[int] | None) -> SimStore:
        """The next connection for the simulation borrowing the database, on its clock."""
        if self._lent == len(self._stores):
            self._stores.append(SimStore(self.path, micros, writes))
        else:
            self._stores[self._lent]._bind(micros, writes)
        self._lent += 1
        return self._stores[self._lent - 1]

    def reset(self) -> None:
        """Every table back to the template's rows, for the next simulation."""
        self._lent = 0

        def empty(q: Any) -> None:
            for table, rows in self._template.items():
                q.run(f"DELETE FROM {table}")
                for row in rows:
                    q.run(f"INSERT INTO {table} VALUES ({', '.join('?' * len(row))})", row)

        self._stores[0].transaction(empty)

    def close(self) -> None:
        for store in self._stores:
            store.close()
        self._remove()


#: Databases no simulation holds now, by process (see :class:`SimDatabase`).
_IDLE: dict[int, list[SimDatabase]] = {}


def borrow() -> SimDatabase:
    """A database for one simulation: an idle one of this process, or a new one."""
    try:
        return _IDLE.get(os.getpid(), []).pop()
    except IndexError:
        return SimDatabase()


def give_back(database: SimDatabase, *, clean: bool) -> None:
    """Return ``database`` after a simulation; ``clean``: it ended normally (every unit of
    work closed), so it is emptied for the next one; otherwise it is thrown away."""
    # (A unit of work left open would carry into the next simulation: never reused then.)
    if clean and not any(store.busy for store in database._stores):
        try:
            database.reset()
        except BaseException:
            database.close()
            raise
    else:
        database.close()
        return
    _IDLE.setdefault(database.pid, []).append(database)


def _remove(directory: str, pid: int) -> None:
    if os.getpid() == pid:
        shutil.rmtree(directory, ignore_errors=True)


def _tmp_root() -> str | None:
    """A RAM-backed directory where the machine has one (the database is throwaway)."""
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() else None
