"""``Worker(concurrency=N)`` on a real SQLite file: many runs driven at once, each once.

Each run writes to an in-memory sandbox of its own at every step; the worker
drives them on threads of its own, and their commits meet in the store's
group commit.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from bench.many_runs import Writer, task_and_policy

from tether import Keyring, Runtime
from tether.core import StoreError
from tether.runtime import Worker, _many
from tether.runtime._many import serve_many
from tether.store import Lease, SQLiteStore
from tether.testing import Sandbox

STEPS = 5


class Runs:
    """Runs seeded in one store, each with the sandbox it writes to, and a worker factory."""

    def __init__(self, store: SQLiteStore, count: int, steps: int = STEPS) -> None:
        self.store = store
        self.steps = steps
        self.keyring = Keyring.generate("many")
        self.sandboxes = {f"run-{i:02d}": Sandbox({"notes.txt": "draft\n"}) for i in range(count)}
        for run_id in self.sandboxes:
            self.factory(store, run_id, "seeder").start(run_id)

    def factory(self, store: Any, run_id: str, worker: str) -> Runtime:
        sandbox = self.sandboxes[run_id]
        task, policy = task_and_policy(sandbox.environment().state_fingerprint, self.steps)
        return Runtime(
            store=store,
            keyring=self.keyring,
            adapter=sandbox,
            task=task,
            policy=policy,
            agent=Writer(self.steps),
            worker=worker,
        )


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SQLiteStore]:
    with SQLiteStore(tmp_path / "store.sqlite") as opened:
        yield opened


def test_a_worker_drives_many_runs_at_once_to_the_end(store: SQLiteStore) -> None:
    """Eight runs on eight threads all complete, each write made once and recorded once."""
    runs = Runs(store, 8)
    worker = Worker(store, runs.factory, "w", lease_ttl_s=30, poll_s=0.01, concurrency=8)
    stats = worker.serve(idle_exit=True)
    assert (stats.claimed, stats.completed, stats.errors, stats.lost) == (8, 8, 0, 0)
    for run_id, sandbox in runs.sandboxes.items():
        mark = store.get_mark(run_id)
        assert mark is not None and mark.phase == "completed" and mark.lease_owner is None
        committed = sum(e.status.value == "committed" for e in store.ledger(run_id))
        assert (sandbox.write_count(), committed) == (STEPS, STEPS)


def test_more_runs_than_threads_are_all_driven(store: SQLiteStore) -> None:
    """Seven runs and three threads: runs are claimed as threads come free, until none is left."""
    runs = Runs(store, 7)
    stats = Worker(store, runs.factory, "w", poll_s=0.01, concurrency=3).serve(idle_exit=True)
    assert (stats.claimed, stats.completed) == (7, 7)
    assert sorted(stats.runs) == sorted(runs.sandboxes)


def test_max_runs_bounds_the_claims_of_a_concurrent_worker(store: SQLiteStore) -> None:
    """With ``max_runs=2`` a worker of four threads claims two runs and returns."""
    runs = Runs(store, 5)
    stats = Worker(store, runs.factory, "w", poll_s=0.01, concurrency=4).serve(
        max_runs=2, idle_exit=True
    )
    assert (stats.claimed, stats.completed) == (2, 2)
    phases = sorted(mark.phase for mark in store.runs())
    assert phases == ["completed", "completed", "running", "running", "running"]


def test_a_stopped_concurrent_worker_lets_every_run_go(store: SQLiteStore) -> None:
    """``stop()`` ends every thread after its step; each run's lease is released, none is lost."""
    runs = Runs(store, 4, steps=100_000)
    worker = Worker(store, runs.factory, "w", lease_ttl_s=30, poll_s=0.01, concurrency=4)
    serving = threading.Thread(target=worker.serve)
    serving.start()
    deadline = time.monotonic() + 60
    while min(mark.generation for mark in store.runs()) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    worker.stop()
    serving.join(timeout=60)
    assert not serving.is_alive()
    assert (worker.stats.claimed, worker.stats.lost, worker.stats.errors) == (4, 0, 0)
    for run_id, sandbox in runs.sandboxes.items():
        mark = store.get_mark(run_id)
        assert mark is not None and mark.phase == "running" and mark.lease_owner is None
        committed = sum(e.status.value == "committed" for e in store.ledger(run_id))
        assert sandbox.write_count() == committed  # the last write's receipt landed at release


