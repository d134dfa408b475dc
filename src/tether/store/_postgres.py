"""PostgresStore: many workers on many machines pointed at one PostgreSQL database.

psycopg 3 with a ``psycopg_pool.ConnectionPool``; one connection is checked
out per unit of work. The SQL is :class:`~tether.store.SQLBase`'s; this
module only supplies the dialect.

Transaction strategy: READ COMMITTED, and every statement that moves a mark
or a lease is ONE conditional ``UPDATE`` (or an insert-if-absent on the
primary key). PostgreSQL row-locks the mark for that statement's
transaction, and a writer that waited for the lock re-checks its WHERE
against the winner's committed row, so a compare-and-set on (generation,
lease version) is exact without SERIALIZABLE. The claim scan locks what it
picks with ``FOR UPDATE SKIP LOCKED`` and so never waits. The one
read-then-write (the ledger's "last status, then append") takes a
transaction-scoped advisory lock on the run first. SERIALIZABLE was the
alternative; it was not chosen because its false-positive serialization
failures (predicate locks on index pages, e.g. under the claim scan) would
force whole-transaction retries, and a retry re-runs the caller's
``before_commit`` hook; here retries are a safety net for deadlocks and
serialization failures that this scheme does not expect to see.

Expiry is judged by ``clock_timestamp()`` (the server's real time, not the
transaction's start), so workers with skewed clocks agree.

A run open without a lease is held for its process by a session-level
``pg_try_advisory_lock`` on a connection of its own, outside the pool (see
``_runlock``): it dies with that connection, so with the process.
"""

from __future__ import annotations

import hashlib
import json
import os
import select
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from tether.core import (
    MigrationError,
    StoreError,
    StoreUnavailableError,
    WriteOnceError,
    format_time,
)
from tether.store._codec import blob_rows, pack
from tether.store._engine import value_rows
from tether.store._group import GroupCommit, Statement
from tether.store._protocols import BeforeCommit, Commit, Lease, LeaseRequest
from tether.store._rows import (
    action_key,
    effect_key,
    ledger_packed_columns,
    listing_values,
    phase_text,
    target_key,
    trace_data_columns,
)
from tether.store._runlock import HoldsRuns, NoLock, ProcessLock
from tether.store._schema import ACTION_KINDS, MOVED_ON_UNPARKS, kinds_sql, migrations
from tether.store._sql import SQLBase

if TYPE_CHECKING:
    from psycopg import Connection
    from psycopg_pool import ConnectionPool

INSTALL_HINT = "pip install 'tether[postgres]'"
#: Seconds libpq may take to connect (per address tried) unless the DSN says otherwise.
CONNECT_TIMEOUT_S = 3

