"""Group commit: the commits of many runs that wait together land in one transaction.

A worker that drives many runs on many threads hands the store many fenced
commits at once. Written one transaction each, every one pays its own fsync;
written together, they pay one. :class:`GroupCommit` queues the commits that
arrive while a transaction is being written, and the next committer to find
the store free (the *leader*) takes the whole queue and writes it as ONE
transaction:

- each commit's compare-and-set is checked on its own: a lost lease or a
  stale generation refuses only that run's commit, with the same typed error
  a commit alone raises, and the others land. A commit of many statements
  (SQLite) runs inside a ``SAVEPOINT`` of its own and is rolled back to it;
  a commit that is ONE statement (PostgreSQL's) wrote nothing when refused,
  needs no savepoint, and is sent with the batch's others in one go (a
  database error in one aborts the transaction: the batch is then written
  again one commit at a time, so only that one fails);
- every committer returns only once the transaction holding its commit is
  durable (``COMMIT`` returned): nothing is acknowledged before it is on
  disk, so no run makes an adapter call on a commit that could still vanish;
- a failure of the transaction itself (the ``COMMIT``, the disk, a lost
  connection) fails every commit in it with that store error: none landed;
- a SIGKILL while a batch is written loses the whole batch atomically (it is
  one transaction), so no run sees its step as durable.

A commit that finds the queue empty and no leader writes at once, exactly
as it would without grouping (no savepoint, no wait): one run alone is as
fast and as durable as before. While the leader's ``COMMIT`` waits for the
disk (the driver lets the GIL go), the next batch forms in the queue.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tether.core import StoreUnavailableError, TetherError

#: At most this many commits in one transaction: bounds the time a leader
#: keeps the store's write lock and the work lost to one failed transaction.
MAX_BATCH = 256


class _Request:
    """One committer's commit, and where its outcome is left for it."""

    __slots__ = ("alone", "atomic", "body", "error", "settled", "value", "wake")

    def __init__(
        self, body: Callable[[], Any], alone: Callable[[], Any] | None, atomic: Statement | None
    ) -> None:
        self.body = body
        self.alone = alone
        self.atomic = atomic
        # Made only for a committer that waits (under the queue's mutex, before it
        # is queued): one that leads at once, the common case, never needs it.
        self.wake: threading.Event | None = None
        self.settled = False  # written (landed or refused); False when woken to lead
        self.value: Any = None
        self.error: BaseException | None = None


class GroupCommit:
    """Writes the commits queued meanwhile in one transaction of ``engine``.

    ``engine`` is the store (an :class:`~tether.store._engine.SQLEngine`):
    the batch is one of its write units of work, so it is retried, translated
    and counted exactly as a single commit is.
    """

    def __init__(self, engine: Any, *, max_batch: int = MAX_BATCH) -> None:
        self._engine = engine
        self._max_batch = max_batch
        self._mutex = threading.Lock()
        self._queue: list[_Request] = []
        self._leading = False
        #: Transactions written by leaders, and the commits they carried.
        self.batches = 0
        self.commits = 0
        #: How many commits the transaction being written now carries (0: none).
        self.writing = 0

    def submit(
        self,
        body: Callable[[], Any],
        alone: Callable[[], Any] | None = None,
        *,
        atomic: Statement | None = None,
    ) -> Any:
        """Run ``body`` (one commit's statements) in a transaction; return once it is durable.

        ``alone``: how the commit is written when no other is queued with it
        (a unit of work of its own; default: ``body`` in a write transaction).
        ``atomic``: the commit is that one statement, which writes nothing when
        refused: in a batch it needs no savepoint, the batch's statements are
        sent together (``engine._statements``), and a database error in one
        (which aborts the transaction) has the batch written again one commit
        at a time.
        """
        request = _Request(body, alone, atomic)
        with self._mutex:
            self._queue.append(request)
            lead = not self._leading
            self._leading = True
            if not lead:
                wake = request.wake = threading.Event()
        if not lead:
            try:
                wake.wait()
            except BaseException:
                self._abandon(request)  # an interrupt (a signal handler's error) while queued
                raise
            if request.settled:
                return _outcome(request)
            # Woken to lead: the leader before this one left this request first in the queue.
        self._lead()
        return _outcome(request)

    def _abandon(self, request: _Request) -> None:
        """Take back a commit whose committer stopped waiting; hand the lead on if it had it.

        A commit still queued is dropped (it never landed); one a leader took is
        written as it would have been, and its committer, gone, never hears.
        """
        with self._mutex:
            if not any(queued is request for queued in self._queue):
                return
            chosen = self._queue[0] is request and _woken(request)
            self._queue.remove(request)
            if chosen:
                self._hand_on()

    def _lead(self) -> None:
        """Write the queue's head (this committer's own commit first) and hand the lead on."""
        with self._mutex:
            batch = self._queue[: self._max_batch]
            del self._queue[: self._max_batch]
        self.writing = len(batch)
        try:
            self._write(batch)
        finally:
            self.writing = 0
            for request in batch:
                request.settled = True
                _wake(request)
            with self._mutex:
                self._hand_on()

    def _hand_on(self) -> None:
        """Wake the next committer in line to lead, or let the next to arrive lead (under the mutex).

        The one woken writes its own commit with the others that queued
        meanwhile; chosen and woken under the mutex, so a committer that stops
        waiting (``_abandon``) can tell whether it had been chosen.
        """
        following = self._queue[0] if self._queue else None
        self._leading = following is not None
        if following is not None:
            _wake(following)

    def _write(self, batch: list[_Request]) -> None:
        engine = self._engine
        if len(batch) == 1:
            # Alone: exactly the single commit's transaction, no savepoint.
            only = batch[0]
            try:
                only.value = only.alone() if only.alone is not None else engine._write(only.body)
            except BaseException as exc:
                only.error = exc
            self.batches += 1
            self.commits += 1
            return
        running: list[_Request | None] = [None]
        try:
            outcomes = engine._write(lambda: _together(engine, batch, running))
        except _OneByOne:
            # An atomic commit's statement failed in the database, and with it the
            # transaction (nothing landed): each commit is written alone, so only
            # the one at fault fails, with the error it raises alone.
            for request in batch:
                self._write([request])
            return
        except BaseException as exc:
            # Nothing of the transaction landed: every commit in it fails alike. A
            # store error is the same error for each (one instance, raised by each
            # committer's thread); anything else (a simulated crash, an interrupt)
            # is raised as it is by the committer whose commit it stopped (the
            # leader's, when it came from the COMMIT), and the others are told
            # theirs was not written.
            owner = running[0] if running[0] is not None else batch[0]
            for request in batch:
                typed = isinstance(exc, TetherError) or request is owner
                request.error = exc if typed else _not_written(exc)
            return
        self.batches += 1
        self.commits += len(batch)
        for request, (ok, result) in zip(batch, outcomes, strict=True):
            if ok:
                request.value = result
            else:
                request.error = result


