"""The workspace's receipt journal: one SQLite file and one lock file, outside the tree.

SQLite is opened for safe concurrency (WAL, ``synchronous=FULL``, a 10 s
busy timeout) with ``isolation_level=None`` so that every write transaction
is an explicit ``BEGIN IMMEDIATE``. Cross-process mutual exclusion for the
whole write protocol comes from an ``flock`` on ``lock``, not from SQLite,
because the protocol spans a file replacement that SQLite knows nothing of.
Driver errors never leave this module untranslated.
"""

from __future__ import annotations

import fcntl
import os
import secrets
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tether.adapters._errors import JournalCorruptError, WorkspaceConfigError
from tether.adapters._filewrite import WriteRequest, parse_receipt, parse_write, receipt_bytes
from tether.core import (
    AdapterUnavailableError,
    CanonicalJSONError,
    ContractViolationError,
    Intent,
    Receipt,
    strict_loads,
)
from tether.core._fields import Fields

_SCHEMA_VERSION = 3
_SCHEMA = (
    # One row: the instance identity and the two counters. The CHECK keeps it one row.
    "CREATE TABLE meta (id INTEGER PRIMARY KEY CHECK (id = 1), instance_id TEXT NOT NULL,"
    " version INTEGER NOT NULL, writes INTEGER NOT NULL)",
    "CREATE TABLE receipts (idempotency_key TEXT PRIMARY KEY, receipt BLOB NOT NULL)",
    "CREATE TABLE prepared (idempotency_key TEXT PRIMARY KEY, intent_digest TEXT NOT NULL,"
    " target TEXT NOT NULL, before_sha256 TEXT, after_sha256 TEXT NOT NULL,"
    " temp_name TEXT NOT NULL, intent BLOB NOT NULL)",
)
# Version 2: the highest fencing token (lease version) seen per run.
_FENCES = "CREATE TABLE fences (run_id TEXT PRIMARY KEY, lease_version INTEGER NOT NULL)"
# Version 3: a snapshot restore under way (at most one); it outlives a crash mid-restore.
_RESTORES = "CREATE TABLE restores (id INTEGER PRIMARY KEY CHECK (id = 1), root TEXT NOT NULL)"
_PREPARED_COLUMNS = (
    "idempotency_key, intent_digest, target, before_sha256, after_sha256, temp_name, intent"
)


@dataclass(frozen=True, slots=True)
class Prepared:
    """A write recorded as about to happen; its row outlives a crash mid-write."""

    key: str
    intent_digest: str
    target: str
    before: str | None
    after: str
    temp_name: str
    intent: bytes

    def request(self) -> WriteRequest:
        """Rebuild the write this row describes, checked against its digest."""
        try:
            raw = strict_loads(self.intent)
            intent = Intent.parse(Fields(raw, "prepared.intent", _journal_error))
            request = parse_write(intent, conditional=True)
        except (CanonicalJSONError, ContractViolationError) as exc:
            raise JournalCorruptError("prepared.intent", str(exc)) from exc
        if intent.digest != self.intent_digest or request.target != self.target:
            raise JournalCorruptError("prepared.intent", "does not match its row")
        return request


def _journal_error(field: str, problem: str) -> Exception:
    return JournalCorruptError(field, problem)


