"""The effect ledger is inside the fence: forged, deleted, edited or stale rows never steer recovery.

Each test damages a real SQLite file the way someone with write access to
the store could (rows hashed correctly: the chain's hash is not a secret),
then recovers: restore fails closed with a typed error, or the run goes on
exactly as if nothing had been inserted; no write is ever made for it.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from tests._plain import plain
from tests.conftest import ScriptedAgent, World, finish, make_policy, write
from tether.core import (
    EffectStatus,
    LeaseLostError,
    LedgerIntegrityError,
    OutcomeKind,
    Phase,
    RunState,
    StaleMarkError,
    canonical_bytes,
    format_time,
)
from tether.core._ledger import seal_entry
from tether.store import SQLiteStore
from tether.testing import CrashPlan, CrashPoint, Sandbox, SimulatedCrash


def agent() -> ScriptedAgent:
    return ScriptedAgent([write("notes.txt", "final\n", "w1"), finish])


def signed_state(world: World, rt: Any, run_id: str = "r1") -> RunState:
    state: RunState = rt.checkpointer.load(run_id).state
    return state


def forge(db: Path, state: RunState, status: EffectStatus, *, seq: int | None = None) -> None:
    """Insert a correctly hashed row that extends the signed chain (what an attacker can do)."""
    pending = state.pending
    key = pending.idempotency_key if pending is not None else "idem-forged"
    entry = seal_entry(
        state.run_id,
        state.ledger_length + 1 if seq is None else seq,
        state.ledger_head,
        idempotency_key=key,
        status=status,
        action_id=pending.action_id if pending is not None else "forged",
        intent_digest=pending.intent_digest if pending is not None else "sha256:" + "e" * 64,
        receipt={"receipt_id": "rcpt-forged"} if status is EffectStatus.COMMITTED else None,
        epoch=state.epoch,
        at=state.updated_at,
    )
    receipt = None if entry.receipt is None else canonical_bytes(entry.receipt).decode()
    with sqlite3.connect(db) as conn:
        conn.execute(
            "INSERT INTO tether_ledger (run_id, hash, prev_hash, seq, idempotency_key, status, "
            "action_id, intent_digest, receipt, epoch, at) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
            (
                entry.run_id,
                entry.hash,
                entry.prev_hash,
                entry.seq,
                entry.idempotency_key,
                entry.status.value,
                entry.action_id,
                entry.intent_digest,
                receipt,
                entry.epoch,
                format_time(entry.at),
            ),
        )


def crash_at(world: World, point: CrashPoint) -> Any:
    rt = world.runtime(agent(), crash=CrashPlan(point))
    session = rt.start("r1")
    with pytest.raises(SimulatedCrash):
        session.run()
    return rt


def test_a_forged_committed_row_fails_closed_and_no_write_is_made(world: World) -> None:
    """A forged `committed` row for a write awaiting approval never lets it run unapproved."""
    world.sandbox = Sandbox(
        {"notes.txt": "draft\n"}, instance_id="sbx-1", clock=world.clock.now, queryable=False
    )
    world.policy = make_policy(
        kinds={
            "file.write": {"risk": "low", "permission": "workspace.write", "needs_approval": True}
        }
    )
    rt = world.runtime(agent())
    outcome = rt.start("r1").run()
    assert outcome.phase is Phase.PENDING
    forge(world.db, signed_state(world, rt), EffectStatus.COMMITTED)
    with pytest.raises(LedgerIntegrityError, match="not on the signed chain"):
        world.runtime(agent()).recover("r1")
    assert world.sandbox.write_count() == 0


def test_a_forged_rejected_row_after_the_effect_fails_closed(world: World) -> None:
    """A forged `rejected` row cannot hide a write that happened: restore refuses the ledger."""
    rt = crash_at(world, CrashPoint.EFFECT_SENT)
    forge(world.db, signed_state(world, rt), EffectStatus.REJECTED)
    with pytest.raises(LedgerIntegrityError):
        world.runtime(agent()).recover("r1")
    assert world.sandbox.write_count() == 1


def test_without_forgery_the_same_crash_reconciles_the_one_write(world: World) -> None:
    """The control: the same crash, untouched ledger, recovers to one committed write."""
    crash_at(world, CrashPoint.EFFECT_SENT)
    outcome = world.runtime(agent()).recover("r1").run()
    assert outcome.phase is Phase.COMPLETED
    assert outcome.state.writes_committed == 1
    assert world.sandbox.write_count() == 1


def test_a_forged_row_in_the_signed_range_fails_closed(world: World) -> None:
    """A row claiming a sequence number inside the signed chain is off the chain: refused."""
    rt = crash_at(world, CrashPoint.EFFECT_SENT)
    forge(world.db, signed_state(world, rt), EffectStatus.COMMITTED, seq=1)
    with pytest.raises(LedgerIntegrityError):
        world.runtime(agent()).recover("r1")


def test_a_deleted_entry_fails_closed(world: World) -> None:
    """Deleting the `intended` entry breaks the chain the checkpoint pins."""
    crash_at(world, CrashPoint.EFFECT_SENT)
    with sqlite3.connect(world.db) as conn:
        conn.execute("DELETE FROM tether_ledger WHERE seq = 1")
    with pytest.raises(LedgerIntegrityError, match="lacks entry"):
        world.runtime(agent()).recover("r1")


def test_an_edited_receipt_fails_closed(world: World) -> None:
    """Editing the committed receipt's bytes no longer matches the entry's hash."""
    outcome = world.runtime(agent()).start("r1").run(max_steps=1)
    assert outcome.state.writes_committed == 1
    plain(world.db)
    with sqlite3.connect(world.db) as conn:
        conn.execute(
            "UPDATE tether_ledger SET receipt = ? WHERE status = 'committed'",
            ('{"receipt_id":"rcpt-edited"}',),
        )
    with pytest.raises(LedgerIntegrityError, match="altered"):
        world.runtime(agent()).recover("r1")


def test_reordered_entries_fail_closed(world: World) -> None:
    """Swapping two entries' sequence numbers is refused."""
    crash_at(world, CrashPoint.EFFECT_SENT)
    with sqlite3.connect(world.db) as conn:
        conn.execute("UPDATE tether_ledger SET seq = 3 - seq")
    with pytest.raises(LedgerIntegrityError):
        world.runtime(agent()).recover("r1")


