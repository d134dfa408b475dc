"""Leases in SQL: take, renew, release, defer and claim runs, each one conditional statement.

Half of the shared SQL base (:class:`~tether.store._sql.SQLBase` inherits it):
every statement that moves a lease is written once here, against the mark
row, and each is conditioned on the caller's lease version so a late worker
changes nothing.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any, ClassVar

from tether.core import (
    CheckpointCorruptError,
    LeaseExpiredError,
    LeaseHeldError,
    LeaseLostError,
    RunNotFoundError,
    StoreError,
    StoreUnavailableError,
)
from tether.store._engine import SQLEngine
from tether.store._protocols import (
    Lease,
    Mark,
)
from tether.store._rows import (
    MARK_COLUMNS,
    from_micros,
    lease_of,
    mark_columns,
    mark_of,
    phase_text,
    ttl_micros,
    whole,
)
from tether.store._schema import (
    CLAIM_ORDER,
    CLAIM_PHASES,
    CLAIM_SCOPE,
    CLAIMABLE_AT,
    FAILED_CLAIMS,
    PARKED,
    SUSPECT,
    UNPARKED,
    parked_after,
)

log = logging.getLogger("tether.store")


class LeaseSQL(SQLEngine):
    """The lease statements of the SQL base (see :class:`~tether.store._sql.SQLBase`)."""

    #: How to read a column so that a value the driver cannot decode (text
    #: that is not UTF-8: SQLite does not check) comes back as bytes, and the
    #: row is refused alone instead of failing the whole statement.
    raw_column: ClassVar[str] = "{}"
    #: The next turn, as SQL a statement that grants a lease sets ``turn`` to, so a
    #: claim can tell which of two runs claimable at the same instant was taken
    #: least recently (:data:`~tether.store._schema.CLAIM_ORDER`). A sequence here
    #: (PostgreSQL: no lock, so claimers never wait on each other for it, and only
    #: a row actually granted draws a value); gaps are harmless, only order matters.
    turn_sql: ClassVar[str] = "nextval('tether_turns')"

    def _mark_row(self, run_id: str) -> Mark | None:
        row = self._one(f"SELECT {MARK_COLUMNS} FROM tether_marks WHERE run_id = ?", (run_id,))
        return None if row is None else mark_of(row)

    # -- leases --------------------------------------------------------------
    #
    # Each grant is ONE conditional UPDATE judged by the store's clock: atomic
    # on its own under READ COMMITTED (row lock, re-check of the WHERE) and
    # inside BEGIN IMMEDIATE on SQLite. RETURNING hands back the new lease.

    def _lease_or_why(self, rows: list[tuple[Any, ...]], run_id: str, lease_version: int) -> Lease:
        if rows:
            return lease_of(mark_of(rows[0]))
        current = self._mark_row(run_id)
        if current is None:
            raise RunNotFoundError(run_id)
        raise LeaseLostError(run_id, lease_version, current.lease_version, current.lease_owner)

    def acquire_lease(self, run_id: str, worker: str, ttl_s: float) -> Lease:
        """Take the run's lease; every acquire increments the fencing token (see the protocol)."""
        ttl = ttl_micros(ttl_s)
        clock = self.clock_sql

        def body() -> Lease:
            # Under READ COMMITTED the holder may release between the refused
            # UPDATE and the read that explains it: then simply try again.
            for _ in range(3):
                rows = self._all(
                    # Every acquire is a new holder and a new fencing token, even
                    # for the same worker id: a restarted worker must fence out
                    # its own hung predecessor. Only renew_lease extends.
                    "UPDATE tether_marks SET lease_version = lease_version + 1, "
                    f"lease_owner = ?, lease_expires_at = {clock} + ?, waiting_after = NULL, "
                    f"turn = {self.turn_sql} WHERE run_id = ? AND (lease_owner IS NULL "
                    f"OR lease_owner = ? OR lease_expires_at <= {clock}) RETURNING {MARK_COLUMNS}",
                    (worker, ttl, run_id, worker),
                )
                if rows:
                    self._turn_taken()
                    return lease_of(mark_of(rows[0]))
                self._refuse_if_held(run_id)
            raise StoreUnavailableError(f"run {run_id}: the lease kept changing hands; retry")

        return self._write(body)

    def _refuse_if_held(self, run_id: str) -> None:
        """After a conditional update matched nothing: say who holds the run, if anyone."""
        current = self._mark_row(run_id)
        if current is None:
            raise RunNotFoundError(run_id)
        if current.lease_owner is not None and current.lease_expires_at is not None:
            raise LeaseHeldError(
                run_id, current.lease_owner, current.lease_version, current.lease_expires_at
            )

    def renew_lease(self, run_id: str, worker: str, lease_version: int, ttl_s: float) -> Lease:
        """Extend a lease ``worker`` still holds at ``lease_version`` (even if it expired)."""
        ttl = ttl_micros(ttl_s)

        def body() -> Lease:
            rows = self._all(
                f"UPDATE tether_marks SET lease_expires_at = {self.clock_sql} + ? "
                "WHERE run_id = ? AND lease_owner = ? AND lease_version = ? "
                f"RETURNING {MARK_COLUMNS}",
                (ttl, run_id, worker, lease_version),
            )
            return self._lease_or_why(rows, run_id, lease_version)

        return self._write(body)

    def release_lease(self, run_id: str, worker: str, lease_version: int) -> None:
        """Give the lease up; a repeated release is a no-op, a lost lease raises LeaseLostError."""

        def body() -> None:
            # A clean release ends a run of failures too. The run is claimable from
            # now, so it waits its turn behind runs claimable longer (a released run
            # claimable "since ever" would be taken before all of them, and a caller
            # that keeps taking up and letting go of one run would starve the rest);
            # behind a run that became claimable at this same instant, too, if that
            # one was taken less recently (CLAIM_ORDER: the store's clock may not
            # have moved since, and run ids must not decide).
            moved = self._run(
                "UPDATE tether_marks SET lease_owner = NULL, lease_expires_at = NULL, "
                f"attempts = 0, parked = 0, retry_at = {self.clock_sql}, last_error = NULL, "
                "waiting_after = NULL "
                "WHERE run_id = ? AND lease_owner = ? AND lease_version = ?",
                (run_id, worker, lease_version),
            )
            if moved == 1:
                return
            current = self._mark_row(run_id)
            if current is None:
                raise RunNotFoundError(run_id)
            if current.lease_version == lease_version and current.lease_owner is None:
                return  # already released at this version
            raise LeaseLostError(run_id, lease_version, current.lease_version, current.lease_owner)

        self._write(body)

    def note_progress(self, run_id: str, worker: str, lease_version: int) -> None:
        """This claim made progress: its count of failed attempts starts again at it.

        A claim counts itself in ``attempts`` before anything runs; a worker
        that dies later never says how it ended. A claim that got a step done
        is not one of a run of failures, so the count restarts at this claim
        (one, itself: it may still die). A lease taken over since is left to
        its new owner (no error: nothing of this claim's is written).
        """

        def body() -> None:
            self._run(
                f"UPDATE tether_marks SET attempts = 1, parked = {parked_after('1')} "
                "WHERE run_id = ? AND lease_owner = ? AND lease_version = ? AND attempts > 1",
                (run_id, worker, lease_version),
            )

        self._write(body)

    def defer(
        self,
        run_id: str,
        worker: str,
        lease_version: int,
        delay_s: float,
        error: str,
        *,
        count: bool = True,
        progressed: bool = False,
    ) -> Mark:
        """Release after a failure: not claimable for ``delay_s`` (the claim counted the attempt)."""
        if isinstance(delay_s, bool) or not math.isfinite(delay_s) or delay_s < 0:
            raise StoreError(
                f"a retry delay must be a non-negative number of seconds, not {delay_s!r}"
            )
        delay = round(min(delay_s, 366 * 24 * 3600) * 1_000_000)
        text = error[:2000]
        # The claim counted this attempt. A failure right after progress starts
        # a new run of failures; an attempt that was not a failure is uncounted.
        if progressed:
            attempts = "1" if count else "0"
        else:
            attempts = (
                "attempts" if count else "CASE WHEN attempts > 0 THEN attempts - 1 ELSE 0 END"
            )

        def body() -> Mark:
            rows = self._all(
                "UPDATE tether_marks SET lease_owner = NULL, lease_expires_at = NULL, "
                f"retry_at = {self.clock_sql} + ?, attempts = {attempts}, "
                f"parked = {parked_after(attempts)}, last_error = ? "
                f"WHERE run_id = ? AND lease_owner = ? AND lease_version = ? RETURNING {MARK_COLUMNS}",
                (delay, text, run_id, worker, lease_version),
            )
            if rows:
                return mark_of(rows[0])
            current = self._mark_row(run_id)
            if current is None:
                raise RunNotFoundError(run_id)
            raise LeaseLostError(run_id, lease_version, current.lease_version, current.lease_owner)

        return self._write(body)

    def wait_for_evidence(
        self, run_id: str, worker: str, lease_version: int, seen: int, floor_s: float
    ) -> None:
        """Park a run that waits for a person until evidence past ``seen`` arrives."""
        if isinstance(seen, bool) or not isinstance(seen, int) or seen < 0:
            raise StoreError(f"seen must be an inbox sequence number, not {seen!r}")
        if isinstance(floor_s, bool) or not math.isfinite(floor_s) or floor_s < 0:
            raise StoreError(f"floor_s must be a non-negative number of seconds, not {floor_s!r}")
        floor = round(min(floor_s, 366 * 24 * 3600) * 1_000_000)

        def body() -> None:
            # Evidence past ``seen`` may have landed since the run read its inbox:
            # then it does not wait at all. The run's lock orders this against
            # put_evidence (which wakes a waiting run), so no evidence is missed
            # between the two: one of them sees the other's row.
            self._lock_run(run_id)
            moved = self._run(
                "UPDATE tether_marks SET lease_owner = NULL, lease_expires_at = NULL, "
                "waiting_after = CASE WHEN EXISTS (SELECT 1 FROM tether_inbox i "
                "WHERE i.run_id = tether_marks.run_id AND i.seq > ?) THEN NULL ELSE ? END, "
                f"retry_at = {self.clock_sql} + ?, attempts = 0, parked = 0 "
                "WHERE run_id = ? AND lease_owner = ? AND lease_version = ?",
                (seen, seen, floor, run_id, worker, lease_version),
            )
            if moved == 1:
                return
            current = self._mark_row(run_id)
            if current is None:
                raise RunNotFoundError(run_id)
            raise LeaseLostError(run_id, lease_version, current.lease_version, current.lease_owner)

        self._write(body)

    def retry_now(self, run_id: str) -> Mark:
        """An operator's "try again": forget the run's failed attempts and its back-off.

        For a run parked at the mark (it failed ``max_attempts`` times before it
        could even be restored) once its cause is fixed. A run someone holds
        a live lease on is left alone (:class:`LeaseHeldError`).

        The run becomes claimable "since ever" (no ``retry_at``): ahead of every
        run waiting its turn, as a person asked. One run per deliberate act
        starves nothing; a run created or let go waits its turn instead. A
        lease that ran out (its worker died) is let go with it, or the run
        would keep its place at that lease's expiry; its version stays, so the
        dead worker's late commits are still refused.
        """
        clock = self.clock_sql

        def body() -> Mark:
            rows = self._all(
                "UPDATE tether_marks SET attempts = 0, parked = 0, retry_at = NULL, "
                "lease_owner = NULL, lease_expires_at = NULL "
                f"WHERE run_id = ? AND (lease_owner IS NULL OR lease_expires_at <= {clock}) "
                f"RETURNING {MARK_COLUMNS}",
                (run_id,),
            )
            if rows:
                return mark_of(rows[0])
            self._refuse_if_held(run_id)
            raise StoreUnavailableError(f"run {run_id}: the lease changed hands; retry")

        return self._write(body)

    def check_lease(self, run_id: str, lease_version: int) -> None:
        """Raise unless ``lease_version`` is current and live by the store's clock."""
        row = self._read(
            lambda: self._one(
                f"SELECT lease_version, lease_owner, lease_expires_at, {self.clock_sql} "
                "FROM tether_marks WHERE run_id = ?",
                (run_id,),
            )
        )
        if row is None:
            raise RunNotFoundError(run_id)
        try:
            version, owner, expires, now = whole(row[0]), row[1], row[2], whole(row[3])
            if expires is not None:
                expires = whole(expires)
                from_micros(expires)
            if owner is not None and not isinstance(owner, str):
                raise ValueError(f"the lease owner is {type(owner).__name__}")
        except (ValueError, OverflowError) as exc:
            raise CheckpointCorruptError(
                f"run {run_id}: its lease columns are malformed: {exc}", run_id=run_id
            ) from exc
        if version != lease_version:
            raise LeaseLostError(
                run_id, lease_version, version, None if owner is None else str(owner)
            )
        if version == 0:
            return  # never leased: single-process use
        if owner is None or expires is None:
            raise LeaseLostError(run_id, lease_version, version)
        if expires <= now:
            raise LeaseExpiredError(run_id, version, from_micros(expires))

    def _clock_bound(self) -> tuple[str, tuple[Any, ...]]:
        """The store's clock as a value an index range can start from: SQL and its parameters.

        PostgreSQL evaluates an uncorrelated subquery once (an InitPlan) and
        uses it as an index bound; SQLite uses only a parameter as one, so
        its dialect reads the clock first (see SQLiteStore).
        """
        return f"(SELECT {self.clock_sql})", ()

    def _turn_taken(self) -> None:
        """After a statement granted a lease at :attr:`turn_sql`, in its transaction.

        Nothing where ``turn_sql`` moved the counter itself (a sequence); a
        dialect whose ``turn_sql`` only reads its counter moves it on here, so
        a claim that found nothing writes nothing.
        """

    def _claim_pick(
        self,
        phases: Sequence[str],
        limit: int,
        ceiling: int,
        suspects: bool | None,
        now: str,
        *,
        lock: bool = True,
    ) -> str:
        """The SELECT of the run ids a claim takes, in claim order (:meth:`claim_expired`).

        ``phases`` are checked phase names; ``now`` is the store's clock as an
        index bound (:meth:`_clock_bound`), written twice. The first ``limit``
        runs of each half of the claim's scope, each read from the front of its
        own index, merged: the due runs, and the runs parked at the mark that are
        under ``ceiling`` (none, for a worker at the ceiling that parked them).
        The scans lock what they pick and skip rows other claimers (or
        committers) hold, so concurrent claimers never take the same run
        (``lock=False``: a read of what a claim would pick, as a benchmark times it).
        """
        kind = {None: "", True: f" AND {SUSPECT}", False: f" AND NOT {SUSPECT}"}[suspects]
        # The indexes' own predicates, spelled as they are, so both planners prove
        # the partial indexes apply; the caller's phases narrow them further.
        scope = f"{CLAIM_SCOPE} AND " if CLAIM_PHASES.issuperset(phases) else ""
        # Phases (checked names) and the limit are written into the statement, not
        # bound: PostgreSQL caches one plan per statement, and a plan made for an
        # unknown LIMIT expects to read a tenth of the index, so it would plan
        # every claim anew; with them written in, the cached plan is the index's.
        phase_list = ", ".join(f"'{phase}'" for phase in phases)
        count = int(limit)
        locked = self.skip_locked if lock else ""

        def front(split: str, name: str, index: str) -> str:
            hint = self.index_hint.format(index) if scope else ""
            return (
                f"SELECT run_id, claimable, turn FROM (SELECT run_id, "
                f"{CLAIMABLE_AT} AS claimable, turn FROM tether_marks{hint} "
                f"WHERE {scope}{split} AND phase IN ({phase_list}) "
                f"AND {CLAIMABLE_AT} <= {now} AND {FAILED_CLAIMS} < {ceiling} "
                f"AND waiting_after IS NULL{kind} "
                f"ORDER BY {CLAIM_ORDER} LIMIT {count}{locked}) AS {name}"
            )

        unparked = "tether_marks_suspect" if suspects else "tether_marks_due"
        # The merge sorts at most twice the limit, by CLAIM_ORDER over the fronts' columns.
        return (
            f"SELECT run_id FROM ({front(UNPARKED, 'due', unparked)} UNION ALL "
            f"{front(PARKED, 'parked', 'tether_marks_parked')}) AS fronts "
            f"ORDER BY claimable, turn, run_id LIMIT {count}"
        )

    def suspect_waiting(
        self, phases: Sequence[str] = ("running", "pending"), max_attempts: int | None = None
    ) -> bool:
        """Whether a suspect (:data:`~tether.store._schema.SUSPECT`) in ``phases`` is due now:
        what ``claim_expired(..., suspects=True)`` would take, read without taking it.

        A busy worker asks it before it stops claiming to make room for one
        (``runtime._many``); one indexed read of a handful of rows, and one probe
        of the parked runs (none under the ceiling that parked them).
        """
        wanted = sorted({phase_text(p) for p in phases})
        if not wanted:
            return False
        clock = self.clock_sql
        ceiling = 2**62 if max_attempts is None else int(max_attempts)
        scope = f"{CLAIM_SCOPE} AND " if CLAIM_PHASES.issuperset(wanted) else ""
        phase_list = ", ".join(f"'{phase}'" for phase in wanted)

        def body() -> bool:
            now, now_params = self._clock_bound()

            def due(split: str, index: str) -> str:
                hint = self.index_hint.format(index) if scope else ""
                return (
                    f"EXISTS (SELECT 1 FROM tether_marks{hint} WHERE {scope}{split} AND "
                    f"phase IN ({phase_list}) AND {SUSPECT} AND {CLAIMABLE_AT} <= {now} "
                    f"AND {FAILED_CLAIMS} < {ceiling} "
                    f"AND (lease_owner IS NULL OR lease_expires_at <= {clock}) "
                    f"AND (retry_at IS NULL OR retry_at <= {clock}))"
                )

            row = self._one(
                "SELECT CASE WHEN "
                f"{due(UNPARKED, 'tether_marks_suspect')} OR {due(PARKED, 'tether_marks_parked')} "
                "THEN 1 ELSE 0 END",
                now_params * 2,
            )
            return row is not None and bool(row[0])

        return self._read(body)

    def claim_expired(
        self,
        worker: str,
        ttl_s: float,
        limit: int = 1,
        phases: Sequence[str] = ("running", "pending"),
        max_attempts: int | None = None,
        suspects: bool | None = None,
    ) -> list[Lease]:
        """Take up to ``limit`` unowned or expired runs in ``phases``; each gets a new version.

        ``suspects``: ``True`` takes only runs whose last claim ended uncleanly
        (:data:`~tether.store._schema.SUSPECT`), ``False`` only the others,
        ``None`` either. Each claim counts itself after the claims that failed
        before it (:func:`tether.core._retry.failed_claims`), and a run with
        ``max_attempts`` of those is not taken (parked at the mark). Each claim
        records ``max_attempts`` on the run it takes (``parks_at``), so a run
        that fails that often leaves the index of due runs for the parked ones.

        Served by the ``tether_marks_due`` index in its own order (when the run
        became claimable, then the run taken least recently, then run id: see
        :data:`~tether.store._schema.CLAIM_ORDER`): the claim reads the due rows
        at the front of the index, never the runs that ended or wait for a person,
        nor those parked at the mark (:data:`~tether.store._schema.PARKED`): of
        those it reads only the ones under its own ``max_attempts``, which it may
        take, and merges the two fronts in the same order (with no
        ``max_attempts`` it may take every parked run, so it reads them all). Phases
        outside the indexes' (a claim of ended runs) are read without them.
        """
        ttl = ttl_micros(ttl_s)
        wanted = sorted({phase_text(p) for p in phases})
        if isinstance(limit, bool) or not isinstance(limit, int):
            raise StoreError(f"limit must be a whole number of runs, not {limit!r}")
        if limit < 1 or not wanted:
            return []
        clock = self.clock_sql
        # Free, due (a deferred run waits out its back-off) and not parked.
        ceiling = 2**62 if max_attempts is None else int(max_attempts)
        # A run parked for a person is woken by the evidence that lands for it
        # (put_evidence clears its wait), so a claim never looks into inboxes.
        kind = {None: "", True: f" AND {SUSPECT}", False: f" AND NOT {SUSPECT}"}[suspects]
        free = (
            f"(lease_owner IS NULL OR lease_expires_at <= {clock}) "
            f"AND (retry_at IS NULL OR retry_at <= {clock}) AND {FAILED_CLAIMS} < {ceiling} "
            f"AND waiting_after IS NULL{kind}"
        )

        def body() -> list[Lease]:
            now, now_params = self._clock_bound()
            # The outer WHERE judges each picked row again by the clock (on
            # PostgreSQL against the row as it is once its lock is granted). The
            # claim records its worker's ceiling: should it fail too, the count
            # it leaves decides which index the run then waits in (PARKED).
            rows = self._all(
                f"UPDATE tether_marks SET lease_owner = ?, lease_version = lease_version + 1, "
                f"lease_expires_at = {clock} + ?, waiting_after = NULL, retry_at = NULL, "
                f"attempts = {FAILED_CLAIMS} + 1, claimed_gen = generation, parks_at = {ceiling}, "
                f"parked = {parked_after(f'{FAILED_CLAIMS} + 1', str(ceiling))}, "
                f"turn = {self.turn_sql} WHERE {free} AND run_id IN ("
                f"{self._claim_pick(wanted, limit, ceiling, suspects, now)}) "
                f"RETURNING {mark_columns(self.raw_column)}",
                (worker, ttl, *now_params, *now_params),
            )
            if rows:
                self._turn_taken()
            leases = []
            for row in rows:
                try:
                    leases.append(lease_of(mark_of(row)))
                except CheckpointCorruptError as exc:
                    # A damaged row stays claimed (by us, until the ttl) rather
                    # than rolled back to the front of every worker's next claim.
                    log.error("claim skipped a damaged mark: %s", exc)
            return sorted(leases, key=lambda lease: lease.run_id)

        return self._write(body)