class Journal:
    """Receipts, prepared writes and counters of one workspace instance."""

    def __init__(self, directory: Path) -> None:
        self._conn: sqlite3.Connection | None = None
        self._lock_fd: int | None = None
        try:
            directory.mkdir(parents=True, exist_ok=True)
            self._lock_fd = os.open(
                directory / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600
            )
        except OSError as exc:
            raise AdapterUnavailableError(f"cannot open the journal in {directory}: {exc}") from exc
        try:
            # Creation under the lock: two processes opening a fresh journal at
            # once must agree on one instance id.
            with self.locked():
                self._conn = self._connect(directory / "journal.sqlite")
                self._migrate()
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _connect(path: Path) -> sqlite3.Connection:
        try:
            # isolation_level=None: no implicit transactions; BEGIN is always ours.
            conn = sqlite3.connect(
                path, timeout=10.0, isolation_level=None, check_same_thread=False
            )
            conn.execute("PRAGMA busy_timeout = 10000")
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            conn.execute("PRAGMA synchronous = FULL")
        except sqlite3.Error as exc:
            raise AdapterUnavailableError(f"cannot open the journal {path}: {exc}") from exc
        if str(mode).lower() != "wal":
            conn.close()
            raise WorkspaceConfigError(f"the journal's file system refused WAL mode ({mode!r})")
        return conn

    def _migrate(self) -> None:
        with self.transaction() as conn:
            found = conn.execute("PRAGMA user_version").fetchone()[0]
            if found == 0:
                for statement in _SCHEMA:
                    conn.execute(statement)
                conn.execute(
                    "INSERT INTO meta (id, instance_id, version, writes) VALUES (1, ?, 0, 0)",
                    (secrets.token_hex(16),),
                )
                conn.execute(_FENCES)
                conn.execute(_RESTORES)
                conn.execute(f"PRAGMA user_version = {_SCHEMA_VERSION}")
            elif found in (1, 2):
                if found == 1:
                    conn.execute(_FENCES)
                conn.execute(_RESTORES)
                conn.execute(f"PRAGMA user_version = {_SCHEMA_VERSION}")
            elif found != _SCHEMA_VERSION:
                raise WorkspaceConfigError(
                    f"journal schema {found} is not {_SCHEMA_VERSION}; use a matching tether"
                )

    def close(self) -> None:
        """Close the connection and the lock file; safe to call twice."""
        if self._conn is not None:
            with suppress(sqlite3.Error):
                self._conn.close()
            self._conn = None
        if self._lock_fd is not None:
            with suppress(OSError):
                os.close(self._lock_fd)
            self._lock_fd = None

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the exclusive cross-process lock (an ``flock`` on the lock file)."""
        fd = self._lock_fd
        if fd is None:
            raise AdapterUnavailableError("the workspace journal is closed")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as exc:
            raise AdapterUnavailableError(f"cannot take the workspace lock: {exc}") from exc
        try:
            yield
        finally:
            with suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """``BEGIN IMMEDIATE`` ... ``COMMIT``; any error rolls back, driver errors translated."""
        conn = self._connection()
        try:
            # IMMEDIATE takes SQLite's write lock up front, so a transaction never
            # fails half-way on a read-to-write upgrade.
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise AdapterUnavailableError(f"journal: cannot begin a transaction: {exc}") from exc
        try:
            yield conn
            conn.execute("COMMIT")
        except BaseException as exc:
            with suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            if isinstance(exc, sqlite3.Error):
                raise AdapterUnavailableError(f"journal write failed: {exc}") from exc
            raise

    # --- reads ----------------------------------------------------------

    def meta(self) -> tuple[str, int, int]:
        """``(instance_id, version, writes)``."""
        rows = self._rows("SELECT instance_id, version, writes FROM meta WHERE id = 1")
        if not rows:
            raise JournalCorruptError("meta", "the journal has no meta record")
        instance_id, version, writes = rows[0]
        return str(instance_id), int(version), int(writes)

    def fence(self, run_id: str) -> int:
        """The highest lease version a write for ``run_id`` has presented (0: none)."""
        rows = self._rows("SELECT lease_version FROM fences WHERE run_id = ?", (run_id,))
        return int(rows[0][0]) if rows else 0

    def raise_fence(self, run_id: str, lease_version: int) -> None:
        """Record ``lease_version`` as the run's highest token (callers hold the lock)."""
        with self.transaction() as conn:
            conn.execute(
                "INSERT INTO fences (run_id, lease_version) VALUES (?, ?) ON CONFLICT (run_id) "
                "DO UPDATE SET lease_version = excluded.lease_version "
                "WHERE excluded.lease_version > fences.lease_version",
                (run_id, lease_version),
            )

    def receipt(self, key: str) -> Receipt | None:
        """The stored receipt under ``key``, parsed strictly."""
        rows = self._rows("SELECT receipt FROM receipts WHERE idempotency_key = ?", (key,))
        return parse_receipt(bytes(rows[0][0])) if rows else None

    def receipts_after(self, version: int, limit: int) -> list[Receipt]:
        """Receipts whose post-state version is above ``version``, oldest first, at most ``limit``."""
        # Receipts are appended in commit order: the newest rows are the candidates.
        rows = self._rows("SELECT receipt FROM receipts ORDER BY rowid DESC LIMIT ?", (limit,))
        found = [parse_receipt(bytes(row[0])) for row in rows]
        newer = [r for r in found if r.post_state.version > version]
        return sorted(newer, key=lambda r: r.post_state.version)[: max(0, limit)]

    def prepared(self, key: str | None = None) -> list[Prepared]:
        """Prepared rows (all, or the one under ``key``), in key order."""
        sql = f"SELECT {_PREPARED_COLUMNS} FROM prepared"
        rows = (
            self._rows(sql + " WHERE idempotency_key = ?", (key,))
            if key is not None
            else self._rows(sql + " ORDER BY idempotency_key")
        )
        return [
            Prepared(str(k), str(d), str(t), b, str(a), str(n), bytes(i))
            for k, d, t, b, a, n, i in rows
        ]

    # --- writes ---------------------------------------------------------

    def prepare(self, row: Prepared) -> None:
        """Record a write as about to happen (step 4 of the protocol)."""
        with self.transaction() as conn:
            conn.execute(
                f"INSERT INTO prepared ({_PREPARED_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    row.key,
                    row.intent_digest,
                    row.target,
                    row.before,
                    row.after,
                    row.temp_name,
                    row.intent,
                ),
            )

    def complete(self, key: str, build: Callable[[int], Receipt]) -> Receipt:
        """Drop ``key``'s prepared row, bump both counters and store ``build(new_version)``.

        One transaction, so a receipt exists exactly when the version counts it.
        """
        with self.transaction() as conn:
            conn.execute("DELETE FROM prepared WHERE idempotency_key = ?", (key,))
            conn.execute("UPDATE meta SET version = version + 1, writes = writes + 1 WHERE id = 1")
            receipt = build(self.meta()[1])
            # INSERT, never upsert: a second receipt for one key is a bug to surface.
            conn.execute(
                "INSERT INTO receipts (idempotency_key, receipt) VALUES (?, ?)",
                (key, receipt_bytes(receipt)),
            )
        return receipt

    def forget(self, key: str) -> None:
        """Drop a prepared row whose write provably never landed."""
        with self.transaction() as conn:
            conn.execute("DELETE FROM prepared WHERE idempotency_key = ?", (key,))

    def delete_receipt(self, key: str) -> bool:
        """Delete the receipt under ``key`` (test hook); True if one existed."""
        with self.transaction() as conn:
            return (
                conn.execute("DELETE FROM receipts WHERE idempotency_key = ?", (key,)).rowcount > 0
            )

    def replace_receipt(self, key: str, receipt: Receipt) -> None:
        """Overwrite the stored receipt under ``key`` (test hook for drift)."""
        with self.transaction() as conn:
            conn.execute(
                "UPDATE receipts SET receipt = ? WHERE idempotency_key = ?",
                (receipt_bytes(receipt), key),
            )

    def pending_restore(self) -> str | None:
        """The root digest of a restore that began and did not finish, if any."""
        rows = self._rows("SELECT root FROM restores WHERE id = 1")
        return str(rows[0][0]) if rows else None

    def begin_restore(self, root: str) -> None:
        """Record that the tree is about to be rewritten to ``root`` (a newer restore supersedes)."""
        with self.transaction() as conn:
            conn.execute("DELETE FROM restores")
            conn.execute("INSERT INTO restores (id, root) VALUES (1, ?)", (root,))

    def complete_restore(self) -> int:
        """Drop the restore row and bump the version, atomically; returns the new version."""
        with self.transaction() as conn:
            conn.execute("DELETE FROM restores")
            conn.execute("UPDATE meta SET version = version + 1 WHERE id = 1")
            return self.meta()[1]

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            raise AdapterUnavailableError("the workspace journal is closed")
        return self._conn

    def _rows(self, sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
        try:
            return self._connection().execute(sql, params).fetchall()
        except sqlite3.Error as exc:
            raise AdapterUnavailableError(f"journal read failed: {exc}") from exc
