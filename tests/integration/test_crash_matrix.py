"""The crash-window matrix: every crash point, both mark placements, SIGKILL and exception.

Each trial seeds the demo (a SQLite store on disk, a real workspace with its
journal outside the tree), dies at one named point, checks that exactly that
point's window is durable, recovers with ``start_or_recover`` from fresh
objects (a fresh process after SIGKILL), and checks that the file was written
exactly once and the run is whole.

What the demo run passes through, in order (pinned by
``test_demo_passes_each_point_as_the_matrix_assumes``): checkpoint 1
genesis; before_proposal 1; checkpoint 2 the read; before_proposal 2;
checkpoint 3 pending intent; intent_persisted; effect_sent;
receipt_deferred (the receipt is sealed and waits for the next commit);
before_proposal 3; checkpoint 4 completion, which carries the receipt
(receipt_persisted inside it). ``checkpoint_write`` fires inside each
checkpoint's transaction before COMMIT; ``content_before_mark`` after each
content write when the mark is a separate database.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.integration._crashkit import (
    RUN_ID,
    Mode,
    Placement,
    Snapshot,
    Window,
    chain_breaks,
    close_stores,
    crash,
    drop_pg_schemas,
    outcome,
    recover,
    seed,
    snapshot,
    stores,
)
from tether import _demo
from tether.core import EffectStatus, Phase
from tether.runtime import CrashPlan, CrashPoint
from tether.store import SQLiteStore

P = CrashPoint
DISPATCHED = (EffectStatus.INTENDED, EffectStatus.DISPATCHED)
COMMITTED = (*DISPATCHED, EffectStatus.COMMITTED)

# Trials on each main cell. `make test` runs the matrix at 20 in its first
# pass; its second pass (python -O, which only has to show that nothing
# depends on assert) sets TETHER_CRASH_TRIALS lower to keep CI short.
TRIALS = int(os.environ.get("TETHER_CRASH_TRIALS", "20"))

# Independent trials share no files, so children can run side by side.
WORKERS = max(1, min(4, os.cpu_count() or 1))

# (mark generation, phase it names, writes committed, ledger, workspace writes).
# The ledger lands only inside a checkpoint's commit: the pending checkpoint
# carries intended + dispatched, the advance carries committed.
NOTHING = (None, None, None, (), 0)
GENESIS = (1, Phase.RUNNING, 0, (), 0)
READ = (2, Phase.RUNNING, 0, (), 0)  # the demo reads calc.py first: no ledger, no write
PENDING_UNSENT = (3, Phase.PENDING, 0, DISPATCHED, 0)
PENDING_SENT = (3, Phase.PENDING, 0, DISPATCHED, 1)

# What is durable when the process dies at the hit-th pass through a point.
# The write's receipt rides on the run's next commit (the completion here):
# from the send until that commit lands, the store says `dispatched`, and
# recovery settles it by asking the workspace by key. `receipt_persisted` is
# inside that commit: co-located, the transaction dies with the process;
# apart, its content (receipt included) is written and the mark has not
# moved (see ORPHANED).
DURABLE_AT = {
    (P.BEFORE_PROPOSAL, 1): GENESIS,
    (P.BEFORE_PROPOSAL, 2): READ,
    (P.BEFORE_PROPOSAL, 3): PENDING_SENT,
    (P.INTENT_PERSISTED, 1): PENDING_UNSENT,
    (P.EFFECT_SENT, 1): PENDING_SENT,
    (P.RECEIPT_DEFERRED, 1): PENDING_SENT,
    (P.RECEIPT_PERSISTED, 1): PENDING_SENT,
    (P.CHECKPOINT_WRITE, 1): NOTHING,
    (P.CHECKPOINT_WRITE, 2): GENESIS,
    (P.CHECKPOINT_WRITE, 3): READ,
    (P.CHECKPOINT_WRITE, 4): PENDING_SENT,
    (P.CONTENT_BEFORE_MARK, 1): NOTHING,
    (P.CONTENT_BEFORE_MARK, 2): GENESIS,
    (P.CONTENT_BEFORE_MARK, 3): READ,
    (P.CONTENT_BEFORE_MARK, 4): PENDING_SENT,
}

# With the mark apart, the commit that died wrote its content (ledger rows
# included) before the mark: the store then holds the rows of the NEXT
# window, which no signed head reaches.
ORPHANED = {
    (P.RECEIPT_PERSISTED, 1): COMMITTED,
    (P.CONTENT_BEFORE_MARK, 1): (),
    (P.CONTENT_BEFORE_MARK, 2): (),
    (P.CONTENT_BEFORE_MARK, 3): DISPATCHED,
    (P.CONTENT_BEFORE_MARK, 4): COMMITTED,
}


@dataclass(frozen=True, slots=True)
class Case:
    """One cell of the matrix and how many trials each mode runs."""

    point: CrashPoint
    hit: int
    placement: Placement
    kill_runs: int
    raise_runs: int

    def __str__(self) -> str:
        return f"{self.point.value}-hit{self.hit}-{self.placement}"

    def window(self) -> Window:
        mark, phase, writes, ledger, workspace_writes = DURABLE_AT[self.point, self.hit]
        newest = mark
        orphaned = self.placement == "separate" and (self.point, self.hit) in ORPHANED
        if orphaned:
            newest = (mark or 0) + 1  # the content landed, the mark did not move
            ledger = ORPHANED[self.point, self.hit]
        return Window(mark, newest, phase, writes, ledger, workspace_writes)


def _cases() -> list[Case]:
    # The hit that matters most for each point runs 20 times in each mode;
    # the others guard the remaining checkpoints with fewer trials.
    main, side = (TRIALS, TRIALS), (min(3, TRIALS), min(5, TRIALS))
    shared = [
        # After the write, its receipt waiting in memory for the next commit: a
        # naive resume would write again.
        (P.BEFORE_PROPOSAL, 3, main),
        (P.BEFORE_PROPOSAL, 1, side),
        (P.BEFORE_PROPOSAL, 2, side),  # after the read: the agent must see the same result
        (P.INTENT_PERSISTED, 1, main),
        (P.EFFECT_SENT, 1, main),
        (P.RECEIPT_DEFERRED, 1, main),  # the receipt sealed, not written
        (P.RECEIPT_PERSISTED, 1, main),
        (P.CHECKPOINT_WRITE, 3, main),  # the pending checkpoint
        (P.CHECKPOINT_WRITE, 4, main),  # the completion that carries the receipt
        (P.CHECKPOINT_WRITE, 1, side),
        (P.CHECKPOINT_WRITE, 2, side),
    ]
    separate_only = [
        (P.CONTENT_BEFORE_MARK, 3, main),
        (P.CONTENT_BEFORE_MARK, 4, main),  # the completion's content, receipt included
        (P.CONTENT_BEFORE_MARK, 1, side),
        (P.CONTENT_BEFORE_MARK, 2, side),
    ]
    cases = [
        Case(point, hit, placement, *runs)
        for placement in ("colocated", "separate")
        for point, hit, runs in shared
    ]
    cases += [Case(point, hit, "separate", *runs) for point, hit, runs in separate_only]
    # The same kill -9 matrix with content and mark in PostgreSQL (issue 4):
    # every point's main hit, 20 real SIGKILLs each, and a few exceptions.
    cases += [
        Case(point, hit, "postgres", runs[0], 3) for point, hit, runs in shared if runs == main
    ]
    return cases


CASES = _cases()


# -- one trial -------------------------------------------------------------------------


def die(paths: _demo.DemoPaths, point: CrashPoint, hit: int, mode: Mode) -> None:
    """Crash the fresh run at ``point``/``hit`` and check it died there, as the mode says."""
    death = crash(paths, point, hit, mode)
    if mode == "kill":
        assert death.returncode == -signal.SIGKILL, death.stderr[-2000:]
    else:
        assert (death.point, death.hits) == (point, hit)


def come_back(paths: _demo.DemoPaths, mode: Mode) -> None:
    """Recover in a fresh process (kill) or from fresh objects (raise); it must succeed."""
    revival = recover(paths, mode)
    assert revival.returncode == 0, revival.stderr[-2000:]


def check_recovered(paths: _demo.DemoPaths, before: Snapshot) -> None:
    """The run completed with one write, one committed receipt and one unbroken trace."""
    out = outcome(paths)
    state = out.state
    assert out.workspace_writes == 1
    assert out.calc == _demo.FIXED
    assert (state.phase, state.stop_reason) == (Phase.COMPLETED, "verified")
    assert state.writes_committed == 1
    assert out.mark_generation == state.generation
    assert len(out.committed) == 1, [e.status for e in out.committed]
    (entry,) = out.committed
    assert entry.receipt is not None
    assert out.adapter_receipts == [entry.receipt]  # the adapter's receipt, field for field
    assert state.last_write is not None
    assert state.last_write.idempotency_key == entry.idempotency_key
    assert state.last_write.receipt_id == entry.receipt["receipt_id"]
    assert chain_breaks(out.trace, state) == []

    kinds = [event.kind for event in out.trace]
    assert kinds.count("run_started") == 1
    assert kinds.count("intent_persisted") == 1
    settled = [k for k in kinds if k in {"effect_committed", "effect_reconciled"}]
    # A write the crashed process already made is reconciled by its key, not executed again.
    sent_before = before.window.workspace_writes == 1 and before.window.phase is Phase.PENDING
    assert settled == ["effect_reconciled" if sent_before else "effect_committed"]

    recovered = [event.data["from_generation"] for event in out.trace if event.kind == "recovered"]
    if before.window.mark_generation is None:
        assert (state.epoch, recovered) == (1, [])  # nothing landed: started, not recovered
    else:
        assert (state.epoch, recovered) == (2, [before.window.mark_generation])
    if before.state is not None and before.state.pending is not None:
        # The key minted before the crash is the one the write settled under.
        assert entry.idempotency_key == before.state.pending.idempotency_key


def trial(base: Path, case: Case, mode: Mode) -> None:
    """Seed, die at the case's point, check the window, recover, check the outcome."""
    paths = seed(base, case.placement)
    die(paths, case.point, case.hit, mode)
    before = snapshot(paths)
    assert before.window == case.window()
    come_back(paths, mode)
    check_recovered(paths, before)


