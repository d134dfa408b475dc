"""A run's past in SQL, by index and by page: what recoveries, steps and people read.

Half of the shared SQL base again (:class:`~tether.store._sql.SQLBase`
inherits it, beside the lease statements): the reads that must not grow
with the length of a history. Rows come back unverified; the runtime proves
the ones a decision uses on the signed chain (``ProvenChain``),
and a page checks its own.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from tether.core import LedgerEntry, StoreError, TraceEvent
from tether.core import _steps as step_rules
from tether.store._engine import SQLEngine
from tether.store._rows import index_key, ledger_entry_of, trace_event_of
from tether.store._schema import LANDMARK_KINDS, kinds_sql

#: The columns a trace row and a ledger row are read with: content, then the index key
#: (which every reader checks against the content).
TRACE_COLUMNS = "hash, prev_hash, seq, kind, at, data, action_id, packed"
LEDGER_COLUMNS = (
    "hash, prev_hash, seq, idempotency_key, status, action_id, intent_digest, "
    "receipt, epoch, at, terms, payload, effect, target, packed"
)


class HistorySQL(SQLEngine):
    """The by-index and by-page reads of the SQL base (see :class:`~tether.store._sql.SQLBase`)."""

    def _walk(
        self,
        table: str,
        columns: str,
        run_id: str,
        head: str,
        limit: int | None,
        before: int,
    ) -> list[tuple[Any, ...]]:
        """Rows of ``table``'s chain from ``head`` with seq below ``before`` (the newest ``limit``).

        The links are followed in SQL on the primary key (hash and prev_hash
        only) down past the page; only the page's rows come back, oldest first.
        (``CROSS JOIN`` keeps SQLite's join order: the page, then its rows.)
        """
        if limit is not None and limit < 1:
            raise StoreError(f"a page holds at least one row, not {limit}")
        selected = ", ".join(f"t.{c.strip()}" for c in columns.split(","))
        page = "" if limit is None else f" LIMIT {int(limit)}"

        def body() -> list[tuple[Any, ...]]:
            top = self._one(
                f"SELECT seq FROM {table} WHERE run_id = ? AND hash = ?", (run_id, head)
            )
            if top is None or not isinstance(top[0], int) or isinstance(top[0], bool):
                return []  # no such head (or a damaged one): nothing is on its chain
            # Walk down past the page (one row below it), and no further.
            floor = 0 if limit is None else max(0, min(before, top[0] + 1) - limit)
            return self._all(
                f"""WITH RECURSIVE chain(hash, prev_hash, seq) AS (
                        SELECT hash, prev_hash, seq FROM {table} WHERE run_id = ? AND hash = ?
                        UNION ALL
                        SELECT t.hash, t.prev_hash, t.seq FROM {table} t JOIN chain c
                            ON t.run_id = ? AND t.hash = c.prev_hash
                         WHERE t.seq < c.seq AND c.seq > ?
                    )
                    SELECT {selected} FROM (
                        SELECT hash, seq FROM chain WHERE seq < ? ORDER BY seq DESC{page}
                    ) c CROSS JOIN {table} t WHERE t.run_id = ? AND t.hash = c.hash
                    ORDER BY t.seq""",
                (run_id, head, run_id, floor, before, run_id),
            )

        return self._read(body)

    def trace_between(self, run_id: str, low: int, high: int | None = None) -> list[TraceEvent]:
        """The run's trace rows with ``low <= seq <= high`` (``None``: no bound); unverified."""
        where, params = (
            ("", (run_id, low)) if high is None else (" AND seq <= ?", (run_id, low, high))
        )
        rows = self._read(
            lambda: self._all(
                f"SELECT {TRACE_COLUMNS} FROM tether_trace WHERE run_id = ? AND seq >= ?"
                f"{where} ORDER BY seq, hash",
                params,
            )
        )
        return [trace_event_of(run_id, row) for row in rows]

    def trace_for_action(self, run_id: str, action_id: str) -> list[TraceEvent]:
        """Events of the run, on any chain, that record ``action_id`` as taken; unverified."""
        # Sorted here (see ledger_for_effect): the action index is the one to probe.
        rows = self._read(
            lambda: self._all(
                f"SELECT {TRACE_COLUMNS} FROM tether_trace WHERE run_id = ? AND action_id = ?",
                (run_id, index_key(action_id)),
            )
        )
        events = [trace_event_of(run_id, row) for row in rows]
        found = [e for e in events if step_rules.action_id_of(e.kind, e.data) == action_id]
        return sorted(found, key=lambda e: (e.seq, e.hash))

    def trace_landmarks(
        self, run_id: str, kinds: Collection[str], *, head: str | None = None
    ) -> list[TraceEvent]:
        """Events of the run of the landmark ``kinds``, by seq; unverified.

        Without ``head``: every such row the store holds, by index. With it:
        those on the chain ending at ``head`` (its links followed in SQL).
        """
        wanted = tuple(sorted(set(kinds)))
        if not wanted or not set(wanted) <= set(LANDMARK_KINDS):
            raise StoreError(f"landmark kinds are {list(LANDMARK_KINDS)}, not {list(wanted)}")
        if head is None:
            # No ORDER BY (sorted below): SQLite would take the seq index to skip the sort.
            sql = (
                f"SELECT {TRACE_COLUMNS} FROM tether_trace WHERE run_id = ? AND "
                f"{kinds_sql(LANDMARK_KINDS)} AND {kinds_sql(wanted)}"
            )
            params: tuple[Any, ...] = (run_id,)
        else:
            sql = f"""WITH RECURSIVE chain(hash, prev_hash, seq) AS (
                          SELECT hash, prev_hash, seq FROM tether_trace
                           WHERE run_id = ? AND hash = ?
                          UNION ALL
                          SELECT t.hash, t.prev_hash, t.seq FROM tether_trace t JOIN chain c
                              ON t.run_id = ? AND t.hash = c.prev_hash
                           WHERE t.seq < c.seq
                      )
                      SELECT {", ".join("t." + c for c in TRACE_COLUMNS.split(", "))}
                        FROM chain c CROSS JOIN tether_trace t
                       WHERE t.run_id = ? AND t.hash = c.hash AND {kinds_sql(wanted, "t.kind")}
                       ORDER BY t.seq"""
            params = (run_id, head, run_id, run_id)
        rows = self._read(lambda: self._all(sql, params))
        events = [trace_event_of(run_id, row) for row in rows]
        return sorted(events, key=lambda e: (e.seq, e.hash))

    def ledger_between(self, run_id: str, low: int, high: int | None = None) -> list[LedgerEntry]:
        """The run's ledger rows with ``low <= seq <= high`` (``high=None``: no bound); unverified."""
        where, params = (
            ("", (run_id, low)) if high is None else (" AND seq <= ?", (run_id, low, high))
        )
        rows = self._read(
            lambda: self._all(
                f"SELECT {LEDGER_COLUMNS} FROM tether_ledger WHERE run_id = ? AND seq >= ?"
                f"{where} ORDER BY seq, hash",
                params,
            )
        )
        return [ledger_entry_of(run_id, row) for row in rows]

    def ledger_for_effect(self, run_id: str, effect: str) -> list[LedgerEntry]:
        """The run's ledger rows whose terms name effect digest ``effect``, by seq; unverified."""
        # Sorted here, not by ORDER BY: SQLite would pick the seq index to skip the sort
        # and scan the run's whole ledger instead of probing the effect's index.
        rows = self._read(
            lambda: self._all(
                f"SELECT {LEDGER_COLUMNS} FROM tether_ledger WHERE run_id = ? AND effect = ?",
                (run_id, index_key(effect)),
            )
        )
        entries = [ledger_entry_of(run_id, row) for row in rows]
        found = [e for e in entries if e.terms is not None and e.terms.effect == effect]
        return sorted(found, key=lambda e: (e.seq, e.hash))

    def ledger_on_target(
        self, run_id: str, target: str, *, below: int | None = None, limit: int = 8
    ) -> list[LedgerEntry]:
        """The run's newest sent rows on ``target`` (a target digest), newest first; unverified.

        At most ``limit`` rows with seq below ``below`` (``None``: no bound),
        found by index, strays included.
        """
        if limit < 1:
            raise StoreError(f"a page holds at least one row, not {limit}")
        bound, params = (
            ("", (run_id, target))
            if below is None
            else (
                " AND seq < ?",
                (run_id, target, below),
            )
        )
        rows = self._read(
            lambda: self._all(
                f"SELECT {LEDGER_COLUMNS} FROM tether_ledger WHERE run_id = ? AND target = ?"
                f"{bound} ORDER BY seq DESC LIMIT {int(limit)}",
                params,
            )
        )
        entries = [ledger_entry_of(run_id, row) for row in rows]
        return sorted(entries, key=lambda e: (e.seq, e.hash), reverse=True)

    def key_age_s(self, run_id: str, effect: str, key: str) -> float | None:
        """Seconds since the store recorded the first ledger row of ``key``, by its own clock.

        The store's now and the row's stamp are read in one statement, so
        both are the store's clock (the one leases are judged by), whatever
        the caller's. ``None`` when any row of ``effect`` under ``key`` lacks a
        stamp (written before the store recorded one): the first row may be
        one of those, so the store cannot say, and the caller's margin applies
        (a later row's stamp would make the key look younger than it is). Found by the effect's
        index; unverified, and only ever made larger by the caller's own clock
        (``tether.core._retention``), so an edited stamp cannot make a key
        younger than the runtime says it is.
        """
        row = self._read(
            lambda: self._one(
                f"SELECT {self.clock_sql}, CASE WHEN COUNT(*) = COUNT(stored_us) "
                "THEN MIN(stored_us) END FROM tether_ledger "
                "WHERE run_id = ? AND effect = ? AND idempotency_key = ?",
                (run_id, index_key(effect), key),
            )
        )
        if row is None or row[1] is None:
            return None
        now, first = row
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (now, first)):
            raise StoreError(f"run {run_id}: a ledger row's store time is not an integer")
        return float(now - first) / 1_000_000

    def ledger_chain(
        self, run_id: str, head: str, limit: int | None = None, *, before: int | None = None
    ) -> list[LedgerEntry]:
        """The ledger's chain from ``head`` (below seq ``before``), newest ``limit``, oldest first."""
        return [
            ledger_entry_of(run_id, row)
            for row in self._walk(
                "tether_ledger",
                LEDGER_COLUMNS,
                run_id,
                head,
                limit,
                before if before is not None else 2**62,
            )
        ]