# One checkpoint commit as ONE statement. Data-modifying CTEs share one
# snapshot and one transaction; each insert selects from the CAS, so it
# writes nothing unless the mark moved. Trace and ledger rows use plain
# INSERTs: a conflict aborts everything. Blobs are shared by content, so an
# existing one is simply there already.
#
# Rows travel as three JSON documents (trace, ledger, blobs) rather than one
# array parameter per column: psycopg adapts a text parameter in one step,
# where sixteen typed arrays cost more client CPU than the rest of the
# commit's SQL work. Values arrive as JSON strings and numbers and are
# stored as the same text (json_to_recordset does not re-encode a string),
# so what the hashes cover is what lands; blob bodies travel as hex.
_COMMIT_STATEMENT = """
WITH cas AS (
    UPDATE tether_marks SET generation = %s, checkpoint_digest = %s,
           state_version = state_version + 1, phase = %s, updated_at = %s,
           epoch = %s, subject = %s, pending_action = %s, gate = %s, approved_until = %s,
           {moved_on_unparks}
     WHERE run_id = %s AND generation = %s AND lease_version = %s
       AND (lease_version = 0 OR lease_owner IS NOT NULL)
    RETURNING run_id, generation, checkpoint_digest
), checkpoint AS (
    INSERT INTO tether_checkpoints (run_id, checkpoint_digest, generation, envelope, codec)
    SELECT run_id, checkpoint_digest, generation, %s::bytea, %s FROM cas
    RETURNING 1
), trace AS (
    INSERT INTO tether_trace (run_id, hash, prev_hash, seq, kind, at, data, action_id, packed)
    SELECT cas.run_id, e.h, e.p, e.s, e.k, e.a, e.d, e.x, decode(e.z, 'hex')
      FROM cas, json_to_recordset(%s::json)
           AS e(h text, p text, s bigint, k text, a text, d text, x text, z text)
    RETURNING 1
), ledger AS (
    INSERT INTO tether_ledger (run_id, hash, prev_hash, seq, idempotency_key, status,
                               action_id, intent_digest, receipt, epoch, at, terms, payload,
                               effect, stored_us, target, packed)
    SELECT cas.run_id, l.h, l.p, l.s, l.k, l.st, l.ac, l.i, l.r, l.ep, l.a, l.t, l.y, l.x,
           (EXTRACT(EPOCH FROM clock_timestamp()) * 1000000)::BIGINT, l.g, decode(l.z, 'hex')
      FROM cas, json_to_recordset(%s::json)
           AS l(h text, p text, s bigint, k text, st text, ac text, i text, r text,
                ep bigint, a text, t text, y text, x text, g text, z text)
    RETURNING 1
), blobs AS (
    INSERT INTO tether_blobs (digest, body, codec)
    SELECT b.g, decode(b.b, 'hex'), b.c
      FROM cas, json_to_recordset(%s::json) AS b(g text, b text, c text)
    ON CONFLICT DO NOTHING
    RETURNING 1
)
SELECT (SELECT count(*) FROM cas), (SELECT count(*) FROM checkpoint),
       (SELECT count(*) FROM trace), (SELECT count(*) FROM ledger), (SELECT count(*) FROM blobs)
""".replace("{moved_on_unparks}", MOVED_ON_UNPARKS)

# Advisory lock keys. The two-key form (class, run hash) and the one-key form
# are separate key spaces in PostgreSQL, so run locks never meet the migrator's.
_MIGRATION_LOCK = 0x746574686572  # b"tether"
_RUN_LOCK_CLASS = 0x74657468  # b"teth"

# SQLSTATEs that mean the session is gone: connection exceptions (class 08) and
# operator intervention (the server shut the backend down).
_GONE_STATES = ("08", "57P01", "57P02", "57P03")


def _hexed(names: Sequence[str], values: Sequence[Any]) -> dict[str, Any]:
    """``values`` by ``names`` for the commit statement's JSON, bytes as hex (bytea in JSON)."""
    return {
        name: value.hex() if isinstance(value, bytes) else value
        for name, value in zip(names, values, strict=True)
    }


def _conninfo(dsn: str) -> dict[str, Any]:
    """The DSN's parameters (empty when it cannot be parsed: libpq then says why)."""
    try:
        from psycopg.conninfo import conninfo_to_dict

        return dict(conninfo_to_dict(dsn))
    except Exception:
        return {}


def _describe(dsn: str) -> str:
    """Host, port and database of a DSN, never its password."""
    parts = _conninfo(dsn)
    if not parts:
        return "(unparseable DSN)"
    host = parts.get("host") or "localhost"
    port = parts.get("port") or "5432"
    return f"postgresql://{host}:{port}/{parts.get('dbname') or ''}"


def _read_committed(conn: Connection[Any]) -> None:
    """Every pooled connection runs READ COMMITTED, whatever the server's default.

    The compare-and-set scheme above is designed for it; a server configured
    for SERIALIZABLE would add retries this store does not expect.
    """
    conn.execute("SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL READ COMMITTED")


def _read_only(conn: Connection[Any]) -> None:
    """A read-only store's sessions: the server itself refuses any write, not only this code."""
    conn.execute(
        "SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL READ COMMITTED, READ ONLY"
    )