def trials(tmp_path: Path, case: Case, mode: Mode, runs: int, workers: int = 1) -> None:
    """Run ``runs`` independent trials, each in its own directory."""
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = [
            pool.submit(trial, tmp_path / f"run{index:02d}", case, mode) for index in range(runs)
        ]
        for index, future in enumerate(futures):
            try:
                future.result()
            except BaseException as exc:
                exc.add_note(f"{case} {mode}: trial {index + 1} of {runs}")
                raise


# -- the matrix ------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=str)
def test_sigkill_then_recovery_in_a_fresh_process(case: Case, tmp_path: Path) -> None:
    """A child SIGKILLed at the point leaves only its window durable, and a fresh child recovers the run with exactly one write."""
    trials(tmp_path, case, "kill", case.kill_runs, WORKERS)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_simulated_crash_then_recovery_from_fresh_objects(case: Case, tmp_path: Path) -> None:
    """A SimulatedCrash at the point leaves only its window durable, and fresh objects over the same files recover the run with exactly one write."""
    trials(tmp_path, case, "raise", case.raise_runs, WORKERS)


@pytest.fixture(scope="module", autouse=True)
def _drop_postgres_schemas() -> Iterator[None]:
    yield
    drop_pg_schemas()


def test_every_point_gets_twenty_trials_per_mode_and_placement() -> None:
    """Each crash point gets at least 20 SIGKILL and 20 exception trials per SQLite placement, and 20 SIGKILLs on PostgreSQL."""
    if not sys.flags.optimize:
        assert TRIALS >= 20, "the first pass of make test must run 20 trials per point"
    floor = min(20, TRIALS)
    for point in CrashPoint:
        if point is not P.CONTENT_BEFORE_MARK:
            here = [c for c in CASES if c.point is point and c.placement == "postgres"]
            assert max(c.kill_runs for c in here) >= floor, (point, "postgres")
    for placement in ("colocated", "separate"):
        for point in CrashPoint:
            if point is P.CONTENT_BEFORE_MARK and placement == "colocated":
                continue
            here = [c for c in CASES if c.point is point and c.placement == placement]
            assert max(c.kill_runs for c in here) >= floor, (point, placement)
            assert max(c.raise_runs for c in here) >= floor, (point, placement)


