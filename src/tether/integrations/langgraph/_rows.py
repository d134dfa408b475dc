"""The saver's statements: few of them, and on PostgreSQL fused into as few round trips.

On PostgreSQL every statement is a round trip to the server, and a
super-step with ``durability="sync"`` writes a task's pending writes and
then a checkpoint, each in one transaction. So, beside BEGIN and COMMIT, a
put is two statements (read the mark holding its row; then one
data-modifying CTE that runs the compare-and-set of the mark and the
inserts) and a put_writes one or two (hold the mark and insert the rows;
then the manifest, when the writes are the latest checkpoint's). Rare cases
(writes stored before their checkpoint, a key already taken) add one or
two, and so does a thread's first checkpoint (no mark row to hold yet: an
advisory lock on the thread, and the mark read again). SQLite runs the same steps as separate statements in-process, under
the write lock its ``BEGIN IMMEDIATE`` already holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tether.core import CheckpointCorruptError
from tether.store import PostgresStore, SQLBase, SQLStatements

MARK_COLUMNS = (
    "thread_id",
    "checkpoint_ns",
    "checkpoint_id",
    "envelope_digest",
    "seq",
    "lineage",
    "writes",
)
WRITE_COLUMNS = (
    "thread_id",
    "checkpoint_ns",
    "checkpoint_id",
    "task_id",
    "idx",
    "kind",
    "body",
    "envelope",
)
BLOB_COLUMNS = ("thread_id", "checkpoint_ns", "digest", "kind", "body")
CHECKPOINT_COLUMNS = ("thread_id", "checkpoint_ns", "checkpoint_id", "seq", "envelope")

#: Rows per multi-row insert: far below SQLite's bound on parameters per statement.
BATCH = 200

_SELECT_MARK = (
    "SELECT checkpoint_id, envelope_digest, seq, lineage, writes FROM tether_lg_marks "
    "WHERE thread_id = ? AND checkpoint_ns = ?"
)
_MOVE_MARK = (
    "UPDATE tether_lg_marks SET checkpoint_id = ?, envelope_digest = ?, seq = ?, writes = ? "
    "WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ? AND seq = ?"
)
_SET_MANIFEST = (
    "UPDATE tether_lg_marks SET writes = ? WHERE thread_id = ? AND checkpoint_ns = ? "
    "AND checkpoint_id = ? AND seq = ?"
)
_EARLY_WRITES = (
    "SELECT task_id, idx, envelope FROM tether_lg_writes WHERE thread_id = ? AND "
    "checkpoint_ns = ? AND checkpoint_id = ?"
)


@dataclass(frozen=True, slots=True)
class Mark:
    """A thread's high-water mark as stored."""

    checkpoint_id: str
    envelope_digest: str
    seq: int
    lineage: str
    #: The sealed manifest of this checkpoint's pending writes (``None``: a mark
    #: from before manifests were kept).
    writes: bytes | None = None


