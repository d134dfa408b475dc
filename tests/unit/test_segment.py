"""walk_down: a stretch of a hash chain below its signed head, each way it can be wrong."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from tether.core import TraceEvent, TraceIntegrityError
from tether.core._segment import hashes_to_itself, walk_down
from tether.core._state import GENESIS_HASH
from tether.core._trace import seal_event

T0 = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)


def chain(count: int, label: str = "main", seqs: list[int] | None = None) -> list[TraceEvent]:
    events: list[TraceEvent] = []
    prev = GENESIS_HASH
    for seq in seqs or range(1, count + 1):
        event = seal_event("r", seq, "step", T0 + timedelta(seconds=seq), {"l": label}, prev)
        events.append(event)
        prev = event.hash
    return events


def broken(problem: str) -> TraceIntegrityError:
    return TraceIntegrityError(problem, run_id="r")


def walk(rows: list[TraceEvent], top: str, top_seq: int, floor: int = 1):  # type: ignore[no-untyped-def]
    return walk_down(
        rows, top=top, top_seq=top_seq, floor=floor, genesis=GENESIS_HASH, broken=broken
    )


def test_the_whole_chain_walks_down_to_genesis() -> None:
    """From the head to seq 1: every row, newest first, no strays, the link at genesis."""
    rows = chain(5)
    stretch = walk(rows, rows[-1].hash, 5)
    assert (
        list(stretch.chain) == rows[::-1] and stretch.strays == () and stretch.link == GENESIS_HASH
    )


def test_a_stretch_stops_at_its_floor_and_hands_on_the_link() -> None:
    """Walking 5..3 proves three rows; the link is the hash row 2 must have."""
    rows = chain(5)
    stretch = walk(rows[2:], rows[-1].hash, 5, floor=3)
    assert [r.seq for r in stretch.chain] == [5, 4, 3] and stretch.link == rows[1].hash


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        ("delete", "lacks entry"),
        ("edit", "altered"),
        ("reseq", "out of order"),
    ],
)
def test_damage_on_the_way_down_is_a_typed_break(damage: str, problem: str) -> None:
    """A row missing, edited or renumbered between the head and the floor fails closed."""
    rows = chain(5)
    if damage == "delete":
        rows = rows[:2] + rows[3:]
    elif damage == "edit":
        rows[2] = replace(rows[2], data={"l": "forged"}, data_text=b"")
    else:
        rows = chain(5, seqs=[1, 2, 9, 4, 5])  # each row hashed over its (wrong) seq
    with pytest.raises(TraceIntegrityError, match=problem):
        walk(rows, rows[-1].hash, 5)


def test_a_row_beside_the_chain_in_the_range_is_a_stray() -> None:
    """A correctly hashed row at a seq the walk passes, not on the chain, is handed back."""
    rows = chain(5)
    beside = seal_event("r", 3, "step", T0, {"l": "forged"}, rows[1].hash)
    stretch = walk([*rows, beside], rows[-1].hash, 5)
    assert stretch.strays == (beside,) and hashes_to_itself(beside)


def test_a_chain_shorter_or_longer_than_signed_is_a_break() -> None:
    """Genesis before seq 1, or no genesis at seq 1: the length the checkpoint signed is wrong."""
    early = seal_event("r", 2, "step", T0, {"l": "main"}, GENESIS_HASH)
    with pytest.raises(TraceIntegrityError, match="reaches genesis"):
        walk([early], early.hash, 2)
    late = seal_event("r", 1, "step", T0, {"l": "main"}, "sha256:" + "e" * 64)
    with pytest.raises(TraceIntegrityError, match="does not begin at genesis"):
        walk([late], late.hash, 1)