def test_a_stale_worker_leaves_no_ledger_rows(world: World) -> None:
    """A worker whose lease was taken over cannot add intended/dispatched rows: its commit is refused."""
    old = world.runtime(agent(), lease_ttl_s=0.05, worker="old")
    stale = old.start("r1")
    time.sleep(0.1)
    world.runtime(agent(), lease_ttl_s=30, worker="new").recover("r1")
    rows_before = len(world.store().ledger("r1"))
    stale._renewed = stale.rt.clock.now()  # it believes its lease is fresh: no renewal attempt
    with pytest.raises(LeaseLostError):
        stale.step()
    assert len(world.store().ledger("r1")) == rows_before == 0
    assert world.sandbox.write_count() == 0


def test_orphan_rows_of_a_commit_that_never_landed_are_tolerated_apart(
    world: World, tmp_path: Path
) -> None:
    """With the mark apart, a crash between content and mark leaves rows no signed head reaches."""
    marks = SQLiteStore(tmp_path / "marks.sqlite")
    world.stores.append(marks)
    rt = world.runtime(agent(), crash=CrashPlan(CrashPoint.CONTENT_BEFORE_MARK, nth=2), marks=marks)
    with pytest.raises(SimulatedCrash):
        rt.start("r1").run()
    raw = world.store().ledger("r1")
    assert [e.status for e in raw] == [EffectStatus.INTENDED, EffectStatus.DISPATCHED]
    outcome = world.runtime(agent(), marks=marks).recover("r1").run()
    assert outcome.phase is Phase.COMPLETED
    assert world.sandbox.write_count() == 1
    # Later restores still prove the orphans (now inside the signed length) are ours.
    assert world.runtime(agent(), marks=marks).recover("r1").state.phase is Phase.COMPLETED


def test_a_forged_row_fails_closed_with_the_mark_apart(world: World, tmp_path: Path) -> None:
    """Apart, a stray row must belong to a checkpoint we signed; a forged one does not."""
    marks = SQLiteStore(tmp_path / "marks.sqlite")
    world.stores.append(marks)
    rt = world.runtime(agent(), crash=CrashPlan(CrashPoint.EFFECT_SENT), marks=marks)
    with pytest.raises(SimulatedCrash):
        rt.start("r1").run()
    forge(world.db, signed_state(world, rt), EffectStatus.REJECTED)
    with pytest.raises(LedgerIntegrityError, match="not on the signed chain"):
        world.runtime(agent(), marks=marks).recover("r1")


