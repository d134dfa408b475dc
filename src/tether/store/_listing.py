"""A page of the runs list in one indexed read: marks, listings, and who needs a person.

Half of the reading side of the shared SQL base (:class:`~tether.store._sql.SQLBase`
inherits it). The runtime records each run's :class:`~tether.core.Listing`
with its mark at every commit; a page is then one ``SELECT`` by run id
(keyset: "after this run id"), served by the primary key, by
``tether_marks_phase`` for one phase, and by ``tether_marks_attention`` for the
runs that wait for a person. Its cost does not grow with the number of runs.
"""

from __future__ import annotations

import contextlib
from datetime import datetime
from typing import Any, ClassVar

from tether.core import CheckpointCorruptError, StoreError, format_time
from tether.store._codec import stored_bytes
from tether.store._engine import SQLEngine
from tether.store._protocols import ListedRun, MarksPage
from tether.store._rows import (
    EPOCH,
    LISTING_COLUMNS,
    listing_of_row,
    mark_columns,
    mark_of,
    parse_stored_time,
    phase_text,
    text_of,
)
from tether.store._schema import ATTENTION

#: The most runs one page may hold.
MAX_PAGE = 1000

#: ``core.listing_rules.needs_person`` in SQL, for a filter the index can serve:
#: frozen for review; a pending write an approval applies to and none in force
#: (parameter 1: now as RFC 3339 text, as approvals are signed); a run whose
#: claims keep ending badly (parameter 2: now in microseconds, as leases are
#: kept); or a run with no listing, which only its checkpoint can answer for.
NEEDS_PERSON = (
    "(phase = 'needs_review' "
    "OR (phase = 'pending' AND gate IS NOT NULL AND (gate = 'intended' OR waiting_after IS NOT NULL) "
    "AND (approved_until IS NULL OR approved_until <= ?)) "
    "OR (phase IN ('pending', 'running') AND attempts > 0 AND (last_error IS NOT NULL "
    "OR lease_owner IS NULL OR lease_expires_at IS NULL OR lease_expires_at <= ?)) "
    "OR (phase IN ('pending', 'running') AND epoch IS NULL))"
)


class ListingSQL(SQLEngine):
    """The runs-list statement of the SQL base (see :class:`~tether.store._sql.SQLBase`)."""

    raw_column: ClassVar[str]

    def runs_page(
        self,
        *,
        after: str | None = None,
        limit: int = 50,
        phase: str | None = None,
        needs_person_at: datetime | None = None,
        envelopes: bool = False,
    ) -> MarksPage:
        """Up to ``limit`` runs after run id ``after``, by run id: one statement (see the protocol)."""
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE:
            raise StoreError(f"a page holds 1 to {MAX_PAGE} runs, not {limit!r}")
        if after is not None and not isinstance(after, str):
            raise StoreError(f"after must be a run id, not {after!r}")
        where: list[str] = []
        params: list[Any] = []
        if after is not None:
            where.append("run_id > ?")
            params.append(after)
        if phase is not None:
            where.append("phase = ?")
            params.append(phase_text(phase))
        if needs_person_at is not None:
            # The index's own predicate, as spelled, so the planner takes the
            # partial index; the time then decides among its rows.
            where += [ATTENTION, NEEDS_PERSON]
            now_us = (needs_person_at - EPOCH) // _MICROSECOND
            params += [format_time(needs_person_at), now_us]
        envelope = (
            ", (SELECT c.envelope FROM tether_checkpoints c WHERE c.run_id = tether_marks.run_id "
            "AND c.checkpoint_digest = tether_marks.checkpoint_digest)"
            ", (SELECT c.codec FROM tether_checkpoints c WHERE c.run_id = tether_marks.run_id "
            "AND c.checkpoint_digest = tether_marks.checkpoint_digest)"
            if envelopes
            else ""
        )
        raw = self.raw_column
        listing = ", ".join(raw.format(c) for c in LISTING_COLUMNS)
        sql = (
            f"SELECT {mark_columns(raw)}, {raw.format('updated_at')}, {listing}{envelope} "
            f"FROM tether_marks{' WHERE ' + ' AND '.join(where) if where else ''} "
            # Written in, not bound: a plan cached for an unknown LIMIT would
            # expect to read a tenth of the table (see claim_expired).
            f"ORDER BY run_id LIMIT {int(limit)}"
        )
        rows = self._read(lambda: self._all(sql, params))
        runs: list[ListedRun] = []
        damaged: list[CheckpointCorruptError] = []
        ids: list[str] = []
        for row in rows:
            try:
                listed = _listed(row, envelopes)
            except CheckpointCorruptError as exc:
                damaged.append(exc)
                # An undecodable run id cannot be a cursor; the next row's can.
                with contextlib.suppress(TypeError, ValueError):
                    ids.append(text_of(row[0]))
                continue
            runs.append(listed)
            ids.append(listed.mark.run_id)
        more = len(rows) == limit and ids
        return MarksPage(tuple(runs), tuple(damaged), max(ids) if more else None)


_MICROSECOND = EPOCH.resolution


def _listed(row: Any, envelopes: bool) -> ListedRun:
    mark = mark_of(row[:12])
    try:
        updated_at = parse_stored_time(text_of(row[12]))
    except (TypeError, ValueError) as exc:
        raise CheckpointCorruptError(
            f"run {mark.run_id}: its high-water mark row is malformed: updated_at: {exc}",
            run_id=mark.run_id,
        ) from exc
    listing = listing_of_row(mark.run_id, row[13:18])
    envelope = None
    if envelopes and row[18] is not None:
        envelope = stored_bytes(
            row[18], row[19], f"checkpoint {mark.checkpoint_digest}", run_id=mark.run_id
        )
    return ListedRun(mark, updated_at, listing, envelope)