def _together(
    engine: Any, batch: list[_Request], running: list[_Request | None]
) -> list[tuple[bool, Any]]:
    """Each commit under a savepoint of its own: a refused one is undone alone.

    Run as one unit of work (and again from the start if the unit is retried),
    so the outcomes are rebuilt on every attempt. ``running`` names the commit
    whose statements are being run (``None`` once all have run).
    """
    outcomes: list[tuple[bool, Any]] = []
    index = 0
    while index < len(batch):
        request = batch[index]
        if request.atomic is not None:
            # A row of one-statement commits, sent together: refused, a statement
            # wrote nothing; failed, the transaction is gone.
            row = [request]
            while index + len(row) < len(batch) and batch[index + len(row)].atomic is not None:
                row.append(batch[index + len(row)])
            outcomes.extend(_statements(engine, row, running))
            index += len(row)
            continue
        running[0] = request
        index += 1
        name = f"tether_commit_{index}"
        engine._execute(f"SAVEPOINT {name}")
        try:
            value = request.body()
        except Exception as exc:
            if engine._retryable(exc) or engine._disconnected(exc):
                raise  # the whole unit is retried (or fails) as one commit's would
            # Undone alone; if even that fails the transaction is gone, and the
            # error of the rollback fails the whole batch.
            engine._execute(f"ROLLBACK TO SAVEPOINT {name}")
            engine._execute(f"RELEASE SAVEPOINT {name}")
            outcomes.append((False, _typed(engine, exc)))
            continue
        engine._execute(f"RELEASE SAVEPOINT {name}")
        outcomes.append((True, value))
    running[0] = None
    return outcomes


def _statements(
    engine: Any, row: list[_Request], running: list[_Request | None]
) -> list[tuple[bool, Any]]:
    """One-statement commits, their ``before`` hooks first, then every statement at once."""
    statements: list[Statement] = []
    for request in row:
        running[0] = request
        statement = request.atomic
        if statement is None:  # the caller sends only one-statement commits here
            raise StoreUnavailableError("a commit of many statements was sent as one")
        if statement.before is not None:
            statement.before()
        statements.append(statement)
    try:
        landed = engine._statements([(s.sql, s.params) for s in statements])
    except Exception as exc:
        if engine._retryable(exc) or engine._disconnected(exc):
            raise
        raise _OneByOne from exc
    outcomes: list[tuple[bool, Any]] = []
    for statement, ok in zip(statements, landed, strict=True):
        if ok:
            outcomes.append((True, None))
            continue
        try:
            statement.refused()  # raises the refusal's typed error
        except TetherError as exc:
            outcomes.append((False, exc))
        else:
            outcomes.append((False, StoreUnavailableError("a refused commit gave no reason")))
    return outcomes


@dataclass(frozen=True, slots=True)
class Statement:
    """A commit that is ONE statement, landed when it returns a row whose first column is 1.

    ``before`` runs inside the transaction before the statement is sent (the
    crash point "inside the commit"); ``refused`` raises the typed error that
    says why a statement that did not land was refused (it may read).
    """

    sql: str
    params: Sequence[Any]
    before: Callable[[], None] | None
    refused: Callable[[], None]


class _OneByOne(Exception):
    """A batch must be written again one commit at a time (see ``_together``)."""


def _typed(engine: Any, exc: Exception) -> BaseException:
    """The error this commit alone would have raised: a driver error translated, as the unit does."""
    if isinstance(exc, TetherError):
        return exc
    typed: BaseException | None = engine._translate(exc)
    if typed is None:
        return exc
    typed.__cause__ = exc
    return typed


def _not_written(exc: BaseException) -> StoreUnavailableError:
    error = StoreUnavailableError(
        "the commit was not written: the transaction carrying it with other runs' "
        f"commits failed ({type(exc).__name__}); nothing of it landed, try again"
    )
    error.__cause__ = exc
    return error


def _wake(request: _Request) -> None:
    """Wake a committer waiting on ``request`` (one that led from the start waits on nothing)."""
    if request.wake is not None:
        request.wake.set()


def _woken(request: _Request) -> bool:
    return request.wake is not None and request.wake.is_set()


def _outcome(request: _Request) -> Any:
    if request.error is not None:
        raise request.error
    return request.value
