"""The SQL shared by every relational store; dialects override a few hooks.

A dialect supplies: how to check a connection out, how to open a write
transaction, how to spell insert-if-absent, the blob column type, the
store-clock expression, how to lock rows, and how to classify and translate
its driver's errors. Everything else, including every statement that moves a
mark or a lease, is written once here.

Connections, units of work, retries and error translation live one layer
down, in :class:`~tether.store._engine.SQLEngine`.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from tether.core import (
    CheckpointCorruptError,
    GenerationConflictError,
    LeaseLostError,
    LedgerEntry,
    MigrationError,
    StoreError,
    TraceEvent,
    WriteOnceError,
    canonical_bytes,
    format_time,
)
from tether.core._listing import Listing
from tether.core._trace import chain_hash
from tether.store._codec import blob_rows, pack, stored_bytes
from tether.store._group import GroupCommit, Statement
from tether.store._history_sql import LEDGER_COLUMNS, TRACE_COLUMNS, HistorySQL
from tether.store._leases import LeaseSQL
from tether.store._listing import ListingSQL
from tether.store._protocols import (
    EVIDENCE_KINDS,
    BeforeCommit,
    Commit,
    Evidence,
    Lease,
    LeaseRequest,
    Mark,
)
from tether.store._rows import (
    LISTING_COLUMNS,
    MARK_COLUMNS,
    action_key,
    effect_key,
    evidence_of,
    lease_of,
    ledger_entry_of,
    ledger_packed_columns,
    listing_values,
    mark_of,
    phase_text,
    stored_int,
    stored_target,
    target_key,
    trace_data_columns,
    trace_event_of,
    ttl_micros,
)
from tether.store._schema import MOVED_ON_UNPARKS, TARGETS_FILLED, migrations

log = logging.getLogger("tether.store")


class SQLBase(HistorySQL, ListingSQL, LeaseSQL):
    """Every store statement, written once; subclasses provide the dialect hooks.

    An integration that keeps tables of its own in the store's database runs
    its statements through the public :meth:`transaction` and :meth:`read`
    (each hands its body a :class:`~tether.store.SQLStatements`), never
    through the underscored helpers the store uses itself.
    """

    #: Where concurrent commits are grouped into one transaction (see ``_group``);
    #: ``None``: every commit is a transaction of its own.
    _group: GroupCommit | None = None

    # -- migrations ----------------------------------------------------------

    def migrate(self) -> int:
        """Apply every missing migration; returns the schema version now in force."""
        return self._write(self._migrate)

    def _migrate(self) -> int:
        steps = migrations(self.blob_type, self.index_backfill, self.turn_counter)
        self._lock_migrations()
        self._execute(
            "CREATE TABLE IF NOT EXISTS tether_migrations "
            "(version INTEGER PRIMARY KEY, applied_at TEXT NOT NULL)"
        )
        applied = {_version(r[0]) for r in self._all("SELECT version FROM tether_migrations")}
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
            if version == TARGETS_FILLED:
                self._fill_targets()
            self._run(
                "INSERT INTO tether_migrations (version, applied_at) VALUES (?, ?)",
                (version, format_time(self._now())),
            )
        return newest

    def _fill_targets(self) -> None:
        """Migration 16: name the target of every sent row written before it, from its terms.

        A digest SQL cannot compute, so tether computes it, row by row, once,
        inside the migration's transaction.
        """
        rows = self._all(
            "SELECT run_id, hash, status, terms FROM tether_ledger "
            "WHERE target IS NULL AND effect IS NOT NULL AND status <> 'intended'"
        )
        for run_id, hash_, status, terms in rows:
            target = stored_target(status, terms)
            if target is not None:
                self._run(
                    "UPDATE tether_ledger SET target = ? WHERE run_id = ? AND hash = ?",
                    (target, run_id, hash_),
                )

    def schema_version(self) -> int:
        """The newest migration recorded in the database (0: none)."""
        row = self._read(lambda: self._one("SELECT MAX(version) FROM tether_migrations"))
        return 0 if row is None or row[0] is None else _version(row[0])

    # -- content -------------------------------------------------------------

    def _check_sealed(self, commit: Commit) -> None:
        """Refuse content whose addresses are not its content's (before anything is written)."""
        if "sha256:" + hashlib.sha256(commit.envelope).hexdigest() != commit.checkpoint_digest:
            raise WriteOnceError(
                f"run {commit.run_id}: checkpoint digest does not address its envelope"
            )
        for event in commit.events:
            if event.run_id != commit.run_id:
                raise WriteOnceError(f"run {commit.run_id}: a commit carries another run's event")
            # Rows are addressed by their hash: one whose hash is not its content's
            # would make "already there" mean "something else is there".
            if chain_hash(event.prev_hash, event.body_bytes()) != event.hash:
                raise WriteOnceError(f"trace event {event.hash} is not sealed over its content")
        for entry in commit.ledger:
            if entry.run_id != commit.run_id:
                raise WriteOnceError(f"run {commit.run_id}: a commit carries another run's ledger")
            if chain_hash(entry.prev_hash, entry.body_bytes()) != entry.hash:
                raise WriteOnceError(f"ledger entry {entry.hash} is not sealed over its content")

    def _put_content(self, commit: Commit) -> None:
        # One statement per table, however many rows: a commit's statements
        # are what it costs the store (and, apart from the server, the client).
        self._check_sealed(commit)
        self._run(
            self._insert_ignore(
                "tether_checkpoints",
                ("run_id", "checkpoint_digest", "generation", "envelope", "codec"),
            ),
            (
                commit.run_id,
                commit.checkpoint_digest,
                commit.generation,
                *pack(commit.envelope, deflate=self.deflate),
            ),
        )
        events, entries = commit.events, commit.ledger
        self._put_rows(
            "tether_trace",
            _TRACE_COLUMNS,
            [_trace_row(event, self.deflate) for event in events],
            lambda index: self._exists_as("tether_trace", events[index], "trace event"),
        )
        # Each ledger row records when the store took it, by the store's clock (the
        # age of a key against an adapter's retention is measured on it).
        self._put_rows(
            "tether_ledger",
            (*_LEDGER_COLUMNS, "stored_us"),
            [_ledger_row(entry, self.deflate) for entry in entries],
            lambda index: self._exists_as("tether_ledger", entries[index], "ledger entry"),
            values=(*["?"] * len(_LEDGER_COLUMNS), self.clock_sql),
        )
        # Shared by content: a blob already there is the same bytes.
        self._put_rows(
            "tether_blobs", _BLOB_COLUMNS, blob_rows(commit.blobs or {}, deflate=self.deflate)
        )

    def _put_rows(
        self,
        table: str,
        columns: Sequence[str],
        rows: Sequence[Sequence[Any]],
        existing: Callable[[int], None] | None = None,
        *,
        values: Sequence[str] | None = None,
    ) -> None:
        """Insert-if-absent ``rows``, up to :data:`_ROWS_PER_STATEMENT` per statement.

        ``existing(i)`` checks row ``i`` when some were already there (a
        hash-addressed row must then be the same row, or it is a collision).
        ``values``: each row's SQL expressions (``?`` for each of a row's
        parameters), where a column is filled by the database itself.
        """
        for start in range(0, len(rows), _ROWS_PER_STATEMENT):
            chunk = rows[start : start + _ROWS_PER_STATEMENT]
            inserted = self._run(
                self._insert_ignore(table, columns, values, rows=len(chunk)),
                [value for row in chunk for value in row],
            )
            if inserted < len(chunk) and existing is not None:
                for index in range(start, start + len(chunk)):
                    existing(index)

    def _exists_as(self, table: str, row: TraceEvent | LedgerEntry, what: str) -> None:
        """Refuse a hash-addressed row whose stored twin has other content (or is not there)."""
        found = self._one(
            f"SELECT prev_hash, seq FROM {table} WHERE run_id = ? AND hash = ?",
            (row.run_id, row.hash),
        )
        if found is None or found[0] != row.prev_hash or found[1] != row.seq:
            raise WriteOnceError(f"{what} {row.hash} exists with other content")

    def put_content(self, commit: Commit, before_commit: BeforeCommit | None = None) -> None:
        """Write a commit's content (checkpoint, events, blobs) write-once."""

        def body() -> None:
            self._put_content(commit)
            if before_commit is not None:
                before_commit()

        self._write(body)

    def get_checkpoint(self, run_id: str, checkpoint_digest: str) -> bytes | None:
        """The sealed envelope stored under ``checkpoint_digest``, or ``None``."""
        row = self._read(
            lambda: self._one(
                "SELECT envelope, codec FROM tether_checkpoints "
                "WHERE run_id = ? AND checkpoint_digest = ?",
                (run_id, checkpoint_digest),
            )
        )
        if row is None:
            return None
        return stored_bytes(row[0], row[1], f"checkpoint {checkpoint_digest}", run_id=run_id)

    def envelopes(self, run_id: str, generation: int | None = None) -> list[bytes]:
        """Every sealed envelope of the run (of one ``generation``), landed or not, in order."""
        where, params = (
            ("", (run_id,))
            if generation is None
            else (
                " AND generation = ?",
                (run_id, generation),
            )
        )
        rows = self._read(
            lambda: self._all(
                f"SELECT envelope, codec FROM tether_checkpoints WHERE run_id = ?{where} "
                "ORDER BY generation, checkpoint_digest",
                params,
            )
        )
        return [
            stored_bytes(row[0], row[1], f"run {run_id}: a checkpoint", run_id=run_id)
            for row in rows
        ]

    def newest_generation(self, run_id: str) -> int | None:
        """The highest generation of any content written for the run (landed or not)."""
        row = self._read(
            lambda: self._one(
                "SELECT MAX(generation) FROM tether_checkpoints WHERE run_id = ?", (run_id,)
            )
        )
        if row is None or row[0] is None:
            return None
        return stored_int(row[0], f"run {run_id}: a checkpoint's generation", run_id=run_id)

    def get_blob(self, blob_digest: str) -> bytes | None:
        """Content-addressed bytes, or ``None``."""
        row = self._read(
            lambda: self._one(
                "SELECT body, codec FROM tether_blobs WHERE digest = ?", (blob_digest,)
            )
        )
        if row is None:
            return None
        return stored_bytes(row[0], row[1], f"blob {blob_digest}")

    def put_blobs(self, blobs: Mapping[str, bytes]) -> None:
        """Store content-addressed bytes write-once; a key that is not its bytes' digest refuses all."""
        for blob_digest, data in blobs.items():
            if "sha256:" + hashlib.sha256(data).hexdigest() != blob_digest:
                raise WriteOnceError(f"blob {blob_digest}: the digest does not address its bytes")
        rows = blob_rows(blobs, deflate=self.deflate)

        def insert() -> None:
            self._put_rows("tether_blobs", _BLOB_COLUMNS, rows)

        if rows:
            self._write(insert)

    def has_blob(self, blob_digest: str) -> bool:
        """Whether bytes are stored under ``blob_digest``."""
        row = self._read(
            lambda: self._one("SELECT 1 FROM tether_blobs WHERE digest = ?", (blob_digest,))
        )
        return row is not None

    def stored_blobs(self, blob_digests: Collection[str]) -> set[str]:
        """Which of ``blob_digests`` have bytes stored (in chunks of 500 per query)."""
        wanted = sorted(set(blob_digests))
        found: set[str] = set()
        for start in range(0, len(wanted), 500):
            chunk = wanted[start : start + 500]
            sql = (
                "SELECT digest FROM tether_blobs WHERE digest IN ("
                + ", ".join("?" for _ in chunk)
                + ")"
            )

            def query(sql: str = sql, chunk: list[str] = chunk) -> list[tuple[Any, ...]]:
                return self._all(sql, chunk)

            found.update(str(row[0]) for row in self._read(query))
        return found

    def get_blobs(self, blob_digests: Collection[str]) -> dict[str, bytes]:
        """The bytes stored under each of ``blob_digests`` that has any (in chunks of 500 per query).

        Unverified, as :meth:`get_blob`: the reader checks each against its digest.
        """
        wanted = sorted(set(blob_digests))
        found: dict[str, bytes] = {}
        for start in range(0, len(wanted), 500):
            chunk = wanted[start : start + 500]
            sql = (
                "SELECT digest, body, codec FROM tether_blobs WHERE digest IN ("
                + ", ".join("?" for _ in chunk)
                + ")"
            )

            def query(sql: str = sql, chunk: list[str] = chunk) -> list[tuple[Any, ...]]:
                return self._all(sql, chunk)

            for stored, body, codec in self._read(query):
                found[str(stored)] = stored_bytes(body, codec, f"blob {stored}")
        return found

    def trace(
        self, run_id: str, head: str, limit: int | None = None, *, before: int | None = None
    ) -> list[TraceEvent]:
        """Walk the chain back from ``head``: events an orphaned attempt wrote are not on it.

        Each step back must go to a smaller ``seq``: an edited row that points
        forward (a cycle, or a duplicate seq) ends the walk instead of making it
        endless, and the shortened chain then fails verification. ``before``:
        only events below that seq (the newest ``limit`` of them), still
        reached by their links from ``head``.
        """
        if before is not None:
            return [
                trace_event_of(run_id, row)
                for row in self._walk("tether_trace", TRACE_COLUMNS, run_id, head, limit, before)
            ]
        rows = self._read(
            lambda: self._all(
                """WITH RECURSIVE chain(hash, prev_hash, seq, kind, at, data, action_id, packed,
                                        depth) AS (
                       SELECT hash, prev_hash, seq, kind, at, data, action_id, packed, 1
                         FROM tether_trace WHERE run_id = ? AND hash = ?
                       UNION ALL
                       SELECT t.hash, t.prev_hash, t.seq, t.kind, t.at, t.data, t.action_id,
                              t.packed, c.depth + 1
                         FROM tether_trace t JOIN chain c
                           ON t.run_id = ? AND t.hash = c.prev_hash
                        WHERE (? < 0 OR c.depth < ?) AND t.seq < c.seq
                   )
                   SELECT hash, prev_hash, seq, kind, at, data, action_id, packed
                     FROM chain ORDER BY seq""",
                (run_id, head, run_id, -1 if limit is None else limit, limit or 0),
            )
        )
        return [trace_event_of(run_id, row) for row in rows]

    # -- inbox ---------------------------------------------------------------

    def put_evidence(self, run_id: str, kind: str, document: dict[str, Any]) -> int:
        """Append signed evidence for a run; the signer's tool writes nothing else."""
        if kind not in EVIDENCE_KINDS:
            raise StoreError(f"evidence kind must be one of {sorted(EVIDENCE_KINDS)}, not {kind!r}")
        text = canonical_bytes(document).decode("utf-8")

        def body() -> int:
            self._lock_run(run_id)
            row = self._one("SELECT MAX(seq) FROM tether_inbox WHERE run_id = ?", (run_id,))
            if row is None or row[0] is None:
                seq = 1
            else:
                seq = stored_int(row[0], f"run {run_id}: the inbox's last seq", run_id=run_id) + 1
                if not 1 <= seq < 2**63:
                    raise CheckpointCorruptError(
                        f"run {run_id}: the inbox's last seq {seq - 1} cannot be followed; "
                        "its rows were edited",
                        run_id=run_id,
                    )
            self._run(
                "INSERT INTO tether_inbox (run_id, seq, kind, document, received_at) "
                "VALUES (?, ?, ?, ?, ?)",
                (run_id, seq, kind, text, format_time(datetime.now(UTC))),
            )
            # A run parked for a person waits for exactly this: it is claimable
            # again (once its floor passes) from this commit on.
            self._run(
                "UPDATE tether_marks SET waiting_after = NULL "
                "WHERE run_id = ? AND waiting_after < ?",
                (run_id, seq),
            )
            return seq

        return self._write(body)

    def evidence(self, run_id: str, after: int = 0) -> list[Evidence]:
        """Inbox entries above ``after``, oldest first."""
        rows = self._read(
            lambda: self._all(
                "SELECT seq, kind, document, received_at FROM tether_inbox "
                "WHERE run_id = ? AND seq > ? ORDER BY seq",
                (run_id, after),
            )
        )
        return [evidence_of(run_id, row) for row in rows]

    # -- ledger --------------------------------------------------------------

    def ledger(self, run_id: str) -> list[LedgerEntry]:
        """Every ledger row of the run by sequence number, unverified (see the protocol)."""
        rows = self._read(
            lambda: self._all(
                f"SELECT {LEDGER_COLUMNS} FROM tether_ledger WHERE run_id = ? ORDER BY seq, hash",
                (run_id,),
            )
        )
        return [ledger_entry_of(run_id, row) for row in rows]

    def action_seen(self, run_id: str, action_id: str) -> bool:
        """Whether an intent with this action id was ever recorded for the run."""
        # Every key's first entry is `intended` and lands with the checkpoint
        # that makes the write pending, so a write that never dispatched counts
        # too; the partial index makes this one probe, not a scan.
        row = self._read(
            lambda: self._one(
                "SELECT 1 FROM tether_ledger "
                "WHERE run_id = ? AND action_id = ? AND status = 'intended' LIMIT 1",
                (run_id, action_id),
            )
        )
        return row is not None

    # -- the mark ------------------------------------------------------------

    def get_mark(self, run_id: str) -> Mark | None:
        """The run's mark, or ``None`` when the store has never seen the run."""
        return self._read(lambda: self._mark_row(run_id))

    def runs(self, *, damaged: list[CheckpointCorruptError] | None = None) -> list[Mark]:
        """Every run's mark, by run id.

        A malformed row raises :class:`~tether.core.CheckpointCorruptError`;
        with ``damaged`` given, it is added there instead, so a listing
        shows every other run and names the damaged one.
        """
        rows = self._read(
            lambda: self._all(f"SELECT {MARK_COLUMNS} FROM tether_marks ORDER BY run_id")
        )
        marks: list[Mark] = []
        for row in rows:
            try:
                marks.append(mark_of(row))
            except CheckpointCorruptError as exc:
                if damaged is None:
                    raise
                damaged.append(exc)
        return marks

    def _cas_mark(
        self,
        run_id: str,
        expected_generation: int,
        new_generation: int,
        checkpoint_digest: str,
        expected_lease_version: int,
        phase: str,
        lease_to: LeaseRequest | None = None,
        listing: Listing | None = None,
    ) -> Lease | None:
        phase = phase_text(phase)
        if new_generation != expected_generation + 1:
            raise GenerationConflictError(run_id, expected_generation, new_generation - 1)
        if lease_to is not None and expected_generation != 0:
            raise StoreError(
                f"run {run_id}: a lease is granted with the run's first checkpoint only; "
                "later ones take it with acquire_lease"
            )
        now = format_time(self._now())
        if expected_generation == 0:
            if expected_lease_version == 0:
                columns = [
                    "run_id",
                    "generation",
                    "checkpoint_digest",
                    "state_version",
                    "phase",
                    "updated_at",
                    *LISTING_COLUMNS,
                ]
                params: list[Any] = [
                    run_id,
                    new_generation,
                    checkpoint_digest,
                    new_generation,
                    phase,
                    now,
                    *listing_values(listing),
                ]
                if lease_to is None:
                    # Created free: claimable from now by the store's clock (as a
                    # release is), so it queues behind runs claimable longer, a dead
                    # worker's runs among them; not "since ever", ahead of them all.
                    values = ["?"] * len(columns) + [self.clock_sql]
                    columns.append("retry_at")
                    inserted = self._run(
                        self._insert_ignore("tether_marks", columns, values), params
                    )
                    if inserted == 1:
                        return None
                else:
                    # The run and its lease in ONE statement: no worker can claim
                    # it between its creation and its first holder.
                    values = ["?"] * len(columns) + ["?", "1", f"{self.clock_sql} + ?"]
                    values.append(self.turn_sql)
                    columns += ["lease_owner", "lease_version", "lease_expires_at", "turn"]
                    params += [lease_to.owner, ttl_micros(lease_to.ttl_s)]
                    rows = self._all(
                        f"{self._insert_ignore('tether_marks', columns, values)} "
                        f"RETURNING {MARK_COLUMNS}",
                        params,
                    )
                    if rows:
                        self._turn_taken()
                        return lease_of(mark_of(rows[0]))
            current = self._mark_row(run_id)
            if current is None:
                # Nobody can hold a lease on a run that does not exist yet.
                raise LeaseLostError(run_id, expected_lease_version, None)
            raise GenerationConflictError(run_id, expected_generation, current.generation)
        # Version 0 means "never leased"; a positive version must still be held
        # (released leases do not commit). On PostgreSQL this UPDATE takes the row
        # lock, and a waiting writer re-checks the WHERE against the winner's row.
        moved = self._run(
            "UPDATE tether_marks SET generation = ?, checkpoint_digest = ?, "
            f"state_version = state_version + 1, phase = ?, updated_at = ?, {_SET_LISTING}, "
            f"{MOVED_ON_UNPARKS} "
            "WHERE run_id = ? AND generation = ? AND lease_version = ? "
            "AND (lease_version = 0 OR lease_owner IS NOT NULL)",
            (
                new_generation,
                checkpoint_digest,
                phase,
                now,
                *listing_values(listing),
                run_id,
                expected_generation,
                expected_lease_version,
            ),
        )
        if moved == 1:
            return None
        self._cas_refused(run_id, expected_generation, expected_lease_version)
        return None  # unreachable: _cas_refused raises

    def _cas_refused(
        self, run_id: str, expected_generation: int, expected_lease_version: int
    ) -> None:
        """Explain a refused compare-and-set (the rare path): raise the error that says why."""
        current = self._mark_row(run_id)
        if current is None:
            raise GenerationConflictError(run_id, expected_generation, None)
        # A lost lease is reported first even if the generation moved too: the
        # caller must stop, not reload and retry.
        if current.lease_version != expected_lease_version or (
            current.lease_version != 0 and current.lease_owner is None
        ):
            raise LeaseLostError(
                run_id, expected_lease_version, current.lease_version, current.lease_owner
            )
        raise GenerationConflictError(run_id, expected_generation, current.generation)

    def cas_mark(
        self,
        run_id: str,
        expected_generation: int,
        new_generation: int,
        checkpoint_digest: str,
        expected_lease_version: int = 0,
        *,
        phase: str = "running",
        lease_to: LeaseRequest | None = None,
        listing: Listing | None = None,
    ) -> Lease | None:
        """Move the mark from ``expected_generation`` (0: create) and record ``phase``, or raise.

        ``lease_to`` (first generation only) creates the run leased to that
        worker; the granted lease is returned. ``listing`` is recorded with
        the mark (see the protocol).
        """
        return self._commit_unit(
            lambda: self._cas_mark(
                run_id,
                expected_generation,
                new_generation,
                checkpoint_digest,
                expected_lease_version,
                phase,
                lease_to,
                listing,
            )
        )

    def commit(
        self,
        commit: Commit,
        expected_generation: int,
        expected_lease_version: int = 0,
        before_commit: BeforeCommit | None = None,
        *,
        lease_to: LeaseRequest | None = None,
    ) -> Lease | None:
        """Content and mark in ONE transaction: both land or neither does."""

        def body() -> Lease | None:
            # The CAS goes first so a losing writer fails before writing content.
            lease = self._cas_mark(
                commit.run_id,
                expected_generation,
                commit.generation,
                commit.checkpoint_digest,
                expected_lease_version,
                commit.phase,
                lease_to,
                commit.listing,
            )
            self._put_content(commit)
            if before_commit is not None:
                before_commit()
            return lease

        return self._commit_unit(body)

    def _commit_unit(
        self,
        body: Callable[[], Lease | None],
        alone: Callable[[], Lease | None] | None = None,
        *,
        atomic: Statement | None = None,
    ) -> Lease | None:
        """One fenced commit: with others queued meanwhile (group commit), or alone.

        ``body`` runs inside a write transaction (its own, or a batch's under a
        savepoint); ``alone``, if given, is how the commit is written when it is
        neither grouped nor inside a caller's transaction (a dialect's faster
        unit of work). Inside a caller's transaction it joins that one, as any
        write does. ``atomic``: see :meth:`GroupCommit.submit`.
        """
        group = self._group
        if getattr(self._local, "conn", None) is not None:
            return self._write(body)
        if group is None:
            return self._write(body) if alone is None else alone()
        result: Lease | None = group.submit(body, alone, atomic=atomic)
        return result


