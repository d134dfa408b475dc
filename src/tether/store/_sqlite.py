"""SQLiteStore: the embedded default.

Opened for safe concurrency between processes: WAL journal, ``synchronous``
FULL unless the caller asks otherwise, ``BEGIN IMMEDIATE`` on every write
path (so two writers serialize instead of failing at commit), a busy
timeout, and foreign keys on.

``BEGIN IMMEDIATE`` takes the database's one write lock up front, so every
write transaction (a CAS, a lease grant, a claim scan followed by its
updates) runs alone: no row locks or retries are needed. The store clock is
SQLite's own ``julianday('now')``; processes on one machine share it.

A run open without a lease is held for its process by a ``flock`` on a file
of its own in ``<database>-locks/`` (see ``_runlock``).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tether.core import (
    CheckpointCorruptError,
    MigrationError,
    StoreError,
    StoreUnavailableError,
    TetherError,
    WriteOnceError,
)
from tether.store._engine import value_rows
from tether.store._group import GroupCommit
from tether.store._runlock import HoldsRuns, NoLock, ProcessLock
from tether.store._schema import ACTION_KINDS, kinds_sql, migrations
from tether.store._sql import SQLBase

_SYNCHRONOUS = {"OFF", "NORMAL", "FULL", "EXTRA"}
_UNDECODABLE = "Could not decode to UTF-8"
_SQLITE_CORRUPT = 11  # sqlite3.SQLITE_CORRUPT, named in the module only from Python 3.11


class SQLiteStore(SQLBase, HoldsRuns):
    """Checkpoint content and the generation mark in one SQLite file (or either alone)."""

    # Integer microseconds since the epoch; julianday('now') is stable within a statement.
    clock_sql = "CAST((julianday('now') - 2440587.5) * 86400000000.0 AS INTEGER)"
    # SQLite keeps whatever it is given, in any column, and text that is not
    # UTF-8 too: integers and NULL come back as they are, anything else as bytes.
    raw_column = "CASE WHEN typeof({0}) IN ('integer', 'null') THEN {0} ELSE CAST({0} AS BLOB) END"
    # Rows from before migration 10: their keys read from their JSON (a row that
    # is not JSON, or names no such string, keeps NULL, as a new one would).
    index_backfill = (
        "UPDATE tether_ledger SET effect = replace(json_extract(terms, '$.effect'), "
        "char(0), char(65533)) WHERE CASE WHEN json_valid(terms) "
        "THEN json_type(terms, '$.effect') = 'text' ELSE 0 END",
        "UPDATE tether_trace SET action_id = replace(json_extract(data, '$.action_id'), "
        f"char(0), char(65533)) WHERE {kinds_sql(ACTION_KINDS)} AND CASE WHEN json_valid(data) "
        "THEN json_type(data, '$.action_id') = 'text' ELSE 0 END",
    )

    # A claim names its index. tether never runs ANALYZE on a SQLite file, and without
    # statistics SQLite reads a claim by tether_marks_phase and sorts every unfinished
    # run, parked ones too; with them, a claim of suspects went by tether_marks_due.
    # INDEXED BY is SQLite's own way of saying "this query uses this index": the
    # statement fails ("no query solution") rather than quietly reading otherwise.
    index_hint = " INDEXED BY {}"

    # No sequences: migration 12's turn counter is a table of one row. A grant reads
    # the next value and moves the counter on only once it granted something
    # (an idle claim must write nothing); writers are serialized by BEGIN IMMEDIATE.
    turn_sql = "(SELECT n + 1 FROM tether_turns)"
    turn_counter = (
        "CREATE TABLE tether_turns (id INTEGER PRIMARY KEY CHECK (id = 1), n INTEGER NOT NULL)",
        "INSERT INTO tether_turns (id, n) VALUES (1, 0)",
    )

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        synchronous: str = "FULL",
        busy_timeout_ms: int = 30_000,
        read_only: bool = False,
        create: bool = True,
    ) -> None:
        super().__init__()
        # One connection per store object, shared by its threads one unit of work at a time.
        self._lock = threading.RLock()
        # Commits from many threads (a worker driving many runs) that wait for the
        # connection meanwhile are written together: one transaction, one fsync.
        self._group = GroupCommit(self)
        mode = synchronous.upper()
        if mode not in _SYNCHRONOUS:
            raise StoreError(
                f"synchronous must be one of {sorted(_SYNCHRONOUS)}, not {synchronous!r}"
            )
        self.path = Path(path)
        self.read_only = read_only
        # Resolved now (a later chdir must not move the run locks away from the
        # database), and through symlinks: every name of one file shares its locks.
        resolved = self.path.resolve()
        self._locks = resolved.with_name(resolved.name + "-locks")
        if (read_only or not create) and not self.path.is_file():
            # Opening would create (and a migration fill) a database nobody asked for.
            raise StoreUnavailableError(f"no SQLite store at {str(self.path)!r}")
        try:
            if read_only:
                uri = f"{self.path.resolve().as_uri()}?mode=ro"
                self._conn = sqlite3.connect(
                    uri,
                    uri=True,
                    isolation_level=None,
                    timeout=busy_timeout_ms / 1000,
                    check_same_thread=False,
                )
                (journal,) = self._conn.execute("PRAGMA journal_mode").fetchone()
            else:
                self._conn = sqlite3.connect(
                    self.path,
                    isolation_level=None,
                    timeout=busy_timeout_ms / 1000,
                    check_same_thread=False,
                )
                (journal,) = self._conn.execute("PRAGMA journal_mode=WAL").fetchone()
            self._conn.execute(f"PRAGMA synchronous={mode}")
            self._conn.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
            self._conn.execute("PRAGMA foreign_keys=ON")
        except (sqlite3.Error, UnicodeError) as exc:
            self._conn_close_quietly()
            if _corrupt(exc):
                raise CheckpointCorruptError(
                    f"SQLite store {str(self.path)!r} is damaged: {exc}"
                ) from exc
            parent = Path(self.path).parent
            missing = "" if parent.is_dir() else f" (its directory {str(parent)!r} does not exist)"
            raise StoreUnavailableError(
                f"cannot open SQLite store {str(self.path)!r}: {exc}{missing}"
            ) from exc
        if read_only and str(journal).lower() != "wal":
            try:
                self._check_current()  # an empty or foreign file: say that, not "WAL"
            except BaseException:
                self._conn.close()
                raise
        if str(journal).lower() != "wal":
            # The concurrency story (readers beside one writer, durable commits
            # at synchronous=FULL) assumes WAL; a file system that refuses it
            # (some network mounts) must fail here, not be silently slower or racy.
            self._conn.close()
            raise StoreUnavailableError(
                f"SQLite store {str(self.path)!r} would not enter WAL mode (it is in "
                f"{journal!r} mode); put it on a local file system"
            )
        try:
            if read_only:
                self._check_current()
            else:
                self.migrate()
        except BaseException:
            self._conn.close()
            raise

    def __repr__(self) -> str:
        return f"SQLiteStore({str(self.path)!r})"

    def _check_current(self) -> None:
        """A read-only store cannot migrate: its schema must already be this tether's."""
        newest = max(version for version, _ in migrations(self.blob_type))
        try:
            (found,) = self._conn.execute("SELECT MAX(version) FROM tether_migrations").fetchone()
        except sqlite3.Error as exc:
            raise StoreUnavailableError(
                f"{str(self.path)!r} is not a tether store (no migrations table): {exc}"
            ) from exc
        if isinstance(found, bool) or not isinstance(found, int):
            raise StoreUnavailableError(f"{str(self.path)!r} records no tether schema version")
        if found > newest:
            raise MigrationError(
                f"database schema version {found} is newer than this tether ({newest}); "
                "upgrade tether"
            )
        if found < newest:
            raise StoreUnavailableError(
                f"{str(self.path)!r} is at schema version {found}, this tether needs {newest}: "
                "open it once read-write to migrate it (your program's next run, a `tether worker`, "
                "or in Python `tether.store.open_store(URL).close()`)"
            )

    def _conn_close_quietly(self) -> None:
        conn = getattr(self, "_conn", None)
        if conn is not None:
            with contextlib.suppress(sqlite3.Error):
                conn.close()

    def close(self) -> None:
        """Close the connection (idempotent); later calls raise StoreError."""
        with self._lock:
            self._conn.close()

    def __enter__(self) -> SQLiteStore:
        return self

    # -- dialect hooks -------------------------------------------------------

    def _connection(self) -> _Held:
        return _Held(self._lock, self._conn)

    def _transaction(self, conn: Any) -> _Immediate:
        return _Immediate(conn)

    def _clock_bound(self) -> tuple[str, tuple[Any, ...]]:
        # SQLite starts an index range only from a parameter, not from a call to
        # the clock; inside the write transaction the clock is read just before.
        row = self._one(f"SELECT {self.clock_sql}")
        if row is None:
            raise StoreUnavailableError(f"SQLite store {str(self.path)!r} read no clock")
        return "?", (row[0],)

    def _turn_taken(self) -> None:
        self._run("UPDATE tether_turns SET n = n + 1")

    def _insert_ignore(
        self,
        table: str,
        columns: Sequence[str],
        values: Sequence[str] | None = None,
        *,
        rows: int = 1,
    ) -> str:
        return f"INSERT OR IGNORE INTO {table} ({', '.join(columns)}) VALUES " + value_rows(
            columns, values, rows
        )

    def _hold_place(self) -> str:
        return str(self._locks)

    def _try_hold(self, run_id: str) -> ProcessLock | None:
        if self.read_only:
            return NoLock()  # a read-only store commits nothing, so it acts on no run
        try:
            self._locks.mkdir(exist_ok=True)
            return _FileLock.take(self._locks / hashlib.sha256(run_id.encode()).hexdigest())
        except OSError as exc:
            raise StoreUnavailableError(
                f"cannot lock run {run_id!r} beside SQLite store {str(self.path)!r} "
                f"(in {str(self._locks)!r}): {exc}"
            ) from exc

    def _translate(self, exc: Exception) -> TetherError | None:
        if isinstance(exc, sqlite3.IntegrityError):
            return WriteOnceError(f"SQLite refused a write-once violation: {exc}")
        if _corrupt(exc):
            # "database disk image is malformed": the file's own pages are damaged.
            return CheckpointCorruptError(f"SQLite store {str(self.path)!r} is damaged: {exc}")
        if isinstance(exc, sqlite3.OperationalError) and _UNDECODABLE in str(exc):
            # A stored text value that is not UTF-8 (SQLite never checks): the
            # bytes were edited, which is damage, not an unavailable store.
            return CheckpointCorruptError(
                f"SQLite store {str(self.path)!r} holds damaged text: {exc}"
            )
        if isinstance(exc, sqlite3.OperationalError):
            return StoreUnavailableError(f"SQLite store {str(self.path)!r} failed: {exc}")
        if isinstance(exc, sqlite3.Error):
            return StoreError(f"SQLite store {str(self.path)!r} failed: {exc}")
        return None