def _one_line(exc: BaseException) -> str:
    """A driver message on one line: libpq's run over several, with tabs and hints."""
    text = " ".join(str(exc).split())
    for prefix in ("connection failed: ",):
        if text.startswith(prefix):
            text = text[len(prefix) :]
    return text.replace("FATAL: ", "")


class PostgresStore(SQLBase, HoldsRuns):
    """Checkpoint content, marks and leases in PostgreSQL (needs the ``[postgres]`` extra)."""

    blob_type = "BYTEA"
    placeholder = "%s"
    clock_sql = "(EXTRACT(EPOCH FROM clock_timestamp()) * 1000000)::BIGINT"
    # Rows from before migration 10: their keys read from their JSON by a function
    # that lives for the migration only. \u0000 has no text form here; read as
    # U+FFFD, as the column keeps it. A row that is not JSON keeps NULL.
    index_backfill = (
        """CREATE FUNCTION pg_temp.tether_json_text(doc text, field text) RETURNS text
           LANGUAGE plpgsql AS $f$
           DECLARE j jsonb;
           BEGIN
               j := replace(doc, '\\u0000', '\\ufffd')::jsonb;
               IF jsonb_typeof(j -> field) = 'string' THEN
                   RETURN j ->> field;
               END IF;
               RETURN NULL;
           EXCEPTION WHEN others THEN
               RETURN NULL;
           END
           $f$""",
        "UPDATE tether_ledger SET effect = pg_temp.tether_json_text(terms, 'effect') "
        "WHERE terms IS NOT NULL",
        "UPDATE tether_trace SET action_id = pg_temp.tether_json_text(data, 'action_id') "
        f"WHERE {kinds_sql(ACTION_KINDS)}",
        "DROP FUNCTION pg_temp.tether_json_text(text, text)",
    )
    skip_locked = " FOR UPDATE SKIP LOCKED"
    # Migration 11's turn counter: a sequence, so concurrent claimers never queue on it.
    turn_counter = ("CREATE SEQUENCE tether_turns",)

    def __init__(
        self,
        dsn: str,
        *,
        max_connections: int = 10,
        timeout_s: float = 30.0,
        retries: int = 5,
        connect_timeout_s: int = CONNECT_TIMEOUT_S,
        read_only: bool = False,
        create: bool = True,
    ) -> None:
        """Open a pool (1 to ``max_connections``) on ``dsn`` and apply missing migrations.

        ``dsn`` is a libpq URL or key=value string; set the schema with
        ``options=-csearch_path=NAME``. ``timeout_s`` bounds every wait for a
        free connection. One connection is tried first, bounded by
        ``connect_timeout_s`` (libpq's ``connect_timeout``, unless the DSN or
        ``PGCONNECT_TIMEOUT`` sets one): a server that is down or a database
        that does not exist fails at once, in one line, instead of after the
        pool's retries.

        ``create=False``: the database must already hold a tether store (one
        of an older schema is migrated). ``read_only``: nothing is created or
        migrated, every session is read-only, and the schema must be this
        tether's.
        """
        super().__init__()
        # Commits from many threads (a worker driving many runs) that wait for one
        # another are written in one transaction: one WAL flush for all. At most 64:
        # each commit's savepoint that writes takes a subtransaction id, and past
        # 64 in one transaction PostgreSQL's per-backend cache of them overflows
        # (every other session's snapshots then look them up on disk).
        self._group = GroupCommit(self, max_batch=64)
        try:
            import psycopg  # noqa: F401
            from psycopg_pool import ConnectionPool, PoolTimeout
        except ImportError as exc:
            raise StoreUnavailableError(
                f"PostgresStore needs psycopg 3 and psycopg-pool: {INSTALL_HINT}"
            ) from exc
        if max_connections < 1:
            raise StoreError(f"max_connections must be at least 1, not {max_connections}")
        self.retries = retries
        self.read_only = read_only
        self._where = _describe(dsn)
        connect: dict[str, Any] = {"autocommit": True}
        if "connect_timeout" not in _conninfo(dsn) and "PGCONNECT_TIMEOUT" not in os.environ:
            connect["connect_timeout"] = connect_timeout_s
        # For the run holds' own connection (see _try_hold).
        self._dsn, self._connect = dsn, connect
        self._first_connection(dsn, connect, must_exist=read_only or not create)
        self._pool: ConnectionPool[Connection[Any]] = ConnectionPool(
            dsn,
            min_size=1,
            max_size=max_connections,
            kwargs=connect,
            configure=_read_only if read_only else _read_committed,
            open=False,
            timeout=timeout_s,
            name="tether",
        )
        try:
            self._pool.open(wait=True, timeout=timeout_s)
        except PoolTimeout as exc:
            self._pool.close()
            raise StoreUnavailableError(
                f"cannot reach PostgreSQL at {self._where} within {timeout_s:g} s; "
                "check the DSN and that the server is up"
            ) from exc
        except Exception as exc:
            self._pool.close()
            raise StoreUnavailableError(
                f"cannot open PostgreSQL store {self._where}: {exc}"
            ) from exc
        if read_only:
            return  # _first_connection found this tether's schema there
        try:
            self.migrate()
        except BaseException:
            self._pool.close()
            raise

    def _first_connection(self, dsn: str, connect: dict[str, Any], *, must_exist: bool) -> None:
        """Connect once before the pool does: refused, unknown or not a tether store, say so now.

        The pool retries a failed connection until its timeout, logging each
        try; one direct attempt fails at once with the server's own reason.
        """
        import psycopg

        try:
            conn = psycopg.connect(dsn, **connect)
        except psycopg.Error as exc:
            raise StoreUnavailableError(
                f"cannot reach PostgreSQL at {self._where}: {_one_line(exc)}"
            ) from exc
        try:
            if must_exist:
                self._check_schema(conn)
        except psycopg.Error as exc:
            raise StoreUnavailableError(
                f"cannot read PostgreSQL store {self._where}: {_one_line(exc)}"
            ) from exc
        finally:
            conn.close()

    def _check_schema(self, conn: Connection[Any]) -> None:
        """The database holds a tether store; a read-only one must hold this tether's schema."""
        newest = max(version for version, _ in migrations(self.blob_type))
        row = conn.execute("SELECT to_regclass('tether_migrations') IS NOT NULL").fetchone()
        if row is None or not row[0]:
            raise StoreUnavailableError(
                f"{self._where} holds no tether store (no tether tables in its search path); "
                "a worker or `tether start` creates one"
            )
        row = conn.execute("SELECT MAX(version) FROM tether_migrations").fetchone()
        found = None if row is None else row[0]
        if not isinstance(found, int) or isinstance(found, bool):
            raise StoreUnavailableError(f"{self._where} records no tether schema version")
        if found > newest:
            raise MigrationError(
                f"database schema version {found} is newer than this tether ({newest}); "
                "upgrade tether"
            )
        if found < newest and self.read_only:
            raise StoreUnavailableError(
                f"{self._where} is at schema version {found}, this tether needs {newest}: "
                "open it once read-write to migrate it (your program's next run, a `tether worker`, "
                "or in Python `tether.store.open_store(URL).close()`)"
            )

    def __repr__(self) -> str:
        return f"PostgresStore({self._where!r})"

    def close(self) -> None:
        """Close the pool (idempotent); later calls raise StoreUnavailableError."""
        self._pool.close()

    def __enter__(self) -> PostgresStore:
        return self

    # -- dialect hooks -------------------------------------------------------

    @contextmanager
    def _connection(self) -> Iterator[Connection[Any]]:
        with self._pool.connection() as conn:
            yield conn

    @contextmanager
    def _transaction(self, conn: Any) -> Iterator[None]:
        with conn.transaction():
            yield

    def commit(
        self,
        commit: Commit,
        expected_generation: int,
        expected_lease_version: int = 0,
        before_commit: BeforeCommit | None = None,
        *,
        lease_to: LeaseRequest | None = None,
    ) -> Lease | None:
        """Content and mark in ONE statement: one round trip, its own transaction.

        The compare-and-set is the statement's first part and every insert
        selects from it, so a refused CAS writes nothing; a row that already
        exists (never expected here: hashes cover content) aborts the whole
        statement. The diagnostic read runs only on the rare refused path.
        The genesis commit (an insert-if-absent of the mark) takes the
        general path.
        """
        if expected_generation == 0 or commit.generation != expected_generation + 1:
            return super().commit(
                commit,
                expected_generation,
                expected_lease_version,
                before_commit,
                lease_to=lease_to,
            )
        if lease_to is not None:
            raise StoreError("a lease is granted with the run's first checkpoint only")
        self._check_sealed(commit)
        trace = [
            {
                "h": e.hash,
                "p": e.prev_hash,
                "s": e.seq,
                "k": e.kind,
                "a": format_time(e.at),
                **_hexed(("d", "z"), trace_data_columns(e, deflate=self.deflate)),
                "x": action_key(e),
            }
            for e in commit.events
        ]
        ledger = [
            {
                **_hexed(("r", "t", "y", "z"), ledger_packed_columns(e, deflate=self.deflate)),
                "h": e.hash,
                "p": e.prev_hash,
                "s": e.seq,
                "k": e.idempotency_key,
                "st": e.status.value,
                "ac": e.action_id,
                "i": e.intent_digest,
                "ep": e.epoch,
                "a": format_time(e.at),
                "x": effect_key(e),
                "g": target_key(e),
            }
            for e in commit.ledger
        ]
        # Envelope and blobs in their stored form (tether.store._codec).
        stored = blob_rows(commit.blobs or {}, deflate=self.deflate)
        blobs = [{"g": d, "b": b.hex(), "c": c} for d, b, c in stored]
        params = (
            commit.generation,
            commit.checkpoint_digest,
            phase_text(commit.phase),
            format_time(self._now()),
            *listing_values(commit.listing),
            commit.run_id,
            expected_generation,
            expected_lease_version,
            *pack(commit.envelope, deflate=self.deflate),
            json.dumps(trace, ensure_ascii=False),
            json.dumps(ledger, ensure_ascii=False),
            json.dumps(blobs),
        )

        def statement() -> tuple[Any, ...] | None:
            if before_commit is not None:
                before_commit()  # "inside the commit": nothing has been sent yet
            return self._one(_COMMIT_STATEMENT, params)

        def refused() -> None:
            self._cas_refused(commit.run_id, expected_generation, expected_lease_version)

        def alone() -> None:
            # The statement is its own transaction; the rare refusal is explained after.
            row = self._statement(statement)
            if row is None or int(row[0]) != 1:
                self._read(refused)

        def grouped() -> None:
            # Inside a transaction with other runs' commits. Refused, the statement
            # wrote nothing, so the error is explained in it and the rest land.
            row = statement()
            if row is None or int(row[0]) != 1:
                refused()

        # In a batch: no savepoint, and sent with the others at once (see _statements);
        # a database error has the batch written again one commit at a time.
        self._commit_unit(
            grouped, alone, atomic=Statement(_COMMIT_STATEMENT, params, before_commit, refused)
        )
        return None

    def _statements(self, statements: Sequence[tuple[str, Sequence[Any]]]) -> list[bool]:
        # Pipelined: every statement is sent before any answer is read, so a batch
        # costs the leader one wait for the server, not one per commit (each wait
        # also hands the GIL to the worker's other threads, and getting it back
        # is slow).
        conn = self._local.conn
        with conn.pipeline():
            cursors = [conn.execute(self._q(sql), tuple(params)) for sql, params in statements]
        landed = []
        for cursor in cursors:
            row = cursor.fetchone()
            landed.append(row is not None and row[0] == 1)
        return landed

    def _lock_migrations(self) -> None:
        # Taken before CREATE TABLE IF NOT EXISTS, which is itself not safe
        # against a concurrent creator; released when the migration commits.
        self._execute(f"SELECT pg_advisory_xact_lock({_MIGRATION_LOCK})")

    def _lock_run(self, run_id: str) -> None:
        # A hash collision only serializes two runs' appends; it never unlocks one.
        self._execute(f"SELECT pg_advisory_xact_lock({_RUN_LOCK_CLASS}, hashtext(?))", (run_id,))

    def _hold_place(self) -> str:
        return f"{self._where} (DSN {_place_key(self._dsn)})"

    def _try_hold(self, run_id: str) -> ProcessLock | None:
        if self.read_only:
            return NoLock()  # a read-only store commits nothing, so it acts on no run
        import psycopg

        try:
            return _AdvisoryLock.take(self._dsn, self._connect, run_id)
        except psycopg.Error as exc:
            raise StoreUnavailableError(
                f"cannot lock run {run_id!r} in PostgreSQL store {self._where}: {_one_line(exc)}"
            ) from exc

    def _insert_ignore(
        self,
        table: str,
        columns: Sequence[str],
        values: Sequence[str] | None = None,
        *,
        rows: int = 1,
    ) -> str:
        return (
            f"INSERT INTO {table} ({', '.join(columns)}) VALUES "
            + value_rows(columns, values, rows)
            + " ON CONFLICT DO NOTHING"
        )

    def _retryable(self, exc: Exception) -> bool:
        from psycopg import errors

        return isinstance(exc, errors.SerializationFailure | errors.DeadlockDetected)

    def _probe(self, conn: Any) -> None:
        # An idle connection in autocommit has nothing to say; if its socket is
        # readable the server closed it (or sent something unasked). Either way
        # it is not trusted with a write: closed, so the pool replaces it.
        import psycopg

        # poll, not select: select() cannot take a descriptor >= 1024.
        poller = select.poll()
        poller.register(conn.pgconn.socket, select.POLLIN | select.POLLERR | select.POLLHUP)
        if poller.poll(0):
            conn.close()
            raise psycopg.OperationalError("the server closed this idle connection")

    def _disconnected(self, exc: Exception) -> bool:
        import psycopg
        from psycopg_pool import PoolClosed, PoolTimeout

        if not isinstance(exc, psycopg.OperationalError) or isinstance(
            exc, PoolClosed | PoolTimeout
        ):
            return False
        state = exc.sqlstate
        gone = state is None or state.startswith(_GONE_STATES)
        if gone:
            # Idle connections died with this one (a server restart): replace
            # them now so the retry does not draw another dead one.
            self._pool.check()
        return gone

    def _translate(self, exc: Exception) -> StoreError | None:
        import psycopg
        from psycopg import errors
        from psycopg_pool import PoolClosed, PoolTimeout

        where = self._where
        if isinstance(exc, errors.UniqueViolation):
            return WriteOnceError(f"PostgreSQL refused a write-once violation: {exc}")
        if isinstance(exc, PoolClosed):
            return StoreUnavailableError(f"PostgreSQL store {where} is closed")
        if isinstance(exc, PoolTimeout):
            return StoreUnavailableError(
                f"no PostgreSQL connection to {where} became free in time; "
                "raise max_connections or lower the load"
            )
        if isinstance(exc, errors.SerializationFailure | errors.DeadlockDetected):
            return StoreUnavailableError(f"PostgreSQL store {where}: transaction conflict: {exc}")
        if isinstance(exc, psycopg.OperationalError):
            return StoreUnavailableError(
                f"PostgreSQL store {where} failed: {exc}; if this was a write, "
                "read the mark to learn whether it landed"
            )
        if isinstance(exc, psycopg.Error):
            return StoreError(f"PostgreSQL store {where} failed: {exc}")
        return None