@pytest.mark.parametrize("placement", ["colocated", "separate"])
def test_demo_passes_each_point_as_the_matrix_assumes(placement: Placement, tmp_path: Path) -> None:
    """An uncrashed demo run passes each crash point exactly as often as the matrix's hit numbers assume."""
    expected = {
        P.BEFORE_PROPOSAL: 3,
        P.INTENT_PERSISTED: 1,
        P.EFFECT_SENT: 1,
        P.RECEIPT_DEFERRED: 1,
        P.RECEIPT_PERSISTED: 1,
        P.CHECKPOINT_WRITE: 4,
        P.CONTENT_BEFORE_MARK: 4 if placement == "separate" else 0,
    }
    for point, count in expected.items():
        paths = seed(tmp_path / point.value, placement)
        plan = CrashPlan(point, nth=10**6, mode="raise")  # armed, never reached
        with _demo.workspace(paths) as ws:
            rt = _demo.runtime(paths, ws, plan)
            try:
                state = rt.start(RUN_ID).run().state
            finally:
                close_stores(rt)
            assert (state.phase, state.generation, ws.write_count()) == (Phase.COMPLETED, 4, 1)
        assert plan.hits == count, point


# -- windows that deserve their own look ----------------------------------------------------

MODES = [
    pytest.param("kill", marks=pytest.mark.slow, id="sigkill"),
    pytest.param("raise", id="raise"),
]
# The matrix already runs each of these windows 20 times per mode; here one
# real SIGKILL (a few cheap exceptions) carries the window's own assertions.
REPEATS: dict[str, int] = {"kill": 1, "raise": 3}