def _corrupt(exc: BaseException) -> bool:
    """Whether SQLite said its file is damaged (errors raised while converting a value carry no code).

    The code is the extended one: SQLITE_CORRUPT_INDEX (779), _SEQUENCE, _VTAB
    are damage too, and only their low byte is SQLITE_CORRUPT.
    """
    code = getattr(exc, "sqlite_errorcode", None)
    return (
        isinstance(exc, sqlite3.DatabaseError)
        and isinstance(code, int)
        and code & 0xFF == _SQLITE_CORRUPT
    )


class _FileLock:
    """An exclusive ``flock`` on one run's lock file: the kernel drops it when the process dies.

    One file per run (named by the SHA-256 of the run id), not byte ranges of
    one file: a POSIX record lock (``lockf``) is dropped when the process
    closes ANY descriptor of that file, and hashed ranges of one file can
    collide; a ``flock`` belongs to its own descriptor only. The files are
    empty and never deleted: unlinking one while another process waits to
    lock it would let two processes hold two different files of one name.
    """

    def __init__(self, fd: int, path: Path) -> None:
        self._fd: int | None = fd
        self._path = path
        self._inode = os.fstat(fd).st_ino

    @classmethod
    def take(cls, path: Path) -> _FileLock | None:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        return cls(fd, path)

    def let_go(self) -> None:
        self._close()  # closing the only descriptor drops the flock

    def alive(self) -> bool:
        # A lock file deleted or replaced under us no longer keeps others out.
        if self._fd is None:
            return False
        try:
            return os.stat(self._path).st_ino == self._inode
        except OSError:
            return False

    def forget(self) -> None:
        self._close()  # the child's copy of the descriptor only: the parent's lock stays

    def _close(self) -> None:
        # Once only: the number may name another file after it is closed.
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)


