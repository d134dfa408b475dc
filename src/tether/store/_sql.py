"""The SQL shared by every relational store; dialects override a few hooks.

A dialect supplies: how to open a write transaction, how to spell
insert-if-absent, the blob column type, the clock, and how to translate its
driver's errors. Everything else, including every statement that moves a
mark, is written once here.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from tether.core import (
    EffectStatus,
    GenerationConflictError,
    IllegalTransitionError,
    LeaseError,
    MigrationError,
    StoreError,
    TraceEvent,
    WriteOnceError,
    canonical_bytes,
    check_effect_move,
    format_time,
    strict_loads,
)
from tether.store._protocols import BeforeCommit, Commit, LedgerEntry, Mark


def migrations(blob: str) -> list[tuple[int, list[str]]]:
    """Numbered schema migrations; ``blob`` is the dialect's byte-string type."""
    return [
        (
            1,
            [
                """CREATE TABLE tether_marks (
                    run_id TEXT PRIMARY KEY,
                    generation BIGINT NOT NULL CHECK (generation >= 1),
                    checkpoint_digest TEXT NOT NULL,
                    state_version BIGINT NOT NULL,
                    lease_version BIGINT NOT NULL DEFAULT 0,
                    lease_owner TEXT,
                    lease_expires_at TEXT,
                    updated_at TEXT NOT NULL
                )""",
                f"""CREATE TABLE tether_checkpoints (
                    run_id TEXT NOT NULL,
                    checkpoint_digest TEXT NOT NULL,
                    generation BIGINT NOT NULL,
                    envelope {blob} NOT NULL,
                    PRIMARY KEY (run_id, checkpoint_digest)
                )""",
                """CREATE TABLE tether_trace (
                    run_id TEXT NOT NULL,
                    hash TEXT NOT NULL,
                    prev_hash TEXT NOT NULL,
                    seq BIGINT NOT NULL,
                    kind TEXT NOT NULL,
                    at TEXT NOT NULL,
                    data TEXT NOT NULL,
                    PRIMARY KEY (run_id, hash)
                )""",
                """CREATE TABLE tether_ledger (
                    run_id TEXT NOT NULL,
                    idempotency_key TEXT NOT NULL,
                    seq BIGINT NOT NULL,
                    status TEXT NOT NULL,
                    action_id TEXT NOT NULL,
                    intent_digest TEXT NOT NULL,
                    receipt TEXT,
                    epoch BIGINT NOT NULL,
                    at TEXT NOT NULL,
                    PRIMARY KEY (run_id, idempotency_key, seq)
                )""",
                # One intended entry per action id: a reused action id is refused
                # by the database itself, not only by the gate.
                """CREATE UNIQUE INDEX tether_ledger_action
                    ON tether_ledger (run_id, action_id) WHERE status = 'intended'""",
                f"""CREATE TABLE tether_blobs (
                    digest TEXT PRIMARY KEY,
                    body {blob} NOT NULL
                )""",
            ],
        ),
    ]


