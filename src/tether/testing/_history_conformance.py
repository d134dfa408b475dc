"""Store conformance, part three: reading a run's past by index and by page.

A recovery and a step read a run's history by index (one effect's entries,
one action id's events, the landmark events) and people read it by page;
each answer must not depend on how long the history is, and must hold every
matching row the store has (on the chain or not: the runtime decides which
rows are proven). Plain pytest, checks through :func:`expect`.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from tether.core import (
    Compensation,
    EffectStatus,
    EffectTerms,
    LedgerEntry,
    RetrySemantics,
    StoreError,
)
from tether.core._ledger import seal_entry
from tether.core._state import GENESIS_HASH
from tether.core._trace import seal_event
from tether.testing._store_conformance import T0, expect_eq, make_commit


def _entries(count: int, effects: list[str], after: LedgerEntry | None = None) -> list[LedgerEntry]:
    """``count`` chained entries; entry i names effect ``effects[i % len(effects)]``."""
    rows: list[LedgerEntry] = []
    prev, seq = (GENESIS_HASH, 0) if after is None else (after.hash, after.seq)
    for i in range(count):
        seq += 1
        terms = EffectTerms(
            "sandbox",
            "file.write",
            f"f{i}.txt",
            RetrySemantics.IDEMPOTENT,
            Compensation.NONE,
            effect=effects[i % len(effects)],
        )
        row = seal_entry(
            "r",
            seq,
            prev,
            idempotency_key=f"k{seq}",
            status=EffectStatus.COMMITTED,
            action_id=f"a{seq}",
            intent_digest="sha256:" + "1" * 64,
            receipt={"receipt_id": f"rc-{seq}"},
            epoch=1,
            at=T0 + timedelta(seconds=seq),
            terms=terms,
        )
        rows.append(row)
        prev = row.hash
    return rows


def test_ledger_rows_are_read_by_seq_range_and_by_effect(tether_store: Any) -> None:
    """ledger_between and ledger_for_effect return every matching row, strays included."""
    e1, e2 = "sha256:" + "a" * 64, "sha256:" + "b" * 64
    rows = _entries(6, [e1, e2])
    tether_store.commit(make_commit("r", 1, ledger=rows), 0)
    # A row beside the chain (what a commit that never landed leaves, apart).
    (stray,) = _entries(1, [e1], after=rows[2])
    tether_store.put_content(make_commit("r", 9, ledger=[stray]))
    expect_eq(
        tether_store.ledger_between("r", 2, 3),
        sorted([rows[1], rows[2]], key=lambda e: (e.seq, e.hash)),
        "seq 2..3",
    )
    expect_eq(
        tether_store.ledger_between("r", 4),
        sorted([rows[3], rows[4], rows[5], stray], key=lambda e: (e.seq, e.hash)),
        "seq 4 and up, the stray beside seq 4 too",
    )
    expect_eq(tether_store.ledger_between("r", 7), [], "nothing past the end")
    found = tether_store.ledger_for_effect("r", e1)
    expect_eq(
        found,
        sorted([rows[0], rows[2], rows[4], stray], key=lambda e: (e.seq, e.hash)),
        "every row of effect e1",
    )
    expect_eq(tether_store.ledger_for_effect("r", "sha256:" + "c" * 64), [], "an unknown effect")
    expect_eq(tether_store.ledger_for_effect("other", e1), [], "another run")


def test_sent_rows_are_read_by_target_newest_first(tether_store: Any) -> None:
    """ledger_on_target gives a target's rows past their intent newest first, a page at a time."""
    e1, e2 = "sha256:" + "a" * 64, "sha256:" + "b" * 64
    rows = _entries(6, [e1, e2])  # targets f0.txt .. f5.txt: one commit each
    tether_store.commit(make_commit("r", 1, ledger=rows), 0)
    target = rows[3].terms.target_key if rows[3].terms is not None else ""
    expect_eq(tether_store.ledger_on_target("r", target), [rows[3]], "f3.txt's one commit")
    expect_eq(tether_store.ledger_on_target("r", target, below=4), [], "none below seq 4")
    expect_eq(tether_store.ledger_on_target("other", target), [], "another run")
    # Many commits on f0.txt, a row sent with its outcome open (indexed: it may have
    # landed), and an intent (never indexed: nothing left the process).
    same: list[LedgerEntry] = []
    after = rows[-1]
    for i in range(5):
        (row,) = _entries(1, [e1 if i % 2 else e2], after=after)
        same.append(row)
        after = row
    dispatched = seal_entry(
        "r",
        after.seq + 1,
        after.hash,
        idempotency_key="k-open",
        status=EffectStatus.DISPATCHED,
        action_id="a-open",
        intent_digest="sha256:" + "1" * 64,
        receipt=None,
        epoch=1,
        at=after.at,
        terms=after.terms,
    )
    intended = seal_entry(
        "r",
        dispatched.seq + 1,
        dispatched.hash,
        idempotency_key="k-next",
        status=EffectStatus.INTENDED,
        action_id="a-next",
        intent_digest="sha256:" + "2" * 64,
        receipt=None,
        epoch=1,
        at=after.at,
        terms=after.terms,
    )
    tether_store.commit(make_commit("r", 2, ledger=[*same, dispatched, intended]), 1)
    key = same[0].terms.target_key if same[0].terms is not None else ""
    newest = [dispatched, *reversed(same), rows[0]]  # rows[0] names f0.txt too
    expect_eq(tether_store.ledger_on_target("r", key, limit=2), newest[:2], "the newest two")
    expect_eq(
        tether_store.ledger_on_target("r", key, below=newest[1].seq, limit=8),
        newest[2:],
        "the page below",
    )
    with pytest.raises(StoreError):
        tether_store.ledger_on_target("r", key, limit=0)


