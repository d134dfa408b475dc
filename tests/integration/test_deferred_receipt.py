"""One durable commit per write step: a receipt rides on the run's next commit, on a real SQLite file.

Where the adapter settles "sent, receipt not persisted" by key (idempotent, or
queryable with final absence), a write's receipt is sealed at once and written
with the next commit of the run; a crash before it is settled by asking the
adapter, never by sending again. Blind adapters, approved writes and runtimes
built with ``defer_receipts=False`` commit the receipt on its own, at once.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.conftest import ScriptedAgent, World, finish, make_policy, write
from tether.core import EffectStatus, GenerationConflictError, LeaseLostError, OutcomeKind, Phase
from tether.crypto import Keyring
from tether.runtime import CrashPlan, CrashPoint, SimulatedCrash
from tether.store import SQLiteStore
from tether.testing import Sandbox


def writes(n: int) -> ScriptedAgent:
    return ScriptedAgent([*(write("notes.txt", f"v{i}\n") for i in range(n)), finish])


def stored(world: World, run_id: str = "r1") -> tuple[int, str, list[tuple[str, str]]]:
    """The mark's generation and phase, and the ledger as the store holds it (action, status)."""
    with SQLiteStore(world.db) as store:
        mark = store.get_mark(run_id)
        assert mark is not None
        ledger = [(e.action_id, e.status.value) for e in store.ledger(run_id)]
        return mark.generation, mark.phase, ledger


def test_a_write_step_is_one_durable_commit_in_steady_state(world: World) -> None:
    """Three write steps on an idempotent, queryable adapter move the mark three generations, not six."""
    session = world.runtime(writes(3)).start("r1")
    start = stored(world)[0]
    for _ in range(3):
        assert session.step().kind is OutcomeKind.EXECUTED
    generation, phase, _ = stored(world)
    assert generation == start + 3 and phase == "pending"
    assert session.run().kind is OutcomeKind.FINISHED
    generation, phase, ledger = stored(world)
    assert (generation, phase) == (start + 4, "completed")
    assert ledger == [
        (a, s) for a in ("a0", "a1", "a2") for s in ("intended", "dispatched", "committed")
    ]
    assert world.sandbox.write_count() == 3


def test_the_deferred_receipt_lands_with_the_next_intent_in_one_transaction(world: World) -> None:
    """After a write step the store says dispatched; the next step's one commit records committed, then the next intent."""
    session = world.runtime(writes(2)).start("r1")
    session.step()
    generation, phase, ledger = stored(world)
    assert phase == "pending" and ledger == [("a0", "intended"), ("a0", "dispatched")]
    # The session goes on from the receipt it holds: its state and trace already say so.
    assert session.state.phase is Phase.RUNNING and session.state.writes_committed == 1
    assert session.trace(1)[0].kind == "effect_committed"
    session.step()
    after, phase, ledger = stored(world)
    assert after == generation + 1 and phase == "pending"
    assert ledger[2:] == [("a0", "committed"), ("a1", "intended"), ("a1", "dispatched")]
    recovered = world.runtime(writes(2)).recover("r1")
    assert recovered.state.writes_committed == 1 and recovered.state.pending is not None


@pytest.mark.parametrize(
    "how", ["blind", "approval", "switched_off"], ids=["blind", "approval", "defer_off"]
)
def test_receipts_that_cannot_wait_are_committed_at_once(world: World, how: str) -> None:
    """A blind adapter, a write a person approved, or defer_receipts=False: the receipt is durable when the step returns."""
    from tests.conftest import signed_approval
    from tether.crypto import Signer, TrustRoots

    options: dict[str, object] = {}
    if how == "blind":
        world.sandbox = Sandbox(
            {"notes.txt": "draft\n"},
            instance_id="sbx-1",
            clock=world.clock.now,
            idempotent=False,
            queryable=False,
        )
    elif how == "switched_off":
        options["defer_receipts"] = False
    approver = Signer.generate("alice", "approver")
    if how == "approval":
        world.policy = make_policy(
            kinds={
                "file.write": {
                    "risk": "low",
                    "permission": "workspace.write",
                    "needs_approval": True,
                }
            }
        )
        options["trust"] = TrustRoots.of(approver.trust_root())
    session = world.runtime(writes(1), **options).start("r1")
    outcome = session.step()
    if how == "approval":
        assert outcome.kind is OutcomeKind.WAITING_FOR_APPROVAL
        session.approve(signed_approval(approver, session.state, world.clock.now()))
        outcome = session.step()
    assert outcome.kind is OutcomeKind.EXECUTED
    _, phase, ledger = stored(world)
    assert phase == "running" and ledger[-1] == ("a0", "committed")