def _place_key(dsn: str) -> str:
    """A short name for ``dsn`` that says nothing of its password (it names a place in errors)."""
    return hashlib.sha256(dsn.encode()).hexdigest()[:12]


class _HoldingConnection:
    """The one connection of this process, per DSN, that holds its runs' advisory locks.

    Outside the pool: a pooled connection is reset and handed to others, and
    one per run would drain the pool. A session-level advisory lock dies with
    its connection, so the server drops them all when the process dies.
    """

    def __init__(self, dsn: str, connect: dict[str, Any]) -> None:
        import psycopg

        self.dsn = dsn
        self.conn = psycopg.connect(dsn, **connect)
        row = self.conn.execute("SELECT current_schema()").fetchone()
        # Advisory locks are per database; the schema tells two stores in one apart.
        self.schema = "" if row is None or row[0] is None else str(row[0])
        self.locks = 0

    def alive(self) -> bool:
        conn = self.conn
        if conn.closed or conn.broken:
            return False
        # Idle in autocommit, the server has nothing to say unasked: a readable
        # socket means it closed the session (a restart, a terminated backend).
        poller = select.poll()
        try:
            poller.register(conn.pgconn.socket, select.POLLIN | select.POLLERR | select.POLLHUP)
        except Exception:
            return False
        return not poller.poll(0)


