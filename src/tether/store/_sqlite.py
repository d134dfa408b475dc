"""SQLiteStore: the embedded default.

Opened for safe concurrency between processes: WAL journal, ``synchronous``
FULL unless the caller asks otherwise, ``BEGIN IMMEDIATE`` on every write
path (so two writers serialize instead of failing at commit), a busy
timeout, and foreign keys on.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tether.core import StoreError, StoreUnavailableError, WriteOnceError
from tether.store._sql import SQLBase

_SYNCHRONOUS = {"OFF", "NORMAL", "FULL", "EXTRA"}


class SQLiteStore(SQLBase):
    """Checkpoint content and the generation mark in one SQLite file (or either alone)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        synchronous: str = "FULL",
        busy_timeout_ms: int = 30_000,
    ) -> None:
        super().__init__()
        mode = synchronous.upper()
        if mode not in _SYNCHRONOUS:
            raise StoreError(
                f"synchronous must be one of {sorted(_SYNCHRONOUS)}, not {synchronous!r}"
            )
        self.path = Path(path)
        try:
            self._conn = sqlite3.connect(
                self.path,
                isolation_level=None,
                timeout=busy_timeout_ms / 1000,
                check_same_thread=False,
            )
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute(f"PRAGMA synchronous={mode}")
            self._conn.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
            self._conn.execute("PRAGMA foreign_keys=ON")
        except sqlite3.Error as exc:
            raise StoreUnavailableError(
                f"cannot open SQLite store {str(self.path)!r}: {exc}"
            ) from exc
        self.migrate()

    def __repr__(self) -> str:
        return f"SQLiteStore({str(self.path)!r})"

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __enter__(self) -> SQLiteStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- dialect hooks -------------------------------------------------------

    def _execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        return self._conn.execute(sql, tuple(params))

    @contextmanager
    def _write(self) -> Iterator[None]:
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            if self._conn.in_transaction:
                self._conn.rollback()
            raise
        self._conn.execute("COMMIT")

    def _insert_ignore(self, table: str, columns: Sequence[str]) -> str:
        marks = ", ".join("?" for _ in columns)
        return f"INSERT OR IGNORE INTO {table} ({', '.join(columns)}) VALUES ({marks})"

    def _translate(self, exc: Exception) -> StoreError | None:
        if isinstance(exc, sqlite3.IntegrityError):
            return WriteOnceError(f"SQLite refused a write-once violation: {exc}")
        if isinstance(exc, sqlite3.OperationalError):
            return StoreUnavailableError(f"SQLite store {str(self.path)!r} failed: {exc}")
        if isinstance(exc, sqlite3.Error):
            return StoreError(f"SQLite store {str(self.path)!r} failed: {exc}")
        return None