def test_the_ledger_and_trace_read_by_page_from_the_head(tether_store: Any) -> None:
    """ledger_chain and trace(before=) give each row of the chain once, newest pages first."""
    rows = _entries(7, ["sha256:" + "a" * 64])
    events = []
    prev = GENESIS_HASH
    for seq in range(1, 8):
        event = seal_event("r", seq, "step", T0 + timedelta(seconds=seq), {"n": seq}, prev)
        events.append(event)
        prev = event.hash
    tether_store.commit(make_commit("r", 1, ledger=rows, events=events), 0)
    head_l, head_t = rows[-1].hash, events[-1].hash
    expect_eq(tether_store.ledger_chain("r", head_l, 3), rows[4:], "the newest ledger page")
    expect_eq(tether_store.ledger_chain("r", head_l, 3, before=5), rows[1:4], "below seq 5")
    expect_eq(tether_store.ledger_chain("r", head_l, 3, before=2), rows[:1], "the last page")
    expect_eq(tether_store.ledger_chain("r", head_l), rows, "no limit: all")
    expect_eq(tether_store.trace("r", head_t, 3, before=8), events[4:], "below seq 8")
    expect_eq(tether_store.trace("r", head_t, 2, before=3), events[:2], "the first two")
    expect_eq(tether_store.trace("r", head_t, 5, before=1), [], "nothing below seq 1")
    expect_eq(tether_store.trace_between("r", 3, 4), events[2:4], "trace seq 3..4")
    expect_eq(tether_store.trace_between("r", 6), events[5:], "trace seq 6 and up")
    pages, before = [], 8
    while True:
        page = tether_store.trace("r", head_t, 3, before=before)
        if not page:
            break
        pages.append(page)
        before = page[0].seq
    expect_eq([e for page in reversed(pages) for e in page], events, "every event once")


def test_trace_events_are_found_by_action_id_and_by_landmark_kind(tether_store: Any) -> None:
    """trace_for_action finds the events that took an id; trace_landmarks the rare kinds."""
    kinds: list[tuple[str, dict[str, Any]]] = [
        ("run_started", {}),
        ("intent_persisted", {"action_id": "w1"}),
        ("action_observed", {"action_id": "r1"}),
        ("step", {"action_id": "w1"}),  # not an action event: not found by id
        ("rewound", {"prefix_length": 1, "failed_suffix": {"trace_length": 3}}),
        ("effect_replayed", {"action_id": "w1"}),
    ]
    events = []
    prev = GENESIS_HASH
    for seq, (kind, data) in enumerate(kinds, start=1):
        event = seal_event("r", seq, kind, T0 + timedelta(seconds=seq), data, prev)
        events.append(event)
        prev = event.hash
    tether_store.commit(make_commit("r", 1, events=events), 0)
    expect_eq(tether_store.trace_for_action("r", "w1"), [events[1], events[5]], "uses of w1")
    expect_eq(tether_store.trace_for_action("r", "r1"), [events[2]], "uses of r1")
    expect_eq(tether_store.trace_for_action("r", "zz"), [], "an unused id")
    expect_eq(tether_store.trace_landmarks("r", ["rewound"]), [events[4]], "the rewind")
    expect_eq(
        tether_store.trace_landmarks("r", ["run_started", "rewound"]),
        [events[0], events[4]],
        "two kinds",
    )
    with pytest.raises(StoreError):
        tether_store.trace_landmarks("r", ["step"])  # not a landmark: no index serves it


__all__ = [
    "test_ledger_rows_are_read_by_seq_range_and_by_effect",
    "test_sent_rows_are_read_by_target_newest_first",
    "test_the_ledger_and_trace_read_by_page_from_the_head",
    "test_trace_events_are_found_by_action_id_and_by_landmark_kind",
]