class SQLBase:
    """Store logic over a DB-API connection; subclasses provide the dialect."""

    blob_type = "BLOB"
    placeholder = "?"

    def __init__(self) -> None:
        self._lock = threading.RLock()

    # -- dialect hooks -------------------------------------------------------

    def _execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        raise NotImplementedError

    @contextmanager
    def _write(self) -> Iterator[None]:
        """A write transaction that serializes with every other writer."""
        raise NotImplementedError
        yield  # pragma: no cover

    def _insert_ignore(self, table: str, columns: Sequence[str]) -> str:
        raise NotImplementedError

    def _translate(self, exc: Exception) -> StoreError | None:
        """The typed error for a driver exception, or ``None`` if it is not a driver error."""
        raise NotImplementedError

    def _now(self) -> datetime:
        return datetime.now(UTC)

    # -- helpers -------------------------------------------------------------

    def _q(self, sql: str) -> str:
        return sql if self.placeholder == "?" else sql.replace("?", self.placeholder)

    def _all(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return list(self._execute(self._q(sql), params).fetchall())

    def _one(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        row = self._execute(self._q(sql), params).fetchone()
        return None if row is None else tuple(row)

    def _run(self, sql: str, params: Sequence[Any] = ()) -> int:
        return int(self._execute(self._q(sql), params).rowcount)

    @contextmanager
    def _guard(self) -> Iterator[None]:
        """Translate driver errors at the boundary; typed errors pass through."""
        with self._lock:
            try:
                yield
            except StoreError:
                raise
            except Exception as exc:
                typed = self._translate(exc)
                if typed is None:
                    raise
                raise typed from exc

    # -- migrations ----------------------------------------------------------

    def migrate(self) -> int:
        """Apply every missing migration; returns the schema version now in force."""
        steps = migrations(self.blob_type)
        with self._guard(), self._write():
            self._execute(
                "CREATE TABLE IF NOT EXISTS tether_migrations "
                "(version INTEGER PRIMARY KEY, applied_at TEXT NOT NULL)"
            )
            applied = {int(r[0]) for r in self._all("SELECT version FROM tether_migrations")}
            newest = max(version for version, _ in steps)
            if applied and max(applied) > newest:
                raise MigrationError(
                    f"database schema version {max(applied)} is newer than this tether "
                    f"({newest}); upgrade tether"
                )
            for version, statements in steps:
                if version in applied:
                    continue
                for statement in statements:
                    self._execute(statement)
                self._run(
                    "INSERT INTO tether_migrations (version, applied_at) VALUES (?, ?)",
                    (version, format_time(self._now())),
                )
            return newest

    def schema_version(self) -> int:
        with self._guard():
            row = self._one("SELECT MAX(version) FROM tether_migrations")
            return 0 if row is None or row[0] is None else int(row[0])

    # -- content -------------------------------------------------------------

    def _put_content(self, commit: Commit) -> None:
        if "sha256:" + hashlib.sha256(commit.envelope).hexdigest() != commit.checkpoint_digest:
            raise WriteOnceError(
                f"run {commit.run_id}: checkpoint digest does not address its envelope"
            )
        self._run(
            self._insert_ignore(
                "tether_checkpoints", ("run_id", "checkpoint_digest", "generation", "envelope")
            ),
            (commit.run_id, commit.checkpoint_digest, commit.generation, commit.envelope),
        )
        for event in commit.events:
            self._put_event(event)
        for blob_digest, body in (commit.blobs or {}).items():
            self._run(self._insert_ignore("tether_blobs", ("digest", "body")), (blob_digest, body))

    def _put_event(self, event: TraceEvent) -> None:
        inserted = self._run(
            self._insert_ignore(
                "tether_trace", ("run_id", "hash", "prev_hash", "seq", "kind", "at", "data")
            ),
            (
                event.run_id,
                event.hash,
                event.prev_hash,
                event.seq,
                event.kind,
                format_time(event.at),
                canonical_bytes(event.data).decode("utf-8"),
            ),
        )
        if inserted == 0:
            # Hash-addressed: an existing row is the same event, or a collision.
            row = self._one(
                "SELECT prev_hash, seq FROM tether_trace WHERE run_id = ? AND hash = ?",
                (event.run_id, event.hash),
            )
            if row is None or row[0] != event.prev_hash or int(row[1]) != event.seq:
                raise WriteOnceError(f"trace event {event.hash} exists with other content")

    def put_content(self, commit: Commit, before_commit: BeforeCommit | None = None) -> None:
        """Write a commit's content (checkpoint, events, ledger, blobs) write-once."""
        with self._guard(), self._write():
            self._put_content(commit)
            if before_commit is not None:
                before_commit()

    def get_checkpoint(self, run_id: str, checkpoint_digest: str) -> bytes | None:
        with self._guard():
            row = self._one(
                "SELECT envelope FROM tether_checkpoints WHERE run_id = ? AND checkpoint_digest = ?",
                (run_id, checkpoint_digest),
            )
            return None if row is None else bytes(row[0])

    def newest_generation(self, run_id: str) -> int | None:
        with self._guard():
            row = self._one(
                "SELECT MAX(generation) FROM tether_checkpoints WHERE run_id = ?", (run_id,)
            )
            return None if row is None or row[0] is None else int(row[0])

    def get_blob(self, blob_digest: str) -> bytes | None:
        with self._guard():
            row = self._one("SELECT body FROM tether_blobs WHERE digest = ?", (blob_digest,))
            return None if row is None else bytes(row[0])

    def trace(self, run_id: str, head: str, limit: int | None = None) -> list[TraceEvent]:
        """Walk the chain back from ``head``: events an orphaned attempt wrote are not on it."""
        with self._guard():
            rows = self._all(
                """WITH RECURSIVE chain(hash, prev_hash, seq, kind, at, data, depth) AS (
                       SELECT hash, prev_hash, seq, kind, at, data, 1 FROM tether_trace
                        WHERE run_id = ? AND hash = ?
                       UNION ALL
                       SELECT t.hash, t.prev_hash, t.seq, t.kind, t.at, t.data, c.depth + 1
                         FROM tether_trace t JOIN chain c
                           ON t.run_id = ? AND t.hash = c.prev_hash
                        WHERE ? < 0 OR c.depth < ?
                   )
                   SELECT hash, prev_hash, seq, kind, at, data FROM chain ORDER BY seq""",
                (run_id, head, run_id, -1 if limit is None else limit, limit or 0),
            )
        events = []
        for hash_, prev, seq, kind, at, data in rows:
            events.append(
                TraceEvent(
                    run_id=run_id,
                    seq=int(seq),
                    kind=str(kind),
                    at=datetime.strptime(str(at), "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC),
                    data=strict_loads(str(data)),
                    prev_hash=str(prev),
                    hash=str(hash_),
                )
            )
        return events

    # -- ledger --------------------------------------------------------------

    def _append_ledger(self, entry: LedgerEntry) -> LedgerEntry:
        row = self._one(
            "SELECT seq, status, intent_digest FROM tether_ledger "
            "WHERE run_id = ? AND idempotency_key = ? ORDER BY seq DESC LIMIT 1",
            (entry.run_id, entry.idempotency_key),
        )
        current = None if row is None else EffectStatus(str(row[1]))
        if row is not None and str(row[2]) != entry.intent_digest:
            raise WriteOnceError(
                f"ledger key {entry.idempotency_key} is bound to intent {row[2]}, "
                f"not {entry.intent_digest}"
            )
        try:
            check_effect_move(current, entry.status)
        except IllegalTransitionError as exc:
            raise WriteOnceError(f"ledger for key {entry.idempotency_key}: {exc}") from exc
        seq = 1 if row is None else int(row[0]) + 1
        self._run(
            "INSERT INTO tether_ledger (run_id, idempotency_key, seq, status, action_id, "
            "intent_digest, receipt, epoch, at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                entry.run_id,
                entry.idempotency_key,
                seq,
                entry.status.value,
                entry.action_id,
                entry.intent_digest,
                None if entry.receipt is None else canonical_bytes(entry.receipt).decode("utf-8"),
                entry.epoch,
                format_time(entry.at),
            ),
        )
        return LedgerEntry(
            entry.run_id,
            entry.idempotency_key,
            seq,
            entry.status,
            entry.action_id,
            entry.intent_digest,
            entry.receipt,
            entry.epoch,
            entry.at,
        )

    def append_ledger(self, *entries: LedgerEntry) -> list[LedgerEntry]:
        with self._guard(), self._write():
            return [self._append_ledger(entry) for entry in entries]

    def ledger(self, run_id: str, idempotency_key: str | None = None) -> list[LedgerEntry]:
        sql = (
            "SELECT idempotency_key, seq, status, action_id, intent_digest, receipt, epoch, at "
            "FROM tether_ledger WHERE run_id = ?"
        )
        params: list[Any] = [run_id]
        if idempotency_key is not None:
            sql += " AND idempotency_key = ?"
            params.append(idempotency_key)
        with self._guard():
            rows = self._all(sql + " ORDER BY at, idempotency_key, seq", params)
        return [
            LedgerEntry(
                run_id=run_id,
                idempotency_key=str(key),
                seq=int(seq),
                status=EffectStatus(str(status)),
                action_id=str(action_id),
                intent_digest=str(intent_digest),
                receipt=None if receipt is None else strict_loads(str(receipt)),
                epoch=int(epoch),
                at=datetime.strptime(str(at), "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC),
            )
            for key, seq, status, action_id, intent_digest, receipt, epoch, at in rows
        ]

    def action_seen(self, run_id: str, action_id: str) -> bool:
        with self._guard():
            row = self._one(
                "SELECT 1 FROM tether_ledger WHERE run_id = ? AND action_id = ? LIMIT 1",
                (run_id, action_id),
            )
            return row is not None

    # -- the mark ------------------------------------------------------------

    def _mark_row(self, run_id: str) -> Mark | None:
        row = self._one(
            "SELECT generation, checkpoint_digest, state_version, lease_version, lease_owner, "
            "lease_expires_at FROM tether_marks WHERE run_id = ?",
            (run_id,),
        )
        if row is None:
            return None
        expires = None
        if row[5] is not None:
            expires = datetime.strptime(str(row[5]), "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
        return Mark(
            run_id=run_id,
            generation=int(row[0]),
            checkpoint_digest=str(row[1]),
            state_version=int(row[2]),
            lease_version=int(row[3]),
            lease_owner=None if row[4] is None else str(row[4]),
            lease_expires_at=expires,
        )

    def get_mark(self, run_id: str) -> Mark | None:
        with self._guard():
            return self._mark_row(run_id)

    def runs(self) -> list[Mark]:
        with self._guard():
            ids = [str(r[0]) for r in self._all("SELECT run_id FROM tether_marks ORDER BY run_id")]
            return [m for m in (self._mark_row(i) for i in ids) if m is not None]

    def _cas_mark(
        self,
        run_id: str,
        expected_generation: int,
        new_generation: int,
        checkpoint_digest: str,
        expected_lease_version: int,
    ) -> None:
        if new_generation != expected_generation + 1:
            raise GenerationConflictError(run_id, expected_generation, new_generation - 1)
        now = format_time(self._now())
        if expected_generation == 0:
            inserted = self._run(
                self._insert_ignore(
                    "tether_marks",
                    ("run_id", "generation", "checkpoint_digest", "state_version", "updated_at"),
                ),
                (run_id, new_generation, checkpoint_digest, new_generation, now),
            )
            if inserted == 1:
                return
        else:
            moved = self._run(
                "UPDATE tether_marks SET generation = ?, checkpoint_digest = ?, "
                "state_version = state_version + 1, updated_at = ? "
                "WHERE run_id = ? AND generation = ? AND lease_version = ?",
                (
                    new_generation,
                    checkpoint_digest,
                    now,
                    run_id,
                    expected_generation,
                    expected_lease_version,
                ),
            )
            if moved == 1:
                return
        current = self._mark_row(run_id)
        if current is not None and current.generation == expected_generation:
            raise LeaseError(run_id, expected_lease_version, current.lease_version)
        raise GenerationConflictError(
            run_id, expected_generation, None if current is None else current.generation
        )

    def cas_mark(
        self,
        run_id: str,
        expected_generation: int,
        new_generation: int,
        checkpoint_digest: str,
        expected_lease_version: int = 0,
    ) -> None:
        with self._guard(), self._write():
            self._cas_mark(
                run_id,
                expected_generation,
                new_generation,
                checkpoint_digest,
                expected_lease_version,
            )

    def commit(
        self,
        commit: Commit,
        expected_generation: int,
        expected_lease_version: int = 0,
        before_commit: BeforeCommit | None = None,
    ) -> None:
        """Content and mark in ONE transaction: both land or neither does."""
        with self._guard(), self._write():
            # The CAS goes first so a losing writer fails before writing content.
            self._cas_mark(
                commit.run_id,
                expected_generation,
                commit.generation,
                commit.checkpoint_digest,
                expected_lease_version,
            )
            self._put_content(commit)
            if before_commit is not None:
                before_commit()