# Every unit of work enters both of these: plain classes, not generator-based
# context managers, which cost several times as much to enter and leave.
class _Held:
    """The store's connection, held under its lock for one unit of work."""

    __slots__ = ("_conn", "_lock")

    def __init__(self, lock: threading.RLock, conn: sqlite3.Connection) -> None:
        self._lock = lock
        self._conn = conn

    def __enter__(self) -> sqlite3.Connection:
        self._lock.acquire()
        return self._conn

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


class _Immediate:
    """``BEGIN IMMEDIATE`` ... ``COMMIT``; rolled back on any error, a failed COMMIT too."""

    __slots__ = ("_conn",)

    def __init__(self, conn: Any) -> None:
        self._conn = conn

    def __enter__(self) -> None:
        self._conn.execute("BEGIN IMMEDIATE")

    def __exit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        conn = self._conn
        if kind is None:
            try:
                conn.execute("COMMIT")
            except BaseException:
                _roll_back(conn)
                raise
            return
        _roll_back(conn)  # the body's error propagates (None: not suppressed)


def _roll_back(conn: Any) -> None:
    # Also after a failed COMMIT: never leave the shared connection mid-transaction.
    if conn.in_transaction:
        # The original error says more than a failed rollback would.
        with contextlib.suppress(sqlite3.Error):
            conn.rollback()