@pytest.mark.parametrize("concurrency", [0, -1, 1025, True, 2.0, "4"])
def test_a_concurrency_out_of_range_is_refused(store: SQLiteStore, concurrency: Any) -> None:
    """A concurrency that is not a whole number from 1 to 1024 is refused when the worker is made."""
    with pytest.raises(StoreError, match="concurrency"):
        Worker(store, Runs(store, 0).factory, "w", concurrency=concurrency)


def _lease(run_id: str) -> Lease:
    return Lease(run_id, "w", 1, datetime.now(UTC), 1, 1)


def _serve(
    claim: Any, drive: Any, unmoved: Any, stop: Any = lambda: False, waiting: Any = lambda: True
) -> None:
    serve_many(
        concurrency=4,
        poll_s=0.01,
        stopping=stop,
        claim=claim,
        drive=drive,
        unmoved=unmoved,
        suspect_waiting=waiting,
        pause=time.sleep,
        give_up_after=3,
        max_runs=None,
        idle_exit=True,
    )


def test_a_suspect_is_driven_alone_until_it_moves_its_run() -> None:
    """serve_many takes a suspect first, into an empty worker, and nothing beside it until it moved."""
    suspects, others = [_lease("suspect")], [_lease("a"), _lease("b")]
    moved = threading.Event()
    claims: list[tuple[bool | None, bool]] = []  # (asked for suspects, the suspect had moved)

    def claim(limit: int, suspect: bool | None) -> list[Lease]:
        claims.append((suspect, moved.is_set()))
        pool = suspects if suspect else others
        taken = pool[:limit]
        del pool[:limit]
        return taken

    def drive(lease: Lease) -> None:
        if lease.run_id == "suspect":
            time.sleep(0.2)
            moved.set()
            time.sleep(0.2)

    _serve(claim, drive, lambda lease: lease.run_id == "suspect" and not moved.is_set())
    assert claims[0] == (True, False)
    assert all(moved_then for asked, moved_then in claims[1:] if asked is False), claims
    assert not suspects and not others


def test_suspects_come_back_one_after_another_as_each_moves_not_as_each_ends() -> None:
    """A suspect that moved its run lets the next one in beside it: three runs killed twice
    with their worker are all driven at once after about three moves, not three whole runs."""
    suspects = [_lease("s1"), _lease("s2"), _lease("s3")]
    moved: set[str] = set()
    together: list[set[str]] = []
    driving: set[str] = set()
    lock = threading.Lock()

    def claim(limit: int, suspect: bool | None) -> list[Lease]:
        if not suspect:
            return []
        taken = suspects[:1]
        del suspects[:1]
        return taken

    def drive(lease: Lease) -> None:
        with lock:
            driving.add(lease.run_id)
        time.sleep(0.1)
        with lock:
            moved.add(lease.run_id)
        time.sleep(1.0)  # the rest of the run, long after its first move
        with lock:
            together.append(set(driving))
            driving.discard(lease.run_id)

    began = time.monotonic()
    _serve(claim, drive, lambda lease: lease.run_id not in moved)
    assert together[0] == {"s1", "s2", "s3"}, together
    assert time.monotonic() - began < 2.5  # one at a time to the end would be 3.3 s