# DSN -> its holding connection; used only under _runlock's lock.
_holding: dict[str, _HoldingConnection] = {}
# Connections inherited by a forked child: never closed there (closing would end
# the parent's session, and its locks), never used.
_inherited: list[_HoldingConnection] = []


class _AdvisoryLock:
    """One run's session-level advisory lock on this process's holding connection."""

    def __init__(self, holder: _HoldingConnection, key: int) -> None:
        self._holder = holder
        self._key = key
        self._forgotten = False

    @classmethod
    def take(cls, dsn: str, connect: dict[str, Any], run_id: str) -> _AdvisoryLock | None:
        holder = _holding.get(dsn)
        if holder is not None and not holder.alive():
            holder = None  # its locks are gone: the runs it held report it at their next check
        if holder is None:
            holder = _holding[dsn] = _HoldingConnection(dsn, connect)
        digest = hashlib.sha256(f"tether-run\0{holder.schema}\0{run_id}".encode()).digest()
        key = int.from_bytes(digest[:8], "big", signed=True)
        row = holder.conn.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone()
        if row is None or not row[0]:
            if holder.locks == 0:
                _drop(holder)
            return None
        holder.locks += 1
        return cls(holder, key)

    def let_go(self) -> None:
        import psycopg

        if self._forgotten:
            return  # a forked child's copy: the connection is the parent's
        holder = self._holder
        holder.locks -= 1
        try:
            if holder.alive():
                holder.conn.execute("SELECT pg_advisory_unlock(%s)", (self._key,))
        except psycopg.Error:
            pass  # a connection that failed holds nothing any more
        if holder.locks <= 0:
            _drop(holder)

    def alive(self) -> bool:
        if self._forgotten:
            return False
        return _holding.get(self._holder.dsn) is self._holder and self._holder.alive()

    def forget(self) -> None:
        self._forgotten = True
        holder = self._holder
        if _holding.get(holder.dsn) is holder:
            del _holding[holder.dsn]
            _inherited.append(holder)
            _disown(holder)


def _disown(holder: _HoldingConnection) -> None:
    """In a forked child: let go of the parent's holding socket without touching the session.

    The child's copy of the socket would keep the server's session (and the
    parent's locks) alive after the parent died (outside attack h8: a
    helper forked without exec kept a killed parent's run held). Closing it
    outright could hand its number to another file the connection object
    might later write to; /dev/null takes its place instead, and the object
    stays referenced (``_inherited``) so nothing ever closes it.
    """
    try:
        fd = holder.conn.pgconn.socket
    except Exception:  # a connection the parent had closed: no socket left to let go of
        return
    null = os.open(os.devnull, os.O_RDWR)
    try:
        os.dup2(null, fd)
    finally:
        os.close(null)


def _drop(holder: _HoldingConnection) -> None:
    """Close ``holder`` (it holds no lock), and forget it."""
    if _holding.get(holder.dsn) is holder:
        del _holding[holder.dsn]
    holder.conn.close()