#: Every commit records the state's listing with the mark (NULLs when it has none).
_SET_LISTING = ", ".join(f"{column} = ?" for column in LISTING_COLUMNS)
#: Rows per insert statement: well under every driver's limit on parameters
#: (SQLite's was 999 before 3.32), whatever the table.
_ROWS_PER_STATEMENT = 64
_BLOB_COLUMNS = ("digest", "body", "codec")
_TRACE_COLUMNS = (
    "run_id",
    "hash",
    "prev_hash",
    "seq",
    "kind",
    "at",
    "data",
    "action_id",
    "packed",
)
_LEDGER_COLUMNS = (
    "run_id",
    "hash",
    "prev_hash",
    "seq",
    "idempotency_key",
    "status",
    "action_id",
    "intent_digest",
    "receipt",
    "epoch",
    "at",
    "terms",
    "payload",
    "effect",
    "target",
    "packed",
)


def _trace_row(event: TraceEvent, deflate: bool) -> tuple[Any, ...]:
    data, packed = trace_data_columns(event, deflate=deflate)
    return (
        event.run_id,
        event.hash,
        event.prev_hash,
        event.seq,
        event.kind,
        format_time(event.at),
        data,
        action_key(event),
        packed,
    )


def _ledger_row(entry: LedgerEntry, deflate: bool) -> tuple[Any, ...]:
    receipt, terms, payload, packed = ledger_packed_columns(entry, deflate=deflate)
    return (
        entry.run_id,
        entry.hash,
        entry.prev_hash,
        entry.seq,
        entry.idempotency_key,
        entry.status.value,
        entry.action_id,
        entry.intent_digest,
        receipt,
        entry.epoch,
        format_time(entry.at),
        terms,
        payload,
        effect_key(entry),
        target_key(entry),
        packed,
    )


def _version(value: Any) -> int:
    """A recorded migration version, or a typed error (the table was edited)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise MigrationError(
            f"tether_migrations records a version that is not an integer ({value!r:.60}); "
            "the database was edited: restore it from a backup"
        )
    return value