def test_a_crash_while_the_receipt_waits_is_settled_by_asking_the_adapter(world: World) -> None:
    """Killed with the receipt only in memory: recovery finds dispatched, asks by key, replays; one write."""
    crash = CrashPlan(CrashPoint.RECEIPT_DEFERRED)
    with pytest.raises(SimulatedCrash):
        world.runtime(writes(2), crash=crash).start("r1").run()
    assert stored(world)[2][-1] == ("a0", "dispatched")
    assert world.sandbox.write_count() == 1
    session = world.runtime(writes(2)).recover("r1")
    settled = session.step()
    assert settled.kind is OutcomeKind.REPLAYED
    assert [e.kind for e in session.trace(2)][-1] == "effect_reconciled"
    assert session.run().kind is OutcomeKind.FINISHED
    assert world.sandbox.write_count() == 2  # a0 once, a1 once
    _, _, ledger = stored(world)
    assert [s for a, s in ledger if a == "a0"] == ["intended", "dispatched", "committed"]


def test_a_crash_inside_the_commit_that_carries_it_loses_both_and_sends_neither_again(
    world: World,
) -> None:
    """Dying inside the next commit (receipt + next intent): the store still says dispatched; the next write was never sent."""
    crash = CrashPlan(CrashPoint.CHECKPOINT_WRITE, nth=3)  # genesis, intent a0, then the fold
    with pytest.raises(SimulatedCrash):
        world.runtime(writes(2), crash=crash).start("r1").run()
    assert stored(world)[2] == [("a0", "intended"), ("a0", "dispatched")]
    assert world.sandbox.write_count() == 1
    session = world.runtime(writes(2)).recover("r1")
    assert session.run().kind is OutcomeKind.FINISHED
    assert world.sandbox.write_count() == 2


def test_releasing_the_lease_lands_the_deferred_receipt(world: World) -> None:
    """A session that lets its run go writes the receipt it holds first: the store says committed."""
    session = world.runtime(writes(2), lease_ttl_s=30).start("r1")
    session.step()
    assert stored(world)[1] == "pending"
    session.release()
    _, phase, ledger = stored(world)
    assert phase == "running" and ledger[-1] == ("a0", "committed")
    assert world.runtime(writes(2), lease_ttl_s=30).recover("r1").state.pending is None


def test_a_worker_that_lost_its_lease_with_a_receipt_waiting_lands_nothing(world: World) -> None:
    """The new owner settles the write by its key; the old session's commit is refused, nothing is sent twice."""
    old = world.runtime(writes(2), lease_ttl_s=0.3, worker="w-old").start("r1")
    assert old.step().kind is OutcomeKind.EXECUTED
    time.sleep(0.4)  # its lease runs out (store clock) while the receipt waits in its memory
    new = world.runtime(writes(2), lease_ttl_s=30, worker="w-new").recover("r1")
    assert new.step().kind is OutcomeKind.REPLAYED
    with pytest.raises((LeaseLostError, GenerationConflictError)):
        old.step()
    with pytest.raises(LeaseLostError):  # letting go lands nothing and says the lease is gone
        old.release()
    assert new.run().kind is OutcomeKind.FINISHED
    assert world.sandbox.write_count() == 2
    _, _, ledger = stored(world)
    assert [s for a, s in ledger if a == "a0"].count(EffectStatus.COMMITTED.value) == 1


def test_the_receipt_rides_on_any_next_checkpoint_not_only_an_intent(tmp_path: Path) -> None:
    """A finish after a write: the completed checkpoint carries the write's receipt (one commit for both)."""
    from tests.conftest import CountingIds, ManualClock, make_task
    from tether.runtime import Runtime

    clock = ManualClock()
    sandbox = Sandbox({"notes.txt": "draft\n"}, instance_id="sbx-2", clock=clock.now)
    with SQLiteStore(tmp_path / "t.sqlite") as store:
        rt = Runtime(
            store=store,
            keyring=Keyring.generate("k1"),
            adapter=sandbox,
            task=make_task(sandbox.environment().state_fingerprint),
            policy=make_policy(),
            agent=writes(1),
            clock=clock,
            ids=CountingIds(),
        )
        session = rt.start("r1")
        session.step()
        pending_at = store.get_mark("r1")
        assert pending_at is not None and pending_at.phase == "pending"
        assert session.step().kind is OutcomeKind.FINISHED
        done = store.get_mark("r1")
        assert done is not None and done.phase == "completed"
        assert done.generation == pending_at.generation + 1
        statuses = [e.status for e in store.ledger("r1")]
        assert statuses[-1] is EffectStatus.COMMITTED
