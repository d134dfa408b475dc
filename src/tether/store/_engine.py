"""How the SQL base talks to a database: connections, units of work, retries, errors.

Every public store method runs as one unit of work through
:meth:`SQLEngine._read` or :meth:`SQLEngine._write`: a connection is checked
out, made current for this thread (so the statement helpers find it), and
driver errors are translated into tether's typed errors at that one
boundary. Transient failures (serialization failures, deadlocks, a
connection found dead before any of a write was sent) are retried a bounded
number of times by re-running the whole unit of work, so a unit of work must
be safe to run again from the start.

:meth:`SQLEngine.transaction` and :meth:`SQLEngine.read` are the same units
of work for code outside the store (an integration's own tables): the body
gets a :class:`SQLStatements` instead of reaching for the private helpers.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from datetime import UTC, datetime
from typing import Any, ClassVar, TypeVar

from tether.core import CommitOutcomeUnknownError, StoreError, StoreUnavailableError, TetherError

T = TypeVar("T")


class SQLEngine:
    """Units of work over DB-API connections; subclasses provide the dialect."""

    blob_type: ClassVar[str] = "BLOB"
    placeholder: ClassVar[str] = "?"
    #: An SQL expression for the store's clock, in integer microseconds since the epoch.
    clock_sql: ClassVar[str] = ""
    #: Appended to the claim scan: lock the rows it picks and skip rows others hold.
    skip_locked: ClassVar[str] = ""
    #: Written after ``tether_marks`` in a claim's scans, ``{}`` the index the scan must
    #: read: a dialect whose planner may pass the index over says so here.
    index_hint: ClassVar[str] = ""
    #: Statements that fill migration 10's index columns for rows written before it.
    index_backfill: ClassVar[tuple[str, ...]] = ()
    #: Statements that create migration 12's turn counter (see ``LeaseSQL._next_turn``).
    turn_counter: ClassVar[tuple[str, ...]] = ()
    #: How many times a transient failure re-runs a unit of work.
    retries: int = 5
    #: Whether envelopes, blobs, trace data and ledger columns are stored deflated (codec
    #: d1, ``tether.store._codec``) when that is shorter. Readers take either form, so a
    #: store whose database is thrown away within seconds (the simulator's) may keep its
    #: rows plain and save the deflating.
    deflate: ClassVar[bool] = True

    def __init__(self) -> None:
        self._local = threading.local()
        self._committed = 0

    @property
    def transactions_committed(self) -> int:
        """Write transactions this store object has committed (each one durable commit).

        Counted for benchmarks and operators: how many times the store paid for
        durability (an fsync on SQLite), whatever the number of runs' commits
        each carried.
        """
        return self._committed

    # -- dialect hooks -------------------------------------------------------

    def _connection(self) -> AbstractContextManager[Any]:
        """Check a connection out for one unit of work (and give it back)."""
        raise NotImplementedError

    def _transaction(self, conn: Any) -> AbstractContextManager[None]:
        """A write transaction on ``conn``: committed on success, rolled back on any error."""
        raise NotImplementedError

    def _lock_migrations(self) -> None:
        """Serialize concurrent migrators (inside the migration transaction)."""

    def _lock_run(self, run_id: str) -> None:
        """Serialize writers of one run's append-only rows (inside a write transaction)."""

    def _insert_ignore(
        self,
        table: str,
        columns: Sequence[str],
        values: Sequence[str] | None = None,
        *,
        rows: int = 1,
    ) -> str:
        """An insert that does nothing for a row that exists; ``values`` are SQL expressions (``?``).

        ``rows`` > 1: that many rows of ``?`` placeholders, in one statement.
        """
        raise NotImplementedError

    def _translate(self, exc: Exception) -> TetherError | None:
        """The typed error for a driver exception, or ``None`` if it is not a driver error."""
        raise NotImplementedError

    def _retryable(self, exc: Exception) -> bool:
        """Whether re-running the whole unit of work may succeed (serialization, deadlock)."""
        return False

    def _probe(self, conn: Any) -> None:
        """Raise a disconnected-class error if ``conn`` is known dead before anything is sent."""

    def _disconnected(self, exc: Exception) -> bool:
        """Whether ``exc`` says the connection was lost (safe to retry before any write)."""
        return False

    def _now(self) -> datetime:
        return datetime.now(UTC)

    def close(self) -> None:
        """Release the store's connections; using the store afterwards raises StoreError."""
        raise NotImplementedError

    def __enter__(self) -> SQLEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- units of work: the public surface ----------------------------------

    def transaction(self, body: Callable[[SQLStatements], T]) -> T:
        """Run ``body`` in ONE write transaction of this store and return what it returns.

        For integrations that keep tables of their own in tether's database
        (``TetherSaver``'s ``tether_lg_*``): ``body`` gets a
        :class:`SQLStatements` for its statements; they commit together when
        it returns and roll back together when it raises. Driver errors come
        back as tether's typed store errors. A transient failure
        (serialization failure, deadlock, a connection found dead before
        anything was sent) runs ``body`` again from the start, so ``body``
        must be safe to run more than once and must not act outside the
        store. Called inside another transaction, it joins that one: its
        statements commit or roll back with the outer transaction (an error
        the outer body catches does not undo them). Inside a :meth:`read` it
        is refused (:class:`~tether.core.StoreError`).
        """
        return self._write(lambda: body(SQLStatements(self)))

    def read(self, body: Callable[[SQLStatements], T]) -> T:
        """Run ``body``'s reads on one connection of this store and return what it returns.

        Like :meth:`transaction` without a write transaction: for ``SELECT``
        statements only. Retried and translated the same way.
        """
        return self._read(lambda: body(SQLStatements(self)))

    # -- units of work -------------------------------------------------------

    def _read(self, body: Callable[[], T]) -> T:
        return self._unit(body, write=False)

    def _write(self, body: Callable[[], T]) -> T:
        return self._unit(body, write=True)

    def _statement(self, body: Callable[[], T]) -> T:
        """A write that is ONE statement, its own transaction (no BEGIN/COMMIT round trips).

        Retried like a write: never once the statement may have been sent.
        """
        return self._unit(body, write=True, transaction=False)

    def _unit(self, body: Callable[[], T], *, write: bool, transaction: bool = True) -> T:
        if getattr(self._local, "conn", None) is not None:
            if write and not getattr(self._local, "write", False):
                # A read holds no transaction: the write's statements would land
                # one by one, and a failure half way would keep the first half.
                raise StoreError(f"{self!r}: a write cannot run inside a read; run it on its own")
            return body()  # nested: join the caller's connection and transaction
        attempt = 0
        while True:
            sent = False
            try:
                with self._connection() as conn:
                    self._local.conn = conn
                    self._local.write = write
                    self._local.unit = object()  # what SQLStatements handed out here are bound to
                    try:
                        if not write:
                            sent = True
                            return body()
                        if not transaction:
                            # No BEGIN goes first to find a dead connection: ask
                            # the dialect, so a stale one is retried, never sent.
                            self._probe(conn)
                            sent = True
                            value = body()
                            self._committed += 1
                            return value
                        with self._transaction(conn):
                            sent = True
                            value = body()
                        self._committed += 1  # still holding the connection
                        return value
                    finally:
                        self._local.conn = None
                        self._local.unit = None
            except TetherError:
                raise
            except Exception as exc:
                # A lost connection is retried only if nothing of a write was sent
                # yet: after that, a COMMIT may have landed and a blind retry would
                # report a CAS it actually won as lost.
                lost = self._disconnected(exc)
                if lost and write and sent:
                    # A COMMIT may have landed: never reported as "not committed".
                    raise CommitOutcomeUnknownError(
                        f"{self!r}: the connection was lost after a write was sent; it may "
                        f"have landed. Read the run back before acting again ({exc})"
                    ) from exc
                transient = self._retryable(exc) or lost
                if transient and attempt < self.retries:
                    attempt += 1
                    time.sleep(min(0.2, 0.002 * 2**attempt))
                    continue
                typed = self._translate(exc)
                if typed is None:
                    raise
                if transient and isinstance(typed, StoreError):
                    typed = StoreUnavailableError(
                        f"{typed} (still failing after {attempt + 1} attempts; retry later)"
                    )
                raise typed from exc

    def _execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            raise StoreError("store statement outside a unit of work (a bug in tether)")
        return conn.execute(self._q(sql), tuple(params))

    def _q(self, sql: str) -> str:
        return sql if self.placeholder == "?" else sql.replace("?", self.placeholder)

    def _all(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return [tuple(row) for row in self._execute(sql, params).fetchall()]

    def _one(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        row = self._execute(sql, params).fetchone()
        return None if row is None else tuple(row)

    def _run(self, sql: str, params: Sequence[Any] = ()) -> int:
        return int(self._execute(sql, params).rowcount)

    def _statements(self, statements: Sequence[tuple[str, Sequence[Any]]]) -> list[bool]:
        """Run one-statement commits in the current transaction; for each, whether it landed.

        A statement landed when its first row's first column is 1. A dialect
        whose driver can send them all before reading any answer overrides this.
        """
        landed = []
        for sql, params in statements:
            row = self._one(sql, params)
            landed.append(row is not None and row[0] == 1)
        return landed


def value_rows(columns: Sequence[str], values: Sequence[str] | None, rows: int) -> str:
    """``(?, ?), (?, ?)``: the VALUES rows of an insert (``values``: each row's SQL expressions)."""
    if rows < 1:
        raise StoreError(f"an insert of {rows} rows needs at least one")
    row = "(" + ", ".join(values if values is not None else ["?"] * len(columns)) + ")"
    return ", ".join([row] * rows)


class SQLStatements:
    """The statements a body passed to :meth:`SQLEngine.transaction` or ``read`` may run.

    Valid only inside the unit of work it was handed to (using it afterwards
    raises :class:`~tether.core.StoreError`). SQL is written with ``?``
    placeholders whatever the dialect; each store translates them.
    """

    __slots__ = ("_engine", "_unit")

    def __init__(self, engine: SQLEngine) -> None:
        self._engine = engine
        # The engine and its statements share this module: the handle holds the
        # token of the unit of work it was handed to (a later unit on the same
        # shared connection has another).
        self._unit = getattr(engine._local, "unit", None)

    def _live(self) -> SQLEngine:
        if self._unit is None or getattr(self._engine._local, "unit", None) is not self._unit:
            raise StoreError(
                "store statements used outside the transaction or read they were handed to; "
                "run them inside the body"
            )
        return self._engine

    def one(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        """The first row ``sql`` returns, or ``None``."""
        return self._live()._one(sql, params)

    def all(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Every row ``sql`` returns."""
        return self._live()._all(sql, params)

    def run(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Execute ``sql``; the number of rows it changed."""
        return self._live()._run(sql, params)

    def insert_ignore(
        self, table: str, columns: Sequence[str], values: Sequence[str] | None = None
    ) -> str:
        """This dialect's insert that does nothing when the row exists (run it with :meth:`run`).

        ``values`` are SQL expressions, one per column (default ``?`` each);
        :meth:`run` returns 1 when the row was inserted, 0 when it was there.
        """
        return self._live()._insert_ignore(table, columns, values)