@pytest.mark.parametrize("mode", MODES)
def test_death_inside_the_first_checkpoint_leaves_nothing_and_the_run_starts(
    mode: Mode, tmp_path: Path
) -> None:
    """Dying inside the genesis checkpoint transaction leaves no mark and no content, and start_or_recover starts the run and writes once."""
    for index in range(REPEATS[mode]):
        paths = seed(tmp_path / f"run{index}", "colocated")
        die(paths, P.CHECKPOINT_WRITE, 1, mode)
        with stores(paths) as (content, marks):
            assert marks.get_mark(RUN_ID) is None
            assert content.newest_generation(RUN_ID) is None
            assert content.ledger(RUN_ID) == []
        before = snapshot(paths)
        assert before.window.workspace_writes == 0
        come_back(paths, mode)
        check_recovered(paths, before)
        out = outcome(paths)
        assert out.state.epoch == 1
        assert out.trace[0].kind == "run_started"


@pytest.mark.parametrize("mode", MODES)
def test_content_without_mark_recovers_from_the_previous_generation(
    mode: Mode, tmp_path: Path
) -> None:
    """With a separate mark, a death between the pending checkpoint's content and its mark leaves the mark one generation back and recovery resumes there, writing once."""
    for index in range(REPEATS[mode]):
        paths = seed(tmp_path / f"run{index}", "separate")
        die(paths, P.CONTENT_BEFORE_MARK, 3, mode)
        assert paths.marks is not None
        with SQLiteStore(paths.marks) as marks:
            mark = marks.get_mark(RUN_ID)
        with SQLiteStore(paths.db) as content:
            newest = content.newest_generation(RUN_ID)
            # The orphaned commit's rows exist, but no signed head reaches them.
            orphans = tuple(e.status for e in content.ledger(RUN_ID))
            assert orphans == DISPATCHED
        assert mark is not None
        assert mark.generation == 2
        assert newest is not None
        assert newest == 3 > mark.generation  # the orphaned content row exists
        before = snapshot(paths)
        assert before.state is not None
        assert (before.state.generation, before.state.phase) == (2, Phase.RUNNING)
        assert before.state.ledger_length == 0
        come_back(paths, mode)
        check_recovered(paths, before)
        recovered = [e for e in outcome(paths).trace if e.kind == "recovered"]
        assert [e.data["from_generation"] for e in recovered] == [2]