@pytest.mark.parametrize("defer", [True, False])
def test_commits_per_write_step(world: World, defer: bool) -> None:
    """A write on a queryable adapter costs one durable commit (its receipt rides on the next), or two with defer_receipts=False."""
    rt = world.runtime(agent(), defer_receipts=defer)
    session = rt.start("r1")
    before = session.state.generation
    session.step()
    assert session.rt.checkpointer.marks.get_mark("r1").generation - before == (1 if defer else 2)
    session.land_deferred()  # (nothing to land without deferral)
    assert session.state.generation - before == 2
    statuses = [e.status for e in rt.checkpointer.verified_ledger(session.state)]
    assert statuses == [EffectStatus.INTENDED, EffectStatus.DISPATCHED, EffectStatus.COMMITTED]


def put_mark_back(db: Path, marks_db: Path, generation: int) -> None:
    """Move the separate mark back to ``generation`` (what restoring an old mark backup does)."""
    with sqlite3.connect(db) as conn:
        (digest,) = conn.execute(
            "SELECT checkpoint_digest FROM tether_checkpoints WHERE run_id = 'r1' AND generation = ?",
            (generation,),
        ).fetchone()
    with sqlite3.connect(marks_db) as conn:
        conn.execute(
            "UPDATE tether_marks SET generation = ?, checkpoint_digest = ?, state_version = ?",
            (generation, digest, generation),
        )


def blind_world(world: World) -> None:
    world.sandbox = Sandbox(
        {"notes.txt": "draft\n"},
        instance_id="sbx-1",
        clock=world.clock.now,
        idempotent=False,
        queryable=False,
        conditional_writes=False,
    )


def test_a_mark_put_back_two_generations_fails_closed(world: World, tmp_path: Path) -> None:
    """Apart, content more than one generation past the mark proves the mark was put back."""
    blind_world(world)
    marks_db = tmp_path / "marks.sqlite"
    marks = SQLiteStore(marks_db)
    world.stores.append(marks)
    assert world.runtime(agent(), marks=marks).start("r1").run().phase is Phase.COMPLETED
    put_mark_back(world.db, marks_db, 2)
    with pytest.raises(StaleMarkError):
        world.runtime(agent(), marks=SQLiteStore(marks_db)).recover("r1")
    assert world.sandbox.write_count() == 1


def test_a_mark_put_back_one_generation_never_sends_a_blind_write_again(
    world: World, tmp_path: Path
) -> None:
    """A mark one generation back looks like a crash between content and mark: settle as maybe sent."""
    blind_world(world)
    marks_db = tmp_path / "marks.sqlite"
    marks = SQLiteStore(marks_db)
    world.stores.append(marks)
    rt = world.runtime(agent(), marks=marks, crash=CrashPlan(CrashPoint.EFFECT_SENT))
    with pytest.raises(SimulatedCrash):
        rt.start("r1").run()
    # Generation 2 made the write pending (intended), 3 said dispatched, then it was sent.
    put_mark_back(world.db, marks_db, 2)
    session = world.runtime(agent(), marks=SQLiteStore(marks_db)).recover("r1")
    outcome = session.run()
    assert (outcome.kind, outcome.phase) == (OutcomeKind.FROZEN, Phase.NEEDS_REVIEW)
    assert session.state.review_cases[0].reason == "outcome_unknown"
    assert world.sandbox.write_count() == 1
    # The next restore accepts the ledger it wrote (intended, dispatched, outcome_unknown).
    again = world.runtime(agent(), marks=SQLiteStore(marks_db)).recover("r1")
    assert again.state.phase is Phase.NEEDS_REVIEW


@pytest.mark.parametrize(
    ("column", "value"), [("seq", "x"), ("epoch", "abc"), ("receipt", '{"a": 1e400}')]
)
def test_a_malformed_ledger_row_is_a_typed_integrity_error(
    world: World, column: str, value: str
) -> None:
    """Text where a number belongs, or a receipt that cannot be hashed, fails closed typed."""
    world.runtime(agent()).start("r1").run(max_steps=1)
    with sqlite3.connect(world.db) as conn:
        conn.execute(f"UPDATE tether_ledger SET {column} = ? WHERE seq = 3", (value,))
    with pytest.raises(LedgerIntegrityError):
        world.runtime(agent()).recover("r1")