class SaverRows:
    """The statements of one saver, in its store's dialect."""

    def __init__(self, store: SQLBase) -> None:
        #: PostgreSQL: statements fused with data-modifying CTEs, the mark's row
        #: locked with FOR UPDATE. SQLite: BEGIN IMMEDIATE holds the database.
        self.fused = isinstance(store, PostgresStore)
        self._lock = " FOR UPDATE" if self.fused else ""

    def mark(self, tx: SQLStatements, thread_id: str, ns: str) -> Mark | None:
        """The thread's mark, read without holding it (reads, and refusal messages)."""
        return mark_of(tx.one(_SELECT_MARK, (thread_id, ns)), thread_id)

    def hold_mark(self, tx: SQLStatements, thread_id: str, ns: str) -> Mark | None:
        """The thread's mark, its row held until the transaction ends.

        A writer of the same thread waits here, then reads the mark it left:
        puts and pending writes of one thread go one after another. One
        statement while the thread has a mark; a thread with none yet has no
        row to hold, so on PostgreSQL its writers take :meth:`hold_thread`.
        """
        mark = mark_of(tx.one(_SELECT_MARK + self._lock, (thread_id, ns)), thread_id)
        if mark is None and self.fused:
            return self.hold_thread(tx, thread_id, ns)
        return mark

    def hold_thread(self, tx: SQLStatements, thread_id: str, ns: str) -> Mark | None:
        """PostgreSQL, a thread with no mark: hold the thread itself, then read its mark again.

        A transaction-scoped advisory lock on (thread, namespace) stands in for
        the row that is not there yet, so a first put and the pending writes
        racing it go one after another: whichever comes second sees what the
        first committed (the early writes a first put adopts, or the mark a
        put_writes then lists its rows on). The mark is read in a statement of
        its own, after the lock: a statement reads what was committed when it
        began. SQLite needs none of this: BEGIN IMMEDIATE holds the database.
        """
        tx.one(
            "SELECT pg_advisory_xact_lock(hashtextextended(?, 0))", (_thread_key(thread_id, ns),)
        )
        return mark_of(tx.one(_SELECT_MARK + self._lock, (thread_id, ns)), thread_id)

    def early_writes(self, tx: SQLStatements, ids: tuple[str, str, str]) -> list[tuple[Any, ...]]:
        """``(task_id, idx, envelope)`` of every pending write stored for the checkpoint ``ids``."""
        return tx.all(_EARLY_WRITES, ids)

    def move_mark(
        self,
        tx: SQLStatements,
        ids: tuple[str, str, str],
        mark: Mark,
        new: tuple[str, int, bytes],
        checkpoint: bytes,
        blobs: Sequence[tuple[str, str, bytes]],
    ) -> tuple[int, int]:
        """CAS the held mark to checkpoint ``ids`` and store its row and new blobs.

        ``new`` is the mark's (envelope digest, seq, sealed writes manifest);
        ``blobs`` are (digest, kind, body). Returns (marks moved, pending writes
        already stored for the checkpoint): when the second is not 0 the
        manifest just written lacks them and the caller records them.
        """
        thread_id, ns, checkpoint_id = ids
        digest, seq, writes = new
        cas = (checkpoint_id, digest, seq, writes, thread_id, ns, mark.checkpoint_id, mark.seq)
        row = (thread_id, ns, checkpoint_id, seq, checkpoint)
        blob_rows = [(thread_id, ns, d, kind, body) for d, kind, body in blobs]
        if self.fused and len(blob_rows) <= BATCH:
            # The mark's row is held: the writes counted here are every one stored
            # before this transaction, and the CAS cannot lose (a rollback undoes
            # the inserts if it did).
            sql = (
                f"WITH early AS ({_EARLY_WRITES}), "
                f"moved AS ({_MOVE_MARK} RETURNING 1), "
                f"cp AS ({_insert('tether_lg_checkpoints', CHECKPOINT_COLUMNS, 1, ignore=False)})"
            )
            params: list[Any] = [*ids, *cas, *row]
            if blob_rows:
                sql += f", bl AS ({_insert('tether_lg_blobs', BLOB_COLUMNS, len(blob_rows))})"
                params += [v for r in blob_rows for v in r]
            sql += " SELECT (SELECT count(*) FROM moved), (SELECT count(*) FROM early)"
            got = tx.one(sql, params)
            if got is None:
                raise CheckpointCorruptError(f"thread {thread_id!r}: the mark's CAS said nothing")
            return int(got[0]), int(got[1])
        early = len(self.early_writes(tx, ids))
        moved = tx.run(_MOVE_MARK, cas)
        if moved == 1:
            tx.run(_insert("tether_lg_checkpoints", CHECKPOINT_COLUMNS, 1, ignore=False), row)
            insert_many(tx, "tether_lg_blobs", BLOB_COLUMNS, blob_rows)
        return moved, early

    def first_mark(
        self,
        tx: SQLStatements,
        ids: tuple[str, str, str],
        new: tuple[str, int, str, bytes],
        checkpoint: bytes,
        blobs: Sequence[tuple[str, str, bytes]],
    ) -> int:
        """Insert the thread's first mark (digest, seq, lineage, writes) and its checkpoint.

        Returns the marks inserted: 0 when another writer's first mark is there.
        """
        thread_id, ns, checkpoint_id = ids
        digest, seq, lineage, writes = new
        moved = tx.run(
            _insert("tether_lg_marks", MARK_COLUMNS, 1),
            (thread_id, ns, checkpoint_id, digest, seq, lineage, writes),
        )
        if moved == 1:
            tx.run(
                _insert("tether_lg_checkpoints", CHECKPOINT_COLUMNS, 1, ignore=False),
                (thread_id, ns, checkpoint_id, seq, checkpoint),
            )
            insert_many(
                tx,
                "tether_lg_blobs",
                BLOB_COLUMNS,
                [(thread_id, ns, d, kind, body) for d, kind, body in blobs],
            )
        return moved

    def hold_and_insert(
        self, tx: SQLStatements, rows: Sequence[tuple[Any, ...]]
    ) -> tuple[Mark | None, int]:
        """PostgreSQL: hold the mark of the rows' thread and insert the rows, in one statement.

        Returns (the mark as held, rows inserted). The insert may run before
        the lock is granted; that is safe because nothing reads a checkpoint's
        writes as settled but a manifest, and the manifest is written only
        under the held mark, which a put moving the mark waits for. Rows whose
        key is taken are skipped, for the caller to settle.
        """
        thread_id, ns = rows[0][0], rows[0][1]
        sql = (
            f"WITH m AS ({_SELECT_MARK} FOR UPDATE), "
            f"ins AS ({_insert('tether_lg_writes', WRITE_COLUMNS, len(rows))} RETURNING 1) "
            "SELECT m.checkpoint_id, m.envelope_digest, m.seq, m.lineage, m.writes, "
            "(SELECT count(*) FROM ins) FROM (SELECT 1) AS one LEFT JOIN m ON true"
        )
        got = tx.one(sql, [thread_id, ns, *(v for r in rows for v in r)])
        if got is None:
            raise CheckpointCorruptError(f"thread {thread_id!r}: the writes' insert said nothing")
        mark = mark_of(None if got[0] is None else got[:5], thread_id)
        if mark is None:  # no row held: a first put may be racing these writes
            mark = self.hold_thread(tx, thread_id, ns)
        return mark, int(got[5])

    def insert_writes(
        self,
        tx: SQLStatements,
        ids: tuple[str, str, str],
        rows: Sequence[tuple[Any, ...]],
        manifest: tuple[bytes, int] | None,
    ) -> tuple[int, bool]:
        """Insert pending-write rows (``WRITE_COLUMNS``); rows whose key is taken are skipped.

        ``manifest`` is (sealed manifest, mark seq) to put on the held mark of
        the rows' checkpoint if every row was inserted. Returns (rows inserted,
        whether the manifest was put); a manifest not put is the caller's to
        record once it has settled the skipped rows.
        """
        inserted = insert_many(tx, "tether_lg_writes", WRITE_COLUMNS, rows)
        if manifest is None or inserted != len(rows):
            return inserted, False
        self.set_manifest(tx, ids, manifest)
        return inserted, True

    def set_manifest(
        self, tx: SQLStatements, ids: tuple[str, str, str], manifest: tuple[bytes, int]
    ) -> int:
        """Put a sealed manifest on the mark naming checkpoint ``ids`` at its seq; rows changed."""
        return tx.run(_SET_MANIFEST, (manifest[0], *ids, manifest[1]))

    def stored_writes(
        self, tx: SQLStatements, ids: tuple[str, str, str], task_id: str, idxs: Sequence[int]
    ) -> dict[int, Any]:
        """The stored envelope of each of a task's writes at ``idxs``, by idx."""
        marks = ", ".join("?" for _ in idxs)
        found = tx.all(
            "SELECT idx, envelope FROM tether_lg_writes WHERE thread_id = ? AND "
            f"checkpoint_ns = ? AND checkpoint_id = ? AND task_id = ? AND idx IN ({marks})",
            (*ids, task_id, *idxs),
        )
        return {row[0]: row[1] for row in found}