def test_a_busy_worker_looks_for_suspects_and_takes_one_beside_runs_that_moved(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A worker that always has runs to claim still takes a suspect within a look's period,
    only once the runs it holds have moved, and holds nothing unmoved beside it."""
    monkeypatch.setattr(_many, "LOOK_FOR_SUSPECTS_S", 0.3)
    counter = iter(range(10_000))
    suspects: list[Lease] = []
    moved: set[str] = set()
    beside: list[set[str]] = []  # the unmoved runs held when the suspect was claimed
    held: dict[str, bool] = {}
    lock = threading.Lock()
    done = threading.Event()
    threading.Timer(0.5, lambda: suspects.append(_lease("suspect"))).start()

    def claim(limit: int, suspect: bool | None) -> list[Lease]:
        with lock:
            if suspect:
                taken = suspects[:1]
                del suspects[:1]
                if taken:
                    beside.append({r for r in held if r not in moved})
                return taken
            return [_lease(f"r{next(counter)}") for _ in range(limit)]

    def drive(lease: Lease) -> None:
        with lock:
            held[lease.run_id] = True
        time.sleep(0.05)
        with lock:
            moved.add(lease.run_id)
        time.sleep(0.15)
        with lock:
            del held[lease.run_id]
        if lease.run_id == "suspect":
            done.set()

    began = time.monotonic()
    _serve(
        claim, drive, lambda lease: lease.run_id not in moved, done.is_set, lambda: bool(suspects)
    )
    assert done.is_set() and beside == [set()], beside
    assert time.monotonic() - began < 3.0


def test_a_busy_worker_with_no_suspect_waiting_never_stops_claiming(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A look that finds no suspect due claims on at once: a run whose first step is slow
    holds up no claim of the others."""
    monkeypatch.setattr(_many, "LOOK_FOR_SUSPECTS_S", 1.0)
    counter = iter(range(10_000))
    claimed_at: list[float] = []
    began = time.monotonic()

    def claim(limit: int, suspect: bool | None) -> list[Lease]:
        if suspect:
            return []
        claimed_at.append(time.monotonic() - began)
        return [_lease(f"r{next(counter)}") for _ in range(limit)]

    def drive(lease: Lease) -> None:
        time.sleep(2.0 if lease.run_id == "r0" else 0.05)  # r0: a slow first step, unmoved

    _serve(
        claim,
        drive,
        lambda lease: True,  # nothing ever moves
        lambda: time.monotonic() - began > 3.5,
        lambda: False,
    )
    gaps = [b - a for a, b in itertools.pairwise(claimed_at)]
    assert max(gaps) < 0.5, gaps


def test_a_suspect_that_does_not_move_lets_the_others_in_after_a_while(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A suspect whose first step hangs holds the worker alone for a look's period, not for ever."""
    monkeypatch.setattr(_many, "LOOK_FOR_SUSPECTS_S", 0.3)
    suspects, others = [_lease("suspect")], [_lease("a"), _lease("b")]
    began = time.monotonic()
    others_at: list[float] = []

    def claim(limit: int, suspect: bool | None) -> list[Lease]:
        pool = suspects if suspect else others
        taken = pool[:limit]
        del pool[:limit]
        if taken and not suspect:
            others_at.append(time.monotonic() - began)
        return taken

    def drive(lease: Lease) -> None:
        time.sleep(2.0 if lease.run_id == "suspect" else 0.01)

    _serve(claim, drive, lambda lease: lease.run_id == "suspect", waiting=lambda: bool(suspects))
    assert others_at and 0.25 < others_at[0] < 1.5, others_at


def test_a_dead_workers_run_is_taken_again_while_new_runs_keep_arriving(
    store: SQLiteStore,
) -> None:
    """A run whose worker died is claimed again within seconds however fast new runs arrive,
    and no run created after its lease ran out is claimed before it."""
    runs = Runs(store, 0, steps=2)

    def create(run_id: str) -> None:
        runs.sandboxes[run_id] = Sandbox({"notes.txt": "draft\n"})
        runs.factory(store, run_id, "launcher").start(run_id)

    create("dead")
    (dead,) = store.claim_expired("crashed", 0.3)  # the worker that took it dies holding it
    after_expiry: list[str] = []  # runs begun once that lease had run out
    arriving = threading.Event()

    def arrive() -> None:
        # A new run every few milliseconds: a claim nearly always finds new runs waiting
        # (when a run created free was claimable "since ever", the dead one never came up).
        for i in itertools.count():
            if arriving.is_set():
                return
            begun = datetime.now(UTC)
            create(f"new-{i:04d}")
            if begun > dead.expires_at:
                after_expiry.append(f"new-{i:04d}")
            time.sleep(0.005)

    worker = Worker(store, runs.factory, "w", lease_ttl_s=30, poll_s=0.01, concurrency=2)
    threads = [threading.Thread(target=arrive), threading.Thread(target=worker.serve)]
    for thread in threads:
        thread.start()
    try:
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            mark = store.get_mark("dead")
            taken = mark is not None and mark.lease_version > dead.lease_version
            late = [store.get_mark(r) for r in list(after_expiry)]
            if taken and any(m is not None and m.lease_version > 0 for m in late):
                break
            time.sleep(0.02)
    finally:
        arriving.set()
        worker.stop()
        for thread in threads:
            thread.join(timeout=30)
    mark = store.get_mark("dead")
    assert mark is not None and mark.lease_version == dead.lease_version + 1, mark
    # The grant order is the turn each claim drew: none of the late runs drew one before it.
    turns = dict(store._conn.execute("SELECT run_id, turn FROM tether_marks").fetchall())
    taken_before = [r for r in after_expiry if turns[r] and turns[r] < turns["dead"]]
    taken_after = [r for r in after_expiry if turns[r] > turns["dead"]]
    assert taken_before == [] and taken_after, (taken_before, len(after_expiry))
