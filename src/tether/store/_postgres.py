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
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from tether.core import StoreError, StoreUnavailableError, WriteOnceError
from tether.store._sql import SQLBase

if TYPE_CHECKING:
    from psycopg import Connection
    from psycopg_pool import ConnectionPool

INSTALL_HINT = "pip install 'tether[postgres]'"

# Advisory lock keys. The two-key form (class, run hash) and the one-key form
# are separate key spaces in PostgreSQL, so run locks never meet the migrator's.
_MIGRATION_LOCK = 0x746574686572  # b"tether"
_RUN_LOCK_CLASS = 0x74657468  # b"teth"

# SQLSTATEs that mean the session is gone: connection exceptions (class 08) and
# operator intervention (the server shut the backend down).
_GONE_STATES = ("08", "57P01", "57P02", "57P03")


def _describe(dsn: str) -> str:
    """Host, port and database of a DSN, never its password."""
    try:
        from psycopg.conninfo import conninfo_to_dict

        parts = conninfo_to_dict(dsn)
    except Exception:
        return "(unparseable DSN)"
    host = parts.get("host") or "localhost"
    port = parts.get("port") or "5432"
    return f"postgresql://{host}:{port}/{parts.get('dbname') or ''}"


class PostgresStore(SQLBase):
    """Checkpoint content, marks and leases in PostgreSQL (needs the ``[postgres]`` extra)."""

    blob_type = "BYTEA"
    placeholder = "%s"
    clock_sql = "(EXTRACT(EPOCH FROM clock_timestamp()) * 1000000)::BIGINT"
    skip_locked = " FOR UPDATE SKIP LOCKED"

    def __init__(
        self,
        dsn: str,
        *,
        max_connections: int = 10,
        timeout_s: float = 30.0,
        retries: int = 5,
    ) -> None:
        """Open a pool (1 to ``max_connections``) on ``dsn`` and apply missing migrations.

        ``dsn`` is a libpq URL or key=value string; set the schema with
        ``options=-csearch_path=NAME``. ``timeout_s`` bounds both the first
        connection and every wait for a free connection.
        """
        super().__init__()
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
        self._where = _describe(dsn)
        self._pool: ConnectionPool[Connection[Any]] = ConnectionPool(
            dsn,
            min_size=1,
            max_size=max_connections,
            kwargs={"autocommit": True},
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
        try:
            self.migrate()
        except BaseException:
            self._pool.close()
            raise

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

    def _lock_migrations(self) -> None:
        # Taken before CREATE TABLE IF NOT EXISTS, which is itself not safe
        # against a concurrent creator; released when the migration commits.
        self._execute(f"SELECT pg_advisory_xact_lock({_MIGRATION_LOCK})")

    def _lock_run(self, run_id: str) -> None:
        # A hash collision only serializes two runs' appends; it never unlocks one.
        self._execute(f"SELECT pg_advisory_xact_lock({_RUN_LOCK_CLASS}, hashtext(?))", (run_id,))

    def _insert_ignore(self, table: str, columns: Sequence[str]) -> str:
        marks = ", ".join("?" for _ in columns)
        return f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks}) ON CONFLICT DO NOTHING"

    def _retryable(self, exc: Exception) -> bool:
        from psycopg import errors

        return isinstance(exc, errors.SerializationFailure | errors.DeadlockDetected)

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