def _thread_key(thread_id: str, ns: str) -> str:
    # Unambiguous for any two strings (the length first), and free of NUL, which
    # PostgreSQL's text cannot hold.
    return f"{len(thread_id)}:{thread_id}{ns}"


def insert_many(
    tx: SQLStatements, table: str, columns: Sequence[str], rows: Sequence[tuple[Any, ...]]
) -> int:
    """Insert ``rows``, skipping any whose key is stored, in as few statements as fit; rows inserted."""
    inserted = 0
    for start in range(0, len(rows), BATCH):
        batch = rows[start : start + BATCH]
        inserted += tx.run(_insert(table, columns, len(batch)), [v for row in batch for v in row])
    return inserted


def _insert(table: str, columns: Sequence[str], rows: int, *, ignore: bool = True) -> str:
    # ON CONFLICT DO NOTHING is the same on PostgreSQL and SQLite (3.24 and later;
    # tether's stores already need 3.35 for RETURNING). A checkpoint row is never
    # skipped: one already stored under its id is an error, not a no-op.
    row = "(" + ", ".join("?" for _ in columns) + ")"
    sql = f"INSERT INTO {table} ({', '.join(columns)}) VALUES " + ", ".join([row] * rows)
    return sql + " ON CONFLICT DO NOTHING" if ignore else sql


def mark_of(row: tuple[Any, ...] | None, thread_id: str) -> Mark | None:
    """The mark a ``_SELECT_MARK`` row holds, its columns checked."""
    if row is None:
        return None
    seq = row[2]
    if isinstance(seq, bool) or not isinstance(seq, int):
        raise CheckpointCorruptError(f"thread {thread_id!r}: mark seq is damaged", run_id=thread_id)
    writes = row[4]
    if writes is not None and not isinstance(writes, bytes | bytearray | memoryview):
        raise CheckpointCorruptError(f"thread {thread_id!r}: mark writes are not bytes")
    return Mark(
        text(row[0], "mark checkpoint_id"),
        text(row[1], "mark envelope_digest"),
        seq,
        text(row[3], "mark lineage"),
        None if writes is None else bytes(writes),
    )


def text(value: Any, what: str) -> str:
    """``value``, which a stored column must hold as text."""
    if not isinstance(value, str):
        raise CheckpointCorruptError(f"stored {what} is not text")
    return value