@pytest.mark.parametrize("placement", ["colocated", "separate"])
@pytest.mark.parametrize("mode", MODES)
def test_effect_sent_receipt_not_persisted_is_reconciled_from_the_adapter(
    mode: Mode, placement: Placement, tmp_path: Path
) -> None:
    """After a death between the adapter's commit and the ledger's, only the workspace knows the receipt, and recovery records exactly that receipt."""
    for index in range(REPEATS[mode]):
        paths = seed(tmp_path / f"run{index}", placement)
        die(paths, P.EFFECT_SENT, 1, mode)
        before = snapshot(paths)
        assert before.state is not None
        assert before.state.pending is not None
        key = before.state.pending.idempotency_key
        assert before.adapter_receipt is not None  # FileWorkspace.lookup(key) has it
        assert before.adapter_receipt["idempotency_key"] == key
        assert EffectStatus.COMMITTED not in [e.status for e in before.ledger]
        assert tuple(e.status for e in before.ledger) == DISPATCHED
        come_back(paths, mode)
        check_recovered(paths, before)
        (entry,) = outcome(paths).committed
        assert entry.idempotency_key == key
        assert entry.receipt == before.adapter_receipt


@pytest.mark.parametrize("placement", ["colocated", "separate"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("point", [P.RECEIPT_DEFERRED, P.BEFORE_PROPOSAL])
def test_a_receipt_waiting_for_the_next_commit_is_asked_for_by_key(
    point: CrashPoint, mode: Mode, placement: Placement, tmp_path: Path
) -> None:
    """A death while the receipt waits in memory for the next commit (sealed, or the agent deciding) leaves `dispatched` signed; recovery asks the workspace by key and records exactly its receipt, writing nothing again."""
    hit = 1 if point is P.RECEIPT_DEFERRED else 3
    for index in range(REPEATS[mode]):
        paths = seed(tmp_path / f"run{index}", placement)
        die(paths, point, hit, mode)
        before = snapshot(paths)
        assert before.state is not None and before.state.pending is not None
        assert before.state.pending.status is EffectStatus.DISPATCHED
        assert tuple(e.status for e in before.ledger) == DISPATCHED  # nothing orphaned either
        assert before.window.workspace_writes == 1
        assert before.adapter_receipt is not None
        assert before.adapter_receipt["idempotency_key"] == before.state.pending.idempotency_key
        come_back(paths, mode)
        check_recovered(paths, before)
        (entry,) = outcome(paths).committed
        assert entry.receipt == before.adapter_receipt


@pytest.mark.parametrize("placement", ["colocated", "separate"])
@pytest.mark.parametrize("mode", MODES)
def test_receipt_persisted_state_not_advanced_replays_the_transition_only(
    mode: Mode, placement: Placement, tmp_path: Path
) -> None:
    """A death inside the commit that records the receipt and advances leaves the signed state pending; recovery asks the adapter and advances without a second write."""
    for index in range(REPEATS[mode]):
        paths = seed(tmp_path / f"run{index}", placement)
        die(paths, P.RECEIPT_PERSISTED, 1, mode)
        before = snapshot(paths)
        assert before.state is not None
        assert before.state.phase is Phase.PENDING
        assert before.state.ledger_length == 2  # intended + dispatched are all that is signed
        committed = [e for e in before.ledger if e.status is EffectStatus.COMMITTED]
        # Co-located, the transaction died whole; apart, its content is an orphan.
        assert len(committed) == (1 if placement == "separate" else 0)
        assert before.adapter_receipt is not None
        come_back(paths, mode)
        check_recovered(paths, before)
        (entry,) = outcome(paths).committed
        assert entry.receipt == before.adapter_receipt
